"""Plumbing, not in the OpenAPI schema: a health check that reaches the database and names this replica's role
(scheduling leader or follower), and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from astraeus.server import answers as A
from astraeus.server import leader
from astraeus.server.routers.deps import CP

router = APIRouter(include_in_schema=False)


@router.get("/healthz", response_model=A.HealthOut, response_model_exclude_unset=True,
            responses={503: {"model": A.HealthOut, "description": "The database does not answer, or cannot write"}})
def healthz(cp: CP):
    """This replica's role in scheduling and whether its database answers: `{"role": "leader"|"follower",
    "epoch": N, "database": "ok"}`, or 503 with `"database": "unreachable"`, or 503 with `"database": "cannot
    write"` and the `reason` while writes fail for want of space (server/diskfull.py). `epoch` is the scheduling
    lease's: this replica's own while it leads, else the database's."""
    ld = cp.leader
    term = ld.term() if ld is not None else None
    try:
        with cp.sessions() as s:
            epoch, _, _ = leader.current(s)
    except Exception:
        return JSONResponse({"role": "leader" if term else "follower", "epoch": ld.epoch if ld else 0,
                             "database": "unreachable"}, status_code=503)
    full = cp.writes.reason if cp.writes is not None else None
    if full:
        return JSONResponse({"role": "leader" if term else "follower", "epoch": term.epoch if term else epoch,
                             "database": "cannot write", "reason": full}, status_code=503)
    return {"role": "leader" if term else "follower", "epoch": term.epoch if term else epoch, "database": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(cp: CP):
    from astraeus.server.routers import workers

    pool = cp.engine.pool
    own = (f"# TYPE astraeus_db_connections_in_use gauge\nastraeus_db_connections_in_use {pool.checkedout()}\n"
           f"# TYPE astraeus_log_follows_open gauge\nastraeus_log_follows_open {workers.FOLLOWING}\n")
    return Response(generate_latest() + own.encode(), media_type=CONTENT_TYPE_LATEST)
