"""Properties over random small clusters and queues (hypothesis)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
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

from .builders import GIB, HOUR, NOW

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPACES = ("ws-aaaaaaaaaaaa", "ws-bbbbbbbbbbbb")


@st.composite
def snapshots(draw, max_waiting: int = 6, allow_stopping: bool = True, quotas: bool = True) -> Snapshot:
    n = draw(st.integers(1, 4))
    machines = tuple(
        Machine(f"m{i}", draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([8, 32])),
                draw(st.sampled_from([64, 256])) * GIB, schedulable=draw(st.booleans()) or i == 0,
                stop_grace_seconds=draw(st.sampled_from([0.0, 30.0, 30.0, 300.0])))
        for i in range(n)
    )
    free = {m.name: [list(range(m.gpus)), m.cpu_cores, m.memory_bytes] for m in machines}
    units = []
    for k in range(draw(st.integers(0, 9))):
        width = draw(st.integers(1, 2))
        names = draw(st.permutations([m.name for m in machines]))[:width]
        gpus = draw(st.integers(0, 4))
        cpu = draw(st.sampled_from([1, 4, 8]))
        mem = draw(st.sampled_from([1, 16])) * GIB
        if any(len(free[m][0]) < gpus or free[m][1] < cpu or free[m][2] < mem for m in names):
            continue
        workers = []
        for j, m in enumerate(names):
            take = tuple(free[m][0][:gpus])
            del free[m][0][:gpus]
            free[m][1] -= cpu
            free[m][2] -= mem
            workers.append(PlacedWorker(f"u{k}-{j}", j, m, take, cpu, mem))
        stopping = allow_stopping and draw(st.integers(0, 5)) == 0
        units.append(RunningUnit(
            f"u{k}", draw(st.sampled_from(SPACES)), draw(st.integers(-2, 2)), NOW - draw(st.integers(0, 10)) * 600,
            draw(st.sampled_from([None, HOUR, 2 * HOUR, 3 * HOUR])), tuple(workers), stopping,
            draw(st.sampled_from([None, "w0", "w1"])) if stopping else None,
        ))
    runs = []
    for k in range(draw(st.integers(1, max_waiting))):
        count = draw(st.integers(1, 2))
        gpus = draw(st.integers(0, 8))
        reqs = tuple(WorkerRequest(i, gpus, draw(st.sampled_from([1, 4, 16])), draw(st.sampled_from([1, 32])) * GIB)
                     for i in range(count))
        runs.append(WaitingRun(
            f"w{k}", draw(st.sampled_from(SPACES)), draw(st.integers(-2, 2)), NOW - 1000 + k, reqs,
            draw(st.sampled_from(["Gang", "Independent"])), draw(st.sampled_from([None, 600.0, HOUR, 5 * HOUR])),
        ))
    spaces = tuple(
        Workspace(ws, ws, Quota(gpus=draw(st.sampled_from([None, 4, 8, 16])), workers=draw(st.sampled_from([None, 3])))
                  if quotas and draw(st.booleans()) else None)
        for ws in SPACES
    )
    return Snapshot("c", machines, tuple(units), tuple(runs), spaces,
                    preemption=draw(st.integers(0, 3)) > 0, backfill=draw(st.integers(0, 3)) > 0)


def _units(snap: Snapshot) -> dict[str, RunningUnit]:
    return {u.run: u for u in snap.running}


@SETTINGS
@given(snapshots())
def test_never_preempts_equal_or_higher_priority(snap):
    p = plan(snap, NOW)
    if not p.stops:
        return
    head = next(r for r in snap.waiting if r.name == p.head)
    units = _units(snap)
    for s in p.stops:
        assert units[s.run].priority < head.priority
        assert not units[s.run].stopping
        assert s.preempted_by == head.name


@SETTINGS
@given(snapshots())
def test_never_exceeds_a_machine_or_a_quota(snap):
    p = plan(snap, NOW)
    machines = {m.name: m for m in snap.machines}
    gpus: dict[str, list[int]] = defaultdict(list)
    cpu: dict[str, float] = defaultdict(float)
    mem: dict[str, int] = defaultdict(int)
    for u in snap.running:
        for w in u.workers:
            gpus[w.machine] += w.gpu_indices
            cpu[w.machine] += w.cpu_cores
            mem[w.machine] += w.memory_bytes
    runs = {r.name: r for r in snap.waiting}
    use: dict[str, list] = defaultdict(lambda: [0, 0])
    for u in snap.running:
        use[u.workspace][0] += sum(len(w.gpu_indices) for w in u.workers)
        use[u.workspace][1] += len(u.workers)
    added: dict[str, list] = defaultdict(lambda: [0, 0])
    for s in p.starts:
        run = runs[s.run]
        asked = {w.index: w for w in run.workers}
        used_here = set()
        for pl in s.placements:
            m = machines[pl.machine]
            assert m.schedulable
            assert len(pl.gpu_indices) == asked[pl.worker_index].gpus
            assert pl.cpu_cores == asked[pl.worker_index].cpu_cores
            gpus[pl.machine] += pl.gpu_indices
            cpu[pl.machine] += pl.cpu_cores
            mem[pl.machine] += pl.memory_bytes
            assert pl.machine not in used_here, "two workers of one run on one machine"
            used_here.add(pl.machine)
            added[run.workspace][0] += pl.gpu_indices.__len__()
            added[run.workspace][1] += 1
        if run.start == "Gang":
            assert len(s.placements) == len(run.workers), "a gang starts whole"
    for name, m in machines.items():
        assert len(gpus[name]) == len(set(gpus[name])), "a GPU index used twice"
        assert all(0 <= g < m.gpus for g in gpus[name])
        assert cpu[name] <= m.cpu_cores and mem[name] <= m.memory_bytes
    for ws in snap.workspaces:
        if ws.quota is None or ws.id not in added:
            continue
        if ws.quota.gpus is not None:
            assert use[ws.id][0] + added[ws.id][0] <= ws.quota.gpus
        if ws.quota.workers is not None:
            assert use[ws.id][1] + added[ws.id][1] <= ws.quota.workers


def _fits(machines, room, workers) -> bool:
    """Brute force: can the workers go on distinct machines with this room?"""
    def go(k, used):
        if k == len(workers):
            return True
        w = workers[k]
        for m in machines:
            if m.name in used:
                continue
            g, c, b = room[m.name]
            if g >= w.gpus and c >= w.cpu_cores and b >= w.memory_bytes and go(k + 1, used | {m.name}):
                return True
        return False
    return go(0, frozenset())


def _room_at(snap: Snapshot, p, t: float, head: WaitingRun):
    """Free room at time t, if running work and this plan's starts are stopped at their time limits (and gone
    once their machines' stop grace has run out)."""
    allowed = [m for m in snap.machines if m.schedulable]
    room = {m.name: [m.gpus, m.cpu_cores, m.memory_bytes] for m in snap.machines}
    grace_of = {m.name: m.stop_grace_seconds for m in snap.machines}
    stopped = {s.run for s in p.stops}
    for u in snap.running:
        if u.stopping or u.run in stopped:
            continue  # gone within the stop grace
        grace = max(grace_of[w.machine] for w in u.workers)
        if u.time_limit_seconds is not None and u.started_at + u.time_limit_seconds + grace <= t:
            continue
        for w in u.workers:
            room[w.machine][0] -= len(w.gpu_indices)
            room[w.machine][1] -= w.cpu_cores
            room[w.machine][2] -= w.memory_bytes
    runs = {r.name: r for r in snap.waiting}
    for s in p.starts:
        tl = runs[s.run].time_limit_seconds
        grace = max(grace_of[pl.machine] for pl in s.placements)
        if tl is not None and NOW + tl + grace <= t:
            continue
        for pl in s.placements:
            room[pl.machine][0] -= len(pl.gpu_indices)
            room[pl.machine][1] -= pl.cpu_cores
            room[pl.machine][2] -= pl.memory_bytes
    return allowed, room


@SETTINGS
@given(snapshots())
def test_backfill_never_delays_the_head_past_its_shadow_time(snap):
    p = plan(snap, NOW)
    if p.head is None or p.shadow_time is None:
        return
    head = next(r for r in snap.waiting if r.name == p.head)
    placed = {pl.worker_index for s in p.starts if s.run == head.name for pl in s.placements}
    waiting = [w for w in head.workers if w.index not in placed]
    allowed, room = _room_at(snap, p, p.shadow_time, head)
    avoid = {pl.machine for s in p.starts if s.run == head.name for pl in s.placements}
    avoid |= {w.machine for u in snap.running if u.run == head.name for w in u.workers}
    assert _fits([m for m in allowed if m.name not in avoid], room, waiting)


@SETTINGS
@given(snapshots(max_waiting=1, allow_stopping=False, quotas=False))
def test_the_victim_set_is_minimal(snap):
    p = plan(snap, NOW)
    if not p.stops:
        return
    head = snap.waiting[0]
    victims = {s.run for s in p.stops}

    def placed(pl) -> int:  # how many of the head's workers a plan starts (an Independent run may start some)
        return sum(len(s.placements) for s in pl.starts if s.run == head.name)

    # With all victims gone the whole head fits ...
    rest = tuple(u for u in snap.running if u.run not in victims)
    assert placed(plan(replace(snap, running=rest, preemption=False), NOW)) == len(head.workers)
    # ... and keeping any one of them, it does not.
    for v in victims:
        kept = tuple(u for u in snap.running if u.run not in victims or u.run == v)
        again = plan(replace(snap, running=kept, preemption=False), NOW)
        assert placed(again) < len(head.workers), f"victim {v} was not needed"


@SETTINGS
@given(snapshots(), st.randoms(use_true_random=False))
def test_same_snapshot_same_plan(snap, rnd: random.Random):
    first = plan(snap, NOW)
    assert plan(snap, NOW) == first
    shuffled = replace(
        snap,
        machines=tuple(rnd.sample(snap.machines, len(snap.machines))),
        running=tuple(rnd.sample(snap.running, len(snap.running))),
        waiting=tuple(rnd.sample(snap.waiting, len(snap.waiting))),
    )
    assert plan(shuffled, NOW) == first


@SETTINGS
@given(snapshots())
def test_every_waiting_run_gets_a_reason(snap):
    p = plan(snap, NOW)
    started = {s.run: len(s.placements) for s in p.starts}
    for r in snap.waiting:
        if started.get(r.name, 0) < len(r.workers):
            assert r.name in p.reasons
