"""What-if: `what_if(snapshot, run, now)` says what the run would do if submitted now, and agrees with the plan the
scheduler makes once it is submitted with nothing else changing."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from astraeus.scheduler import (
    NodeSelection,
    PlacedWorker,
    Placement,
    Quota,
    RunningUnit,
    WaitingRun,
    WorkerRequest,
    answer,
    plan,
    what_if,
)
from astraeus.scheduler.reasons import OTHER_NAMESPACE

from .builders import GIB, HOUR, NOW, WS_A, WS_B, cluster, machine
from .test_pools_reservations import reserved_snapshots
from .test_properties import SETTINGS, SPACES, snapshots


def asked(name: str = "new", gpus: int = 1, workers: int = 1, prio: int = 0, ws: str = WS_A,
          limit: float | None = None, start: str = "Gang", reservation: str | None = None) -> WaitingRun:
    reqs = tuple(WorkerRequest(i, gpus, 1, GIB) for i in range(workers))
    return WaitingRun(name, ws, prio, NOW, reqs, start, limit, NodeSelection(reservation=reservation))


# ------------------------------------------------------------------------------------------------ table


def test_starts_now_with_its_placements():
    snap = cluster(machine("g1"), machine("g2", gpus=4)).running("busy", gpus=2, on="g2").build()
    a = what_if(snap, asked(gpus=2), NOW)
    assert a.outcome == "Starts"
    assert a.placements == (Placement(0, "g2", (2, 3), 1, GIB),)
    assert a.backfilled is False and a.reason == "" and a.victims == ()


def test_starts_backfilled_behind_the_head():
    snap = (cluster(machine("g1"))
            .running("busy", gpus=4, on="g1", limit=2 * HOUR, started=NOW - HOUR)
            .waiting("big", gpus=8).build())
    a = what_if(snap, asked(gpus=2, limit=HOUR / 2), NOW)
    assert a.outcome == "Starts" and a.backfilled is True
    assert [p.machine for p in a.placements] == ["g1"]


def test_preempts_names_its_own_victims_and_hides_others():
    snap = (cluster(machine("g1"), machine("g2"))
            .running("train", gpus=8, on="g1", prio=-10)
            .running("theirs", gpus=8, on="g2", prio=-10, ws=WS_B)
            .build())
    a = what_if(snap, asked(gpus=8, workers=2, prio=10), NOW)
    assert a.outcome == "Preempts"
    assert a.victims == ("train-0", OTHER_NAMESPACE)
    assert a.preempts_workers == 2
    assert a.starts_by == NOW + 30
    assert a.reason.startswith("Preempting 2 lower-priority worker(s) of ")


def test_head_starts_by_the_shadow_time():
    snap = cluster(machine("g1")).running("busy", gpus=8, on="g1", limit=2 * HOUR, started=NOW - HOUR - 30).build()
    a = what_if(snap, asked(gpus=4), NOW)
    assert a.outcome == "Head"
    assert a.starts_by == NOW + HOUR
    assert a.reason == "Next to run (priority 0): starts by 2026-10-01 13:00 UTC as running work ends"
    assert a.why_not == {"new-0": (("g1", "not enough free GPUs: 0 free, 4 asked (8 held by busy at priority 0)"),)}


def test_head_without_a_known_start():
    snap = cluster(machine("g1")).running("busy", gpus=8, on="g1").build()
    a = what_if(snap, asked(gpus=4), NOW)
    assert a.outcome == "Head" and a.starts_by is None
    assert a.reason == "Next to run (priority 0): waits for running work to end"


def test_queued_behind_another_namespaces_head():
    snap = cluster(machine("g1")).running("busy", gpus=8, on="g1").waiting("theirs", gpus=8, ws=WS_B).build()
    a = what_if(snap, asked(gpus=8), NOW)
    assert a.outcome == "Queued"
    assert a.behind == OTHER_NAMESPACE
    assert a.reason == "Queued behind a job in another namespace, which waits for running work to end"


def test_queued_behind_its_own_namespaces_head():
    snap = cluster(machine("g1")).running("busy", gpus=8, on="g1").waiting("mine", gpus=8).build()
    a = what_if(snap, asked(gpus=8), NOW)
    assert (a.outcome, a.behind) == ("Queued", "mine")


@pytest.mark.parametrize("builder, run, outcome, reason", [
    pytest.param(cluster(machine("g1")).workspace(WS_A, Quota(gpus=2)).running("mine", gpus=2, on="g1"),
                 asked(gpus=1), "Waits", "Waits for namespace quota: gpus 2 in use + 1 asked > 2", id="quota"),
    pytest.param(cluster(machine("g1")), asked(gpus=16), "Waits",
                 "Cannot run on this cluster: asks for 16 GPUs on one machine; the largest machine has 8",
                 id="never-fits"),
    pytest.param(cluster(machine("g1")).reservation("launch", "g1", start=NOW + HOUR, ws=WS_A),
                 asked(reservation="launch"), "Waits",
                 "Waits for reservation launch, which starts at 2026-10-01 13:00 UTC", id="reservation-ahead"),
    pytest.param(cluster(machine("g1")), asked(reservation="launch"), "Fails", "Reservation launch has ended",
                 id="reservation-ended"),
    pytest.param(cluster(machine("g1")).reservation("launch", "g1", start=NOW - HOUR), asked(gpus=1), "Waits",
                 "Waits for machines reserved for another namespace", id="only-reserved-machines"),
])
def test_waits_and_fails_with_the_reason_its_status_would_show(builder, run, outcome, reason):
    a = what_if(builder.build(), run, NOW)
    assert (a.outcome, a.reason) == (outcome, reason)
    assert a.placements == () and a.starts_by is None


# ------------------------------------------------------------------------------------------- properties


@st.composite
def new_runs(draw, name: str = "new") -> WaitingRun:
    count = draw(st.integers(1, 2))
    gpus = draw(st.integers(0, 8))
    reqs = tuple(WorkerRequest(i, gpus, draw(st.sampled_from([1, 4])), draw(st.sampled_from([1, 32])) * GIB)
                 for i in range(count))
    return WaitingRun(name, draw(st.sampled_from(SPACES)), draw(st.integers(-2, 3)), NOW, reqs,
                      draw(st.sampled_from(["Gang", "Independent"])),
                      draw(st.sampled_from([None, 600.0, HOUR, 5 * HOUR])))


def _agrees(snap, run, now) -> None:
    a = what_if(snap, run, now)
    after = replace(snap, waiting=snap.waiting + (run,))
    p = plan(after, now)
    start = next((s for s in p.starts if s.run == run.name), None)
    whole = start is not None and len(start.placements) == len(run.workers)
    assert (a.outcome == "Starts") == whole
    if whole:
        assert a.placements == start.placements and a.backfilled == start.backfilled
    assert (a.outcome in ("Preempts", "Head")) == (p.head == run.name)
    assert (a.outcome == "Fails") == (run.name in p.fails)
    if a.outcome == "Preempts":
        mine = [s for s in p.stops if s.preempted_by == run.name]
        assert mine == list(p.stops)
        own = {u.run: u.workspace for u in snap.running}
        names = [w for s in p.stops if own[s.run] == run.workspace for w in s.workers]
        others = [s for s in p.stops if own[s.run] != run.workspace]
        assert list(a.victims) == names + ([OTHER_NAMESPACE] if others else [])
        assert a.preempts_workers == sum(len(s.workers) for s in p.stops)
        assert a.starts_by == p.shadow_time
    elif a.outcome == "Head":
        assert p.stops == () and a.starts_by == p.shadow_time
    if a.outcome == "Queued":
        assert p.reasons[run.name].startswith("Queued behind ")
        head = next(r for r in after.waiting if r.name == p.head)
        assert a.behind == (p.head if head.workspace == run.workspace else OTHER_NAMESPACE)
    elif a.outcome != "Starts":
        assert a.reason == p.reasons.get(run.name, p.fails.get(run.name))
        assert not p.reasons.get(run.name, "").startswith("Queued behind ")
    return a, p


def _apply(snap, p, now):
    """The snapshot once the plan's starts run: each started run (or its started workers) is running."""
    runs = {r.name: r for r in snap.waiting}
    units = list(snap.running)
    waiting = []
    started = {s.run: s for s in p.starts}
    for r in snap.waiting:
        s = started.get(r.name)
        if s is None:
            waiting.append(r)
            continue
        placed = [PlacedWorker(f"{r.name}-{pl.worker_index}", pl.worker_index, pl.machine, pl.gpu_indices,
                               pl.cpu_cores, pl.memory_bytes) for pl in s.placements]
        groups = [placed] if r.start == "Gang" else [[w] for w in placed]
        for g in groups:
            units.append(RunningUnit(r.name, r.workspace, r.priority, now, r.time_limit_seconds, tuple(g)))
        done = {pl.worker_index for pl in s.placements}
        rest = tuple(w for w in runs[r.name].workers if w.index not in done)
        if rest:
            waiting.append(replace(r, workers=rest))
    return replace(snap, running=tuple(units), waiting=tuple(waiting))


@SETTINGS
@given(snapshots(max_waiting=4), new_runs())
def test_what_if_agrees_with_the_plan_once_submitted(snap, run):
    _agrees(snap, run, NOW)


@SETTINGS
@given(reserved_snapshots(), new_runs())
def test_what_if_agrees_with_the_plan_with_pools_and_reservations(case, run):
    snap, now = case
    _agrees(snap, run, now)


@SETTINGS
@given(snapshots(max_waiting=4), new_runs())
def test_a_run_that_starts_is_running_in_the_next_plan(snap, run):
    a, p = _agrees(snap, run, NOW)
    if a.outcome != "Starts":
        return
    nxt = _apply(replace(snap, waiting=snap.waiting + (run,)), p, NOW)
    assert all(r.name != run.name for r in nxt.waiting)
    # Its room is taken: no GPU is given twice on a machine in the next plan.
    gpus = defaultdict(list)
    for u in nxt.running:
        for w in u.workers:
            gpus[w.machine] += w.gpu_indices
    for s in plan(nxt, NOW).starts:
        for pl in s.placements:
            gpus[pl.machine] += pl.gpu_indices
    assert all(len(v) == len(set(v)) for v in gpus.values())


@SETTINGS
@given(snapshots(max_waiting=4), st.randoms(use_true_random=False))
def test_what_if_for_a_waiting_run_is_what_the_plan_does_with_it(snap, rnd: random.Random):
    p = plan(snap, NOW)
    run = rnd.choice(snap.waiting)
    rest = replace(snap, waiting=tuple(r for r in snap.waiting if r.name != run.name))
    assert what_if(rest, run, NOW) == answer(p, snap, run.name, NOW)
