"""Issue 46: runs asking GPU memory (`gpu_requests.memory_bytes`) in the pure scheduler: on each machine the ask is
that memory's share of the machine's GPU, rounded up to thousandths; a machine whose GPU holds no more than the ask
does not fit, and its why-not line says so."""

from __future__ import annotations

import pytest

from astraeus.scheduler import (
    Machine,
    NodeSelection,
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
WS = "ws-3f9c2a1b7d4e"


@pytest.mark.parametrize("asked, gpu, milli", [
    (20 * GIB, 80 * GIB, 250),
    (10 * GIB, 40 * GIB, 250),
    (1, 80 * GIB, 1),  # at least a thousandth
    (27 * GIB, 80 * GIB, 338),  # 337.5 rounded up
    (79 * GIB, 80 * GIB, 988),
    (80 * GIB - 1, 80 * GIB, 999),  # at most FULL - 1: a whole GPU is `count`
    (80 * GIB, 80 * GIB, None),  # the GPU holds no more than asked: does not fit
    (100 * GIB, 80 * GIB, None),
    (GIB, 0, None),  # the machine reports no GPU memory
])
def test_memory_becomes_thousandths_of_each_machines_gpu(asked, gpu, milli):
    assert gpushare.memory_milli(asked, gpu) == milli


def machine(name: str, gpu_memory: int, gpus: int = 1) -> Machine:
    return Machine(name, gpus, 64, 512 * GIB, gpu_model="simulated", gpu_memory_bytes=gpu_memory)


def asking(name: str, gpu_memory: int, share: float, at: float = 0.0) -> WaitingRun:
    """A run asking `gpu_memory` bytes of GPU memory, counted as `share` of a GPU for quotas while it waits."""
    return WaitingRun(name, WS, 0, NOW - 1000 + at, (WorkerRequest(0, share, 1.0, GIB, gpu_memory_bytes=gpu_memory),),
                      node_selection=NodeSelection(gpu_memory=gpu_memory))


def snap(machines, wait=(), run=(), quota: Quota | None = None) -> Snapshot:
    return Snapshot("c", tuple(machines), tuple(run), tuple(wait), (Workspace(WS, "a", quota),))


def only_start(p, run: str):
    (start,) = [s for s in p.starts if s.run == run]
    (pl,) = start.placements
    return pl


@pytest.mark.parametrize("gpu, milli", [(80 * GIB, 250), (40 * GIB, 500), (24 * GIB, 834)])
def test_the_share_taken_is_the_placing_machines(gpu, milli):
    pl = only_start(plan(snap([machine("m", gpu)], [asking("r", 20 * GIB, 0.834)]), NOW), "r")
    assert (pl.machine, pl.gpu_indices, pl.gpu_milli) == ("m", (0,), milli)


def test_the_smallest_gpu_that_holds_it_is_chosen():
    p = plan(snap([machine("big", 80 * GIB), machine("mid", 40 * GIB), machine("small", 16 * GIB)],
                  [asking("r", 20 * GIB, 0.5)]), NOW)
    pl = only_start(p, "r")
    assert (pl.machine, pl.gpu_milli) == ("mid", 500)


def test_a_machine_whose_gpu_is_too_small_gets_a_why_not_line_and_the_run_waits():
    s = snap([machine("small", 16 * GIB)], [asking("r", 20 * GIB, 0.999)])
    p = plan(s, NOW)
    assert not p.starts
    assert "asks for 20 GiB of GPU memory; no machine it may use has a GPU with more" in p.reasons["r"]
    lines = dict(p.why_not["r-0"])
    assert lines["small"] == "machine's GPUs have 16 GiB of memory, 20 GiB asked (less than one GPU's memory)"


def test_a_machine_that_reports_no_gpu_memory_does_not_fit():
    p = plan(snap([machine("old", 0), machine("new", 80 * GIB)], [asking("r", 20 * GIB, 0.25)]), NOW)
    assert only_start(p, "r").machine == "new"
    p = plan(snap([machine("old", 0)], [asking("r", 20 * GIB, 0.25)]), NOW)
    assert not p.starts and dict(p.why_not["r-0"])["old"].startswith("machine reports no GPU memory")


def test_memory_asks_share_a_gpu_until_its_thousandths_are_taken():
    runs = [asking(f"r{i}", 20 * GIB, 0.25, at=i) for i in range(5)]
    p = plan(snap([machine("m", 80 * GIB)], runs), NOW)
    got = sorted((s.run, s.placements[0].gpu_indices, s.placements[0].gpu_milli) for s in p.starts)
    assert got == [(f"r{i}", (0,), 250) for i in range(4)]
    assert "r4" in p.reasons


def test_running_tenants_leave_room_by_their_thousandths():
    held = RunningUnit("t", WS, 0, NOW - 10, None, (PlacedWorker("t-0", 0, "m", (0,), 1.0, GIB, 800),))
    p = plan(snap([machine("m", 80 * GIB, gpus=2)], [asking("r", 20 * GIB, 0.25)], run=[held]), NOW)
    pl = only_start(p, "r")
    assert (pl.gpu_indices, pl.gpu_milli) == ((1,), 250)  # 200 left on GPU 0 is too little
    p = plan(snap([machine("m", 80 * GIB, gpus=2)], [asking("r", 16 * GIB, 0.2)], run=[held]), NOW)
    assert only_start(p, "r").gpu_indices == (0,)  # 200 fits exactly: best fit fills the shared GPU


def test_quota_counts_the_share_asked():
    s = snap([machine("m", 80 * GIB)], [asking("r", 60 * GIB, 0.75)], quota=Quota(gpus=0.5))
    p = plan(s, NOW)
    assert not p.starts
    assert "quota allows at all (gpus 0.75 asked > 0.5)" in p.reasons["r"]


def test_a_run_that_fits_no_machine_is_never_placed_even_when_the_others_fill():
    """The share index (many machines) must keep to the machines whose GPUs hold the ask."""
    machines = [machine(f"s{i:03}", 16 * GIB, gpus=2) for i in range(60)] + [machine("z-big", 80 * GIB)]
    p = plan(snap(machines, [asking("r", 20 * GIB, 0.25)]), NOW)
    pl = only_start(p, "r")
    assert (pl.machine, pl.gpu_milli) == ("z-big", 250)
