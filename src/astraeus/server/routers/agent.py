"""The agent protocol: a machine registers, long-polls its assignments, reports its workers and sends their logs.

Only machine tokens may call these: a join token only /register, which answers the machine's own credential;
that credential the rest, for its own machine only (astraeus.server.agents). The bodies are `astraeus.protocol`'s
models, shared with the agent.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import ValidationError

from astraeus import protocol as P
from astraeus.server import agents, leader, log_admission, services
from astraeus.server import bodies as B
from astraeus.server.asgi import read_request, replay
from astraeus.server.db import Machine, Token
from astraeus.server.routers import errors
from astraeus.server.routers.deps import CP, Sess, tx
from astraeus.server.services import ApiError

LONG_POLL_MAX = 30.0


def machine_token(s: Sess, authorization: Annotated[str | None, Header()] = None) -> Token:
    tok = agents.authenticate(s, authorization)
    # The route's body runs in another call to the thread pool: do not keep a pooled connection (idle in the read
    # transaction) while the request waits for a thread. With every thread busy, those requests held the whole pool
    # and the state lock's holder could not get a connection (benchmarks/bench_agents.py at 400 agents).
    services.hand_back_connection(s)
    return tok


AgentTok = Annotated[Token, Depends(machine_token)]

router = APIRouter(prefix="/api/v1/agent", tags=["agent"], responses=B.ERRORS)


@router.post("/register")
def agent_register(tok: AgentTok, s: Sess, cp: CP, body: P.Register) -> P.Registered:
    settings = cp.settings
    with tx(s):
        m, cl, changed, credential = agents.register(s, tok, body, time.time(), settings.heartbeat)
        out = P.Registered(machine=m.name, cluster=cl.name, heartbeat_seconds=settings.heartbeat,
                           lost_after_seconds=cl.lost_after_seconds, credential=credential)
        mid = m.id
    cp.notifier.bump_machines([mid])
    cp.notifier.wake_scheduler()
    return out


@router.get("/assignments")
async def agent_assignments(request: Request, machine: str, after: int = 0,
                            wait: Annotated[float, Query(ge=0, le=LONG_POLL_MAX)] = 0,
                            authorization: Annotated[str | None, Header()] = None) -> P.Assignments:
    """The long-poll waits on the event loop (core.Notifier.await_machine), not in a request thread: each agent
    keeps one open, and a fleet's would otherwise take every thread. Its reads run in the thread pool (two calls:
    no sync dependency, each of which would be one more)."""
    cp = request.app.state.cp
    mid = await anyio.to_thread.run_sync(machine_id, cp, authorization, machine)
    version = await cp.notifier.await_machine(mid, after, wait) if wait else cp.notifier.machine_version(mid)
    return await anyio.to_thread.run_sync(answer_assignments, cp, mid, version)


def machine_id(cp, authorization: str | None, machine: str) -> int:
    with cp.sessions() as s:
        return agents.caller_machine(s, authorization, machine).id


def answer_assignments(cp, mid: int, version: int) -> P.Assignments:
    with cp.sessions() as s:
        # the scheduling lease's epoch, read before the assignments (they are at least as new as it): an agent
        # ignores answers older than the newest epoch it saw
        epoch, _, _ = leader.current(s)
        m = s.get(Machine, mid)
        return P.Assignments(version=version, assignments=agents.assignments(s, m), exports=agents.exports(s, m),
                             epoch=epoch)


@router.post("/report")
async def agent_report(request: Request, body: P.Report,
                       authorization: Annotated[str | None, Header()] = None) -> P.Ack:
    """Most of a fleet's requests (every agent, every heartbeat): the whole report (agents.report, which
    PlainReports calls too), authentication included, is one call to the thread pool; sync dependencies (the control
    plane, a session, the token) would each cost one more hop off the event loop."""
    await anyio.to_thread.run_sync(agents.report, request.app.state.cp, authorization, body)
    return P.Ack()


REPORT_PATH = "/api/v1/agent/report"
ACK = b'{"ok":true}'  # P.Ack() as FastAPI answers it


class PlainReports:
    """POST /api/v1/agent/report (most of a fleet's requests: every agent, every heartbeat) answered ahead of
    FastAPI's routing, dependency solving and response model: an adapter that decodes the body as agent_report's
    `body: P.Report` is (a JSON object, with `Content-Type: application/json`), runs agents.report in the thread
    pool as agent_report does, and answers as it would (200 `{"ok":true}`, or an ApiError's {"code", "message"}).
    Anything else goes on to the app as it came (the body replayed): another path or method, a query, a body that
    is not a valid report (its 422 is FastAPI's), and a report that failed on something other than an ApiError (a
    database error: nothing of it was kept, and the app runs it again with its usual handling: RetryConflicts for a
    conflict, a 503 for a database that does not answer). Pure ASGI, inside BodyLimit."""

    def __init__(self, app, cp):
        self.app, self.cp = app, cp

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != REPORT_PATH
                or scope.get("query_string") or scope.get("root_path")):
            return await self.app(scope, receive, send)
        authorization, json_body, messages, whole = await read_request(scope, receive)
        body = None
        if whole and json_body is True:
            try:
                body = P.Report.model_validate(json.loads(b"".join(m.get("body", b"") for m in messages)))
            except (ValueError, ValidationError):  # not JSON, not an object, not a valid report: FastAPI says why
                body = None
        if body is None:
            return await self.app(scope, replay(messages), send)
        try:
            await anyio.to_thread.run_sync(agents.report, self.cp, authorization, body)
        except ApiError as e:
            return await errors.error_json(e.status, e.code, e.message)(scope, receive, send)
        except Exception:  # nothing of it was kept (its transaction rolled back): the usual way, with its handling
            return await self.app(scope, replay(messages), send)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(ACK)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": ACK})


def _inline(schema: dict) -> dict:
    """A model's JSON schema with its $defs written in place (for openapi_extra, which has no $defs)."""
    defs = schema.pop("$defs", {})

    def walk(x):
        if isinstance(x, dict):
            if "$ref" in x:
                return walk(dict(defs[x["$ref"].rsplit("/", 1)[1]]))
            return {k: walk(v) for k, v in x.items()}
        return [walk(v) for v in x] if isinstance(x, list) else x

    return walk(schema)


@router.post("/logs", openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": _inline(P.Logs.model_json_schema())}}}},
    responses={429: {"model": B.Error, "description": "too many log batches being stored: send this one again "
                                                     "after Retry-After seconds (the lines are not stored)"}})
async def agent_logs(request: Request, authorization: Annotated[str | None, Header()] = None) -> P.LogsStored:
    cp = request.app.state.cp
    try:
        n = await log_admission.store(request.app, cp, authorization, request.headers.get("content-length"),
                                      request.body)
    except log_admission.Busy as e:
        busy = errors.error_json(429, "BUSY", str(e))
        busy.headers["Retry-After"] = str(log_admission.LOG_RETRY_AFTER)
        return busy  # type: ignore[return-value]  # a Response goes out as it is
    if n:
        cp.notifier.bump_logs()
    return P.LogsStored(stored=n)
