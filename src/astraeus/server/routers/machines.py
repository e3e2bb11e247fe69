"""The machines of the clusters the workspace may use."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.routers.deps import Sess, WsCaller
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.get("/machines")
def list_machines(c: WsCaller, s: Sess):
    return {"items": services.machines_view(s, services.granted_cluster_ids(s, c))}
