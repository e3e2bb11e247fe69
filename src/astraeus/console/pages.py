"""The console's routes. Every read and write goes through `astraeus.server.services`, as the API's do."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio.from_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus.cli.format import human_bytes, human_duration
from astraeus.console import forms
from astraeus.server import services
from astraeus.server.core import ControlPlane
from astraeus.server.db import Access, Cluster, Drive, Machine, Org, Token, Workspace
from astraeus.server.services import ApiError, Caller

HERE = Path(__file__).parent
COOKIE = "astraeus_token"
STATES = ("Pending", "Starting", "Running", "Stopping", "Completed", "Failed", "Cancelled")
TRANSPORTS = (("Auto", "RDMA when both have it, else TCP"), ("TCP", "TCP"), ("RDMA", "RDMA"))
STATIC = "/console/static"


def _age(t: float | None, now: float) -> str:
    return human_duration(max(1, now - t)) if t else ""


def _tx(s: Session):
    from astraeus.server.app import tx  # the API's commit-or-nothing block

    return tx(s)


class Page:
    """What every signed-in page knows: who calls, in which organisation and workspace."""

    def __init__(self, s: Session, caller: Caller, ws: Workspace | None):
        self.caller = caller
        self.org = caller.org
        self.ws = ws
        self.org_admin = caller.org_admin
        self.role = caller.role
        if caller.org_admin:
            self.workspaces = [w.name for w in s.scalars(select(Workspace).where(Workspace.org_id == caller.org.id)
                                                         .order_by(Workspace.id))]
        else:
            self.workspaces = [ws.name] if ws else []

    @property
    def base(self) -> str:
        return f"/o/{self.org.name}/w/{self.ws.name}" if self.ws else f"/o/{self.org.name}"

    def cannot(self, role: str) -> str | None:
        """The API's refusal for this caller, or None when it may."""
        try:
            services.require(self.caller, role)
        except ApiError as e:
            return e.message
        return None


def mount(app: FastAPI, cp: ControlPlane) -> None:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters["bytes"] = human_bytes
    env.filters["duration"] = human_duration
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
    env.globals["STATIC"] = STATIC
    env.globals["STATES"] = STATES
    env.globals["TRANSPORTS"] = TRANSPORTS
    base_url = cp.settings.console_base
    validation_handler = app.exception_handlers[RequestValidationError]
    r = APIRouter(include_in_schema=False)

    # --------------------------------------------------------------------------------------- plumbing
    def authorization(request: Request) -> str | None:
        h = request.headers.get("authorization")
        if h:
            return h
        t = request.cookies.get(COOKIE)
        return f"Bearer {t}" if t else None

    def token_of(s: Session, request: Request) -> Token:
        tok = services.authenticate(s, authorization(request))
        if tok.kind == "machine":
            raise ApiError(403, "FORBIDDEN", "a machine token cannot call user endpoints")
        return tok

    def ws_page(s: Session, request: Request, org: str, ws: str) -> Page:
        c = services.workspace_caller(s, token_of(s, request), org, ws)
        return Page(s, c, c.workspace)

    def render(request: Request, name: str, page: Page | None, status: int = 200, **ctx: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"p": page, **ctx}, status_code=status)

    def error_page(request: Request, e: ApiError) -> Response:
        if e.status == 401 and "authorization" not in request.headers:
            return RedirectResponse(f"/sign-in?next={quote(request.url.path)}", status_code=303)
        return render(request, "error.html", None, status=e.status, error=e)

    def page(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ApiError as e:
                return error_page(kwargs["request"], e)

        return wrapper

    def validation_message(e: ValidationError | RequestValidationError) -> tuple[str, list[dict]]:
        """Pydantic errors worded exactly as the API's 422 handler words them (it is called, not copied)."""
        exc = e if isinstance(e, RequestValidationError) else RequestValidationError(e.errors())
        resp = anyio.from_thread.run(validation_handler, None, exc)
        data = json.loads(bytes(resp.body))
        return data["message"], data.get("errors", [])

    def parse_json(text: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:  # as FastAPI reports a body that is not JSON
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                           "input": {}, "ctx": {"error": e.msg}}]) from None

    def default_access(s: Session, c: Caller) -> dict | None:
        view = services.workspace_view(s, c, base_url())
        return view["clusters"][0] if view["clusters"] else None

    def cluster_ids(s: Session, c: Caller) -> list[int]:
        return list(s.scalars(select(Access.cluster_id).where(Access.workspace_id == c.workspace.id)))

    # ------------------------------------------------------------------------------------- sign in
    @r.get("/")
    def home(request: Request):
        with cp.sessions() as s:
            try:
                tok = token_of(s, request)
            except ApiError:
                return RedirectResponse("/sign-in", status_code=303)
            org = s.get(Org, tok.org_id)
            ws = s.get(Workspace, tok.workspace_id) if tok.workspace_id else s.scalar(
                select(Workspace).where(Workspace.org_id == org.id).order_by(Workspace.id))
            if ws is None:
                return RedirectResponse(f"/o/{org.name}/settings", status_code=303)
            return RedirectResponse(f"/o/{org.name}/w/{ws.name}/runs", status_code=303)

    @r.get("/sign-in")
    def sign_in_form(request: Request, next: str = "/"):
        return render(request, "sign_in.html", None, next=next, error=None)

    @r.post("/sign-in")
    async def sign_in(request: Request):
        form = await request.form()
        secret = str(form.get("token") or "").strip()
        nxt = str(form.get("next") or "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"

        def check() -> str | None:
            with cp.sessions() as s:
                try:
                    tok = services.authenticate(s, f"Bearer {secret}")
                except ApiError as e:
                    return e.message
                if tok.kind == "machine":
                    return "a machine token cannot sign in to the console: use a user or organisation admin token"
            return None

        error = await anyio.to_thread.run_sync(check) if secret else "paste an API token"
        if error:
            return render(request, "sign_in.html", None, status=401, next=nxt, error=error)
        resp = RedirectResponse(nxt, status_code=303)
        resp.set_cookie(COOKIE, secret, httponly=True, samesite="lax", max_age=30 * 86400)
        return resp

    @r.post("/sign-out")
    def sign_out(request: Request):
        resp = RedirectResponse("/sign-in", status_code=303)
        resp.delete_cookie(COOKIE)
        return resp

    # ------------------------------------------------------------------------------------------ runs
    def runs_rows(s: Session, p: Page, state: str | None) -> list[dict]:
        now = time.time()
        clusters = {cl.id: cl for cl in s.scalars(select(Cluster))}
        rows = []
        for run in services.list_runs(s, p.caller, state or None):
            v = services.run_view(run, p.org, p.ws, clusters[run.cluster_id], base_url(), None, {})
            tt = v["spec"]["task_template"]
            rows.append({"v": v, "age": _age(run.created_at, now),
                         "gpus": tt.get("requested_resources", {}).get("gpu_requests", {}).get("count", 0),
                         "url": f"{p.base}/jobs/{v['metadata']['cluster']}/{run.name}"})
        return rows

    @r.get("/o/{org}/w/{ws}/runs")
    @page
    def runs(request: Request, org: str, ws: str, state: str = ""):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "runs.html", p, nav="runs", state=state, rows=runs_rows(s, p, state),
                          cannot_submit=p.cannot("editor"))

    @r.get("/o/{org}/w/{ws}/runs/live")
    @page
    def runs_live(request: Request, org: str, ws: str, state: str = ""):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "_runs_rows.html", p, rows=runs_rows(s, p, state))

    def new_run_page(request: Request, s: Session, p: Page, *, mode: str = "form", values: dict | None = None,
                     spec_json: str = "", error: str | None = None, errors: list | None = None, status: int = 200):
        acc = default_access(s, p.caller)
        vals = {**forms.RUN_DEFAULTS, **(values or {})}
        return render(request, "new_run.html", p, status=status, nav="runs", mode=mode, values=vals,
                      spec_json=spec_json, error=error, errors=errors or [], access=acc,
                      max_priority=acc["max_priority"] if acc else 0, cannot_submit=p.cannot("editor"),
                      machines=services.machines_view(s, cluster_ids(s, p.caller)),
                      drives=[d.name for d in s.scalars(select(Drive).where(Drive.workspace_id == p.ws.id)
                                                       .order_by(Drive.name))])

    @r.get("/o/{org}/w/{ws}/runs/new")
    @page
    def new_run_form(request: Request, org: str, ws: str):
        with cp.sessions() as s:
            return new_run_page(request, s, ws_page(s, request, org, ws))

    @r.post("/o/{org}/w/{ws}/runs/new")
    @page
    def new_run(request: Request, org: str, ws: str):
        form = {k: str(v) for k, v in anyio.from_thread.run(request.form).items()}
        mode = form.get("mode", "form")
        action = form.get("action", "start")
        values = {k: form.get(k, "") for k in forms.RUN_FIELDS}
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            if mode == "form" and action == "json":  # Edit as JSON: the same spec, as the API takes it
                try:
                    body = forms.run_body(form)
                except forms.FormError as e:
                    return new_run_page(request, s, p, values=values, error=str(e), status=422)
                return new_run_page(request, s, p, mode="json", values=values,
                                    spec_json=json.dumps(body, indent=2, ensure_ascii=False))
            if mode == "json" and action == "form":
                return new_run_page(request, s, p, values=values)
            spec_json = form.get("spec_json", "")
            try:
                raw = parse_json(spec_json) if mode == "json" else forms.run_body(form)
                body = S.RunCreate.model_validate(raw)
                with _tx(s):
                    run = services.submit_run(s, p.caller, body, time.time())
                    url = f"{p.base}/jobs/{s.get(Cluster, run.cluster_id).name}/{run.name}"
            except forms.FormError as e:
                return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=str(e),
                                    status=422)
            except (ValidationError, RequestValidationError) as e:
                msg, errs = validation_message(e)
                return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=msg,
                                    errors=errs, status=422)
            except ApiError as e:
                if e.status == 401:
                    raise
                return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=e.message,
                                    status=e.status)
        cp.notifier.wake_scheduler()
        return RedirectResponse(url, status_code=303)

    # ------------------------------------------------------------------------------------------- run
    def run_ctx(s: Session, p: Page, cluster: str, name: str) -> dict:
        run = services.get_run(s, p.caller, name)
        cl = s.get(Cluster, run.cluster_id)
        if cl.name != cluster:
            raise ApiError(404, "NOT_FOUND", f"run {name} not found in workspace {p.ws.name} on cluster {cluster}")
        names = dict(s.execute(select(Machine.id, Machine.name)).all())
        v = services.run_view(run, p.org, p.ws, cl, base_url(), services.run_history(s, run), names)
        return {"v": v, "run_url": f"{p.base}/jobs/{cl.name}/{run.name}", "age": _age(run.created_at, time.time())}

    @r.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}")
    @page
    def run_page(request: Request, org: str, ws: str, cluster: str, name: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            ctx = run_ctx(s, p, cluster, name)
            return render(request, "run.html", p, nav="runs", cannot_delete=p.cannot("editor"), **ctx)

    @r.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}/live")
    @page
    def run_live(request: Request, org: str, ws: str, cluster: str, name: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "_run_live.html", p, **run_ctx(s, p, cluster, name))

    @r.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}/logs")
    @page
    def run_logs(request: Request, org: str, ws: str, cluster: str, name: str, worker: str = "", after: int = 0):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            run_ctx(s, p, cluster, name)
            wk = services.get_worker(s, p.caller, worker or f"{name}-0")
            if wk.run.name != name:
                raise ApiError(404, "NOT_FOUND", f"worker {worker} not found in run {name}")
            lines = services.read_logs(s, wk, after_id=after, tail=None if after else 1000)
            return JSONResponse({"lines": [ln.text for ln in lines], "after": lines[-1].id if lines else after})

    @r.post("/o/{org}/w/{ws}/jobs/{cluster}/{name}/delete")
    @page
    def run_delete(request: Request, org: str, ws: str, cluster: str, name: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            run_ctx(s, p, cluster, name)
            with _tx(s):
                _, machines = services.delete_run(s, p.caller, name, time.time())
        cp.notifier.bump_machines(machines)
        cp.notifier.wake_scheduler()
        return RedirectResponse(f"/o/{org}/w/{ws}/runs?deleted={quote(name)}", status_code=303)

    # ---------------------------------------------------------------------------------------- drives
    def drives_page(request: Request, s: Session, p: Page, **ctx: Any):
        ds = s.scalars(select(Drive).where(Drive.workspace_id == p.ws.id).order_by(Drive.name))
        items = [services.drive_view(d, p.ws, s.get(Cluster, d.cluster_id)) for d in ds]
        return render(request, "drives.html", p, nav="drives", drives=items, cannot_edit=p.cannot("editor"), **ctx)

    @r.get("/o/{org}/w/{ws}/drives")
    @page
    def drives(request: Request, org: str, ws: str, deleted: str = ""):
        with cp.sessions() as s:
            return drives_page(request, s, ws_page(s, request, org, ws), deleted=deleted)

    def new_drive_page(request: Request, s: Session, p: Page, values: dict, error: str | None = None,
                       status: int = 200):
        acc = default_access(s, p.caller)
        return render(request, "new_drive.html", p, status=status, nav="drives", values=values, error=error,
                      access=acc, cannot_edit=p.cannot("editor"),
                      machines=services.machines_view(s, cluster_ids(s, p.caller)))

    @r.get("/o/{org}/w/{ws}/drives/new")
    @page
    def new_drive_form(request: Request, org: str, ws: str):
        with cp.sessions() as s:
            return new_drive_page(request, s, ws_page(s, request, org, ws),
                                  {"mode": "ReadWrite", "transport": "Auto", "create": "on"})

    @r.post("/o/{org}/w/{ws}/drives/new")
    @page
    def new_drive(request: Request, org: str, ws: str):
        form = {k: str(v) for k, v in anyio.from_thread.run(request.form).items()}
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            try:
                body = S.DriveCreate.model_validate(forms.drive_body(form))
                with _tx(s):
                    services.create_drive(s, p.caller, body, time.time())
            except forms.FormError as e:
                return new_drive_page(request, s, p, form, str(e), 422)
            except ValidationError as e:
                return new_drive_page(request, s, p, form, validation_message(e)[0], 422)
            except ApiError as e:
                if e.status == 401:
                    raise
                return new_drive_page(request, s, p, form, e.message, e.status)
        return RedirectResponse(f"/o/{org}/w/{ws}/drives", status_code=303)

    @r.post("/o/{org}/w/{ws}/drives/{name}/delete")
    @page
    def drive_delete(request: Request, org: str, ws: str, name: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            with _tx(s):
                services.delete_drive(s, p.caller, name, time.time())
        return RedirectResponse(f"/o/{org}/w/{ws}/drives?deleted={quote(name)}", status_code=303)

    # ---------------------------------------------------------------------------- events, machines
    def events_ctx(s: Session, p: Page) -> dict:
        return {"events": [{"time": services.iso(e.time), "kind": e.kind, "object": e.object, "message": e.message}
                           for e in services.list_events(s, p.caller, 200)]}

    @r.get("/o/{org}/w/{ws}/events")
    @page
    def events(request: Request, org: str, ws: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "events.html", p, nav="events", **events_ctx(s, p))

    @r.get("/o/{org}/w/{ws}/events/live")
    @page
    def events_live(request: Request, org: str, ws: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "_events_rows.html", p, **events_ctx(s, p))

    @r.get("/o/{org}/w/{ws}/machines")
    @page
    def machines(request: Request, org: str, ws: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "machines.html", p, nav="machines",
                          machines=services.machines_view(s, cluster_ids(s, p.caller)))

    @r.get("/o/{org}/w/{ws}/machines/live")
    @page
    def machines_live(request: Request, org: str, ws: str):
        with cp.sessions() as s:
            p = ws_page(s, request, org, ws)
            return render(request, "_machines_rows.html", p,
                          machines=services.machines_view(s, cluster_ids(s, p.caller)))

    # -------------------------------------------------------------------------------------- settings
    def admin_page(s: Session, request: Request, org: str) -> Page:
        c = services.org_admin_caller(s, token_of(s, request), org)
        ws = s.scalar(select(Workspace).where(Workspace.org_id == c.org.id).order_by(Workspace.id))
        return Page(s, c, ws)

    def settings_ctx(s: Session, p: Page) -> dict:
        clusters = list(s.scalars(select(Cluster).where(Cluster.org_id == p.org.id).order_by(Cluster.id)))
        rows = []
        for ws in s.scalars(select(Workspace).where(Workspace.org_id == p.org.id).order_by(Workspace.id)):
            for cl, acc in s.execute(select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id)
                                     .where(Access.workspace_id == ws.id).order_by(Cluster.id)).all():
                rows.append({"workspace": ws.name, "ns": ws.ns, **services.access_view(cl, acc)})
        return {"clusters": [{"name": cl.name, "preemption": cl.preemption,
                              "machines": services.machines_view(s, [cl.id]),
                              "access": [x for x in rows if x["name"] == cl.name]} for cl in clusters],
                "rows": rows}

    @r.get("/o/{org}/settings")
    @page
    def settings(request: Request, org: str, saved: str = ""):
        with cp.sessions() as s:
            p = admin_page(s, request, org)
            return render(request, "settings.html", p, nav="settings", saved=saved, **settings_ctx(s, p))

    def access_of(s: Session, p: Page, cluster: str, ws: str) -> tuple[Cluster, Workspace, dict]:
        cl = s.scalar(select(Cluster).where(Cluster.org_id == p.org.id, Cluster.name == cluster))
        if cl is None:
            raise ApiError(404, "NOT_FOUND", f"cluster {cluster} not found")
        w = s.scalar(select(Workspace).where(Workspace.org_id == p.org.id, Workspace.name == ws))
        if w is None:
            raise ApiError(404, "NOT_FOUND", f"workspace {ws} not found")
        acc = s.scalar(select(Access).where(Access.workspace_id == w.id, Access.cluster_id == cl.id))
        view = services.access_view(cl, acc) if acc else services.access_view(cl, Access(
            max_priority=0, weight=1.0, host_paths=[]))
        return cl, w, view

    @r.get("/o/{org}/settings/clusters/{cluster}/workspaces/{ws}")
    @page
    def change_access_form(request: Request, org: str, cluster: str, ws: str):
        with cp.sessions() as s:
            p = admin_page(s, request, org)
            _, w, view = access_of(s, p, cluster, ws)
            return render(request, "settings_change.html", p, nav="settings", cluster=cluster, workspace=w.name,
                          a=view, error=None, values=None)

    @r.post("/o/{org}/settings/clusters/{cluster}/workspaces/{ws}")
    @page
    def change_access(request: Request, org: str, cluster: str, ws: str):
        form = {k: str(v) for k, v in anyio.from_thread.run(request.form).items()}
        with cp.sessions() as s:
            p = admin_page(s, request, org)
            cl, w, view = access_of(s, p, cluster, ws)
            try:
                fields = _access_fields(form, cluster)
                with _tx(s):
                    services.set_access(s, w, cl, **fields)
            except ValueError as e:
                msg = str(e) if str(e).startswith("clusters.") else f"clusters.{cluster}: {e}"
                return render(request, "settings_change.html", p, nav="settings", cluster=cluster,
                              workspace=w.name, a=view, error=msg, values=form, status=422)
        cp.notifier.wake_scheduler()
        return RedirectResponse(f"/o/{org}/settings?saved={quote(ws)}", status_code=303)

    app.include_router(r)
    app.mount(STATIC, StaticFiles(directory=str(HERE / "static")), name="console-static")


def _access_fields(form: dict[str, str], cluster: str) -> dict:
    """The Change form → services.set_access's keywords, checked as the admin API checks them."""

    def num(key: str, kind=int, label: str | None = None):
        text = (form.get(key) or "").strip()
        if not text:
            return None
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"clusters.{cluster}.{label or key}: {text!r} is not a number") from None

    mp = num("max_priority")
    if mp is not None and not (S.PRIORITY_MIN <= mp <= S.PRIORITY_MAX):
        raise ValueError(f"clusters.{cluster}.max_priority: must be between -1000 and 1000")
    weight = num("weight", float)
    if weight is not None and weight <= 0:
        raise ValueError(f"clusters.{cluster}.weight: must be more than 0")
    mem_gib = num("quota_memory_gib", float, "quota.memory_bytes")
    quota = {"gpus": num("quota_gpus", int, "quota.gpus"), "cpu_cores": num("quota_cpu_cores", float,
                                                                           "quota.cpu_cores"),
             "memory_bytes": int(mem_gib * 1024**3) if mem_gib is not None else None,
             "workers": num("quota_workers", int, "quota.workers")}
    paths = [x.strip() for x in (form.get("host_paths") or "").replace(",", "\n").splitlines() if x.strip()]
    return {"max_priority": mp, "weight": weight, "quota": quota, "host_paths": paths}
