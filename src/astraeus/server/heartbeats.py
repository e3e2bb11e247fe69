"""Heartbeats without the state lock: most of a fleet's reports (POST /api/v1/agent/report, every
heartbeat_seconds from every agent) say only "still here, my workers are as you know them". Those write the
machine's last_heartbeat in one UPDATE of their own (lifecycle.machine_heartbeat_seen), without the state lock or
PostgreSQL's advisory lock, which every state change and the scheduling loop's apply take: with 400 agents their
reports held the lock for seconds. A report that would change anything (a worker's state, pid, environment or
starting message; a lost machine's return) goes the usual way, under the lock (agents.report).

SQLite: one writer at a time anyway, and a write between a locked transaction's read and its own write would fail
it; there the UPDATE takes the process's state lock (held for that UPDATE only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from astraeus import protocol as P
from astraeus.server import diskfull, health, lifecycle, services
from astraeus.server.db import Machine, Run, Worker, Workspace


class Recorded(Protocol):
    """What the control plane holds of one worker attempt placed on the machine."""

    attempt: int
    state: str
    pid: int | None
    environment: str | None
    reason: str
    progress_at: float | None
    checkpoint_at: float | None


def changes_nothing(recorded: Mapping[str, Recorded], reports: Iterable[P.WorkerReport]) -> bool:
    """Whether agents.report would change nothing of these workers (`recorded`: the machine's active workers by
    identity). A report of another attempt, or of a worker not active here, is skipped there too; a worker that
    exited or failed to start, one now running that was starting, a new pid or environment, a new starting message:
    each is a change."""
    for r in reports:
        w = recorded.get(r.worker)
        if w is None or w.attempt != r.attempt or w.state not in lifecycle.ACTIVE:
            continue
        if r.state not in ("Starting", "Running"):
            return False
        if (r.pid and r.pid != w.pid) or (r.environment and r.environment != w.environment):
            return False
        kept_progress, kept_checkpoint = getattr(w, "progress_at", None), getattr(w, "checkpoint_at", None)
        if (r.progress_at is not None and (kept_progress is None or r.progress_at > kept_progress)) or (
                r.checkpoint_at is not None and (kept_checkpoint is None or r.checkpoint_at > kept_checkpoint)):
            return False  # new progress or a new checkpoint (server/progress.py) is written under the lock
        if w.state == lifecycle.WorkerState.STARTING:
            if r.state == "Running":
                return False
            said = " ".join((r.message or "").split())[:lifecycle.STARTING_MESSAGE_MAX]
            if said and said != w.reason:
                return False
    return True


# built once (services._USER_CALLER says why)
_RECORDED = (select(Workspace.ns, Worker.name, Run.uid, Worker.attempt, Worker.state, Worker.pid, Worker.environment,
                    Worker.reason, Worker.progress_at, Worker.checkpoint_at)
             .join(Run, Worker.run_id == Run.id).join(Workspace, Run.workspace_id == Workspace.id)
             .where(Worker.machine_id == bindparam("machine"), Worker.state.in_(lifecycle.ACTIVE),
                    Worker.name.in_(bindparam("names", expanding=True))))


def recorded_here(session: Session, m: Machine, identities: set[str]) -> dict[str, Recorded]:
    """The active workers placed on `m` among `identities` (what a report names), by identity: plain rows."""
    names = {P.identity_name(i) for i in identities}
    if not names:
        return {}
    rows = session.execute(_RECORDED, {"machine": m.id, "names": list(names)})
    return {k: row for row in rows if (k := P.worker_identity(row.ns, row.name, row.uid)) in identities}


def heartbeat_only(session: Session, m: Machine, body: P.Report, at: float) -> bool:
    """Write the report as a bare heartbeat when that is all it is (see the module); True when done. False: the
    report changes something, or the machine is not Ready; nothing was written, and it goes the usual way."""
    if m.state != lifecycle.MachineState.READY or diskfull.disk_changed(m, body.disk) or health.report_changes(
            m, body.gpu_faults, body.health_check) or not changes_nothing(
            recorded_here(session, m, {r.worker for r in body.workers}), body.workers):
        session.expire(m)  # read before the state lock: the usual way reads it again under the lock
        return False
    with services.side_tx(session):
        done = lifecycle.machine_heartbeat_seen(session, m.id, at)
    if not done:
        session.expire(m)
    return done
