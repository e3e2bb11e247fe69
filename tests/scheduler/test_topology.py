"""Topology (issue 46): a gang's machines from the fewest network blocks, ranks in topology order, a gang that
must have one block waits with a reason when it cannot; a worker's GPUs inside one NVLink island."""

from __future__ import annotations

from dataclasses import replace

import pytest

from astraeus.scheduler import plan
from astraeus.scheduler.topology import BLOCK, RACK, island_gpus, rank_order

from .builders import cluster, machine


def labelled(name: str, block: str, rack: str = "r1", gpus: int = 8):
    return machine(name, gpus=gpus, labels={BLOCK: block, RACK: rack})


def same_block(snap, run: str, level: str = "block"):
    runs = tuple(replace(r, node_selection=replace(r.node_selection, topology_same=level)) if r.name == run else r
                 for r in snap.waiting)
    return replace(snap, waiting=runs)


def machines_of(p, run: str) -> list[str]:
    (start,) = [s for s in p.starts if s.run == run]
    return [pl.machine for pl in sorted(start.placements, key=lambda pl: pl.worker_index)]


def test_a_gang_goes_to_one_block_when_one_holds_it():
    # By name alone best fit would take gpu-01 (blk-b) and gpu-02 (blk-a); blk-a holds the gang whole.
    snap = (cluster(labelled("gpu-01", "blk-b"), labelled("gpu-02", "blk-a"), labelled("gpu-03", "blk-a"),
                    labelled("gpu-04", "blk-c"))
            .running("other", gpus=8, on="gpu-04")
            .waiting("gang", gpus=8, workers=2)
            .build())
    assert machines_of(plan(snap, 0.0), "gang") == ["gpu-02", "gpu-03"]


def test_ranks_are_numbered_in_topology_order():
    # Rack r1 before r2 inside the block, whatever the names say.
    snap = (cluster(labelled("gpu-01", "blk-a", "r2"), labelled("gpu-02", "blk-a", "r1"),
                    labelled("gpu-03", "blk-a", "r2"), labelled("gpu-04", "blk-a", "r1"))
            .waiting("gang", gpus=8, workers=4)
            .build())
    assert machines_of(plan(snap, 0.0), "gang") == ["gpu-02", "gpu-04", "gpu-01", "gpu-03"]


def test_without_the_requirement_a_gang_spans_blocks_when_it_must():
    snap = (cluster(labelled("gpu-01", "blk-a"), labelled("gpu-02", "blk-b"))
            .waiting("gang", gpus=8, workers=2)
            .build())
    assert machines_of(plan(snap, 0.0), "gang") == ["gpu-01", "gpu-02"]


def test_a_gang_that_needs_one_block_never_larger_than_the_blocks_says_so():
    snap = same_block(cluster(labelled("gpu-01", "blk-a"), labelled("gpu-02", "blk-b"))
                      .waiting("gang", gpus=8, workers=2)
                      .build(), "gang")
    p = plan(snap, 0.0)
    assert not p.starts
    assert p.reasons["gang"] == ("Cannot run on this cluster: needs 2 machines in one network block "
                                 "(topology.astraeus.io/block); the largest block it may use, blk-a, has 1")


def test_a_gang_that_needs_one_block_on_unlabelled_machines_says_which_label():
    snap = same_block(cluster(machine("gpu-01"), machine("gpu-02")).waiting("gang", gpus=8, workers=2).build(),
                      "gang")
    assert plan(snap, 0.0).reasons["gang"] == (
        "Cannot run on this cluster: needs 2 machines in one network block, and no machine it may use has the "
        "label topology.astraeus.io/block")


def test_a_gang_that_needs_one_block_waits_while_its_block_is_busy_and_starts_inside_it():
    # blk-a has 2 machines, one busy with higher-priority work; blk-b has one free machine. Two free machines
    # exist (gpu-02, gpu-03) but in two blocks: the gang waits (it is the head), it does not span them.
    b = (cluster(labelled("gpu-01", "blk-a"), labelled("gpu-02", "blk-a"), labelled("gpu-03", "blk-b"))
         .running("busy", gpus=8, on="gpu-01", prio=10)
         .waiting("gang", gpus=8, workers=2))
    p = plan(same_block(b.build(), "gang"), 0.0)
    assert not p.starts and not p.stops
    assert "gang" in p.reasons
    # The same gang without the requirement starts across the blocks.
    assert machines_of(plan(b.build(), 0.0), "gang") == ["gpu-02", "gpu-03"]
    # Once blk-a is free it starts there.
    free = cluster(labelled("gpu-01", "blk-a"), labelled("gpu-02", "blk-a"), labelled("gpu-03", "blk-b"))
    p = plan(same_block(free.waiting("gang", gpus=8, workers=2).build(), "gang"), 0.0)
    assert machines_of(p, "gang") == ["gpu-01", "gpu-02"]


def test_a_same_rack_gang_picks_a_rack():
    snap = same_block(cluster(labelled("gpu-01", "blk-a", "r1"), labelled("gpu-02", "blk-a", "r2"),
                              labelled("gpu-03", "blk-a", "r2"))
                      .waiting("gang", gpus=8, workers=2).build(), "gang", "rack")
    assert machines_of(plan(snap, 0.0), "gang") == ["gpu-02", "gpu-03"]


def test_topology_plans_are_deterministic():
    b = cluster(*(labelled(f"gpu-{k:02}", f"blk-{k % 3}", f"r{k % 2}") for k in range(9)))
    for k in range(5):
        b = b.waiting(f"g{k}", gpus=4, workers=2)
    snap = b.build()
    assert plan(snap, 0.0) == plan(snap, 0.0)


def test_rank_order_reads_block_then_rack_then_name():
    assert rank_order([("b", {BLOCK: "2"}), ("a", {BLOCK: "2", RACK: "x"}), ("c", {BLOCK: "1"})]) == ["c", "b", "a"]


@pytest.mark.parametrize(
    ("free", "islands", "n", "expected"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], [[0, 1, 2, 3], [4, 5, 6, 7]], 4, (0, 1, 2, 3)),
        ([1, 2, 3, 4, 5], [[0, 1, 2, 3], [4, 5, 6, 7]], 2, (4, 5)),  # the island with fewer free stays tight
        ([2, 3, 4, 5], [[0, 1, 2, 3], [4, 5, 6, 7]], 3, None),  # 4 free, but no island has 3: it waits
        ([5, 1, 0], [], 2, (0, 1)),  # no islands reported: any GPUs
    ],
)
def test_a_worker_gets_gpus_of_one_island(free, islands, n, expected):
    assert island_gpus(free, islands, n) == expected


def test_a_gang_that_needs_one_block_preempts_inside_one_block():
    # blk-a's two machines run low-priority work; blk-b's one machine is free. The urgent gang needs one block:
    # it stops the work in blk-a (not just one run beside the free machine of blk-b).
    snap = same_block(cluster(labelled("gpu-01", "blk-a"), labelled("gpu-02", "blk-a"), labelled("gpu-03", "blk-b"))
                      .running("low-1", gpus=8, on="gpu-01", prio=-100)
                      .running("low-2", gpus=8, on="gpu-02", prio=-100)
                      .waiting("urgent", gpus=8, workers=2, prio=50)
                      .build(), "urgent")
    p = plan(snap, 0.0)
    assert not p.starts
    assert sorted(s.run for s in p.stops) == ["low-1", "low-2"]
