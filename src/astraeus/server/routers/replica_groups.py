"""Replica groups: create, list, show, scale (PATCH), delete. The work is in server/replica_groups.py."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import replica_groups as G
from astraeus.server.routers.deps import CP, Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.post("/replica-groups", status_code=201, response_model=A.ReplicaGroupOut, response_model_exclude_unset=True)
def create_group(c: WsCaller, s: Sess, cp: CP, body: G.GroupCreate):
    with tx(s):
        g = G.create_group(s, c, body, now())
        out = G.group_view(s, g, c.workspace, c.role)
    cp.notifier.wake_scheduler()
    return out


@router.get("/replica-groups", response_model=A.ReplicaGroupList, response_model_exclude_unset=True)
def list_groups(c: WsCaller, s: Sess):
    return {"items": [G.group_view(s, g, c.workspace, c.role) for g in G.list_groups(s, c)]}


@router.get("/replica-groups/{name}", response_model=A.ReplicaGroupOut, response_model_exclude_unset=True)
def get_group(name: str, c: WsCaller, s: Sess):
    return G.group_view(s, G.get_group(s, c, name), c.workspace, c.role)


@router.patch("/replica-groups/{name}", response_model=A.ReplicaGroupOut, response_model_exclude_unset=True)
def patch_group(name: str, c: WsCaller, s: Sess, cp: CP, body: G.GroupPatch):
    with tx(s):
        g = G.patch_group(s, c, name, body, now())
        out = G.group_view(s, g, c.workspace, c.role)
    cp.notifier.wake_scheduler()
    return out


@router.delete("/replica-groups/{name}", response_model=A.Deleted, response_model_exclude_unset=True)
def delete_group(name: str, c: WsCaller, s: Sess, cp: CP):
    with tx(s):
        machines = G.delete_group(s, c, name, now())
    cp.notifier.bump_machines(machines)
    cp.notifier.wake_scheduler()
    return {"name": name, "deleted": True}
