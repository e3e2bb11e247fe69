"""Pools, GPU models and reservations in the pure scheduler: what a user sees (reasons, why-not lines, starts,
stops), then properties over random snapshots with reservations and a random `now`."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from astraeus.scheduler import NodeSelection, Pool, Reservation, StopUnit, Workspace, plan

from .builders import HOUR, NOW, WS_A, WS_B, cluster, machine, started, started_names, stopped_names
from .test_properties import SETTINGS, SPACES, snapshots

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
# NOW is 2026-10-01 12:00 UTC; a window starting an hour later shows as 13:00.
AT_13 = "2026-10-01 13:00 UTC"
RESERVED = "machine is reserved for another namespace"
RESERVED_TIMED = f"{RESERVED} from {AT_13}: the run's time limit does not end it by then"
RESERVED_UNTIMED = f"{RESERVED} from {AT_13}: a run without a time limit cannot use it before then"
WAITS_RESERVED = "Waits for machines reserved for another namespace"


def lines(p, worker: str) -> dict[str, str]:
    return dict(p.why_not[worker])


def machines_of(p, run: str) -> list[str]:
    s = started(p, run)
    return [] if s is None else [pl.machine for pl in s.placements]


def gpu_cluster():
    """a1 (A100), h1 (H100), c1 (no GPUs); pool a100 = a1, pool h100 = h1."""
    return (cluster(machine("a1", model=A100), machine("h1", model=H100), machine("c1", gpus=0))
            .pool("a100", "a1").pool("h100", "h1"))


# -------------------------------------------------------------------------------------------------- pools

POOL_CASES = [
    pytest.param(gpu_cluster().running("busy", gpus=8, on="a1").waiting("r", gpus=1, pools=("a100",)),
                 None, "h1", "machine is not in the run's pools (a100)", id="run-pool-only-its-machines"),
    pytest.param(gpu_cluster().waiting("r", gpus=8, pools=("h100",)), "h1", None, None, id="run-pool-started"),
    pytest.param(gpu_cluster().running("a", gpus=8, on="a1").running("h", gpus=8, on="h1")
                 .waiting("r", gpus=1, pools=("a100", "h100")),
                 None, "c1", "machine is not in the run's pools (a100, h100)", id="run-pools-two-names"),
    pytest.param(gpu_cluster().workspace(WS_A, pools=("h100",)).waiting("r", gpus=1),
                 "h1", None, None, id="namespace-pool-started-there"),
    pytest.param(gpu_cluster().workspace(WS_A, pools=("h100",)).running("h", gpus=8, on="h1").waiting("r", gpus=1),
                 None, "a1", "machine is not in the namespace's pools", id="namespace-pool-only-its-machines"),
    pytest.param(gpu_cluster().workspace(WS_A, pools=("a100",)).running("a", gpus=8, on="a1")
                 .waiting("r", gpus=1, pools=("h100",)),
                 None, "h1", "machine is not in the namespace's pools", id="run-pool-outside-namespace-pools"),
    pytest.param(gpu_cluster().waiting("r", gpus=1, model="h100"), "h1", None, None, id="gpu-model-substring"),
    pytest.param(gpu_cluster().waiting("r", gpus=1, model="A100"), "a1", None, None, id="gpu-model-any-case"),
    pytest.param(gpu_cluster().running("a", gpus=8, on="a1").waiting("r", gpus=1, model="a100"),
                 None, "h1", f"machine's GPUs are {H100}, not a100", id="gpu-model-mismatch"),
    pytest.param(gpu_cluster().running("a", gpus=8, on="a1").running("h", gpus=8, on="h1")
                 .waiting("r", gpus=1, model="a100"),
                 None, "c1", "machine has no GPUs, not a100", id="gpu-model-machine-without-gpus"),
    pytest.param(cluster(machine("x1", gpus=2), machine("a1", model=A100)).running("a", gpus=8, on="a1")
                 .waiting("r", gpus=1, model="a100"),
                 None, "x1", "machine has no GPUs, not a100", id="gpu-model-machine-without-model"),
]


@pytest.mark.parametrize("builder, where, machine_name, line", POOL_CASES)
def test_pools_and_gpu_models(builder, where, machine_name, line):
    p = plan(builder.build(), NOW)
    if where is not None:
        assert machines_of(p, "r") == [where]
    else:
        assert started_names(p) == []
        assert lines(p, "r-0")[machine_name] == line


NEVER_CASES = [
    pytest.param(gpu_cluster().pool("empty-ish", "gone").waiting("r", pools=("empty-ish",)),
                 "Cannot run on this cluster: no machine in its pools", id="run-pools-hold-no-machine"),
    pytest.param(cluster(machine("a1", schedulable=False), machine("b1")).pool("a100", "a1")
                 .waiting("r", pools=("a100",)),
                 "Cannot run on this cluster: no machine in its pools", id="run-pools-hold-no-schedulable-machine"),
    pytest.param(gpu_cluster().workspace(WS_A, pools=("nothing",)).waiting("r"),
                 "Cannot run on this cluster: no machine the namespace's pools hold", id="namespace-pools-empty"),
    pytest.param(gpu_cluster().workspace(WS_A, pools=("a100",)).waiting("r", pools=("h100",)),
                 "Cannot run on this cluster: no machine the namespace's pools hold",
                 id="run-pools-and-namespace-pools-disjoint"),
    pytest.param(gpu_cluster().waiting("r", model="b200"),
                 "Cannot run on this cluster: no machine has b200 GPUs", id="gpu-model-nowhere"),
    pytest.param(gpu_cluster().waiting("r", pools=("h100",), model="a100"),
                 "Cannot run on this cluster: no machine has a100 GPUs", id="gpu-model-not-in-its-pools"),
    pytest.param(gpu_cluster().waiting("r", gpus=16, pools=("a100",)),
                 "Cannot run on this cluster: asks for 16 GPUs on one machine; the largest machine it may use has 8",
                 id="too-big-for-its-pools"),
]


@pytest.mark.parametrize("builder, reason", NEVER_CASES)
def test_a_run_its_pools_cannot_hold_says_so_and_is_never_the_head(builder, reason):
    p = plan(builder.build(), NOW)
    assert p.reasons["r"] == reason
    assert p.head is None and p.starts == ()


def test_a_pool_name_in_both_lists_is_one_machine_set():
    snap = (gpu_cluster().workspace(WS_A, pools=("a100", "h100"))
            .running("a", gpus=8, on="a1").waiting("r", gpus=1, pools=("a100", "h100")).build())
    assert machines_of(plan(snap, NOW), "r") == ["h1"]


def test_unrestricted_namespace_and_run_use_every_machine():
    snap = (gpu_cluster().running("a", gpus=0, cpu=64, on="a1").running("h", gpus=0, cpu=64, on="h1")
            .waiting("r", gpus=0).build())
    assert machines_of(plan(snap, NOW), "r") == ["c1"]


@pytest.mark.parametrize("namespace_pools", [False, True], ids=["run-pools", "namespace-pools"])
def test_a_pool_redrawn_between_cycles_moves_the_runs_that_name_it(namespace_pools):
    """Cycles that pass the same machines share what the machines decide (the fleet); which machines a pool holds
    is read from each snapshot: a pool an admin redraws takes effect in the next cycle, and an equal one read
    again gives the same answer."""
    builder = gpu_cluster()
    builder = (builder.workspace(WS_A, pools=("a100",)).waiting("r", gpus=1) if namespace_pools
               else builder.waiting("r", gpus=1, pools=("a100",)))
    snap = builder.build()
    assert machines_of(plan(snap, NOW), "r") == ["a1"]
    again = replace(snap, pools=tuple(Pool(p.name, tuple(p.machines)) for p in snap.pools))
    assert again.machines is snap.machines and again.pools is not snap.pools
    assert machines_of(plan(again, NOW), "r") == ["a1"]
    redrawn = replace(snap, pools=(Pool("a100", ("h1",)), Pool("h100", ("a1",))))
    assert machines_of(plan(redrawn, NOW), "r") == ["h1"]


# ------------------------------------------------------------------------------------------ reservations


def two_machines():
    """g1 and g2, 8 GPUs each; 30 s stop grace."""
    return cluster(machine("g1"), machine("g2"))


def no_name_leaks(p, outsider: str, name: str = "launch") -> None:
    """Another namespace's reservation is never named in an outsider's reason or why-not lines."""
    assert name not in p.reasons.get(outsider, "")
    for worker, ls in p.why_not.items():
        if worker.rpartition("-")[0] == outsider:
            assert all(name not in line for _, line in ls)


WINDOW = dict(start=NOW - HOUR, end=NOW + HOUR)  # open now
AHEAD = dict(start=NOW + HOUR, end=NOW + 3 * HOUR)  # opens at 13:00


WINDOW_CASES = [
    # (builder, outsider run placed on, why-not line for g1 when not placed)
    pytest.param(two_machines().reservation("launch", "g1", **WINDOW).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1), None, RESERVED, id="inside-window-outsider-kept-off"),
    pytest.param(two_machines().reservation("launch", "g1", **WINDOW).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1, limit=60), None, RESERVED, id="inside-window-timed-outsider-kept-off"),
    pytest.param(two_machines().reservation("launch", "g1", **WINDOW).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1, ws=WS_B), "g1", None, id="inside-window-insider-placed"),
    pytest.param(two_machines().reservation("launch", "g1", start=NOW - 2 * HOUR, end=NOW)
                 .running("busy", gpus=8, on="g2").waiting("r", gpus=1), "g1", None, id="after-window-free-again"),
    pytest.param(two_machines().reservation("launch", "g1", **AHEAD).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1, limit=HOUR - 30), "g1", None, id="before-window-ends-with-stop-grace"),
    pytest.param(two_machines().reservation("launch", "g1", **AHEAD).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1, limit=HOUR - 29), None, RESERVED_TIMED, id="before-window-ends-too-late"),
    pytest.param(two_machines().reservation("launch", "g1", **AHEAD).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1), None, RESERVED_UNTIMED, id="before-window-no-time-limit"),
    pytest.param(two_machines().reservation("launch", "g1", **AHEAD).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1, ws=WS_B), "g1", None, id="before-window-insider-unrestricted"),
    pytest.param(two_machines().reservation("launch", "g1", start=NOW + HOUR).running("busy", gpus=8, on="g2")
                 .waiting("r", gpus=1), None, RESERVED_UNTIMED, id="before-window-without-end"),
    pytest.param(cluster(machine("g1", grace=600), machine("g2")).reservation("launch", "g1", **AHEAD)
                 .running("busy", gpus=8, on="g2").waiting("r", gpus=1, limit=HOUR - 300),
                 None, RESERVED_TIMED, id="before-window-the-machines-own-stop-grace"),
]


@pytest.mark.parametrize("builder, where, line", WINDOW_CASES)
def test_reservation_windows(builder, where, line):
    p = plan(builder.build(), NOW)
    if where is not None:
        assert machines_of(p, "r") == [where]
    else:
        assert started_names(p) == []
        assert lines(p, "r-0")["g1"] == line
        assert lines(p, "r-0")["g2"].startswith("not enough free GPUs")
    no_name_leaks(p, "r")


def test_a_window_opens_and_closes_as_now_moves():
    snap = (two_machines().reservation("launch", "g1", start=NOW + HOUR, end=NOW + 2 * HOUR)
            .running("busy", gpus=8, on="g2").waiting("r", gpus=1, limit=HOUR).build())
    seen = {}
    for label, now in (("long before", NOW - HOUR), ("too close", NOW), ("inside", NOW + HOUR),
                       ("last second", NOW + 2 * HOUR - 1), ("after", NOW + 2 * HOUR)):
        p = plan(snap, now)
        seen[label] = machines_of(p, "r") or lines(p, "r-0")["g1"]
    assert seen == {
        "long before": ["g1"],
        "too close": RESERVED_TIMED,
        "inside": RESERVED,
        "last second": RESERVED,
        "after": ["g1"],
    }


@pytest.mark.parametrize("limit, reason", [
    pytest.param(20 * 60, "Next to run (priority 0): starts by 2026-10-01 12:30 UTC as running work ends",
                 id="ends-before-the-window-from-when-room-frees"),
    pytest.param(40 * 60, "Next to run (priority 0): starts by 2026-10-01 14:00 UTC as running work ends",
                 id="would-not-end-before-the-window-from-then"),
])
def test_an_outsider_heads_shadow_time_counts_a_reserved_machine_only_while_it_would_end_in_time(limit, reason):
    # g1 frees at 12:30 and is reserved from 13:00; g2 frees at 14:00.
    snap = (two_machines().reservation("launch", "g1", **AHEAD)
            .running("g1-busy", gpus=8, on="g1", started=NOW - HOUR - 30, limit=1.5 * HOUR)
            .running("g2-busy", gpus=8, on="g2", started=NOW - HOUR - 30, limit=3 * HOUR)
            .waiting("r", gpus=8, limit=limit).build())
    p = plan(snap, NOW)
    assert p.head == "r"
    assert p.reasons["r"] == reason


def test_an_outsider_that_only_fits_on_reserved_machines_waits_and_is_never_the_head():
    snap = (cluster(machine("g1"), machine("g2", gpus=2)).reservation("launch", "g1", **WINDOW)
            .waiting("big", gpus=8).waiting("small", gpus=2).build())
    p = plan(snap, NOW)
    assert p.reasons["big"] == WAITS_RESERVED
    assert p.head is None
    assert machines_of(p, "small") == ["g2"]
    assert lines(p, "big-0") == {"g1": RESERVED, "g2": "machine has 2 GPUs, 8 asked"}
    no_name_leaks(p, "big")


def test_a_run_too_big_for_every_machine_still_cannot_run_with_reservations():
    snap = two_machines().reservation("launch", "g1", **WINDOW).waiting("r", gpus=16).build()
    assert plan(snap, NOW).reasons["r"] == (
        "Cannot run on this cluster: asks for 16 GPUs on one machine; the largest machine it may use has 8")


# --------------------------------------------------------------------------------- work stopped at the start


def test_work_of_others_still_there_is_stopped_when_the_window_opens():
    snap = (cluster(machine("g1"), machine("g2"), machine("g3"))
            .reservation("launch", ["g1", "g2"], start=NOW, end=NOW + HOUR)
            .running("outside", gpus=4, on="g1", prio=100)
            .running("gang", gpus=2, on=["g2", "g3"])
            .running("inside", gpus=2, on="g2", ws=WS_B)
            .running("leaving", gpus=2, on="g2", stopping=True)
            .running("elsewhere", gpus=2, on="g3")
            .waiting("b-run", gpus=8, ws=WS_B, names=("g1",))
            .build())
    p = plan(snap, NOW)
    assert p.reservation_stops == (  # in run name order
        StopUnit("gang", ("gang-0", "gang-1"), "launch", "Stopped for reservation launch"),
        StopUnit("outside", ("outside-0",), "launch", "Stopped for reservation launch"),
    )
    assert p.stops == ()
    # Their room is still taken this cycle: the insider waits as the head until the stop grace has run out.
    assert started_names(p) == []
    assert p.head == "b-run"
    assert p.reasons["b-run"] == "Next to run (priority 0): starts by 2026-10-01 12:01 UTC as running work ends"


def test_nothing_is_stopped_before_the_window_or_after_it():
    b = two_machines().running("outside", gpus=4, on="g1")
    for start, end in ((NOW + 1, NOW + HOUR), (NOW - HOUR, NOW)):
        snap = b.reservation("launch", "g1", start=start, end=end).build()
        assert plan(snap, NOW).reservation_stops == ()
        b.reservations.clear()


def test_a_plan_is_made_with_nothing_waiting():
    snap = two_machines().reservation("launch", "g2", start=NOW).running("outside", gpus=1, on="g2").build()
    assert [s.run for s in plan(snap, NOW).reservation_stops] == ["outside"]


# ------------------------------------------------------------------------------------------------ preemption


def test_no_preemption_from_outside_inside_the_window():
    snap = (two_machines().reservation("launch", "g1", **WINDOW)
            .running("b-low", gpus=8, on="g1", prio=-100, ws=WS_B)
            .running("a-low", gpus=8, on="g2", prio=-100)
            .waiting("urgent", gpus=8, prio=100)
            .build())
    p = plan(snap, NOW)
    assert stopped_names(p) == ["a-low"]
    assert p.reasons["urgent"] == "Preempting 1 lower-priority worker(s) of a-low to start"


def test_an_outsider_head_never_preempts_a_gang_with_a_worker_on_reserved_machines():
    snap = (two_machines().reservation("launch", "g1", **WINDOW)
            .running("b-gang", gpus=4, on=["g1", "g2"], prio=-100, ws=WS_B)
            .running("filler", gpus=4, on="g2", prio=100)
            .waiting("urgent", gpus=8, prio=100)
            .build())
    p = plan(snap, NOW)
    assert p.stops == ()
    assert p.head == "urgent"
    no_name_leaks(p, "urgent")


def test_an_outsider_only_fitting_on_reserved_machines_preempts_nothing():
    snap = (cluster(machine("g1")).reservation("launch", "g1", **WINDOW)
            .running("b-low", gpus=8, on="g1", prio=-100, ws=WS_B)
            .waiting("urgent", gpus=8, prio=100)
            .build())
    p = plan(snap, NOW)
    assert p.stops == () and p.head is None
    assert p.reasons["urgent"] == WAITS_RESERVED


def test_inside_the_window_the_reservations_workspaces_preempt_by_priority():
    snap = (cluster(machine("g1")).reservation("launch", "g1", **WINDOW)
            .running("b-low", gpus=8, on="g1", prio=-5, ws=WS_B)
            .waiting("b-high", gpus=8, prio=5, ws=WS_B, reservation="launch")
            .build())
    p = plan(snap, NOW)
    assert stopped_names(p) == ["b-low"]
    assert p.stops[0].reason == "Preempted by higher-priority work (b-high)"


# ----------------------------------------------------------------------------------- a run naming a reservation


def test_a_run_naming_a_future_reservation_waits_for_it_and_is_never_the_head():
    snap = (two_machines().reservation("launch", "g1", **AHEAD)
            .waiting("b-run", gpus=1, ws=WS_B, reservation="launch")
            .waiting("later", gpus=1, ws=WS_B, limit=60)
            .build())
    p = plan(snap, NOW)
    assert p.reasons["b-run"] == f"Waits for reservation launch, which starts at {AT_13}"
    assert p.head is None
    assert "b-run" not in started_names(p) and "later" in started_names(p)


def test_a_run_naming_an_open_reservation_uses_only_its_machines():
    b = two_machines().reservation("launch", "g2", **WINDOW).waiting("b-run", gpus=8, ws=WS_B, reservation="launch")
    assert machines_of(plan(b.build(), NOW), "b-run") == ["g2"]
    snap = (two_machines().reservation("launch", "g2", **WINDOW).running("mine", gpus=8, on="g2", ws=WS_B)
            .waiting("b-run", gpus=8, ws=WS_B, reservation="launch").build())
    p = plan(snap, NOW)
    assert started_names(p) == []
    assert lines(p, "b-run-0")["g1"] == "machine is not in reservation launch"
    assert p.reasons["b-run"] == "Next to run (priority 0): waits for running work to end"


@pytest.mark.parametrize("reservations", [
    pytest.param((), id="deleted"),
    pytest.param((Reservation("launch", ("g1",), (WS_B,), NOW - 2 * HOUR, NOW),), id="ended-now"),
])
def test_a_run_naming_an_ended_reservation_fails(reservations):
    snap = replace(two_machines().waiting("b-run", ws=WS_B, reservation="launch").build(), reservations=reservations)
    p = plan(snap, NOW)
    assert p.fails == {"b-run": "Reservation launch has ended"}
    assert p.starts == () and p.head is None


def test_a_run_naming_another_namespaces_reservation_cannot_run():
    snap = two_machines().reservation("launch", "g1", **WINDOW).waiting("r", reservation="launch").build()
    p = plan(snap, NOW)
    assert p.reasons["r"] == "Cannot run on this cluster: reservation launch is not for this namespace"
    assert p.starts == () and p.head is None


def test_a_reservation_for_two_workspaces_lets_both_in():
    snap = (cluster(machine("g1", gpus=2)).reservation("launch", "g1", ws=(WS_A, WS_B), **WINDOW)
            .waiting("a-run", gpus=1).waiting("b-run", gpus=1, ws=WS_B).build())
    assert sorted(started_names(plan(snap, NOW))) == ["a-run", "b-run"]


# ---------------------------------------------------------------------------------------------- properties


def _open(r: Reservation, now: float) -> bool:
    return r.start <= now and (r.end is None or now < r.end)


@st.composite
def reserved_snapshots(draw):
    snap = draw(snapshots(max_waiting=5))
    snap = replace(snap, machines=tuple(replace(m, gpu_model=draw(st.sampled_from(["", A100, H100])))
                                        for m in snap.machines))
    names = [m.name for m in snap.machines]
    reservations = []
    for k in range(draw(st.integers(0, 3))):
        start = NOW + draw(st.integers(-4, 4)) * HOUR / 2
        reservations.append(Reservation(
            f"res{k}", tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))),
            draw(st.sampled_from([(SPACES[0],), (SPACES[1],), (SPACES[1],), SPACES])),
            start, draw(st.sampled_from([None, start + HOUR, start + 3 * HOUR])),
        ))
    pools = (Pool("p0", tuple(names[: len(names) // 2 + 1])), Pool("p1", tuple(names[len(names) // 2:])))
    spaces = tuple(replace(ws, pools=draw(st.sampled_from([None, None, ("p0",), ("p1",), ("p0", "p1")])))
                   for ws in snap.workspaces)
    waiting = []
    for r in snap.waiting:
        sel = NodeSelection(
            pools=draw(st.sampled_from([(), (), ("p0",), ("p1",)])),
            gpu_model=draw(st.sampled_from([None, None, "a100", "H100"])),
            reservation=draw(st.sampled_from([None] * 4 + [x.name for x in reservations])),
        )
        waiting.append(replace(r, node_selection=sel))
    now = NOW + draw(st.integers(-4, 8)) * HOUR / 4
    return replace(snap, reservations=tuple(reservations), pools=pools, workspaces=spaces,
                   waiting=tuple(waiting)), now


def _machine_sets(snap):
    pools = {p.name: set(p.machines) for p in snap.pools}
    spaces: dict[str, Workspace] = {ws.id: ws for ws in snap.workspaces}
    return pools, spaces


@SETTINGS
@given(reserved_snapshots())
def test_nothing_from_outside_starts_on_reserved_machines_inside_the_window(case):
    snap, now = case
    p = plan(snap, now)
    runs = {r.name: r for r in snap.waiting}
    grace = {m.name: m.stop_grace_seconds for m in snap.machines}
    pools, spaces = _machine_sets(snap)
    for s in p.starts:
        run = runs[s.run]
        for pl in s.placements:
            for r in snap.reservations:
                if pl.machine not in r.machines or run.workspace in r.workspaces:
                    continue
                # (a) never inside the window
                assert not _open(r, now), f"{s.run} started on {pl.machine} inside {r.name}"
                # (c) before it only when its time limit and the stop grace end it by the start
                if now < r.start:
                    tl = run.time_limit_seconds
                    assert tl is not None and now + tl + grace[pl.machine] <= r.start
            # pools: the run's and the workspace's
            if run.node_selection.pools:
                assert any(pl.machine in pools[n] for n in run.node_selection.pools)
            model = run.node_selection.gpu_model
            if model is not None:
                m = next(m for m in snap.machines if m.name == pl.machine)
                assert m.gpus and model.lower() in m.gpu_model.lower()
            ws_pools = spaces[run.workspace].pools
            if ws_pools is not None:
                assert any(pl.machine in pools[n] for n in ws_pools)
            if run.node_selection.reservation is not None:
                named = next(r for r in snap.reservations if r.name == run.node_selection.reservation)
                assert pl.machine in named.machines and _open(named, now)


@SETTINGS
@given(reserved_snapshots())
def test_outsiders_work_on_reserved_machines_inside_the_window_is_stopping(case):
    snap, now = case
    p = plan(snap, now)
    stopped = {(s.run, s.workers) for s in p.reservation_stops}
    for r in snap.reservations:
        if not _open(r, now):
            continue
        for u in snap.running:
            if u.workspace in r.workspaces or not any(w.machine in r.machines for w in u.workers):
                continue
            # (b) every outsider unit there is stopping, or stopped now for a reservation
            assert u.stopping or (u.run, tuple(w.name for w in u.workers)) in stopped
    for s in p.reservation_stops:
        assert s.reason == f"Stopped for reservation {s.preempted_by}"
    # Nothing is stopped twice, and work stopped for a reservation is no head's victim.
    keys = [(s.run, s.workers) for s in p.reservation_stops + p.stops]
    assert len(keys) == len(set(keys))


@SETTINGS
@given(reserved_snapshots())
def test_no_victim_of_an_outsider_on_machines_reserved_now(case):
    snap, now = case
    p = plan(snap, now)
    if not p.stops:
        return
    head = next(r for r in snap.waiting if r.name == p.head)
    units = {(u.run, tuple(w.name for w in u.workers)): u for u in snap.running}
    for s in p.stops:
        u = units[s.run, s.workers]
        for r in snap.reservations:
            if _open(r, now) and head.workspace not in r.workspaces:
                assert not any(w.machine in r.machines for w in u.workers)


@SETTINGS
@given(reserved_snapshots(), st.randoms(use_true_random=False))
def test_same_snapshot_and_time_same_plan(case, rnd: random.Random):
    snap, now = case
    first = plan(snap, now)
    assert plan(snap, now) == first
    shuffled = replace(
        snap,
        machines=tuple(rnd.sample(snap.machines, len(snap.machines))),
        running=tuple(rnd.sample(snap.running, len(snap.running))),
        waiting=tuple(rnd.sample(snap.waiting, len(snap.waiting))),
        reservations=tuple(rnd.sample(snap.reservations, len(snap.reservations))),
    )
    assert plan(shuffled, now) == first
