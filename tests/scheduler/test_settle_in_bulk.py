"""Runs behind the head settled in bulk (issue 19) change no plan.

Once the head is known and the runs that get why-not lines are found, the queue hands a workspace's next runs
to `Cycle.settle`, which gives every run whose outcome its workspace recorded already (same shape, machines and
view) its reason and quota note at once, without the fair-share heap, and stops at the first other run. Plans
must be those of handling runs one at a time: the same starts, stops, head, reasons, why-not lines, and quota
notes in the same order (notes made in bulk are put back in queue order by the runs' order key). A start keeps the outcomes settled for
a workspace without a quota (none of them reads its usage): the reference forgets them at every start. A gang
behind the head whose workspace saw the same gang (sorted shapes, machines, view) wait is settled from its outcome
too: the reference places it again.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from astraeus.scheduler import (
    Machine,
    PlacedWorker,
    Quota,
    RunningUnit,
    Snapshot,
    WaitingRun,
    WorkerRequest,
    Workspace,
    plan,
)
from astraeus.scheduler import cycle as cycle_module
from astraeus.scheduler.cycle import FAST
from astraeus.scheduler.queue import _sort_by_submission

from .builders import GIB, HOUR, NOW

SPACES = ("ws-aaaaaaaaaaaa", "ws-bbbbbbbbbbbb", "ws-cccccccccccc", "ws-dddddddddddd")


def _plans(snap: Snapshot):
    """The plan with runs settled in bulk, and the one-run-at-a-time reference (every start forgets its
    workspace's outcomes, a gang behind the head is placed again). Random queues: test_fast_paths.py."""
    return plan(snap, NOW), plan(snap, NOW, replace(FAST, batch=False, keep_settled=False, settle_gangs=False))


def test_a_long_queue_behind_the_head_is_settled_in_bulk_with_its_notes_in_queue_order(monkeypatch):
    """Two workspaces whose quota allows no GPU and one without a quota, 300 one-GPU runs interleaved by fair
    share on a full machine: the head waits, every other run waits behind it or beyond its quota; the notes of
    both quota workspaces' runs come interleaved, in queue order."""
    machines = (Machine("m00", 8, 64, 512 * GIB),)
    units = (RunningUnit("busy", SPACES[3], 0, NOW - 60, HOUR,
                         (PlacedWorker("busy-0", 0, "m00", tuple(range(8)), 8, 64 * GIB),)),)
    spaces = (Workspace(SPACES[0], "a", Quota(gpus=0)), Workspace(SPACES[1], "b", Quota(gpus=0), 2.0),
              Workspace(SPACES[2], "c"), Workspace(SPACES[3], "d"))
    runs = tuple(
        WaitingRun(f"r{k:03d}", SPACES[k % 3], 0, NOW - 1000 + k // 2, (WorkerRequest(0, 1, 1, GIB),))
        for k in range(300)
    )
    snap = Snapshot("c", machines, units, runs, spaces, why_not_limit=2)
    taken = []
    settle = cycle_module.Cycle.settle

    def counting(self, lst, share):
        before = len(lst)
        found = settle(self, lst, share)
        taken.append(before - len(lst))
        return found

    monkeypatch.setattr(cycle_module.Cycle, "settle", counting)
    bulk, one_by_one = _plans(snap)
    assert sum(taken) > 200  # most of the queue was settled in bulk
    assert bulk == one_by_one
    assert [q.run for q in bulk.quota_reached] == [f"r{k:03d}" for k in range(300) if k % 3 != 2]
    assert bulk.head is not None and len(bulk.reasons) == 300


def test_bulk_settling_keeps_plans_of_runs_with_dependencies_arrays_and_exclusions():
    """Runs that are never settled in bulk (a dependency, a job array, excluded machines, several workers)
    stop a bulk at their place in the queue and are handled one at a time."""
    machines = (Machine("m00", 4, 64, 512 * GIB), Machine("m01", 4, 64, 512 * GIB))
    spaces = (Workspace(SPACES[0], "a", Quota(gpus=2)), Workspace(SPACES[1], "b"))
    base = WaitingRun("x", SPACES[0], 0, NOW, (WorkerRequest(0, 4, 1, GIB),))
    runs = []
    for k in range(80):
        r = replace(base, name=f"r{k:02d}", workspace=SPACES[k % 2], submitted_at=NOW - 1000 + k,
                    workers=(WorkerRequest(0, 1 + k % 4, 1, GIB),))
        if k % 7 == 3:
            r = replace(r, excluded_machines=(("m00", "its drive lives elsewhere"),))
        if k % 11 == 5:
            r = replace(r, array="sweep", array_max_running=1)
        if k % 13 == 6:
            r = replace(r, workers=(WorkerRequest(0, 2, 1, GIB), WorkerRequest(1, 2, 1, GIB)), start="Independent")
        runs.append(r)
    snap = Snapshot("c", machines, (), tuple(runs), spaces, why_not_limit=1)
    bulk, one_by_one = _plans(snap)
    assert bulk == one_by_one
    assert bulk.quota_reached == one_by_one.quota_reached


def _the_schedulers(o) -> bool:
    """Is o an object of the scheduler's classes (a cycle, its cluster, the batch), or a method bound to one?"""
    of = o.__self__ if isinstance(o, types.MethodType) else o
    return type(of).__module__.startswith("astraeus.scheduler")


def cycle_snapshot() -> Snapshot:
    """A full machine, a workspace whose quota allows no GPU and one without a quota: runs settled in bulk."""
    machines = (Machine("m00", 8, 64, 512 * GIB),)
    units = (RunningUnit("busy", SPACES[3], 0, NOW - 60, HOUR,
                         (PlacedWorker("busy-0", 0, "m00", tuple(range(8)), 8, 64 * GIB),)),)
    spaces = (Workspace(SPACES[0], "a", Quota(gpus=0)), Workspace(SPACES[2], "c"))
    runs = tuple(WaitingRun(f"r{k:03d}", SPACES[k % 2 * 2], 0, NOW - 1000 + k, (WorkerRequest(0, 1, 1, GIB),))
                 for k in range(50))
    return Snapshot("c", machines, units, runs, spaces, why_not_limit=1)


def garbage_of_one_plan(saved: bool = False) -> int:
    """How many objects the cyclic collector finds once a plan of `cycle_snapshot` is dropped (kept in gc.garbage
    when `saved`)."""
    snap = cycle_snapshot()
    plan(snap, NOW)  # a first plan in this process may import or cache what later ones reuse: not the cycle's garbage
    gc.collect()
    if saved:
        gc.set_debug(gc.DEBUG_SAVEALL)
    p = plan(snap, NOW)
    assert len(p.reasons) == 50
    del p
    return gc.collect()


def test_a_cycle_leaves_no_reference_cycle_behind():
    """plan() pauses the cyclic garbage collector: what a cycle made must be freed when its plan is dropped
    (the bulk settling's hook refers back to the cycle; it is let go at the end). In a process of its own nothing
    at all is left; in this one, threads an earlier test left running may leave garbage of theirs, but none of it
    is the scheduler's."""
    alone = subprocess.run(
        [sys.executable, "-c", "from tests.scheduler.test_settle_in_bulk import garbage_of_one_plan as g; print(g())"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip() == "0"
    try:
        garbage_of_one_plan(saved=True)
        assert [o for o in gc.garbage if _the_schedulers(o)] == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abcd")), max_size=40))
def test_the_queue_sorts_a_workspaces_runs_by_submission_then_name(items):
    """`_sort_by_submission` (the queue's sort, by keys read as the runs were grouped) gives the order of a plain sort
    by (submitted_at, name), with ties of submission time or not."""
    runs = [WaitingRun(f"{name}{k}", "ws", 0, float(t), ()) for k, (t, name) in enumerate(items)]
    expected = sorted(runs, key=lambda r: (r.submitted_at, r.name))
    got = list(runs)
    _sort_by_submission(got, [r.submitted_at for r in got])
    assert got == expected
