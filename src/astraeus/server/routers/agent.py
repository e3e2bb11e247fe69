"""The agent protocol: a machine registers, long-polls its assignments, reports its workers and sends their logs.

Only machine tokens may call these: a join token only /register, which answers the machine's own credential;
that credential the rest, for its own machine only (astraeus.server.agents). The bodies are `astraeus.protocol`'s
models, shared with the agent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from astraeus import protocol as P
from astraeus.server import agents, diskfull, heartbeats, leader, services
from astraeus.server import bodies as B
from astraeus.server.asgi import read_request, replay
from astraeus.server.db import Machine, Token
from astraeus.server.logstore import LogStore
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
        m, cl, changed, credential = agents.register(s, tok, body, time.time(), settings.heartbeat_seconds)
        out = P.Registered(machine=m.name, cluster=cl.name, heartbeat_seconds=settings.heartbeat_seconds,
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
        return agents.machine_for(s, agents.authenticate(s, authorization), machine).id


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
    """Most of a fleet's requests (every agent, every heartbeat): the whole report, authentication included, is one
    call to the thread pool. Sync dependencies (the control plane, a session, the token) each cost one more, and at
    300 agents the event loop spent more on those hops than the reports' own work (py-spy; bench_agents.py)."""
    await anyio.to_thread.run_sync(report, request.app.state.cp, authorization, body)
    return P.Ack()


REPORT_PATH = "/api/v1/agent/report"
ACK = b'{"ok":true}'  # P.Ack() as FastAPI answers it


class PlainReports:
    """POST /api/v1/agent/report (most of a fleet's requests: every agent, every heartbeat), answered ahead of
    FastAPI's routing, dependency solving and response model, as agent_report would: the body is read and checked
    as its `body: P.Report` is (a JSON object, with `Content-Type: application/json`), the report runs in the
    thread pool, and the answer is agent_report's (200 `{"ok":true}`, or an ApiError's {"code", "message"}).
    Anything else goes on to the app as it came (the body replayed): another path or method, a query, a body that
    is not a valid report (its 422 is FastAPI's), and a report that failed on something other than an ApiError
    (a database error: nothing of it was kept, and the app runs it again with its usual handling: RetryConflicts
    for a conflict, a 503 for a database that does not answer). Pure ASGI, inside BodyLimit."""

    def __init__(self, app, cp):
        self.app, self.cp = app, cp

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != REPORT_PATH
                or scope.get("query_string") or scope.get("root_path")):
            return await self.app(scope, receive, send)
        authorization, json_body, messages, whole = await read_request(scope, receive)
        if not whole:
            return await self.app(scope, replay(messages), send)
        plain = json_body is True
        body = None
        if plain:
            try:
                body = P.Report.model_validate(json.loads(b"".join(m.get("body", b"") for m in messages)))
            except (ValueError, ValidationError):  # not JSON, not an object, not a valid report: FastAPI says why
                body = None
        if body is None:
            return await self.app(scope, replay(messages), send)
        try:
            await anyio.to_thread.run_sync(report, self.cp, authorization, body)
        except ApiError as e:
            return await errors.error_json(e.status, e.code, e.message)(scope, receive, send)
        except Exception:  # nothing of it was kept (its transaction rolled back): the usual way, with its handling
            return await self.app(scope, replay(messages), send)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(ACK)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": ACK})


def caller_machine(s, authorization: str | None, machine: str) -> Machine:
    """The machine a report's or a log batch's credential acts for (which must be the one it names): the one check
    of both routes, each in its own call to the thread pool."""
    return agents.machine_for(s, agents.authenticate(s, authorization), machine)


def report(cp, authorization: str | None, body: P.Report) -> None:
    with cp.sessions() as s:
        if not body.lines and heartbeats.heartbeat_only(s, caller_machine(s, authorization, body.machine), body,
                                                        time.time()):
            return  # a bare heartbeat: written without the state lock (server/heartbeats.py)
        with tx(s):  # waits for the state lock holding no pooled connection (services.tx)
            m = caller_machine(s, authorization, body.machine)
            # the last lines of the attempts it says ended, first: their end may release them from this machine
            stored = agents.store_logs(s, m, body.lines, cp.settings.log_max_bytes, cp.settings.log_max_lines) \
                if body.lines else 0
            told: set[int] = set()  # the machines whose agents must hear now (agents.report)
            changed = agents.report(s, m, body, time.time(), told)
            changed = diskfull.record_disk(m, body.disk) or changed  # disk pressure began or ended: plan again
    if told:
        cp.notifier.bump_machines(told)
    if changed:
        cp.notifier.wake_scheduler()
    if changed or stored:
        cp.notifier.bump_logs()


# A batch of log lines (up to 1 MiB) is read and stored in a worker thread, never on the event loop (where FastAPI
# would parse a declared body, holding up every long-poll and follower meanwhile), and at most
# ASTRAEUS_LOG_STORES_AT_ONCE (settings.log_stores_at_once, 1) at a time: under a flood the other batches wait
# without a thread, so the API's threads and the database stay free for everything else (on PostgreSQL, two stores
# at once took both of a 2-core machine's cores in a flood and tripled the API's p99: benchmarks/README.md), each
# parsed in the log store's process (server/logstore.py), off the API's interpreter lock (and on PostgreSQL stored
# there too; SQLite's small batches are parsed and stored in the API's process). Admission: when
# LOG_STORES_WAITING more already wait, a batch is refused at once with 429 and Retry-After (LOG_RETRY_AFTER seconds), before it is parsed: the agent keeps its lines and sends them again
# then (agent.Agent.ship_logs), so a flood costs the server a refusal per batch, not a store, and the scheduling
# loop keeps its share of the CPU (benchmarks/bench_logs.py). Only a machine token is admitted: a batch whose bearer
# token is none (missing, unknown, revoked, expired, a user's) gets its 401 (403) before it is counted, so a flood
# without a valid token cannot push the real agents into 429s. The check is cheap: a token that passed it in the
# last KNOWN_SECONDS is known by its digest on the event loop; any other is checked in the thread pool (the store
# authenticates again in full, so a token revoked meanwhile stores nothing, and is forgotten).
#
# The big batches' lane rests after each store (Lane.store): a store that took t seconds keeps the next big one
# from starting for t × (1/share − 1), ASTRAEUS_LOG_STORE_SHARE (0.5) being the most of the control plane's time a
# flood may take; a flood stored as fast as it came took a core of a 2-core control plane and doubled the API's p99.
#
# A small batch (a Content-Length of at most SMALL_BATCH_BYTES: the lines of workers that print a little, which the
# agent posts on their own ahead of a flood's, agent.Agent._post_logs) has a lane of its own: one store at a time
# and SMALL_STORES_WAITING more, so that it never waits behind, nor is refused because of, the flood's big batches
# (`logs -f` of a quiet worker stays live on a machine whose neighbour floods); past that it gets the same 429.
LOG_STORES_WAITING = 4
LOG_RETRY_AFTER = 2
SMALL_BATCH_BYTES = 64 << 10
SMALL_STORES_AT_ONCE = 1
SMALL_STORES_WAITING = 16
KNOWN_SECONDS = 60.0
KNOWN_MAX = 100_000  # digests remembered; beyond it the memory starts again (every agent is checked once more)


class Lane:
    """Stores of log batches: at most `at_once` running, `waiting` more waiting without a thread; past that, 429.
    With a `share` under 1, a store rests the lane afterwards (Lane.store)."""

    def __init__(self, at_once: int, waiting: int, share: float = 1.0) -> None:
        self.limiter = anyio.CapacityLimiter(at_once)
        self.bound = at_once + waiting
        self.held = 0  # running + waiting; changed on the event loop only
        self.at_once, self.share = at_once, share
        self.rest_until = 0.0  # time.monotonic(): no store of this lane starts before

    def full(self) -> bool:
        return self.held >= self.bound

    async def store(self, store: Callable[[], int]) -> int:
        """`store` in a worker thread, once the lane has room for it and has rested: a store that took t seconds
        keeps the next from starting for t × (1/share − 1) (spread over the stores it runs at once), so that a
        flood of big batches takes at most `share` of the control plane's time (ASTRAEUS_LOG_STORE_SHARE). The
        answer to this batch does not wait for the rest."""
        async with self.limiter:
            wait = self.rest_until - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)
            t0 = time.monotonic()
            try:
                return await anyio.to_thread.run_sync(store)
            finally:
                if self.share < 1:
                    end = time.monotonic()
                    self.rest_until = end + (end - t0) * (1 / self.share - 1) / self.at_once


class LogAdmission:
    """Counts the stores running or waiting for one app, and remembers the credentials that passed the check before
    admission; one per app, made in its event loop."""

    def __init__(self, at_once: int, share: float = 1.0) -> None:
        self.big = Lane(at_once, LOG_STORES_WAITING, share)
        self.small = Lane(SMALL_STORES_AT_ONCE, SMALL_STORES_WAITING)
        self.known: dict[str, float] = {}  # a credential's digest -> when it passed (monotonic)

    def lane(self, request: Request) -> Lane:
        """The small lane for a batch whose Content-Length is at most SMALL_BATCH_BYTES, else the big one."""
        length = request.headers.get("content-length", "")
        return self.small if length.isdigit() and int(length) <= SMALL_BATCH_BYTES else self.big

    async def check(self, cp, authorization: str | None) -> str:
        """Raises the 401 (403) of a bearer token that is no machine token; returns its key in `known` (which
        machine it acts for, the store checks against the batch)."""
        if not authorization or not authorization.lower().startswith("bearer ") or \
                len(authorization.split(None, 1)) != 2:
            raise ApiError(401, "UNAUTHENTICATED", "missing bearer token: send 'Authorization: Bearer "
                                                   "$ASTRAEUS_TOKEN'")
        key = services.digest(authorization.split(None, 1)[1].strip())
        at = self.known.get(key)
        now = time.monotonic()
        if at is not None and now - at < KNOWN_SECONDS:
            return key
        await anyio.to_thread.run_sync(check_credential, cp, authorization)
        if len(self.known) >= KNOWN_MAX:
            self.known.clear()
        self.known[key] = now
        return key


def _log_store(app, cp) -> LogStore:
    """The app's log store process, made at its first batch and closed with the app (app.py)."""
    store = getattr(app.state, "log_store", None)
    if store is None:
        store = app.state.log_store = LogStore(cp.engine.url.render_as_string(hide_password=False),
                                               cp.settings.log_max_bytes, cp.settings.log_max_lines,
                                               cp.settings.log_stores_at_once)
    return store


def check_credential(cp, authorization: str | None) -> None:
    """A machine token's (a join token gets its 403 from the store, after its body is checked, as before)."""
    with cp.sessions() as s:
        agents.authenticate(s, authorization)


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
    responses={429: {"description": "too many log batches being stored: send this one again after Retry-After "
                                    "seconds (the lines are not stored)"}})
async def agent_logs(request: Request, authorization: Annotated[str | None, Header()] = None) -> P.LogsStored:
    cp = request.app.state.cp
    admission = getattr(request.app.state, "log_admission", None)
    if admission is None:
        admission = request.app.state.log_admission = LogAdmission(cp.settings.log_stores_at_once,
                                                                   cp.settings.log_store_share)
    key = await admission.check(cp, authorization)  # before it counts: 401 for a token that is no credential
    lane = admission.lane(request)
    if lane.full():
        busy = errors.error_json(429, "BUSY", f"{lane.held} log batches are being stored or wait: send this "
                                              f"one again in {LOG_RETRY_AFTER} s")
        busy.headers["Retry-After"] = str(LOG_RETRY_AFTER)
        return busy  # type: ignore[return-value]  # a Response goes out as it is
    lane.held += 1
    try:
        raw = await request.body()

        def write(machine_id: int, chunks: list) -> int:  # SQLite: a big batch's chunks, parsed in the log store
            with cp.sessions() as s, services.side_tx(s):
                return agents.store_log_chunks(s, machine_id, chunks, cp.settings.log_max_bytes,
                                               cp.settings.log_max_lines, pause=lambda: services.let_state_changes_in(s))

        def store() -> int:
            if cp.postgres or lane is admission.big:  # parsed in the log store's process, off the API's lock
                return _log_store(request.app, cp).store(authorization, raw, write)
            with cp.sessions() as s:  # SQLite's small batches: parsed and stored here
                try:
                    m, body = agents.log_batch(s, authorization, raw)
                except ValidationError as e:
                    raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) \
                        from None
                # not a state change (services.side_tx): on SQLite a submit's busy-wait for the write lock lost to
                # a flood of stores for seconds (benchmarks/bench_logs.py); the body was parsed before the lock
                with services.side_tx(s):
                    # on SQLite, state changes waiting for the lock go between the batch's chunks
                    return agents.store_logs(s, m, body.lines, cp.settings.log_max_bytes, cp.settings.log_max_lines,
                                             pause=lambda: services.let_state_changes_in(s))

        try:
            n = await lane.store(store)
        except ApiError as e:
            if e.status == 401:  # revoked or expired since it was known: checked again at its next batch
                admission.known.pop(key, None)
            raise
    finally:
        lane.held -= 1
    if n:
        cp.notifier.bump_logs()
    return P.LogsStored(stored=n)
