"""The workspace itself, as its token sees it: role, clusters granted, quotas, max priority."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.routers.deps import Base, Sess, WsCaller

PREFIX = "/api/v1/o/{org}/w/{ws}"

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.get("", response_model=A.WorkspaceOut, response_model_exclude_unset=True)
def get_workspace(c: WsCaller, s: Sess, base: Base):
    return services.workspace_view(s, c, base)
