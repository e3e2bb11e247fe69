"""The console's pages for runs, drives, templates, events, machines and settings: their reads and writes go
through `astraeus.server.services` and `astraeus.server.admin`, with the API's own body models, as the API's
routers do. A form is turned into the API's JSON body (`forms`), validated by the API's model, and a refusal is
worded as the API words it. The shared machinery (router, templates, `Page`, `render`) is `astraeus.console.base`;
`astraeus.console.site` gathers every page module for the app (`astraeus.app`)."""

from __future__ import annotations

import hmac
import json
from typing import Any
from urllib.parse import quote

import anyio.from_thread
import anyio.to_thread
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus.console import forms
from astraeus.console.base import (
    COOKIE,
    CSRF_FIELD,
    Page,
    admin_page,
    age,
    base_url,
    check_origin,
    console_session,
    cp_of,
    default_access,
    page,
    parse_json,
    read_form,
    render,
    router,
    session_cookie,
    token_of,
    ws_page,
)
from astraeus.server import admin, services, submits
from astraeus.server import bodies as B
from astraeus.server import templates as run_templates
from astraeus.server.db import Access, Cluster, Org, Workspace
from astraeus.server.pools import list_pools, workspace_pools
from astraeus.server.routers.deps import machine_names, now
from astraeus.server.routers.errors import validation_errors, validation_message
from astraeus.server.services import ApiError, sso, tx
from astraeus.server.services.auth import open_console_session
from astraeus.server.whatif import what_if
from astraeus.units import gpus_asked


# ------------------------------------------------------------------------------------- sign in
@router.get("/")
def home(request: Request):
    with cp_of(request).sessions() as s:
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


@router.get("/sign-in")
def sign_in_form(request: Request, next: str = "/"):
    return render(request, "sign_in.html", None, next=next, error=None)


@router.post("/sign-in")
async def sign_in(request: Request):
    """An API token → a new console session: the cookie holds the session's own random secret (HttpOnly,
    SameSite=Lax, Secure over HTTPS), never the token; the session ends at sign-out, when it expires
    (ASTRAEUS_CONSOLE_SESSION_HOURS) or when its token is revoked."""
    form = await request.form()
    secret = str(form.get("token") or "").strip()
    nxt = str(form.get("next") or "/")
    if not nxt.startswith("/") or nxt.startswith("//"):
        nxt = "/"
    try:
        check_origin(request)
    except ApiError as e:
        return render(request, "error.html", None, status=e.status, error=e)
    hours = cp_of(request).settings.console_session_hours
    cookie = ""

    def start() -> str | None:
        nonlocal cookie
        with cp_of(request).sessions() as s:
            try:
                tok = services.authenticate(s, f"Bearer {secret}")
            except ApiError as e:
                return e.message
            if tok.kind == "machine":
                return "a machine token cannot sign in to the console: use a user or organisation admin token"
            with tx(s):
                cookie = open_console_session(s, tok, hours)
        return None

    error = await anyio.to_thread.run_sync(start) if secret else "paste an API token"
    if error:
        return render(request, "sign_in.html", None, status=401, next=nxt, error=error)
    return session_cookie(request, RedirectResponse(nxt, status_code=303), cookie, hours)


@router.post("/sign-out")
def sign_out(request: Request):
    """Ends the console session: its row is marked revoked, so the old cookie opens nothing any more."""
    with cp_of(request).sessions() as s:
        try:
            check_origin(request)
            cs = console_session(s, request)
            if cs is not None:
                sent = read_form(request).get(CSRF_FIELD, "")
                if not hmac.compare_digest(sent.encode(), cs.csrf.encode()):
                    raise ApiError(403, "FORBIDDEN", "the form's CSRF token is missing or wrong: reload the page "
                                                     "and sign out from there")
                with tx(s):
                    cs.revoked = True
            provider_end = sso.end_session_url(s, cs, base_url(request) + "/sign-in")  # signed in by SSO
        except ApiError as e:
            return render(request, "error.html", None, status=e.status, error=e)
    resp = RedirectResponse(provider_end or "/sign-in", status_code=303)
    resp.delete_cookie(COOKIE, path="/")
    return resp


# ------------------------------------------------------------------------------------------ runs
RUNS_PAGE = 100  # runs on one page of the runs page: newest first, then Next (GET $API/runs' default page)


def runs_rows(request: Request, s: Session, p: Page, state: str | None, label: str = "",
              cursor: str = "") -> tuple[list[dict], str | None]:
    """One page of the runs (in `state`, with the labels of `label`: key=value,...) after `cursor`, and the next
    page's cursor (None on the last one): as GET $API/runs, whose 422s (naming label or cursor) it raises."""
    from astraeus.server.db import Machine
    from astraeus.server.routers.events import decode_cursor, encode_cursor

    labels = services.parse_label_selector([label] if label else None)
    after = decode_cursor(cursor or None, (float, int))
    runs = services.list_runs(s, p.caller, state or None, labels, after, RUNS_PAGE + 1)
    more, runs = len(runs) > RUNS_PAGE, runs[:RUNS_PAGE]
    at = now()
    clusters = {cl.id: cl for cl in s.scalars(select(Cluster))}
    mids = {w.machine_id for r in runs for w in r.workers if w.machine_id is not None}
    names = dict(s.execute(select(Machine.id, Machine.name).where(Machine.id.in_(mids))).all()) if mids else {}
    rows = []
    for run in runs:
        v = services.run_view(run, p.org, p.ws, clusters[run.cluster_id], base_url(request), None, names, p.role)
        tt = v["spec"]["task_template"]
        rows.append({"v": v, "age": age(run.created_at, at),
                     "gpus": gpus_asked(tt.get("requested_resources") or {}),
                     "url": f"{p.base}/jobs/{v['metadata']['cluster']}/{run.name}"})
    return rows, encode_cursor((runs[-1].created_at, runs[-1].id)) if more else None


def _runs_query(**params: str | None) -> str:
    from urllib.parse import urlencode

    kept = {k: v for k, v in params.items() if v}
    return "?" + urlencode(kept) if kept else ""


@router.get("/o/{org}/w/{ws}/runs")
@page
def runs(request: Request, org: str, ws: str, state: str = "", label: str = "", cursor: str = ""):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        rows, next_cursor = runs_rows(request, s, p, state, label, cursor)
        return render(request, "runs.html", p, nav="runs", state=state, label=label, rows=rows,
                      cannot_submit=p.cannot("editor"), first_page=not cursor,
                      state_query=lambda st: _runs_query(state=st, label=label),
                      newest_url=_runs_query(state=state, label=label),
                      next_url=_runs_query(state=state, label=label, cursor=next_cursor) if next_cursor else None,
                      live_query=_runs_query(state=state, label=label, cursor=cursor))


@router.get("/o/{org}/w/{ws}/runs/live")
@page
def runs_live(request: Request, org: str, ws: str, state: str = "", label: str = "", cursor: str = ""):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "_runs_rows.html", p, rows=runs_rows(request, s, p, state, label, cursor)[0],
                      state=state, label=label)


def new_run_page(request: Request, s: Session, p: Page, *, mode: str = "form", values: dict | None = None,
                 spec_json: str = "", error: str | None = None, errors: list | None = None, status: int = 200,
                 whatif: dict | None = None):
    acc = default_access(s, request, p.caller)
    vals = {**forms.RUN_DEFAULTS, **(values or {})}
    tpls = run_templates.listed(s, p.caller)
    chosen = next((t for t in tpls if t.name == vals.get("template")), None)
    return render(request, "new_run.html", p, status=status, nav="runs", mode=mode, values=vals,
                  run_templates=[t.name for t in tpls], chosen=chosen,
                  spec_json=spec_json, error=error, errors=errors or [], access=acc,
                  max_priority=S.highest_priority_allowed(acc["max_priority"] if acc else 0), cannot_submit=p.cannot("editor"),
                  machines=services.machines_view(s, services.granted_cluster_ids(s, p.caller)),
                  drives=[d.name for d in services.list_drives(s, p.caller)],
                  pools=sorted({x["name"] for x in workspace_pools(s, p.caller)}), whatif=whatif)


@router.get("/o/{org}/w/{ws}/runs/new")
@page
def new_run_form(request: Request, org: str, ws: str, template: str = ""):
    """New run; `?template=NAME` (New run → from a template) fills the form with the template's values."""
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        if not template:
            return new_run_page(request, s, p)
        try:
            t = run_templates.get(s, p.caller, template)
        except ApiError as e:
            return new_run_page(request, s, p, error=e.message, status=e.status)
        return new_run_page(request, s, p, values={**forms.template_values(t.spec or {}), "template": t.name})


@router.post("/o/{org}/w/{ws}/runs/new")
@page
def new_run(request: Request, org: str, ws: str):
    form = read_form(request)
    mode = form.get("mode", "form")
    action = form.get("action", "start")
    values = {k: form.get(k, "") for k in forms.RUN_FIELDS}
    with cp_of(request).sessions() as s:
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
        answer = None
        try:
            raw = parse_json(spec_json) if mode == "json" else forms.run_body(form)
            if action == "whatif":  # as POST $API/runs?dry_run=true: nothing is stored
                answer = what_if(s, p.caller, raw, now())
            else:
                with tx(s):  # as POST $API/runs: a template it names is merged in first
                    run = submits.submit_run_body(s, p.caller, raw, now())
                    url = f"{p.base}/jobs/{s.get(Cluster, run.cluster_id).name}/{run.name}"
        except forms.FormError as e:
            return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=str(e),
                                status=422)
        except services.InvalidBody as e:
            msg, errs = validation_errors(e.errors)
            return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=msg,
                                errors=errs, status=422)
        except (ValidationError, RequestValidationError) as e:
            msg, errs = validation_message(e)
            return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=msg,
                                errors=errs, status=422)
        except ApiError as e:
            if e.status == 401:
                raise
            return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, error=e.message,
                                status=e.status)
        if answer is not None:
            return new_run_page(request, s, p, mode=mode, values=values, spec_json=spec_json, whatif=answer)
    cp_of(request).notifier.wake_scheduler()
    return RedirectResponse(url, status_code=303)


# ------------------------------------------------------------------------------------------- run
def run_ctx(request: Request, s: Session, p: Page, cluster: str, name: str) -> dict:
    run = services.get_run(s, p.caller, name)
    cl = s.get(Cluster, run.cluster_id)
    if cl.name != cluster:
        raise ApiError(404, "NOT_FOUND", f"run {name} not found in workspace {p.ws.name} on cluster {cluster}")
    v = services.run_view(run, p.org, p.ws, cl, base_url(request), services.run_history(s, run), machine_names(s),
                          p.role)
    return {"v": v, "run_url": f"{p.base}/jobs/{cl.name}/{run.name}", "age": age(run.created_at, now())}


@router.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}")
@page
def run_page(request: Request, org: str, ws: str, cluster: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        ctx = run_ctx(request, s, p, cluster, name)
        return render(request, "run.html", p, nav="runs", cannot_delete=p.cannot("editor"),
                      terminal=terminal_ctx(s, p, name), **ctx)


def terminal_ctx(s: Session, p: Page, name: str) -> dict | None:
    """The Terminal panel, for editors and admins: the exec stream's URL (the API's own WebSocket, signed in by the
    console's cookie) and the running workers to choose from. With none running the panel is hidden until the live
    part of the page lists one (terminal.js)."""
    if p.cannot("editor"):
        return None
    run = services.get_run(s, p.caller, name)
    running = [(w.index, w.name) for w in sorted(run.workers, key=lambda w: w.index) if w.state == "Running"]
    return {"url": f"/api/v1/o/{p.org.name}/w/{p.ws.name}/runs/{run.name}/exec", "workers": running}


@router.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}/live")
@page
def run_live(request: Request, org: str, ws: str, cluster: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "_run_live.html", p, **run_ctx(request, s, p, cluster, name))


@router.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}/logs")
@page
def run_logs(request: Request, org: str, ws: str, cluster: str, name: str, worker: str = "", after: int = 0):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        run_ctx(request, s, p, cluster, name)
        wk = services.get_worker(s, p.caller, worker or f"{name}-0")
        if wk.run.name != name:
            raise ApiError(404, "NOT_FOUND", f"worker {worker} not found in run {name}")
        lines = services.read_logs(s, wk, after_id=after, tail=None if after else 1000)
        return JSONResponse({"lines": [ln.text for ln in lines], "after": lines[-1].id if lines else after})


@router.post("/o/{org}/w/{ws}/jobs/{cluster}/{name}/delete")
@page
def run_delete(request: Request, org: str, ws: str, cluster: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        run_ctx(request, s, p, cluster, name)
        with tx(s):
            _, machines = services.delete_run(s, p.caller, name, now())
    cp_of(request).notifier.bump_machines(machines)
    cp_of(request).notifier.wake_scheduler()
    return RedirectResponse(f"/o/{org}/w/{ws}/runs?deleted={quote(name)}", status_code=303)


# ---------------------------------------------------------------------------------------- drives
def drives_page(request: Request, s: Session, p: Page, **ctx: Any):
    items = [services.drive_out(s, p.caller, d) for d in services.list_drives(s, p.caller)]
    return render(request, "drives.html", p, nav="drives", drives=items, cannot_edit=p.cannot("editor"), **ctx)


@router.get("/o/{org}/w/{ws}/drives")
@page
def drives(request: Request, org: str, ws: str, deleted: str = ""):
    with cp_of(request).sessions() as s:
        return drives_page(request, s, ws_page(s, request, org, ws), deleted=deleted)


def new_drive_page(request: Request, s: Session, p: Page, values: dict, error: str | None = None,
                   status: int = 200):
    acc = default_access(s, request, p.caller)
    machines = services.machines_view(s, services.granted_cluster_ids(s, p.caller))
    return render(request, "new_drive.html", p, status=status, nav="drives", values=values, error=error,
                  access=acc, cannot_edit=p.cannot("editor"), machines=machines,
                  filesystems=sorted({fs for m in machines for fs in m["shared_filesystems"]}))


@router.get("/o/{org}/w/{ws}/drives/new")
@page
def new_drive_form(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        return new_drive_page(request, s, ws_page(s, request, org, ws),
                              {"mode": "ReadWrite", "transport": "Auto", "create": "on"})


@router.post("/o/{org}/w/{ws}/drives/new")
@page
def new_drive(request: Request, org: str, ws: str):
    form = read_form(request)
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        try:
            body = S.DriveCreate.model_validate(forms.drive_body(form))
            with tx(s):
                services.create_drive(s, p.caller, body, now())
        except forms.FormError as e:
            return new_drive_page(request, s, p, form, str(e), 422)
        except ValidationError as e:
            return new_drive_page(request, s, p, form, validation_message(e)[0], 422)
        except ApiError as e:
            if e.status == 401:
                raise
            return new_drive_page(request, s, p, form, e.message, e.status)
    return RedirectResponse(f"/o/{org}/w/{ws}/drives", status_code=303)


@router.post("/o/{org}/w/{ws}/drives/{name}/delete")
@page
def drive_delete(request: Request, org: str, ws: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        with tx(s):
            services.delete_drive(s, p.caller, name, now())
    return RedirectResponse(f"/o/{org}/w/{ws}/drives?deleted={quote(name)}", status_code=303)


# ------------------------------------------------------------------------------------- templates
def templates_page(request: Request, s: Session, p: Page, **ctx: Any):
    items = [run_templates.view(t, p.caller) for t in run_templates.listed(s, p.caller)]
    return render(request, "run_templates.html", p, nav="templates", items=items, cannot_edit=p.cannot("editor"),
                  **ctx)


@router.get("/o/{org}/w/{ws}/templates")
@page
def templates_list(request: Request, org: str, ws: str, deleted: str = ""):
    with cp_of(request).sessions() as s:
        return templates_page(request, s, ws_page(s, request, org, ws), deleted=deleted)


@router.get("/o/{org}/w/{ws}/templates/{name}")
@page
def template_show(request: Request, org: str, ws: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        v = run_templates.view(run_templates.get(s, p.caller, name), p.caller)
        return render(request, "run_template.html", p, nav="templates", v=v, cannot_edit=p.cannot("editor"),
                      users=run_templates.users(s, p.ws.id, name))


@router.post("/o/{org}/w/{ws}/templates/{name}/delete")
@page
def template_delete(request: Request, org: str, ws: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        try:
            with tx(s):
                run_templates.delete(s, p.caller, name, now())
        except ApiError as e:
            if e.status != 409:
                raise
            return templates_page(request, s, p, error=e.message, status=409)
    return RedirectResponse(f"/o/{org}/w/{ws}/templates?deleted={quote(name)}", status_code=303)


# ---------------------------------------------------------------------------- events, machines
def events_ctx(s: Session, p: Page) -> dict:
    return {"events": [services.event_view(e) for e in services.list_events(s, p.caller, 200)]}


@router.get("/o/{org}/w/{ws}/events")
@page
def events(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "events.html", p, nav="events", **events_ctx(s, p))


@router.get("/o/{org}/w/{ws}/events/live")
@page
def events_live(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "_events_rows.html", p, **events_ctx(s, p))


def machines_ctx(s: Session, p: Page) -> dict:
    """The workspace's machines, each with the pools it is in (as GET $API/machines), and the pools it may use
    (as GET $API/pools)."""
    machines = services.machines_view(s, services.granted_cluster_ids(s, p.caller))
    pools = workspace_pools(s, p.caller)
    for m in machines:
        if "pools" not in m:
            m["pools"] = [x["name"] for x in pools if x["cluster"] == m["cluster"] and m["name"] in x["machines"]]
    from astraeus.console.usage_pages import machine_sparks  # its GPUs in use over the last 24 h

    return {"machines": machines, "pools": pools, "sparks": machine_sparks(s, machines, now())}


@router.get("/o/{org}/w/{ws}/machines")
@page
def machines(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "machines.html", p, nav="machines", **machines_ctx(s, p))


@router.get("/o/{org}/w/{ws}/machines/live")
@page
def machines_live(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "_machines_rows.html", p, **machines_ctx(s, p))


# -------------------------------------------------------------------------------------- settings
def settings_ctx(s: Session, p: Page) -> dict:
    clusters = list(s.scalars(select(Cluster).where(Cluster.org_id == p.org.id).order_by(Cluster.id)))
    rows = []
    for ws in s.scalars(select(Workspace).where(Workspace.org_id == p.org.id).order_by(Workspace.id)):
        for cl, acc in s.execute(select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id)
                                 .where(Access.workspace_id == ws.id).order_by(Cluster.id)).all():
            rows.append({"workspace": ws.name, "ns": ws.ns, **services.access_view(cl, acc)})
    return {"clusters": [{"name": cl.name, "preemption": cl.preemption,
                          "machines": services.machines_view(s, [cl.id]), "pools": list_pools(s, p.caller, cl.name),
                          "access": [x for x in rows if x["name"] == cl.name]} for cl in clusters],
            "rows": rows}


@router.get("/o/{org}/settings")
@page
def settings(request: Request, org: str, saved: str = ""):
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        return render(request, "settings.html", p, nav="settings", saved=saved, **settings_ctx(s, p))


def access_of(s: Session, p: Page, cluster: str, ws: str) -> tuple[Cluster, Workspace, dict]:
    """The workspace's access to the cluster as the admin API shows it (its defaults when it has none yet)."""
    cl = admin.cluster_named(s, p.caller, cluster)
    w = admin.workspace_named(s, p.caller, ws)
    acc = s.scalar(select(Access).where(Access.workspace_id == w.id, Access.cluster_id == cl.id))
    view = services.access_view(cl, acc or Access(max_priority=0, weight=1.0, host_paths=[]))
    return cl, w, view


def change_access_page(request: Request, s: Session, p: Page, cluster: str, workspace: str, view: dict, *,
                       values: dict | None = None, error: str | None = None, errors: list | None = None,
                       status: int = 200) -> HTMLResponse:
    return render(request, "settings_change.html", p, status=status, nav="settings", cluster=cluster,
                  workspace=workspace, a=view, values=values, error=error, errors=errors or [],
                  cluster_pools=[x["name"] for x in list_pools(s, p.caller, cluster)])


@router.get("/o/{org}/settings/clusters/{cluster}/workspaces/{ws}")
@page
def change_access_form(request: Request, org: str, cluster: str, ws: str):
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        _, w, view = access_of(s, p, cluster, ws)
        return change_access_page(request, s, p, cluster, w.name, view)


@router.post("/o/{org}/settings/clusters/{cluster}/workspaces/{ws}")
@page
def change_access(request: Request, org: str, cluster: str, ws: str):
    """Settings → Clusters → Change: the body of PATCH $ORG_API/workspaces/{ws}, validated by the API's model
    and applied by the API's service, so the form refuses what the API refuses, with the API's message."""
    form = read_form(request)
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        cl, w, view = access_of(s, p, cluster, ws)
        try:
            body = B.WorkspacePatch.model_validate(forms.access_body(form, cl.name))
            with tx(s):
                admin.update_workspace(s, p.caller, w.name, body.model_dump(exclude_unset=True))
        except ValidationError as e:
            msg, errs = validation_message(e)
            return change_access_page(request, s, p, cluster, w.name, view, values=form, error=msg, errors=errs,
                                      status=422)
        except ApiError as e:
            if e.status == 401:
                raise
            return change_access_page(request, s, p, cluster, w.name, view, values=form, error=e.message,
                                      status=e.status)
    cp_of(request).notifier.wake_scheduler()
    return RedirectResponse(f"/o/{org}/settings?saved={quote(ws)}", status_code=303)

