"""Job arrays and dependencies in the pure scheduler: an array never runs more than its `max_running` at once,
and a run whose dependency is not met waits with a reason naming what it waits for (never the head), or fails
with a reason once its dependency can no longer be met."""

from __future__ import annotations

from dataclasses import replace

import pytest

from astraeus.scheduler import Dependency, plan
from astraeus.scheduler.dependencies import verdict

from .builders import NOW, WS_A, WS_B, cluster, machine, started_names


def arrayed(b, array: str, limit: int | None, runs: tuple[str, ...] = (), units: tuple[str, ...] = ()):
    """The builder's waiting runs in `runs` and running units in `units` made runs of job array `array`."""
    b.runs = [replace(r, array=array, array_max_running=limit) if r.name in runs else r for r in b.runs]
    b.units = [replace(u, array=array) if u.run in units else u for u in b.units]
    return b


def depending(b, run: str, dep: Dependency):
    b.runs = [replace(r, dependency=dep) if r.name == run else r for r in b.runs]
    return b


def array_of(n: int, running: int = 0, limit: int = 4, ws: str = WS_A):
    """Job array `train` of n one-GPU runs on a machine with room for all, `running` of them running already."""
    b = cluster(machine("gpu-01", gpus=64))
    for i in range(running):
        b.running(f"train_{i}", ws=ws)
    for i in range(running, n):
        b.waiting(f"train_{i}", ws=ws)
    names = tuple(f"train_{i}" for i in range(n))
    return arrayed(b, "train", limit, names, names)


# ----------------------------------------------------------------------------------------------- arrays


def test_an_array_starts_at_most_its_limit_in_index_order():
    p = plan(array_of(20).build(), NOW)
    assert started_names(p) == ["train_0", "train_1", "train_2", "train_3"]
    for i in range(4, 20):
        assert p.reasons[f"train_{i}"] == "Waiting: 4 of array train are running (at most 4 at once)"
    assert p.head is None  # a run held by its array is never the head: nothing is preempted for it


def test_running_runs_of_the_array_count_against_its_limit():
    p = plan(array_of(20, running=3).build(), NOW)
    assert started_names(p) == ["train_3"]
    assert p.reasons["train_4"] == "Waiting: 4 of array train are running (at most 4 at once)"


def test_a_full_array_starts_nothing_and_a_stopping_run_still_counts():
    b = array_of(6, running=4)
    b.units[0] = replace(b.units[0], stopping=True)
    p = plan(b.build(), NOW)
    assert started_names(p) == []
    assert p.reasons["train_4"] == "Waiting: 4 of array train are running (at most 4 at once)"


def test_an_array_without_a_limit_starts_all_that_fit():
    p = plan(array_of(6, limit=None).build(), NOW)
    assert len(started_names(p)) == 6


def test_the_limit_is_per_workspace_and_other_work_still_starts():
    b = cluster(machine("gpu-01", gpus=64))
    for i in range(3):
        b.waiting(f"train_{i}", ws=WS_A)
    b.waiting("other")
    for i in range(3):
        b.waiting(f"train_{i}", ws=WS_B)
    b.runs = [replace(r, array="train", array_max_running=1) if r.name.startswith("train") else r for r in b.runs]
    p = plan(b.build(), NOW)
    assert sorted(started_names(p)) == ["other", "train_0", "train_0"]


def test_a_started_independent_run_of_the_array_may_place_its_other_workers():
    b = cluster(machine("gpu-01", gpus=1), machine("gpu-02", gpus=1))
    b.running("train_0", on="gpu-01")
    b.waiting("train_0", start="Independent")  # its second worker waits
    b.runs = [replace(r, workers=(replace(r.workers[0], index=1),)) for r in b.runs]
    arrayed(b, "train", 1, ("train_0",), ("train_0",))
    assert started_names(plan(b.build(), NOW)) == ["train_0"]


# ---------------------------------------------------------------------------------------- dependencies

WAITING = [
    (Dependency("afterok", (("prep", "prep", "Running"),)), "Waiting for prep to complete (afterok)"),
    (Dependency("afterok", (("prep", "prep", "Pending"), ("eval", "eval", "Completed"))),
     "Waiting for prep to complete (afterok)"),
    (Dependency("afternotok", (("prep", "prep", "Starting"),)), "Waiting for prep to fail (afternotok)"),
    (Dependency("afterany", (("a", "a", "Running"), ("b", "b", "Pending"))), "Waiting for a, b to end (afterany)"),
    (Dependency("afterok", tuple(("train", f"train_{i}", "Running") for i in range(20))),
     "Waiting for train to complete (afterok)"),
    (Dependency("singleton", (("train", "train_1", "Running"),)), "Waiting for train_1 to end (singleton)"),
]
FAILS = [
    (Dependency("afterok", (("prep", "prep", "Failed"), ("b", "b", "Running"))),
     "prep failed: afterok can no longer be met"),
    (Dependency("afterok", (("prep", "prep", "Cancelled"),)), "prep was cancelled: afterok can no longer be met"),
    (Dependency("afterok", (("train", "train_0", "Completed"), ("train", "train_7", "Failed"))),
     "train_7 failed: afterok can no longer be met"),
    (Dependency("afternotok", (("prep", "prep", "Completed"),)), "prep completed: afternotok can no longer be met"),
]
MET = [
    Dependency("afterok", (("prep", "prep", "Completed"),)),
    Dependency("afternotok", (("prep", "prep", "Failed"), ("b", "b", "Cancelled"))),
    Dependency("afterany", (("a", "a", "Failed"), ("b", "b", "Completed"))),
    Dependency("singleton", ()),
]


@pytest.mark.parametrize(("dep", "reason"), WAITING)
def test_a_run_whose_dependency_is_not_met_waits_and_says_for_what(dep, reason):
    b = depending(cluster(machine("gpu-01", gpus=8)).waiting("after", prio=100).waiting("low", prio=-5), "after",
                  dep)
    p = plan(b.build(), NOW)
    assert started_names(p) == ["low"]  # room it does not take goes to others
    assert p.reasons["after"] == reason
    assert p.head is None and p.fails == {}


@pytest.mark.parametrize(("dep", "reason"), FAILS)
def test_a_run_whose_dependency_can_no_longer_be_met_fails_with_the_reason(dep, reason):
    p = plan(depending(cluster(machine("gpu-01")).waiting("after"), "after", dep).build(), NOW)
    assert started_names(p) == []
    assert p.fails == {"after": reason}
    assert "after" not in p.reasons


@pytest.mark.parametrize("dep", MET)
def test_a_run_whose_dependency_is_met_starts(dep):
    assert verdict(dep) is None
    p = plan(depending(cluster(machine("gpu-01")).waiting("after"), "after", dep).build(), NOW)
    assert started_names(p) == ["after"]


def test_a_high_priority_run_held_by_its_dependency_preempts_nothing():
    b = cluster(machine("gpu-01", gpus=8)).running("low", prio=-100, gpus=8).waiting("after", prio=500, gpus=8)
    p = plan(depending(b, "after", Dependency("afterok", (("prep", "prep", "Running"),))).build(), NOW)
    assert p.stops == () and p.head is None
    assert p.reasons["after"] == "Waiting for prep to complete (afterok)"


def test_many_names_are_cut_short():
    dep = Dependency("afterany", tuple((n, n, "Running") for n in ("a", "b", "c", "d", "e")))
    assert verdict(dep) == ("wait", "Waiting for a, b, c and 2 more to end (afterany)")
