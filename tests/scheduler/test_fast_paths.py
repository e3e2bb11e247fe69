"""Each fast path of a cycle gives the plan of its plain path (issue 43).

A cycle has four fast paths (`cycle.Paths`), each with a plain reference it must agree with exactly:
  batch          runs behind the head settled in bulk by the queue (`Cycle.settle`) / one run at a time;
  keep_settled   a start keeps the outcomes settled for a workspace without a quota / every start forgets them;
  settle_gangs   a gang behind the head is settled from its outcome like a one-worker run / it is placed again;
  from_template  why-not lines of restricted runs laid over the per-shape template / made machine by machine;
and share_index (issue 46): a fractional worker's GPU found through the cluster's share index / every machine scored.
Plans are compared whole: starts, stops, head, shadow time, reasons, why-not lines, quota notes (in order), fails
and reservation stops, over random queues with gangs, priorities, fair share weights, quotas, pools, reservations,
job arrays, dependencies, excluded machines and runs already partly running.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astraeus.scheduler import (
    Dependency,
    Machine,
    NodeSelection,
    PlacedWorker,
    Pool,
    Quota,
    Reservation,
    RunningUnit,
    Snapshot,
    WaitingRun,
    WorkerRequest,
    Workspace,
)
from astraeus.scheduler.cycle import FAST, PLAIN, Paths, plan
from astraeus.scheduler.fragments import POLICIES
from astraeus.scheduler.gpushare import SHARING
from astraeus.scheduler.topology import BLOCK

from .builders import GIB, HOUR, NOW
from .test_constraint_index import INDEX_MODES, set_index_mode
from .test_constraint_index import snapshots as restricted_snapshots

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPACES = ("ws-aaaaaaaaaaaa", "ws-bbbbbbbbbbbb", "ws-cccccccccccc", "ws-dddddddddddd")
SWITCHES = ("batch", "keep_settled", "settle_gangs", "from_template")


@st.composite
def queues(draw, extras: bool = True) -> Snapshot:
    """A few machines, running work, and many waiting runs in workspaces with and without quotas and weights,
    sharing a handful of selection objects (the fast paths key on them), with ties in submission time. With
    `extras`, some snapshots also have pools, reservations (open, ahead, for one workspace or two), job arrays,
    dependencies, excluded machines, and other queue orders (FIFO, no fair share); these take runs off the
    fast paths, which must hand them back to the plain path at their place in the queue."""
    n = draw(st.integers(1, 8))
    machines = tuple(
        Machine(f"m{i:02d}", draw(st.sampled_from([2, 4, 8])), 32, 256 * GIB,
                labels=(("zone", draw(st.sampled_from(["z1", "z2"]))),),
                stop_grace_seconds=draw(st.sampled_from([0.0, 30.0])), schedulable=draw(st.integers(0, 6)) > 0,
                gpu_model=draw(st.sampled_from(["NVIDIA A100", "NVIDIA H100"])))
        for i in range(n)
    )
    names = [m.name for m in machines]
    units = []
    for k, m in enumerate(machines):
        gpus = draw(st.integers(0, m.gpus))
        if gpus:
            stopping = draw(st.integers(0, 6)) == 0
            units.append(RunningUnit(
                f"w{k:02d}" if draw(st.integers(0, 3)) == 0 else f"u{k}",  # some: a waiting run's other worker
                draw(st.sampled_from(SPACES)), draw(st.integers(-1, 1)), NOW - 3600,
                draw(st.sampled_from([None, HOUR, 4 * HOUR])),
                (PlacedWorker(f"u{k}-0", 0, m.name, tuple(range(gpus)), 4, 16 * GIB),),
                stopping, draw(st.sampled_from([None, "w00", "w01"])) if stopping else None,
                array=draw(st.sampled_from([None, None, "sweep"])),
            ))
    pools: tuple[Pool, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    with_pools = extras and draw(st.integers(0, 3)) == 0
    if with_pools:
        pools = (Pool("p1", tuple(draw(st.lists(st.sampled_from(names), max_size=n, unique=True)))),
                 Pool("p2", tuple(draw(st.lists(st.sampled_from(names), max_size=n, unique=True)))))
    if extras and draw(st.integers(0, 3)) == 0:
        reservations = tuple(
            Reservation(f"r{j}", tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))),
                        tuple(draw(st.lists(st.sampled_from(SPACES), min_size=1, max_size=2, unique=True))),
                        NOW + draw(st.sampled_from([-HOUR, -HOUR, 600.0, 2 * HOUR])),
                        draw(st.sampled_from([None, NOW + 3 * HOUR])))
            for j in range(draw(st.integers(1, 2)))
        )
    spaces = tuple(
        Workspace(ws, ws,
                  Quota(gpus=draw(st.sampled_from([2, 4, 16])), workers=draw(st.sampled_from([None, None, 3])))
                  if draw(st.booleans()) else None,
                  draw(st.sampled_from([1.0, 2.0])),
                  draw(st.sampled_from([None, None, ("p1",), ("p1", "p2")])) if with_pools else None)
        for ws in SPACES
    )
    shared = [NodeSelection(), NodeSelection("Labels", labels=(("zone", "z1"),)),
              NodeSelection("Names", tuple(names[: max(1, n // 2)])), NodeSelection(gpu_model="h100")]
    if with_pools:
        shared.append(NodeSelection(pools=("p2",)))
    if reservations:
        shared.append(NodeSelection(reservation=reservations[0].name))
    runs = []
    for k in range(draw(st.integers(1, 60))):
        count = 1 if draw(st.integers(0, 4)) else draw(st.integers(2, 3))
        gpus = draw(st.sampled_from([1, 1, 2, 4, 8]))
        reqs = tuple(WorkerRequest(i, gpus, 4 * gpus, 16 * GIB * gpus) for i in range(count))
        sel = draw(st.sampled_from(shared)) if draw(st.integers(0, 5)) else NodeSelection()  # a fresh Any too
        run = WaitingRun(
            f"w{k:02d}", draw(st.sampled_from(SPACES)), draw(st.sampled_from([-1, 0, 0, 1])),
            NOW - 1000 + draw(st.integers(0, 20)), reqs, draw(st.sampled_from(["Gang", "Gang", "Independent"])),
            draw(st.sampled_from([None, 600.0, HOUR, 10 * HOUR])), sel,
            quota_noted=draw(st.integers(0, 3)) == 0,
        )
        if extras:
            extra = draw(st.integers(0, 12))
            if extra == 0:
                run = replace(run, excluded_machines=((draw(st.sampled_from(names)), "its drive lives elsewhere"),))
            elif extra == 1:
                run = replace(run, array="sweep", array_max_running=draw(st.integers(1, 3)))
            elif extra == 2:
                state = draw(st.sampled_from(["Running", "Completed", "Failed"]))
                run = replace(run, dependency=Dependency(draw(st.sampled_from(["afterok", "afterany"])),
                                                         (("dep", "dep", state),)))
        runs.append(run)
    order = draw(st.sampled_from(["fair share", "fair share", "fair share", "priority", "fifo"]))
    return Snapshot("c", machines, tuple(units), tuple(runs), spaces,
                    preemption=draw(st.booleans()), backfill=draw(st.integers(0, 3)) > 0,
                    fair_share=order != "priority", fifo=order == "fifo", pools=pools, reservations=reservations,
                    why_not_limit=draw(st.sampled_from([0, 1, 3, None])),
                    why_not_machines=draw(st.sampled_from([100, 100, 3])))


def _off(switch: str) -> Paths:
    return PLAIN if switch == "all" else replace(FAST, **{switch: False})


def test_production_takes_every_fast_path():
    assert FAST == Paths() and all(getattr(FAST, s) for s in (*SWITCHES, "share_index"))
    assert not any(getattr(PLAIN, s) for s in (*SWITCHES, "share_index"))
    assert plan.__defaults__ == (FAST,)


@pytest.mark.parametrize("switch", [*SWITCHES, "all"])
@SETTINGS
@given(snap=queues())
def test_the_fast_path_gives_the_plan_of_the_plain_path(switch, snap):
    fast = plan(snap, NOW)
    plain = plan(snap, NOW, _off(switch))
    assert fast == plain
    assert fast.quota_reached == plain.quota_reached  # the same notes, in the same order


@pytest.mark.parametrize("switch", ["batch", "settle_gangs", "all"])
@SETTINGS
@given(snap=queues(extras=False))
def test_the_fast_path_gives_the_plan_of_the_plain_path_on_plain_queues(switch, snap):
    """Without pools, reservations, arrays or dependencies every run behind the head may be settled in bulk."""
    assert plan(snap, NOW) == plan(snap, NOW, _off(switch))


def test_quota_notes_settled_in_batches_that_interleave_come_in_queue_order():
    """Behind the head, two workspaces at the same share (each with a quota, nothing in use) take turns in the
    queue by submission; the batch path settles each one's runs together, so its notes are put back in queue order
    (`Cycle._notes`), as the plain path makes them one by one."""
    machines = (Machine("m00", 4, 32, 256 * GIB),)
    spaces = (Workspace(SPACES[0], "a", Quota(gpus=2)), Workspace(SPACES[1], "b", Quota(gpus=2)),
              Workspace(SPACES[2], "c"))
    busy = RunningUnit("busy", SPACES[2], 0, NOW - 60, HOUR, (PlacedWorker("busy-0", 0, "m00", (0, 1), 4, GIB),))
    four = (WorkerRequest(0, 4, 1, GIB),)
    head = WaitingRun("head", SPACES[2], 10, NOW - 100, four)
    waiting = [head] + [WaitingRun(f"r{k}", SPACES[k % 2], 0, NOW - 50 + k, four) for k in range(12)]
    snap = Snapshot("c", machines, (busy,), tuple(waiting), spaces, why_not_limit=1)
    fast, plain = plan(snap, NOW), plan(snap, NOW, PLAIN)
    assert fast.head == "head" and not fast.starts
    assert [n.run for n in fast.quota_reached] == [f"r{k}" for k in range(12)]
    assert fast.quota_reached == plain.quota_reached and fast == plain


@SETTINGS
@given(restricted_snapshots())
def test_why_not_lines_of_restricted_runs_equal_the_machine_by_machine_reference(snap):
    """Runs kept from machines by names, labels, pools and GPU models: the lines laid over the per-shape template
    equal the lines made machine by machine, one line per machine and grouped."""
    snap = replace(snap, why_not_limit=None)
    assert plan(snap, NOW) == plan(snap, NOW, replace(FAST, from_template=False))
    grouped = replace(snap, why_not_machines=2)
    assert plan(grouped, NOW) == plan(grouped, NOW, replace(FAST, from_template=False))


@st.composite
def shared_queues(draw) -> Snapshot:
    """`queues` with GPUs shared (issue 46): some one-worker runs ask for a fraction of a GPU, some machines have
    fractional tenants of one or two workspaces on the GPUs the running work leaves free, some are in network
    blocks, and the cluster places by one of the placements and shares by one of the sharing settings."""
    snap = draw(queues())
    used = {w.machine: set(w.gpu_indices) for u in snap.running for w in u.workers}
    machines, units = [], list(snap.running)
    for k, m in enumerate(snap.machines):
        if draw(st.booleans()):
            m = replace(m, labels=m.labels + ((BLOCK, draw(st.sampled_from(["b1", "b2"]))),))
        machines.append(m)
        for g in sorted(set(range(m.gpus)) - used.get(m.name, set())):
            for t in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
                units.append(RunningUnit(
                    f"f{k}-{g}-{t}", draw(st.sampled_from(SPACES[:2])), 0, NOW - 60, None,
                    (PlacedWorker(f"f{k}-{g}-{t}-0", 0, m.name, (g,), 1, GIB, draw(st.sampled_from([250, 300, 500]))),),
                ))
    runs = []
    for run in snap.waiting:
        if len(run.workers) == 1 and draw(st.integers(0, 2)) == 0:
            frac = draw(st.sampled_from([0.25, 0.3, 0.5, 0.75]))
            run = replace(run, workers=(replace(run.workers[0], gpus=frac, cpu_cores=2.0, memory_bytes=8 * GIB),))
        runs.append(run)
    return replace(snap, machines=tuple(machines), running=tuple(units), waiting=tuple(runs),
                   placement=draw(st.sampled_from(POLICIES)), gpu_sharing=draw(st.sampled_from(SHARING)))


@pytest.mark.parametrize("scan_at_most", list(INDEX_MODES.values()), ids=list(INDEX_MODES))
@SETTINGS
@given(snap=shared_queues())
def test_the_share_index_gives_the_plan_of_scoring_every_machine(scan_at_most, snap):
    """Fractional workers placed through the share index (best fit, FGD or spread; sharing in one workspace or
    any) land where scoring every machine puts them, and so does every other run of the plan."""
    with pytest.MonkeyPatch.context() as mp:
        set_index_mode(mp, scan_at_most)
        fast = plan(snap, NOW)
        assert fast == plan(snap, NOW, replace(FAST, share_index=False))
        assert fast == plan(snap, NOW, PLAIN)
