"""One scheduling cycle: `plan(snapshot, now) -> Plan`. Pure: no I/O, no clock, no randomness.

The phases, named as the README describes the scheduler (each a method of `Cycle`):
  room                the cluster's free room from machines and running work (`Cluster`), each workspace's usage;
  order_queue         the waiting runs lazily in priority → fair share → submission order (`queue_order`);
  reservation_stops   work of other namespaces still on the machines of a reservation whose window is open is
                      stopped (it stays in the room until it is gone, and counts as stopping work);
  held                a run whose dependency is not met (`dependencies.verdict`), whose job array already runs
                      its `max_running` runs, or that names a reservation whose window has not opened, waits with
                      its reason and is never the head; one whose dependency can no longer be met, or whose
                      reservation has ended, fails;
  place               the machines it may use (node selection, pools, GPU model, reservations: `Cluster.allowed`);
                      can the run ever run here? is it within quota? does it fit now? start it if so — behind
                      the head only in room the head does not need, or anywhere if its time limit (and the
                      stop grace after it) ends it by the shadow time (backfill);
  find_head           the first run that cannot start now but could here is the head, and its room is held:
    preempt             room that work stopping for it frees, or the fewest new victims (`choose_victims`);
    compute_shadow_time otherwise when it starts at the latest: running work ends at its time limit, and is
                        gone once its machine's stop grace has run out (`shadow`);
  queue_behind_head   every later run that does not start is queued behind the head;
  explain             per-machine "why not" lines for the first runs left waiting (`WhyNot`).
"""

from __future__ import annotations

import gc
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, is_not

from . import reasons as R
from .cluster import Cluster, by_worker_index
from .dependencies import verdict
from .head import HeadFit, choose_victims, least_work_lost_order, shadow, unit_grace, unit_order_key
from .model import (
    Plan,
    QuotaReached,
    RunningUnit,
    Snapshot,
    StartRun,
    StopUnit,
    WaitingRun,
    Workspace,
    start_run,
)
from .progress import loss_words
from .queue import Batch, Usage, queue_order
from .whynot import Unstarted, WhyNot

_UNSET = object()
_EMPTY: frozenset[int] = frozenset()
# A quota note made at C speed from (run, workspace, message)
_note_of = partial(tuple.__new__, QuotaReached)
_unit_run, _unit_array, _run_name = attrgetter("run"), attrgetter("array"), attrgetter("name")


@dataclass(frozen=True)
class Paths:
    """Which way a cycle goes where it has a fast path and a plain one. Both give the same plan; the plain one is
    the reference tests/scheduler/test_fast_paths.py holds the fast one to. Production uses FAST."""

    # Runs behind the head settled in bulk by the queue (`Cycle.settle`); plain: one run at a time.
    batch: bool = True
    # A start keeps the outcomes settled for its workspace's runs when the workspace has no quota; plain: every
    # start forgets them.
    keep_settled: bool = True
    # A gang behind the head is settled too (its outcome kept by its sorted shapes); plain: one-worker runs only.
    settle_gangs: bool = True
    # Why-not lines of restricted runs laid over the per-shape template (`WhyNot`); plain: machine by machine.
    from_template: bool = True
    # A fractional worker's GPU found through the cluster's share index (`Cluster.best_share`); plain: every machine
    # scored.
    share_index: bool = True


FAST = Paths()
PLAIN = Paths(batch=False, keep_settled=False, settle_gangs=False, from_template=False, share_index=False)

QuotaSpec = tuple  # ((word, formatter, limit), ...) for gpus, cpu cores, memory, workers; limit None: no limit


def _quota_spec(ws: Workspace | None) -> QuotaSpec | None:
    if ws is None or ws.quota is None:
        return None
    return tuple((word, fmt, getattr(ws.quota, field)) for field, word, fmt in R.QUOTA_RESOURCES)


def _quota_check(spec: QuotaSpec, usage: Usage, workers) -> tuple[str, bool, str, str] | None:
    """(detail, alone, the run's reason, the quota note) for the first quota resource the workers would
    exceed, or None."""
    asked = (
        sum(w.gpus for w in workers),
        sum(w.cpu_cores for w in workers),
        sum(w.memory_bytes for w in workers),
        len(workers),
    )
    found = None
    for (word, fmt, limit), a in zip(spec, asked, strict=True):
        if limit is not None and a > limit:
            found = R.quota_alone(word, fmt, a, limit), True
            break
    if found is None:
        in_use = (usage.gpus, usage.cpu_cores, usage.memory_bytes, usage.workers)
        for (word, fmt, limit), a, u in zip(spec, asked, in_use, strict=True):
            if limit is not None and u + a > limit + 1e-9:  # fractions of GPUs add up in floating point
                found = R.quota_in_use(word, fmt, u, a, limit), False
                break
    if found is None:
        return None
    detail, alone = found
    reason = R.waits_beyond_quota(detail) if alone else R.waits_for_quota(detail)
    return detail, alone, reason, R.quota_reached(detail)


def plan(snapshot: Snapshot, now: float, paths: Paths = FAST) -> Plan:
    # A cycle makes many objects and frees few, and none of them in reference cycles: the cyclic garbage
    # collector, run every few thousand of them, would walk the whole snapshot again and again for nothing (a
    # quarter of a cycle with 100,000 waiting runs on 10,000 machines). It is paused for the cycle.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _plan(snapshot, now, paths)
    finally:
        if paused:
            gc.enable()


def _plan(snapshot: Snapshot, now: float, paths: Paths = FAST) -> Plan:
    cycle = Cycle(snapshot, now, paths)
    held, place, starts = cycle.held, cycle.place, cycle.starts
    user_limits = cycle.user_limits
    batch = cycle.batch
    for run in cycle.order_queue():
        if batch is not None and not batch.on and cycle.head is not None and len(cycle.unstarted) >= cycle.keep:
            # From here on the queue may settle runs in bulk (`Cycle.settle`): the head is known and the runs
            # that get why-not lines are all found, so a run that starts nothing changes nothing but its reason.
            batch.on = True
        if (run.dependency is not None or run.array is not None or run.node_selection.reservation is not None
                or (run.user is not None and run.workspace in user_limits)) and held(run):
            continue  # its dependency is not met, or its job array runs as many as it may: it has its reason
        if run.array is None:
            left = place(run) if cycle.head is None else cycle.behind(run)
        else:
            started = len(starts)
            left = place(run)
            if len(starts) > started:
                cycle.array_started(run)
        if left is None:
            continue  # started whole, or it has its reason (it cannot run here; it waits for quota or the head)
        if cycle.head is None:
            cycle.find_head(run, *left)
        else:
            cycle.queue_behind_head(run)
    if batch is not None:
        batch.settle = None  # the batch holds the cycle's bound method: no reference cycle is left behind
    return cycle.result()


def _order_key(run: WaitingRun, share: float) -> tuple:
    """A run's place in the queue, with the share its workspace had when the queue yielded it."""
    return (-run.priority, share, run.submitted_at, run.name, run.workspace)


class Cycle:
    """What one cycle knows: the room, each workspace's usage, the head, and the plan so far."""

    def __init__(self, snapshot: Snapshot, now: float, paths: Paths = FAST):
        self.snapshot = snapshot
        self.now = now
        self.paths = paths
        self.settle_gangs = paths.settle_gangs
        self.starts: list[StartRun] = []
        self.stops: list[StopUnit] = []
        self.reasons: dict[str, str] = {}
        self.quota_notes: list[QuotaReached] = []
        # Notes made once runs may be settled in bulk, and their runs; sorted by the runs' order key (-priority,
        # share, submitted, name, workspace), they follow `quota_notes` in queue order. Each batch of them (one
        # `settle` call's, or one `_note`'s: (where it begins, the share its runs had)) is in queue order, so all
        # are when every batch's first run comes after the one before it (`_notes` sorts only if not).
        self.bulk_notes: list[QuotaReached] = []
        self.bulk_runs: list[WaitingRun] = []
        self.note_batches: list[tuple[int, float]] = []
        self.unstarted: list[tuple[Unstarted, int]] = []  # the first runs left waiting: they get why-not lines
        limit = snapshot.why_not_limit
        self.keep = len(snapshot.waiting) if limit is None else max(limit, 0)
        self.head: WaitingRun | None = None
        self.shadow_time: float | None = None
        self.failed: set[tuple] = set()  # placements known not to fit: free room only shrinks within a cycle
        self.never: dict[tuple, str | None] = {}  # (shapes, machines) -> "Cannot run on this cluster: …" or None
        self.queued_behind: dict[str, str] = {}  # the reason behind the head, per workspace of the waiting run
        # Behind the head, per workspace: (shape, allowed key, view B) -> why a one-worker run did not start (it
        # cannot run here, waits for quota, or waits behind the head: `_waits`), until the workspace's usage
        # changes when it has a quota (`_take`); a gang's likewise, keyed by (its sorted shapes, allowed key,
        # view B, topology). `settle` keeps an outcome it found under the key of its `_settle_memo` too (id of
        # the workers, id of the selection, time limit: three items, never equal to those keys' four or five).
        self.settled: dict[str, dict[tuple, tuple]] = {}
        self.fails: dict[str, str] = {}  # runs whose dependency can no longer be met, or whose reservation ended
        self.room()
        snap = snapshot
        self.batch = Batch(self.settle) if paths.batch and snap.fair_share and not snap.fifo and self.all_plain else None
        self._view_b: dict[float | None, bool] = {}  # time limit -> view B, behind the head
        self._settle_memo: dict[tuple, tuple] = {}  # (id(workers), id(selection), time limit) -> `settle`'s key
        self.reservation_stops: list[StopUnit] = []
        # Running work as preemption and the shadow time see it: units stopped for a reservation are stopping.
        self.running: tuple[RunningUnit, ...] = snapshot.running
        self.stop_for_reservations()

    # ----------------------------------------------------------------------------------------------- room

    def room(self) -> None:
        snapshot = self.snapshot
        self.usage: dict[str, Usage] = defaultdict(Usage)  # counted as the cluster's room is taken
        self.cluster = Cluster(snapshot, self.now, self.usage, self.paths.share_index)
        self.workspaces = {ws.id: ws for ws in snapshot.workspaces}
        # Per workspace: True when nothing restricts its runs beyond their own node selection (no pools of its
        # own, no reservation of another namespace now or ahead): the fast path of `place`.
        self.plain: dict[str, bool] = {}
        self.all_plain = not snapshot.reservations and all(ws.pools is None for ws in snapshot.workspaces)
        self.by_selection: dict[int, tuple] = {}  # id(NodeSelection) -> (it, Cluster.allowed's answer) when all_plain
        # The waiting runs that hold room now too (an Independent run's other workers): they avoid the machines they
        # are on (`held_by`, made when first asked). Few or none: most runs' test reads a small set.
        self.also_running = frozenset(map(_unit_run, snapshot.running)).intersection(map(_run_name, snapshot.waiting))
        self._held_by: dict[str, frozenset[int]] | None = None
        # Job arrays: (workspace, array) -> the runs of it that hold room now (counted once however many units).
        self.array_runs: dict[tuple[str, str], set[str]] = defaultdict(set)
        running = snapshot.running
        for u in compress(running, map(is_not, map(_unit_array, running), repeat(None))):
            self.array_runs[u.workspace, u.array].add(u.run)
        # Per (workspace, user) with a per-user limit: the GPUs that user's running work holds (all of it, stopping
        # too: its room is still taken).
        self.user_limits = {ws.id: ws.max_gpus_per_user for ws in snapshot.workspaces
                            if ws.max_gpus_per_user is not None}
        self.user_gpus: dict[tuple[str, str], int] = defaultdict(int)
        if self.user_limits:
            for u in running:
                if u.user is not None and u.workspace in self.user_limits:
                    self.user_gpus[u.workspace, u.user] += sum(
                        w.gpu_milli / 1000 if w.gpu_milli else len(w.gpu_indices) for w in u.workers)
        self.quota_specs = {ws_id: _quota_spec(ws) for ws_id, ws in self.workspaces.items()}
        # Per workspace with a quota: group shapes -> _quota_check's answer at the workspace's usage now; cleared
        # whenever that usage changes (same ask, same usage: same answer).
        self.quota_seen: dict[str, dict] = {ws_id: {} for ws_id, spec in self.quota_specs.items() if spec is not None}

    # ---------------------------------------------------------------------------------- reservation_stops

    def stop_for_reservations(self) -> None:
        """Inside a reservation's window, every running unit of another namespace with a worker on one of its
        machines is stopped like a preemption (its room stays taken this cycle: it is still stopping)."""
        opened = self.cluster.reserved.open
        if not opened:
            return
        stopped: set[int] = set()
        order = sorted(range(len(self.running)), key=lambda k: unit_order_key(self.running[k]))
        for r, _ in opened:  # by start, then name
            machines = frozenset(r.machines)
            spaces = frozenset(r.workspaces)
            for k in order:
                u = self.running[k]
                if u.stopping or k in stopped or u.workspace in spaces:
                    continue
                if any(w.machine in machines for w in u.workers):
                    stopped.add(k)
                    self.reservation_stops.append(StopUnit(
                        run=u.run, workers=tuple(w.name for w in u.workers), preempted_by=r.name,
                        reason=R.stopped_for_reservation(r.name),
                    ))
        if stopped:
            self.running = tuple(replace(u, stopping=True) if k in stopped else u for k, u in enumerate(self.running))

    def held_by(self, name: str) -> frozenset[int]:
        """The machines where run `name` holds workers now."""
        if self._held_by is None:
            by: dict[str, set[int]] = defaultdict(set)
            index_get = self.cluster.index.get
            for u in self.snapshot.running:
                for w in u.workers:
                    i = index_get(w.machine)
                    if i is not None:
                        by[u.run].add(i)
            self._held_by = {run: frozenset(machines) for run, machines in by.items()}
        return self._held_by.get(name, _EMPTY)

    def is_plain(self, ws_id: str) -> bool:
        plain = self.plain.get(ws_id)
        if plain is None:
            ws = self.workspaces.get(ws_id)
            plain = self.plain[ws_id] = (ws is None or ws.pools is None) and not self.cluster.reserved.affects(ws_id)
        return plain

    def ws_pools(self, ws_id: str) -> tuple[str, ...] | None:
        ws = self.workspaces.get(ws_id)
        return None if ws is None else ws.pools

    # ---------------------------------------------------------------------------------------- order_queue

    def order_queue(self):
        return queue_order(self.snapshot, self.usage, self.workspaces, self.batch)

    # ----------------------------------------------------------------------------------------------- held

    def held(self, run: WaitingRun) -> bool:
        """True when the run may not start this cycle whatever the room: its dependency is not met (it waits, or
        fails when it can no longer be met), or its job array already runs `array_max_running` runs."""
        if run.dependency is not None:
            found = verdict(run.dependency)
            if found is not None:
                kind, reason = found
                if kind == "fail":
                    self.fails[run.name] = reason
                else:
                    self.reasons[run.name] = reason
                return True
        if run.array is not None and run.array_max_running is not None:
            runs = self.array_runs.get((run.workspace, run.array), ())
            if run.name not in runs and len(runs) >= run.array_max_running:
                self.reasons[run.name] = R.array_limit(len(runs), run.array, run.array_max_running)
                return True
        if run.user is not None and self.user_limits:
            limit = self.user_limits.get(run.workspace)
            if limit is not None:
                in_use = self.user_gpus.get((run.workspace, run.user), 0)
                asked = sum(w.gpus for w in run.workers)
                if in_use.__class__ is float or asked.__class__ is float:  # fractions (issue 46): sums of thousandths
                    in_use, asked = R.number(in_use), R.number(asked)
                    if float(in_use) + float(asked) > limit + 1e-9:
                        self.reasons[run.name] = R.waits_for_user_limit(run.user, in_use, asked, limit)
                        return True
                elif in_use + asked > limit:
                    self.reasons[run.name] = R.waits_for_user_limit(run.user, in_use, asked, limit)
                    return True
        name = run.node_selection.reservation
        if name is not None:
            r = self.cluster.reserved.by_name.get(name)
            if r is None or (r.end is not None and r.end <= self.now):
                self.fails[run.name] = R.reservation_ended(name)
                return True
            if run.workspace not in r.workspaces:
                self.reasons[run.name] = R.reservation_not_for_namespace(name)
                return True
            if self.now < r.start:
                self.reasons[run.name] = R.waits_for_reservation(name, r.start)
                return True
        return False

    def array_started(self, run: WaitingRun) -> None:
        self.array_runs[run.workspace, run.array].add(run.name)

    # ---------------------------------------------------------------------------------------------- place

    def place(self, run: WaitingRun) -> tuple[tuple, list[int] | None, frozenset[int]] | None:
        """Start what of the run fits now. Returns (its workers still waiting for room, the machines it may use,
        the machines it must avoid) when some are, None when it started whole or has its reason already."""
        workers = run.workers
        if not workers:
            return None
        sel = run.node_selection
        plain = self.all_plain or self.plain.get(run.workspace)
        if plain is None:
            plain = self.is_plain(run.workspace)
        if (sel.mode == "Any" and not run.excluded_machines and plain and not sel.pools and not sel.gpu_model
                and sel.reservation is None and not sel.gpu_memory and not sel.mig):
            allowed_key, allowed, allowed_list = -1, None, None  # every schedulable machine
        elif self.all_plain and not run.excluded_machines:
            # Nothing but its own selection restricts it: runs sharing a NodeSelection object share the answer,
            # found by the object's id (no hashing of its names or labels run by run).
            hit = self.by_selection.get(id(sel))
            if hit is None or hit[0] is not sel:
                hit = self.by_selection[id(sel)] = (sel, self.cluster.allowed(run))
            allowed_key, allowed, allowed_list = hit[1]
        else:
            allowed_key, allowed, allowed_list = self.cluster.allowed(run, self.ws_pools(run.workspace))
        if len(workers) == 1:
            w0 = workers[0]
            ordered = shapes = (w0.gpus, w0.cpu_cores, w0.memory_bytes)  # one worker: its shape, not a 1-tuple
        else:
            ordered = tuple([(w.gpus, w.cpu_cores, w.memory_bytes) for w in workers])
            shapes = tuple(sorted(ordered))
        avoid = self.held_by(run.name) if run.name in self.also_running else _EMPTY
        # Behind the head a run may use the head's room only if its time limit, and the stop grace after it,
        # end it by the shadow time.
        settled = None
        if self.head is None:
            ends_before = view_b = False
        else:
            view_b = self._view_b_for(run.time_limit_seconds)
            ends_before = not view_b
            if not avoid and (len(workers) == 1 or (run.start == "Gang" and self.settle_gangs)):
                # One worker, or a gang, behind the head: a run of its workspace with the same shapes, machines
                # and view that waited already waits the same way (free room only shrinks; the workspace's usage,
                # which its quota answer reads, has not changed since: `_take` forgets its runs' outcomes).
                settled = self.settled.get(run.workspace)
                if settled is None:
                    settled = self.settled[run.workspace] = {}
                # One worker: shapes is its (gpus, cpu cores, memory); a gang's key has its sorted shapes.
                sk = (*shapes, allowed_key, view_b) if len(workers) == 1 else (shapes, allowed_key, view_b,
                                                                               sel.topology_same)
                outcome = settled.get(sk)
                if outcome is not None:
                    return self._waits(run, workers, outcome, allowed_key)
        same = sel.topology_same if len(workers) > 1 else None
        nk = (shapes, allowed_key, same)
        never = self.never.get(nk, _UNSET)
        if never is _UNSET:
            never = self._never(run, workers, allowed_key, allowed_list)
            if never is None and same is not None:
                never = self.cluster.cannot_have_same(same, len(workers), allowed)
            self.never[nk] = never
        if never is not None:
            if settled is not None:
                settled[sk] = (never, None, None, False)
            self.reasons[run.name] = never
            self._left_waiting(run, workers, False, None, avoid, allowed_key)
            return None
        where = (allowed_key, allowed, allowed_list)
        if len(workers) == 1 or run.start == "Gang":
            waiting, quota = self._place_together(run, ordered, shapes, where, avoid, view_b, ends_before)
        else:
            waiting, quota, avoid = self._place_each(run, ordered, where, avoid, view_b, ends_before)
        if not waiting:
            return None
        if settled is not None:
            outcome = settled[sk] = (self._behind(run.workspace), None, None, view_b) if quota is None else (
                quota[2], quota[3], quota[0], view_b)
            return self._waits(run, workers, outcome, allowed_key)
        if quota is not None:
            self.reasons[run.name] = quota[2]
            if not run.quota_noted:
                self._note(run, quota[3])
            self._left_waiting(run, waiting, view_b, quota[0], avoid, allowed_key)
            return None
        self._left_waiting(run, waiting, view_b, None, avoid, allowed_key)
        if same is not None:  # as the head it frees room inside one group: the largest it may use
            allowed_list = self.cluster.largest_group(same, allowed)
        return waiting, allowed_list, avoid

    def behind(self, run: WaitingRun) -> tuple[tuple, list[int] | None, frozenset[int]] | None:
        """`place` for a run behind the head, with the shortest way for the most common run there: one worker,
        machines found without a lookup (any machine, or a selection object seen before), a run of its workspace
        with the same shape, machines and view settled already (`place` keeps the outcomes)."""
        workers = run.workers
        batch = self.batch
        if len(workers) != 1 or not self.all_plain or run.excluded_machines or (batch is not None
                                                                                and run is batch.missed):
            return self.place(run)
        sk = self._memo_key(run)
        settled = self.settled.get(run.workspace)
        if sk is None or settled is None or run.name in self.also_running:
            return self.place(run)
        outcome = settled.get(sk)
        if outcome is None:
            return self.place(run)
        return self._waits(run, workers, outcome, sk[3])  # a one-worker key: (gpus, cpu, memory, allowed key, view)

    def _waits(self, run: WaitingRun, workers, outcome: tuple, allowed_key: int) -> None:
        """A one-worker run behind the head that does not start, as `outcome` says: (its reason, the quota note or
        None, the quota detail its why-not lines show or None, judged in view B)."""
        reason, note, detail, view_b = outcome
        self.reasons[run.name] = reason
        if note is not None and not run.quota_noted:
            self._note(run, note)
        if len(self.unstarted) < self.keep:
            self.unstarted.append((Unstarted(run, workers, view_b, detail, _EMPTY), allowed_key))

    def _note(self, run: WaitingRun, message: str) -> None:
        batch = self.batch
        if batch is not None and batch.on:
            self.note_batches.append((len(self.bulk_notes), batch.share))
            self.bulk_notes.append(_note_of((run.name, run.workspace, message)))
            self.bulk_runs.append(run)
        else:
            self.quota_notes.append(QuotaReached(run.name, run.workspace, message))

    def _notes(self) -> tuple[QuotaReached, ...]:
        """The quota notes in queue order: those made before runs were settled in bulk, then the others by their
        runs' order key (the order the queue yields them in)."""
        bulk = self.bulk_notes
        if not bulk:
            return tuple(self.quota_notes)
        runs, batches = self.bulk_runs, self.note_batches
        if any(_order_key(runs[k - 1], batches[b - 1][1]) > _order_key(runs[k], share)
               for b, (k, share) in enumerate(batches) if b):
            ends = [k for k, _ in batches[1:]] + [len(bulk)]
            keys = [_order_key(runs[k], share) for (start, share), end in zip(batches, ends, strict=True)
                    for k in range(start, end)]
            bulk = [bulk[k] for k in sorted(range(len(bulk)), key=keys.__getitem__)]
        return (*self.quota_notes, *bulk)

    def settle(self, lst: list[WaitingRun], share: float) -> bool:
        """Behind the head, once the why-not runs are found: take from the end of `lst` (next run last) the runs
        `behind` (or, for a gang, `place`) would settle from `settled` — one worker or a gang, machines known
        without a lookup, an outcome recorded for its workspace, shapes, machines and view — and give them their
        outcome (`_waits`), stopping at the
        first other run. Their outcome holds at their turn in the queue: they start nothing, their workspace's
        runs before them are handled (so its usage, and `settled`, are as they will be then), and free room only
        shrinks. Returns True when it took any."""
        settled_of = self.settled
        also_running = self.also_running
        user_limits = self.user_limits
        reasons = self.reasons
        bulk = self.bulk_notes
        append, noted = bulk.append, self.bulk_runs.append
        first_note = len(bulk)
        ws = lst[-1].workspace if lst else None
        settled = settled_of.get(ws)
        taken = 0
        memo = self._settle_memo
        for run in reversed(lst):
            if (run.dependency is not None or run.array is not None or run.excluded_machines
                    or (user_limits and run.user is not None and run.workspace in user_limits)):
                break
            if run.workspace is not ws:
                ws = run.workspace  # the merged runs of workspaces without a quota
                settled = settled_of.get(ws)
            if not settled:
                break
            # An outcome found before for the same (workers, selection, time limit) objects is kept under those
            # objects' key too (`settled`): most runs here find theirs in one lookup
            mk = (id(run.workers), id(run.node_selection), run.time_limit_seconds)
            outcome = settled.get(mk)
            if outcome is None:
                sk = memo.get(mk)  # `_memo_key` inline
                if sk is None:
                    sk = self._memo_key(run)
                    if sk is None:
                        break
                outcome = settled.get(sk)
                if outcome is None:
                    self.batch.missed = run  # neither the queue's next `settle` nor `behind` looks it up again
                    break
                settled[mk] = outcome
            name = run.name
            if also_running and name in also_running:
                break
            reasons[name] = outcome[0]
            if outcome[1] is not None and not run.quota_noted:  # its note, made by `_notes`
                append(_note_of((name, ws, outcome[1])))
                noted(run)
            taken += 1
        if not taken:
            return False
        if len(bulk) > first_note:
            self.note_batches.append((first_note, share))
        del lst[len(lst) - taken:]
        return True

    def _memo_key(self, run: WaitingRun) -> tuple | None:
        """Behind the head: the run's key in `settled` (as `place` keeps outcomes), found once per (workers,
        selection, time limit) objects of the cycle (they live all the cycle: ids are theirs; the allowed key and
        view are fixed once the head is known); None when such a run is never settled (an independent run of
        many workers, a selection `place` must look up first)."""
        workers, sel, tl = run.workers, run.node_selection, run.time_limit_seconds
        mk = (id(workers), id(sel), tl)
        sk = self._settle_memo.get(mk)
        if sk is None:
            sk = self._settled_key(workers, sel, tl, run.start)
            if sk is not None:
                self._settle_memo[mk] = sk
        return sk

    def _settled_key(self, workers, sel, tl, start: str) -> tuple | None:
        """The key `place` keeps such a run's outcome under in `settled`, or None (`_memo_key`)."""
        one = len(workers) == 1
        if not one and (start != "Gang" or not self.settle_gangs):
            return None
        allowed_key = self._allowed_key_behind(sel)
        if allowed_key is None:
            return None
        view_b = self._view_b_for(tl)
        if one:
            w0 = workers[0]
            return (w0.gpus, w0.cpu_cores, w0.memory_bytes, allowed_key, view_b)
        return (tuple(sorted([(w.gpus, w.cpu_cores, w.memory_bytes) for w in workers])), allowed_key, view_b,
                sel.topology_same)

    def _view_b_for(self, time_limit: float | None) -> bool:
        """Behind the head: does a run with this time limit see view B (the room less the head's hold)? Only one whose
        time limit, and the stop grace after it, end it by the shadow time may use the head's room. Kept per time
        limit for the cycle (the shadow time is set once)."""
        view_b = self._view_b.get(time_limit)
        if view_b is None:
            st = self.shadow_time
            view_b = self._view_b[time_limit] = not (
                st is not None and time_limit is not None and self.now + time_limit + self.cluster.max_grace <= st)
        return view_b

    def _allowed_key_behind(self, sel) -> int | None:
        """The allowed key `settle` and `behind` read for runs of this selection, or None when such a run goes
        through `place` (it names a reservation; or its machines are not known yet)."""
        if sel.reservation is not None:
            return None
        if sel.mode == "Any" and not sel.pools and not sel.gpu_model and not sel.gpu_memory and not sel.mig:
            key = -1
        else:
            hit = self.by_selection.get(id(sel))
            if hit is None or hit[0] is not sel:
                return None
            key = hit[1][0]
        return key

    def _behind(self, ws_id: str) -> str:
        """The reason of a run of this workspace queued behind the head (the head as the workspace may see it)."""
        behind = self.queued_behind.get(ws_id)
        if behind is None:
            head = self.head
            assert head is not None
            behind = R.queued_behind(R.shown(head.name, head.workspace, ws_id), self.shadow_time)
            self.queued_behind[ws_id] = behind
        return behind

    def _never(self, run: WaitingRun, workers, allowed_key: int, allowed_list: list[int] | None) -> str | None:
        """The reason of a run that can never run on the machines it may use, or None. When it could on machines
        reserved for another namespace, it waits for them (it is never the head: they may stay reserved)."""
        cluster = self.cluster
        ws_pools = self.ws_pools(run.workspace)
        why = cluster.never_fits(run, workers, allowed_list, ws_pools)
        if why is None:
            return None
        if allowed_key in cluster.restricted and cluster.reserved.affects(run.workspace):
            _, _, unreserved = cluster.allowed(run, ws_pools, reserved=False)
            if unreserved != allowed_list and cluster.never_fits(run, workers, unreserved, ws_pools) is None:
                return R.waits_for_reserved_machines()
        return R.cannot_run(why)

    def _place_together(self, run: WaitingRun, ordered, shapes, where, avoid, view_b: bool, ends_before: bool):
        """A gang, or a run of one worker: placed all at once or not at all. Returns (workers still waiting,
        the quota check that stops it or None)."""
        workers = run.workers
        seen = self.quota_seen.get(run.workspace)
        quota = None
        if seen is not None:
            quota = seen.get(ordered, _UNSET)
            if quota is _UNSET:
                quota = seen[ordered] = _quota_check(self.quota_specs[run.workspace], self.usage[run.workspace],
                                                     workers)
        if quota is not None or (self.head is not None and not self.snapshot.backfill):
            return workers, quota  # over quota; or backfill off: nothing behind the head starts
        chosen = self._fit(workers, shapes, where, avoid, view_b, run.workspace, run.node_selection.topology_same)
        if chosen is None:
            return workers, None
        self.starts.append(start_run(run.name, self._take(run, chosen, ends_before), self.head is not None))
        return (), None

    def _place_each(self, run: WaitingRun, ordered, where, avoid: frozenset[int], view_b: bool, ends_before: bool):
        """Independent workers, each on its own. Returns (workers still waiting, the quota check that stops them
        or None, the machines the run now holds workers on)."""
        workers = run.workers
        ws_id = run.workspace
        seen = self.quota_seen.get(ws_id)
        blocked = self.head is not None and not self.snapshot.backfill  # backfill off: nothing behind the head
        placements: list = []
        waiting: list = []
        quota = None
        for k, w in enumerate(workers):
            s = ordered[k]
            if seen is not None:
                q = seen.get(s, _UNSET)
                if q is _UNSET:
                    q = seen[s] = _quota_check(self.quota_specs[ws_id], self.usage[ws_id], (w,))
                if q is not None:
                    quota = q
                    waiting.extend(workers[k:])
                    break
            chosen = None if blocked else self._fit((w,), s, where, avoid, view_b, run.workspace)
            if chosen is None:
                waiting.append(w)
                continue
            placements.extend(self._take(run, chosen, ends_before))
            avoid = avoid | {i if i.__class__ is int else i[0] for _, i in chosen}
        if placements:
            if len(placements) > 1:
                placements.sort(key=by_worker_index)
            self.starts.append(start_run(run.name, tuple(placements), self.head is not None))
        return tuple(waiting), quota, avoid

    def _fit(self, workers, shapes, where, avoid: frozenset[int], view_b: bool, workspace: str = "",
             same: str | None = None):
        """Machines for the workers in the view, or None (remembered: free room only shrinks in a cycle)."""
        allowed_key, allowed, allowed_list = where
        fk = (shapes, allowed_key, avoid, view_b, same)
        if workers[0].gpus.__class__ is float:
            fk += (workspace,)  # a fractional worker's room on shared GPUs depends on its workspace
        if fk in self.failed:
            return None
        chosen = self.cluster.place(workers, allowed, allowed_list, avoid, view_b, workspace, same)
        if chosen is None:
            self.failed.add(fk)
        return chosen

    def _take(self, run: WaitingRun, chosen, ends_before: bool):
        """Commit the placement: the room is taken and counted in the workspace's usage."""
        placed = self.cluster.commit(run.name, run.workspace, run.priority, chosen, ends_before)  # in worker order
        use = self.usage[run.workspace]
        for w, _ in chosen:
            use.add(w.gpus, w.cpu_cores, w.memory_bytes, 1)
        if run.user is not None and run.workspace in self.user_limits:
            self.user_gpus[run.workspace, run.user] += sum(w.gpus for w, _ in chosen)
        seen = self.quota_seen.get(run.workspace)
        if seen is not None or not self.paths.keep_settled:
            if seen is not None:
                seen.clear()
            # With a quota, the outcomes settled for the workspace's runs read its usage (the quota's answer and
            # its text): they are found again. Without one they hold: "cannot run here" for good, and no room in
            # the view stays no room (free room only shrinks).
            settled = self.settled.get(run.workspace)
            if settled:
                settled.clear()
        return placed

    def _left_waiting(self, run: WaitingRun, workers, view_b: bool, quota: str | None, avoid, allowed_key: int):
        if len(self.unstarted) < self.keep:
            self.unstarted.append((Unstarted(run, tuple(workers), view_b, quota, avoid), allowed_key))

    # ------------------------------------------------------------------------------------------ find_head

    def find_head(self, run: WaitingRun, waiting, allowed_list: list[int] | None, avoid: frozenset[int]) -> None:
        """The run is the head: free room for it by preemption, or else compute its shadow time. Either way
        the room it will take is held, so that nothing behind it may take it."""
        self.head = run
        cluster = self.cluster
        machines = [i for i in (cluster.all_schedulable if allowed_list is None else allowed_list) if i not in avoid]
        fit = HeadFit(cluster, waiting, machines)
        found = self.preempt(run, fit)
        if found is None:  # a MIG head's too: its holders' devices free as they end (HeadFit counts them)
            found = self.compute_shadow_time(run, fit)
        self.shadow_time, self.reasons[run.name] = found

    def preempt(self, head: WaitingRun, fit: HeadFit) -> tuple[float, str] | None:
        """Room from lower-priority work: what already stops for the head if that suffices, else the fewest
        new victims. Returns (when the head starts at the latest, its reason), or None when preemption cannot
        make room."""
        cluster, now, running = self.cluster, self.now, self.running
        # Work already stopping for the head: its room is the head's; no new victims if it suffices.
        for_head = [u for u in running if u.stopping and u.preempted_for == head.name]
        for u in for_head:
            fit.add(u)
        if for_head:
            chosen = fit.placement()
            if chosen is not None:
                cluster.hold(fit.holds(chosen))
                t = now + max(unit_grace(cluster, u) for u in for_head)
                return t, R.head_waiting_for_victims(sum(len(u.workers) for u in for_head))
        if self.snapshot.preemption:
            guarded = cluster.reserved.open_for(head.workspace)
            if guarded:
                # Inside a reservation's window, runs from outside it never preempt work on its machines.
                index_get = cluster.index.get
                running = [u for u in running if not any(index_get(w.machine) in guarded for w in u.workers)]
            least = self.snapshot.victims == "least-work-lost"
            found = choose_victims(fit, head.priority, running, least_work_lost_order(now) if least else None)
            if found is not None:
                victims, chosen = found
                cluster.hold(fit.holds(chosen))
                t = now + max(unit_grace(cluster, u) for u in victims + for_head)
                self.stops.extend(
                    StopUnit(
                        run=u.run,
                        workers=tuple(w.name for w in u.workers),
                        preempted_by=head.name,
                        reason=R.preempted_by(R.shown(head.name, head.workspace, u.workspace))
                        + (f"; {loss_words(now, u.started_at, u.last_checkpoint)}" if least else ""),
                    )
                    for u in victims
                )
                first = victims[0]
                n = sum(len(u.workers) for u in victims)
                return t, R.head_preempting(n, R.shown(first.run, first.workspace, head.workspace))
        for u in for_head:
            fit.add(u, -1)  # `shadow` counts all stopping work itself
        return None

    def compute_shadow_time(self, head: WaitingRun, fit: HeadFit) -> tuple[float | None, str]:
        """When the head starts at the latest, as running work ends; the room it takes then is held now."""
        deadlines = self.cluster.reserved.deadlines(head.workspace, head.time_limit_seconds)
        if deadlines:
            deadlines = {i: t for i, t in deadlines.items() if i in fit.machine_set}
        t, held = shadow(self.cluster, fit, self.running, self.now, deadlines)
        self.cluster.hold(held)
        return t, R.head_next(head.priority, t)

    # ---------------------------------------------------------------------------------- queue_behind_head

    def queue_behind_head(self, run: WaitingRun) -> None:
        self.reasons[run.name] = self._behind(run.workspace)

    # -------------------------------------------------------------------------------------------- explain

    def explain(self) -> dict[str, tuple[tuple[str, str], ...]]:
        why_not: dict[str, tuple[tuple[str, str], ...]] = {}
        if self.unstarted:
            lines = WhyNot(self.cluster, self.head, self.snapshot.why_not_machines,
                           self.paths.from_template).lines
            for u, allowed_key in self.unstarted:
                why_not.update(lines(u, allowed_key))
        return why_not

    def result(self) -> Plan:
        head = self.head
        return Plan(
            starts=tuple(self.starts),
            stops=tuple(self.stops),
            reasons=self.reasons,
            why_not=self.explain(),
            head=head.name if head is not None else None,
            shadow_time=self.shadow_time,
            quota_reached=self._notes(),
            fails=self.fails,
            reservation_stops=tuple(self.reservation_stops),
        )
