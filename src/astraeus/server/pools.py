"""Pools: named groups of one cluster's machines, by name and/or by label (a machine having every label given).

Membership is worked out when used (`pool_members`), so a machine that registers later with the labels joins.
Organisation admins make them (`$ORG_API/clusters/{cluster}/pools`); a workspace's access to a cluster may list the
pools it may use (`Access.pools`, None: every machine), and a run may ask for pools (`node_selection.pools`).
routers/pools.py and the console only call these.
"""

from __future__ import annotations

import time

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.server import bodies as B
from astraeus.server import lifecycle
from astraeus.server.db import Access, Cluster, Machine, Pool, Reservation, Worker, Workspace
from astraeus.server.services.auth import Caller
from astraeus.server.services.errors import ApiError, InvalidBody
from astraeus.server.services.views import iso
from astraeus.usage import in_pool


def pool_members(pool: Pool, machines: list[Machine]) -> list[str]:
    """The names of `machines` (one cluster's) in the pool: those it names, and those having all its labels."""
    return sorted(m.name for m in machines if in_pool(pool.machines, pool.labels, m.name, m.labels))


def cluster_machines(s: Session, cluster_id: int) -> list[Machine]:
    return list(s.scalars(select(Machine).where(Machine.cluster_id == cluster_id).order_by(Machine.name)))


def cluster_pools(s: Session, cluster_id: int) -> list[Pool]:
    return list(s.scalars(select(Pool).where(Pool.cluster_id == cluster_id).order_by(Pool.name)))


def members_by_pool(s: Session, cluster_id: int) -> dict[str, list[str]]:
    """Every pool of the cluster, by name, with its member machines' names."""
    machines = cluster_machines(s, cluster_id)
    return {p.name: pool_members(p, machines) for p in cluster_pools(s, cluster_id)}


def _gpus_used(s: Session, machine_ids: list[int]) -> dict[int, int]:
    used: dict[int, set] = {}  # a GPU shared by fractional workers (issue 46) counts once
    if not machine_ids:
        return {}
    for mid, idx in s.execute(select(Worker.machine_id, Worker.gpu_indices).where(
            Worker.state.in_(lifecycle.ACTIVE), Worker.machine_id.in_(machine_ids))):
        used.setdefault(mid, set()).update(idx or [])
    return {mid: len(g) for mid, g in used.items()}


def _counts(s: Session, members: list[Machine]) -> tuple[int, int, list[str]]:
    """Total GPUs, free GPUs (on Ready machines), and the GPU models of these machines."""
    used = _gpus_used(s, [m.id for m in members])
    gpus = sum(m.gpus for m in members)
    free = sum(max(0, m.gpus - used.get(m.id, 0)) for m in members if m.state == lifecycle.MachineState.READY)
    models: list[str] = []
    for m in members:
        for g in m.gpu_models or []:
            if g not in models:
                models.append(g)
    return gpus, free, models


def pool_view(s: Session, pool: Pool, cluster: Cluster, machines: list[Machine] | None = None) -> dict:
    machines = cluster_machines(s, cluster.id) if machines is None else machines
    names = pool_members(pool, machines)
    members = [m for m in machines if m.name in set(names)]
    gpus, free, _ = _counts(s, members)
    return {"name": pool.name, "cluster": cluster.name,
            "selector": {"machines": list(pool.machines or []), "labels": dict(pool.labels or {})},
            "machines": names, "gpus": gpus, "free_gpus": free, "created_at": iso(pool.created_at)}


def _cluster(s: Session, c: Caller, name: str) -> Cluster:
    cl = s.scalar(select(Cluster).where(Cluster.org_id == c.org.id, Cluster.name == name))
    if cl is None:
        raise ApiError(404, "CLUSTER_NOT_FOUND", f"cluster {name} not found")
    return cl


def _pool(s: Session, cl: Cluster, name: str) -> Pool:
    p = s.scalar(select(Pool).where(Pool.cluster_id == cl.id, Pool.name == name))
    if p is None:
        raise ApiError(404, "NOT_FOUND", f"pool {name} not found in cluster {cl.name}: see the cluster's pools "
                                         f"with GET $ORG_API/clusters/{cl.name}/pools")
    return p


def _parsed(model, body) -> dict:
    """`body` (a dict: the router's, or the console's form) checked by `model`: InvalidBody naming the field."""
    if isinstance(body, B.BaseModel):
        body = body.model_dump(exclude_unset=True)
    try:
        return model.model_validate(body).model_dump(exclude_unset=True)
    except ValidationError as e:
        raise InvalidBody(e.errors()) from None


def _check_selector(s: Session, cl: Cluster, body: dict) -> tuple[list[str], dict]:
    machines, labels = list(body.get("machines") or []), dict(body.get("labels") or {})
    if not machines and not labels:
        raise ApiError(422, "INVALID", "machines: give machines or labels (or both)")
    known = {m.name for m in cluster_machines(s, cl.id)}
    for n in machines:
        if n not in known:
            raise ApiError(422, "INVALID", f"machines: no machine named {n} in cluster {cl.name}")
    return list(dict.fromkeys(machines)), labels


def list_pools(s: Session, c: Caller, cluster_name: str) -> list[dict]:
    cl = _cluster(s, c, cluster_name)
    machines = cluster_machines(s, cl.id)
    return [pool_view(s, p, cl, machines) for p in cluster_pools(s, cl.id)]


def get_pool(s: Session, c: Caller, cluster_name: str, name: str) -> dict:
    cl = _cluster(s, c, cluster_name)
    return pool_view(s, _pool(s, cl, name), cl)


def create_pool(s: Session, c: Caller, cluster_name: str, body) -> dict:
    cl = _cluster(s, c, cluster_name)
    body = _parsed(B.PoolCreate, body)
    name = body["name"]
    if s.scalar(select(Pool.id).where(Pool.cluster_id == cl.id, Pool.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a pool named {name} already exists in cluster {cl.name}")
    machines, labels = _check_selector(s, cl, body)
    p = Pool(cluster_id=cl.id, name=name, machines=machines, labels=labels)
    s.add(p)
    s.flush()
    return pool_view(s, p, cl)


def replace_pool(s: Session, c: Caller, cluster_name: str, name: str, body) -> dict:
    cl = _cluster(s, c, cluster_name)
    p = _pool(s, cl, name)
    body = _parsed(B.PoolReplace, body)
    if body.get("name") not in (None, name):
        raise ApiError(422, "INVALID", f"name: a pool is not renamed: give {name} or leave name out")
    p.machines, p.labels = _check_selector(s, cl, body)
    s.flush()
    return pool_view(s, p, cl)


def pool_users(s: Session, cl: Cluster, name: str, at: float) -> list[str]:
    """What keeps the pool from being deleted: workspaces whose access lists it, reservations not yet ended
    made from it."""
    out = []
    for ws, a in s.execute(select(Workspace, Access).join(Access, Access.workspace_id == Workspace.id)
                           .where(Access.cluster_id == cl.id).order_by(Workspace.name)):
        if a.pools is not None and name in a.pools:
            out.append(f"workspace {ws.name}'s access lists it")
    for r in s.scalars(select(Reservation).where(Reservation.cluster_id == cl.id, Reservation.pool == name)
                       .order_by(Reservation.name)):
        if r.end_at is None or r.end_at > at:
            out.append(f"reservation {r.name} was made from it")
    return out


def delete_pool(s: Session, c: Caller, cluster_name: str, name: str, at: float | None = None) -> None:
    cl = _cluster(s, c, cluster_name)
    at = time.time() if at is None else at
    p = _pool(s, cl, name)
    users = pool_users(s, cl, name, at)
    if users:
        raise ApiError(409, "POOL_IN_USE", f"pool {name} is in use: {'; '.join(users)}")
    s.delete(p)
    s.flush()


def check_access_pools(s: Session, cl: Cluster, pools: list[str] | None) -> list[str] | None:
    """A workspace's access pools on `cl` (None: every machine), each a pool of the cluster: else 422 naming
    `clusters.<cluster>.pools`."""
    if pools is None:
        return None
    known = {p.name for p in cluster_pools(s, cl.id)}
    for n in pools:
        if n not in known:
            raise ApiError(422, "INVALID", f"clusters.{cl.name}.pools: no pool named {n} in cluster {cl.name}")
    return list(dict.fromkeys(pools))


def workspace_pools(s: Session, c: Caller) -> list[dict]:
    """GET $API/pools: the pools the caller's workspace may use (all the cluster's when its access is not
    restricted), with their machines, GPUs and GPU models."""
    out = []
    rows = s.execute(select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id)
                     .where(Access.workspace_id == c.workspace.id).order_by(Cluster.name)).all()
    for cl, a in rows:
        machines = cluster_machines(s, cl.id)
        for p in cluster_pools(s, cl.id):
            if a.pools is not None and p.name not in a.pools:
                continue
            names = set(pool_members(p, machines))
            members = [m for m in machines if m.name in names]
            gpus, free, models = _counts(s, members)
            out.append({"name": p.name, "cluster": cl.name, "machines": [m.name for m in members], "gpus": gpus,
                        "free_gpus": free, "gpu_models": models})
    return out
