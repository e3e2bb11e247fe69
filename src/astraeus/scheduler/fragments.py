"""Placement that avoids fragments: where on which machine a worker's GPUs go (pure; the standard library only).

A machine's room is its per-GPU free capacity in thousandths (`Free`: 1000 = a whole free GPU, by GPU index)
with its free CPU (thousandths of a core) and memory. A request is whole GPUs (`gpus` >= 1, `milli` 1000), a
share of one GPU (`gpus` 1, `milli` < 1000) or no GPU (`gpus` 0).

FGD (Weng et al., "Beware of Fragmentation", USENIX ATC 2023): a machine's fragmentation for a task is the GPU
capacity it has free that cannot serve that task (all of it when the task cannot run there at all; else the
GPUs with less free than the task's share, or, for whole-GPU tasks, the partly used GPUs). Weighted by the
workload's distribution of task sizes it is the expected free capacity a task drawn from the workload cannot
use; FGD places each task where that measure grows least. Here ties go to the tighter fit (bestfit), then to
the machine first in name order, so a plan is deterministic.

`fgd+` adds to FGD's measure the GPU capacity a machine cannot use for want of CPU or memory (`stranded`):
its free GPU capacity beyond what its free CPU and memory would feed at the workload's CPU and memory per GPU.
On the Alibaba trace CPU runs out before GPUs do, and FGD alone fills the CPU-poor machines' cores first
(benchmarks/README.md, placement section). `fgd+` also weighs the task sizes differently (`plus_sizes`): a share
of s thousandths by how many of it one GPU holds (1000 / s), so the small shares that alone can fill the slivers
left beside large ones count more, and whole-GPU tasks less (`WHOLE_WEIGHT`): a partly used GPU is lost to them
wherever a share goes. Both were chosen on the paper's protocol, where they pack more than FGD's plain counts.

Policies (a cluster's `placement`): `fgd`, `fgd+`, `bestfit` (least free GPU capacity left on the machine, today's
rule), `spread` (most left). `Placer` keeps the machines grouped by identical room, so one decision costs one
score per distinct room, not per machine: the scheduler and the simulator both place through it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WHOLE = 1000  # a whole GPU in thousandths
POLICIES = ("fgd", "fgd+", "bestfit", "spread")
# fgd+'s weight of a whole-GPU task against a task without GPUs (1), in tenths; chosen on the FGD protocol
# (benchmarks/README.md, placement section).
WHOLE_WEIGHT = 3

Free = tuple[int, ...]  # per-GPU free capacity in thousandths, by GPU index


@dataclass(frozen=True, slots=True)
class Request:
    gpus: int  # whole GPUs, or 1 with a share below 1000; 0: no GPU
    milli: int = WHOLE  # per GPU, thousandths
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def demand(self) -> int:
        """GPU capacity asked, in thousandths."""
        return self.gpus * self.milli if self.gpus else 0


@dataclass(frozen=True, slots=True)
class Room:
    free: Free
    cpu_milli: int = 0
    memory_mib: int = 0


# The workload's task sizes: (request, how many of them) — counts, so sums stay exact integers.
Sizes = tuple[tuple[Request, int], ...]


def fits(room: Room, r: Request) -> bool:
    if room.cpu_milli < r.cpu_milli or room.memory_mib < r.memory_mib:
        return False
    if r.gpus == 0:
        return True
    if r.milli < WHOLE:
        return max(room.free, default=0) >= r.milli
    return sum(1 for f in room.free if f == WHOLE) >= r.gpus


def fragment(room: Room, r: Request) -> int:
    """The free GPU capacity of `room` that cannot serve `r` (thousandths)."""
    free = room.free
    if r.gpus == 0 or not fits(room, r):
        return sum(free)
    if r.milli < WHOLE:
        return sum(f for f in free if f < r.milli)
    return sum(f for f in free if f < WHOLE)


def fragmentation(room: Room, sizes: Sizes) -> int:
    """Expected unusable free capacity for a task drawn from `sizes`, times the sizes' total count."""
    return sum(n * fragment(room, r) for r, n in sizes)


def per_gpu(sizes: Sizes) -> tuple[float, float]:
    """The workload's CPU (thousandths of a core) and memory (MiB) per thousandth of GPU, over its GPU tasks."""
    demand = sum(n * r.demand for r, n in sizes)
    if not demand:
        return 0.0, 0.0
    return sum(n * r.cpu_milli for r, n in sizes if r.gpus) / demand, sum(n * r.memory_mib for r, n in sizes if r.gpus) / demand


def plus_sizes(sizes: Sizes) -> Sizes:
    """The sizes as fgd+ weighs them, in tenths: a task without GPUs 10, a whole-GPU task `WHOLE_WEIGHT`, a share
    of s thousandths 10 * 1000 / s (how many of it one GPU holds), times its count."""
    def weight(r: Request) -> int:
        if r.gpus == 0:
            return 10
        return WHOLE_WEIGHT if r.milli == WHOLE else 10 * WHOLE // r.milli
    return tuple((r, n * weight(r)) for r, n in sizes)


def stranded(room: Room, cpu_per_gpu: float, mem_per_gpu: float) -> float:
    """The free GPU capacity of `room` (thousandths) its free CPU and memory cannot feed at these rates."""
    fed = [have / rate for have, rate in ((room.cpu_milli, cpu_per_gpu), (room.memory_mib, mem_per_gpu)) if rate > 0]
    return max(0.0, sum(room.free) - min(fed)) if fed else 0.0


def choices(room: Room, r: Request) -> list[tuple[tuple[int, ...], Room]]:
    """Each distinct way to place `r` on `room`: (GPU indices, the room left). Empty if it does not fit."""
    if not fits(room, r):
        return []
    cpu, mem = room.cpu_milli - r.cpu_milli, room.memory_mib - r.memory_mib
    free = room.free
    if r.gpus == 0:
        return [((), Room(free, cpu, mem))]
    if r.milli == WHOLE:
        gpus = tuple([g for g, f in enumerate(free) if f == WHOLE][: r.gpus])
        left = list(free)
        for g in gpus:
            left[g] = 0
        return [(gpus, Room(tuple(left), cpu, mem))]
    out, seen = [], set()
    for g, f in enumerate(free):  # one GPU per distinct free value: the lowest index that has it
        if f >= r.milli and f not in seen:
            seen.add(f)
            left = list(free)
            left[g] = f - r.milli
            out.append(((g,), Room(tuple(left), cpu, mem)))
    return out


def shape_of(room: Room) -> tuple:
    """What a score depends on: the free values as a multiset, CPU and memory (GPU order does not matter)."""
    return (tuple(sorted(room.free)), room.cpu_milli, room.memory_mib)


class Placer:
    """The machines' rooms grouped by shape; `choose` finds the best machine and GPUs, `take` applies it."""

    def __init__(self, rooms: Sequence[Room], policy: str = "bestfit", sizes: Iterable[tuple[Request, int]] = ()):
        if policy not in POLICIES:
            raise ValueError(f"placement must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy = policy
        self.sizes: Sizes = tuple((r, n) for r, n in sizes if n > 0)
        self.rooms = list(rooms)
        self._gid: dict[tuple, int] = {}  # shape -> a small number naming it (cheap to hash in the memo)
        self._rid: dict[Request, int] = {}
        self.groups: dict[int, list[int]] = {}  # shape's number -> machine indices in order
        for i, room in enumerate(self.rooms):
            self.groups.setdefault(self._shape_id(room), []).append(i)
        self._frag: dict[tuple, int] = {}
        scored = plus_sizes(self.sizes) if policy == "fgd+" else self.sizes  # what the fragmentation weighs
        self._scored: Sizes = scored
        self._count = sum(n for _, n in scored) or 1
        self._per_gpu = per_gpu(scored)
        self._unusable: dict[tuple, float] = {}
        self._best: dict[tuple[int, int], tuple | None] = {}  # (shape, request) -> (score, free value taken)

    def _shape_id(self, room: Room) -> int:
        key = shape_of(room)
        g = self._gid.get(key)
        if g is None:
            g = self._gid[key] = len(self._gid)
        return g

    def _fragmentation(self, room: Room) -> int:
        key = shape_of(room)
        v = self._frag.get(key)
        if v is None:
            v = self._frag[key] = fragmentation(room, self._scored)
        return v

    def _unusable_of(self, room: Room) -> float:
        """fgd+'s measure: the expected fragment for a task of the weighted sizes (`plus_sizes`) plus the capacity
        stranded by CPU/memory at the weighted sizes' rates."""
        key = shape_of(room)
        v = self._unusable.get(key)
        if v is None:
            v = self._unusable[key] = self._fragmentation(room) / self._count + stranded(room, *self._per_gpu)
        return v

    def _score(self, room: Room, left: Room, tight: int) -> tuple:
        """Lower is better. `tight`: what the GPU a share goes to keeps free (0 for whole GPUs)."""
        after = sum(left.free)
        if self.policy == "fgd":
            return (self._fragmentation(left) - self._fragmentation(room), after, tight, left.cpu_milli)
        if self.policy == "fgd+":
            return (self._unusable_of(left) - self._unusable_of(room), after, tight, left.cpu_milli)
        if self.policy == "bestfit":
            return (after, tight, left.cpu_milli)
        return (-after, tight, -left.cpu_milli)

    def _best_on(self, room: Room, r: Request) -> tuple | None:
        best = None
        for gpus, left in choices(room, r):
            took = room.free[gpus[0]] if gpus else None
            s = self._score(room, left, left.free[gpus[0]] if gpus and r.milli < WHOLE else 0)
            if best is None or s < best[0]:
                best = (s, took)
        return best

    def choose(self, r: Request, allowed=None) -> tuple[int, tuple[int, ...]] | None:
        """The machine (its index) and GPU indices for `r`, or None when no machine (in `allowed`) fits it."""
        rid = self._rid.get(r)
        if rid is None:
            rid = self._rid[r] = len(self._rid)
        memo, rooms = self._best, self.rooms
        best = None
        for gid, members in self.groups.items():
            if allowed is None:
                i = members[0]
            else:
                i = next((m for m in members if m in allowed), None)
                if i is None:
                    continue
            k = (gid, rid)
            b = memo.get(k, memo)
            if b is memo:
                b = memo[k] = self._best_on(rooms[i], r)
            if b is not None and (best is None or b[0] < best[0] or (b[0] == best[0] and i < best[1])):
                best = (b[0], i, b[1])
        if best is None:
            return None
        i, took = best[1], best[2]
        room = rooms[i]
        if r.gpus == 0:
            return i, ()
        if r.milli == WHOLE:
            return i, tuple([g for g, f in enumerate(room.free) if f == WHOLE][: r.gpus])
        return i, (room.free.index(took),)

    def take(self, i: int, gpus: tuple[int, ...], r: Request) -> None:
        """Machine i gives `r` the GPUs `gpus` (as `choose` returned them)."""
        room = self.rooms[i]
        free = list(room.free)
        for g in gpus:
            free[g] -= r.milli
            if free[g] < 0:
                raise ValueError(f"GPU {g} of machine {i} has too little free for {r.milli} thousandths")
        new = Room(tuple(free), room.cpu_milli - r.cpu_milli, room.memory_mib - r.memory_mib)
        old = self._shape_id(room)
        members = self.groups[old]
        del members[bisect_left(members, i)]
        if not members:
            del self.groups[old]
        insort(self.groups.setdefault(self._shape_id(new), []), i)
        self.rooms[i] = new


def sizes_of(requests: Iterable[Request]) -> Sizes:
    """The task distribution of these requests (each distinct request with how many times it appears), in a
    fixed order so that plans built from it are deterministic."""
    counts: dict[Request, int] = {}
    for r in requests:
        counts[r] = counts.get(r, 0) + 1
    return tuple(sorted(counts.items(), key=lambda x: (x[0].gpus, x[0].milli, x[0].cpu_milli, x[0].memory_mib)))


def fgd_share(candidates, milli: int, sizes: Sizes, memo: dict | None = None) -> tuple[int, int] | None:
    """(machine, gpu) for a worker sharing `milli` thousandths of one GPU, where the fragmentation grows least
    (ties: the tighter fit, then machine and GPU index); None when no GPU has room. `candidates`: (machine index,
    its per-GPU free thousandths: `gpushare.free_milli`); CPU and memory are already checked by the caller,
    so the sizes are scored on GPUs alone. `memo`: a dict kept across calls with the same sizes (a cycle's)."""
    frag: dict = {} if memo is None else memo
    gpu_sizes = frag.get("sizes")
    if gpu_sizes is None:
        gpu_sizes = frag["sizes"] = _gpu_only(sizes)

    def f(free: Free) -> int:
        key = tuple(sorted(free))
        v = frag.get(key)
        if v is None:
            v = frag[key] = fragmentation(Room(free, 0, 0), gpu_sizes)
        return v

    best = None
    # Machines with the same free tuple score the same, for this share: kept with the memo (a cycle's)
    on: dict[tuple[Free, int], tuple | None] = frag.setdefault("on", {})
    for i, free in candidates:
        hit = on.get((free, milli), on)
        if hit is on:
            hit = on[free, milli] = _share_on(free, milli, f)
        if hit is not None:
            key = (hit[0], hit[1], i, hit[2])
            if best is None or key < best:
                best = key
    return None if best is None else (best[2], best[3])


def _share_on(free: Free, milli: int, f) -> tuple[int, int, int] | None:
    """(fragmentation growth, what the GPU keeps free, GPU) of the best GPU of one machine for a share."""
    if max(free, default=0) < milli:
        return None
    before = f(free)
    best, seen = None, set()
    for g, v in enumerate(free):  # one GPU per distinct free value: the lowest index that has it
        if v < milli or v in seen:
            continue
        seen.add(v)
        left = list(free)
        left[g] = v - milli
        key = (f(tuple(left)) - before, v - milli, g)
        if best is None or key < best:
            best = key
    return best


def _gpu_only(sizes: Sizes) -> Sizes:
    out: dict[Request, int] = {}
    for r, n in sizes:
        k = Request(r.gpus, r.milli)
        out[k] = out.get(k, 0) + n
    return tuple(out.items())


def sizes_of_gpus(counts: dict) -> Sizes:
    """`sizes_of` from a count of `WorkerRequest.gpus` values (whole GPUs, or 0 < gpus < 1 for a share)."""
    merged: dict[Request, int] = {}
    for g, n in counts.items():
        r = request_of(g)
        merged[r] = merged.get(r, 0) + n
    return tuple(sorted(merged.items(), key=lambda x: (x[0].gpus, x[0].milli)))


def request_of(gpus: float, cpu_cores: float = 0.0, memory_bytes: int = 0) -> Request:
    """A worker's request (`WorkerRequest.gpus`: whole GPUs, or 0 < gpus < 1 for a share of one) in thousandths."""
    if 0 < gpus < 1:
        return Request(1, max(1, min(WHOLE - 1, round(gpus * WHOLE))), round(cpu_cores * 1000), memory_bytes >> 20)
    return Request(int(gpus), WHOLE, round(cpu_cores * 1000), memory_bytes >> 20)


def whole_order(gpus: int, top: int, sizes: Sizes, policy: str) -> list[int]:
    """The free whole-GPU counts (gpus..top) a worker of `gpus` whole GPUs should look at first: for `fgd` the
    count whose machines' fragmentation grows least when it takes them (a machine with f free GPUs is a room
    of f whole GPUs), ties the fewer; `spread` the most first; `bestfit` the fewest first."""
    counts = range(gpus, top + 1)
    if policy == "spread":
        return list(reversed(counts))
    if policy != "fgd" or not sizes:
        return list(counts)
    gpu_sizes = _gpu_only(sizes)

    def frag(f: int) -> int:
        return fragmentation(Room((WHOLE,) * f), gpu_sizes)

    return sorted(counts, key=lambda f: (frag(f - gpus) - frag(f), f))
