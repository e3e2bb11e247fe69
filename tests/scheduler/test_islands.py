"""NVLink islands in placement (issue 46): a whole-GPU worker's GPUs lie inside one island of its machine; a
worker no island has room for waits (or goes elsewhere) with a why-not line that says so; a machine that reports
no islands is one island and plans exactly as before."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from astraeus.scheduler import PlacedWorker, RunningUnit, plan
from astraeus.scheduler.topology import full_islands, parse_islands

from .builders import GIB, HOUR, NOW, WS_A, cluster, machine, started, stopped_names

TWO_FOURS = ((0, 1, 2, 3), (4, 5, 6, 7))


def islanded(name: str, islands=TWO_FOURS, gpus: int = 8):
    return replace(machine(name, gpus=gpus), nvlink_islands=islands)


def on_gpus(snap, run: str, machine_name: str, gpus: tuple[int, ...], prio: int = 0, started_at: float = NOW - HOUR):
    """The snapshot with one more running unit: `run` on these GPUs of the machine."""
    unit = RunningUnit(run, WS_A, prio, started_at, None,
                       (PlacedWorker(f"{run}-0", 0, machine_name, gpus, 1, GIB),))
    return replace(snap, running=snap.running + (unit,))


def gpus_of(p, run: str) -> tuple[int, ...]:
    (pl,) = started(p, run).placements
    return pl.gpu_indices


@pytest.mark.parametrize("taken, want", [
    ((), (0, 1, 2, 3)),
    ((0, 1), (4, 5, 6, 7)),  # the lowest free GPUs would be 2-5, across the islands
    ((0,), (4, 5, 6, 7)),
    ((5,), (0, 1, 2, 3)),
    ((4, 5, 6), (0, 1, 2, 3)),
])
def test_a_4_gpu_worker_gets_one_island_never_gpus_across_two(taken, want):
    snap = cluster(islanded("gpu-01")).waiting("r", gpus=4).build()
    if taken:
        snap = on_gpus(snap, "held", "gpu-01", taken)
    assert gpus_of(plan(snap, NOW), "r") == want


@pytest.mark.parametrize("n, taken, want", [
    (2, (0, 1, 4), (2, 3)),  # the island with the fewest free GPUs that holds it: big islands stay whole
    (2, (0, 4, 5), (6, 7)),
    (1, (0, 1), (2,)),
    (3, (0,), (1, 2, 3)),
])
def test_smaller_workers_take_the_fullest_island_that_holds_them(n, taken, want):
    snap = on_gpus(cluster(islanded("gpu-01")).waiting("r", gpus=n).build(), "held", "gpu-01", taken)
    assert gpus_of(plan(snap, NOW), "r") == want


def test_a_worker_no_island_has_room_for_waits_with_the_reason():
    # 4 GPUs free (2, 3, 6, 7), but 2 in each island.
    snap = on_gpus(on_gpus(cluster(islanded("gpu-01")).waiting("r", gpus=4).build(),
                           "a", "gpu-01", (0, 1)), "b", "gpu-01", (4, 5))
    p = plan(snap, NOW)
    assert started(p, "r") is None
    assert dict(p.why_not["r-0"])["gpu-01"].startswith("no NVLink island has 4 free GPUs")


def test_it_goes_to_a_machine_whose_island_has_room():
    snap = on_gpus(on_gpus(cluster(islanded("gpu-01"), islanded("gpu-02")).waiting("r", gpus=4).build(),
                           "a", "gpu-01", (0, 1)), "b", "gpu-01", (4, 5))
    snap = on_gpus(snap, "c", "gpu-02", (0,))
    p = plan(snap, NOW)
    (pl,) = started(p, "r").placements
    assert (pl.machine, pl.gpu_indices) == ("gpu-02", (4, 5, 6, 7))


def test_a_5_gpu_worker_on_machines_of_4_gpu_islands_waits_with_the_reason():
    snap = cluster(islanded("gpu-01"), islanded("gpu-02")).waiting("r", gpus=5).build()
    p = plan(snap, NOW)
    assert not p.starts
    assert p.reasons["r"] == ("Cannot run on this cluster: asks for 5 GPUs in one NVLink island; the largest island "
                              "of a machine it may use has 4")
    assert dict(p.why_not["r-0"]) == {"gpu-01": "machine's largest NVLink island has 4 GPUs, 5 asked",
                                      "gpu-02": "machine's largest NVLink island has 4 GPUs, 5 asked"}


def test_a_5_gpu_worker_goes_to_the_machine_without_islands():
    snap = cluster(islanded("gpu-01"), machine("gpu-02")).waiting("r", gpus=5).build()
    (pl,) = started(plan(snap, NOW), "r").placements
    assert (pl.machine, pl.gpu_indices) == ("gpu-02", (0, 1, 2, 3, 4))


def test_a_gang_of_4_gpu_workers_takes_an_island_on_each_machine():
    snap = on_gpus(cluster(islanded("gpu-01"), islanded("gpu-02")).waiting("g", gpus=4, workers=2).build(),
                   "a", "gpu-01", (2,))
    placed = {pl.machine: pl.gpu_indices for pl in started(plan(snap, NOW), "g").placements}
    assert placed == {"gpu-01": (4, 5, 6, 7), "gpu-02": (0, 1, 2, 3)}


def test_preemption_frees_one_island_for_the_head():
    # Free: 2, 3. The most recent unit (b, on 4-5) alone frees 4 GPUs, not 4 in one island: the victims must free
    # an island (a on 0-1, or b and c together).
    snap = cluster(islanded("gpu-01")).waiting("head", gpus=4, prio=100).build()
    snap = on_gpus(snap, "a", "gpu-01", (0, 1), prio=-1, started_at=NOW - 3 * HOUR)
    snap = on_gpus(snap, "c", "gpu-01", (6, 7), prio=-1, started_at=NOW - 2 * HOUR)
    snap = on_gpus(snap, "b", "gpu-01", (4, 5), prio=-1, started_at=NOW - HOUR)
    stopped = set(stopped_names(plan(snap, NOW)))
    assert "a" in stopped or {"b", "c"} <= stopped


def test_islands_parse_from_the_agents_option():
    assert parse_islands("0-3,4-7", 8) == TWO_FOURS
    assert parse_islands("0-1+4-5, 2-3", 8) == ((0, 1, 4, 5), (2, 3), (6,), (7,))
    assert full_islands([[4, 5, 6, 7], [3, 2, 1, 0]], 8) == TWO_FOURS
    assert full_islands([], 8) == ()


@pytest.mark.parametrize("text, error", [
    ("0-3,4-8", "'4-8' names GPU 8, and the machine has 8 GPUs (indices 0-7)"),
    ("0-3,3-7", "GPU 3 is in two islands ('0-3' and '3-7'): a GPU is in one island"),
    ("0-3,,4-7", "an empty island; give islands such as 0-3,4-7"),
    ("a-b", "'a-b' is not an island: give GPU indices as a-b or a (e.g. 0-3,4-7)"),
    ("3-1", "'3-1' is not an island: a range a-b needs 0 <= a <= b (e.g. 0-3)"),
])
def test_bad_islands_say_what_to_change(text, error):
    with pytest.raises(ValueError) as e:
        parse_islands(text, 8)
    assert error in str(e.value)


def random_snapshot(seed: int, islands):
    """Machines of 8 GPUs with random running work and waiting runs of 1-8 GPUs (gangs among them)."""
    rnd = random.Random(seed)
    ms = [replace(machine(f"gpu-{k:02d}"), nvlink_islands=islands) for k in range(6)]
    b = cluster(*ms)
    free = [8] * 6
    for k in range(rnd.randint(0, 8)):
        g, at = rnd.choice([1, 2, 4]), rnd.randrange(6)
        if free[at] >= g:
            free[at] -= g
            b.running(f"run-{k}", gpus=g, on=f"gpu-{at:02d}", prio=rnd.randint(-2, 2))
    for k in range(12):
        b.waiting(f"w-{k}", gpus=rnd.choice([1, 2, 3, 4, 8]), workers=rnd.choice([1, 1, 2]), prio=rnd.randint(-2, 2))
    return b.build()


@pytest.mark.parametrize("seed", range(12))
def test_one_island_of_every_gpu_plans_as_no_islands(seed):
    # The fast path (machines without islands) pinned to the island rule with one island holding every GPU.
    plain = plan(random_snapshot(seed, ()), NOW)
    one = plan(random_snapshot(seed, (tuple(range(8)),)), NOW)
    assert (one.starts, one.stops, one.reasons, one.why_not) == (plain.starts, plain.stops, plain.reasons,
                                                                  plain.why_not)
