"""Plumbing, not in the OpenAPI schema: a health check that reaches the database, and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import select

from astraeus.server.routers.deps import Sess

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
def healthz(s: Sess):
    s.execute(select(1))
    return {"ok": True}


@router.get("/metrics")
def metrics():
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
