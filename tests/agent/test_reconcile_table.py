"""The agent's reconciler (astraeus.agent.reconcile), pure: one row per case, the desired assignments and the
workers' states here → the actions, in order."""

from __future__ import annotations

import pytest

from astraeus import protocol as P
from astraeus.agent.reconcile import (
    NOT_ASSIGNED,
    Actual,
    Adopt,
    Forget,
    ReleaseDrives,
    Report,
    Start,
    Stop,
    StoppedBeforeStart,
    actions,
    adoptions,
    drives_needed,
    state_of,
)
from astraeus.agent.runtime.base import EXITED, RUNNING, START_FAILED, WorkerStatus

NOW = 1000.0
GRACE = 30.0
NS = "ws-0123456789ab"
UID = "0123456789abcdef0123456789abcdef"
W = f"{NS}.train-0.{UID}"  # a worker's identity
V = f"{NS}.eval-0.{UID}"


def want(worker: str = W, attempt: int = 1, desired: str = "Running", stop_reason: str | None = None) -> P.Assignment:
    return P.Assignment(worker=worker, attempt=attempt, command="python", desired=desired, stop_reason=stop_reason,
                        env={"ASTRAEUS_JOB_NAME": f"{NS}.{worker.split('.')[1].rsplit('-', 1)[0]}"})


def running(worker: str = W, attempt: int = 1, stopping: bool = False) -> WorkerStatus:
    return WorkerStatus(worker, attempt, RUNNING, pid=4242, stopping=stopping)


def ended(worker: str = W, attempt: int = 1, state: str = EXITED) -> WorkerStatus:
    return WorkerStatus(worker, attempt, state, exit_code=0, finished_at=NOW - 5)


def desired(*assignments: P.Assignment) -> dict:
    return {a.key: a for a in assignments}


def actual(*workers: WorkerStatus, starting=(), reported=(), drives_mounted=False, seen=True) -> Actual:
    """The workers here; `seen`: their states are as last reported (no Report action)."""
    ws = {st.key: st for st in workers}
    return Actual(ws, frozenset(starting), frozenset(reported), {k: state_of(st) for k, st in ws.items()} if seen
                  else {}, drives_mounted)


CASES = [
    # (case, desired, actual, expected actions)
    ("no answer yet: nothing started nor stopped", None, actual(running()), []),
    ("nothing assigned, nothing here", desired(), actual(), []),
    ("assigned, not here: started", desired(want()), actual(), [Start(want())]),
    ("assigned and being started: left to its start", desired(want()), actual(starting=[(W, 1)]), []),
    ("assigned and running: nothing", desired(want()), actual(running()), []),
    ("assigned, its start failed: not started again", desired(want()), actual(ended(state=START_FAILED)), []),
    ("a new attempt waits while the older one still runs", desired(want(attempt=2)), actual(running()),
     [Stop(W, 1, GRACE, NOT_ASSIGNED)]),
    ("a new attempt waits while the older one is stopping", desired(want(attempt=2)),
     actual(running(stopping=True)), []),
    ("a new attempt starts once the older one ended", desired(want(attempt=2)), actual(ended(), reported=[(W, 1)]),
     [Start(want(attempt=2)), Forget(W, 1)]),
    ("two attempts of one worker assigned: one started", desired(want(attempt=2), want(attempt=3)), actual(),
     [Start(want(attempt=2))]),
    ("two workers assigned: both started, in order", desired(want(), want(V)), actual(),
     [Start(want()), Start(want(V))]),
    ("desired Stopped, running: stopped with its reason", desired(want(desired="Stopped", stop_reason="Preempted")),
     actual(running()), [Stop(W, 1, GRACE, "Preempted", why="Preempted")]),
    ("desired Stopped without a reason", desired(want(desired="Stopped")), actual(running()),
     [Stop(W, 1, GRACE, "stopped by the control plane", why="desired Stopped")]),
    ("desired Stopped, already stopping: nothing", desired(want(desired="Stopped")),
     actual(running(stopping=True)), []),
    ("desired Stopped, ended: nothing", desired(want(desired="Stopped")), actual(ended()), []),
    ("desired Stopped, never started: it ended so", desired(want(desired="Stopped")), actual(),
     [StoppedBeforeStart(W, 1, NOW)]),
    ("desired Stopped while being started: left to its start", desired(want(desired="Stopped")),
     actual(starting=[(W, 1)]), []),
    ("running, no longer assigned: stopped", desired(), actual(running()), [Stop(W, 1, GRACE, NOT_ASSIGNED)]),
    ("unassigned and stopping: nothing", desired(), actual(running(stopping=True)), []),
    ("unassigned while being started: left to its start", desired(), actual(running(), starting=[(W, 1)]), []),
    ("ended, unassigned, not reported yet: kept", desired(), actual(ended()), []),
    ("ended, unassigned and reported: forgotten", desired(), actual(ended(), reported=[(W, 1)]), [Forget(W, 1)]),
    ("ended, reported, still assigned: kept", desired(want()), actual(ended(), reported=[(W, 1)]), []),
    ("drives from other machines mounted: released where unneeded", desired(want()),
     actual(running(), drives_mounted=True), [ReleaseDrives()]),
    ("no answer yet, drives mounted: nothing released", None, actual(running(), drives_mounted=True), []),
    ("a state not reported yet: a report", desired(want()), actual(running(), seen=False),
     [Report((((W, 1), state_of(running())),))]),
    ("no answer yet, a state not reported: a report all the same", None, actual(running(), seen=False),
     [Report((((W, 1), state_of(running())),))]),
    ("stopped, forgotten and reported in one pass, in order", desired(want(V, desired="Stopped")),
     actual(running(V), ended(), reported=[(W, 1)], drives_mounted=True, seen=False),
     [Stop(V, 1, GRACE, "stopped by the control plane", why="desired Stopped"), Forget(W, 1), ReleaseDrives(),
      Report((((V, 1), state_of(running(V))), ((W, 1), state_of(ended()))))]),
]


@pytest.mark.parametrize(("desired_", "actual_", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_actions(desired_, actual_, expected):
    assert actions(desired_, actual_, NOW, GRACE) == expected


OLD = f"{NS}.train-0"  # the identity an older agent named the worker by

ADOPTIONS = [
    ("an older agent's attempt, assigned under its new identity: adopted", desired(want()), actual(running(OLD)),
     [Adopt(OLD, 1, W)]),
    ("an ended one too (its end is reported under the new identity)", desired(want()), actual(ended(OLD)),
     [Adopt(OLD, 1, W)]),
    ("one asked to stop is not (a deleted run's)", desired(want()), actual(running(OLD, stopping=True)), []),
    ("already here under the new identity: nothing", desired(want()), actual(running(), running(OLD)), []),
    ("another attempt: nothing", desired(want(attempt=2)), actual(running(OLD)), []),
    ("no answer yet: nothing", None, actual(running(OLD)), []),
    ("nothing older here", desired(want()), actual(), []),
]


@pytest.mark.parametrize(("desired_", "actual_", "expected"), [c[1:] for c in ADOPTIONS],
                         ids=[c[0] for c in ADOPTIONS])
def test_adoptions(desired_, actual_, expected):
    assert adoptions(desired_, actual_.workers) == expected


def test_drives_needed_are_those_of_workers_starting_or_running():
    ds = desired(want(), want(V), want(f"{NS}.idle-0.{UID}"))
    targets = {W: {"/mnt/a"}, V: {"/mnt/b", "/mnt/c"}, f"{NS}.idle-0.{UID}": {"/mnt/d"}}
    assert drives_needed(ds, frozenset({(V, 1)}), {(W, 1)}, lambda a: targets[a.worker]) == {"/mnt/a", "/mnt/b",
                                                                                            "/mnt/c"}
