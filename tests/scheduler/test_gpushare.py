"""Issue 46: fractional GPUs in the pure scheduler (tables and hypothesis properties)."""

from __future__ import annotations

from collections import defaultdict

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
    gpushare,
    plan,
)

GIB = 1 << 30
NOW = 1_790_000_000.0
WS_A = "ws-3f9c2a1b7d4e"
WS_B = "ws-8a7b6c5d4e3f"


def machine(name: str = "gpu-01", gpus: int = 8) -> Machine:
    return Machine(name, gpus, 256, 2048 * GIB)


def waiting(name: str, gpus, ws: str = WS_A, prio: int = 0, at: float = 0.0) -> WaitingRun:
    return WaitingRun(name, ws, prio, NOW - 1000 + at, (WorkerRequest(0, gpus, 1.0, GIB),))


def running(name: str, gpu: int, milli: int, ws: str = WS_A, prio: int = 0, machine: str = "gpu-01",
            gpus: tuple[int, ...] | None = None) -> RunningUnit:
    w = PlacedWorker(f"{name}-0", 0, machine, gpus if gpus is not None else (gpu,), 1.0, GIB, milli)
    return RunningUnit(name, ws, prio, NOW - 500, None, (w,))


def snap(machines, run=(), wait=(), quota: Quota | None = None, sharing: str = "workspace") -> Snapshot:
    spaces = (Workspace(WS_A, "a", quota), Workspace(WS_B, "b"))
    return Snapshot("c", tuple(machines), tuple(run), tuple(wait), spaces, gpu_sharing=sharing)


def used_per_gpu(p, s: Snapshot):
    """(machine, gpu) -> thousandths taken by running work and the plan's starts; whole GPUs take FULL."""
    used: dict = defaultdict(int)
    whole: set = set()
    for u in s.running:
        for w in u.workers:
            for g in w.gpu_indices:
                used[w.machine, g] += w.gpu_milli or gpushare.FULL
                if not w.gpu_milli:
                    whole.add((w.machine, g))
    for st_ in p.starts:
        for pl in st_.placements:
            for g in pl.gpu_indices:
                used[pl.machine, g] += pl.gpu_milli or gpushare.FULL
                if not pl.gpu_milli:
                    whole.add((pl.machine, g))
    return used, whole


def test_sixteen_halves_fill_one_eight_gpu_machine():
    s = snap([machine()], wait=[waiting(f"half-{k:02}", 0.5, at=k) for k in range(16)])
    p = plan(s, NOW)
    assert len(p.starts) == 16
    used, _ = used_per_gpu(p, s)
    assert sorted(used.values()) == [1000] * 8
    assert {pl.gpu_milli for st_ in p.starts for pl in st_.placements} == {500}


def test_best_fit_fills_a_shared_gpu_before_an_empty_one():
    s = snap([machine()], run=[running("r1", 3, 250)], wait=[waiting("q", 0.5)])
    (start,) = plan(s, NOW).starts
    assert start.placements[0].gpu_indices == (3,)
    assert start.placements[0].gpu_milli == 500


def test_whole_gpu_run_never_lands_on_a_shared_gpu():
    s = snap([machine(gpus=2)], run=[running("r1", 0, 250)], wait=[waiting("whole", 2)])
    p = plan(s, NOW)
    assert not p.starts
    assert "whole" in p.reasons
    s = snap([machine(gpus=2)], run=[running("r1", 0, 250)], wait=[waiting("whole", 1)])
    (start,) = plan(s, NOW).starts
    assert start.placements[0].gpu_indices == (1,)


def test_other_workspaces_share_a_gpu_only_where_the_cluster_allows():
    run = [running("r1", 0, 500, ws=WS_B)]
    p = plan(snap([machine(gpus=1)], run=run, wait=[waiting("q", 0.5)]), NOW)
    assert not p.starts
    p = plan(snap([machine(gpus=1)], run=run, wait=[waiting("q", 0.5)], sharing="any"), NOW)
    assert p.starts[0].placements[0].gpu_indices == (0,)


def test_quota_counts_fractions():
    s = snap([machine()], run=[running("r1", 0, 500)], wait=[waiting("q", 0.75)], quota=Quota(gpus=1))
    p = plan(s, NOW)
    assert not p.starts
    assert "gpus 0.5 in use + 0.75 asked > 1" in p.reasons["q"]


def test_preemption_frees_every_tenant_of_a_shared_gpu():
    run = [running("low-1", 0, 250, prio=-10), running("low-2", 0, 250, prio=-10), running("low-3", 0, 500, prio=-10)]
    p = plan(snap([machine(gpus=1)], run=run, wait=[waiting("urgent", 1, prio=100)]), NOW)
    assert p.head == "urgent"
    assert sorted(s.run for s in p.stops) == ["low-1", "low-2", "low-3"]


# -------------------------------------------------------------------------------------------- properties

fractions = st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.75, 0.9])
asks = st.one_of(fractions, st.integers(min_value=1, max_value=4))


@st.composite
def clusters(draw):
    machines = [machine(f"gpu-{k:02}", draw(st.integers(1, 4))) for k in range(draw(st.integers(1, 3)))]
    runs = []
    for k in range(draw(st.integers(0, 4))):
        m = draw(st.sampled_from(machines))
        g = draw(st.integers(0, m.gpus - 1))
        runs.append(running(f"r{k}", g, draw(st.sampled_from([100, 250, 500])),
                            ws=draw(st.sampled_from([WS_A, WS_B])), prio=draw(st.integers(-5, 5)), machine=m.name))
    # keep running tenants within capacity
    used: dict = defaultdict(int)
    kept = []
    for r in runs:
        w = r.workers[0]
        if used[w.machine, w.gpu_indices[0]] + w.gpu_milli <= 1000:
            used[w.machine, w.gpu_indices[0]] += w.gpu_milli
            kept.append(r)
    wait = [waiting(f"w{k:02}", draw(asks), ws=draw(st.sampled_from([WS_A, WS_B])), prio=draw(st.integers(-5, 10)),
                    at=k) for k in range(draw(st.integers(1, 12)))]
    return snap(machines, kept, wait, sharing=draw(st.sampled_from(gpushare.SHARING)))


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_no_gpu_is_ever_oversubscribed_and_whole_gpus_are_never_shared(s):
    p = plan(s, NOW)
    used, whole = used_per_gpu(p, s)
    assert all(v <= gpushare.FULL for v in used.values())
    assert all(used[k] == gpushare.FULL for k in whole)
    # plans are deterministic
    again = plan(s, NOW)
    assert again.starts == p.starts and again.stops == p.stops and again.reasons == p.reasons


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_preemption_frees_enough_of_a_shared_gpu(s):
    p = plan(s, NOW)
    head = next((r for r in s.waiting if r.name == p.head), None)
    if head is None or not p.stops:
        return
    stopped = {st_.run for st_ in p.stops}
    left = snap(s.machines, [u for u in s.running if u.run not in stopped], [head], sharing=s.gpu_sharing)
    assert [x.run for x in plan(left, NOW).starts] == [head.name]


@st.composite
def machines_room(draw) -> tuple[int, list[int], dict[int, list]]:
    """(GPUs, whole free GPUs in index order, shared GPUs {gpu: [used, {workspace: tenants}]}) of one machine."""
    n = draw(st.integers(1, 8))
    kinds = draw(st.lists(st.sampled_from(["free", "held", "shared"]), min_size=n, max_size=n))
    whole = [g for g, k in enumerate(kinds) if k == "free"]
    shared = {g: [draw(st.integers(1, 1000)),
                  draw(st.dictionaries(st.sampled_from([WS_A, WS_B]), st.integers(1, 3), min_size=1))]
              for g, k in enumerate(kinds) if k == "shared"}
    return n, whole, shared


@settings(max_examples=300, deadline=None)
@given(st.lists(machines_room(), max_size=5), st.integers(1, 999), st.sampled_from(list(gpushare.SHARING)))
def test_best_fit_gives_the_tightest_gpu_of_the_free_thousandths(rooms, milli, sharing):
    """Best fit over the machines' whole and shared GPUs is the GPU whose `free_milli` room is left smallest by the
    share (ties: machine, then GPU), as FGD's tuple gives each GPU."""
    fits = [(f - milli, i, g) for i, (n, whole, shared) in enumerate(rooms)
            for g, f in enumerate(gpushare.free_milli(n, whole, shared, WS_A, sharing)) if f >= milli]
    want = min(fits)[1:] if fits else None
    cands = [(i, whole, shared) for i, (_, whole, shared) in enumerate(rooms)]
    assert gpushare.best_fit(cands, milli, WS_A, sharing) == want


def test_best_fit_weighs_the_room_free_milli_gives_each_gpu():
    # gpu-0: GPU 0 empty, GPU 1 shared with 300 free; gpu-1: GPU 0 shared with 600 free, GPU 1 held whole
    cands = [(0, [0], {1: [700, {WS_A: 1}]}), (1, [], {0: [400, {WS_A: 1}]})]
    assert gpushare.best_fit(cands, 250, WS_A, "workspace") == (0, 1)
    assert gpushare.best_fit(cands, 350, WS_A, "workspace") == (1, 0)
    assert gpushare.best_fit(cands, 650, WS_A, "workspace") == (0, 0)  # only an empty GPU holds it
    assert gpushare.best_fit([(0, [], {0: [900, {WS_A: 1}]})], 250, WS_A, "workspace") is None
    # another workspace's tenants keep the GPU from it unless the cluster lets any workspace share
    other = [(0, [1], {0: [500, {WS_B: 1}]})]
    assert gpushare.best_fit(other, 250, WS_A, "workspace") == (0, 1)
    assert gpushare.best_fit(other, 250, WS_A, "any") == (0, 0)
    assert gpushare.free_milli(2, [1], {0: [500, {WS_B: 1}]}, WS_A, "workspace") == (0, 1000)
    assert gpushare.free_milli(2, [1], {0: [500, {WS_B: 1}]}, WS_A, "any") == (500, 1000)


def test_a_fractional_head_preempts_lower_priority_work_for_a_gpu():
    run = [running("low", 0, 0, prio=-10, gpus=(0,))]
    p = plan(snap([machine(gpus=1)], run=run, wait=[waiting("urgent-half", 0.5, prio=100)]), NOW)
    assert p.head == "urgent-half" and [s.run for s in p.stops] == ["low"]
    # behind it, nothing takes the GPU held for it
    p = plan(snap([machine(gpus=1)], run=run, wait=[waiting("urgent-half", 0.5, prio=100),
                                                     waiting("later", 0.25, at=5)]), NOW)
    assert not p.starts


def test_tenths_add_up_to_a_whole_quota_exactly():
    run = [running(f"r{k}", 0, 100) for k in range(7)]
    s = snap([machine()], run=run, wait=[waiting("q", 0.3)], quota=Quota(gpus=1))
    assert [x.run for x in plan(s, NOW).starts] == ["q"]
