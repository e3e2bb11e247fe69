"""Every state transition of server/lifecycle.py, driven directly on rows in an in-memory SQLite database: no
server process, no agent. Each case names the rules of lifecycle.RULES it exercises; a test checks that the
cases together exercise every rule, and each case checks that its rules were really applied."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from sqlalchemy import select

from astraeus.server import lifecycle as L
from astraeus.server import loop
from astraeus.server.db import Cluster, Event, Org
from tests.lifecycle.rows import T0, delete, exits, machine_lost, place, preempt, running, start_fails, stop


@dataclass
class Case:
    name: str
    rules: tuple[str, ...]  # the rules this case exercises (each must be applied)
    steps: list  # (seconds after T0, step)
    workers: list[tuple]  # (state, reason, restarts, preemptions) of each worker at the end
    run: tuple[str, str]  # the run's state and reason at the end
    history: list[tuple[str, str]]  # History rows after "Submitted"
    events: list[tuple[str, str, str]] = field(default_factory=list)  # after the machines joined
    n: int = 1
    policy: str = "OnFailure"
    budget: int = 10
    limit: int | None = None
    start: str = "Gang"


R10 = "Restarting in 10s"
NEVER_MET = "prep failed: afterok can no longer be met"
CASES = [
    Case("fails unplaced when its dependency can no longer be met", ("dependency_never_met", "run_fails"),
         [(1, lambda world, run, at: L.dependency_never_met(world.s, run, NEVER_MET, at))],
         [("Failed", NEVER_MET, 0, 0)], ("Failed", NEVER_MET), [("Failed", NEVER_MET)],
         [("RunFailed", "r", NEVER_MET)]),
    Case("submitted", ("create_run", "create_worker"), [],
         [("Pending", "Waiting to be placed", 0, 0)], ("Pending", "Waiting for the scheduler"), []),
    Case("placed", ("place", "run_starts"), [(1, place(0))],
         [("Starting", "Starting on gpu-01", 0, 0)], ("Starting", "Starting 1 of 1 workers"),
         [("Starting", "Starting 1 of 1 workers")]),
    Case("running", ("start", "run_runs"), [(1, place(0)), (2, running(0))],
         [("Running", "Running", 0, 0)], ("Running", "1 of 1 workers running"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running")]),
    Case("succeeds", ("succeed", "run_completes"), [(1, place(0)), (2, running(0)), (5, exits(0, 0))],
         [("Succeeded", "Exited with code 0", 0, 0)], ("Completed", "1 of 1 workers succeeded"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Completed", "1 of 1 workers succeeded")],
         [("RunCompleted", "r", "1 of 1 workers succeeded")]),
    Case("exits 0 while starting (it ran, ended before a report said so)", ("succeed",),
         [(1, place(0)), (2, exits(0, 0))],
         [("Succeeded", "Exited with code 0", 0, 0)], ("Completed", "1 of 1 workers succeeded"),
         [("Starting", "Starting 1 of 1 workers"), ("Completed", "1 of 1 workers succeeded")],
         [("RunCompleted", "r", "1 of 1 workers succeeded")]),
    Case("fails and restarts after its backoff", ("restart", "run_waits"),
         [(1, place(0)), (2, running(0)), (3, exits(0, 3))],
         [("Pending", f"{R10} (exit code 3; restart 1 of 10)", 1, 0)],
         ("Pending", f"{R10} (exit code 3; restart 1 of 10)"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Pending", "Failed (exit code 3); restart 1 of 10 in 10s"),
          ("Pending", f"{R10} (exit code 3; restart 1 of 10)")],
         [("WorkerRestarted", "r-0", "Failed (exit code 3); restart 1 of 10 in 10s")]),
    Case("killed by a signal", ("restart",), [(1, place(0)), (2, running(0)), (3, exits(0, None, 9))],
         [("Pending", f"{R10} (signal 9; restart 1 of 10)", 1, 0)], ("Pending", f"{R10} (signal 9; restart 1 of 10)"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Pending", "Failed (signal 9); restart 1 of 10 in 10s"), ("Pending", f"{R10} (signal 9; restart 1 of 10)")],
         [("WorkerRestarted", "r-0", "Failed (signal 9); restart 1 of 10 in 10s")]),
    Case("fails to start", ("restart",), [(1, place(0)), (2, start_fails(0, "no such command: trian.py"))],
         [("Pending", f"{R10} (failed to start: no such command: trian.py; restart 1 of 10)", 1, 0)],
         ("Pending", f"{R10} (failed to start: no such command: trian.py; restart 1 of 10)"),
         [("Starting", "Starting 1 of 1 workers"),
          ("Pending", "Failed (failed to start: no such command: trian.py); restart 1 of 10 in 10s"),
          ("Pending", f"{R10} (failed to start: no such command: trian.py; restart 1 of 10)")],
         [("WorkerRestarted", "r-0", "Failed (failed to start: no such command: trian.py); restart 1 of 10 in 10s")]),
    Case("fails with its restart budget spent", ("fail", "run_fails"),
         [(1, place(0)), (2, running(0)), (3, exits(0, 3))],
         [("Failed", "Failed (exit code 3); restart budget spent", 0, 0)],
         ("Failed", "Failed (exit code 3); restart budget spent"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Failed", "Failed (exit code 3); restart budget spent")],
         [("RunFailed", "r", "Failed (exit code 3); restart budget spent")], budget=0),
    Case("fails with policy Never", ("fail", "run_fails"), [(1, place(0)), (2, running(0)), (3, exits(0, 1))],
         [("Failed", "Failed (exit code 1)", 0, 0)], ("Failed", "Failed (exit code 1)"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Failed", "Failed (exit code 1)")],
         [("RunFailed", "r", "Failed (exit code 1)")], policy="Never"),
    Case("lost with its machine", ("machine_lost", "restart"), [(1, place(0)), (2, running(0)), (70, machine_lost())],
         [("Pending", f"{R10} (lost with machine gpu-01; restart 1 of 10)", 1, 0)],
         ("Pending", f"{R10} (lost with machine gpu-01; restart 1 of 10)"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Pending", "Failed (lost with machine gpu-01); restart 1 of 10 in 10s"),
          ("Pending", f"{R10} (lost with machine gpu-01; restart 1 of 10)")],
         [("MachineLost", "gpu-01", "machine gpu-01 lost: no heartbeat for 70 s; its workers are handled by their "
                                    "restart policy"),
          ("WorkerRestarted", "r-0", "Failed (lost with machine gpu-01); restart 1 of 10 in 10s")]),
    Case("preempted, then queued again without backoff", ("stop", "run_stops", "preempted", "requeue", "run_waits"),
         [(1, place(0)), (2, running(0)), (3, preempt([0], "big", "Stopping: preempted by big (priority 100)")),
          (4, exits(0, None, 15))],
         [("Pending", "Preempted by big; queued again", 0, 1)],
         ("Pending", "Preempted by higher-priority work (big); waiting to run again"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Stopping", "Stopping: preempted by big (priority 100)"), ("Pending", "Preempted by big; queued again"),
          ("Pending", "Preempted by higher-priority work (big); waiting to run again")],
         [("Preempted", "r", "Stopping: preempted by big (priority 100)")]),
    Case("preempted for another namespace's run, which is never named", ("preempted", "requeue"),
         [(1, place(0)), (2, running(0)), (3, preempt([0], "secret", "Stopping: preempted by a job in another "
                                                                     "namespace")), (4, exits(0, 0))],
         [("Pending", "Preempted by a job in another namespace; queued again", 0, 1)],
         ("Pending", "Preempted by higher-priority work (a job in another namespace); waiting to run again"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Stopping", "Stopping: preempted by a job in another namespace"),
          ("Pending", "Preempted by a job in another namespace; queued again"),
          ("Pending", "Preempted by higher-priority work (a job in another namespace); waiting to run again")],
         [("Preempted", "r", "Stopping: preempted by a job in another namespace")]),
    Case("a gang preempted is not queued again while one of its workers still stops", ("preempted",),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)),
          (3, preempt([0, 1], "big", "Stopping: preempted by big (priority 100)")), (4, exits(0, 0))],
         [("Cancelled", "Preempted by big", 0, 1), ("Stopping", "Stopping: preempted by big (priority 100)", 0, 1)],
         ("Stopping", "Stopping: preempted by big (priority 100)"),
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Stopping", "Stopping: preempted by big (priority 100)")],
         [("Preempted", "r", "Stopping: preempted by big (priority 100)")], n=2),
    Case("a gang preempted is queued again once none of its workers still stops", ("preempted", "requeue"),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)),
          (3, preempt([0, 1], "big", "Stopping: preempted by big (priority 100)")), (4, exits(0, 0)),
          (5, exits(1, None, 9))],
         [("Pending", "Preempted by big; queued again", 0, 1), ("Pending", "Preempted by big; queued again", 0, 1)],
         ("Pending", "Preempted by higher-priority work (big); waiting to run again"),
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Stopping", "Stopping: preempted by big (priority 100)"), ("Pending", "Preempted by big; queued again"),
          ("Pending", "Preempted by higher-priority work (big); waiting to run again")],
         [("Preempted", "r", "Stopping: preempted by big (priority 100)")], n=2),
    Case("deleted while waiting", ("cancel_waiting", "run_cancelled"), [(1, delete())],
         [("Cancelled", "Deleted", 0, 0)], ("Cancelled", "Deleted"),
         [("Stopping", "Deleted by request"), ("Cancelled", "Deleted")]),
    Case("deleted while running", ("stop", "run_stops", "deleted", "run_cancelled"),
         [(1, place(0)), (2, running(0)), (3, delete()), (4, exits(0, None, 15))],
         [("Cancelled", "Deleted", 0, 0)], ("Cancelled", "Deleted"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Stopping", "Deleted by request"), ("Stopping", "Deleting: stopping 1 worker(s)"), ("Cancelled", "Deleted")]),
    Case("deleted after it failed", ("run_cancelled",), [(1, place(0)), (2, exits(0, 1)), (3, delete())],
         [("Failed", "Failed (exit code 1)", 0, 0)], ("Cancelled", "Deleted"),
         [("Starting", "Starting 1 of 1 workers"), ("Failed", "Failed (exit code 1)"),
          ("Stopping", "Deleted by request"), ("Cancelled", "Deleted")],
         [("RunFailed", "r", "Failed (exit code 1)")], policy="Never"),
    Case("stopped at its time limit: fails, not restarted", ("stop", "time_limit", "run_fails"),
         [(1, place(0)), (2, running(0)), (4, stop(0, L.StopKind.TIMELIMIT, "Stopping: time limit of 2s reached")),
          (5, exits(0, None, 15))],
         [("Failed", "Stopped at its time limit (2s); not restarted", 0, 0)],
         ("Failed", "Stopped at its time limit (2s); not restarted"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Stopping", "Stopping: time limit of 2s reached"),
          ("Failed", "Stopped at its time limit (2s); not restarted")],
         [("RunFailed", "r", "Stopped at its time limit (2s); not restarted")], limit=2),
    Case("a gang stops with its worker at the time limit", ("time_limit", "time_limit_gang", "run_fails"),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)),
          (4, stop(0, L.StopKind.TIMELIMIT, "Stopping: time limit of 2s reached")), (5, exits(0, None, 15)),
          (6, exits(1, None, 15))],
         [("Failed", "Stopped at its time limit (2s); not restarted", 0, 0),
          ("Cancelled", "Stopped with its gang at the time limit", 0, 0)],
         ("Failed", "Stopped at its time limit (2s); not restarted"),
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Stopping", "Stopping: time limit of 2s reached"),
          ("Stopping", "Stopped at its time limit (2s); not restarted"),
          ("Failed", "Stopped at its time limit (2s); not restarted")],
         [("RunFailed", "r", "Stopped at its time limit (2s); not restarted")], n=2, limit=2),
    Case("a failed worker restarts its gang", ("restart_gang", "stop", "gang_stopped", "requeue", "run_waits"),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)), (3, exits(1, 2)),
          (4, exits(0, None, 15))],
         [("Pending", "Restarting with its gang", 0, 0), ("Pending", f"{R10} (exit code 2; restart 1 of 3)", 1, 0)],
         ("Pending", "Restarting in 9s (exit code 2; restart 1 of 3)"),  # its mate took a second to stop
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Pending", "Failed (exit code 2); restart 1 of 3 in 10s"),
          ("Stopping", "Stopping: a worker of the gang failed"),
          ("Pending", "Restarting in 9s (exit code 2; restart 1 of 3)")],
         [("WorkerRestarted", "r-1", "Failed (exit code 2); restart 1 of 3 in 10s")], n=2, budget=3),
    Case("a gang restarts its worker that had succeeded", ("succeed", "restart_gang", "requeue"),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)), (3, exits(0, 0)),
          (4, exits(1, 2))],
         [("Pending", "Restarting with its gang", 0, 0), ("Pending", f"{R10} (exit code 2; restart 1 of 3)", 1, 0)],
         ("Pending", f"{R10} (exit code 2; restart 1 of 3)"),
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Pending", "Failed (exit code 2); restart 1 of 3 in 10s"), ("Pending", f"{R10} (exit code 2; restart 1 of 3)")],
         [("WorkerRestarted", "r-1", "Failed (exit code 2); restart 1 of 3 in 10s")], n=2, budget=3),
    Case("a gang whose worker failed for good is stopped, not queued again", ("fail", "gang_stopped", "run_fails"),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)), (3, exits(1, 2)),
          (4, exits(0, None, 15))],
         [("Cancelled", "Stopped: a worker of its gang failed", 0, 0),
          ("Failed", "Failed (exit code 2); restart budget spent", 0, 0)],
         ("Failed", "Failed (exit code 2); restart budget spent"),
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Stopping", "Failed (exit code 2); restart budget spent"),
          ("Failed", "Failed (exit code 2); restart budget spent")],
         [("RunFailed", "r", "Failed (exit code 2); restart budget spent")], n=2, budget=0),
    Case("an independent worker restarts alone", ("restart", "run_runs"),
         [(1, place(0)), (1, place(1, "gpu-02")), (2, running(0)), (2, running(1)), (3, exits(1, 2))],
         [("Running", "Running", 0, 0), ("Pending", f"{R10} (exit code 2; restart 1 of 10)", 1, 0)],
         ("Running", "1 of 2 workers running"),
         [("Starting", "Starting 1 of 2 workers"), ("Running", "1 of 2 workers running"),
          ("Pending", "Failed (exit code 2); restart 1 of 10 in 10s")],
         [("WorkerRestarted", "r-1", "Failed (exit code 2); restart 1 of 10 in 10s")], n=2, start="Independent"),
    Case("lost while stopping for a preemption: queued again, no restart counted", ("preempted", "requeue"),
         [(1, place(0)), (2, running(0)), (3, preempt([0], "big", "Stopping: preempted by big (priority 100)")),
          (70, machine_lost())],
         [("Pending", "Preempted by big; queued again", 0, 1)],
         ("Pending", "Preempted by higher-priority work (big); waiting to run again"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Stopping", "Stopping: preempted by big (priority 100)"), ("Pending", "Preempted by big; queued again"),
          ("Pending", "Preempted by higher-priority work (big); waiting to run again")],
         [("Preempted", "r", "Stopping: preempted by big (priority 100)"),
          ("MachineLost", "gpu-01", "machine gpu-01 lost: no heartbeat for 70 s; its workers are handled by their "
                                    "restart policy")]),
    Case("lost while stopping at its time limit: fails, not restarted", ("time_limit",),
         [(1, place(0)), (2, running(0)), (4, stop(0, "timelimit", "Stopping: time limit of 2s reached")),
          (70, machine_lost())],
         [("Failed", "Stopped at its time limit (2s); not restarted", 0, 0)],
         ("Failed", "Stopped at its time limit (2s); not restarted"),
         [("Starting", "Starting 1 of 1 workers"), ("Running", "1 of 1 workers running"),
          ("Stopping", "Stopping: time limit of 2s reached"),
          ("Failed", "Stopped at its time limit (2s); not restarted")],
         [("MachineLost", "gpu-01", "machine gpu-01 lost: no heartbeat for 70 s; its workers are handled by their "
                                    "restart policy"),
          ("RunFailed", "r", "Stopped at its time limit (2s); not restarted")], limit=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_transition(world, applied, case):
    run = world.run(workers=case.n, policy=case.policy, budget=case.budget, limit=case.limit, start=case.start)
    L.history(world.s, run, "Pending", "Submitted", T0)
    before = len(world.events())
    for dt, step in case.steps:
        step(world, run, T0 + dt)
    world.s.flush()
    got = [(w.state, w.reason, w.restarts, w.preemptions) for w in run.workers]
    assert got == case.workers
    assert (run.state, run.reason) == case.run
    assert world.history(run)[1:] == case.history
    assert world.events()[before:] == case.events
    assert set(case.rules) <= set(applied), f"rules said but not applied: {set(case.rules) - set(applied)}"
    assert run.preemptions == max(w.preemptions for w in run.workers)
    for w in run.workers:  # an active worker holds room on a machine; a waiting one holds none
        assert w.state not in L.ACTIVE or w.machine_id is not None, w.name
        assert w.state != "Pending" or (w.machine_id is None and w.gpu_indices == []), w.name
        # backoff only after a failure that restarts; never after a preemption or with nothing failed
        assert (w.restart_at is not None) == (w.state in ("Pending", "Cancelled") and w.reason.startswith(R10))


def test_every_rule_has_a_case():
    covered = {r for c in CASES for r in c.rules} | set(MACHINE_RULES)
    assert covered == set(L.RULES), f"rules without a case: {set(L.RULES) - covered}"


# ----------------------------------------------------------------------------------------- the table


STATES = {"worker": [None, *L.WorkerState], "run": [None, *L.RunState], "machine": [None, *L.MachineState]}
PAIRS = [(r, s) for r in L.RULES.values() for s in STATES[r.kind]]


@pytest.mark.parametrize(("rule", "state"), PAIRS, ids=[f"{r.name}-from-{s}" for r, s in PAIRS])
def test_the_table_allows_exactly_its_from_states(world, rule, state):
    row = {"worker": lambda: world.run().workers[0], "run": world.run,
           "machine": lambda: world.machines["gpu-01"]}[rule.kind]()
    row.state = state.value if state is not None else None
    if state in rule.before:
        L._move(row, rule.name, "why")
        assert row.state == rule.after and type(row.state) is str  # stored as the plain string
    else:
        with pytest.raises(L.IllegalTransition, match=re.escape(f"{rule.name}: {rule.kind} {row.name} is {state}")):
            L._move(row, rule.name, "why")
        assert row.state == (state.value if state is not None else None)


def test_terminal_states_only_change_by_a_delete():
    ended = {r.name for r in L.RULES.values() if r.kind == "run" and set(r.before) & set(L.RUN_ENDED)}
    assert ended == {"run_cancelled"}
    worker_from_ended = {r.name for r in L.RULES.values() if r.kind == "worker" and set(r.before) & {"Failed"}}
    assert worker_from_ended == set()


def test_a_rule_for_another_kind_of_row_is_refused(world):
    run = world.run()
    with pytest.raises(L.IllegalTransition, match="rule place moves a worker, not a run"):
        L._move(run, "place")


def test_late_or_repeated_events_are_ignored(world, applied):
    """An agent's report can come late or twice; a stop can be asked twice: the table says no, nothing moves."""
    run = world.run()
    w = run.workers[0]
    L.running(world.s, run, w, 1, None, T0)  # a Pending worker reported running: stale
    L.ended(world.s, run, w, 0, None, None, T0)  # a Pending worker reported ended: stale
    assert (w.state, w.reason, w.pid) == ("Pending", "Waiting to be placed", None)
    place(0)(world, run, T0 + 1)
    stop(0, "preempt", "Stopping: preempted by a")(world, run, T0 + 2)
    stop(0, "timelimit", "Stopping: time limit of 2s reached")(world, run, T0 + 3)  # the first stop decides
    assert (w.state, w.stop_kind, w.reason) == ("Stopping", "preempt", "Stopping: preempted by a")
    exits(0, 0)(world, run, T0 + 4)
    exits(0, 0)(world, run, T0 + 5)  # twice
    assert (w.state, w.reason, w.restarts) == ("Pending", "Preempted by higher-priority work; queued again", 0)
    with pytest.raises(L.IllegalTransition, match="place: worker r-0 is Starting"):
        place(0)(world, run, T0 + 6)
        place(0)(world, run, T0 + 7)


def test_a_completed_run_cannot_run_again(world):
    run = world.run()
    for dt, step in [(1, place(0)), (2, running(0)), (3, exits(0, 0))]:
        step(world, run, T0 + dt)
    assert run.state == "Completed"
    run.workers[0].state = "Running"  # what no rule does: the table refuses what it would mean for the run
    with pytest.raises(L.IllegalTransition, match="run_runs: run r is Completed"):
        L.refresh_run(world.s, run, T0 + 4)


def test_pid_and_environment_are_noted_only_for_a_worker_holding_room(world):
    run = world.run()
    w = run.workers[0]
    L.process_seen(w, 77, "process")
    assert w.pid is None
    place(0)(world, run, T0)
    L.process_seen(w, 77, "process (unshare)")
    assert (w.state, w.pid, w.environment) == ("Starting", 77, "process (unshare)")
    L.process_seen(w, None, None)  # a report without them keeps what was known
    assert (w.pid, w.environment) == (77, "process (unshare)")


def test_scheduler_notes_quota_once_and_why_not_only_while_waiting(world):
    run = world.run()
    L.note_quota(world.s, run, "Waits for its namespace's quota", T0)
    L.note_quota(world.s, run, "Waits for its namespace's quota", T0 + 1)
    world.s.flush()
    assert world.history(run) == [("Pending", "Waits for its namespace's quota")]
    assert world.events()[-1] == ("QuotaReached", "r", "Waits for its namespace's quota")
    assert sum(1 for e in world.events() if e[0] == "QuotaReached") == 1
    L.set_queue_reason(world.s, run, "Queued behind big", T0 + 2)
    assert (run.state, run.reason, run.queue_reason) == ("Pending", "Queued behind big", "Queued behind big")
    L.set_why_not(run.workers[0], [["gpu-01", "too few free GPUs"]])
    assert run.workers[0].why_not == [["gpu-01", "too few free GPUs"]]
    place(0)(world, run, T0 + 3)
    assert run.workers[0].why_not == [] and run.quota_noted is False
    L.set_why_not(run.workers[0], [["gpu-01", "stale"]])
    assert run.workers[0].why_not == []


# ------------------------------------------------------------------------------------------- machines

MACHINE_RULES = ("machine_joins", "machine_heartbeats", "machine_returns", "machine_lost")


def test_machine_joins_heartbeats_is_lost_and_returns(session, applied):
    org = Org(name="o")
    session.add(org)
    session.flush()
    c = Cluster(org_id=org.id, name="main")
    session.add(c)
    session.flush()
    m, changed = L.machine_registered(session, None, c, "gpu-09", T0)
    assert (m.state, m.last_heartbeat, changed) == ("Ready", T0, True)
    m2, changed = L.machine_registered(session, m, c, "gpu-09", T0 + 1)
    assert (m2 is m, m.state, changed) == (True, "Ready", False)
    assert L.machine_heartbeat(session, m, T0 + 2) is False
    L.machine_lost(session, m, [], T0 + 80)
    assert m.state == "Lost"
    with pytest.raises(L.IllegalTransition, match="machine_lost: machine gpu-09 is Lost"):
        L.machine_lost(session, m, [], T0 + 81)
    assert L.machine_heartbeat(session, m, T0 + 90) is True
    assert (m.state, m.last_heartbeat) == ("Ready", T0 + 90)
    L.machine_lost(session, m, [], T0 + 200)
    m3, changed = L.machine_registered(session, m, c, "gpu-09", T0 + 210)
    assert (m3.state, changed) == ("Ready", True)
    session.flush()
    assert [(e.kind, e.message) for e in session.scalars(select(Event).order_by(Event.id))] == [
        ("MachineJoined", "machine gpu-09 joined cluster main"),
        ("MachineLost", "machine gpu-09 lost: no heartbeat for 78 s; its workers are handled by their restart policy"),
        ("MachineReturned", "machine gpu-09 heartbeats again"),
        ("MachineLost", "machine gpu-09 lost: no heartbeat for 110 s; its workers are handled by their restart "
                        "policy"),
        ("MachineReturned", "machine gpu-09 is back in cluster main"),
    ]
    assert set(MACHINE_RULES) <= set(applied)


def test_the_loop_loses_a_silent_machine_with_its_workers(world):
    run = world.run()
    place(0)(world, run, T0)
    running(0)(world, run, T0 + 1)
    for m in world.machines.values():
        m.last_heartbeat = T0
    world.s.flush()
    assert loop.detect_lost_machines(world.s, T0 + 60) == set()
    touched = loop.detect_lost_machines(world.s, T0 + 61)
    assert touched == {world.machines["gpu-01"].id, world.machines["gpu-02"].id}
    assert [m.state for m in world.machines.values()] == ["Lost", "Lost"]
    w = run.workers[0]
    assert (w.state, w.reason, w.restarts) == ("Pending", f"{R10} (lost with machine gpu-01; restart 1 of 10)", 1)


def test_the_loop_stops_a_worker_at_its_time_limit(world):
    run = world.run(limit=120)
    place(0)(world, run, T0)
    running(0)(world, run, T0 + 5)
    world.s.flush()
    assert loop.enforce_time_limits(world.s, T0 + 124) == set()
    assert loop.enforce_time_limits(world.s, T0 + 125) == {world.machines["gpu-01"].id}
    w = run.workers[0]
    assert (w.state, w.stop_kind, w.reason) == ("Stopping", "timelimit", "Stopping: time limit of 2m reached")
    assert (run.state, run.reason) == ("Stopping", "Stopping: time limit of 2m reached")
