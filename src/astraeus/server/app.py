"""The control plane's HTTP app: thin routers over `services` and `agents`."""



import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import protocol as P
from astraeus import spec as S
from astraeus.server import admin, agents, lifecycle, services
from astraeus.server import bodies as B
from astraeus.server.core import STATE_LOCK, ControlPlane, Settings
from astraeus.server.db import Access, Cluster, Machine, Token, Worker
from astraeus.server.loop import SchedulingLoop
from astraeus.server.services import ApiError, Caller

# Long-polls and log follows each hold a worker thread; allow many (one per agent, plus followers).
THREADS = 400
LONG_POLL_MAX = 30.0


@contextmanager
def tx(s: Session):
    """Commit what the block did, or nothing at all; one state change at a time (see STATE_LOCK)."""
    with STATE_LOCK:
        try:
            yield
            s.commit()
        except BaseException:
            s.rollback()
            raise


def _error_json(status: int, code: str, message: str, **extra) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


def _loc(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (("." if out else "") + p)
    return out or "body"


def create_app(settings: Settings | None = None, cp: ControlPlane | None = None, run_loop: bool = True) -> FastAPI:
    settings = settings or Settings()
    cp = cp or ControlPlane.open(settings)
    loop = SchedulingLoop(cp)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
        if run_loop:
            loop.start()
            cp.notifier.wake_scheduler()
        yield
        if run_loop:
            loop.stop()

    app = FastAPI(title="Astraeus", version="0.1.0", lifespan=lifespan,
                  description="GPU cluster workload manager: runs, workers, drives, machines.")
    app.state.cp = cp
    app.state.loop = loop

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error_json(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = []
        for e in exc.errors():
            where = _loc(e.get("loc", ()))
            msg = e.get("msg", "invalid")
            if e.get("type") == "extra_forbidden":
                msg = "unknown field: remove it or check its spelling"
            elif e.get("type") == "missing":
                msg = "field required"
            msg = msg.removeprefix("Value error, ")
            errors.append({"field": where, "message": msg})
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        return _error_json(422, "INVALID", f"{first['field']}: {first['message']}", errors=errors)

    def session() -> Iterator[Session]:
        with cp.sessions() as s:
            yield s

    Sess = Annotated[Session, Depends(session)]

    def token(s: Sess, authorization: Annotated[str | None, Header()] = None) -> Token:
        return services.authenticate(s, authorization)

    def ws_caller(org: str, ws: str, s: Sess, tok: Annotated[Token, Depends(token)]) -> Caller:
        if tok.kind == "machine":
            raise ApiError(403, "FORBIDDEN", "a machine token cannot call user endpoints")
        return services.workspace_caller(s, tok, org, ws)

    def admin_caller(org: str, s: Sess, tok: Annotated[Token, Depends(token)]) -> Caller:
        return services.org_admin_caller(s, tok, org)

    def agent_token(tok: Annotated[Token, Depends(token)]) -> Token:
        return agents.machine_token(tok)

    WsCaller = Annotated[Caller, Depends(ws_caller)]
    AdminCaller = Annotated[Caller, Depends(admin_caller)]
    AgentTok = Annotated[Token, Depends(agent_token)]
    base = settings.console_base

    # ------------------------------------------------------------------------------------- plumbing
    @app.get("/healthz", include_in_schema=False)
    def healthz(s: Sess):
        s.execute(select(1))
        return {"ok": True}

    @app.get("/metrics", include_in_schema=False)
    def metrics():
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------------------------ workspace
    w = APIRouter(prefix="/api/v1/o/{org}/w/{ws}", tags=["workspace"], responses=B.ERRORS)

    def cluster_of(s: Session, run) -> Cluster:
        return s.get(Cluster, run.cluster_id)

    def machine_names(s: Session) -> dict[int, str]:
        return dict(s.execute(select(Machine.id, Machine.name)).all())

    @w.get("")
    def get_workspace(c: WsCaller, s: Sess):
        return services.workspace_view(s, c, base())

    @w.post("/runs", status_code=201)
    def create_run(c: WsCaller, s: Sess, body: S.RunCreate):
        with tx(s):
            run = services.submit_run(s, c, body, time.time())
            out = services.run_view(run, c.org, c.workspace, cluster_of(s, run), base(), [], {})
        cp.notifier.wake_scheduler()
        return out

    @w.get("/runs")
    def list_runs(c: WsCaller, s: Sess, state: str | None = None):
        names = machine_names(s)
        clusters = {cl.id: cl for cl in s.scalars(select(Cluster))}
        runs = services.list_runs(s, c, state)
        return {"items": [services.run_view(r, c.org, c.workspace, clusters[r.cluster_id], base(), None, names)
                          for r in runs]}

    @w.get("/runs/{name}")
    def get_run(name: str, c: WsCaller, s: Sess):
        run = services.get_run(s, c, name)
        return services.run_view(run, c.org, c.workspace, cluster_of(s, run), base(),
                                 services.run_history(s, run), machine_names(s))

    @w.delete("/runs/{name}")
    def delete_run(name: str, c: WsCaller, s: Sess):
        with tx(s):
            run, machines = services.delete_run(s, c, name, time.time())
        cp.notifier.bump_machines(machines)
        cp.notifier.wake_scheduler()
        return {"name": name, "deleted": True, "state": run.state}

    @w.get("/workers")
    def list_workers(c: WsCaller, s: Sess, run: str | None = None):
        names = machine_names(s)
        return {"items": [services.worker_view(x, names) for x in services.list_workers(s, c, run)]}

    @w.get("/workers/{name}")
    def get_worker(name: str, c: WsCaller, s: Sess):
        return services.worker_view(services.get_worker(s, c, name), machine_names(s))

    @w.get("/workers/{name}/logs", responses={200: {"description": "one line per output line",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def worker_logs(name: str, c: WsCaller, s: Sess, tail: Annotated[int | None, Query(ge=0, le=B.INT32)] = None,
                    follow: bool = False, timestamps: bool = False):
        worker = services.get_worker(s, c, name)
        wid = worker.id

        def fmt(ln) -> str:
            if timestamps:
                t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ln.time)) + f".{int(ln.time % 1 * 1e6):06d}Z"
                return f"{t} {ln.text}\n"
            return ln.text + "\n"

        if not follow:
            return PlainTextResponse("".join(fmt(ln) for ln in services.read_logs(s, worker, tail=tail)))

        def stream() -> Iterator[str]:
            last = 0
            with cp.sessions() as s2:
                wk = s2.get(Worker, wid)
                lines = services.read_logs(s2, wk, tail=tail)
            for ln in lines:
                last = ln.id
                yield fmt(ln)
            while True:
                v = cp.notifier.logs_version()
                with cp.sessions() as s2:
                    wk = s2.get(Worker, wid)
                    if wk is None:
                        return
                    new = services.read_logs(s2, wk, after_id=last)
                    done = wk.state in lifecycle.ENDED or (wk.state == "Pending" and wk.attempt > 0)
                for ln in new:
                    last = ln.id
                    yield fmt(ln)
                if done and not new:
                    return
                cp.notifier.wait_logs(v, 1.0)

        return StreamingResponse(stream(), media_type="text/plain")

    @w.post("/drives", status_code=201)
    def create_drive(c: WsCaller, s: Sess, body: S.DriveCreate):
        with tx(s):
            d = services.create_drive(s, c, body, time.time())
            out = services.drive_view(d, c.workspace, s.get(Cluster, d.cluster_id))
        return out

    @w.get("/drives")
    def list_drives(c: WsCaller, s: Sess):
        from astraeus.server.db import Drive

        ds = s.scalars(select(Drive).where(Drive.workspace_id == c.workspace.id).order_by(Drive.name))
        return {"items": [services.drive_view(d, c.workspace, s.get(Cluster, d.cluster_id)) for d in ds]}

    @w.get("/drives/{name}")
    def get_drive(name: str, c: WsCaller, s: Sess):
        d = services.get_drive(s, c, name)
        return services.drive_view(d, c.workspace, s.get(Cluster, d.cluster_id))

    @w.delete("/drives/{name}")
    def delete_drive(name: str, c: WsCaller, s: Sess):
        with tx(s):
            services.delete_drive(s, c, name, time.time())
        return {"name": name, "deleted": True}

    @w.get("/events")
    def list_events(c: WsCaller, s: Sess, limit: Annotated[int, Query(ge=1, le=1000)] = 200):
        return {"items": [{"time": services.iso(e.time), "kind": e.kind, "object": e.object, "message": e.message}
                          for e in services.list_events(s, c, limit)]}

    @w.get("/machines")
    def list_machines(c: WsCaller, s: Sess):
        ids = list(s.scalars(select(Access.cluster_id).where(Access.workspace_id == c.workspace.id)))
        return {"items": services.machines_view(s, ids)}

    app.include_router(w)

    # --------------------------------------------------------------------------------- organisation
    o = APIRouter(prefix="/api/v1/o/{org}", tags=["organisation"], responses=B.ERRORS)

    @o.get("/workspaces")
    def list_workspaces(c: AdminCaller, s: Sess):
        return {"items": admin.list_workspaces(s, c)}

    @o.post("/workspaces", status_code=201)
    def create_workspace(c: AdminCaller, s: Sess, body: B.WorkspaceCreate):
        with tx(s):
            return admin.create_workspace(s, c, body.model_dump(exclude_unset=True))

    @o.get("/workspaces/{name}")
    def get_workspace_admin(name: str, c: AdminCaller, s: Sess):
        return admin.workspace_out(s, admin.workspace_named(s, c, name))

    @o.patch("/workspaces/{name}")
    def patch_workspace(name: str, c: AdminCaller, s: Sess, body: B.WorkspacePatch):
        with tx(s):
            out = admin.update_workspace(s, c, name, body.model_dump(exclude_unset=True))
        cp.notifier.wake_scheduler()
        return out

    @o.get("/clusters")
    def list_clusters(c: AdminCaller, s: Sess):
        return {"items": admin.list_clusters(s, c)}

    @o.post("/clusters", status_code=201)
    def create_cluster(c: AdminCaller, s: Sess, body: B.ClusterCreate):
        with tx(s):
            return admin.create_cluster(s, c, body.model_dump(exclude_unset=True))

    @o.get("/clusters/{name}")
    def get_cluster(name: str, c: AdminCaller, s: Sess):
        return admin.cluster_out(admin.cluster_named(s, c, name))

    @o.patch("/clusters/{name}")
    def patch_cluster(name: str, c: AdminCaller, s: Sess, body: B.ClusterPatch):
        with tx(s):
            out = admin.update_cluster(s, c, name, body.model_dump(exclude_none=True))
        cp.notifier.wake_scheduler()
        return out

    @o.get("/clusters/{name}/machines")
    def cluster_machines(name: str, c: AdminCaller, s: Sess):
        return {"items": services.machines_view(s, [admin.cluster_named(s, c, name).id])}

    @o.post("/tokens", status_code=201)
    def create_token(c: AdminCaller, s: Sess, body: B.TokenCreate):
        with tx(s):
            return admin.issue_token(s, c, body.model_dump(exclude_unset=True))

    @o.get("/tokens")
    def list_tokens(c: AdminCaller, s: Sess):
        return {"items": admin.list_tokens(s, c)}

    @o.delete("/tokens/{token_id}")
    def revoke_token(token_id: Annotated[int, Path(ge=1, le=B.INT32)], c: AdminCaller, s: Sess):
        with tx(s):
            admin.revoke_token(s, c, token_id)
        return {"id": token_id, "revoked": True}

    app.include_router(o)

    # ---------------------------------------------------------------------------------------- agent
    a = APIRouter(prefix="/api/v1/agent", tags=["agent"], responses=B.ERRORS)

    @a.post("/register")
    def agent_register(tok: AgentTok, s: Sess, body: P.Register) -> P.Registered:
        with tx(s):
            m, cl, changed = agents.register(s, tok, body, time.time(), settings.heartbeat_seconds)
            out = P.Registered(machine=m.name, cluster=cl.name, heartbeat_seconds=settings.heartbeat_seconds,
                               lost_after_seconds=cl.lost_after_seconds)
            mid = m.id
        cp.notifier.bump_machines([mid])
        cp.notifier.wake_scheduler()
        return out

    @a.get("/assignments")
    def agent_assignments(tok: AgentTok, s: Sess, machine: str, after: int = 0,
                          wait: Annotated[float, Query(ge=0, le=LONG_POLL_MAX)] = 0) -> P.Assignments:
        m = agents.machine_for(s, tok, machine)
        mid = m.id
        s.rollback()
        version = cp.notifier.wait_machine(mid, after, wait) if wait else cp.notifier.machine_version(mid)
        with cp.sessions() as s2:
            m2 = s2.get(Machine, mid)
            return P.Assignments(version=version, assignments=agents.assignments(s2, m2))

    @a.post("/report")
    def agent_report(tok: AgentTok, s: Sess, body: P.Report) -> P.Ack:
        with tx(s):
            m = agents.machine_for(s, tok, body.machine)
            changed = agents.report(s, m, body, time.time())
            mid = m.id
        if changed:
            cp.notifier.bump_machines([mid])
            cp.notifier.bump_logs()
            cp.notifier.wake_scheduler()
        return P.Ack()

    @a.post("/logs")
    def agent_logs(tok: AgentTok, s: Sess, body: P.Logs) -> P.LogsStored:
        with tx(s):
            m = agents.machine_for(s, tok, body.machine)
            n = agents.store_logs(s, m, body.lines)
        if n:
            cp.notifier.bump_logs()
        return P.LogsStored(stored=n)

    app.include_router(a)

    try:  # the console, when its package is present
        from astraeus.console import mount as mount_console

        mount_console(app, cp)
    except ImportError:
        pass

    app.openapi_schema = None

    return app
