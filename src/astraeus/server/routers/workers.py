"""Workers and their logs (plain text; `follow` streams until the worker ends or its client leaves)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from sqlalchemy import select, tuple_
from sqlalchemy.orm import selectinload

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import lifecycle, services
from astraeus.server.db import Run, Worker
from astraeus.server.routers.deps import CP, Sess, WsCaller, machine_names
from astraeus.server.routers.events import PAGE_DEFAULT, Cursor, Limit, decode_cursor, page
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)

LOGS_200 = {200: {"description": "one line per output line", "content": {"text/plain": {"schema": {"type": "string"}}}}}
# The log is text and its refusals JSON: the errors name their content type (a model would be documented under the
# route's text/plain).
LOGS_ANSWERS = {**{code: {"description": r["description"], "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/Error"}}}} for code, r in B.ERRORS.items()}, **LOGS_200}


@router.get("/workers", response_model=A.WorkerPage, response_model_exclude_unset=True)
def list_workers(c: WsCaller, s: Sess, run: str | None = None, limit: Limit = PAGE_DEFAULT, cursor: Cursor = None):
    """The workspace's workers (of one run with `run`), by run then index, a page at a time."""
    after = decode_cursor(cursor, (int, int, int))
    q = (select(Worker).join(Run).where(Run.workspace_id == c.workspace.id, Run.live_key == "")
         .options(selectinload(Worker.run)))
    if run:
        q = q.where(Run.name == run)
    if after is not None:
        q = q.where(tuple_(Run.id, Worker.index, Worker.id) > tuple_(*after))
    rows = list(s.scalars(q.order_by(Run.id, Worker.index, Worker.id).limit(limit + 1)))
    names = machine_names(s)
    return page(rows, limit, lambda w: (w.run_id, w.index, w.id), lambda w: services.worker_view(w, names))


@router.get("/workers/{name}", response_model=A.WorkerOut, response_model_exclude_unset=True)
def get_worker(name: str, c: WsCaller, s: Sess):
    return services.worker_view(services.get_worker(s, c, name), machine_names(s))


def _line(ln, timestamps: bool) -> str:
    if timestamps:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ln.time)) + f".{int(ln.time % 1 * 1e6):06d}Z"
        return f"{t} {ln.text}\n"
    return ln.text + "\n"


@router.get("/workers/{name}/logs", response_class=PlainTextResponse, responses=LOGS_ANSWERS)
def worker_logs(name: str, c: WsCaller, s: Sess, cp: CP, request: Request,
                tail: Annotated[int | None, Query(ge=0, le=B.INT32)] = None,
                follow: bool = False, timestamps: bool = False):
    worker = services.get_worker(s, c, name)
    limits = cp.settings.log_max_bytes_per_worker, cp.settings.log_max_lines_per_worker
    if not follow:
        lines = services.read_logs(s, worker, tail=tail)
        head = _dropped(s, worker, limits, tail, lines)
        return PlainTextResponse(head + "".join(_line(ln, timestamps) for ln in lines))
    wid = worker.id
    s.close()  # the stream reads in short sessions of its own: this one's connection goes back to the pool now
    return StreamingResponse(_follow(request, cp, wid, tail, timestamps, limits), media_type="text/plain")


def _dropped(s, worker: Worker, limits: tuple[int, int], tail: int | None, lines: list) -> str:
    """The retention marker line, when the log was trimmed and what is shown reaches back to its start."""
    if tail is not None and len(lines) >= tail:
        return ""
    marker = services.logs_dropped_line(s, worker, *limits)
    return marker + "\n" if marker else ""


# A follower waits without a thread: it looks at the notifier's log version (an in-memory counter) every
# POLL seconds, and at the database only when that changed, or every RECHECK seconds; each look is a short
# session in a worker thread. It ends when the worker's attempt has ended, when the control plane stops, or
# when its client has gone (checked at every look, so an abandoned follow of a quiet worker ends too).
POLL = 0.25
RECHECK = 5.0
FOLLOWING = 0  # follow streams open now, in this process (/metrics: astraeus_log_follows_open)


async def _follow(request: Request, cp, wid: int, tail: int | None, timestamps: bool,
                  limits: tuple[int, int]) -> AsyncIterator[str]:
    """The last `tail` lines, then each new one as it arrives, until the worker's attempt is over."""

    def first():
        with cp.sessions() as s2:
            wk = s2.get(Worker, wid)
            if wk is None:
                return "", [], 0
            lines = services.read_logs(s2, wk, tail=tail)
            # what follows is what comes after the lines shown; with --tail 0 (none shown), after the last stored
            last = lines[-1].id if lines else services.last_log_id(s2, wk) if tail == 0 else 0
            return _dropped(s2, wk, limits, tail, lines), lines, last

    def more(after: int):
        with cp.sessions() as s2:
            wk = s2.get(Worker, wid)
            if wk is None:
                return [], True
            new = services.read_logs(s2, wk, after_id=after)
            return new, wk.state in lifecycle.ENDED or (wk.state == "Pending" and wk.attempt > 0)

    global FOLLOWING
    FOLLOWING += 1
    try:
        async for chunk in _stream(request, cp, timestamps, first, more):
            yield chunk
    finally:
        FOLLOWING -= 1


async def _stream(request: Request, cp, timestamps: bool, first, more) -> AsyncIterator[str]:
    v = cp.notifier.logs_version()
    head, lines, last = await anyio.to_thread.run_sync(first)
    if head or lines:
        yield head + "".join(_line(ln, timestamps) for ln in lines)
    while True:
        new, done = await anyio.to_thread.run_sync(more, last)
        if new:
            last = new[-1].id
            yield "".join(_line(ln, timestamps) for ln in new)
        if done and not new:
            return
        waited = 0.0
        while cp.notifier.logs_version() == v and waited < RECHECK:
            if cp.notifier.closing or await request.is_disconnected():
                return
            await asyncio.sleep(POLL)
            waited += POLL
        if cp.notifier.closing or await request.is_disconnected():
            return
        v = cp.notifier.logs_version()
