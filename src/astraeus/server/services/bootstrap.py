"""What a fresh control plane makes if it is missing: the organisation, cluster, workspace and the workspace's access."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus.server.db import (
    Access,
    Cluster,
    Org,
    Workspace,
)
from astraeus.server.services.auth import new_ns
from astraeus.server.services.drives import check_grants


def ensure_org(session: Session, name: str) -> Org:
    org = session.scalar(select(Org).where(Org.name == name))
    if org is None:
        org = Org(name=name)
        session.add(org)
        session.flush()
    return org


def ensure_cluster(session: Session, org: Org, name: str, preemption: bool = True,
                   lost_after: float | None = None) -> Cluster:
    c = session.scalar(select(Cluster).where(Cluster.org_id == org.id, Cluster.name == name))
    if c is None:
        c = Cluster(org_id=org.id, name=name, preemption=preemption)
        session.add(c)
    if lost_after is not None:
        c.lost_after_seconds = lost_after
    session.flush()
    return c


def ensure_workspace(session: Session, org: Org, name: str) -> Workspace:
    S.check_dns_label(name, "workspace name")
    ws = session.scalar(select(Workspace).where(Workspace.org_id == org.id, Workspace.name == name))
    if ws is None:
        ws = Workspace(org_id=org.id, name=name, ns=new_ns())
        session.add(ws)
        session.flush()
    return ws


def set_access(session: Session, ws: Workspace, cluster: Cluster, **fields) -> Access:
    acc = session.scalar(select(Access).where(Access.workspace_id == ws.id, Access.cluster_id == cluster.id))
    if acc is None:
        acc = Access(workspace_id=ws.id, cluster_id=cluster.id, host_paths=[])
        session.add(acc)
    quota = fields.pop("quota", None)
    if quota is not None:
        for k in ("gpus", "cpu_cores", "memory_bytes", "workers"):
            if k in quota:
                setattr(acc, f"quota_{k}", quota[k])
    for k, v in fields.items():
        if v is not None:
            if k == "host_paths":
                for p in v:
                    S.check_host_path(p)
                v = list(v)
                check_grants(session, ws, cluster, [p for p in v if p not in (acc.host_paths or [])])
            setattr(acc, k, v)
    session.flush()
    return acc
