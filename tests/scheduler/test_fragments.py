"""Placement that avoids fragments (issue 46): the FGD score, the policies, and the cluster's `placement`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astraeus.scheduler import plan
from astraeus.scheduler.fragments import (
    WHOLE,
    Placer,
    Request,
    Room,
    fgd_share,
    fits,
    fragment,
    fragmentation,
    per_gpu,
    plus_sizes,
    sizes_of,
    stranded,
    whole_order,
)

from .builders import cluster, machine

HALF, QUARTER = Request(1, 500), Request(1, 250)


# ------------------------------------------------------------------------------------------ the measure


@pytest.mark.parametrize(
    ("free", "asked", "expected"),
    [
        ((1000, 1000), Request(1), 0),  # whole free GPUs serve a whole-GPU task
        ((1000, 300), Request(1), 300),  # a partly used GPU is a fragment for a whole-GPU task
        ((1000, 300), HALF, 300),  # 300 free cannot serve a half
        ((1000, 600), HALF, 0),
        ((300, 200), HALF, 500),  # it fits nowhere: all the free capacity is fragment
        ((1000, 1000), Request(4), 2000),  # 4 whole GPUs never fit on 2
        ((1000, 1000), Request(0), 2000),  # a task without GPUs uses none of them
    ],
)
def test_fragment_of_one_task(free, asked, expected):
    assert fragment(Room(free, 10_000, 10_000), asked) == expected


def test_a_machine_without_cpu_left_is_all_fragment():
    room = Room((1000, 1000), cpu_milli=1000)
    assert fragment(room, Request(1, WHOLE, cpu_milli=4000)) == 2000
    assert fragment(room, Request(1, WHOLE, cpu_milli=1000)) == 0


def test_fragmentation_weighs_the_task_sizes():
    sizes = ((HALF, 3), (Request(1), 1))
    assert fragmentation(Room((1000, 300)), sizes) == 3 * 300 + 1 * 300


def test_an_unknown_placement_says_which_ones_exist():
    with pytest.raises(ValueError, match="placement must be one of fgd, fgd\\+, bestfit, spread, not 'tightest'"):
        Placer([Room((1000,))], "tightest")


# ------------------------------------------------------------------------------------------ the choice


def test_fgd_keeps_a_whole_gpu_free_where_bestfit_splits_it():
    # Machine 0 has one GPU with 600 free; machine 1 an empty GPU. The workload is halves and whole GPUs.
    # A 250 task: bestfit fills the tightest GPU (machine 0, left 350: no half fits there any more);
    # fgd also goes to machine 0 (the whole GPU of machine 1 stays whole for a whole-GPU task).
    sizes = ((HALF, 1), (Request(1), 1))
    rooms = [Room((600,)), Room((1000,))]
    assert Placer(rooms, "bestfit", sizes).choose(QUARTER) == (0, (0,))
    assert Placer(rooms, "fgd", sizes).choose(QUARTER) == (0, (0,))
    # A 100 task: bestfit still takes machine 0 (600 -> 500); so does fgd (500 still serves a half).
    assert Placer(rooms, "fgd", sizes).choose(Request(1, 100)) == (0, (0,))


def test_fgd_avoids_the_gpu_whose_rest_would_be_useless():
    # GPUs with 700 and 600 free; the workload is all halves. A 200 task on the 600 leaves 400 (a fragment for
    # halves), on the 700 leaves 500 (still a half): fgd takes the 700, bestfit the 600.
    rooms = [Room((700, 600))]
    sizes = ((HALF, 1),)
    assert Placer(rooms, "fgd", sizes).choose(Request(1, 200)) == (0, (0,))
    assert Placer(rooms, "bestfit", sizes).choose(Request(1, 200)) == (0, (1,))


def test_spread_takes_the_emptiest_machine():
    rooms = [Room((1000, 0)), Room((1000, 1000)), Room((1000, 1000))]
    assert Placer(rooms, "spread").choose(Request(1)) == (1, (0,))
    assert Placer(rooms, "bestfit").choose(Request(1)) == (0, (0,))


def test_nothing_fits_is_none():
    assert Placer([Room((300,))], "fgd", ((HALF, 1),)).choose(HALF) is None


def test_take_moves_the_machine_to_its_new_room():
    p = Placer([Room((1000, 1000)), Room((1000,))], "bestfit")
    i, gpus = p.choose(Request(1))
    p.take(i, gpus, Request(1))
    assert p.rooms[i].free == (0,)
    assert p.choose(Request(1)) == (0, (0,))
    with pytest.raises(ValueError, match="too little free"):
        p.take(1, (0,), Request(1))


def test_fgd_share_matches_the_cluster_candidates_shape():
    sizes = sizes_of([HALF] * 3 + [Request(1)] * 2)
    assert fgd_share([(0, (500, 1000)), (1, (700, 1000))], 500, sizes) == (0, 0)
    assert fgd_share([(0, (300,))], 500, sizes) is None


def test_whole_order_keeps_whole_machines_for_big_tasks():
    # Workload: 8-GPU tasks and 1-GPU tasks. A 1-GPU worker should not break into an empty 8-GPU machine when a
    # machine with 3 free GPUs is there; bestfit scans from the fewest free up.
    sizes = ((Request(8), 1), (Request(1), 1))
    order = whole_order(1, 8, sizes, "fgd")
    assert order.index(3) < order.index(8)
    assert whole_order(1, 8, sizes, "bestfit") == list(range(1, 9))
    assert whole_order(1, 8, sizes, "spread") == list(range(8, 0, -1))


# ------------------------------------------------------------------------- fgd+: CPU and memory strand GPUs

ONE_GPU_10_CORES = Request(1, WHOLE, cpu_milli=10_000, memory_mib=1_000)


@pytest.mark.parametrize(
    ("room", "expected"),
    [
        (Room((1000, 1000), 20_000, 2_000), 0.0),  # 20 cores and 2,000 MiB feed both GPUs at 10 cores, 1,000 MiB each
        (Room((1000, 1000), 10_000, 2_000), 1000.0),  # 10 cores feed one: the other GPU is stranded
        (Room((1000, 1000), 20_000, 500), 1500.0),  # memory for half a GPU
        (Room((1000, 300), 5_000, 9_000), 800.0),  # 1,300 free, cores for 500 of it
        (Room((0, 0), 0, 0), 0.0),  # nothing free, nothing stranded
    ],
)
def test_stranded_gpu_capacity(room, expected):
    assert per_gpu(((ONE_GPU_10_CORES, 3), (Request(0, cpu_milli=50_000), 9))) == (10.0, 1.0)  # GPU tasks only
    assert stranded(room, 10.0, 1.0) == expected


@pytest.mark.parametrize(
    ("asked", "rooms", "fgd_takes", "fgd_plus_takes"),
    [
        # A 10-core task without GPUs: both machines still fit a 10-core GPU task after it, so FGD sees no
        # fragment and best-fits the CPU (machine 1, whose second GPU is then stranded); fgd+ uses machine 0's.
        (Request(0, cpu_milli=10_000), [Room((1000, 1000), 40_000, 10_000), Room((1000, 1000), 20_000, 10_000)], 1, 0),
        # A one-GPU task of one core belongs where cores are short (machine 0: 5 a GPU, one GPU stranded); FGD
        # keeps machine 0's last 10 cores for a 10-core task instead.
        (Request(1, WHOLE, cpu_milli=1_000), [Room((1000, 1000), 10_000, 10_000), Room((1000, 1000), 40_000, 10_000)],
         1, 0),
    ],
)
def test_fgd_plus_keeps_gpus_the_cpu_can_feed(asked, rooms, fgd_takes, fgd_plus_takes):
    sizes = ((ONE_GPU_10_CORES, 4), (Request(0, cpu_milli=10_000), 1))
    assert Placer(rooms, "fgd", sizes).choose(asked)[0] == fgd_takes
    assert Placer(rooms, "fgd+", sizes).choose(asked)[0] == fgd_plus_takes


def test_fgd_plus_weighs_a_share_by_how_many_one_gpu_holds():
    sizes = ((Request(0, cpu_milli=1_000), 2), (Request(1), 5), (Request(8), 1), (Request(1, 250), 3), (Request(1, 810), 1))
    assert plus_sizes(sizes) == ((Request(0, cpu_milli=1_000), 20), (Request(1), 15), (Request(8), 3),
                                 (Request(1, 250), 120), (Request(1, 810), 12))


def test_fgd_plus_keeps_a_gpu_for_the_share_that_fills_it():
    # A workload of the trace's shape: mostly whole GPUs, 470 the commonest share. A 160 share on machine 1's GPU
    # with 530 free would leave 370, which no 470 can use; FGD, counting every whole-GPU task, does it anyway, while
    # fgd+ takes the GPU with 840 free and keeps the 530 for a 470.
    sizes = ((Request(1), 20), (Request(1, 810), 4), (Request(1, 160), 1), (Request(1, 470), 6), (Request(1, 320), 3),
             (Request(1, 650), 2))
    rooms = [Room((1000, 1000)), Room((530, 840))]
    assert Placer(rooms, "fgd", sizes).choose(Request(1, 160)) == (1, (0,))
    assert Placer(rooms, "fgd+", sizes).choose(Request(1, 160)) == (1, (1,))


# ---------------------------------------------------------------------------------------- properties

frees = st.lists(st.integers(0, 1000), min_size=1, max_size=8).map(tuple)
requests = st.one_of(st.integers(1, 999).map(lambda m: Request(1, m)), st.integers(1, 4).map(Request))
workloads = st.lists(st.tuples(requests, st.integers(1, 5)), min_size=1, max_size=5).map(
    lambda xs: tuple(dict(xs).items()))


@settings(max_examples=200, deadline=None)
@given(rooms=st.lists(frees, min_size=1, max_size=6), r=requests, sizes=workloads)
def test_fgd_never_grows_fragmentation_more_than_bestfit(rooms, r, sizes):
    rooms = [Room(f) for f in rooms]

    def growth(choice):
        i, gpus = choice
        p = Placer(rooms, "bestfit")
        before = fragmentation(p.rooms[i], sizes)
        p.take(i, gpus, r)
        return fragmentation(p.rooms[i], sizes) - before

    fgd, bestfit = Placer(rooms, "fgd", sizes).choose(r), Placer(rooms, "bestfit", sizes).choose(r)
    assert (fgd is None) == (bestfit is None)
    if fgd is not None:
        assert fits(rooms[fgd[0]], r)
        assert growth(fgd) <= growth(bestfit)


rooms_with_cpu = st.builds(Room, frees, st.integers(0, 64_000), st.integers(0, 64_000))
requests_with_cpu = st.builds(lambda r, c, m: replace(r, cpu_milli=c, memory_mib=m), st.one_of(requests, st.just(Request(0))),
                              st.integers(0, 16_000), st.integers(0, 16_000))
workloads_with_cpu = st.lists(st.tuples(requests_with_cpu, st.integers(1, 5)), min_size=1, max_size=5).map(
    lambda xs: tuple(dict(xs).items()))


@settings(max_examples=200, deadline=None)
@given(rooms=st.lists(rooms_with_cpu, min_size=1, max_size=6), r=requests_with_cpu, sizes=workloads_with_cpu)
def test_fgd_plus_never_grows_its_measure_more_than_bestfit_and_is_deterministic(rooms, r, sizes):
    weighted = plus_sizes(sizes)
    count, rates = sum(n for _, n in weighted), per_gpu(weighted)

    def unusable(room):  # what fgd+ optimises: expected fragment for a task of the weighted sizes plus stranded capacity
        return fragmentation(room, weighted) / count + stranded(room, *rates)

    def growth(choice):
        i, gpus = choice
        p = Placer(rooms, "bestfit")
        before = unusable(p.rooms[i])
        p.take(i, gpus, r)
        return unusable(p.rooms[i]) - before

    plus, bestfit = Placer(rooms, "fgd+", sizes).choose(r), Placer(rooms, "bestfit", sizes).choose(r)
    assert (plus is None) == (bestfit is None)
    assert Placer(rooms, "fgd+", sizes).choose(r) == plus
    if plus is not None:
        assert fits(rooms[plus[0]], r)
        assert growth(plus) <= growth(bestfit) + 1e-9


@settings(max_examples=100, deadline=None)
@given(rooms=st.lists(frees, min_size=1, max_size=6), rs=st.lists(requests, max_size=12), sizes=workloads,
       policy=st.sampled_from(["fgd", "fgd+", "bestfit", "spread"]))
def test_placements_are_deterministic_and_never_oversubscribe(rooms, rs, sizes, policy):
    def fill():
        p, out = Placer([Room(f) for f in rooms], policy, sizes), []
        for r in rs:
            c = p.choose(r)
            if c is not None:
                p.take(*c, r)  # raises if a GPU would go below 0
            out.append(c)
        return out, p.rooms

    first, second = fill(), fill()
    assert first == second
    assert all(0 <= f <= WHOLE for room in first[1] for f in room.free)


# ------------------------------------------------------------------------------ the cluster's placement


def test_the_cluster_placement_decides_where_a_one_gpu_run_goes():
    # gpu-a has 3 free GPUs, gpu-b 8; the queue holds 8-GPU runs too (the workload's sizes).
    snap = (cluster(machine("gpu-a", gpus=8), machine("gpu-b", gpus=8))
            .running("holder", gpus=5, on="gpu-a")
            .waiting("small", gpus=1)
            .build())
    where = {}
    for policy in ("bestfit", "fgd", "spread"):
        p = plan(replace(snap, placement=policy, task_sizes=((Request(8), 4), (Request(1), 1))), 0.0)
        (start,) = [s for s in p.starts if s.run == "small"]
        where[policy] = start.placements[0].machine
    assert where == {"bestfit": "gpu-a", "fgd": "gpu-a", "spread": "gpu-b"}


def test_fgd_plans_are_deterministic():
    b = cluster(*(machine(f"gpu-{k:02}", gpus=8) for k in range(6)))
    for k in range(10):
        b = b.waiting(f"r{k}", gpus=1 + k % 4)
    snap = replace(b.build(), placement="fgd")
    assert plan(snap, 0.0) == plan(snap, 0.0)
