"""Topology (issue 46): a worker's GPUs inside one NVLink/NVSwitch island, a gang's machines from the fewest
network blocks, ranks numbered in topology order (pure; the standard library only).

Machines say where they sit with labels: `topology.astraeus.io/block` (a network block: machines behind one
spine) and `topology.astraeus.io/rack`. A machine's GPUs form islands (sets of GPU indices joined by NVLink or one
NVSwitch) when its agent reports them; a machine that reports none is one island.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

BLOCK = "topology.astraeus.io/block"
RACK = "topology.astraeus.io/rack"
LEVELS = {"block": BLOCK, "rack": RACK}  # what `node_selection.topology.same` may name


def place_of(labels: Mapping[str, str], name: str) -> tuple[str, str, str]:
    """A machine's place in topology order: (block, rack, name); "" sorts machines without labels first."""
    return labels.get(BLOCK, ""), labels.get(RACK, ""), name


def rank_order(machines: Iterable[tuple[str, Mapping[str, str]]]) -> list[str]:
    """Machine names in topology order (block, rack, name): rank 0 on the first, neighbours next to each other."""
    return [n for n, _ in sorted(machines, key=lambda m: place_of(m[1], m[0]))]


def cannot_have_same(same: str, n: int, groups: Mapping[str, int]) -> str | None:
    """Why a gang of n machines that must share one block (or rack) can never run here, or None when some
    group has n machines it may use. `groups`: the group's name -> machines in it the run may use."""
    label = LEVELS[same]
    if groups and max(groups.values()) >= n:
        return None
    if not groups:
        return (f"Cannot run on this cluster: needs {n} machines in one network {same}, and no machine it may "
                f"use has the label {label}")
    most, where = min((-c, k) for k, c in groups.items())
    most = -most
    return (f"Cannot run on this cluster: needs {n} machines in one network {same} ({label}); the largest "
            f"{same} it may use, {where}, has {most}")


def island_gpus(free: Sequence[int], islands: Sequence[Sequence[int]], n: int) -> tuple[int, ...] | None:
    """n of the free GPU indices inside one island: the island with the fewest free that holds them (keeping
    big islands whole), lowest indices first. No islands reported: the lowest free GPUs. None when no island
    holds n (the worker waits rather than span NVLink islands)."""
    if not islands:
        return tuple(sorted(free)[:n]) if len(free) >= n else None
    fs = set(free)
    best = None
    for island in islands:
        here = sorted(g for g in island if g in fs)
        if len(here) >= n and (best is None or (len(here), here) < best):
            best = (len(here), here)
    return None if best is None else tuple(best[1][:n])
