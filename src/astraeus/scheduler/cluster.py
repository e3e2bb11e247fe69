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
from collections import Counter
from itertools import chain, filterfalse, islice
from operator import attrgetter

from . import fragments, gpushare, topology
from . import reasons as R
from .model import Machine, NodeSelection, Placement, Snapshot, WaitingRun, WorkerRequest, placement
from .reasons import gib, number

Shape = tuple[int, float, int]  # (gpus, cpu cores, memory bytes) of one worker

# A run restricted to more machines than this gets free-GPU buckets of its own (`Cluster.sub_buckets`), so best
# fit scans only its machines; up to this many, scanning its list is cheaper. 0 in tests: always the buckets.
SCAN_AT_MOST = 32
# A restricted list of at least 1/WIDE of the schedulable machines scans the cluster's buckets instead, each machine
# checked against it: buckets of its own would cost every start on its machines one more move (`_move`). When one
# bucket shows more than PROBE_AT_MOST machines outside it before one of its own fits, it takes its own after all.
# 0: no list scans the cluster's buckets. Tests set both to exercise each way.
WIDE = 8
PROBE_AT_MOST = 64


_UNSET = object()
_NO_SHARES: dict[int, list] = {}  # a machine without shared GPUs (read only)
_gpus, _workers = attrgetter("gpus"), attrgetter("workers")


def shape(w: WorkerRequest) -> Shape:
    return (w.gpus, w.cpu_cores, w.memory_bytes)


def by_worker_index(p: Placement) -> int:
    return p.worker_index


def placement_order(workers) -> list[WorkerRequest]:
    """Largest workers first (they are the hardest to place), then by index: one fixed order."""
    return sorted(workers, key=lambda w: (-w.gpus, -w.cpu_cores, -w.memory_bytes, w.index))


class Reserved:
    """The cycle's reservations as they restrict a workspace's runs: per machine the why-not line of each machine
    another namespace has reserved (open window: always; upcoming window: unless the run's time limit and the
    machine's stop grace end it by the start). Reservations are never named here (they are another namespace's)."""

    def __init__(self, snapshot: Snapshot, index: dict[str, int], machines: list[Machine], now: float):
        self.now = now
        self.machines = machines
        self.by_name = {r.name: r for r in snapshot.reservations}
        self.open: list[tuple] = []  # (reservation, machine indices) with start <= now < end
        self.upcoming: list[tuple] = []  # (reservation, machine indices) with now < start
        for r in sorted(snapshot.reservations, key=lambda r: (r.start, r.name)):
            if r.end is not None and r.end <= now:
                continue  # ended: restricts nothing
            idx = sorted({index[m] for m in r.machines if m in index})
            (self.open if r.start <= now else self.upcoming).append((r, idx))
        self._ws: dict[str, tuple[dict[int, str], list]] = {}
        self._timed: dict[tuple, tuple] = {}
        self._none = (None, {})

    def open_for(self, ws: str) -> dict[int, str]:
        """The machines open reservations of other namespaces keep from `ws` now (empty when none)."""
        if not self.open:
            return {}
        return self._for(ws)[0]

    def _for(self, ws: str) -> tuple[dict[int, str], list]:
        hit = self._ws.get(ws)
        if hit is None:
            lines: dict[int, str] = {}
            for r, idx in self.open:
                if ws not in r.workspaces:
                    for i in idx:
                        lines.setdefault(i, R.RESERVED_NOW)
            upcoming = [(r, idx) for r, idx in self.upcoming if ws not in r.workspaces]
            hit = self._ws[ws] = (lines, upcoming)
        return hit

    def affects(self, ws: str) -> bool:
        """Does any reservation keep machines from this workspace's runs (now, or for some time limit)?"""
        lines, upcoming = self._for(ws)
        return bool(lines or upcoming)

    def deadlines(self, ws: str, time_limit: float | None) -> dict[int, float]:
        """Machine -> the latest start on it for a run of `ws` with this time limit (another namespace's window
        opens after that), for the machines it may use now only because its time limit ends it by the start."""
        if not self.upcoming or time_limit is None:
            return {}
        out: dict[int, float] = {}
        for r, idx in self._for(ws)[1]:
            for i in idx:
                latest = r.start - time_limit - self.machines[i].stop_grace_seconds
                if latest >= self.now and latest < out.get(i, latest + 1):
                    out[i] = latest
        return out

    def exclusions(self, ws: str, time_limit: float | None) -> tuple:
        """(key, {machine: line}) of the machines reservations keep from a run of `ws` with this time limit; key
        None when there are none. The key is equal for equal exclusions (it keys Cluster.allowed's cache)."""
        if not self.open and not self.upcoming:
            return self._none
        lines, upcoming = self._for(ws)
        k = (ws, time_limit if upcoming else None)
        hit = self._timed.get(k)
        if hit is not None:
            return hit
        if upcoming:
            lines = dict(lines)
            now = self.now
            for r, idx in upcoming:
                for i in idx:
                    if i in lines:
                        continue
                    if time_limit is None:
                        lines[i] = R.reserved_before(r.start, False)
                    elif now + time_limit + self.machines[i].stop_grace_seconds > r.start:
                        lines[i] = R.reserved_before(r.start, True)
        hit = self._timed[k] = (frozenset(lines.items()) if lines else None, lines)
        return hit


class Fleet:
    """What a cycle takes from the machines alone: them sorted by name, their sizes, and the label index. Made
    once per machines tuple: the last one is kept, so a caller that passes the same tuple every cycle (the
    simulator) pays for it once. Read-only: a cycle's changing room lives in `Cluster`."""

    def __init__(self, given: tuple[Machine, ...]):
        self.given = given
        machines: list[Machine] = sorted(given, key=lambda m: m.name)
        self.machines = machines
        self.names = [m.name for m in machines]
        self.index = {m.name: i for i, m in enumerate(machines)}
        self.cap_g = [m.gpus - len(m.quarantined_gpus) for m in machines]  # a failed GPU is no room at all
        self.cap_c = [m.cpu_cores for m in machines]
        self.cap_m = [m.memory_bytes for m in machines]
        self.schedulable = [m.schedulable for m in machines]
        # A run stopped at its time limit holds its room for its machine's stop grace too.
        self.max_grace = max((m.stop_grace_seconds for m in machines), default=0.0)
        self.all_schedulable = [i for i, m in enumerate(machines) if m.schedulable]
        self.gpu_lists = [[g for g in range(m.gpus) if g not in m.quarantined_gpus] if m.quarantined_gpus
                          else list(range(m.gpus)) for m in machines]  # each cycle copies them as its free GPUs
        self.labels: list[dict[str, str]] | None = None  # per machine, made when a run selects by labels
        self.by_label: dict[tuple[str, str], set[int]] | None = None
        self.with_model: dict[str, frozenset[int]] = {}  # asked GPU model -> the machines that have it
        self.gpu_kinds: list[tuple[str, int]] | None = None  # per machine (GPU model, GPUs), made when first asked
        # What the machines alone decide, kept across the cycles that pass the same machines (the simulator, the
        # scale benchmark): per node selection that names no pool or reservation, (its why-not lines, the set and
        # sorted list of the machines it may use), and per (allowed list or None, shapes) whether the run could
        # ever fit (Cluster.never_fits); a list kept here is known by its id (`fixed`), the entry keeping it alive.
        self.allowed_by_selection: dict[NodeSelection, tuple[dict[int, str], frozenset[int] | None,
                                                               list[int] | None]] = {}
        self.fixed: set[int] = set()
        # Likewise per (node selection, its workspace's pools) where pools restrict it: (the pools, those answers)
        # for the last pools a cycle read (a cycle of other pools puts a new pair here; one that holds the old
        # answers still reads them)
        self.allowed_by_pools: tuple[tuple, dict[tuple, tuple]] | None = None
        self.never: dict[tuple, str | None] = {}
        self.topology_groups: dict[str, list[list[int]]] = {}  # topology label -> its groups (Cluster.topology_groups)
        # Issue 46: a GPU with MIG devices takes MIG workers only: it is not among the machine's GPUs here; per
        # machine its devices by profile (gpushare.mig_devices_of), per profile the machines that have it.
        self.any_mig = any(m.gpu_mig for m in machines)
        self.mig_of: list[dict[str, list[tuple[int, str, int]]]] = []
        self.mig_machines: dict[str, list[int]] = {}
        if self.any_mig:
            for i, m in enumerate(machines):
                devs = {p: [d for d in ds if d[0] not in m.quarantined_gpus]
                        for p, ds in gpushare.mig_devices_of(m.gpu_mig).items()}
                self.mig_of.append({p: ds for p, ds in devs.items() if ds})
                for p in self.mig_of[i]:
                    self.mig_machines.setdefault(p, []).append(i)
                mig_gpus = {g for g, ps in enumerate(m.gpu_mig) if ps}
                if mig_gpus:
                    self.gpu_lists[i] = [g for g in self.gpu_lists[i] if g not in mig_gpus]
                    self.cap_g[i] = len(self.gpu_lists[i])
        # Issue 46: per machine its NVLink islands (() for one island), and the GPUs its largest island holds; a
        # fleet without islands checks nothing more (`any_islands` False keeps today's fast path).
        self.islands = [m.nvlink_islands for m in machines]
        self.any_islands = any(self.islands)
        self.island_cap = [topology.largest_island(isl, gl) if isl else cap for isl, gl, cap in
                           zip(self.islands, self.gpu_lists, self.cap_g, strict=True)] if self.any_islands else self.cap_g


_last_fleet: list[Fleet] = []


def fleet(machines: tuple[Machine, ...]) -> Fleet:
    if _last_fleet and _last_fleet[0].given is machines:
        return _last_fleet[0]
    f = Fleet(machines)
    if type(machines) is tuple:  # immutable (of frozen machines): the same object is the same fleet
        _last_fleet[:] = [f]
    return f


class Cluster:
    def __init__(self, snapshot: Snapshot, now: float = 0.0, usage: dict | None = None, share_index: bool = True):
        """`usage`: workspace -> `queue.Usage` (a defaultdict), added to with each running worker's room as the
        room is taken (one pass over the running work for both). `share_index`: False to place fractional workers
        by a scan of every machine (the reference the index is tested against)."""
        self.fleet = f = fleet(snapshot.machines)
        self.machines = machines = f.machines
        self.names = f.names
        self.index = f.index
        self.cap_g = f.cap_g
        self.cap_c = f.cap_c
        self.cap_m = f.cap_m
        self.schedulable = f.schedulable
        self.max_grace = f.max_grace
        self.all_schedulable = f.all_schedulable
        # Who holds GPUs on each machine, for the "why not" lines: made per machine when first asked (`holders_of`;
        # grouped lines name the holders of a few machines only), from the running units on it (in snapshot order).
        self._units_on: list[list] = [[] for _ in machines]
        self._holders_on: dict[int, dict[str, list]] = {}
        self._taken: dict[int, list[tuple]] = {}  # machine -> (run, workspace, priority, gpus) started this cycle

        free_g: list[list[int]] = [g[:] for g in f.gpu_lists]
        self.free_g = free_g
        # Issue 46: machine -> gpu -> [thousandths used, {workspace: tenants}] of each GPU fractional workers share
        # (such a GPU is not in free_g: whole-GPU workers never take it).
        self.shared: dict[int, dict[int, list]] = {}
        self.mig_taken: dict[int, set[tuple[int, str, int]]] = {}  # issue 46: machine -> its MIG devices held
        self.gpu_sharing = snapshot.gpu_sharing
        # The share index (made on the first fractional worker, then kept by `commit`): who may share (a workspace,
        # or None: anyone) -> (whole free GPUs, free thousandths of its shared GPUs) -> the machines with that
        # room, in index order; per machine its keys there, and per who the machines in its groups.
        self.share_index = share_index
        self._share_groups: dict[str | None, dict[tuple, list[int]]] | None = None
        self._share_keys: dict[int, dict[str | None, tuple]] = {}
        self._share_members: dict[str | None, set[int]] = {}
        # Issue 46: the cluster's placement (fragments.POLICIES) and, for fgd, the workload's task sizes (made
        # when first asked) and the free-GPU counts in the order a whole-GPU worker of each size scans them.
        self.placement = snapshot.placement
        self._snapshot = snapshot
        self._sizes: tuple | None = None
        self._orders: dict[int, list[int]] = {}
        self._frag_memo: dict = {}  # fragments.fgd_share's, kept for the cycle
        self._no_group: set[tuple] = set()  # gang shapes no topology group holds this cycle
        self._group_sets: dict[int, tuple[list[int], frozenset[int]]] = {}  # a topology group's set, by id
        self._group_members: dict[tuple[int, int], tuple] = {}  # a group's machines a selection allows, by ids
        self._ranks: dict[int, dict[int, int]] = {}
        self.free_c = free_c = list(self.cap_c)
        self.free_m = free_m = list(self.cap_m)
        index_get = self.index.get
        units_on = self._units_on
        for unit in snapshot.running:
            use = None if usage is None else usage[unit.workspace]
            for w in unit.workers:
                gpu_indices = w.gpu_indices
                if use is not None:
                    use.gpus += gpushare.from_milli(w.gpu_milli) if w.gpu_milli else len(gpu_indices)
                    use.cpu_cores += w.cpu_cores
                    use.memory_bytes += w.memory_bytes
                    use.workers += 1
                i = index_get(w.machine)
                if i is None:
                    continue
                units_on[i].append(unit)
                if w.mig_devices:
                    self.mig_taken.setdefault(i, set()).update(w.mig_devices)
                elif w.gpu_milli and gpu_indices:
                    self._share(i, gpu_indices[0], w.gpu_milli, unit.workspace)
                free = free_g[i]
                n = len(gpu_indices)
                if n > 1 and gpu_indices == tuple(free[:n]):
                    del free[:n]  # the lowest free GPUs, as `commit` takes them
                else:
                    for g in gpu_indices:
                        if g in free:
                            free.remove(g)  # free GPUs stay in index order
                free_c[i] -= w.cpu_cores
                free_m[i] -= w.memory_bytes
        self.max_g = max(self.cap_g, default=0)
        self.buckets: list[list[int]] = [[] for _ in range(self.max_g + 1)]
        for i in self.all_schedulable:
            self.buckets[len(self.free_g[i])].append(i)  # appended in index order: each bucket is sorted
        self.top = self.max_g  # no bucket above this one holds a machine (free room only shrinks in a cycle)
        # Buckets of full machines (no free GPU: the largest bucket as the cluster fills, and read only for a worker
        # that asks for no GPU) that `commit` appended to out of name order, sorted when next read (`tidy`): an
        # insort into thousands of machines moved them all at every start.
        self._unsorted: dict[int, list[int]] = {}
        # The head's hold: machine -> [gpus, cpu, memory] of free room kept for it, and what runs that end
        # before the shadow time took on those machines (that room comes back in time).
        self.held: dict[int, list] = {}
        self.ending: dict[int, list] = {}
        self._held_room: dict[int, tuple[int, float, int]] = {}  # a held machine's room in view B, until it changes
        self._allowed_cache: dict[tuple, tuple[int, frozenset[int] | None, list[int] | None]] = {}
        # Per allowed key: the why-not line of each machine that pools, the GPU model or reservations keep from it.
        self.restricted: dict[int, dict[int, str]] = {}
        self._pools: dict[str, tuple[str, ...]] = {p.name: p.machines for p in snapshot.pools}
        self._by_pools: dict[tuple, tuple] | None = None  # the fleet's answers for these pools (`allowed`)
        self._pool_sets: dict[tuple[str, ...], frozenset[int]] = {}
        self.reserved = Reserved(snapshot, self.index, machines, now)
        # Constraint indexes, made on first use (the label index is the fleet's): per allowed list (by id; the entry
        # keeps the list alive) free-GPU buckets restricted to its machines, and per machine the restricted
        # buckets it is in (`commit` keeps them); per names tuple of a selection (by id, likewise) its set.
        self._sub: dict[int, tuple[list[int], list[list[int]]]] = {}
        self._wide: dict[int, tuple[list[int], frozenset[int] | None]] = {}  # `scan_buckets`' choice per list, by id
        self._selected_sets: dict[NodeSelection, frozenset[int]] = {}
        self._subs_of: list[list[list[list[int]]]] = []  # per machine (made on first use)
        self._name_sets: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}

    # ------------------------------------------------------------------------------------------- machines

    @property
    def holders(self) -> list[dict[str, list]]:
        """Per machine: run -> [workspace, priority, GPUs held] (workspace and priority as first seen)."""
        return [self.holders_of(i) for i in range(len(self.machines))]

    def holders_of(self, i: int) -> dict[str, list]:
        """Machine i's `holders`: its running units' workers in snapshot order, then the runs started on it."""
        holders = self._holders_on.get(i)
        if holders is None:
            holders = self._holders_on[i] = {}
            name = self.names[i]
            last = None
            for unit in self._units_on[i]:
                if unit is last:
                    continue  # one entry per worker on the machine: the unit's workers are counted at once
                last = unit
                run = unit.run
                for w in unit.workers:
                    if w.machine != name:
                        continue
                    h = holders.get(run)
                    if h is None:
                        holders[run] = [unit.workspace, unit.priority, len(w.gpu_indices)]
                    else:
                        h[2] += len(w.gpu_indices)
            for t in self._taken.pop(i, ()):
                self._note_holder(i, *t)
        return holders

    def _note_holder(self, i: int, run: str, workspace: str, priority: int, gpus: int) -> None:
        holders = self._holders_on.get(i)
        if holders is None:  # nobody asked for them yet: kept for `holders_of`
            taken = self._taken.get(i)
            if taken is None:
                self._taken[i] = [(run, workspace, priority, gpus)]
            else:
                taken.append((run, workspace, priority, gpus))
            return
        h = holders.get(run)
        if h is None:
            holders[run] = [workspace, priority, gpus]
        else:
            h[2] += gpus

    @property
    def labels(self) -> list[dict[str, str]]:
        f = self.fleet
        if f.labels is None:
            f.labels = [dict(m.labels) for m in self.machines]
        return f.labels

    def in_pools(self, pools: tuple[str, ...]) -> frozenset[int]:
        """The machines of any of these pools (a name that is no pool of the cluster holds none)."""
        hit = self._pool_sets.get(pools)
        if hit is None:
            index = self.index
            hit = self._pool_sets[pools] = frozenset(
                [index[m] for p in pools for m in self._pools.get(p, ()) if m in index]
            )
        return hit

    def with_model(self, asked: str) -> frozenset[int]:
        """The machines `model_fits` (GPUs of a model containing `asked`, case-insensitively), per fleet."""
        f = self.fleet
        hit = f.with_model.get(asked)
        if hit is None:
            by_model: dict[str, list[int]] = {}
            for i, m in enumerate(self.machines):
                if m.gpus:
                    by_model.setdefault(m.gpu_model.lower(), []).append(i)
            low = asked.lower()
            hit = f.with_model[asked] = frozenset(i for model, idx in by_model.items() if low in model for i in idx)
        return hit

    def model_fits(self, i: int, asked: str) -> bool:
        m = self.machines[i]
        return bool(m.gpus) and asked.lower() in m.gpu_model.lower()

    def allowed(
        self, run: WaitingRun, ws_pools: tuple[str, ...] | None = None, reserved: bool = True
    ) -> tuple[int, frozenset[int] | None, list[int] | None]:
        """(key, set, sorted list) of schedulable machines the run may use; set None = every schedulable one.
        `ws_pools`: the pools its workspace may use (None: every machine); `reserved`: False to leave out what
        reservations keep from it (to tell "never fits here" from "waits for reserved machines")."""
        sel = run.node_selection
        res_key, res_lines = self.reserved.exclusions(run.workspace, run.time_limit_seconds) if reserved else (
            None, {})
        k = (sel, run.excluded_machines, ws_pools, res_key)
        hit = self._allowed_cache.get(k)
        if hit is not None:
            return hit
        key = len(self._allowed_cache)
        if res_key is None and not run.excluded_machines and sel.reservation is None:
            # The machines alone decide (names, labels, GPU model), and the pools: kept by the fleet (by pools while
            # the snapshot's pools stay the same)
            f = self.fleet
            pooled = ws_pools is not None or bool(sel.pools)
            if pooled:
                cache = self._by_pools
                if cache is None:
                    kept = f.allowed_by_pools
                    if kept is None or kept[0] != self._snapshot.pools:
                        kept = f.allowed_by_pools = (self._snapshot.pools, {})
                    cache = self._by_pools = kept[1]
                ck = (sel, ws_pools)
            else:
                cache, ck = f.allowed_by_selection, sel
            fixed = cache.get(ck)
            if fixed is None:
                lines = self._restrictions(sel, ws_pools, {})
                if sel.mode == "Any" and not lines:
                    fixed = (lines, None, None)
                else:
                    chosen = list(filterfalse(lines.__contains__, self._candidates(sel)) if lines
                                  else self._candidates(sel))
                    fixed = (lines, frozenset(chosen), chosen)
                    if not pooled:  # `never_fits` keeps its answers by such a list's id (pools' lists may go)
                        f.fixed.add(id(chosen))
                cache[ck] = fixed
            lines, fs, chosen = fixed
            result: tuple = (key, fs, chosen)
            if lines:
                self.restricted[key] = lines
            self._allowed_cache[k] = result
            return result
        excluded = {self.index[n] for n, _ in run.excluded_machines if n in self.index}
        lines = self._restrictions(sel, ws_pools, res_lines)
        if sel.mode == "Any" and not excluded and not lines:
            result = (key, None, None)
        else:
            found = self._candidates(sel)
            if excluded:
                found = filterfalse(excluded.__contains__, found)
            if lines:
                found = filterfalse(lines.__contains__, found)
            chosen = list(found)
            result = (key, frozenset(chosen), chosen)
        if lines:
            self.restricted[key] = lines
        self._allowed_cache[k] = result
        return result

    def _candidates(self, sel: NodeSelection) -> list[int]:
        """The schedulable machines its mode (Any, Names, Labels) selects, in index order, from the indexes."""
        schedulable = self.schedulable
        if sel.mode == "Names":
            index_get = self.index.get
            found = {index_get(n) for n in sel.names}
            found.discard(None)
            return sorted(i for i in found if schedulable[i])
        if sel.mode == "Labels":
            if not sel.labels:
                return self.all_schedulable
            by_label = self.by_label
            sets = sorted((by_label.get(kv, set()) for kv in set(sel.labels)), key=len)
            found = set(sets[0]).intersection(*sets[1:])
            return sorted(i for i in found if schedulable[i])
        return self.all_schedulable

    def selected_set(self, sel: NodeSelection) -> frozenset[int]:
        """The schedulable machines its mode selects (`selected` for each, from the indexes)."""
        hit = self._selected_sets.get(sel)
        if hit is None:
            hit = self._selected_sets[sel] = frozenset(self._candidates(sel))
        return hit

    @property
    def by_label(self) -> dict[tuple[str, str], set[int]]:
        """(label, value) -> the machines with that label (the last value given wins, as in `labels`)."""
        f = self.fleet
        if f.by_label is None:
            out: dict[tuple[str, str], set[int]] = {}
            for i, labels in enumerate(self.labels):
                for kv in labels.items():
                    out.setdefault(kv, set()).add(i)
            f.by_label = out
        return f.by_label

    def _restrictions(self, sel: NodeSelection, ws_pools: tuple[str, ...] | None, res_lines: dict[int, str]):
        """Per machine the first of: not in the reservation the run names, not in its pools, not in its
        workspace's pools, not its GPU model, reserved for another namespace."""
        lines: dict[int, str] = {}
        every = range(len(self.machines))

        def outside(inside) -> list[int]:
            """The machines not in `inside` that have no line yet (at C speed: 10,000 machines per selection)."""
            return list(filterfalse(lines.__contains__, filterfalse(inside.__contains__, every)))

        if sel.reservation is not None:
            r = self.reserved.by_name.get(sel.reservation)
            inside = frozenset(self.index[m] for m in (r.machines if r else ()) if m in self.index)
            lines.update(dict.fromkeys(outside(inside), R.not_in_reservation(sel.reservation)))
        if sel.pools:
            lines.update(dict.fromkeys(outside(self.in_pools(sel.pools)), R.not_in_run_pools(sel.pools)))
        if ws_pools is not None:
            lines.update(dict.fromkeys(outside(self.in_pools(ws_pools)), R.NOT_IN_NAMESPACE_POOLS))
        if sel.gpu_model:
            asked = sel.gpu_model
            idx = outside(self.with_model(asked))
            if idx:
                # One line per (GPU model, GPU count) of the machines it does not fit.
                kinds = self.fleet.gpu_kinds
                if kinds is None:
                    kinds = self.fleet.gpu_kinds = [(m.gpu_model, m.gpus) for m in self.machines]
                kind_of = list(map(kinds.__getitem__, idx))
                text = {k: R.gpu_model_mismatch(k[0], k[1], asked) for k in set(kind_of)}
                lines.update(zip(idx, map(text.__getitem__, kind_of), strict=True))
        if sel.gpu_memory:  # issue 46: a GPU-memory ask fits only GPUs that hold more than it
            asked, machines = sel.gpu_memory, self.machines
            fits = frozenset(i for i, m in enumerate(machines) if m.gpu_memory_bytes > asked)
            lines.update({i: gpushare.gpu_memory_short(machines[i].gpu_memory_bytes, asked) for i in outside(fits)})
        if sel.mig:  # issue 46: MIG devices fit only machines that have that profile
            has = frozenset(self.fleet.mig_machines.get(sel.mig, ()))
            lines.update(dict.fromkeys(outside(has), gpushare.no_mig_device(sel.mig)))
        for i, line in res_lines.items():
            lines.setdefault(i, line)
        return lines

    def selected(self, sel: NodeSelection, i: int) -> bool:
        if sel.mode == "Names":
            hit = self._name_sets.get(id(sel.names))
            if hit is None or hit[0] is not sel.names:
                hit = self._name_sets[id(sel.names)] = (sel.names, frozenset(sel.names))
            return self.names[i] in hit[1]
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

    def hold(self, held: dict[int, list]) -> None:
        """Hold the head's room: machine -> [gpus, cpu, memory] nothing behind it may take."""
        self.held = held
        self._held_room.clear()

    def held_room(self, i: int) -> tuple[int, float, int]:
        """`room(i, True)` of a held machine, kept until something is placed on it (`commit`)."""
        r = self._held_room.get(i)
        if r is None:
            r = self._held_room[i] = self.room(i, True)
        return r

    def island_fits(self, i: int, g: int, extra: tuple[int, ...] = ()) -> bool:
        """Do g of machine i's free GPUs (and `extra`, GPUs that victims free) lie in one NVLink island? True on a
        machine that reports no islands, and for one GPU."""
        isl = self.fleet.islands[i]
        if not isl or g <= 1:
            return True
        free = self.free_g[i]
        return topology.island_gpus(list(free) + list(extra) if extra else free, isl, g) is not None

    # ------------------------------------------------------------------------------------------ placement

    def _share(self, i: int, g: int, milli: int, workspace: str) -> None:
        """Count a fractional tenant of `milli` thousandths on GPU g of machine i."""
        s = self.shared.setdefault(i, {}).get(g)
        if s is None:
            s = self.shared[i][g] = [0, {}]
        s[0] += milli
        s[1][workspace] = s[1].get(workspace, 0) + 1

    def best_share(self, milli: int, c: float, m: int, workspace: str, allowed: frozenset[int] | None,
                   allowed_list: list[int] | None, avoid, view_b: bool) -> tuple[int, int] | None:
        """(machine, gpu) for a fractional worker: best fit (or FGD) over each GPU's free thousandths (gpushare).
        The machines scored are one per group of the share index and per free-GPU bucket (the first that fits the
        worker's CPU and memory: the others of its group score the same and come later by name), and the head's
        held machines; a short restricted list, or `share_index` off, scores every machine."""
        if self.share_index and (allowed_list is None or len(allowed_list) > SCAN_AT_MOST):
            machines = self._share_reps(milli, c, m, workspace, allowed, allowed_list, avoid, view_b)
        else:
            machines = allowed_list if allowed_list is not None else (
                sorted(allowed) if allowed is not None else self.all_schedulable)
        shared, free_g, sharing = self.shared, self.free_g, self.gpu_sharing
        fgd = self.placement == "fgd"
        cands = []
        for i in machines:
            if i in avoid or not self.schedulable[i]:
                continue
            fg, fc, fm = self.room(i, view_b)
            if fc < c or fm < m:
                continue
            on = shared.get(i)
            if not on and fg < 1:
                continue
            whole = free_g[i] if fg >= 1 else ()
            cands.append((i, gpushare.free_milli(self.machines[i].gpus, whole, on or {}, workspace, sharing)) if fgd
                         else (i, whole, on or _NO_SHARES))
        if fgd:
            return fragments.fgd_share(cands, milli, self.task_sizes(), self._frag_memo)
        return gpushare.best_fit(cands, milli, workspace, sharing)

    def _share_reps(self, milli: int, c: float, m: int, workspace: str, allowed, allowed_list, avoid,
                    view_b: bool) -> list[int]:
        """The machines `best_share` scores: per share-index group and per free-GPU bucket the first (by name) that
        the worker may use, and the head's held machines (their room in view B is not what the index keeps)."""
        if self._share_groups is None:
            self._share_groups = {}
            for i in self.shared:
                self._reshare(i)
        who = None if self.gpu_sharing == gpushare.ANY_WORKSPACE else workspace
        held = self.held if view_b else {}
        free_c, free_m = self.free_c, self.free_m
        out = [i for i in held if allowed is None or i in allowed]
        for (k, free), members in self._share_groups.get(who, {}).items():
            if k or free[-1] >= milli:
                for i in members:
                    if free_c[i] >= c and free_m[i] >= m and i not in avoid and i not in held and (
                            allowed is None or i in allowed):
                        out.append(i)
                        break
        # Machines without room shared to this worker score by their whole free GPUs alone; under FGD a machine
        # with shared room is scored by its group instead (its score differs); under best fit either way is right.
        sharing = self._share_members.get(who, ()) if self.placement == "fgd" else ()
        buckets, member = (self.buckets, None) if allowed_list is None else self.scan_buckets(allowed_list, allowed)
        for cnt in range(1, len(buckets)):
            outside = 0
            for i in buckets[cnt]:
                if member is not None and i not in member:
                    outside += 1
                    if outside > PROBE_AT_MOST:
                        self.narrow(allowed_list)
                        return self._share_reps(milli, c, m, workspace, allowed, allowed_list, avoid, view_b)
                elif free_c[i] >= c and free_m[i] >= m and i not in avoid and i not in held and i not in sharing and (
                        allowed is None or i in allowed):
                    out.append(i)
                    break
        return out

    def _reshare(self, i: int) -> None:
        """Put machine i in the share-index groups its room is in now (none without shared GPUs)."""
        groups = self._share_groups
        if groups is None:
            return
        for who, key in self._share_keys.pop(i, {}).items():
            members = groups[who][key]
            del members[bisect_left(members, i)]
            if not members:
                del groups[who][key]
            self._share_members[who].discard(i)
        on = self.shared.get(i)
        if not on or not self.schedulable[i]:
            return
        keys = {who: (len(self.free_g[i]), free)
                for who, free in gpushare.usable_shares(on, self.gpu_sharing).items()}
        for who, key in keys.items():
            insort(groups.setdefault(who, {}).setdefault(key, []), i)
            self._share_members.setdefault(who, set()).add(i)
        if keys:
            self._share_keys[i] = keys

    def task_sizes(self) -> tuple:
        """The workload FGD scores against: the snapshot's, or its waiting and running workers' requests."""
        if self._sizes is None:
            snap = self._snapshot
            counts = Counter(map(_gpus, chain.from_iterable(map(_workers, snap.waiting))))  # at C speed
            counts.update(w.gpu_milli / 1000 if w.gpu_milli else len(w.gpu_indices)
                          for unit in snap.running for w in unit.workers)
            self._sizes = snap.task_sizes or fragments.sizes_of_gpus(counts)
        return self._sizes

    def scan_order(self, g: int) -> range | list[int]:
        """The free-GPU counts a whole-GPU worker of g GPUs scans, best first (`fragments.whole_order`)."""
        if self.placement == "bestfit":
            return range(g, self.top + 1)
        order = self._orders.get(g)
        if order is None:
            sizes = self.task_sizes() if self.placement == "fgd" else ()  # spread's order reads none
            order = self._orders[g] = fragments.whole_order(g, self.max_g, sizes, self.placement)
            self._ranks[g] = {cnt: k for k, cnt in enumerate(order)}
        return order

    def rank(self, g: int, fg: int) -> int:
        """Where a machine with fg free GPUs comes in a g-GPU worker's scan order (lower: better)."""
        if self.placement == "bestfit":
            return fg
        self.scan_order(g)
        return self._ranks[g][fg]

    def best_machine(
        self, s: Shape, allowed: frozenset[int] | None, allowed_list: list[int] | None, avoid, view_b: bool
    ) -> int | None:
        """Best fit for one worker: fewest free GPUs that still fits, ties by name."""
        g, c, m = s
        # Issue 46: on machines with NVLink islands, g GPUs must lie in one island (None: no machine has islands)
        islands = self.fleet.islands if g > 1 and self.fleet.any_islands else None
        if allowed_list is not None and len(allowed_list) <= SCAN_AT_MOST:
            best = None
            for i in allowed_list:
                if i in avoid:
                    continue
                fg, fc, fm = self.room(i, view_b)
                if fg >= g and fc >= c and fm >= m and (best is None or (self.rank(g, fg), i) < best) and (
                        islands is None or self.island_fits(i, g)):
                    best = (self.rank(g, fg), i)
            return None if best is None else best[1]
        if allowed_list is None and allowed is not None:
            allowed_list = sorted(allowed)
        held = self.held if view_b else ()
        if not g and self._unsorted:
            self.tidy()
        while self.top > 0 and not self.buckets[self.top]:
            self.top -= 1
        # A restricted run scans the buckets of its own machines (every one of them allowed), or the cluster's with
        # each machine checked (`scan_buckets`).
        buckets, member = (self.buckets, None) if allowed_list is None else self.scan_buckets(allowed_list, allowed)
        best = None
        free_c, free_m = self.free_c, self.free_m
        order = self.scan_order(g)
        ranks = None if self.placement == "bestfit" else self._ranks[g]  # bestfit's rank: the free GPUs
        for cnt in order:
            outside = 0
            for i in buckets[cnt]:
                if member is not None and i not in member:
                    outside += 1
                    if outside > PROBE_AT_MOST:
                        self.narrow(allowed_list)
                        return self.best_machine(s, allowed, allowed_list, avoid, view_b)
                elif free_c[i] >= c and free_m[i] >= m and i not in avoid and i not in held and (
                        islands is None or not islands[i] or self.island_fits(i, g)):
                    best = (cnt if ranks is None else ranks[cnt], i)
                    break
            if best is not None:
                break
        for i in held:
            if i in avoid or (allowed is not None and i not in allowed):
                continue
            fg, fc, fm = self.held_room(i)
            if fg >= g and fc >= c and fm >= m:
                k = (fg if ranks is None else ranks[fg], i)
                if (best is None or k < best) and (islands is None or self.island_fits(i, g)):
                    best = k
        return None if best is None else best[1]

    def tidy(self) -> None:
        """Sort the buckets of full machines `commit` left out of order (every bucket is then in name order)."""
        for b in self._unsorted.values():
            b.sort()
        self._unsorted.clear()

    def scan_buckets(self, allowed_list: list[int], allowed: frozenset[int] | None
                     ) -> tuple[list[list[int]], frozenset[int] | None]:
        """The free-GPU buckets a run restricted to these machines scans, and the set to check each machine in them
        against: the cluster's buckets and the list's set for a list of at least 1/WIDE of the machines, else the
        list's own buckets (`sub_buckets`) and None."""
        hit = self._wide.get(id(allowed_list))
        if hit is None or hit[0] is not allowed_list:
            wide = WIDE and len(allowed_list) * WIDE >= len(self.all_schedulable)
            member = (allowed if allowed is not None else frozenset(allowed_list)) if wide else None
            hit = self._wide[id(allowed_list)] = (allowed_list, member)
        return (self.buckets, hit[1]) if hit[1] is not None else (self.sub_buckets(allowed_list), None)

    def narrow(self, allowed_list: list[int]) -> None:
        """The list's machines lie far apart in the cluster's buckets: it scans buckets of its own from now on."""
        self._wide[id(allowed_list)] = (allowed_list, None)

    def sub_buckets(self, allowed_list: list[int]) -> list[list[int]]:
        """`buckets` restricted to these machines: made on first use from the room now, then kept by `commit`."""
        hit = self._sub.get(id(allowed_list))
        if hit is not None and hit[0] is allowed_list:
            return hit[1]
        subs_of = self._subs_of
        if not subs_of:
            subs_of.extend([] for _ in self.machines)
        sub: list[list[int]] = [[] for _ in range(self.max_g + 1)]
        idx = list(filter(self.schedulable.__getitem__, allowed_list))
        for i, n in zip(idx, map(len, map(self.free_g.__getitem__, idx)), strict=True):
            sub[n].append(i)
        for lst in map(subs_of.__getitem__, idx):
            lst.append(sub)
        for b in sub:
            b.sort()
        self._sub[id(allowed_list)] = (allowed_list, sub)
        return sub

    def place(
        self, workers, allowed, allowed_list, avoid: frozenset[int], view_b: bool, workspace: str = "",
        same: str | None = None,
    ) -> list[tuple[WorkerRequest, int]] | None:
        """Machines for all `workers` at once (one worker per machine when there are several), or None.
        A fractional worker's is (worker, (machine, gpu)): `commit` shares that GPU. A gang's machines come
        from one network block (`same`: "block" or "rack" requires it; else preferred when the machines are
        labelled), numbered in topology order. MIG workers: `_place_mig`."""
        if workers[0].mig_count:
            return self._place_mig(workers, allowed, avoid, view_b)
        if len(workers) > 1 and (same is not None or self.topology_groups(topology.BLOCK)):
            return self._place_by_topology(workers, allowed, allowed_list, avoid, view_b, same)
        if len(workers) == 1:
            w = workers[0]
            if w.gpu_memory_bytes:
                return self._place_by_memory(w, allowed_list, avoid, view_b, workspace)
            if w.gpus.__class__ is float and gpushare.is_fraction(w.gpus):
                hit = self.best_share(gpushare.to_milli(w.gpus), w.cpu_cores, w.memory_bytes, workspace, allowed,
                                      allowed_list, avoid, view_b)
                return None if hit is None else [(w, hit)]
            if w.gpus > self.max_g:
                return None
            i = self.best_machine(shape(w), allowed, allowed_list, avoid, view_b)
            return None if i is None else [(w, i)]
        return self._place_anywhere(workers, allowed, allowed_list, avoid, view_b)

    def _place_by_memory(self, w: WorkerRequest, allowed_list, avoid, view_b: bool, workspace: str):
        """A worker asking GPU memory: on each machine its share is that memory's thousandths of the machine's GPU
        (gpushare.memory_milli). Machines grouped by GPU memory, the smallest GPU that holds it first (the one it
        fills best), best fit (or FGD) within a group."""
        groups: dict[int, list[int]] = {}
        machines = self.machines
        for i in (allowed_list if allowed_list is not None else self.all_schedulable):
            groups.setdefault(machines[i].gpu_memory_bytes, []).append(i)
        for mem in sorted(groups):
            milli = gpushare.memory_milli(w.gpu_memory_bytes, mem)
            if milli is None:
                continue
            members = groups[mem]
            hit = self.best_share(milli, w.cpu_cores, w.memory_bytes, workspace, frozenset(members), members, avoid,
                                  view_b)
            if hit is not None:
                return [(w, hit)]
        return None

    def mig_free(self, i: int, profile: str) -> list[tuple[int, str, int]]:
        """Machine i's MIG devices of the profile that no worker holds, in GPU order."""
        taken = self.mig_taken.get(i)
        devs = self.fleet.mig_of[i].get(profile, ()) if self.fleet.any_mig else ()
        return [d for d in devs if d not in taken] if taken else list(devs)

    def _place_mig(self, workers, allowed, avoid, view_b: bool):
        """MIG workers, one per machine: the machine with the fewest free devices of the profile that holds the
        worker's (best fit: the others stay free for larger asks), ties by name."""
        used, out = set(avoid), []
        for w in workers:
            best = None
            for i in self.fleet.mig_machines.get(w.mig, ()):
                if i in used or not self.schedulable[i] or (allowed is not None and i not in allowed):
                    continue
                _, fc, fm = self.room(i, view_b)
                if fc < w.cpu_cores or fm < w.memory_bytes:
                    continue
                free = len(self.mig_free(i, w.mig))
                h = self.held.get(i) if view_b else None
                if h is not None and len(h) > 3 and h[4] == w.mig:
                    free -= h[3]  # free devices a MIG head holds (HeadFit.holds)
                if free >= w.mig_count and (best is None or (free, i) < best):
                    best = (free, i)
            if best is None:
                return None
            used.add(best[1])
            out.append((w, best[1]))
        return out

    def _commit_mig(self, run: str, workspace: str, priority: int, w: WorkerRequest, i: int,
                    ends_before_shadow: bool) -> Placement:
        """Take a MIG worker's devices on machine i (the first free ones in GPU order): each is one worker's whole."""
        devs = tuple(self.mig_free(i, w.mig)[:w.mig_count])
        self.mig_taken.setdefault(i, set()).update(devs)
        self._take_cpu_memory(i, w, ends_before_shadow)
        self._note_holder(i, run, workspace, priority, 0)
        return placement(w.index, self.names[i], tuple(sorted({d[0] for d in devs})), w.cpu_cores, w.memory_bytes,
                         gpushare.mig_milli(w.mig, len(devs)), devs)

    def topology_groups(self, label: str) -> list[list[int]]:
        """The machines (indices, in order) of each value of a topology label, smallest group first."""
        cache = self.fleet.topology_groups
        hit = cache.get(label)
        if hit is None:
            by: dict[str, list[int]] = {}
            for i, labels in enumerate(self.labels):
                if label in labels:
                    by.setdefault(labels[label], []).append(i)
            hit = cache[label] = [ms for _, ms in sorted(by.items(), key=lambda kv: (len(kv[1]), kv[0]))]
        return hit

    def _groups_allowed(self, same: str, allowed) -> dict[str, list[int]]:
        label = topology.LEVELS[same]
        labels = self.labels
        out = {}
        for group in self.topology_groups(label):
            members = group if allowed is None else self._members_allowed(group, allowed)
            if members:
                out[labels[group[0]][label]] = members
        return out

    def cannot_have_same(self, same: str, n: int, allowed) -> str | None:
        """Why a gang of n machines that needs one block (or rack) never runs here, or None."""
        groups = self._groups_allowed(same, allowed)
        return topology.cannot_have_same(same, n, {k: len(v) for k, v in groups.items()})

    def largest_group(self, same: str, allowed) -> list[int] | None:
        """The machines of the largest group (ties: first by name) the run may use: where it frees room as the head."""
        groups = self._groups_allowed(same, allowed)
        if not groups:
            return None
        return min(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[1]

    def _place_in(self, workers, members: list[int], avoid, view_b: bool) -> list | None:
        """A gang's whole-GPU workers on these machines only, one each: best machine by the placement's rank."""
        used, out = set(avoid), []
        free_g, schedulable, room = self.free_g, self.schedulable, self.room
        for w in placement_order(workers):
            g, c, m = shape(w)
            best = None
            for i in members:
                # room() never shows more GPUs than are free: a machine with fewer is passed over without it
                if len(free_g[i]) < g or i in used or not schedulable[i]:
                    continue
                fg, fc, fm = room(i, view_b)
                if fg >= g and fc >= c and fm >= m and self.island_fits(i, g):
                    k = (self.rank(g, fg), i)
                    if best is None or k < best:
                        best = k
            if best is None:
                return None
            used.add(best[1])
            out.append((w, best[1]))
        return out

    def _place_by_topology(self, workers, allowed, allowed_list, avoid, view_b: bool, same: str | None):
        """A gang in the fewest blocks: inside one group (block, or rack when `same` says so) if one holds it,
        the smallest such group first (big groups stay whole for big gangs); when `same` is None and no group
        holds it, wherever it fits. Ranks in topology order (block, rack, name) when the workers are alike."""
        if any(w.gpus.__class__ is float for w in workers):
            return None if same is not None else self._place_anywhere(workers, allowed, allowed_list, avoid, view_b)
        label = topology.LEVELS.get(same or "block", topology.BLOCK)
        chosen = None
        if same is None:  # the quick way first: best fit anywhere, kept when it lands in one block already
            chosen = self._place_anywhere(workers, allowed, allowed_list, avoid, view_b)
            if chosen is None:
                return None
            labels = self.labels
            if len({labels[i].get(label) for _, i in chosen}) == 1:
                return self._ranked(chosen)
        # No group held these shapes with this room: none will later in the cycle (free room only shrinks).
        key = (tuple(sorted(shape(w) for w in workers)), allowed, avoid, view_b, label)
        if key not in self._no_group:
            need, fewest = len(workers), min(w.gpus for w in workers)
            for group in self.topology_groups(label):
                if sum(map(len, self.sub_buckets(group)[fewest:])) < need:
                    continue  # fewer of its machines have that many free GPUs than the gang has workers
                if allowed is None:  # the group's own free-GPU buckets (its list is kept: `sub_buckets` by id)
                    found = self._place_anywhere(workers, self._group_set(group), group, avoid, view_b)
                else:
                    members = self._members_allowed(group, allowed)
                    found = self._place_in(workers, members, avoid, view_b) if len(members) >= len(workers) else None
                if found is not None:
                    return self._ranked(found)
            self._no_group.add(key)
        return None if same is not None else self._ranked(chosen)

    def _members_allowed(self, group: list[int], allowed) -> list[int]:
        """The machines of a topology group a run may use (kept for the cycle: gangs of one selection ask again)."""
        key = (id(group), id(allowed))
        hit = self._group_members.get(key)
        if hit is None or hit[0] is not group or hit[1] is not allowed:
            hit = self._group_members[key] = (group, allowed, [i for i in group if i in allowed])
        return hit[2]

    def _group_set(self, group: list[int]) -> frozenset[int]:
        hit = self._group_sets.get(id(group))
        if hit is None or hit[0] is not group:
            hit = self._group_sets[id(group)] = (group, frozenset(group))
        return hit[1]

    def _ranked(self, chosen):
        """Workers in index order on machines in topology order (block, rack, name), when the workers are alike."""
        if len({shape(w) for w, _ in chosen}) == 1:
            labels = self.labels
            order = sorted((i for _, i in chosen),
                           key=lambda i: topology.place_of(labels[i], "")[:2] + (i,))
            chosen = list(zip(sorted((w for w, _ in chosen), key=lambda w: w.index), order, strict=True))
        return chosen

    def _place_anywhere(self, workers, allowed, allowed_list, avoid, view_b: bool):
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
        """Take the room; lowest free GPU indices first (inside one NVLink island: `topology.island_gpus`)."""
        out = []
        free_g, held = self.free_g, self.held
        islands = self.fleet.islands if self.fleet.any_islands else None
        for w, i in chosen:
            if w.mig_count:  # MIG devices, each whole
                out.append(self._commit_mig(run, workspace, priority, w, i, ends_before_shadow))
                continue
            if i.__class__ is tuple:  # a fractional worker: its share of one GPU
                out.append(self._commit_share(run, workspace, priority, w, i, ends_before_shadow))
                continue
            free = free_g[i]
            before = len(free)
            n = w.gpus
            isl = islands[i] if islands is not None and n > 1 else None
            gpus = topology.island_gpus(free, isl, n) if isl else None
            if gpus is None:  # no islands (or `place` checked none): the lowest free GPUs
                gpus = tuple(free[:n])
                del free[:n]
            else:
                for g in gpus:
                    free.remove(g)
            if n and self.schedulable[i]:
                self._move(i, before, before - len(gpus))
            self.free_c[i] -= w.cpu_cores
            self.free_m[i] -= w.memory_bytes
            if i in held:
                self._held_room.pop(i, None)
                if ends_before_shadow:
                    e = self.ending.setdefault(i, [0, 0.0, 0])
                    e[0] += n
                    e[1] += w.cpu_cores
                    e[2] += w.memory_bytes
            if n:
                self._note_holder(i, run, workspace, priority, n)
                if i in self._share_keys:
                    self._reshare(i)
            out.append(placement(w.index, self.names[i], gpus, w.cpu_cores, w.memory_bytes))
        if len(out) > 1:
            out.sort(key=by_worker_index)
        return tuple(out)

    def _move(self, i: int, before: int, after: int) -> None:
        """Machine i had `before` free GPUs and has `after`: its place in the free-GPU buckets, the cluster's and the
        restricted ones it is in. A machine left with none is appended to the full machines' bucket, sorted when
        next read (`tidy`): an insort there moved thousands of machines at every start."""
        unsorted = self._unsorted
        for bs in (self.buckets, *self._subs_of[i]) if self._subs_of else (self.buckets,):
            b = bs[before]
            del b[bisect_left(b, i)]
            b = bs[after]
            if after:
                insort(b, i)
            else:
                if b and b[-1] > i:
                    unsorted[id(b)] = b
                b.append(i)

    def _commit_share(self, run: str, workspace: str, priority: int, w: WorkerRequest, at: tuple[int, int],
                      ends_before_shadow: bool) -> Placement:
        """Take a fractional worker's share of GPU g on machine i (an empty GPU leaves free_g and its bucket)."""
        i, g = at
        milli = (gpushare.memory_milli(w.gpu_memory_bytes, self.machines[i].gpu_memory_bytes) or gpushare.FULL - 1
                 if w.gpu_memory_bytes else gpushare.to_milli(w.gpus))
        free = self.free_g[i]
        if g in free:
            before = len(free)
            free.remove(g)
            if self.schedulable[i]:
                self._move(i, before, before - 1)
        self._share(i, g, milli, workspace)
        self._reshare(i)
        self._take_cpu_memory(i, w, ends_before_shadow)
        self._note_holder(i, run, workspace, priority, w.gpus)
        return placement(w.index, self.names[i], (g,), w.cpu_cores, w.memory_bytes, milli)

    def _take_cpu_memory(self, i: int, w: WorkerRequest, ends_before_shadow: bool) -> None:
        """A MIG or fractional worker's CPU and memory on machine i (`commit` does the same inline for whole GPUs);
        a run ending before the shadow time gives them back to the head's hold in time."""
        self.free_c[i] -= w.cpu_cores
        self.free_m[i] -= w.memory_bytes
        if i in self.held:
            self._held_room.pop(i, None)
            if ends_before_shadow:
                e = self.ending.setdefault(i, [0, 0.0, 0])
                e[1] += w.cpu_cores
                e[2] += w.memory_bytes

    # ------------------------------------------------------------------------------ could it ever run here

    def never_fits(
        self, run: WaitingRun, workers, allowed_list: list[int] | None, ws_pools: tuple[str, ...] | None = None
    ) -> str | None:
        """Why the run cannot run on this cluster even if it were empty, or None if it could."""
        machines = self.all_schedulable if allowed_list is None else allowed_list
        if not machines:
            return self._nothing_allowed(run.node_selection, ws_pools)
        if workers[0].mig_count:
            return self._never_fits_mig(workers, machines)
        f = self.fleet
        if allowed_list is None or id(allowed_list) in f.fixed:  # the machines alone decide: kept by the fleet
            k = (None if allowed_list is None else id(allowed_list),
                 shape(workers[0]) if len(workers) == 1 else tuple(sorted(map(shape, workers))))
            why = f.never.get(k, _UNSET)
            if why is _UNSET:
                why = f.never[k] = self._never_fits(workers, machines, allowed_list is not None)
            return why
        return self._never_fits(workers, machines, True)

    def _never_fits(self, workers, machines: list[int], restricted: bool) -> str | None:
        largest = "the largest machine it may use has" if restricted else "the largest machine has"
        fitting: set[int] = set()
        cap_c, cap_m = self.cap_c, self.cap_m
        # Up to len(workers) machines per shape tell both checks below apart (a shape with that many fits all its
        # workers, and the union then holds enough): no scan of every machine once enough are found.
        enough = len(workers)
        for s in sorted({shape(w) for w in workers}):
            g, c, m = s
            # Issue 46: a worker's GPUs lie in one NVLink island (the machine's GPUs where it reports none)
            cap_g = self.fleet.island_cap if g > 1 else self.cap_g
            ok = list(islice((i for i in machines if cap_g[i] >= g and cap_c[i] >= c and cap_m[i] >= m), enough))
            if not ok:
                top_g = max(self.cap_g[i] for i in machines)
                top_c = max(self.cap_c[i] for i in machines)
                top_m = max(self.cap_m[i] for i in machines)
                if g > top_g:
                    return f"asks for {g} GPUs on one machine; {largest} {top_g}"
                top_i = max(cap_g[i] for i in machines)
                if g > top_i:
                    return (f"asks for {g} GPUs in one NVLink island; the largest island of a machine it may use "
                            f"has {top_i}")
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


    def _never_fits_mig(self, workers, machines: list[int]) -> str | None:
        """Why MIG workers never fit the machines (that have their profile), or None."""
        mig_of, cap_c, cap_m = self.fleet.mig_of, self.cap_c, self.cap_m
        fitting: set[int] = set()
        for w in workers:
            ok = [i for i in machines if len(mig_of[i].get(w.mig, ())) >= w.mig_count and cap_c[i] >= w.cpu_cores
                  and cap_m[i] >= w.memory_bytes]
            if not ok:
                most = max(len(mig_of[i].get(w.mig, ())) for i in machines)
                if w.mig_count > most:
                    return f"asks for {w.mig_count} MIG {w.mig} devices on one machine; a machine it may use has {most}"
                return f"no machine with MIG {w.mig} devices has {number(w.cpu_cores)} CPU cores and " \
                       f"{gib(w.memory_bytes)} of memory for one worker"
            fitting.update(ok)
        if len(fitting) < len(workers):
            return f"asks for {len(workers)} machines (one worker on each); only {len(fitting)} can hold its workers"
        return None

    def _nothing_allowed(self, sel: NodeSelection, ws_pools: tuple[str, ...] | None) -> str:
        """Which restriction, applied in turn to the schedulable machines, leaves none."""
        left = self.all_schedulable
        if sel.mode != "Any":
            left = [i for i in left if self.selected(sel, i)]
            if not left:
                return "no machine matches its node_selection"
        if sel.pools:
            inside = self.in_pools(sel.pools)
            left = [i for i in left if i in inside]
            if not left:
                return R.no_machine_in_pools()
        if ws_pools is not None:
            inside = self.in_pools(ws_pools)
            left = [i for i in left if i in inside]
            if not left:
                return R.no_machine_in_namespace_pools()
        if sel.gpu_model:
            left = [i for i in left if self.model_fits(i, sel.gpu_model)]
            if not left:
                return R.no_machine_with_model(sel.gpu_model)
        if sel.gpu_memory:
            left = [i for i in left if self.machines[i].gpu_memory_bytes > sel.gpu_memory]
            if not left:
                return gpushare.no_gpu_memory(sel.gpu_memory)
        if sel.mig:
            has = frozenset(self.fleet.mig_machines.get(sel.mig, ()))
            left = [i for i in left if i in has]
            if not left:
                return gpushare.no_mig_profile(sel.mig, sorted(self.fleet.mig_machines))
        return "no schedulable machine it may use"
