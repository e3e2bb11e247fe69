"""Runs: submit, list, show, delete."""

from __future__ import annotations

import json
import re
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Body, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import select

from astraeus import spec as S
from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import loop, services, submits, whatif
from astraeus.server.asgi import read_request, replay
from astraeus.server.db import Cluster, Machine
from astraeus.server.routers.deps import CP, Base, Sess, WsCaller, machine_names, now, tx, ws_caller
from astraeus.server.routers.errors import error_json
from astraeus.server.routers.events import PAGE_DEFAULT, Cursor, Limit, decode_cursor, page
from astraeus.server.routers.workspace import PREFIX
from astraeus.server.services import Caller

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


def document_run_body(app) -> None:
    """POST /runs reads its body as a JSON object and checks it below the router (a run that names a template is
    complete only once the template's fields are merged in: submits.submit_run_body); /openapi.json still shows
    RunCreate as its body."""
    from pydantic.json_schema import models_json_schema

    build = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        _, defs = models_json_schema([(S.RunCreate, "validation")], ref_template="#/components/schemas/{model}")
        schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        post = schema["paths"][f"{PREFIX}/runs"]["post"]
        post["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/RunCreate"}}}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


@router.post("/runs", status_code=201, responses={  # a JSONResponse (the fast path) or a dict: documented here
    201: {"model": A.RunOut, "description": "The run, as submitted"},
    200: {"model": A.WhatIfOut, "description": "dry_run=true: what the run would do now (nothing is stored)"}})
async def create_run(org: str, ws: str, s: Sess, cp: CP, base: Base, body: Annotated[dict, Body()],
                     response: Response, request: Request,
                     dry_run: Annotated[bool, Query(description="Answer what the run would do if submitted now "
                                                                "(starts where, preempts whom, starts by when, "
                                                                "waits behind whom) and store nothing; refusals "
                                                                "are the submit's")] = False,
                     authorization: Annotated[str | None, Header()] = None):
    """`async def`: the body is checked here, and a plain submit waits for its group commit on the event loop
    (batched), authenticated by the writer with the rest of its batch: no hop through the thread pool at all.
    Everything else finds its caller as WsCaller does (one hop), and only what reads or writes the database besides
    goes to a worker thread."""

    async def caller() -> Caller:
        return await to_thread.run_sync(ws_caller, org, ws, s, authorization)

    if dry_run:
        c = await caller()
        response.status_code = 200
        return await to_thread.run_sync(lambda: whatif.what_if(s, c, body, now()))
    try:
        parsed = submits.parse_run_body(body)  # checked before the state lock (None: names a template)
    except Exception:
        await caller()  # refused as unauthenticated (or not found) first, as before its body is judged
        raise
    if not request.scope.get(UNBATCHED):
        answer = await batched(cp, parsed, authorization, org, ws)
        if answer is not None:
            return answer
    c = await caller()
    org, ws = c.org, c.workspace

    def write():
        with tx(s, keep=(org, ws)):
            run = submits.submit_run_body(s, c, body, now(), parsed=parsed)
            return services.run_view(run, org, ws, run.cluster_row, base, [], {}, c.role)

    out = await to_thread.run_sync(write)
    cp.notifier.wake_scheduler()
    return out


async def batched(cp, parsed: S.RunCreate | None, authorization: str | None, org: str,
                  ws: str) -> JSONResponse | None:
    """A submit through the group commit (server/submits.py), for create_run and PlainSubmits alike: its answer (the
    run's 201, or its refusal's {"code", "message"}, as errors.install answers an ApiError), or None when it does
    not batch or its batch could not be written (it is then submitted on its own)."""
    if not submits.batchable(parsed):
        return None
    it = await cp.submits.submit_async(submits.Submit(parsed, now(), authorization=authorization, org=org, ws=ws))
    if it.fallback:
        return None
    if isinstance(it.error, services.ApiError):
        return error_json(it.error.status, it.error.code, it.error.message)
    if it.error is not None:
        raise it.error
    c = it.caller
    # plain JSON already: answered as is, without FastAPI's jsonable_encoder
    return JSONResponse(services.run_view(it.run, c.org, c.workspace, it.cluster, cp.settings.console_base(), [],
                                          {}, c.role), 201)


UNBATCHED = "astraeus.unbatched"  # in a request's scope: PlainSubmits tried the group commit, submit it on its own
SUBMIT_PATH = re.compile(r"/api/v1/o/([^/]+)/w/([^/]+)/runs")
assert PREFIX + "/runs" == "/api/v1/o/{org}/w/{ws}/runs", "SUBMIT_PATH follows the route's path"


class PlainSubmits:
    """POST /runs answered ahead of FastAPI's middlewares, routing and dependency solving: an adapter that decodes
    the request as create_run's `Body()` would (a JSON object, with `Content-Type: application/json`), parses it
    (submits.parse_run_body) and answers what `batched` answers. Anything it does not answer goes on to the app as
    it came (the body replayed), to create_run: another path or method, a query (dry_run), a body it cannot decode
    or parse (its 422 is create_run's, after authentication), and a submit `batched` leaves (UNBATCHED: not tried
    again). Pure ASGI, inside BodyLimit."""

    def __init__(self, app, cp):
        self.app, self.cp = app, cp

    async def __call__(self, scope, receive, send):
        m = SUBMIT_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if (m is None or scope["method"] != "POST" or scope.get("query_string") or scope.get("root_path")
                or scope.get(UNBATCHED)):
            return await self.app(scope, receive, send)
        authorization, json_body, messages, whole = await read_request(scope, receive)
        parsed = None
        if whole and json_body is not False:
            try:
                parsed = submits.parse_run_body(json.loads(b"".join(msg.get("body", b"") for msg in messages)))
            except Exception:  # not JSON, not an object, not a valid run: create_run says why, as it always has
                parsed = None
        if parsed is None:
            return await self.app(scope, replay(messages), send)
        answer = await batched(self.cp, parsed, authorization, m.group(1), m.group(2))
        if answer is None:
            return await self.app({**scope, UNBATCHED: True}, replay(messages), send)
        await answer(scope, receive, send)


@router.get("/runs", response_model=A.RunPage, response_model_exclude_unset=True)  # answered as a JSONResponse
def list_runs(c: WsCaller, s: Sess, base: Base, state: str | None = None,
              label: Annotated[list[str] | None, Query(
                  max_length=2048, description="Only runs with these labels: key=value, repeated or comma-separated "
                                               "(all must match)")] = None,
              limit: Limit = PAGE_DEFAULT, cursor: Cursor = None,
              job_id: Annotated[int | None, Query(ge=1, lt=2**63, description="Only the run of this numeric job id "
                                                                       "(metadata.job_id)")] = None):
    """The workspace's runs, newest first, a page at a time (see routers/events.py)."""
    labels = services.parse_label_selector(label)
    after = decode_cursor(cursor, (float, int))
    runs = services.list_runs(s, c, state, labels, after, limit + 1, job_id)
    mids = {w.machine_id for r in runs[:limit] for w in r.workers if w.machine_id is not None}
    names = dict(s.execute(select(Machine.id, Machine.name).where(Machine.id.in_(mids))).all()) if mids else {}
    clusters = {cl.id: cl for cl in s.scalars(select(Cluster))}
    # plain JSON already: answered as is, without FastAPI's jsonable_encoder walking every value (half the time of
    # a page of 1000 runs)
    return JSONResponse(page(runs, limit, lambda r: (r.created_at, r.id), lambda r: services.run_view(
        r, c.org, c.workspace, clusters[r.cluster_id], base, None, names, c.role)))


@router.get("/runs/{name}", response_model=A.RunOut, response_model_exclude_unset=True)
def get_run(name: str, c: WsCaller, s: Sess, base: Base):
    run = services.get_run(s, c, name)
    return services.run_view(run, c.org, c.workspace, s.get(Cluster, run.cluster_id), base,
                             services.run_history(s, run), machine_names(s), c.role)


class RunUpdate(S.Strict):
    """PATCH /runs/{name}: what `scontrol update` changes; a field left out stays as it is."""

    priority: Annotated[int, S.Field(ge=-(2**31), lt=2**31)] | None = None
    time_limit_seconds: Annotated[int, S.Field(gt=0, le=365 * 86400)] | None = None
    held: bool | None = S.Field(None, description="true: held (scontrol hold; a Pending run only); false: released")


@router.patch("/runs/{name}", response_model=A.RunOut, response_model_exclude_unset=True)
def update_run(name: str, body: RunUpdate, c: WsCaller, s: Sess, cp: CP, base: Base):
    """A live run's priority (within the workspace's maximum), time limit (null: none) and/or hold; editors."""
    with tx(s):
        run = services.update_run(s, c, name, {k: getattr(body, k) for k in body.model_fields_set}, now())
    loop.forget_spec(run.uid)  # its spec changed: the loop reads it again (it keeps specs, which never changed before)
    cp.notifier.wake_scheduler()  # a full read: the queue's order or a deadline may have changed
    return services.run_view(run, c.org, c.workspace, s.get(Cluster, run.cluster_id), base,
                             services.run_history(s, run), machine_names(s), c.role)


@router.delete("/runs/{name}", response_model=A.RunDeleted, response_model_exclude_unset=True)
def delete_run(name: str, c: WsCaller, s: Sess, cp: CP):
    with tx(s):
        run, machines = services.delete_run(s, c, name, now())
    cp.notifier.bump_machines(machines)
    cp.notifier.wake_scheduler()
    return {"name": name, "deleted": True, "state": run.state}
