"""The one place where a run's, a worker's or a machine's state changes.

Every state, stop kind, reason, restart or preemption count, and crash-loop backoff is written here and
nowhere else (tests/lifecycle/test_transitions.py greps the code for writes elsewhere). Callers (the API
services, the scheduling loop, agent reports) decide *that* something happened; this module decides what
it means for the states, and writes the run's History and the workspace's Events.

The transitions are a table, `RULES`: each rule has a name, the states it may start from and the state it
leads to. A function moves a row only through `_move(row, rule)`, which refuses a move the table does not
allow by raising `IllegalTransition` (a bug in the caller, never a user's doing). Events that can arrive
late or twice (an agent's report of a worker that has already ended, a stop asked of a worker that is
already stopping) are checked against the table first with `allows` and ignored when it says no.

Worker: Pending → Starting → Running → Stopping → Succeeded | Failed | Cancelled, and back to Pending when it
restarts (after its crash-loop backoff) or is queued again after a preemption or with its gang.
Run (derived from its workers by `refresh_run`): Pending, Starting, Running, Stopping, then Completed,
Failed or Cancelled; an ended run changes only when it is deleted (→ Cancelled).
Machine: (new) → Ready ⇄ Lost.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import and_, bindparam, case, select, update
from sqlalchemy.orm import Session

from astraeus.server.db import Cluster, Event, History, Machine, Run, Worker
from astraeus.units import fmt_duration, human_bytes


class WorkerState(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    STOPPING = "Stopping"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class RunState(StrEnum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class MachineState(StrEnum):
    READY = "Ready"
    LOST = "Lost"


class StopKind(StrEnum):
    """Why the control plane asked a worker to stop; decides what its end means."""

    PREEMPT = "preempt"  # room for higher-priority work: queued again, no restart counted
    DELETE = "delete"  # its run was deleted
    TIMELIMIT = "timelimit"  # past its time limit: fails, not restarted
    TIMELIMIT_GANG = "timelimit_gang"  # a gang mate of a worker past its time limit
    GANG = "gang"  # a gang mate failed: the gang restarts (or fails) together
    RESERVATION = "reservation"  # its machine's reservation opened for other workspaces: queued again, no restart


W, R = WorkerState, RunState
# Plain strings (the stored values), for membership tests and SQL `IN (...)`.
ACTIVE: tuple[str, ...] = (W.STARTING.value, W.RUNNING.value, W.STOPPING.value)  # states that hold room
ENDED: tuple[str, ...] = (W.SUCCEEDED.value, W.FAILED.value, W.CANCELLED.value)
RUN_ENDED: tuple[str, ...] = (R.COMPLETED.value, R.FAILED.value, R.CANCELLED.value)
RUN_LIVE: tuple[str, ...] = (R.PENDING.value, R.STARTING.value, R.RUNNING.value, R.STOPPING.value)
NEW = None  # the "state" of a row not yet created

# Crash-loop backoff, as Kubernetes does it: a failed worker that restarts waits base × 2^streak seconds (10 s,
# 20 s, 40 s, … at most 5 minutes); the streak starts again once an attempt has run for 10 minutes.
RESTART_BACKOFF_CAP = 300.0
RESTART_BACKOFF_RESET = 600.0
BACKOFF_ENV = "ASTRAEUS_RESTART_BACKOFF_BASE"


def backoff_base() -> float:
    """The first restart's delay in seconds: ASTRAEUS_RESTART_BACKOFF_BASE, default 10 (tests make it short)."""
    raw = os.environ.get(BACKOFF_ENV, "10")
    try:
        base = float(raw)
    except ValueError:
        raise ValueError(f"{BACKOFF_ENV}={raw!r}: give a number of seconds, e.g. 10") from None
    if not 0 <= base <= RESTART_BACKOFF_CAP:
        raise ValueError(f"{BACKOFF_ENV}={raw!r}: give seconds between 0 and {RESTART_BACKOFF_CAP:g}")
    return base


def backoff_delay(streak: int, base: float) -> float:
    """Seconds before the next restart of a worker that has failed `streak` times in a row before this one."""
    return min(base * 2 ** min(streak, 32), RESTART_BACKOFF_CAP)


class IllegalTransition(RuntimeError):
    """A move the transition table does not allow: a bug in the caller."""


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str  # "worker" | "run" | "machine"
    before: frozenset
    after: str
    doc: str


def _rule(name: str, kind: str, before, after: str, doc: str) -> Rule:
    return Rule(name, kind, frozenset(before), after, doc)


_ACTIVE = (W.STARTING, W.RUNNING, W.STOPPING)
RULES: dict[str, Rule] = {r.name: r for r in (
    # ------------------------------------------------------------------------------------------- workers
    _rule("create_worker", "worker", {NEW}, W.PENDING, "submitted: waits to be placed"),
    _rule("place", "worker", {W.PENDING}, W.STARTING, "the scheduler placed it on a machine"),
    _rule("start", "worker", {W.STARTING}, W.RUNNING, "its machine reports the process running"),
    _rule("stop", "worker", {W.STARTING, W.RUNNING}, W.STOPPING,
          "preempted, past its time limit, deleted, or its gang stops: SIGTERM, the stop grace, SIGKILL"),
    _rule("cancel_waiting", "worker", {W.PENDING}, W.CANCELLED, "its run was deleted before it was placed"),
    _rule("dependency_never_met", "worker", {W.PENDING}, W.FAILED,
          "its run's dependency can no longer be met (afterok on a run that failed, …): it fails unplaced"),
    _rule("succeed", "worker", {W.STARTING, W.RUNNING}, W.SUCCEEDED, "it exited with code 0, unasked"),
    _rule("preempted", "worker", _ACTIVE, W.CANCELLED,
          "it ended after a preemption: queued again once no worker of its gang still stops"),
    _rule("deleted", "worker", _ACTIVE, W.CANCELLED, "it ended after its run was deleted"),
    _rule("time_limit", "worker", _ACTIVE, W.FAILED, "it ended at its time limit: failed, not restarted"),
    _rule("time_limit_gang", "worker", _ACTIVE, W.CANCELLED, "it ended with its gang at a mate's time limit"),
    _rule("gang_stopped", "worker", _ACTIVE, W.CANCELLED, "it ended because a mate of its gang failed"),
    _rule("restart", "worker", _ACTIVE, W.PENDING,
          "it failed (or was lost) with restarts left: waits out its backoff, then is placed again"),
    _rule("restart_gang", "worker", _ACTIVE, W.CANCELLED,
          "it failed with restarts left in a gang: the gang is queued again once all its workers ended"),
    _rule("fail", "worker", _ACTIVE, W.FAILED, "it failed with no restart left, or its policy is Never"),
    _rule("requeue", "worker", {W.PENDING, W.CANCELLED, W.SUCCEEDED}, W.PENDING,
          "queued again: after a preemption, or with its gang's restart"),
    # ---------------------------------------------------------------------------------------------- runs
    _rule("create_run", "run", {NEW}, R.PENDING, "submitted"),
    _rule("run_waits", "run", RUN_LIVE, R.PENDING, "no worker holds room: queued, backing off or preempted"),
    _rule("run_starts", "run", RUN_LIVE, R.STARTING, "workers placed, none running yet"),
    _rule("run_runs", "run", RUN_LIVE, R.RUNNING, "a worker runs"),
    _rule("run_stops", "run", RUN_LIVE, R.STOPPING, "workers stop: deleted, preempted, time limit, gang failure"),
    _rule("run_completes", "run", RUN_LIVE, R.COMPLETED, "every worker succeeded"),
    _rule("run_fails", "run", RUN_LIVE, R.FAILED, "a worker failed for good"),
    _rule("run_cancelled", "run", (*RUN_LIVE, *RUN_ENDED), R.CANCELLED, "deleted, and no worker runs any more"),
    # ------------------------------------------------------------------------------------------ machines
    _rule("machine_joins", "machine", {NEW}, MachineState.READY, "an agent registered a new machine"),
    _rule("machine_heartbeats", "machine", {MachineState.READY}, MachineState.READY, "its agent reports"),
    _rule("machine_returns", "machine", {MachineState.LOST}, MachineState.READY,
          "a lost machine's agent registers or reports again"),
    _rule("machine_lost", "machine", {MachineState.READY}, MachineState.LOST,
          "no heartbeat for the cluster's lost_after_seconds: its workers are handled by their restart policy"),
)}
# refresh_run derives a run's next state; this is the rule that leads there.
RUN_RULE_FOR = {r.after: r for r in RULES.values() if r.kind == "run" and r.name != "create_run"}


def allows(name: str, state: str | None) -> bool:
    return state in RULES[name].before


def _move(row: Worker | Run | Machine, name: str, reason: str | None = None) -> None:
    rule = RULES[name]
    kind = {Worker: "worker", Run: "run", Machine: "machine"}[type(row)]
    if kind != rule.kind:
        raise IllegalTransition(f"rule {name} moves a {rule.kind}, not a {kind}")
    if row.state not in rule.before:
        allowed = ", ".join(sorted(str(s) for s in rule.before))
        raise IllegalTransition(f"{name}: {kind} {row.name} is {row.state}; the rule starts from {allowed}")
    row.state = rule.after.value
    if reason is not None:
        row.reason = reason


# ------------------------------------------------------------------------------------------- helpers


def history(session: Session, run: Run, state: str, reason: str, at: float) -> None:
    session.add(History(run_id=run.id, time=at, state=str(state), reason=reason))


def submitted_message(name: str, priority: int) -> str:
    """The RunSubmitted event's words (services.submit_run, and the group-commit writer's batches)."""
    return f"{name} submitted at priority {priority}"


def event(session: Session, workspace_id: int | None, kind: str, obj: str, message: str, at: float) -> None:
    session.add(Event(workspace_id=workspace_id, time=at, kind=kind, object=obj, message=message))


def _spec(run: Run) -> dict:
    return run.spec["task_template"]


_COUNTDOWN = re.compile(r"^Restarting in \d+s ")


def shown_reason(reason: str, restart_at: float | None, now: float) -> str:
    """A stored "Restarting in 20s (…)" says how long was left when the worker failed; shown later, it says how
    long is left now ("Restarting (…)" once the backoff is over and the worker waits to be placed)."""
    if restart_at is None or not _COUNTDOWN.match(reason or ""):
        return reason
    left = math.ceil(restart_at - now)
    return _COUNTDOWN.sub(f"Restarting in {left}s " if left > 0 else "Restarting ", reason, count=1)


def worker_reason(w: Worker, now: float) -> str:
    """The worker's reason as the API and the console show it at `now`."""
    return shown_reason(w.reason, w.restart_at if w.state == W.PENDING else None, now)


def run_reason(run: Run, now: float) -> str:
    """The run's reason as the API and the console show it at `now` (see shown_reason)."""
    if run.state != R.PENDING:
        return run.reason
    return shown_reason(run.reason, restart_due(run.workers), now)


def restart_due(workers: list[Worker]) -> float | None:
    """When the waiting workers given may be placed again: the latest backoff among them (a gang waits for all
    of its workers), or None when none backs off."""
    return max((w.restart_at for w in workers if w.state == W.PENDING and w.restart_at), default=None)


# --------------------------------------------------------------------------------------- creation


def new_run(**fields) -> Run:
    """A new run row, Pending (add it to the session; its workers come from new_worker)."""
    run = Run(state=None, **fields)
    _move(run, "create_run", "Waiting for the scheduler")
    return run


def new_worker(**fields) -> Worker:
    w = Worker(state=None, **fields)
    _move(w, "create_worker", "Waiting to be placed")
    w.restarts = w.preemptions = w.crash_streak = 0
    return w


# ------------------------------------------------------------------------------------------ run state


def _derive(run: Run, at: float) -> tuple[str, str]:
    ws = run.workers
    n = len(ws)
    active = [w for w in ws if w.state in ACTIVE]
    if run.deleting:
        if active:
            return R.STOPPING, f"Deleting: stopping {len(active)} worker(s)"
        return R.CANCELLED, "Deleted"
    if ws and all(w.state == W.SUCCEEDED for w in ws):
        return R.COMPLETED, f"{n} of {n} workers succeeded"
    if any(w.state == W.FAILED for w in ws) and (run.spec.get("start") != "Independent" or not active
                                                  and not any(w.state == W.PENDING for w in ws)):
        failed = next(w for w in ws if w.state == W.FAILED)
        return (R.STOPPING, failed.reason) if active else (R.FAILED, failed.reason)
    if any(w.state == W.STOPPING for w in ws):
        return R.STOPPING, next(w for w in ws if w.state == W.STOPPING).reason
    running = sum(1 for w in ws if w.state == W.RUNNING)
    if ws and running and all(w.state == W.RUNNING for w in ws if w.state not in ENDED):
        return R.RUNNING, f"{running} of {n} workers running"
    if any(w.state in (W.STARTING, W.RUNNING) for w in ws):
        if running:
            return R.RUNNING, f"{running} of {n} workers running"
        said = next((w.reason for w in ws if w.state == W.STARTING and w.reason and w.reason != "Running"
                     and not w.reason.startswith("Starting on ")), None)
        if said:  # what a machine says it is doing ("Pulling image …")
            return R.STARTING, f"Starting {len(active)} of {n} workers: {said}"
        return R.STARTING, f"Starting {len(active)} of {n} workers"
    if run.preempted_by:
        return R.PENDING, f"Preempted by higher-priority work ({run.preempted_by}); waiting to run again"
    due = restart_due(ws)
    if due is not None and due > at:
        backing_off = next(w for w in ws if w.state == W.PENDING and w.restart_at == due)
        return R.PENDING, shown_reason(backing_off.reason, due, at)  # the time left now, in History too
    return R.PENDING, run.queue_reason or "Waiting for the scheduler"


def refresh_run(session: Session, run: Run, at: float) -> None:
    """Derive the run's state and reason from its workers; record a History entry when either changes."""
    state, reason = _derive(run, at)
    if state in (R.RUNNING,) and run.started_at is None:
        run.started_at = at
    if state in RUN_ENDED and run.finished_at is None:
        run.finished_at = at
    if state != run.state or reason != run.reason:
        # History keeps what happened to the run: every change of state, and each new reason while it stops
        # or waits after a preemption. The queue's own reasons ("Queued behind …") change with every cycle
        # and stay out of it: status.reason and the per-machine lines show them.
        if state != run.state or state == R.STOPPING or (state == R.PENDING and run.preempted_by):
            history(session, run, state, reason, at)
        if state != run.state and state in (R.COMPLETED, R.FAILED):
            event(session, run.workspace_id, f"Run{state}", run.name, reason, at)
        if state == run.state:
            run.reason = reason
        else:
            _move(run, RUN_RULE_FOR[state].name, reason)
    if run.deleting and state == R.CANCELLED:
        run.live_key = run.uid  # frees the name for a new run


def set_queue_reason(session: Session, run: Run, reason: str, at: float) -> None:
    """The scheduler's word on why a waiting run waits ("Queued behind …")."""
    if run.queue_reason != reason:
        run.queue_reason = reason
        refresh_run(session, run, at)


def set_why_not(worker: Worker, lines: list) -> None:
    """The scheduler's per-machine reasons why a waiting worker is not placed."""
    if worker.state == W.PENDING:
        worker.why_not = lines


SHARED_IDS = 500  # rows named in one UPDATE of a value many share (set_queue_reasons)


def _write_shared(session: Session, update_rows, id_col, key: str, values: dict[int, object], **params) -> None:
    """Write `values` (row id -> value) with `update_rows` (an UPDATE setting bindparam(key), its WHERE still to
    add): with `id_col` IN the rows, once for each value that four rows or more share (SHARED_IDS rows at a time);
    by primary key, the other rows in one batch (executemany).
    Waiting runs share their queue reason ("Queued behind <the head>, which …", changed for all of them when the
    head does) and workers of one shape their why-not lines (10,000 of each: 480-520 -> 270-310 ms on SQLite;
    1.1-1.6 -> 1.1-1.3 s on PostgreSQL, where each row's new version is the cost: `bench_snapshot.py
    --queue-reasons`). On PostgreSQL, revision 0012's fillfactor 70 keeps room on the page for the new versions
    (HOT updates, no index entries): 641-661 -> 381-395 ms a write, on tables new to both."""
    by_value: dict[str, tuple[object, list[int]]] = {}
    for rid, v in sorted(values.items()):
        by_value.setdefault(json.dumps(v, sort_keys=True), (v, []))[1].append(rid)
    alone = []
    for v, rids in by_value.values():
        if len(rids) < 4:
            alone.extend({"row_id": rid, key: v, **params} for rid in rids)
            continue
        for i in range(0, len(rids), SHARED_IDS):
            session.execute(update_rows.where(id_col.in_(bindparam("ids", expanding=True))),
                            {"ids": rids[i:i + SHARED_IDS], key: v, **params})
    if alone:
        session.execute(update_rows.where(id_col == bindparam("row_id")), alone)


def set_queue_reasons(session: Session, reasons: dict[int, str], why_not: dict[int, list], at: float) -> None:
    """The queue's word on waiting runs that the plan does not otherwise act on, written without reading them: one
    UPDATE for each reason (why-not lines) that many rows share, and the rest one batch by primary key
    (_write_shared). `reasons`: run id -> "Queued behind …"; `why_not`: worker id -> its per-machine lines. What
    set_queue_reason and set_why_not would do, said in SQL on the rows as they are now (the snapshot may be old): a
    run being deleted is left alone; its status reason follows the queue's only while it is plainly waiting
    (Pending, not preempted, not backing off after a failure: refresh_run's rule; no History line either way); only
    a worker still waiting gets its lines."""
    runs, workers = Run.__table__, Worker.__table__
    if reasons:
        backing_off = select(workers.c.id).where(
            workers.c.run_id == runs.c.id, workers.c.state == W.PENDING.value,
            workers.c.restart_at > bindparam("at")).exists()
        plainly_waiting = and_(runs.c.state == R.PENDING.value, runs.c.preempted_by.is_(None),
                               ~backing_off)
        _write_shared(session, update(runs).where(runs.c.deleting.is_(False)).values(
            queue_reason=bindparam("q"), reason=case((plainly_waiting, bindparam("q")), else_=runs.c.reason)),
            runs.c.id, "q", reasons, at=at)
    if why_not:
        _write_shared(session, update(workers).where(workers.c.state == W.PENDING.value)
                      .values(why_not=bindparam("lines", type_=workers.c.why_not.type)),
                      workers.c.id, "lines", why_not)


def note_quota(session: Session, run: Run, message: str, at: float) -> None:
    """The run waits at its workspace's quota: said once in its History and the workspace's Events."""
    if run.quota_noted:
        return
    run.quota_noted = True
    history(session, run, run.state, message, at)
    event(session, run.workspace_id, "QuotaReached", run.name, message, at)


# --------------------------------------------------------------------------------------- worker moves


def place(session: Session, run: Run, worker: Worker, machine_id: int, gpu_indices: list[int], cpu: float,
          mem: int, at: float, machine_name: str) -> None:
    _move(worker, "place", f"Starting on {machine_name}")
    worker.machine_id = machine_id
    worker.gpu_indices = list(gpu_indices)
    worker.cpu_cores = cpu
    worker.memory_bytes = mem
    worker.attempt += 1
    worker.desired = "Running"
    worker.stop_kind = worker.stop_reason = worker.preempted_for = None
    worker.exit_code = None
    worker.pid = None
    worker.placed_at = at
    worker.started_at = None
    worker.finished_at = None
    worker.stop_requested_at = None
    worker.restart_at = None
    worker.why_not = []
    limit = _spec(run).get("time_limit_seconds")
    worker.deadline = at + limit if limit else None
    run.preempted_by = None
    run.quota_noted = False


def running(session: Session, run: Run, worker: Worker, pid: int | None, environment: str | None, at: float) -> None:
    """The machine reports the worker's process running (or, for one already running, its pid again)."""
    if allows("start", worker.state):
        _move(worker, "start", "Running")
        worker.started_at = at
        limit = _spec(run).get("time_limit_seconds")
        worker.deadline = at + limit if limit else None  # the limit counts from the start
    process_seen(worker, pid, environment)
    refresh_run(session, run, at)


STARTING_MESSAGE_MAX = 500  # characters of a machine's word on a starting worker that its reason keeps


def starting(session: Session, run: Run, worker: Worker, message: str | None, at: float) -> None:
    """The machine reports the worker still starting, saying what it does ("Pulling image 127.0.0.1:5000/x:1"):
    that is the worker's reason (and shows in its run's) until it runs, fails to start or is stopped."""
    text = " ".join((message or "").split())[:STARTING_MESSAGE_MAX]
    if worker.state != W.STARTING or not text or worker.reason == text:
        return
    worker.reason = text
    refresh_run(session, run, at)


def process_seen(worker: Worker, pid: int | None, environment: str | None) -> None:
    """The machine names the worker's process (pid) and where it runs; no state changes."""
    if worker.state not in ACTIVE:
        return
    if pid:
        worker.pid = pid
    if environment:
        worker.environment = environment


def request_stop(session: Session, run: Run, worker: Worker, kind: StopKind | str, reason: str, at: float,
                 preempted_for: str | None = None) -> None:
    """Tell the worker's machine to stop it: SIGTERM, the machine's stop grace, then SIGKILL.

    A waiting worker has nothing to stop: a delete cancels it, other stops leave it waiting. A worker already
    stopping or ended is left as it is (the first stop decides what its end means)."""
    kind = StopKind(kind)
    if worker.state == W.PENDING:
        if kind == StopKind.DELETE:
            _move(worker, "cancel_waiting", "Deleted")
            worker.restart_at = None
        return
    if not allows("stop", worker.state) or worker.desired == "Stopped":
        return
    _move(worker, "stop", reason)
    worker.desired = "Stopped"
    worker.stop_kind = kind.value
    worker.stop_reason = reason
    worker.preempted_for = preempted_for
    worker.stop_requested_at = at


def preempt(session: Session, run: Run, workers: list[Worker], head: str, reason: str, at: float) -> None:
    """Stop these workers of `run` to make room for `head`: one preemption for the run, one for each worker."""
    stopped = False
    for w in workers:
        if allows("stop", w.state) and w.desired != "Stopped":
            request_stop(session, run, w, StopKind.PREEMPT, reason, at, preempted_for=head)
            w.preemptions += 1
            stopped = True
    if stopped:
        run.preemptions += 1
        event(session, run.workspace_id, "Preempted", run.name, reason, at)


def stop_for_reservation(session: Session, run: Run, workers: list[Worker], reservation: str, reason: str,
                         at: float) -> None:
    """Stop these workers of `run`: a reservation for other workspaces opened on their machines. Like a
    preemption (counted as one, no restart spent; queued again once they ended), but the run is not said to wait
    for higher-priority work: its reason and history say `reason` ("Stopped for reservation <name>")."""
    stopped = False
    for w in workers:
        if allows("stop", w.state) and w.desired != "Stopped":
            request_stop(session, run, w, StopKind.RESERVATION, reason, at, preempted_for=reservation[:63])
            w.preemptions += 1
            stopped = True
    if stopped:
        run.preemptions += 1
        event(session, run.workspace_id, "Preempted", run.name, reason, at)


def _release(worker: Worker) -> None:
    """The worker no longer holds room on a machine."""
    worker.desired = None
    worker.machine_id = None
    worker.gpu_indices = []
    worker.pid = None


def _requeue(worker: Worker, reason: str) -> None:
    _move(worker, "requeue", reason)
    _release(worker)


def _gang(run: Run) -> bool:
    return run.spec.get("start", "Gang") != "Independent" and len(run.workers) > 1


def ended(session: Session, run: Run, worker: Worker, exit_code: int | None, signal: int | None,
          message: str | None, at: float, oom_limit_bytes: int | None = None, evicted: str | None = None) -> None:
    """The worker's process is gone (agent report), it failed to start, or its machine is lost (message given,
    no code). What that means follows the stop asked of it, if any, else its exit and its restart policy. A
    report for a worker not holding room (already ended, or a stale attempt) is ignored. `oom_limit_bytes`: the
    kernel killed it at that memory limit (the failure then reads `Out of memory (limit 256 MiB)`)."""
    if worker.state not in ACTIVE:
        return
    kind = StopKind(worker.stop_kind) if worker.stop_kind else None
    tt = _spec(run)
    worker.exit_code = exit_code if exit_code is not None else (128 + signal if signal else None)
    worker.finished_at = at
    worker.desired = None
    how = (f"exit code {exit_code}" if exit_code is not None else f"signal {signal}" if signal else message
           or "lost")
    if oom_limit_bytes:
        how = f"Out of memory (limit {human_bytes(oom_limit_bytes)})"
    if evicted:  # its agent stopped it over its ephemeral storage limit (agent/disk.py)
        how = evicted
    gang = _gang(run)
    if kind == StopKind.PREEMPT:
        # Another workspace's run is never named: the stop reason already says so when it is one.
        hidden = "a job in another namespace"
        by = hidden if hidden in (worker.stop_reason or "") else (worker.preempted_for or "higher-priority work")
        _move(worker, "preempted", f"Preempted by {by}")
        # A gang is queued again only once none of its workers is still stopping.
        mates = [w for w in run.workers if w.stop_kind == StopKind.PREEMPT] if gang else [worker]
        if all(w.state not in ACTIVE for w in mates):
            for w in mates:
                _requeue(w, f"Preempted by {by}; queued again")
                w.restart_at = None  # a preemption never waits on backoff
            run.preempted_by = by
            history(session, run, R.PENDING, f"Preempted by {by}; queued again", at)
    elif kind == StopKind.RESERVATION:
        said = worker.stop_reason or "Stopped for a reservation"
        _move(worker, "preempted", said)
        mates = [w for w in run.workers if w.stop_kind == StopKind.RESERVATION] if gang else [worker]
        if all(w.state not in ACTIVE for w in mates):
            for w in mates:
                _requeue(w, f"{said}; queued again")
                w.restart_at = None
            run.preempted_by = None  # it waits as any run does, not for higher-priority work
            history(session, run, R.PENDING, f"{said}; queued again", at)
    elif kind == StopKind.DELETE:
        _move(worker, "deleted", "Deleted")
    elif kind == StopKind.TIMELIMIT:
        limit = fmt_duration(tt.get("time_limit_seconds") or 0)
        _move(worker, "time_limit", f"Stopped at its time limit ({limit}); not restarted")
        if gang:
            for w in run.workers:
                if w is not worker:
                    request_stop(session, run, w, StopKind.TIMELIMIT_GANG, worker.reason, at)
    elif kind == StopKind.TIMELIMIT_GANG:
        _move(worker, "time_limit_gang", "Stopped with its gang at the time limit")
    elif kind == StopKind.GANG:
        failed = any(w.state == W.FAILED for w in run.workers)  # for good: the gang is not restarted
        _move(worker, "gang_stopped", "Stopped: a worker of its gang failed" if failed else "Stopped to restart its gang")
        _requeue_gang(run)
    elif exit_code == 0 and kind is None and not evicted:
        _move(worker, "succeed", "Exited with code 0")
    else:
        _failed(session, run, worker, how, at, gang)
    refresh_run(session, run, at)


def _requeue_gang(run: Run) -> None:
    """Once no worker of a restarting gang holds room, queue them all again (none if one failed for good)."""
    if any(w.state in ACTIVE or w.state == W.FAILED for w in run.workers):
        return
    for w in run.workers:
        # The worker that failed keeps its "Restarting in …" (its restart_at is set); the others follow it.
        _requeue(w, w.reason if w.state == W.PENDING or w.restart_at else "Restarting with its gang")


def _failed(session: Session, run: Run, worker: Worker, how: str, at: float, gang: bool) -> None:
    tt = _spec(run)
    budget = tt.get("max_restarts", 10)
    if tt.get("restart_policy", "OnFailure") == "OnFailure" and worker.restarts < budget:
        ran = at - worker.started_at if worker.started_at else 0.0
        if ran >= RESTART_BACKOFF_RESET:
            worker.crash_streak = 0
        delay = backoff_delay(worker.crash_streak, backoff_base())
        worker.crash_streak += 1
        worker.restart_at = at + delay
        worker.restarts += 1
        secs = math.ceil(delay)
        reason = f"Restarting in {secs}s ({how}; restart {worker.restarts} of {budget})"
        line = f"Failed ({how}); restart {worker.restarts} of {budget} in {secs}s"
        history(session, run, R.PENDING, line, at)
        event(session, run.workspace_id, "WorkerRestarted", worker.name, line, at)
        run.queue_reason = ""  # the scheduler's word from before the failure no longer holds
        if gang:
            _move(worker, "restart_gang", reason)
            for w in run.workers:
                if w is not worker:
                    request_stop(session, run, w, StopKind.GANG, "Stopping: a worker of the gang failed", at)
            _requeue_gang(run)
        else:
            _move(worker, "restart", reason)
            _release(worker)
    else:
        spent = "; restart budget spent" if tt.get("restart_policy") != "Never" else ""
        _move(worker, "fail", f"Failed ({how}){spent}")
        if gang:
            for w in run.workers:
                if w is not worker:
                    request_stop(session, run, w, StopKind.GANG, "Stopping: a worker of the gang failed", at)


def start_failed(session: Session, run: Run, worker: Worker, message: str, at: float) -> None:
    """The machine could not start the worker's process: a failure, handled by its restart policy (unless it
    was being stopped anyway, when the stop decides)."""
    ended(session, run, worker, None, None, f"failed to start: {message or 'unknown'}", at)


def lost(session: Session, run: Run, worker: Worker, machine: str, at: float) -> None:
    """The worker's machine stopped heartbeating: the worker is lost. One that was being stopped ends as that
    stop says (a preempted one is queued again, a deleted one cancelled, one at its time limit fails); any
    other is a failure handled by its restart policy."""
    ended(session, run, worker, None, None, f"lost with machine {machine}", at)


def dependency_never_met(session: Session, run: Run, reason: str, at: float) -> None:
    """A waiting run whose dependency can no longer be met ("prep failed: afterok can no longer be met") fails:
    its waiting workers fail with that reason, and so does the run (History, a RunFailed event)."""
    for w in run.workers:
        if w.state == W.PENDING:
            _move(w, "dependency_never_met", reason)
            w.restart_at = None
            w.why_not = []
    refresh_run(session, run, at)


def delete(session: Session, run: Run, at: float) -> None:
    run.deleting = True
    for w in run.workers:
        request_stop(session, run, w, StopKind.DELETE, "Stopping: the run was deleted", at)
    history(session, run, R.STOPPING, "Deleted by request", at)
    refresh_run(session, run, at)


# --------------------------------------------------------------------------------------------- machines


def machine_registered(session: Session, machine: Machine | None, cluster: Cluster, name: str,
                       at: float) -> tuple[Machine, bool]:
    """An agent registers `name` (its row, or None for a new machine): it is Ready. Returns the row, and
    whether it joined or came back (what the scheduler must see)."""
    if machine is None:
        machine = Machine(cluster_id=cluster.id, name=name, state=None)
        session.add(machine)
        _move(machine, "machine_joins")
        event(session, None, "MachineJoined", name, f"machine {name} joined cluster {cluster.name}", at)
        changed = True
    elif allows("machine_returns", machine.state):
        _move(machine, "machine_returns")
        event(session, None, "MachineReturned", name, f"machine {name} is back in cluster {cluster.name}", at)
        changed = True
    else:
        _move(machine, "machine_heartbeats")
        changed = False
    machine.last_heartbeat = at
    return machine, changed


def machine_heartbeat(session: Session, machine: Machine, at: float) -> bool:
    """The machine's agent reports. Returns True when a lost machine came back."""
    returned = allows("machine_returns", machine.state)
    if returned:
        _move(machine, "machine_returns")
        event(session, None, "MachineReturned", machine.name, f"machine {machine.name} heartbeats again", at)
    else:
        _move(machine, "machine_heartbeats")
    machine.last_heartbeat = at
    return returned


_HEARTBEAT_SEEN = (update(Machine.__table__)
                   .where(Machine.__table__.c.id == bindparam("machine_id"),
                          Machine.__table__.c.state == MachineState.READY.value)
                   .values(last_heartbeat=bindparam("at")))  # built once: each bare heartbeat runs it


def machine_heartbeat_seen(session: Session, machine_id: int, at: float) -> bool:
    """A heartbeat that changes nothing but the time of the machine's last one (server/heartbeats.py), written
    without the state lock: one UPDATE, only while the machine is Ready. Returns False when it is not (it was
    lost: its return is a state change, made by machine_heartbeat under the lock). The loop's lost-machine check
    reads a machine it would lose again, locking its row (loop.detect_lost_machines), so a heartbeat is either
    seen there or waits for it and then finds the machine Lost."""
    done = session.execute(_HEARTBEAT_SEEN, {"machine_id": machine_id, "at": at})
    return done.rowcount == 1


def machine_lost(session: Session, machine: Machine, workers: list[Worker], at: float) -> None:
    """No heartbeat for too long: the machine is Lost, and each of its workers (those holding room on it) is
    handled as lost (see `lost`)."""
    _move(machine, "machine_lost")
    wsids = {w.run.workspace_id for w in workers} or {None}
    for wsid in sorted(wsids, key=lambda x: (x is None, x)):
        event(session, wsid, "MachineLost", machine.name,
              f"machine {machine.name} lost: no heartbeat for {int(at - machine.last_heartbeat)} s; "
              f"its workers are handled by their restart policy", at)
    for w in workers:
        lost(session, w.run, w, machine.name, at)
