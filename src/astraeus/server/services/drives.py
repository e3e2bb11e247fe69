"""Drives: create (checked against the machines and every other workspace's drives and grants), list, delete."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import drives as drive_rules
from astraeus import spec as S
from astraeus.server import lifecycle
from astraeus.server.db import (
    Access,
    Cluster,
    Drive,
    Machine,
    Workspace,
)
from astraeus.server.services.auth import Caller, require
from astraeus.server.services.errors import ApiError
from astraeus.server.services.runs import _cluster_for
from astraeus.server.services.views import drive_view


def create_drive(session: Session, caller: Caller, body: S.DriveCreate, at: float) -> Drive:
    require(caller, "editor")
    cluster, access = _cluster_for(session, caller, None)
    src = body.spec.sources[0]
    granted = access.host_paths or []
    if S.granted_root(src.model_dump(), granted) is None:
        allowed = ", ".join(granted) or "none"
        where = f"in shared filesystem {src.filesystem} " if src.filesystem else ""
        grant = f"; a grant in it is written {src.filesystem}:/path" if src.filesystem else ""
        raise ApiError(403, "HOST_PATH_NOT_GRANTED",
                       f"spec.sources[0].path {src.path} {where}is outside the host paths granted to workspace "
                       f"{caller.workspace.name} on cluster {cluster.name} ({allowed}): use a path under one of them, "
                       f"or ask an organisation admin to grant it (Settings → Clusters → Change → Host paths{grant})")
    name = body.metadata.name
    if session.scalar(select(Drive.id).where(Drive.workspace_id == caller.workspace.id, Drive.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a drive named {name} already exists: choose another metadata.name")
    check_drive_place(session, caller.workspace.id, cluster.id, src.model_dump())
    d = Drive(workspace_id=caller.workspace.id, cluster_id=cluster.id, name=name,
              spec=body.spec.model_dump(mode="json", exclude_none=True), created_at=at, created_by=caller.user,
              updated_by=caller.user)
    session.add(d)
    lifecycle.event(session, caller.workspace.id, "DriveCreated", name,
                    f"drive {name} on {src.where()}", at)
    session.flush()
    return d


def _machine_facts(session: Session, cluster_id: int) -> list[drive_rules.MachineFacts]:
    """The cluster's machines as far as drives' places go: their names and shared filesystems."""
    return [drive_rules.MachineFacts(name=n, shared_filesystems=dict(fs or {})) for n, fs in session.execute(
        select(Machine.name, Machine.shared_filesystems).where(Machine.cluster_id == cluster_id))]


def check_drive_place(session: Session, ws_id: int, cluster_id: int, src: dict) -> None:
    """Refuse a drive folder (a source) of workspace `ws_id` that is inside, equal to or above a drive folder of
    another workspace on the cluster, or that holds a folder granted to another workspace (drives.py says why).
    The message names neither the other workspace nor its drive. Called in the state transaction (tx), so two
    creates racing are checked one after the other."""
    machines = _machine_facts(session, cluster_id)
    mine = drive_rules.source_places(src, machines)
    others = select(Drive.spec).where(Drive.cluster_id == cluster_id, Drive.workspace_id != ws_id)
    grants = select(Access.host_paths).where(Access.cluster_id == cluster_id, Access.workspace_id != ws_id)
    if (any(drive_rules.overlap(mine, drive_rules.source_places(spec["sources"][0], machines))
            for spec in session.scalars(others))
            or any(drive_rules.holds(mine, drive_rules.grant_places(g, machines))
                   for paths in session.scalars(grants) for g in paths or [])):
        where = f" in shared filesystem {src['filesystem']}" if src.get("filesystem") else ""
        raise ApiError(409, "PATH_IN_USE", f"spec.sources[0].path {src['path']}{where} overlaps a folder another "
                                           f"workspace uses; choose a path outside it")


def check_grants(session: Session, ws: Workspace, cluster: Cluster, added: list[str]) -> None:
    """Refuse host paths newly granted to `ws` on `cluster` that lie inside (or are) a drive folder of another
    workspace there. Grants may be shared or nested (drives.py): the drives made in them are what may not overlap.
    An organisation admin asks, so the message names the drive and its workspace."""
    if not added:
        return
    machines = _machine_facts(session, cluster.id)
    rows = session.execute(select(Drive.name, Drive.spec, Workspace.name).join(Workspace, Drive.workspace_id == Workspace.id)
                           .where(Drive.cluster_id == cluster.id, Drive.workspace_id != ws.id).order_by(Drive.id))
    drives = [(name, spec["sources"][0], owner) for name, spec, owner in rows]
    for p in added:
        mine = drive_rules.grant_places(p, machines)
        for name, src, owner in drives:
            if drive_rules.holds(drive_rules.source_places(src, machines), mine):
                raise ApiError(409, "PATH_IN_USE",
                               f"clusters.{cluster.name}.host_paths: {p} overlaps drive {name} of workspace {owner} "
                               f"({S.DriveSource(**src).where()}): grant a folder outside it")


def list_drives(session: Session, caller: Caller) -> list[Drive]:
    return list(session.scalars(select(Drive).where(Drive.workspace_id == caller.workspace.id).order_by(Drive.name)))


def drive_out(session: Session, caller: Caller, d: Drive) -> dict:
    """drive_view for a drive of the caller's workspace."""
    return drive_view(d, caller.workspace, session.get(Cluster, d.cluster_id))


def get_drive(session: Session, caller: Caller, name: str) -> Drive:
    d = session.scalar(select(Drive).where(Drive.workspace_id == caller.workspace.id, Drive.name == name))
    if d is None:
        raise ApiError(404, "NOT_FOUND", f"drive {name} not found in workspace {caller.workspace.name}")
    return d


def delete_drive(session: Session, caller: Caller, name: str, at: float) -> None:
    require(caller, "editor")
    d = get_drive(session, caller, name)
    session.delete(d)
    lifecycle.event(session, caller.workspace.id, "DriveDeleted", name,
                    f"drive {name} deleted; its files stay on {S.DriveSource(**d.spec['sources'][0]).where()}", at)
