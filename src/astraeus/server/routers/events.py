"""The workspace's events, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.routers.deps import Sess, WsCaller
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.get("/events")
def list_events(c: WsCaller, s: Sess, limit: Annotated[int, Query(ge=1, le=1000)] = 200):
    return {"items": [services.event_view(e) for e in services.list_events(s, c, limit)]}
