"""The cluster's room during one cycle, and placing workers on it.

`Cluster` is built once per cycle from the snapshot and is the only mutable thing in the cycle: each start
takes room, and once the head is known its room is held. Machines are kept sorted by name (index order =
name order) and indexed by their count of free GPUs (`buckets`), so best fit — the machine with the fewest
free GPUs that still fits, ties by name — is a scan of a few buckets instead of every machine.

Two views of the room:
- view A, all free room: runs before the head, and runs behind it whose time limit ends before the shadow time;
- view B, free room less what is held for the head: every other run behind the head. The hold is per
  resource: on a machine whose GPUs are promised, CPU cores and memory the head does not need stay usable.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from .model import Machine, NodeSelection, Placement, Snapshot, WaitingRun, WorkerRequest
from .reasons import gib, number

Shape = tuple[int, float, int]  # (gpus, cpu cores, memory bytes) of one worker


def shape(w: WorkerRequest) -> Shape:
    return (w.gpus, w.cpu_cores, w.memory_bytes)


def by_worker_index(p: Placement) -> int:
    return p.worker_index


def placement_order(workers) -> list[WorkerRequest]:
    """Largest workers first (they are the hardest to place), then by index: one fixed order."""
    return sorted(workers, key=lambda w: (-w.gpus, -w.cpu_cores, -w.memory_bytes, w.index))


class Cluster:
    def __init__(self, snapshot: Snapshot):
        machines: list[Machine] = sorted(snapshot.machines, key=lambda m: m.name)
        self.machines = machines
        self.names = [m.name for m in machines]
        self.index = {m.name: i for i, m in enumerate(machines)}
        self.cap_g = [m.gpus for m in machines]
        self.cap_c = [m.cpu_cores for m in machines]
        self.cap_m = [m.memory_bytes for m in machines]
        self.schedulable = [m.schedulable for m in machines]
        # A run stopped at its time limit holds its room for its machine's stop grace too.
        self.max_grace = max((m.stop_grace_seconds for m in machines), default=0.0)
        self._labels: list[dict[str, str]] | None = None  # per machine, made when a run selects by labels
        self.all_schedulable = [i for i, m in enumerate(machines) if m.schedulable]
        # Who holds GPUs on each machine, for the "why not" lines: made when first asked (`holders`).
        self._running = snapshot.running
        self._holders: list[dict[str, list]] | None = None
        self._taken: list[tuple] = []  # (machine, run, workspace, priority, gpus) started before `holders` is made

        free_g: list[list[int]] = [list(range(cap)) for cap in self.cap_g]
        self.free_g = free_g
        self.free_c = free_c = list(self.cap_c)
        self.free_m = free_m = list(self.cap_m)
        index_get = self.index.get
        for unit in snapshot.running:
            for w in unit.workers:
                i = index_get(w.machine)
                if i is None:
                    continue
                free = free_g[i]
                for g in w.gpu_indices:
                    if g in free:
                        free.remove(g)  # free GPUs stay in index order
                free_c[i] -= w.cpu_cores
                free_m[i] -= w.memory_bytes
        self.max_g = max(self.cap_g, default=0)
        self.buckets: list[list[int]] = [[] for _ in range(self.max_g + 1)]
        for i in self.all_schedulable:
            self.buckets[len(self.free_g[i])].append(i)  # appended in index order: each bucket is sorted
        self.top = self.max_g  # no bucket above this one holds a machine (free room only shrinks in a cycle)
        # The head's hold: machine -> [gpus, cpu, memory] of free room kept for it, and what runs that end
        # before the shadow time took on those machines (that room comes back in time).
        self.held: dict[int, list] = {}
        self.ending: dict[int, list] = {}
        self._allowed_cache: dict[tuple, tuple[int, frozenset[int] | None, list[int] | None]] = {}

    # ------------------------------------------------------------------------------------------- machines

    @property
    def holders(self) -> list[dict[str, list]]:
        """Per machine: run -> [workspace, priority, GPUs held] (workspace and priority as first seen)."""
        if self._holders is None:
            holders: list[dict[str, list]] = [{} for _ in self.machines]
            index_get = self.index.get
            for unit in self._running:
                run = unit.run
                for w in unit.workers:
                    i = index_get(w.machine)
                    if i is None:
                        continue
                    h = holders[i].get(run)
                    if h is None:
                        holders[i][run] = [unit.workspace, unit.priority, len(w.gpu_indices)]
                    else:
                        h[2] += len(w.gpu_indices)
            self._holders = holders
            for t in self._taken:
                self._note_holder(*t)
            self._taken = []
        return self._holders

    def _note_holder(self, i: int, run: str, workspace: str, priority: int, gpus: int) -> None:
        if self._holders is None:
            self._taken.append((i, run, workspace, priority, gpus))
            return
        h = self._holders[i].get(run)
        if h is None:
            self._holders[i][run] = [workspace, priority, gpus]
        else:
            h[2] += gpus

    @property
    def labels(self) -> list[dict[str, str]]:
        if self._labels is None:
            self._labels = [dict(m.labels) for m in self.machines]
        return self._labels

    def allowed(self, run: WaitingRun) -> tuple[int, frozenset[int] | None, list[int] | None]:
        """(key, set, sorted list) of schedulable machines the run may use; set None = every schedulable one."""
        k = (run.node_selection, run.excluded_machines)
        hit = self._allowed_cache.get(k)
        if hit is not None:
            return hit
        sel = run.node_selection
        excluded = {self.index[n] for n, _ in run.excluded_machines if n in self.index}
        if sel.mode == "Any" and not excluded:
            result: tuple = (len(self._allowed_cache), None, None)
        else:
            chosen = [i for i in self.all_schedulable if i not in excluded and self.selected(sel, i)]
            result = (len(self._allowed_cache), frozenset(chosen), chosen)
        self._allowed_cache[k] = result
        return result

    def selected(self, sel: NodeSelection, i: int) -> bool:
        if sel.mode == "Names":
            return self.names[i] in sel.names
        if sel.mode == "Labels":
            labels = self.labels[i]
            return all(labels.get(k) == v for k, v in sel.labels)
        return True

    def room(self, i: int, view_b: bool) -> tuple[int, float, int]:
        """Free (gpus, cpu, memory) on machine i in the view; view B leaves the head's hold alone."""
        fg, fc, fm = len(self.free_g[i]), self.free_c[i], self.free_m[i]
        if view_b:
            h = self.held.get(i)
            if h is not None:
                e = self.ending.get(i, (0, 0.0, 0))
                fg = min(fg, fg + e[0] - h[0])
                fc = min(fc, fc + e[1] - h[1])
                fm = min(fm, fm + e[2] - h[2])
        return fg, fc, fm

    # ------------------------------------------------------------------------------------------ placement

    def best_machine(
        self, s: Shape, allowed: frozenset[int] | None, allowed_list: list[int] | None, avoid, view_b: bool
    ) -> int | None:
        """Best fit for one worker: fewest free GPUs that still fits, ties by name."""
        g, c, m = s
        if allowed_list is not None and len(allowed_list) <= 32:
            best = None
            for i in allowed_list:
                if i in avoid:
                    continue
                fg, fc, fm = self.room(i, view_b)
                if fg >= g and fc >= c and fm >= m and (best is None or (fg, i) < best):
                    best = (fg, i)
            return None if best is None else best[1]
        held = self.held if view_b else ()
        while self.top > 0 and not self.buckets[self.top]:
            self.top -= 1
        best = None
        free_c, free_m = self.free_c, self.free_m
        for cnt in range(g, self.top + 1):
            for i in self.buckets[cnt]:
                if free_c[i] >= c and free_m[i] >= m and i not in avoid and i not in held:
                    if allowed is None or i in allowed:
                        best = (cnt, i)
                        break
            if best is not None:
                break
        for i in held:
            if i in avoid or (allowed is not None and i not in allowed):
                continue
            fg, fc, fm = self.room(i, True)
            if fg >= g and fc >= c and fm >= m and (best is None or (fg, i) < best):
                best = (fg, i)
        return None if best is None else best[1]

    def place(
        self, workers, allowed, allowed_list, avoid: frozenset[int], view_b: bool
    ) -> list[tuple[WorkerRequest, int]] | None:
        """Machines for all `workers` at once (one worker per machine when there are several), or None."""
        if len(workers) == 1:
            w = workers[0]
            if w.gpus > self.max_g:
                return None
            i = self.best_machine(shape(w), allowed, allowed_list, avoid, view_b)
            return None if i is None else [(w, i)]
        used = set(avoid)
        out = []
        for w in placement_order(workers):
            i = self.best_machine(shape(w), allowed, allowed_list, used, view_b)
            if i is None:
                return None
            used.add(i)
            out.append((w, i))
        return out

    def commit(
        self, run: str, workspace: str, priority: int, chosen, ends_before_shadow: bool
    ) -> tuple[Placement, ...]:
        """Take the room; lowest free GPU indices first."""
        out = []
        free_g, buckets, held = self.free_g, self.buckets, self.held
        for w, i in chosen:
            free = free_g[i]
            before = len(free)
            n = w.gpus
            gpus = tuple(free[:n])
            del free[:n]
            if n and self.schedulable[i]:
                b = buckets[before]
                del b[bisect_left(b, i)]
                insort(buckets[before - len(gpus)], i)
            self.free_c[i] -= w.cpu_cores
            self.free_m[i] -= w.memory_bytes
            if ends_before_shadow and i in held:
                e = self.ending.setdefault(i, [0, 0.0, 0])
                e[0] += n
                e[1] += w.cpu_cores
                e[2] += w.memory_bytes
            if n:
                self._note_holder(i, run, workspace, priority, n)
            out.append(Placement(w.index, self.names[i], gpus, w.cpu_cores, w.memory_bytes))
        if len(out) > 1:
            out.sort(key=by_worker_index)
        return tuple(out)

    # ------------------------------------------------------------------------------ could it ever run here

    def never_fits(self, run: WaitingRun, workers, allowed_list: list[int] | None) -> str | None:
        """Why the run cannot run on this cluster even if it were empty, or None if it could."""
        machines = self.all_schedulable if allowed_list is None else allowed_list
        restricted = allowed_list is not None
        if not machines:
            if run.node_selection.mode != "Any" and not any(
                self.selected(run.node_selection, i) for i in self.all_schedulable
            ):
                return "no machine matches its node_selection"
            return "no schedulable machine it may use"
        largest = "the largest machine it may use has" if restricted else "the largest machine has"
        fitting: set[int] = set()
        for s in sorted({shape(w) for w in workers}):
            g, c, m = s
            ok = [i for i in machines if self.cap_g[i] >= g and self.cap_c[i] >= c and self.cap_m[i] >= m]
            if not ok:
                top_g = max(self.cap_g[i] for i in machines)
                top_c = max(self.cap_c[i] for i in machines)
                top_m = max(self.cap_m[i] for i in machines)
                if g > top_g:
                    return f"asks for {g} GPUs on one machine; {largest} {top_g}"
                if c > top_c:
                    return f"asks for {number(c)} CPU cores on one machine; {largest} {number(top_c)}"
                if m > top_m:
                    return f"asks for {gib(m)} of memory on one machine; {largest} {gib(top_m)}"
                return f"no machine has {g} GPUs, {number(c)} CPU cores and {gib(m)} of memory for one worker"
            need = sum(1 for w in workers if shape(w) == s)
            if len(ok) < need:
                return f"asks for {need} machines (one worker on each); only {len(ok)} can hold its workers"
            fitting.update(ok)
        if len(fitting) < len(workers):
            return f"asks for {len(workers)} machines (one worker on each); only {len(fitting)} can hold its workers"
        return None

