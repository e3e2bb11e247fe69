"""The one place where a run's, a worker's or a machine's state changes (why: docs/design-one-transition-table.md).

Every state, stop kind, reason, restart or preemption count, and crash-loop backoff is written here and
nowhere else (tests/lifecycle/test_transitions.py greps the code for writes elsewhere). Callers (the API
services, the scheduling loop, agent reports) decide *that* something happened; this module decides what
it means for the states, and writes the run's History and the workspace's Events.

The transitions are a table, `RULES`: each rule has a name (a `Transition`), the states it may start from, the
state it leads to, the row's reason after it and what it writes down (its `Record`: History line, Event). A
function moves a row only through `_move(row, transition)`, which refuses a move the table does not allow by
raising `IllegalTransition` (a bug in the caller, never a user's doing). What a worker's end means follows the
stop asked of it (`ON_END`, by `StopKind`). Callers never word History or Events themselves. Events that can arrive
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
import re
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import and_, bindparam, case, select, update
from sqlalchemy.orm import Session

from astraeus.server import accounting
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
    IDLE = "idle"  # an interactive run with no session attached for its idle timeout: it ends, Cancelled
    MACHINE = "machine"  # its machine was drained or its GPU failed (server/health.py): queued again, no restart
    STALL = "stall"  # no progress for its run's stall_seconds (server/progress.py): restarted or failed as asked


# The words of the stops the control plane asks on its own (a preemption's and a reservation's are the scheduler's).
STOP_ASKED = {
    StopKind.DELETE: "Stopping: the run was deleted",
    StopKind.TIMELIMIT: "Stopping: time limit of {limit} reached",
    StopKind.GANG: "Stopping: a worker of the gang failed",
    StopKind.IDLE: "No session attached for {idle}: ended (idle timeout)",
}
# The stops after which a run ends Cancelled rather than waiting again: its idle timeout, a preemption with
# spec.requeue false (Slurm's --no-requeue)
ENDS_RUN = (StopKind.IDLE.value, StopKind.PREEMPT.value)


class Desired(StrEnum):
    """What the control plane wants of a placed worker: its machine's assignment says so."""

    RUNNING = "Running"
    STOPPED = "Stopped"


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
    """The first restart's delay in seconds: ASTRAEUS_RESTART_BACKOFF_BASE, default 10 (tests make it short), as
    the server's settings read it once (astraeus.settings.server_settings)."""
    from astraeus.settings import SettingsError, server_settings

    try:
        return server_settings().restart_backoff_base
    except SettingsError as e:
        if BACKOFF_ENV not in e.values:
            raise
        raise ValueError(f"{BACKOFF_ENV}={e.values[BACKOFF_ENV]!r}: give seconds between 0 and "
                         f"{RESTART_BACKOFF_CAP:g}, e.g. 10") from None


def backoff_delay(streak: int, base: float) -> float:
    """Seconds before the next restart of a worker that has failed `streak` times in a row before this one."""
    return min(base * 2 ** min(streak, 32), RESTART_BACKOFF_CAP)


class IllegalTransition(RuntimeError):
    """A move the transition table does not allow: a bug in the caller."""


class Transition(StrEnum):
    """The transitions of `RULES`, by name (the names the table and its tests use; no row stores them)."""

    # workers
    CREATE_WORKER = "create_worker"
    PLACE = "place"
    START = "start"
    STOP = "stop"
    CANCEL_WAITING = "cancel_waiting"
    DEPENDENCY_NEVER_MET = "dependency_never_met"
    SUCCEED = "succeed"
    PREEMPTED = "preempted"
    DELETED = "deleted"
    TIME_LIMIT = "time_limit"
    TIME_LIMIT_GANG = "time_limit_gang"
    GANG_STOPPED = "gang_stopped"
    RESTART = "restart"
    RESTART_GANG = "restart_gang"
    FAIL = "fail"
    REQUEUE = "requeue"
    # runs
    CREATE_RUN = "create_run"
    RUN_WAITS = "run_waits"
    RUN_STARTS = "run_starts"
    RUN_RUNS = "run_runs"
    RUN_STOPS = "run_stops"
    RUN_COMPLETES = "run_completes"
    RUN_FAILS = "run_fails"
    RUN_CANCELLED = "run_cancelled"
    # machines
    MACHINE_JOINS = "machine_joins"
    MACHINE_HEARTBEATS = "machine_heartbeats"
    MACHINE_RETURNS = "machine_returns"
    MACHINE_LOST = "machine_lost"


T = Transition


@dataclass(frozen=True)
class Record:
    """What the product writes down when something happens to a run or a machine: a line of the run's History
    and/or an Event of its workspace. Each text is a template filled with the fields of the moment
    (`str.format`); None: nothing of that kind is written."""

    history: str | None = None  # the History line
    event: str | None = None  # the Event's kind
    message: str | None = None  # the Event's message; None: the History line
    state: str | None = None  # the History line's state; None: the run's state as it is

    def line(self, **fields) -> str | None:
        return None if self.history is None else self.history.format(**fields)

    def said(self, **fields) -> str:
        return (self.message or self.history or "").format(**fields)


# The records written outside any one transition (a transition's own is its rule's `says`).
SUBMITTED = Record("Submitted", "RunSubmitted", "{name} submitted at priority {priority}", state=R.PENDING.value)
DELETED_BY_REQUEST = Record("Deleted by request", state=R.STOPPING.value)
RUN_DELETED = Record(event="RunDeleted", message="{name} deleted")  # once its logs are gone too
# A person's or service account's delete names who (issue 45): the run's history line and its event.
DELETED_BY = Record("Deleted by {by}", state=R.STOPPING.value)
RUN_DELETED_BY = Record(event="RunDeleted", message="Deleted by {by}")
QUOTA_REACHED = Record("{message}", "QuotaReached")
PREEMPTED = Record(event="Preempted", message="{reason}")  # a run's workers stopped for other work (or a reservation)
QUEUED_AGAIN = Record("{said}; queued again", state=R.PENDING.value)  # once a preempted run's workers all ended
RUN_CHANGED = Record("{reason}")  # refresh_run: a change of the run's state, or a new reason while it stops
MACHINE_HEARTBEATS_AGAIN = Record(event="MachineReturned", message="machine {machine} heartbeats again")
# Issue 47 (server/health.py): a machine cordoned, drained or resumed, a GPU failed or cleared; a worker stopped
# for its machine is queued again with the stop's own words ("GPU 3 of gpu-07 failed (XID 79): queued again …").
QUEUED_OFF_MACHINE = Record("{said}", state=R.PENDING.value)


@dataclass(frozen=True)
class Rule:
    name: Transition
    kind: str  # "worker" | "run" | "machine"
    before: frozenset
    after: str
    doc: str
    reason: str | None = None  # the row's reason after the move, a template (None: the caller's words)
    says: Record | None = None  # what the move writes down, beyond the row's state

    def reason_for(self, **fields) -> str | None:
        return None if self.reason is None else self.reason.format(**fields)


def _rule(name: Transition, kind: str, before, after: str, doc: str, reason: str | None = None,
          says: Record | None = None) -> Rule:
    return Rule(name, kind, frozenset(before), after, doc, reason, says)


_ACTIVE = (W.STARTING, W.RUNNING, W.STOPPING)
RESTARTING = Record("Failed ({how}); restart {restarts} of {budget} in {secs}s", "WorkerRestarted",
                    state=R.PENDING.value)
RULES: dict[Transition, Rule] = {r.name: r for r in (
    # ------------------------------------------------------------------------------------------- workers
    _rule(T.CREATE_WORKER, "worker", {NEW}, W.PENDING, "submitted: waits to be placed", "Waiting to be placed"),
    _rule(T.PLACE, "worker", {W.PENDING}, W.STARTING, "the scheduler placed it on a machine", "Starting on {machine}"),
    _rule(T.START, "worker", {W.STARTING}, W.RUNNING, "its machine reports the process running", "Running"),
    _rule(T.STOP, "worker", {W.STARTING, W.RUNNING}, W.STOPPING,
          "preempted, past its time limit, deleted, or its gang stops: SIGTERM, the stop grace, SIGKILL"),
    _rule(T.CANCEL_WAITING, "worker", {W.PENDING}, W.CANCELLED, "its run was deleted before it was placed",
          "Deleted"),
    _rule(T.DEPENDENCY_NEVER_MET, "worker", {W.PENDING}, W.FAILED,
          "its run's dependency can no longer be met (afterok on a run that failed, …): it fails unplaced"),
    _rule(T.SUCCEED, "worker", {W.STARTING, W.RUNNING}, W.SUCCEEDED, "it exited with code 0, unasked",
          "Exited with code 0"),
    _rule(T.PREEMPTED, "worker", _ACTIVE, W.CANCELLED,
          "it ended after a preemption: queued again once no worker of its gang still stops"),
    _rule(T.DELETED, "worker", _ACTIVE, W.CANCELLED, "it ended after its run was deleted (or at its idle timeout)",
          "Deleted"),
    _rule(T.TIME_LIMIT, "worker", _ACTIVE, W.FAILED, "it ended at its time limit: failed, not restarted",
          "Stopped at its time limit ({limit}); not restarted"),
    _rule(T.TIME_LIMIT_GANG, "worker", _ACTIVE, W.CANCELLED, "it ended with its gang at a mate's time limit",
          "Stopped with its gang at the time limit"),
    _rule(T.GANG_STOPPED, "worker", _ACTIVE, W.CANCELLED, "it ended because a mate of its gang failed"),
    _rule(T.RESTART, "worker", _ACTIVE, W.PENDING,
          "it failed (or was lost) with restarts left: waits out its backoff, then is placed again",
          "Restarting in {secs}s ({how}; restart {restarts} of {budget})", RESTARTING),
    _rule(T.RESTART_GANG, "worker", _ACTIVE, W.CANCELLED,
          "it failed with restarts left in a gang: the gang is queued again once all its workers ended",
          "Restarting in {secs}s ({how}; restart {restarts} of {budget})", RESTARTING),
    _rule(T.FAIL, "worker", _ACTIVE, W.FAILED, "it failed with no restart left, or its policy is Never",
          "Failed ({how}){spent}"),
    _rule(T.REQUEUE, "worker", {W.PENDING, W.CANCELLED, W.SUCCEEDED}, W.PENDING,
          "queued again: after a preemption, or with its gang's restart"),
    # ---------------------------------------------------------------------------------------------- runs
    _rule(T.CREATE_RUN, "run", {NEW}, R.PENDING, "submitted", "Waiting for the scheduler"),
    _rule(T.RUN_WAITS, "run", RUN_LIVE, R.PENDING, "no worker holds room: queued, backing off or preempted",
          says=RUN_CHANGED),
    _rule(T.RUN_STARTS, "run", RUN_LIVE, R.STARTING, "workers placed, none running yet", says=RUN_CHANGED),
    _rule(T.RUN_RUNS, "run", RUN_LIVE, R.RUNNING, "a worker runs", says=RUN_CHANGED),
    _rule(T.RUN_STOPS, "run", RUN_LIVE, R.STOPPING, "workers stop: deleted, preempted, time limit, gang failure",
          says=RUN_CHANGED),
    _rule(T.RUN_COMPLETES, "run", RUN_LIVE, R.COMPLETED, "every worker succeeded",
          says=Record("{reason}", "RunCompleted")),
    _rule(T.RUN_FAILS, "run", RUN_LIVE, R.FAILED, "a worker failed for good", says=Record("{reason}", "RunFailed")),
    _rule(T.RUN_CANCELLED, "run", (*RUN_LIVE, *RUN_ENDED), R.CANCELLED, "deleted, and no worker runs any more",
          says=RUN_CHANGED),
    # ------------------------------------------------------------------------------------------ machines
    _rule(T.MACHINE_JOINS, "machine", {NEW}, MachineState.READY, "an agent registered a new machine",
          says=Record(event="MachineJoined", message="machine {machine} joined cluster {cluster}")),
    _rule(T.MACHINE_HEARTBEATS, "machine", {MachineState.READY}, MachineState.READY, "its agent reports"),
    _rule(T.MACHINE_RETURNS, "machine", {MachineState.LOST}, MachineState.READY,
          "a lost machine's agent registers or reports again",
          says=Record(event="MachineReturned", message="machine {machine} is back in cluster {cluster}")),
    _rule(T.MACHINE_LOST, "machine", {MachineState.READY}, MachineState.LOST,
          "no heartbeat for the cluster's lost_after_seconds: its workers are handled by their restart policy",
          says=Record(event="MachineLost", message="machine {machine} lost: no heartbeat for {silent} s; "
                                                   "its workers are handled by their restart policy")),
)}
# refresh_run derives a run's next state; this is the rule that leads there.
RUN_RULE_FOR = {r.after: r for r in RULES.values() if r.kind == "run" and r.name != T.CREATE_RUN}


def allows(name: Transition | str, state: str | None) -> bool:
    return state in RULES[name].before


def _move(row: Worker | Run | Machine, name: Transition | str, reason: str | None = None, **fields) -> None:
    """Move `row` by the rule `name`; its reason becomes `reason`, else the rule's own (filled with `fields`)."""
    rule = RULES[name]
    kind = {Worker: "worker", Run: "run", Machine: "machine"}[type(row)]
    if kind != rule.kind:
        raise IllegalTransition(f"rule {name} moves a {rule.kind}, not a {kind}")
    if row.state not in rule.before:
        allowed = ", ".join(sorted(str(s) for s in rule.before))
        raise IllegalTransition(f"{name}: {kind} {row.name} is {row.state}; the rule starts from {allowed}")
    row.state = rule.after.value
    if reason is None:
        reason = rule.reason_for(**fields)
    if reason is not None:
        row.reason = reason


# ------------------------------------------------------------------------------------------- helpers


def history(session: Session, run: Run, state: str, reason: str, at: float) -> None:
    session.add(History(run_id=run.id, time=at, state=str(state), reason=reason))


def submitted_message(name: str, priority: int) -> str:
    """The RunSubmitted event's words (submits.submit_run, and the group-commit writer's batches)."""
    return SUBMITTED.said(name=name, priority=priority)


def submitted_rows(run: Run, at: float) -> tuple[dict, dict]:
    """A newly queued run's first History line and its RunSubmitted event, as the rows to insert (server/submits.py
    writes them with the run; the History line's run is named by the writer, once the run's id is known)."""
    return ({"time": at, "state": SUBMITTED.state, "reason": SUBMITTED.line()},
            {"workspace_id": run.workspace_id, "time": at, "kind": SUBMITTED.event, "object": run.name,
             "message": submitted_message(run.name, run.priority)})


def submitted_records(runs: list[tuple[Run, float, object]], key: str) -> list[tuple]:
    """The History lines and RunSubmitted events of newly queued runs, as (table, rows) for the batch submit's bulk
    INSERTs (server/submits.py): `runs` as (run, time, ref), each History row naming its run by `key` = ref (run_id,
    or run_uid where the writer finds the run's id by its uid)."""
    history, events = [], []
    for run, at, ref in runs:
        h, e = submitted_rows(run, at)
        history.append({**h, key: ref})
        events.append(e if key == "run_id" else {**e, "run_uid": ref})
    return [(History.__table__, history), (Event.__table__, events)]


def submitted(session: Session, run: Run, at: float) -> None:
    """A run just submitted: its first History line and its workspace's RunSubmitted event."""
    record(session, SUBMITTED, at, run=run, name=run.name, priority=run.priority)


def event(session: Session, workspace_id: int | None, kind: str, obj: str, message: str, at: float) -> None:
    session.add(Event(workspace_id=workspace_id, time=at, kind=kind, object=obj, message=message))


def record(session: Session, rec: Record, at: float, *, run: Run | None = None, workspace_id: int | None = None,
           obj: str | None = None, **fields) -> None:
    """Write down `rec` filled with `fields`: the History line of `run` (in the record's state, else the run's as it
    is) and the Event of the run's workspace (or of `workspace_id`, about `obj`, the run's name unless given)."""
    line = rec.line(**fields)
    if line is not None and run is not None:
        history(session, run, rec.state or run.state, line, at)
    if rec.event is not None:
        wsid = run.workspace_id if run is not None else workspace_id
        event(session, wsid, rec.event, obj if obj is not None else run.name, rec.said(**fields), at)


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
    _move(run, T.CREATE_RUN)
    return run


def new_worker(**fields) -> Worker:
    w = Worker(state=None, **fields)
    _move(w, T.CREATE_WORKER)
    w.restarts = w.preemptions = w.crash_streak = 0
    return w


# ------------------------------------------------------------------------------------------ run state


HELD = "Held by user"  # how a held run's reason begins (scontrol hold)


def held_reason(name: str) -> str:
    return f"{HELD}; waiting for astra slurm scontrol release {name}"


def submitted_held(run: Run) -> None:
    """A run submitted held (sbatch -H): Pending with the held reason from its first row, so no plan ever sees it
    unheld."""
    run.held = True
    run.reason = held_reason(run.name)


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
        said = next((w.reason for w in ws if w.state == W.STARTING and w.reason and w.reason != RULES[T.START].reason
                     and not w.reason.startswith("Starting on ")), None)
        if said:  # what a machine says it is doing ("Pulling image …")
            return R.STARTING, f"Starting {len(active)} of {n} workers: {said}"
        return R.STARTING, f"Starting {len(active)} of {n} workers"
    ended_by = next((w for w in ws if w.state == W.CANCELLED and w.stop_kind in ENDS_RUN), None)
    if ended_by is not None and all(w.state in ENDED for w in ws):  # not queued again: the run ends with it
        return R.CANCELLED, ended_by.reason
    if run.held:
        return R.PENDING, held_reason(run.name)
    if run.preempted_by:
        return R.PENDING, f"Preempted by higher-priority work ({run.preempted_by}); waiting to run again"
    due = restart_due(ws)
    if due is not None and due > at:
        backing_off = next(w for w in ws if w.state == W.PENDING and w.restart_at == due)
        return R.PENDING, shown_reason(backing_off.reason, due, at)  # the time left now, in History too
    return R.PENDING, run.queue_reason or RULES[T.CREATE_RUN].reason


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
        if state == run.state:
            run.reason = reason
            if state == R.STOPPING or (state == R.PENDING and run.preempted_by):
                record(session, RUN_CHANGED, at, run=run, reason=reason)
        else:
            rule = RUN_RULE_FOR[state]
            _move(run, rule.name, reason)
            record(session, rule.says, at, run=run, reason=reason)
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
    head does) and workers of one shape their why-not lines, so one statement per shared value writes most rows
    (on PostgreSQL each row's new version stays the cost; `bench_snapshot.py --queue-reasons` measures it). On
    PostgreSQL, revision 0012's fillfactor 70 keeps room on the page for the new versions (HOT updates, no index
    entries)."""
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
    (Pending, not held, not preempted, not backing off after a failure: refresh_run's rule; no History line either way); only
    a worker still waiting gets its lines."""
    runs, workers = Run.__table__, Worker.__table__
    if reasons:
        backing_off = select(workers.c.id).where(
            workers.c.run_id == runs.c.id, workers.c.state == W.PENDING.value,
            workers.c.restart_at > bindparam("at")).exists()
        plainly_waiting = and_(runs.c.state == R.PENDING.value, runs.c.preempted_by.is_(None),
                               runs.c.held.is_(False), ~backing_off)  # a held run keeps "Held by user" (refresh_run)
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
    record(session, QUOTA_REACHED, at, run=run, message=message)


def stall_noted(session: Session, run: Run, rec: Record, reason: str, on_stall: str, at: float) -> None:
    """A running run stalled and asks only to be told (server/progress.py, `on_stall: notify`): the record, and
    the stall as its reason until progress resumes (progress_again) or its state changes."""
    record(session, rec, at, run=run, reason=f"{reason}; on_stall: {on_stall}")
    if run.state == R.RUNNING:
        run.reason = reason


def progress_again(session: Session, run: Run, rec: Record, said: str, at: float, still_stalled: bool) -> None:
    """Progress after a stall the run was told of: the record, and its own reason back unless another of its
    workers is still stalled."""
    record(session, rec, at, run=run, said=said)
    if run.state == R.RUNNING and not still_stalled:
        run.reason = _derive(run, at)[1]


# --------------------------------------------------------------------------------------- worker moves


def place(session: Session, run: Run, worker: Worker, machine_id: int, gpu_indices: list[int], cpu: float,
          mem: int, at: float, machine_name: str) -> None:
    _move(worker, T.PLACE, machine=machine_name)
    worker.machine_id = machine_id
    worker.gpu_indices = list(gpu_indices)
    worker.cpu_cores = cpu
    worker.memory_bytes = mem
    worker.attempt += 1
    worker.desired = Desired.RUNNING.value
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
    if allows(T.START, worker.state):
        _move(worker, T.START)
        worker.started_at = at
        worker.deadline = deadline(run, worker, at, attached=False)  # the limit counts from the start
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
            _move(worker, T.CANCEL_WAITING)
            worker.restart_at = None
        return
    if not _stoppable(worker):
        return
    _move(worker, T.STOP, reason)
    worker.desired = Desired.STOPPED.value
    worker.stop_kind = kind.value
    worker.stop_reason = reason
    worker.preempted_for = preempted_for
    worker.stop_requested_at = at


def _stoppable(worker: Worker) -> bool:
    """Placed, and not yet asked to stop."""
    return allows(T.STOP, worker.state) and worker.desired != Desired.STOPPED


def idle_timeout(run: Run) -> int | None:
    """An interactive run's idle timeout (spec.interactive.idle_timeout_seconds), or None."""
    return (run.spec.get("interactive") or {}).get("idle_timeout_seconds")


def deadline(run: Run, worker: Worker, at: float, attached: bool) -> float | None:
    """A running worker's deadline (Worker.deadline, which the loop enforces): its start + its time limit, or, for
    an interactive run with an idle timeout and no session attached, `at` + that timeout when it comes first."""
    limit = _spec(run).get("time_limit_seconds")
    ends = [worker.started_at + limit] if limit and worker.started_at is not None else []
    idle = idle_timeout(run)
    if idle and not attached:
        ends.append(at + idle)
    return min(ends) if ends else None


def sessions_changed(run: Run, worker: Worker, attached: bool, at: float) -> None:
    """An exec or shell session attached to the worker (`attached`), or its last one went: its idle timeout stops,
    or starts counting from `at`."""
    if worker.state == W.RUNNING and idle_timeout(run):
        worker.deadline = deadline(run, worker, at, attached)


def stop_at_time_limit(session: Session, run: Run, worker: Worker, at: float) -> None:
    """The worker is past its time limit: stop it; it fails, not restarted (and its gang stops with it). Or, for an
    interactive run before its limit, past its idle timeout: it ends, Cancelled, with its run."""
    limit_s = _spec(run).get("time_limit_seconds")
    if idle_timeout(run) and not (limit_s and worker.started_at is not None and worker.started_at + limit_s <= at):
        said = STOP_ASKED[StopKind.IDLE].format(idle=fmt_duration(idle_timeout(run)))
        for w in run.workers:  # the whole run ends
            request_stop(session, run, w, StopKind.IDLE, said, at)
        return
    limit = fmt_duration(limit_s or 0)
    request_stop(session, run, worker, StopKind.TIMELIMIT, STOP_ASKED[StopKind.TIMELIMIT].format(limit=limit), at)


def preempt(session: Session, run: Run, workers: list[Worker], head: str, reason: str, at: float) -> None:
    """Stop these workers of `run` to make room for `head`: one preemption for the run, one for each worker."""
    _stop_for_other_work(session, run, workers, StopKind.PREEMPT, head, reason, at)


def stop_for_reservation(session: Session, run: Run, workers: list[Worker], reservation: str, reason: str,
                         at: float) -> None:
    """Stop these workers of `run`: a reservation for other workspaces opened on their machines. Like a
    preemption (counted as one, no restart spent; queued again once they ended), but the run is not said to wait
    for higher-priority work: its reason and history say `reason` ("Stopped for reservation <name>")."""
    _stop_for_other_work(session, run, workers, StopKind.RESERVATION, reservation[:63], reason, at)


def _stop_for_other_work(session: Session, run: Run, workers: list[Worker], kind: StopKind, preempted_for: str,
                         reason: str, at: float) -> None:
    stopped = False
    for w in workers:
        if _stoppable(w):
            request_stop(session, run, w, kind, reason, at, preempted_for=preempted_for)
            w.preemptions += 1
            stopped = True
    if stopped:
        run.preemptions += 1
        record(session, PREEMPTED, at, run=run, reason=reason)


def _release(worker: Worker) -> None:
    """The worker no longer holds room on a machine."""
    worker.desired = None
    worker.machine_id = None
    worker.gpu_indices = []
    worker.pid = None


def _requeue(worker: Worker, reason: str) -> None:
    _move(worker, T.REQUEUE, reason)
    _release(worker)


def _gang(run: Run) -> bool:
    return run.spec.get("start", "Gang") != "Independent" and len(run.workers) > 1


@dataclass(frozen=True)
class End:
    """A worker's process is gone: what the report says (the facts `ended` was given, `how` in words)."""

    session: Session
    run: Run
    worker: Worker
    exit_code: int | None
    how: str  # "exit code 1", "signal 9", "lost with machine gpu-01", "Out of memory (limit 256 MiB)", …
    evicted: bool
    gang: bool
    at: float


def ended(session: Session, run: Run, worker: Worker, exit_code: int | None, signal: int | None,
          message: str | None, at: float, oom_limit_bytes: int | None = None, evicted: str | None = None) -> None:
    """The worker's process is gone (agent report), it failed to start, or its machine is lost (message given,
    no code). What that means follows the stop asked of it, if any (ON_END), else its exit and its restart policy.
    A report for a worker not holding room (already ended, or a stale attempt) is ignored. `oom_limit_bytes`: the
    kernel killed it at that memory limit (the failure then reads `Out of memory (limit 256 MiB)`)."""
    if worker.state not in ACTIVE:
        return
    kind = StopKind(worker.stop_kind) if worker.stop_kind else None
    worker.exit_code = exit_code if exit_code is not None else (128 + signal if signal else None)
    worker.finished_at = at
    worker.desired = None
    how = (f"exit code {exit_code}" if exit_code is not None else f"signal {signal}" if signal else message
           or "lost")
    if oom_limit_bytes:
        how = f"Out of memory (limit {human_bytes(oom_limit_bytes)})"
    if evicted:  # its agent stopped it over its ephemeral storage limit (agent/disk.py)
        how = evicted
    facts = accounting.attempt_facts(worker)  # before a restart releases its machine
    by = (_preempted_by(worker) if kind == StopKind.PREEMPT
          else f"reservation {worker.preempted_for}" if kind == StopKind.RESERVATION else None)
    ON_END[kind](End(session, run, worker, exit_code, how, bool(evicted), _gang(run), at))
    accounting.attempt_ended(session, run, worker, facts, by, exit_code, bool(evicted), at)  # its usage record
    refresh_run(session, run, at)


def _end_unasked(e: End) -> None:
    """No stop was asked: code 0 succeeds, anything else is a failure for its restart policy."""
    if e.exit_code == 0 and not e.evicted:
        _move(e.worker, T.SUCCEED)
    else:
        _failed(e.session, e.run, e.worker, e.how, e.at, e.gang)


def _preempted_by(w: Worker) -> str:
    # Another workspace's run is never named: the stop reason already says so when it is one.
    hidden = "a job in another namespace"
    return hidden if hidden in (w.stop_reason or "") else (w.preempted_for or "higher-priority work")


def _end_preempted(e: End) -> None:
    by = _preempted_by(e.worker)
    if e.run.spec.get("requeue") is False:  # --no-requeue: it ends here, and the run ends Cancelled
        _move(e.worker, T.PREEMPTED, f"Preempted by {by}; not queued again (--no-requeue)")
        return
    _queue_again(e, StopKind.PREEMPT, f"Preempted by {by}", by)


def _end_for_reservation(e: End) -> None:
    # the run waits as any run does afterwards, not for higher-priority work
    _queue_again(e, StopKind.RESERVATION, e.worker.stop_reason or "Stopped for a reservation", None)


def _queue_again(e: End, kind: StopKind, said: str, preempted_by: str | None, rec: Record = QUEUED_AGAIN) -> None:
    """Stopped for other work: queued again (no backoff) once no worker of its gang stopped so still stops."""
    run = e.run
    _move(e.worker, T.PREEMPTED, said)
    mates = [w for w in run.workers if w.stop_kind == kind] if e.gang else [e.worker]
    if all(w.state not in ACTIVE for w in mates):
        line = rec.line(said=said)
        for w in mates:
            _requeue(w, line)
            w.restart_at = None  # a preemption never waits on backoff
        run.preempted_by = preempted_by
        record(e.session, rec, e.at, run=run, said=said)


def _end_deleted(e: End) -> None:
    _move(e.worker, T.DELETED)


def _end_idle(e: End) -> None:
    _move(e.worker, T.DELETED, e.worker.stop_reason)


def _end_at_time_limit(e: End) -> None:
    _move(e.worker, T.TIME_LIMIT, limit=fmt_duration(_spec(e.run).get("time_limit_seconds") or 0))
    if e.gang:
        _stop_mates(e.session, e.run, e.worker, StopKind.TIMELIMIT_GANG, e.worker.reason, e.at)


def _end_with_gang_at_time_limit(e: End) -> None:
    _move(e.worker, T.TIME_LIMIT_GANG)


def _end_stalled(e: End) -> None:
    """Stopped without progress: a failure that spends a restart (on_stall restart), or fails for good (fail)."""
    how = e.worker.stop_reason or "No progress"
    if (e.run.spec.get("progress") or {}).get("on_stall") == "fail":
        _move(e.worker, T.FAIL, how=how, spent="")
        if e.gang:
            _stop_mates(e.session, e.run, e.worker, StopKind.GANG, STOP_ASKED[StopKind.GANG], e.at)
    else:
        _failed(e.session, e.run, e.worker, how, e.at, e.gang)


def _end_with_gang(e: End) -> None:
    failed = any(w.state == W.FAILED for w in e.run.workers)  # for good: the gang is not restarted
    _move(e.worker, T.GANG_STOPPED, "Stopped: a worker of its gang failed" if failed else "Stopped to restart its gang")
    _requeue_gang(e.run)


# What a worker's end means, by the stop the control plane asked of it (None: none was asked).
ON_END = {
    None: _end_unasked,
    StopKind.PREEMPT: _end_preempted,
    StopKind.RESERVATION: _end_for_reservation,
    StopKind.DELETE: _end_deleted,
    StopKind.TIMELIMIT: _end_at_time_limit,
    StopKind.TIMELIMIT_GANG: _end_with_gang_at_time_limit,
    StopKind.GANG: _end_with_gang,
    StopKind.IDLE: _end_idle,
    StopKind.STALL: _end_stalled,
    StopKind.MACHINE: lambda e: _queue_again(e, StopKind.MACHINE, e.worker.stop_reason or "Stopped off its machine",
                                             None, QUEUED_OFF_MACHINE),
}


def _stop_mates(session: Session, run: Run, worker: Worker, kind: StopKind, reason: str, at: float) -> None:
    for w in run.workers:
        if w is not worker:
            request_stop(session, run, w, kind, reason, at)


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
        said = {"how": how, "restarts": worker.restarts, "budget": budget, "secs": math.ceil(delay)}
        rule = RULES[T.RESTART_GANG if gang else T.RESTART]
        record(session, rule.says, at, run=run, obj=worker.name, **said)
        run.queue_reason = ""  # the scheduler's word from before the failure no longer holds
        _move(worker, rule.name, **said)
        if gang:
            _stop_mates(session, run, worker, StopKind.GANG, STOP_ASKED[StopKind.GANG], at)
            _requeue_gang(run)
        else:
            _release(worker)
    else:
        spent = "; restart budget spent" if tt.get("restart_policy") != "Never" else ""
        _move(worker, T.FAIL, how=how, spent=spent)
        if gang:
            _stop_mates(session, run, worker, StopKind.GANG, STOP_ASKED[StopKind.GANG], at)


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
            _move(w, T.DEPENDENCY_NEVER_MET, reason)
            w.restart_at = None
            w.why_not = []
    refresh_run(session, run, at)


def delete(session: Session, run: Run, at: float, by: str | None = None) -> None:
    """`by`: who deleted it (None: the control plane, or unknown)."""
    run.deleting = True
    for w in run.workers:
        request_stop(session, run, w, StopKind.DELETE, STOP_ASKED[StopKind.DELETE], at)
    if by:
        record(session, DELETED_BY, at, run=run, by=by)
    else:
        record(session, DELETED_BY_REQUEST, at, run=run)
    refresh_run(session, run, at)


# --------------------------------------------------------------------------------------------- machines


def machine_registered(session: Session, machine: Machine | None, cluster: Cluster, name: str,
                       at: float) -> tuple[Machine, bool]:
    """An agent registers `name` (its row, or None for a new machine): it is Ready. Returns the row, and
    whether it joined or came back (what the scheduler must see)."""
    if machine is None:
        machine = Machine(cluster_id=cluster.id, name=name, state=None)
        session.add(machine)
        _move(machine, T.MACHINE_JOINS)
        record(session, RULES[T.MACHINE_JOINS].says, at, obj=name, machine=name, cluster=cluster.name)
        changed = True
    elif allows(T.MACHINE_RETURNS, machine.state):
        _move(machine, T.MACHINE_RETURNS)
        record(session, RULES[T.MACHINE_RETURNS].says, at, obj=name, machine=name, cluster=cluster.name)
        changed = True
    else:
        _move(machine, T.MACHINE_HEARTBEATS)
        changed = False
    machine.last_heartbeat = at
    return machine, changed


def machine_heartbeat(session: Session, machine: Machine, at: float) -> bool:
    """The machine's agent reports. Returns True when a lost machine came back."""
    returned = allows(T.MACHINE_RETURNS, machine.state)
    if returned:
        _move(machine, T.MACHINE_RETURNS)
        record(session, MACHINE_HEARTBEATS_AGAIN, at, obj=machine.name, machine=machine.name)
    else:
        _move(machine, T.MACHINE_HEARTBEATS)
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
    _move(machine, T.MACHINE_LOST)
    wsids = {w.run.workspace_id for w in workers} or {None}
    for wsid in sorted(wsids, key=lambda x: (x is None, x)):
        record(session, RULES[T.MACHINE_LOST].says, at, workspace_id=wsid, obj=machine.name, machine=machine.name,
               silent=int(at - machine.last_heartbeat))
    for w in workers:
        lost(session, w.run, w, machine.name, at)


def stop_off_machine(session: Session, run: Run, workers: list[Worker], reason: str, at: float) -> None:
    """Stop these workers of `run` because their machine was drained or their GPU failed (server/health.py): like a
    preemption for the restart budget (none spent, queued again once they ended) but not counted as one; the
    worker's reason is `reason` (`GPU 3 of gpu-07 failed (XID 79): queued again elsewhere`)."""
    for w in workers:
        request_stop(session, run, w, StopKind.MACHINE, reason, at)


def machine_health_event(session: Session, workspace_ids: list[int], kind: str, machine: str, message: str,
                         at: float) -> None:
    """An event of each workspace that may use the machine: it was cordoned, drained or resumed, a GPU failed or
    was cleared."""
    for wsid in workspace_ids or [None]:
        event(session, wsid, kind, machine, message, at)


def hold(session: Session, run: Run, held: bool, at: float) -> str:
    """`scontrol hold` (held) / `release` of a Pending run (update_run refuses the others): a held run stays
    Pending, its reason says so, and the loop offers it to no plan."""
    run.held = held
    run.queue_reason = ""  # released: waiting for the scheduler's next word
    for w in run.workers:
        set_why_not(w, [])
    refresh_run(session, run, at)
    return "held" if held else "released"
