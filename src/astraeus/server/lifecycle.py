"""The one place where a run's or a worker's state changes.

Every transition goes through a function here, which also writes the run's History and the workspace's
Events. Callers (the API services, the scheduling loop, agent reports) decide *that* something happened;
this module decides what it means for the states.

Worker states: Pending → Starting → Running → Stopping → Succeeded | Failed | Cancelled.
Run states: Pending, Starting, Running, Stopping, Completed, Failed, Cancelled.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from astraeus.server.db import Event, History, Run, Worker

ACTIVE = ("Starting", "Running", "Stopping")  # states that hold room on a machine
ENDED = ("Succeeded", "Failed", "Cancelled")


def fmt_duration(seconds: float) -> str:
    s = int(seconds)
    if s % 3600 == 0 and s >= 3600:
        return f"{s // 3600}h"
    if s % 60 == 0 and s >= 60:
        return f"{s // 60}m"
    return f"{s}s"


def history(session: Session, run: Run, state: str, reason: str, at: float) -> None:
    session.add(History(run_id=run.id, time=at, state=state, reason=reason))


def event(session: Session, workspace_id: int | None, kind: str, obj: str, message: str, at: float) -> None:
    session.add(Event(workspace_id=workspace_id, time=at, kind=kind, object=obj, message=message))


def _spec(run: Run) -> dict:
    return run.spec["task_template"]


# ------------------------------------------------------------------------------------------ run state


def refresh_run(session: Session, run: Run, at: float) -> None:
    """Derive the run's state and reason from its workers; record a History entry when either changes."""
    ws = run.workers
    n = len(ws)
    active = [w for w in ws if w.state in ACTIVE]
    if run.deleting:
        if active:
            state, reason = "Stopping", f"Deleting: stopping {len(active)} worker(s)"
        else:
            state, reason = "Cancelled", "Deleted"
    elif ws and all(w.state == "Succeeded" for w in ws):
        state, reason = "Completed", f"{n} of {n} workers succeeded"
    elif any(w.state == "Failed" for w in ws) and (run.spec.get("start") != "Independent" or not active
                                                      and not any(w.state == "Pending" for w in ws)):
        failed = next(w for w in ws if w.state == "Failed")
        state, reason = ("Stopping", failed.reason) if active else ("Failed", failed.reason)
    elif any(w.state == "Stopping" for w in ws):
        stopping = [w for w in ws if w.state == "Stopping"]
        state, reason = "Stopping", stopping[0].reason
    elif ws and all(w.state == "Running" for w in ws if w.state not in ENDED) and any(
            w.state == "Running" for w in ws):
        running = sum(1 for w in ws if w.state == "Running")
        state, reason = "Running", f"{running} of {n} workers running"
    elif any(w.state in ("Starting", "Running") for w in ws):
        running = sum(1 for w in ws if w.state == "Running")
        state = "Running" if running else "Starting"
        reason = f"{running} of {n} workers running" if running else f"Starting {len(active)} of {n} workers"
    else:
        state = "Pending"
        if run.preempted_by:
            reason = f"Preempted by higher-priority work ({run.preempted_by}); waiting to run again"
        else:
            reason = run.queue_reason or "Waiting for the scheduler"
    if state in ("Running",) and run.started_at is None:
        run.started_at = at
    if state in ("Completed", "Failed", "Cancelled") and run.finished_at is None:
        run.finished_at = at
    if state != run.state or reason != run.reason:
        # History keeps what happened to the run: every change of state, and each new reason while it stops
        # or waits after a preemption. The queue's own reasons ("Queued behind …") change with every cycle
        # and stay out of it: status.reason and the per-machine lines show them.
        if state != run.state or state == "Stopping" or (state == "Pending" and run.preempted_by):
            history(session, run, state, reason, at)
        if state != run.state and state in ("Completed", "Failed"):
            event(session, run.workspace_id, f"Run{state}", run.name, reason, at)
        run.state, run.reason = state, reason
    if run.deleting and state == "Cancelled":
        run.live_key = run.uid  # frees the name for a new run


def set_queue_reason(session: Session, run: Run, reason: str, at: float) -> None:
    if run.queue_reason != reason:
        run.queue_reason = reason
        refresh_run(session, run, at)


# --------------------------------------------------------------------------------------- worker moves


def place(session: Session, run: Run, worker: Worker, machine_id: int, gpu_indices: list[int], cpu: float,
          mem: int, at: float, machine_name: str) -> None:
    worker.state = "Starting"
    worker.reason = f"Starting on {machine_name}"
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
    worker.why_not = []
    limit = _spec(run).get("time_limit_seconds")
    worker.deadline = at + limit if limit else None
    run.preempted_by = None
    run.quota_noted = False


def running(session: Session, run: Run, worker: Worker, pid: int | None, environment: str | None, at: float) -> None:
    if worker.state == "Starting":
        worker.state = "Running"
        worker.reason = "Running"
        worker.started_at = at
        limit = _spec(run).get("time_limit_seconds")
        worker.deadline = at + limit if limit else None  # the limit counts from the start
    if pid:
        worker.pid = pid
    if environment:
        worker.environment = environment
    refresh_run(session, run, at)


def request_stop(session: Session, run: Run, worker: Worker, kind: str, reason: str, at: float,
                 preempted_for: str | None = None) -> None:
    """Tell the worker's machine to stop it: SIGTERM, the machine's stop grace, then SIGKILL."""
    if worker.state == "Pending":  # nothing runs: a delete cancels it, other stops leave it waiting
        if kind == "delete":
            worker.state = "Cancelled"
        worker.reason = reason
        return
    if worker.state not in ACTIVE or worker.desired == "Stopped":
        return
    worker.state = "Stopping"
    worker.desired = "Stopped"
    worker.stop_kind = kind
    worker.stop_reason = reason
    worker.reason = reason
    worker.preempted_for = preempted_for
    worker.stop_requested_at = at


def preempt(session: Session, run: Run, workers: list[Worker], head: str, reason: str, at: float) -> None:
    for w in workers:
        request_stop(session, run, w, "preempt", reason, at, preempted_for=head)
        w.preemptions += 1
    run.preemptions += 1
    event(session, run.workspace_id, "Preempted", run.name, reason, at)


def _requeue(worker: Worker, reason: str) -> None:
    worker.state = "Pending"
    worker.reason = reason
    worker.desired = None
    worker.machine_id = None
    worker.gpu_indices = []
    worker.pid = None


def ended(session: Session, run: Run, worker: Worker, exit_code: int | None, signal: int | None,
          message: str | None, at: float) -> None:
    """The worker's process is gone (agent report) or its machine is lost (message given, code None)."""
    if worker.state not in ACTIVE:
        return
    kind = worker.stop_kind
    tt = _spec(run)
    worker.exit_code = exit_code if exit_code is not None else (128 + signal if signal else None)
    worker.finished_at = at
    worker.desired = None
    how = (f"exit code {exit_code}" if exit_code is not None else f"signal {signal}" if signal else message
           or "lost")
    gang = run.spec.get("start", "Gang") != "Independent" and len(run.workers) > 1
    if kind == "preempt":
        # Another workspace's run is never named: the stop reason already says so when it is one.
        hidden = "a job in another namespace"
        by = hidden if hidden in (worker.stop_reason or "") else (worker.preempted_for or "higher-priority work")
        worker.state, worker.reason = "Cancelled", f"Preempted by {by}"
        # A gang is queued again only once none of its workers is still stopping.
        mates = [w for w in run.workers if w.stop_kind == "preempt"] if gang else [worker]
        if all(w.state not in ACTIVE for w in mates):
            for w in mates:
                _requeue(w, f"Preempted by {by}; queued again")
            run.preempted_by = by
            history(session, run, "Pending", f"Preempted by {by}; queued again", at)
    elif kind == "delete":
        worker.state, worker.reason = "Cancelled", "Deleted"
    elif kind == "timelimit":
        limit = fmt_duration(tt.get("time_limit_seconds") or 0)
        worker.state, worker.reason = "Failed", f"Stopped at its time limit ({limit}); not restarted"
        if gang:
            for w in run.workers:
                if w is not worker:
                    request_stop(session, run, w, "timelimit_gang", worker.reason, at)
    elif kind == "timelimit_gang":
        worker.state, worker.reason = "Cancelled", "Stopped with its gang at the time limit"
    elif kind == "gang":
        worker.state, worker.reason = "Cancelled", "Stopped to restart its gang"
        if all(w.state not in ACTIVE for w in run.workers):
            for w in run.workers:
                _requeue(w, w.reason if w.state == "Pending" else "Restarting with its gang")
    elif exit_code == 0 and kind is None:
        worker.state, worker.reason = "Succeeded", "Exited with code 0"
    else:
        _failed(session, run, worker, how, at, gang)
    refresh_run(session, run, at)


def _failed(session: Session, run: Run, worker: Worker, how: str, at: float, gang: bool) -> None:
    tt = _spec(run)
    budget = tt.get("max_restarts", 10)
    if tt.get("restart_policy", "OnFailure") == "OnFailure" and worker.restarts < budget:
        worker.restarts += 1
        reason = f"Failed ({how}); restarting ({worker.restarts} of {budget} restarts)"
        history(session, run, "Pending", reason, at)
        event(session, run.workspace_id, "WorkerRestarted", worker.name, reason, at)
        if gang:
            worker.state, worker.reason = "Cancelled", reason
            for w in run.workers:
                if w is not worker:
                    request_stop(session, run, w, "gang", "Stopping: a worker of the gang failed", at)
            if all(w.state not in ACTIVE for w in run.workers):
                for w in run.workers:
                    _requeue(w, reason if w is worker else "Restarting with its gang")
        else:
            _requeue(worker, reason)
    else:
        worker.state = "Failed"
        worker.reason = f"Failed ({how})" + ("; restart budget spent" if tt.get("restart_policy") != "Never" else "")
        if gang:
            for w in run.workers:
                if w is not worker:
                    request_stop(session, run, w, "gang", "Stopping: a worker of the gang failed", at)


def lost(session: Session, run: Run, worker: Worker, machine: str, at: float) -> None:
    """The worker's machine stopped heartbeating: the worker is lost and handled by its restart policy."""
    if worker.state not in ACTIVE:
        return
    if worker.stop_kind == "preempt" or worker.stop_kind == "delete":
        ended(session, run, worker, None, None, f"lost with machine {machine}", at)
        return
    worker.stop_kind = None
    ended(session, run, worker, None, None, f"lost with machine {machine}", at)


def delete(session: Session, run: Run, at: float) -> None:
    run.deleting = True
    for w in run.workers:
        if w.state == "Pending":
            w.state, w.reason = "Cancelled", "Deleted"
        else:
            request_stop(session, run, w, "delete", "Stopping: the run was deleted", at)
    history(session, run, "Stopping", "Deleted by request", at)
    refresh_run(session, run, at)
