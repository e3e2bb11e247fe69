"""The organisation: workspaces (and their access to clusters), clusters and tokens. Organisation admins only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from astraeus.server import admin, services
from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server.routers.deps import CP, AdminCaller, Sess, tx
from astraeus.server.routers.events import PAGE_DEFAULT, Cursor, Limit, decode_cursor, page

router = APIRouter(prefix="/api/v1/o/{org}", tags=["organisation"], responses=B.ERRORS)


@router.get("/workspaces", response_model=A.OrgWorkspaceList, response_model_exclude_unset=True)
def list_workspaces(c: AdminCaller, s: Sess):
    return {"items": admin.list_workspaces(s, c)}


@router.post("/workspaces", status_code=201, response_model=A.OrgWorkspaceOut, response_model_exclude_unset=True)
def create_workspace(c: AdminCaller, s: Sess, body: B.WorkspaceCreate):
    with tx(s):
        return admin.create_workspace(s, c, body.model_dump(exclude_unset=True))


@router.get("/workspaces/{name}", response_model=A.OrgWorkspaceOut, response_model_exclude_unset=True)
def get_workspace_admin(name: str, c: AdminCaller, s: Sess):
    return admin.workspace_out(s, admin.workspace_named(s, c, name))


@router.patch("/workspaces/{name}", response_model=A.OrgWorkspaceOut, response_model_exclude_unset=True)
def patch_workspace(name: str, c: AdminCaller, s: Sess, cp: CP, body: B.WorkspacePatch):
    with tx(s):
        out = admin.update_workspace(s, c, name, body.model_dump(exclude_unset=True))
    cp.notifier.wake_scheduler()
    return out


@router.get("/clusters", response_model=A.ClusterList, response_model_exclude_unset=True)
def list_clusters(c: AdminCaller, s: Sess):
    return {"items": admin.list_clusters(s, c)}


@router.post("/clusters", status_code=201, response_model=A.ClusterOut, response_model_exclude_unset=True)
def create_cluster(c: AdminCaller, s: Sess, body: B.ClusterCreate):
    with tx(s):
        return admin.create_cluster(s, c, body.model_dump(exclude_unset=True))


@router.get("/clusters/{name}", response_model=A.ClusterOut, response_model_exclude_unset=True)
def get_cluster(name: str, c: AdminCaller, s: Sess):
    return admin.cluster_out(admin.cluster_named(s, c, name))


@router.patch("/clusters/{name}", response_model=A.ClusterOut, response_model_exclude_unset=True)
def patch_cluster(name: str, c: AdminCaller, s: Sess, cp: CP, body: B.ClusterPatch):
    with tx(s):
        out = admin.update_cluster(s, c, name, body.model_dump(exclude_none=True))
    cp.notifier.wake_scheduler()
    return out


@router.get("/clusters/{name}/machines", response_model=A.MachinePage, response_model_exclude_unset=True)
def cluster_machines(name: str, c: AdminCaller, s: Sess, limit: Limit = PAGE_DEFAULT, cursor: Cursor = None):
    """The cluster's machines by name, a page at a time (as the workspace's machines: routers/machines.py)."""
    after = decode_cursor(cursor, (str, int))
    cluster_ids = [admin.cluster_named(s, c, name).id]
    rows = services.list_machines(s, cluster_ids, after, limit + 1)
    views = {id(m): v for m, v in zip(rows[:limit], services.machines_view(s, cluster_ids, rows[:limit]),
                                       strict=True)}
    return page(rows, limit, lambda m: (m.name, m.id), lambda m: views[id(m)])


@router.post("/tokens", status_code=201, response_model=A.TokenIssued, response_model_exclude_unset=True)
def create_token(c: AdminCaller, s: Sess, body: B.TokenCreate):
    with tx(s):
        return admin.issue_token(s, c, body.model_dump(exclude_unset=True))


@router.get("/tokens", response_model=A.TokenList, response_model_exclude_unset=True)
def list_tokens(c: AdminCaller, s: Sess):
    return {"items": admin.list_tokens(s, c)}


@router.delete("/tokens/{token_id}", response_model=A.TokenRevoked, response_model_exclude_unset=True)
def revoke_token(token_id: Annotated[int, Path(ge=1, le=B.INT32)], c: AdminCaller, s: Sess):
    with tx(s):
        admin.revoke_token(s, c, token_id)
    return {"id": token_id, "revoked": True}
