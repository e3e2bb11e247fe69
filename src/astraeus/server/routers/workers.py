"""Workers and their logs (plain text; `follow` streams until the worker ends)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse, StreamingResponse

from astraeus.server import bodies as B
from astraeus.server import lifecycle, services
from astraeus.server.db import Worker
from astraeus.server.routers.deps import CP, Sess, WsCaller, machine_names
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)

LOGS_200 = {200: {"description": "one line per output line", "content": {"text/plain": {"schema": {"type": "string"}}}}}


@router.get("/workers")
def list_workers(c: WsCaller, s: Sess, run: str | None = None):
    names = machine_names(s)
    return {"items": [services.worker_view(x, names) for x in services.list_workers(s, c, run)]}


@router.get("/workers/{name}")
def get_worker(name: str, c: WsCaller, s: Sess):
    return services.worker_view(services.get_worker(s, c, name), machine_names(s))


def _line(ln, timestamps: bool) -> str:
    if timestamps:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ln.time)) + f".{int(ln.time % 1 * 1e6):06d}Z"
        return f"{t} {ln.text}\n"
    return ln.text + "\n"


@router.get("/workers/{name}/logs", responses=LOGS_200)
def worker_logs(name: str, c: WsCaller, s: Sess, cp: CP,
                tail: Annotated[int | None, Query(ge=0, le=B.INT32)] = None,
                follow: bool = False, timestamps: bool = False):
    worker = services.get_worker(s, c, name)
    if not follow:
        return PlainTextResponse("".join(_line(ln, timestamps) for ln in services.read_logs(s, worker, tail=tail)))
    return StreamingResponse(_follow(cp, worker.id, tail, timestamps), media_type="text/plain")


def _follow(cp, wid: int, tail: int | None, timestamps: bool) -> Iterator[str]:
    """The last `tail` lines, then each new one as it arrives, until the worker's attempt is over."""
    last = 0
    with cp.sessions() as s2:
        wk = s2.get(Worker, wid)
        lines = services.read_logs(s2, wk, tail=tail)
    for ln in lines:
        last = ln.id
        yield _line(ln, timestamps)
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
            yield _line(ln, timestamps)
        if done and not new:
            return
        cp.notifier.wait_logs(v, 1.0)
