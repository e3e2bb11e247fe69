"""Log admission for POST /api/v1/agent/logs: which batches of log lines are stored now, which wait, and which are
refused with 429 (Lane, LogAdmission), and the store itself (store): in the log store's process or, for SQLite's
small batches, here. routers/agent.py answers what this decides."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from astraeus.server import agents, services
from astraeus.server.logstore import LogStore
from astraeus.server.services import ApiError

# A batch of log lines (up to 1 MiB) is read and stored in a worker thread, never on the event loop (where FastAPI
# would parse a declared body, holding up every long-poll and follower meanwhile), and at most
# ASTRAEUS_LOG_STORES_AT_ONCE (settings.log_stores_at_once) at a time: under a flood the other batches wait without a
# thread, so the API's threads and the database stay free for everything else. Each is parsed in the log store's
# process (server/logstore.py), off the API's interpreter lock (on PostgreSQL stored there too; SQLite's small
# batches are parsed and stored in the API's process).
#
# Admission: when LOG_STORES_WAITING more already wait, a batch is refused at once with 429 and Retry-After
# (LOG_RETRY_AFTER seconds), before it is parsed: the agent keeps its lines and sends them again then
# (agent.Agent.ship_logs), so a flood costs the server a refusal per batch, not a store. Only a machine token is
# admitted: a batch whose bearer token is none (missing, unknown, revoked, expired, a user's) gets its 401 (403)
# before it is counted, so a flood without a valid token cannot push the real agents into 429s. A token that passed
# the check in the last KNOWN_SECONDS is known by its digest on the event loop; any other is checked in the thread
# pool (the store authenticates again in full, so a token revoked meanwhile stores nothing, and is forgotten).
#
# The big batches' lane rests after each store (Lane.store), so that a flood takes at most ASTRAEUS_LOG_STORE_SHARE
# of the control plane's time. A small batch (a Content-Length of at most SMALL_BATCH_BYTES: the lines of workers
# that print a little, which the agent posts on their own ahead of a flood's, agent.Agent._post_logs) has a lane of
# its own, so that it never waits behind, nor is refused because of, a flood's big batches (`logs -f` of a quiet
# worker stays live on a machine whose neighbour floods); past its room it gets the same 429.
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

    @classmethod
    def of(cls, app, cp) -> LogAdmission:
        """The app's, made at its first batch (in its event loop)."""
        admission = getattr(app.state, "log_admission", None)
        if admission is None:
            admission = app.state.log_admission = cls(cp.settings.log_stores_at_once, cp.settings.log_store_share)
        return admission

    def lane(self, length: str | None) -> Lane:
        """The small lane for a batch whose Content-Length is at most SMALL_BATCH_BYTES, else the big one."""
        length = length or ""
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


def log_store(app, cp) -> LogStore:
    """The app's log store process, made at its first batch and closed with the app (app.py)."""
    store = getattr(app.state, "log_store", None)
    if store is None:
        store = app.state.log_store = LogStore(cp.engine.url.render_as_string(hide_password=False),
                                               cp.settings.log_max_bytes_per_worker,
                                               cp.settings.log_max_lines_per_worker, cp.settings.log_stores_at_once)
    return store


def check_credential(cp, authorization: str | None) -> None:
    """A machine token's (a join token gets its 403 from the store, after its body is checked, as before)."""
    with cp.sessions() as s:
        agents.authenticate(s, authorization)


class Busy(Exception):
    """A batch refused because its lane is full: the agent sends it again after LOG_RETRY_AFTER seconds."""


async def store(app, cp, authorization: str | None, length: str | None, body: Callable[[], Awaitable[bytes]]) -> int:
    """A batch of log lines admitted and stored: the lines taken. Raises the 401 (403) of a token that is no
    machine credential before the batch counts, Busy when its lane is full (before its body is read), and the
    store's ApiError or RequestValidationError. `length`: its Content-Length; `body`: reads it."""
    admission = LogAdmission.of(app, cp)
    key = await admission.check(cp, authorization)  # before it counts: 401 for a token that is no credential
    lane = admission.lane(length)
    if lane.full():
        raise Busy(f"{lane.held} log batches are being stored or wait: send this one again in {LOG_RETRY_AFTER} s")
    lane.held += 1
    try:
        raw = await body()

        def write(machine_id: int, chunks: list) -> int:  # SQLite: a big batch's chunks, parsed in the log store
            with cp.sessions() as s, services.side_tx(s):
                return agents.store_log_chunks(s, machine_id, chunks, cp.settings.log_max_bytes_per_worker,
                                               cp.settings.log_max_lines_per_worker,
                                               pause=lambda: services.let_state_changes_in(s))

        def stored() -> int:
            if cp.postgres or lane is admission.big:  # parsed in the log store's process, off the API's lock
                return log_store(app, cp).store(authorization, raw, write)
            with cp.sessions() as s:  # SQLite's small batches: parsed and stored here
                try:
                    m, batch = agents.log_batch(s, authorization, raw)
                except ValidationError as e:
                    raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) \
                        from None
                # not a state change (services.side_tx): on SQLite a submit's busy-wait for the write lock lost to
                # a flood of stores for seconds; the body was parsed before the lock
                with services.side_tx(s):
                    # on SQLite, state changes waiting for the lock go between the batch's chunks
                    return agents.store_logs(s, m, batch.lines, cp.settings.log_max_bytes_per_worker,
                                             cp.settings.log_max_lines_per_worker,
                                             pause=lambda: services.let_state_changes_in(s))

        try:
            return await lane.store(stored)
        except ApiError as e:
            if e.status == 401:  # revoked or expired since it was known: checked again at its next batch
                admission.known.pop(key, None)
            raise
    finally:
        lane.held -= 1
