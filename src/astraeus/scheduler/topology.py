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


def full_islands(islands: Sequence[Sequence[int]], gpus: int) -> tuple[tuple[int, ...], ...]:
    """The islands as the scheduler keeps them: sorted, with each GPU no island names as an island of its own
    (a GPU without NVLink); () when none are given (the machine is one island)."""
    if not islands:
        return ()
    named = {g for island in islands for g in island}
    out = [tuple(sorted(island)) for island in islands if island]
    out += [(g,) for g in range(gpus) if g not in named]
    return tuple(sorted(out))


def parse_islands(text: str, gpus: int) -> tuple[tuple[int, ...], ...]:
    """`--nvlink-islands 0-3,4-7` (islands separated by commas; an island is a range `a-b`, one GPU `a`, or
    several joined by `+`: `0-1+4-5`) as GPU indices, checked against the machine's `gpus`. ValueError says what
    to change."""
    islands: list[tuple[int, ...]] = []
    seen: dict[int, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"{text!r}: an empty island; give islands such as 0-3,4-7")
        members: list[int] = []
        for piece in part.split("+"):
            lo, _, hi = piece.strip().partition("-")
            try:
                a, b = int(lo), int(hi if hi else lo)
            except ValueError:
                raise ValueError(f"{part!r} is not an island: give GPU indices as a-b or a (e.g. 0-3,4-7)") from None
            if a < 0 or b < a:
                raise ValueError(f"{part!r} is not an island: a range a-b needs 0 <= a <= b (e.g. 0-3)")
            if b >= gpus:
                raise ValueError(f"{part!r} names GPU {b}, and the machine has {gpus} GPUs (indices 0-{gpus - 1})"
                                 if gpus else f"{part!r}: the machine has no GPUs (give --gpus N)")
            for g in range(a, b + 1):
                if g in seen:
                    raise ValueError(f"GPU {g} is in two islands ({seen[g]!r} and {part!r}): a GPU is in one island")
                seen[g] = part
                members.append(g)
        islands.append(tuple(members))
    return full_islands(islands, gpus)


def largest_island(islands: Sequence[Sequence[int]], usable: Sequence[int]) -> int:
    """How many of the `usable` GPUs (not failed) the largest island holds; all of them with no islands."""
    if not islands:
        return len(usable)
    us = set(usable)
    return max((sum(1 for g in island if g in us) for island in islands), default=0)


def no_island_free(n: int) -> str:
    """The why-not line of a machine with n free GPUs or more, none of its NVLink islands with n of them free."""
    return f"no NVLink island has {n} free GPUs"


def island_too_small(largest: int, n: int) -> str:
    """The why-not line of a machine whose largest NVLink island holds fewer than n GPUs."""
    return f"machine's largest NVLink island has {largest} GPUs, {n} asked"
