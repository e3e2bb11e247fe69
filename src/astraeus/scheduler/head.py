"""The head: when it will start (shadow time), whom to preempt for it, and the room held for it.

`HeadFit` answers "does the head fit if this running work were gone?" incrementally: it keeps, for each
distinct worker shape of the head, the set of machines where that shape fits given the room added so far, so
adding a unit's room costs only the machines it touches. The full placement (best fit, one worker per
machine) runs only once the cheap count check passes. A head of MIG devices (issue 46) counts, in place of GPUs,
the free devices of its profile and those its holders free.
"""

from __future__ import annotations

from .cluster import Cluster, Shape, placement_order, shape
from .model import RunningUnit, WorkerRequest
from .progress import work_lost


class HeadFit:
    def __init__(self, cluster: Cluster, workers, machines: list[int]):
        self.cluster = cluster
        self.workers: list[WorkerRequest] = placement_order(workers)
        # Issue 46: a MIG head's profile ("" else): its room is devices of that profile, its shape (devices, cpu,
        # memory); whole and shared GPUs freed are not its, nor MIG devices freed for a head of GPUs
        self.mig = self.workers[0].mig if self.workers and self.workers[0].mig_count else ""
        self.shape = _mig_shape if self.mig else shape
        self.machine_set = frozenset(machines)
        # Names whose index is one of `machines` (a worker on a machine not in the cluster touches none).
        self.machine_names = frozenset([name for name, i in cluster.index.items() if i in self.machine_set])
        self.shapes: list[Shape] = sorted({self.shape(w) for w in self.workers}, key=lambda s: (-s[0], -s[1], -s[2]))
        self.need = [sum(1 for w in self.workers if self.shape(w) == s) for s in self.shapes]
        self.extra: dict[int, list] = {}  # machine -> [gpus, cpu, memory] that the added units free
        # Issue 46: (machine, gpu) -> thousandths of a shared GPU its added tenants free; the GPU counts as freed
        # (one more in `extra`) only once every tenant on it is added: its tenants are victims as units.
        self.shared_freed: dict[tuple[int, int], int] = {}
        self.dropped: set[int] = set()  # machines the head may no longer start on (a reservation's window nears)
        # Issue 46: machine -> the GPUs (indices) the added units free, where the machine has NVLink islands (the
        # head's workers fit only inside one island there)
        self.islands = cluster.fleet.islands if cluster.fleet.any_islands and not self.mig else None
        self.freed: dict[int, list[int]] = {}
        self.fit: list[set[int]] = [set() for _ in self.shapes]
        for i in machines:
            self._refresh(i)

    def room(self, i: int) -> tuple[int, float, int]:
        c = self.cluster
        e = self.extra.get(i)
        fg = len(c.mig_free(i, self.mig)) if self.mig else len(c.free_g[i])
        if e is None:
            return fg, c.free_c[i], c.free_m[i]
        return fg + e[0], c.free_c[i] + e[1], c.free_m[i] + e[2]

    def drop(self, i: int) -> None:
        """The head may not start on machine i from now on (in the time `shadow` has reached)."""
        self.dropped.add(i)
        for f in self.fit:
            f.discard(i)

    def _refresh(self, i: int) -> None:
        if i in self.dropped:
            return
        fg, fc, fm = self.room(i)
        isl = self.islands is not None and self.islands[i]
        for k, (g, c, m) in enumerate(self.shapes):
            if fg >= g and fc >= c and fm >= m and (
                    not isl or self.cluster.island_fits(i, g, tuple(self.freed.get(i, ())))):
                self.fit[k].add(i)
            else:
                self.fit[k].discard(i)

    def touches(self, unit: RunningUnit) -> bool:
        names = self.machine_names
        for w in unit.workers:
            if w.machine in names:
                return True
        return False

    def add(self, unit: RunningUnit, sign: int = 1) -> bool:
        """Count (sign=1) or stop counting (sign=-1) the unit's room as free. True if it touched the head's machines."""
        touched = False
        idx = self.cluster.index
        for w in unit.workers:
            i = idx.get(w.machine)
            if i is None or i not in self.machine_set:
                continue
            e = self.extra.setdefault(i, [0, 0.0, 0])
            if w.mig_devices:
                # MIG devices free no GPU a head may take (a MIG GPU takes MIG workers only); a MIG head counts
                # the devices of its profile
                if self.mig:
                    e[0] += sign * sum(1 for d in w.mig_devices if d[1] == self.mig)
            elif self.mig:
                pass  # GPUs freed whole or shared are not a MIG head's
            elif w.gpu_milli and w.gpu_indices:
                e[0] += self._free_share(i, w.gpu_indices[0], sign * w.gpu_milli)
            else:
                e[0] += sign * len(w.gpu_indices)
                if self.islands is not None and self.islands[i]:
                    freed = self.freed.setdefault(i, [])
                    for g in w.gpu_indices:
                        if sign > 0:
                            freed.append(g)
                        else:
                            freed.remove(g)
            e[1] += sign * w.cpu_cores
            e[2] += sign * w.memory_bytes
            self._refresh(i)
            touched = True
        return touched

    def _free_share(self, i: int, g: int, milli: int) -> int:
        """Count `milli` more (or less) of shared GPU g as freed; +1/-1 when that frees (un-frees) the whole GPU."""
        on = self.cluster.shared.get(i, {}).get(g)
        used = on[0] if on is not None else milli
        before = self.shared_freed.get((i, g), 0)
        after = self.shared_freed[(i, g)] = before + milli
        return (after >= used) - (before >= used)

    def placement(self) -> list[tuple[WorkerRequest, int]] | None:
        for k, n in enumerate(self.need):
            if len(self.fit[k]) < n:
                return None
        if len(self.shapes) > 1 and len(set().union(*self.fit)) < len(self.workers):
            return None
        used: set[int] = set()
        out = []
        for w in self.workers:
            k = self.shapes.index(self.shape(w))
            best = None
            for i in self.fit[k]:
                if i not in used:
                    key = (self.room(i)[0], i)
                    if best is None or key < best:
                        best = key
            if best is None:
                return None
            used.add(best[1])
            out.append((w, best[1]))
        return out

    def holds(self, chosen) -> dict[int, list]:
        """The free room the head takes at its start that is free now: per machine and per resource, what the
        head needs beyond the room that the counted units give back."""
        held: dict[int, list] = {}
        for w, i in chosen:
            e = self.extra.get(i, (0, 0.0, 0))
            if self.mig:
                # Issue 46: [0, cpu, memory, free devices of the profile held, the profile] (Cluster._place_mig)
                h = [0, max(0.0, w.cpu_cores - e[1]), max(0, w.memory_bytes - e[2]), max(0, w.mig_count - e[0]),
                     self.mig]
                if h[1] or h[2] or h[3]:
                    held[i] = h
                continue
            g = 1 if w.gpus.__class__ is float else w.gpus  # a fractional head waits for a whole free GPU
            h = [max(0, g - e[0]), max(0.0, w.cpu_cores - e[1]), max(0, w.memory_bytes - e[2])]
            if h[0] or h[1] or h[2]:
                held[i] = h
        return held


def _mig_shape(w: WorkerRequest) -> Shape:
    """A MIG worker's shape as a MIG head counts it: (devices, cpu cores, memory)."""
    return (w.mig_count, w.cpu_cores, w.memory_bytes)


def unit_order_key(u: RunningUnit) -> tuple:
    return (u.run, u.workers[0].name if u.workers else "")


def _victim_order(u: RunningUnit) -> tuple:
    """Lowest priority first, among equals the most recently started (then `unit_order_key`)."""
    return (u.priority, -u.started_at, u.run, u.workers[0].name if u.workers else "")


def unit_grace(cluster: Cluster, u: RunningUnit) -> float:
    idx = cluster.index
    return max((cluster.machines[idx[w.machine]].stop_grace_seconds for w in u.workers if w.machine in idx), default=0.0)


def shadow(
    cluster: Cluster, fit: HeadFit, running, now: float, deadlines: dict[int, float] | None = None
) -> tuple[float | None, dict[int, list]]:
    """The earliest time enough room frees for the head, from time limits and stop graces (work stopped at its
    time limit, or stopping now, is gone when its machine's stop grace runs out), and the room to hold now. If
    work without a time limit must end first, the time is None and the room held is the room the head would take
    once that work ends (oldest first). `deadlines`: machine -> the latest time the head may start there (another
    namespace's reservation opens after it); past it the machine does not count."""
    late = sorted((t, i) for i, t in deadlines.items()) if deadlines else []
    events = []
    unlimited = []
    for u in running:
        if not fit.touches(u):
            continue
        if u.stopping:
            events.append((now + unit_grace(cluster, u), unit_order_key(u), u))
        elif u.time_limit_seconds is not None:
            # Stopped at its time limit, it is gone once its stop grace has run out too.
            end = max(now, u.started_at + u.time_limit_seconds) + unit_grace(cluster, u)
            events.append((end, unit_order_key(u), u))
        else:
            unlimited.append(((u.started_at,) + unit_order_key(u), u))
    events.sort(key=lambda e: (e[0], e[1]))
    n = len(events)
    k = 0
    d = 0
    while k < n:
        t = events[k][0]
        while k < n and events[k][0] == t:
            fit.add(events[k][2])
            k += 1
        while d < len(late) and late[d][0] < t:
            fit.drop(late[d][1])
            d += 1
        chosen = fit.placement()
        if chosen is not None:
            return t, fit.holds(chosen)
    for _, i in late[d:]:
        fit.drop(i)  # work without a time limit ends at no known time
    unlimited.sort(key=lambda e: e[0])
    for _, u in unlimited:
        fit.add(u)
        chosen = fit.placement()
        if chosen is not None:
            return None, fit.holds(chosen)
    return None, {}


def least_work_lost_order(now: float):
    """Lowest priority first, among equals the fewest GPU-seconds lost since the last checkpoint (issue 47)."""

    def key(u: RunningUnit) -> tuple:
        lost = work_lost(now, u.started_at, u.last_checkpoint, sum(len(w.gpu_indices) for w in u.workers))
        return (u.priority, lost) + _victim_order(u)[1:]

    return key


def choose_victims(fit: HeadFit, priority: int, running, order=None) -> tuple[list[RunningUnit], list] | None:
    """The least running work of strictly lower priority that makes room for the head, or None.

    Lowest priority first, among equals the most recently started (or `order`, a sort key: least_work_lost_order);
    a unit (gang) is taken whole. Then units
    not needed are dropped: first those with no worker on a machine the head would use, then, in reverse
    order, each one without which the head still fits. What remains is minimal: without any one of it, the
    head does not fit.
    """
    touches = fit.touches
    candidates = [u for u in running if not u.stopping and u.priority < priority and touches(u)]
    candidates.sort(key=order or _victim_order)
    chosen: list[RunningUnit] = []
    placed = None
    for u in candidates:
        fit.add(u)
        chosen.append(u)
        placed = fit.placement()
        if placed is not None:
            break
    if placed is None:
        for u in chosen:
            fit.add(u, -1)
        return None
    used = {i for _, i in placed}
    idx = fit.cluster.index
    kept = []
    for u in chosen:
        if any(idx.get(w.machine) in used for w in u.workers):
            kept.append(u)
        else:
            fit.add(u, -1)
    for u in reversed(list(kept)):
        fit.add(u, -1)
        if fit.placement() is not None:
            kept.remove(u)
        else:
            fit.add(u)
    again = fit.placement()
    if again is None:
        # Greedy placement of mixed worker shapes is not exact; never return a set that does not make room.
        for u in chosen:
            if u not in kept:
                fit.add(u)
        return chosen, fit.placement() or placed
    return kept, again
