"""Plumbing, not in the OpenAPI schema: a health check that reaches the database, and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import select

from astraeus.server.routers.deps import CP, Sess

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
def healthz(s: Sess):
    s.execute(select(1))
    return {"ok": True}


@router.get("/metrics")
def metrics(cp: CP):
    from astraeus.server.routers import workers

    pool = cp.engine.pool
    own = (f"# TYPE astraeus_db_connections_in_use gauge\nastraeus_db_connections_in_use {pool.checkedout()}\n"
           f"# TYPE astraeus_log_follows_open gauge\nastraeus_log_follows_open {workers.FOLLOWING}\n")
    return Response(generate_latest() + own.encode(), media_type=CONTENT_TYPE_LATEST)
