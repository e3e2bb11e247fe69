"""Accounting's writer: the usage record of a worker attempt, written where every attempt ends (lifecycle.ended),
and the Prometheus counters per workspace it feeds. What the end means is astraeus.usage's (pure); the reports
read the records in services/usage.py. Imports only the models: lifecycle imports it.

Prometheus: `astraeus_gpu_seconds_total`, `astraeus_preemptions_total` and the histogram
`astraeus_queue_wait_seconds`, by workspace, counted once an attempt's record is committed (a rolled-back one counts
nothing).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from astraeus import usage as U
from astraeus.server.db import Cluster, Machine, Pool, Run, UsageRecord, Worker, Workspace

_PENDING = "astraeus_usage_committed"  # session.info key: records written in the session's transaction

GPU_SECONDS = Counter("astraeus_gpu_seconds_total", "GPU-seconds of ended worker attempts", ["workspace"])
PREEMPTIONS = Counter("astraeus_preemptions_total", "Worker attempts ended by a preemption (or a reservation opening)",
                      ["workspace"])
QUEUE_WAIT = Histogram("astraeus_queue_wait_seconds", "Time worker attempts waited in the queue before being placed",
                       ["workspace"], buckets=(1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400))


@event.listens_for(Session, "after_commit")
def _count_committed(session: Session) -> None:
    done = session.info.pop(_PENDING, None)
    if not done:
        return
    for ws, seconds, preempted, wait in done:
        GPU_SECONDS.labels(workspace=ws).inc(seconds)
        if preempted:
            PREEMPTIONS.labels(workspace=ws).inc()
        QUEUE_WAIT.labels(workspace=ws).observe(wait)


@event.listens_for(Session, "after_rollback")
def _forget_rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)


# ------------------------------------------------------------------------------------------- writing


def _pool(s: Session, run: Run, machine: Machine | None) -> str | None:
    """The pool the attempt ran in: the first pool the run asked for that holds its machine, else the first of the
    cluster's pools that does (None: in no pool)."""
    if machine is None:
        return None
    pools = s.scalars(select(Pool).where(Pool.cluster_id == machine.cluster_id).order_by(Pool.name))
    holding = [p.name for p in pools if U.in_pool(p.machines, p.labels, machine.name, machine.labels)]
    rr = run.spec.get("task_template", {}).get("requested_resources") or {}
    asked = (rr.get("node_selection") or {}).get("pools") or []
    return next((p for p in asked if p in holding), holding[0] if holding else None)


def gpu_model(machine: Machine | None, gpu_indices: list[int]) -> str | None:
    models = list(machine.gpu_models or []) if machine is not None else []
    if not models:
        return None
    i = gpu_indices[0] if gpu_indices and 0 <= gpu_indices[0] < len(models) else 0
    return models[i] or None


def _queued_since(s: Session, run: Run, worker_name: str) -> float:
    """When the worker's attempt now placed became due: the end of its previous attempt (or the end of that
    attempt's restart backoff), else the run's submission."""
    prev = s.execute(select(UsageRecord.ended_at, UsageRecord.restart_at)
                     .where(UsageRecord.run_id == run.id, UsageRecord.worker == worker_name)
                     .order_by(UsageRecord.id.desc()).limit(1)).first()
    if prev is None:
        return run.created_at
    return max(prev.ended_at, prev.restart_at or 0.0)


def attempt_facts(worker: Worker) -> dict:
    """What the record needs of the attempt before its end is handled (a restart releases the machine)."""
    return {"machine_id": worker.machine_id, "gpu_indices": list(worker.gpu_indices or []),
            "placed_at": worker.placed_at, "attempt": worker.attempt, "stop_kind": worker.stop_kind}


def attempt_ended(s: Session, run: Run, worker: Worker, facts: dict, preempted_by: str | None, exit_code: int | None,
                  evicted: bool, at: float) -> UsageRecord:
    """Write the usage record of the worker's attempt that just ended (`facts` from attempt_facts, taken before)."""
    machine = s.get(Machine, facts["machine_id"]) if facts["machine_id"] is not None else None
    ws = s.get(Workspace, run.workspace_id)
    cluster = s.get(Cluster, run.cluster_id)
    start = facts["placed_at"] if facts["placed_at"] is not None else at
    state = U.outcome(facts["stop_kind"], exit_code, evicted)
    rec = UsageRecord(
        org_id=ws.org_id, workspace_id=ws.id, workspace=ws.name, cluster=cluster.name if cluster else "",
        run_id=run.id, run_uid=run.uid, run=run.name, worker=worker.name, attempt=facts["attempt"],
        user=run.created_by, pool=_pool(s, run, machine),
        machine=machine.name if machine else None, gpu_model=gpu_model(machine, facts["gpu_indices"]),
        gpus=len(facts["gpu_indices"]) or worker.gpus, cpu_cores=worker.cpu_cores or 0.0,
        memory_bytes=worker.memory_bytes or 0, started_at=start, ended_at=at,
        wait_seconds=U.wait_seconds(start, _queued_since(s, run, worker.name)),
        restart_at=worker.restart_at if worker.state == "Pending" else None, state=state,
        reason=worker.reason or "", preempted_by=preempted_by if state == U.PREEMPTED else None)
    s.add(rec)
    s.info.setdefault(_PENDING, []).append(
        (ws.name, rec.gpus * max(0.0, at - start), state == U.PREEMPTED, rec.wait_seconds))
    return rec
