"""Pools of a cluster's machines: organisation admins make them (`$ORG_API/clusters/{cluster}/pools`); a workspace
sees the pools it may use (`GET $API/pools`)."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import pools
from astraeus.server.routers.deps import CP, AdminCaller, Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(responses=B.ERRORS)
ORG = "/api/v1/o/{org}/clusters/{cluster}/pools"


@router.get(ORG, tags=["organisation"], response_model=A.PoolList, response_model_exclude_unset=True)
def list_pools(cluster: str, c: AdminCaller, s: Sess):
    return {"items": pools.list_pools(s, c, cluster)}


@router.post(ORG, status_code=201, tags=["organisation"], response_model=A.PoolOut, response_model_exclude_unset=True)
def create_pool(cluster: str, c: AdminCaller, s: Sess, cp: CP, body: B.PoolCreate):
    with tx(s):
        out = pools.create_pool(s, c, cluster, body.model_dump(exclude_unset=True))
    cp.notifier.wake_scheduler()
    return out


@router.get(ORG + "/{name}", tags=["organisation"], response_model=A.PoolOut, response_model_exclude_unset=True)
def get_pool(cluster: str, name: str, c: AdminCaller, s: Sess):
    return pools.get_pool(s, c, cluster, name)


@router.put(ORG + "/{name}", tags=["organisation"], response_model=A.PoolOut, response_model_exclude_unset=True)
def replace_pool(cluster: str, name: str, c: AdminCaller, s: Sess, cp: CP, body: B.PoolReplace):
    with tx(s):
        out = pools.replace_pool(s, c, cluster, name, body.model_dump(exclude_unset=True))
    cp.notifier.wake_scheduler()
    return out


@router.delete(ORG + "/{name}", tags=["organisation"], response_model=A.Deleted, response_model_exclude_unset=True)
def delete_pool(cluster: str, name: str, c: AdminCaller, s: Sess, cp: CP):
    with tx(s):
        pools.delete_pool(s, c, cluster, name, now())
    cp.notifier.wake_scheduler()
    return {"name": name, "deleted": True}


@router.get(PREFIX + "/pools", tags=["workspace"], response_model=A.WorkspacePoolList,
            response_model_exclude_unset=True)
def workspace_pools(c: WsCaller, s: Sess):
    return {"items": pools.workspace_pools(s, c)}
