"""Organisation administration: workspaces (quota, weight, max priority, host paths), clusters and tokens.

Callers are organisation admins (`services.org_admin_caller`); routers/admin.py and the console only call these.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus.imageref import ImageRef
from astraeus.server import pools, services
from astraeus.server.db import Access, Cluster, Machine, Org, Token, Workspace
from astraeus.server.services import ApiError, Caller, users


def _check_name(name: str, what: str) -> None:
    try:
        S.check_dns_label(name, what)
    except ValueError as e:
        raise ApiError(422, "INVALID", f"name: {e}") from None


# ------------------------------------------------------------------------------------------ workspaces


def workspace_out(s: Session, ws: Workspace) -> dict:
    rows = s.execute(select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id)
                     .where(Access.workspace_id == ws.id)).all()
    return {"name": ws.name, "id": ws.ns, "clusters": {c.name: services.access_view(c, a) for c, a in rows}}


def list_workspaces(s: Session, c: Caller) -> list[dict]:
    return [workspace_out(s, ws) for ws in s.scalars(select(Workspace).where(Workspace.org_id == c.org.id))]


def workspace_named(s: Session, c: Caller, name: str) -> Workspace:
    ws = s.scalar(select(Workspace).where(Workspace.org_id == c.org.id, Workspace.name == name))
    if ws is None:
        raise ApiError(404, "NOT_FOUND", f"workspace {name} not found")
    return ws


def check_default_image(cluster: str, image) -> str | None:
    """A workspace's default image on a cluster, checked as a run's image is (422 naming the field)."""
    if image is None or image == "":
        return None
    try:
        ImageRef.parse(str(image))
    except ValueError as e:
        raise ApiError(422, "INVALID", f"clusters.{cluster}.default_image: {e}") from None
    return str(image)


def apply_clusters(s: Session, c: Caller, ws: Workspace, clusters: dict) -> None:
    """Grant or change the workspace's access to each named cluster (quota, weight, max priority, host paths,
    pools)."""
    for cname, conf in (clusters or {}).items():
        cl = s.scalar(select(Cluster).where(Cluster.org_id == c.org.id, Cluster.name == cname))
        if cl is None:
            raise ApiError(404, "CLUSTER_NOT_FOUND", f"cluster {cname} not found: create it first")
        conf = dict(conf or {})
        mp = conf.get("max_priority")
        if mp is not None and not (S.PRIORITY_MIN <= int(mp) <= S.PRIORITY_MAX):
            raise ApiError(422, "INVALID", f"clusters.{cname}.max_priority: must be between -1000 and 1000")
        try:
            acc = services.set_access(s, ws, cl, max_priority=mp, weight=conf.get("weight"),
                                      host_paths=conf.get("host_paths"), quota=conf.get("quota"),
                                      host_network=conf.get("host_network"))
        except ValueError as e:
            raise ApiError(422, "INVALID", f"clusters.{cname}: {e}") from None
        if "pools" in conf:  # the pools it may use; null: every machine of the cluster again
            acc.pools = pools.check_access_pools(s, cl, conf["pools"])
            s.flush()
        if "max_gpus_per_user" in conf:  # the most GPUs one user's runs hold at once; null: no limit again
            acc.max_gpus_per_user = conf["max_gpus_per_user"]
            s.flush()
        if "default_image" in conf:  # the image its runs use when they name none; null or "": none again
            acc.default_image = check_default_image(cname, conf["default_image"])
            s.flush()


def create_workspace(s: Session, c: Caller, body: dict) -> dict:
    name = body.get("name", "")
    _check_name(name, "workspace name")
    if s.scalar(select(Workspace).where(Workspace.org_id == c.org.id, Workspace.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a workspace named {name} already exists")
    ws = services.ensure_workspace(s, c.org, name)
    apply_clusters(s, c, ws, body.get("clusters") or {})
    return workspace_out(s, ws)


def update_workspace(s: Session, c: Caller, name: str, body: dict) -> dict:
    ws = workspace_named(s, c, name)
    apply_clusters(s, c, ws, body.get("clusters") or {})
    return workspace_out(s, ws)


# -------------------------------------------------------------------------------------------- clusters


def cluster_out(cl: Cluster) -> dict:
    return {"name": cl.name, "preemption": cl.preemption, "lost_after_seconds": cl.lost_after_seconds,
            "preemption_victims": cl.preemption_victims or "recent", "gpu_sharing": cl.gpu_sharing or "workspace",
            "placement": cl.placement or "bestfit"}


def list_clusters(s: Session, c: Caller) -> list[dict]:
    return [cluster_out(cl) for cl in s.scalars(select(Cluster).where(Cluster.org_id == c.org.id))]


def cluster_named(s: Session, c: Caller, name: str) -> Cluster:
    cl = s.scalar(select(Cluster).where(Cluster.org_id == c.org.id, Cluster.name == name))
    if cl is None:
        raise ApiError(404, "NOT_FOUND", f"cluster {name} not found")
    return cl


def create_cluster(s: Session, c: Caller, body: dict) -> dict:
    name = body.get("name", "")
    _check_name(name, "cluster name")
    if s.scalar(select(Cluster).where(Cluster.org_id == c.org.id, Cluster.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a cluster named {name} already exists")
    cl = services.ensure_cluster(s, c.org, name, bool(body.get("preemption", True)), body.get("lost_after_seconds"))
    _set_policies(cl, body)
    return cluster_out(cl)


POLICIES = ("preemption_victims", "gpu_sharing", "placement")  # a cluster's choices among named rules (bodies.py)


def _set_policies(cl: Cluster, body: dict) -> None:
    for key in POLICIES:
        if body.get(key):
            setattr(cl, key, body[key])


def update_cluster(s: Session, c: Caller, name: str, body: dict) -> dict:
    cl = cluster_named(s, c, name)
    if "preemption" in body:
        cl.preemption = bool(body["preemption"])
    if body.get("lost_after_seconds") is not None:
        cl.lost_after_seconds = float(body["lost_after_seconds"])
    _set_policies(cl, body)
    return cluster_out(cl)


# ---------------------------------------------------------------------------------------------- tokens


def issue_token(s: Session, c: Caller, body: dict) -> dict:
    """A new token; the only time its secret is shown."""
    kind = body.get("kind")
    ws = cl = role = None
    if kind == "user":
        ws = s.scalar(select(Workspace).where(Workspace.org_id == c.org.id, Workspace.name == body.get("workspace")))
        if ws is None:
            raise ApiError(404, "NOT_FOUND", f"workspace {body.get('workspace')} not found")
        role = body.get("role", "viewer")
        if role not in services.ROLES:
            raise ApiError(422, "INVALID", "role: must be viewer, editor or admin")
    elif kind == "machine":
        cl = s.scalar(select(Cluster).where(Cluster.org_id == c.org.id, Cluster.name == body.get("cluster")))
        if cl is None:
            raise ApiError(404, "NOT_FOUND", f"cluster {body.get('cluster')} not found")
    elif kind != "org_admin":
        raise ApiError(422, "INVALID", "kind: must be user, org_admin or machine")
    org = s.get(Org, c.org.id)
    tok, secret = services.create_token(s, org, kind, ws, role, cl, body.get("expires_in_seconds"),
                                        user=users.owner_for(s, org, kind, ws, role))
    return {"id": tok.id, "kind": kind, "role": role, "token": secret}


def list_tokens(s: Session, c: Caller) -> list[dict]:
    """Every token of the organisation, never a secret. A machine token is a join token (`machine` null: it only
    registers machines) or a machine's own credential (`machine`: its name); either can be revoked."""
    clusters = dict(s.execute(select(Cluster.id, Cluster.name).where(Cluster.org_id == c.org.id)).all())
    machines = dict(s.execute(select(Machine.id, Machine.name).where(Machine.cluster_id.in_(clusters))).all())
    return [{"id": t.id, "kind": t.kind, "role": t.role, "revoked": t.revoked, "expires_at": services.iso(t.expires_at),
             **({"cluster": clusters.get(t.cluster_id), "machine": machines.get(t.machine_id)}
                if t.kind == "machine" else {})}
            for t in s.scalars(select(Token).where(Token.org_id == c.org.id).order_by(Token.id))]


def revoke_token(s: Session, c: Caller, token_id: int) -> None:
    t = s.get(Token, token_id)
    if t is None or t.org_id != c.org.id:
        raise ApiError(404, "NOT_FOUND", f"token {token_id} not found")
    t.revoked = True
