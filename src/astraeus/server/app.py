"""The control plane's HTTP app, assembled: error handlers, the scheduling loop's lifespan, and the routers.

Every route lives in `astraeus.server.routers` (one module per resource); they read the ControlPlane from
`app.state.cp`, so this module only puts it there and includes them.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from fastapi import FastAPI

from astraeus.server import services
from astraeus.server.asgi import replay
from astraeus.server.audit import Audited
from astraeus.server.core import ControlPlane
from astraeus.server.loop import SchedulingLoop
from astraeus.server.routers import (
    admin,
    agent,
    drives,
    errors,
    events,
    health,
    machine_health,  # cordon, drain, GPU faults (issue 47)
    machines,
    pools,
    registries,
    replica_groups,
    reservations,
    runs,
    schedules,
    templates,
    usage,
    workers,
    workspace,
)
from astraeus.server.routers import audit as audit_router  # the audit log (issue 45)
from astraeus.server.routers import exec as exec_router  # sessions into running workers
from astraeus.server.routers import sso as sso_router  # single sign-on (issue 45)
from astraeus.server.routers import users as users_router  # users and their tokens (issue 45)
from astraeus.server.services import tx
from astraeus.settings import ServerSettings

__all__ = ["create_api", "tx"]

# Long-polls each hold a worker thread; allow many (one per agent). Log follows hold none while they wait.
THREADS = 400

# In the order /openapi.json lists them.
# The agent protocol first: most of a fleet's requests (every agent's report each heartbeat, its long-poll), and a
# request is matched against the routers in this order (with many agents, matching past the others was a visible
# share of the event loop; benchmarks/bench_agents.py). Its paths are its own, so the order changes no answer.
ROUTERS = (agent, health, workspace, runs, templates, schedules, replica_groups, workers, drives, registries, events,
           machines, admin, pools, reservations, exec_router, users_router, audit_router, machine_health,
           usage, sso_router)


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


class BodyLimit:
    """Refuse a request body over `limit` bytes with 413 TOO_LARGE before reading it: at once when its
    Content-Length says so, else as soon as the streamed bytes pass the limit (what was read is dropped). Pure
    ASGI, ahead of every route and of authentication, so an unauthenticated 50 MB POST costs nothing."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _too_large(self, what: str) -> dict:
        return {"code": "TOO_LARGE",
                "message": f"request body over {mib(self.limit)}: {what}; send a smaller body (a run's large files "
                           "belong on a drive; the limit is the server's ASTRAEUS_MAX_BODY_BYTES)"}

    async def _answer(self, send, body: dict) -> None:
        raw = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": raw})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = 0
                if n > self.limit:
                    return await self._answer(send, self._too_large(f"Content-Length is {n} bytes"))
        seen = 0
        over = False
        started = False

        async def counted():
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    over = True  # the app sees a client that left; this answers for it
                    return {"type": "http.disconnect"}
            return msg

        async def guarded(msg):
            nonlocal started
            if over:
                return  # the app's own answer to the "disconnect": dropped, the 413 goes instead
            started = True
            await send(msg)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._answer(send, self._too_large(f"more than {self.limit} bytes were sent"))


# SQLSTATEs after which the whole request is tried again: serialization failure, deadlock, lock not available.
RETRIED = {"40001", "40P01", "55P03"}


def _conflict(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    while exc is not None:
        if isinstance(exc, DBAPIError):
            code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            return code in RETRIED
        exc = exc.__cause__ or exc.__context__
    return False


class RetryConflicts:
    """Try a request again (up to `tries` times, a few milliseconds apart) when the database refused its
    transaction for a conflict with another replica's (serialization failure, deadlock, lock timeout), as long
    as nothing of the answer was sent: the transaction was rolled back, so the route runs again from the
    start. The body is kept for that (BodyLimit, outside, has bounded it). Never a 5xx for a conflict."""

    def __init__(self, app, tries: int = 5):
        self.app, self.tries = app, tries

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        body, more = [], True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return await self.app(scope, replay([msg]), send)
            body.append(msg)
            more = msg.get("more_body", False)
        for attempt in range(self.tries):
            started = False

            async def guarded(msg):
                nonlocal started
                started = True
                await send(msg)

            try:
                return await self.app(scope, replay(list(body)), guarded)
            except Exception as e:
                if started or attempt == self.tries - 1 or not _conflict(e):
                    raise
                await anyio.sleep(0.005 * (2 ** attempt))


def _unreachable(exc: BaseException) -> bool:
    """The database connection broke or could not be made (PostgreSQL restarting, unreachable)."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    code = getattr(exc.orig, "sqlstate", None) or ""
    return exc.connection_invalidated or code.startswith("08") or code in ("57P01", "57P02", "57P03") or (
        not code and type(exc.orig).__name__ == "OperationalError")


def create_api(settings: ServerSettings | None = None, cp: ControlPlane | None = None, run_loop: bool = True) -> FastAPI:
    settings = settings or ServerSettings.load()
    cp = cp or ControlPlane.open(settings)
    loop = SchedulingLoop(cp)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
        if run_loop:
            cp.start_bus()  # PostgreSQL: hear the other replicas' wake-ups, tell them ours
            loop.start()  # leads, or waits as a follower (server/leader.py)
            cp.notifier.wake_scheduler(remote=True)
        yield
        if run_loop:
            loop.stop()  # gives the lease up: another replica leads at once
            cp.stop_bus()
        store = getattr(app.state, "log_store", None)
        if store is not None:  # PostgreSQL: the log store's process (server/log_admission.py)
            store.close()

    # telemetry off: Astraeus exports Prometheus metrics (/metrics), not OpenTelemetry; FastAPI's native telemetry
    # otherwise asks OpenTelemetry's global providers whether it is configured on every request
    app = FastAPI(title="Astraeus", version="0.1.0", lifespan=lifespan,
                  description="GPU cluster workload manager: runs, workers, drives, machines.",
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.cp = cp
    app.state.loop = loop
    errors.install(app)

    from sqlalchemy.exc import DBAPIError

    @app.exception_handler(DBAPIError)
    async def _database(request, exc: DBAPIError):
        """A conflict goes on to RetryConflicts (the request runs again); a database that does not answer is a
        503 saying so (the transaction did not commit, or the client cannot know: it may try again, and a
        submit tried again answers 409 if the first got through); so is a write that failed for want of space
        (server/diskfull.py); anything else stays a 500."""
        full = cp.writes.failed(exc) if cp.writes is not None else None
        if full:
            return errors.error_json(503, "DISK_FULL", full)
        if _unreachable(exc) and not _conflict(exc):
            return errors.error_json(503, "UNAVAILABLE", "the database is not answering (restarting or "
                                     "unreachable): try again in a few seconds")
        raise exc

    @app.exception_handler(OSError)
    async def _no_space(request, exc: OSError):
        """A file the control plane writes (not the database) found no space: 503 with the reason."""
        full = cp.writes.failed(exc) if cp.writes is not None else None
        if full:
            return errors.error_json(503, "DISK_FULL", full)
        raise exc

    app.add_middleware(agent.PlainReports, cp=cp)  # an agent's report: answered here (inside RetryConflicts)
    app.add_middleware(RetryConflicts)
    app.add_middleware(runs.PlainSubmits, cp=cp)  # a plain submit: answered here, ahead of routing and dependencies
    app.add_middleware(BodyLimit, limit=cp.settings.max_body_bytes)
    app.add_middleware(Audited, cp=cp, cookie_name=services.CONSOLE_COOKIE)  # outermost: every change, and refusals
    for module in ROUTERS:
        app.include_router(module.router)

    app.openapi_schema = None
    runs.document_run_body(app)
    return app
