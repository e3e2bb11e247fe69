"""Batches of log lines are parsed in a process of their own (the log store), not in the API's: a flood of lines
(100 workers printing 1,000 lines a second) kept the store's thread on the interpreter lock for most of each second,
and every API request and the scheduling loop waited for it at each of their database round trips
(benchmarks/README.md, logs at scale). The store's process opens its own connection to the same database and
authenticates the machine's token and parses the batch as the route did; its errors (401/403/404, 422 with pydantic's
errors) are raised again in the API's process (LogStore.store).

On PostgreSQL it also stores the lines (agents.store_logs) and answers how many. On SQLite (one writer) the API's
process writes them: the store's process answers the lines as JSON chunks (agents.log_chunks), which the API's
process hands to SQLite a chunk at a time under its state lock, stepping aside between chunks for state changes that
wait for it (agents.store_log_chunks, services.let_state_changes_in): no work per line is left in the API's
interpreter. (SQLite's small batches, the quiet workers' lane, are parsed and stored in the API's process: cheap,
and no process is started for them; routers/agent.py.)

ASTRAEUS_LOG_STORES_AT_ONCE processes (1 by default), started at the first batch, by `spawn` (the API's process
has threads); if one dies, a new one takes the batch in flight (LogStore.store)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from astraeus.server.services import ApiError

log = logging.getLogger("astraeus.logstore")

# in the store's process: the database and the log limits (_start)
_sessions = None
_limits: tuple[int, int] = (0, 0)


def _start(url: str, max_bytes: int, max_lines: int) -> None:
    global _sessions, _limits
    from astraeus.server import db

    _sessions = db.session_factory(db.make_engine(url))
    _limits = (max_bytes, max_lines)
    threading.Thread(target=_end_with, args=(os.getppid(),), name="logstore-parent", daemon=True).start()


def _end_with(parent: int) -> None:
    """The store's process ends within a second of the API's: killed (SIGKILL, out of memory), the API's process
    cannot end it, and its pool's pipe alone does not."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _store(authorization: str | None, raw: bytes) -> tuple:
    """In the store's process: ("stored", n) (PostgreSQL), ("chunks", machine id, chunks) (SQLite), ("error",
    status, code, message) or ("invalid", errors), which LogStore.store turns into the number or the exception."""
    from astraeus.server import agents, services

    try:
        with _sessions() as s:
            m, body = agents.log_batch(s, authorization, raw)
            if s.get_bind().dialect.name == "sqlite":  # the API's process writes them (agents.store_log_chunks)
                return ("chunks", m.id, agents.log_chunks(s, m, body.lines))
            with services.side_tx(s):
                return ("stored", agents.store_logs(s, m, body.lines, *_limits))
    except ValidationError as e:
        return ("invalid", json.loads(e.json()))
    except ApiError as e:
        return ("error", e.status, e.code, e.message)


class LogStore:
    """The API process's side: hands a batch to the store's process and waits for its answer (in a thread)."""

    def __init__(self, url: str, max_bytes: int, max_lines: int, processes: int = 1) -> None:
        self.args, self.processes = (url, max_bytes, max_lines), processes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start, initargs=self.args)
            return self._pool

    def store(self, authorization: str | None, raw: bytes,
              write: Callable[[int, list[tuple[str, dict[int, int]]]], int] | None = None) -> int:
        """The lines stored, or the route's error raised here: ApiError (401, 403, 404; 503 when the store's
        process died twice on this batch, and the agent sends it again later) or RequestValidationError. When the
        store's process died (killed, out of memory), a new one stores the batch: what the dead one committed of
        it is stored once (a line is stored once: worker, attempt, seq). On SQLite `write(machine id, chunks)`
        stores the chunks the store's process made, here (agents.store_log_chunks)."""
        for _ in range(2):
            pool = self._get()
            try:
                answer = pool.submit(_store, authorization, raw).result()
                break
            except BrokenProcessPool:
                with self._lock:
                    if self._pool is pool:
                        self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
                log.warning("the log store's process ended; a new one takes the batch")
        else:
            raise ApiError(503, "LOG_STORE_UNAVAILABLE", "the log store's process ended twice while storing this "
                                                         "batch: send it again")
        if answer[0] == "invalid":
            raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in answer[1]])
        if answer[0] == "error":
            raise ApiError(*answer[1:])
        if answer[0] == "chunks":
            assert write is not None, "a store on SQLite writes the chunks in the API's process"
            return write(answer[1], answer[2])
        return answer[1]

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
