"""The constraint indexes (issue 19) change no placement.

A run restricted to some machines (names, labels, pools, GPU model) takes its machines from name and label
indexes, and best fit scans free-GPU buckets restricted to them (`Cluster.sub_buckets`, kept on commit) instead
of every bucket with an `in allowed` test or its whole list. These properties hold the fast path to a
straightforward reference: every machine the run may use, in name order, the one with the fewest free GPUs
that still fits (its free room in the view), ties by name; and whole plans equal to those of the plain list scan.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astraeus.scheduler import (
    Machine,
    NodeSelection,
    PlacedWorker,
    Pool,
    RunningUnit,
    Snapshot,
    WaitingRun,
    WorkerRequest,
    Workspace,
    plan,
)
from astraeus.scheduler import cluster as cluster_module
from astraeus.scheduler.cluster import Cluster

from .builders import GIB, HOUR, NOW

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SPACES = ("ws-aaaaaaaaaaaa", "ws-bbbbbbbbbbbb")
MODELS = ("A100", "H100", "")
ZONES = ("z1", "z2")


@st.composite
def selections(draw, names: list[str]) -> NodeSelection:
    mode = draw(st.sampled_from(["Any", "Names", "Labels"]))
    sel = NodeSelection()
    if mode == "Names":
        picked = draw(st.lists(st.sampled_from(names + ["not-a-machine"]), max_size=len(names) + 1))
        sel = NodeSelection("Names", tuple(picked))
    elif mode == "Labels":
        labels = draw(st.lists(st.tuples(st.sampled_from(["zone", "model"]),
                                         st.sampled_from(ZONES + MODELS[:2])), max_size=2))
        sel = NodeSelection("Labels", labels=tuple(labels))
    pools = draw(st.sampled_from([(), ("p1",), ("p2",), ("p1", "p2"), ("nowhere",)]))
    model = draw(st.sampled_from([None, None, "a100", "h1"]))
    return replace(sel, pools=pools, gpu_model=model)


@st.composite
def snapshots(draw, max_machines: int = 12, max_waiting: int = 10) -> Snapshot:
    n = draw(st.integers(1, max_machines))
    order = draw(st.permutations(range(n)))  # machines given in any order: the cluster sorts them by name
    machines = []
    for i in order:
        model = draw(st.sampled_from(MODELS))
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8])) if model else 0
        machines.append(Machine(
            f"m{i:02d}", gpus, draw(st.sampled_from([8, 32])), draw(st.sampled_from([64, 256])) * GIB,
            labels=(("model", model), ("zone", draw(st.sampled_from(ZONES)))),
            stop_grace_seconds=draw(st.sampled_from([0.0, 30.0])), schedulable=draw(st.integers(0, 5)) > 0,
            gpu_model=model,
        ))
    names = sorted(m.name for m in machines)
    free = {m.name: [list(range(m.gpus)), m.cpu_cores, m.memory_bytes] for m in machines}
    units = []
    for k in range(draw(st.integers(0, 2 * n))):
        m = draw(st.sampled_from(names))
        gpus = draw(st.integers(0, 4))
        cpu = draw(st.sampled_from([1, 4, 8]))
        mem = draw(st.sampled_from([1, 16])) * GIB
        if len(free[m][0]) < gpus or free[m][1] < cpu or free[m][2] < mem:
            continue
        take = tuple(free[m][0][:gpus])
        del free[m][0][:gpus]
        free[m][1] -= cpu
        free[m][2] -= mem
        units.append(RunningUnit(
            f"u{k}", draw(st.sampled_from(SPACES)), draw(st.integers(-2, 2)), NOW - draw(st.integers(0, 10)) * 600,
            draw(st.sampled_from([None, HOUR, 2 * HOUR])), (PlacedWorker(f"u{k}-0", 0, m, take, cpu, mem),),
        ))
    pools = (Pool("p1", tuple(draw(st.lists(st.sampled_from(names), max_size=n)))),
             Pool("p2", tuple(draw(st.lists(st.sampled_from(names), max_size=n)))))
    shared = draw(selections(names))  # one selection many runs share, as a trace's gpu_spec does
    runs = []
    for k in range(draw(st.integers(1, max_waiting))):
        count = draw(st.integers(1, 2))
        gpus = draw(st.integers(0, 8))
        reqs = tuple(WorkerRequest(i, gpus, draw(st.sampled_from([1, 4, 16])), draw(st.sampled_from([1, 32])) * GIB)
                     for i in range(count))
        sel = shared if draw(st.booleans()) else draw(selections(names))
        excluded = tuple((x, "its drive lives elsewhere") for x in draw(st.lists(st.sampled_from(names), max_size=2)))
        runs.append(WaitingRun(
            f"w{k}", draw(st.sampled_from(SPACES)), draw(st.integers(-2, 2)), NOW - 1000 + k, reqs,
            draw(st.sampled_from(["Gang", "Independent"])), draw(st.sampled_from([None, 600.0, HOUR])), sel,
            excluded if draw(st.integers(0, 4)) == 0 else (),
        ))
    spaces = tuple(Workspace(ws, ws, pools=draw(st.sampled_from([None, None, ("p1",)]))) for ws in SPACES)
    return Snapshot("c", tuple(machines), tuple(units), tuple(runs), spaces, pools=pools,
                    preemption=draw(st.integers(0, 3)) > 0, backfill=draw(st.integers(0, 3)) > 0)


def reference_allowed(c: Cluster, run: WaitingRun, ws_pools) -> list[int]:
    """Every schedulable machine the run may use, checked one by one with `selected` and the restrictions."""
    excluded = {n for n, _ in run.excluded_machines}
    lines = c._restrictions(run.node_selection, ws_pools, {})
    return [i for i in c.all_schedulable
            if c.names[i] not in excluded and i not in lines and c.selected(run.node_selection, i)]


def reference_best(c: Cluster, shape, allowed_list, avoid, view_b: bool) -> int | None:
    """Fewest free GPUs (in the view) that still fits, ties by name, over every machine it may use."""
    g, cpu, mem = shape
    machines = c.all_schedulable if allowed_list is None else allowed_list
    fits = []
    for i in machines:
        if i in avoid:
            continue
        fg, fc, fm = c.room(i, view_b)
        if fg >= g and fc >= cpu and fm >= mem:
            fits.append((fg, c.names[i], i))
    return min(fits)[2] if fits else None


# How a restricted run scans (cluster.SCAN_AT_MOST, WIDE, PROBE_AT_MOST): always in buckets of its own list; a
# list of any size in the cluster's buckets, each machine checked; the same, taking buckets of its own at the
# first machine outside it (`Cluster.narrow`); and the defaults (a list up to 32 scanned whole).
INDEX_MODES = {
    "always-indexed": (0, 0, 64),
    "wide-in-the-cluster's-buckets": (0, 10**6, 64),
    "wide-then-narrowed": (0, 10**6, 0),
    "lists-up-to-32": (32, cluster_module.WIDE, cluster_module.PROBE_AT_MOST),
}


def set_index_mode(monkeypatch, mode: tuple[int, int, int]) -> None:
    for name, value in zip(("SCAN_AT_MOST", "WIDE", "PROBE_AT_MOST"), mode, strict=True):
        monkeypatch.setattr(cluster_module, name, value)


@pytest.fixture(params=list(INDEX_MODES.values()), ids=list(INDEX_MODES))
def scan_at_most(request, monkeypatch):
    set_index_mode(monkeypatch, request.param)
    return request.param


def _ws_pools(snap: Snapshot, ws: str):
    return next((w.pools for w in snap.workspaces if w.id == ws), None)


@SETTINGS
@given(snapshots(), st.data())
def test_best_fit_over_the_index_is_the_reference_best_fit(scan_at_most, snap, data):
    c = Cluster(snap, NOW)
    # Some room of schedulable machines held for a head (view B), as after find_head; `ending` gives some back.
    held = data.draw(st.lists(st.sampled_from(c.all_schedulable), max_size=3, unique=True)) if c.all_schedulable else []
    for i in held:
        c.held[i] = [data.draw(st.integers(0, 8)), data.draw(st.sampled_from([0.0, 4.0])), 0]
        if data.draw(st.booleans()):
            c.ending[i] = [data.draw(st.integers(0, 2)), 0.0, 0]
    for run in snap.waiting * 2:  # twice: the second round finds the restricted buckets made and kept
        ws_pools = _ws_pools(snap, run.workspace)
        key, allowed, allowed_list = c.allowed(run, ws_pools)
        want = reference_allowed(c, run, ws_pools)
        assert (allowed_list if allowed_list is not None else c.all_schedulable) == want
        assert allowed is None or allowed == frozenset(want)
        avoid = frozenset(data.draw(st.lists(st.sampled_from(range(len(c.machines))), max_size=2)))
        view_b = data.draw(st.booleans())
        w = run.workers[0]
        s = (w.gpus, w.cpu_cores, w.memory_bytes)
        got = c.best_machine(s, allowed, allowed_list, avoid, view_b)
        assert got == reference_best(c, s, allowed_list, avoid, view_b)
        if got is not None:
            c.commit(run.name, run.workspace, run.priority, [(w, got)], data.draw(st.booleans()))
    # Every restricted bucket still holds exactly its machines, by their free GPUs now, in name order (once the
    # buckets of full machines, appended to by `commit`, are sorted: as best fit and the why-not lines read them).
    c.tidy()
    for allowed_list, sub in c._sub.values():
        want = [[] for _ in sub]
        for i in allowed_list:
            want[len(c.free_g[i])].append(i)
        assert sub == want


def _plan_with(monkeypatch, snap: Snapshot, mode: tuple[int, int, int]):
    set_index_mode(monkeypatch, mode)
    return plan(snap, NOW)


@SETTINGS
@given(snapshots())
def test_plans_over_the_index_equal_plans_of_the_plain_scan(snap):
    with pytest.MonkeyPatch.context() as mp:
        reference = _plan_with(mp, snap, (10**9, 0, 0))  # every restricted run scans its whole list of machines
        for mode in (*INDEX_MODES.values(), (4, 2, 1)):
            assert _plan_with(mp, snap, mode) == reference


@SETTINGS
@given(snapshots(), snapshots())
def test_what_the_fleet_keeps_from_one_plan_changes_no_later_plan(snap, other):
    """Plans that pass the same machines keep what the machines alone decide (a selection's machines and why-not
    lines, whether a shape could ever fit) in their Fleet: another queue planned on them first changes nothing."""
    fresh = plan(replace(snap, machines=tuple(list(snap.machines))), NOW)  # a tuple of its own: nothing kept
    plan(replace(other, machines=snap.machines), NOW)  # fills what the fleet of snap.machines keeps
    assert plan(snap, NOW) == fresh
    assert plan(snap, NOW) == fresh  # and again, from what snap's own plan kept


@SETTINGS
@given(snapshots(), snapshots())
def test_what_the_fleet_keeps_from_one_plan_changes_no_later_plan_without_pools(snap, other):
    """The same, with no pools and no excluded machines: every restricted run takes what the fleet keeps."""
    def plain(x: Snapshot) -> Snapshot:
        runs = tuple(replace(r, node_selection=replace(r.node_selection, pools=()), excluded_machines=())
                     for r in x.waiting)
        return replace(x, waiting=runs, workspaces=tuple(replace(w, pools=None) for w in x.workspaces))

    snap, other = plain(snap), plain(other)
    fresh = plan(replace(snap, machines=tuple(list(snap.machines))), NOW)
    plan(replace(other, machines=snap.machines), NOW)
    assert plan(snap, NOW) == fresh


def test_a_selection_kept_by_the_fleet_is_told_from_another_of_the_same_mode():
    """Two plans on the same machines, one asking for A100s and one for H100s (and by label): each gets its own
    machines and why-not lines, as on machines given afresh."""
    machines = tuple(Machine(f"m{i}", 4, 32, 256 * GIB, labels=(("model", model),), gpu_model=model)
                     for i, model in enumerate(["A100", "H100", "A100", "H100"]))
    ws = (Workspace(SPACES[0], SPACES[0]),)

    def queue(model: str) -> Snapshot:
        runs = (WaitingRun("by-model", SPACES[0], 0, NOW - 10, (WorkerRequest(0, 4, 1, GIB),), "Gang", None,
                           NodeSelection(gpu_model=model)),
                WaitingRun("by-label", SPACES[0], 0, NOW - 5, (WorkerRequest(0, 4, 1, GIB),), "Gang", None,
                           NodeSelection("Labels", labels=(("model", model),))),
                WaitingRun("too-big", SPACES[0], 0, NOW, (WorkerRequest(0, 8, 1, GIB),), "Gang", None,
                           NodeSelection(gpu_model=model)))
        return Snapshot("c", machines, (), runs, ws)

    for first, then in (("A100", "H100"), ("H100", "A100")):
        fresh = plan(replace(queue(then), machines=tuple(list(machines))), NOW)
        plan(queue(first), NOW)
        got = plan(queue(then), NOW)
        assert got == fresh
        placed = {s.run: s.placements[0].machine for s in got.starts}
        assert {machines[int(m[1:])].gpu_model for m in placed.values()} == {then}, placed


def test_many_runs_sharing_a_selection_keep_best_fit_on_a_large_cluster():
    """48 machines of two models; 300 one-GPU runs restricted to one model by names, labels or GPU model: each
    starts on that model's fullest machine that fits, ties by name (the restricted buckets follow each start)."""
    machines = tuple(
        Machine(f"n{i:03d}", 8, 64, 512 * GIB, labels=(("model", "H100" if i % 3 else "A100"),),
                gpu_model="NVIDIA H100" if i % 3 else "NVIDIA A100")
        for i in range(48)
    )
    h100 = tuple(m.name for m in machines if m.gpu_model == "NVIDIA H100")
    sels = [NodeSelection("Names", h100), NodeSelection("Labels", labels=(("model", "H100"),)),
            NodeSelection(gpu_model="h100")]
    runs = tuple(WaitingRun(f"r{k:03d}", SPACES[0], 0, NOW - 1000 + k, (WorkerRequest(0, 1, 1, GIB),), "Gang",
                            None, sels[k % 3]) for k in range(300))
    snap = Snapshot("c", machines, (), runs, (Workspace(SPACES[0], "a"),), why_not_limit=0)
    p = plan(snap, NOW)
    placed = [s.placements[0].machine for s in p.starts]
    # Best fit fills one machine before the next, in name order, over the 32 H100 machines' 256 GPUs.
    assert len(placed) == 256
    assert placed == [name for name in h100 for _ in range(8)]
    assert set(p.reasons) == {f"r{k:03d}" for k in range(256, 300)}


def test_a_worker_of_no_gpu_goes_to_the_first_full_machine_by_name_whichever_filled_first():
    """Machines that run out of free GPUs are kept apart unsorted while the cycle starts runs (`Cluster.tidy`): a
    worker that asks for no GPU still gets the fullest machine that fits, ties by name, though m03 filled before
    m00 did."""
    machines = tuple(Machine(f"m{i:02d}", 2, 8, 64 * GIB) for i in range(4))
    units = (RunningUnit("busy", SPACES[0], 0, NOW - 60, HOUR, (PlacedWorker("busy-0", 0, "m03", (0,), 1, GIB),)),)
    runs = (
        WaitingRun("one-gpu", SPACES[0], 0, NOW - 30, (WorkerRequest(0, 1, 1, GIB),)),  # best fit: m03 (1 free)
        WaitingRun("two-gpus", SPACES[0], 0, NOW - 20, (WorkerRequest(0, 2, 1, GIB),)),  # m00 (first with 2)
        WaitingRun("no-gpu", SPACES[0], 0, NOW - 10, (WorkerRequest(0, 0, 1, GIB),)),
    )
    p = plan(Snapshot("c", machines, units, runs, (Workspace(SPACES[0], "a"),)), NOW)
    assert {s.run: s.placements[0].machine for s in p.starts} == {"one-gpu": "m03", "two-gpus": "m00",
                                                                   "no-gpu": "m00"}
