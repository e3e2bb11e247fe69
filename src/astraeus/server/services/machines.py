"""Machines a caller may see, their views (GPUs, pools, disk pressure) and the workspace's own view."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from astraeus import units
from astraeus.scheduler import gpushare
from astraeus.server import lifecycle
from astraeus.server.db import (
    Access,
    Cluster,
    Machine,
    Pool,
    Worker,
)
from astraeus.server.services.auth import Caller
from astraeus.server.services.views import access_view, iso


def granted_cluster_ids(session: Session, caller: Caller) -> list[int]:
    """The clusters the caller's workspace has access to."""
    return list(session.scalars(select(Access.cluster_id).where(Access.workspace_id == caller.workspace.id)))


def list_machines(session: Session, cluster_ids: list[int], after: tuple[str, int] | None = None,
                  limit: int | None = None) -> list[Machine]:
    """The machines of `cluster_ids` by name (then id: two clusters may share a name), after the sort key `after`
    (a page's last machine), at most `limit` (None: all of them)."""
    q = select(Machine).where(Machine.cluster_id.in_(cluster_ids))
    if after is not None:
        q = q.where(Machine.name >= after[0], or_(Machine.name > after[0], Machine.id > after[1]))
    q = q.order_by(Machine.name, Machine.id)
    if limit is not None:
        q = q.limit(limit)
    return list(session.scalars(q))


def machines_view(session: Session, cluster_ids: list[int], machines: list[Machine] | None = None) -> list[dict]:
    """The views of `machines` (of `cluster_ids`; None: every machine of them, by name)."""
    if machines is None:
        machines = list_machines(session, cluster_ids)
    counts: dict[int, set] = {}  # machine -> its GPUs in use (a GPU shared by fractional workers counts once)
    mig_used: dict[int, list] = {}  # issue 46: machine -> its MIG devices held by workers, [gpu, profile, k] each
    held: dict[int, dict[int, int]] = {}  # issue 46: machine -> per GPU the part workers hold of it, in _WHOLE
    q = select(Worker.machine_id, Worker.gpu_indices, Worker.mig_devices, Worker.gpu_milli).where(
        Worker.state.in_(lifecycle.ACTIVE))
    if len(machines) <= 1000:
        q = q.where(Worker.machine_id.in_([m.id for m in machines]))
    for mid, idx, mig, milli in session.execute(q):
        counts.setdefault(mid, set()).update(idx or [])
        on = held.setdefault(mid, {})
        if mig:
            mig_used.setdefault(mid, []).extend(mig)
            for g, profile, _ in mig:  # by compute slices, so that a GPU's seven 1g devices make one whole
                on[g] = on.get(g, 0) + units.mig_slices(profile) * _SLICE
        else:
            for g in idx or []:  # a fractional worker's share of its one GPU, else each GPU whole
                on[g] = on.get(g, 0) + (milli or gpushare.FULL) * _MILLI
    out = []
    names = dict(session.execute(select(Cluster.id, Cluster.name)).all())
    in_pools: dict[tuple[int, str], list[str]] = {}  # (cluster id, machine) -> the pools it is in
    from astraeus.server.pools import pool_members

    for p in session.scalars(select(Pool).where(Pool.cluster_id.in_(cluster_ids)).order_by(Pool.name)):
        for n in pool_members(p, [m for m in machines if m.cluster_id == p.cluster_id]):
            in_pools.setdefault((p.cluster_id, n), []).append(p.name)
    from astraeus.server import health

    for m in machines:
        u = len(counts.get(m.id, ()))
        h = health.view(m)
        usable = m.gpus - len(h["quarantined_gpus"])
        out.append({"name": m.name, "cluster": names.get(m.cluster_id), "state": m.state, "gpus": m.gpus,
                    "pools": in_pools.get((m.cluster_id, m.name), []),
                    "gpus_used": u, "gpus_free": max(0, usable - u) if m.state == "Ready" and not m.cordon else 0,
                    "gpu_models": m.gpu_models, "cpu_cores": m.cpu_cores, "memory_bytes": m.memory_bytes,
                    "stop_grace_seconds": m.stop_grace_seconds, "labels": m.labels, "runtime": m.runtime,
                    "address": m.address, "shared_filesystems": m.shared_filesystems or {},
                    "nfs": m.nfs or {"server": None, "client": False, "rdma": False},
                    **_disk_view(m), "last_heartbeat": iso(m.last_heartbeat), **h,
                    **_mig_view(m, mig_used.get(m.id, ())), **_allocated_view(m, held.get(m.id, {}))})
        if m.cordon and m.state == "Ready":  # cordoned or drained: says so where disk pressure would
            out[-1]["schedulable"], out[-1]["reason"] = False, health.unschedulable(m)
        if h["quarantined_gpus"]:  # and its failed GPUs, after that
            out[-1]["reason"] = "; ".join(x for x in (out[-1]["reason"], health.gpus_reason(m)) if x)
    return out


def _mig_view(m: Machine, held) -> dict:
    """Issue 46: per GPU its MIG devices by profile as its agent reports them (`gpu_mig`) and how many of them
    workers hold (`gpu_mig_used`); both [] on a machine without MIG."""
    reported = [dict(d or {}) for d in (m.gpu_mig or [])[:m.gpus]]
    if not any(reported):
        return {"gpu_mig": [], "gpu_mig_used": []}
    used: list[dict[str, int]] = [{} for _ in reported]
    for g, profile, _ in held:
        if 0 <= g < len(used):
            used[g][profile] = used[g].get(profile, 0) + 1
    return {"gpu_mig": reported, "gpu_mig_used": used}


def _allocated_view(m: Machine, on: dict[int, int]) -> dict:
    """Issue 46: how much of each GPU workers hold (`gpu_allocated`: 1 held whole, 0.5 by fractional workers or MIG
    devices making half of it, 0 free), their sum (`gpus_allocated`) and each GPU's memory as its agent reports it
    (`gpu_memory_bytes`; [] where none is reported)."""
    per = [on.get(g, 0) for g in range(m.gpus)]
    return {"gpu_allocated": [_gpus(n) for n in per], "gpus_allocated": _gpus(sum(per)),
            "gpu_memory_bytes": list(m.gpu_memory or [])[:m.gpus]}


# A GPU counted in parts that both thousandths (fractional workers) and sevenths (MIG compute slices) divide exactly.
_WHOLE = gpushare.FULL * gpushare.MIG_SLICES
_MILLI, _SLICE = _WHOLE // gpushare.FULL, _WHOLE // gpushare.MIG_SLICES


def _gpus(parts: int) -> int | float:
    """Parts of a GPU (_WHOLE each) as GPUs: 2, 0.5, 0.429 (three MIG slices of seven)."""
    return parts // _WHOLE if parts % _WHOLE == 0 else round(parts / _WHOLE, 3)


def _disk_view(m: Machine) -> dict:
    """A machine's disk (its agent's state dir's filesystem; None from an older agent) and why it takes no new
    workers (None: it does, or it is Lost, which its state says)."""
    from astraeus.server.diskfull import PRESSURE_BELOW, disk_pressure

    disk = None if m.disk_total_bytes is None else {
        "path": m.disk_path, "free_bytes": m.disk_free_bytes, "total_bytes": m.disk_total_bytes,
        "free_percent": round(100 * (m.disk_free_bytes or 0) / m.disk_total_bytes, 1) if m.disk_total_bytes else None}
    reason = disk_pressure(m.disk_path, m.disk_free_bytes, m.disk_total_bytes, PRESSURE_BELOW) \
        if m.state == "Ready" else None
    return {"schedulable": m.state == "Ready" and reason is None, "reason": reason, "disk": disk}


def workspace_view(session: Session, caller: Caller, base: str) -> dict:
    rows = session.execute(select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id)
                           .where(Access.workspace_id == caller.workspace.id).order_by(Cluster.id)).all()
    return {
        "name": caller.workspace.name, "id": caller.workspace.ns, "org": caller.org.name, "role": caller.role,
        "console_url": f"{base}/o/{caller.org.name}/w/{caller.workspace.name}",
        "clusters": [access_view(c, a) for c, a in rows],
    }
