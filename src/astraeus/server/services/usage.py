"""Accounting's reports: the usage records of worker attempts (written by astraeus.server.accounting when an attempt
ends) added up by astraeus.usage (pure) for GET $API/usage, $ORG_API/usage and $API/usage/records."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from astraeus import usage as U
from astraeus.server.accounting import gpu_model
from astraeus.server.db import Cluster, Machine, Org, Run, UsageRecord, Worker, Workspace
from astraeus.server.services.errors import ApiError
from astraeus.server.services.views import iso

# ------------------------------------------------------------------------------------------- reading


def record_view(r: UsageRecord) -> dict:
    return {"workspace": r.workspace, "cluster": r.cluster, "run": r.run, "run_uid": r.run_uid, "worker": r.worker,
            "attempt": r.attempt, "user": r.user, "pool": r.pool, "machine": r.machine, "gpu_model": r.gpu_model,
            "gpus": r.gpus, "cpu_cores": r.cpu_cores, "memory_bytes": r.memory_bytes, "start": iso(r.started_at),
            "end": iso(r.ended_at), "seconds": round(r.ended_at - r.started_at, 3),
            "gpu_seconds": round(r.gpus * (r.ended_at - r.started_at), 3), "wait_seconds": round(r.wait_seconds, 3),
            "state": r.state, "reason": r.reason, "preempted_by": r.preempted_by}


def _attempts(s: Session, org_id: int, workspace_id: int | None, since: float, until: float) -> list[U.Attempt]:
    """The ended attempts that overlap [since, until), and the attempts holding a machine now."""
    q = select(UsageRecord).where(UsageRecord.org_id == org_id, UsageRecord.ended_at >= since,
                                  UsageRecord.started_at < until)
    if workspace_id is not None:
        q = q.where(UsageRecord.workspace_id == workspace_id)
    out = [U.Attempt(r.workspace, r.user, r.run, r.cluster, r.gpu_model, r.gpus, r.cpu_cores, r.started_at,
                     r.ended_at, r.wait_seconds, r.state, r.run_uid) for r in s.scalars(q)]
    live = (select(Worker, Run, Workspace.name, Cluster.name, Machine)
            .join(Run, Worker.run_id == Run.id).join(Workspace, Run.workspace_id == Workspace.id)
            .join(Cluster, Run.cluster_id == Cluster.id).outerjoin(Machine, Worker.machine_id == Machine.id)
            .where(Workspace.org_id == org_id, Worker.state.in_(("Starting", "Running", "Stopping")),
                   Worker.placed_at.is_not(None), Worker.placed_at < until))
    if workspace_id is not None:
        live = live.where(Run.workspace_id == workspace_id)
    rows = s.execute(live).all()
    ended = {}
    if rows:  # each live worker's previous attempt, for its queue wait
        ids = sorted({w.run_id for w, *_ in rows})
        last = (select(UsageRecord.run_id, UsageRecord.worker, func.max(UsageRecord.ended_at))
                .where(UsageRecord.run_id.in_(ids)).group_by(UsageRecord.run_id, UsageRecord.worker))
        ended = {(rid, w): t for rid, w, t in s.execute(last)}
    for w, run, ws, cl, m in rows:
        queued = ended.get((run.id, w.name), run.created_at)
        out.append(U.Attempt(ws, run.created_by, run.name, cl, gpu_model(m, w.gpu_indices or []),
                             len(w.gpu_indices or []) or w.gpus, w.cpu_cores or 0.0, w.placed_at, None,
                             U.wait_seconds(w.placed_at, queued), "Running", run.uid))
    return out


def report(s: Session, org: Org, workspace: Workspace | None, group_by: list[str] | None, since: str | None,
           until: str | None, now: float) -> dict:
    """GET $API/usage (one workspace) and $ORG_API/usage (`workspace` None: the whole organisation)."""
    try:
        groups = U.parse_group_by(group_by)
        lo, hi = U.window(since, until, now)
    except U.UsageError as e:
        raise ApiError(422, "INVALID", str(e)) from None
    attempts = _attempts(s, org.id, workspace.id if workspace else None, lo, hi)
    items, total = U.aggregate(attempts, groups, lo, hi, now)
    return {"since": iso(lo), "until": iso(hi), "group_by": list(groups), "items": items, "total": total}


def records(s: Session, org: Org, workspace: Workspace | None, since: str | None, until: str | None,
            now: float, run: str | None = None) -> dict:
    """The usage records themselves (ended attempts), oldest first: what the reports add up."""
    try:
        lo, hi = U.window(since, until, now)
    except U.UsageError as e:
        raise ApiError(422, "INVALID", str(e)) from None
    q = select(UsageRecord).where(UsageRecord.org_id == org.id, UsageRecord.ended_at >= lo,
                                  UsageRecord.started_at < hi)
    if workspace is not None:
        q = q.where(UsageRecord.workspace_id == workspace.id)
    if run is not None:
        q = q.where(UsageRecord.run == run)
    return {"since": iso(lo), "until": iso(hi),
            "items": [record_view(r) for r in s.scalars(q.order_by(UsageRecord.id).limit(10000))]}


def attempts(s: Session, org: Org, workspace: Workspace | None, since: str | None, until: str | None,
             now: float) -> tuple[float, float, list[U.Attempt]]:
    """The window [since, until) and the attempts in it that the reports add up (the console's Usage page charts
    them); a bad `since`/`until` is a 422 as GET $API/usage's."""
    try:
        lo, hi = U.window(since, until, now)
    except U.UsageError as e:
        raise ApiError(422, "INVALID", str(e)) from None
    return lo, hi, _attempts(s, org.id, workspace.id if workspace else None, lo, hi)


def machine_intervals(s: Session, machine_ids: list[int], since: float,
                      now: float) -> dict[int, list[tuple[float, float, int]]]:
    """Each machine's GPUs held since `since`, as (start, end, gpus): its ended attempts' usage records, and its
    workers holding GPUs now (until `now`). Every workspace's: a machine's use is the machine's, not a run's."""
    if not machine_ids:
        return {}
    ms = {m.id: m for m in s.scalars(select(Machine).where(Machine.id.in_(machine_ids)))}
    clusters = {c.id: c for c in s.scalars(select(Cluster).where(Cluster.id.in_({m.cluster_id for m in ms.values()})))}
    # a record names its machine by organisation, cluster and name (it outlives the machine's row)
    machine_of = {(clusters[m.cluster_id].org_id, clusters[m.cluster_id].name, m.name): i for i, m in ms.items()}
    out: dict[int, list[tuple[float, float, int]]] = {i: [] for i in ms}
    q = select(UsageRecord.org_id, UsageRecord.cluster, UsageRecord.machine, UsageRecord.started_at,
               UsageRecord.ended_at, UsageRecord.gpus).where(UsageRecord.ended_at >= since,
                                                             UsageRecord.machine.in_({m.name for m in ms.values()}))
    for org_id, cl, name, start, end, gpus in s.execute(q):
        i = machine_of.get((org_id, cl, name))
        if i is not None and gpus:
            out[i].append((start, end, gpus))
    live = select(Worker.machine_id, Worker.placed_at, Worker.gpu_indices, Worker.gpus).where(
        Worker.machine_id.in_(list(ms)), Worker.state.in_(("Starting", "Running", "Stopping")),
        Worker.placed_at.is_not(None))
    for mid, placed, idx, gpus in s.execute(live):
        n = len(idx or []) or gpus or 0
        if n:
            out[mid].append((placed, now, n))
    return out
