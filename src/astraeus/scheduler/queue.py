"""Queue order: priority (higher first), then fair share, then submission time.

Fair share moves during a cycle: a workspace's dominant share counts its running and stopping work and what
it started earlier in the same cycle. So the order is produced lazily: within one priority, a heap holds the
next run of each workspace keyed by that workspace's share / weight; when a run of workspace W has been
handled (and perhaps started), W's next run goes back into the heap with W's share as it is now. Other
workspaces' keys do not change, so each step is O(log workspaces).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator
from functools import partial
from itertools import islice
from operator import attrgetter, eq

from .model import Quota, Snapshot, WaitingRun, Workspace


class Usage:
    """What a workspace holds on the cluster: running + stopping + started this cycle."""

    __slots__ = ("gpus", "cpu_cores", "memory_bytes", "workers", "changes")

    def __init__(self) -> None:
        self.gpus = 0
        self.cpu_cores = 0.0
        self.memory_bytes = 0
        self.workers = 0
        self.changes = 0  # how many times it was added to: an unchanged count means an unchanged share

    def add(self, gpus: int, cpu_cores: float, memory_bytes: int, workers: int) -> None:
        self.gpus += gpus
        self.cpu_cores += cpu_cores
        self.memory_bytes += memory_bytes
        self.workers += workers
        self.changes += 1


ShareSpec = tuple  # (gpus, cpu_cores, memory_bytes, workers limits (None: no limit), weight)
_INF = float("inf")


def share_spec(ws: Workspace | None) -> ShareSpec | None:
    """What `_share` needs of a workspace, read once per cycle; None when it has no quota (share 0)."""
    if ws is None or ws.quota is None:
        return None
    q: Quota = ws.quota
    return (q.gpus, q.cpu_cores, q.memory_bytes, q.workers, ws.weight)


def _frac(used: float, limit: float) -> float:
    if limit <= 0:
        return _INF if used > 0 else 0.0
    return used / limit


def _share(usage: Usage, spec: ShareSpec) -> float:
    """The dominant share: the largest fraction of any quota in use, divided by the weight."""
    lg, lc, lm, lw, weight = spec
    share = 0.0  # `max(share, frac)` in field order: replaced only by a strictly larger fraction
    for used, limit in ((usage.gpus, lg), (usage.cpu_cores, lc), (usage.memory_bytes, lm), (usage.workers, lw)):
        if limit is not None:
            frac = _frac(used, limit)
            if frac > share:
                share = frac
    return share / weight if weight > 0 else _INF


_by_submission = attrgetter("submitted_at", "name")
_by_submitted_at, _by_name, _by_workspace = attrgetter("submitted_at"), attrgetter("name"), attrgetter("workspace")


def _sort_by_submission(runs: list[WaitingRun], times: list[float] | None = None, workspace: bool = False) -> None:
    """Sort in place by (submitted_at, name[, workspace]): sorts by one key at a time, last key first (stable
    sorts; no key tuple made per run). The name (and workspace) sorts only when two runs were submitted at the
    same time: otherwise submission alone gives the order (the names' sort was most of the sorting's time).
    `times`: the runs' submission times, read as the runs were grouped (then the runs are not read again here:
    they are put in order by their positions)."""
    if times is not None and len(set(times)) == len(times):
        # list.sort computes each key once, in list order, before it sorts: the k-th run's key is times[k] (no run
        # read again, no index list sorted and mapped back)
        runs.sort(key=partial(next, iter(times)))
        return
    runs.sort(key=_by_submitted_at)
    times = list(map(_by_submitted_at, runs))
    if any(map(eq, times, islice(times, 1, None))):  # ties: sorted again by every key
        if workspace:
            runs.sort(key=_by_workspace)
        runs.sort(key=_by_name)
        runs.sort(key=_by_submitted_at)


class Batch:
    """How the caller settles runs in bulk (fair share only). While `on`, before a run is yielded, `settle(lst,
    share)` may take from the end of `lst` (a workspace's runs of one priority, next run last; or the merged runs
    of the workspaces without a quota, share 0) the runs whose outcome it knows already and which change nothing
    (no start: no usage, no share, no room), and returns True if it took any. `share` is set before each run is
    yielded (on or not): the share its order key had (with its priority, submission and name, the runs' order key: the runs
    of one priority come in ascending order of it, since a workspace's share only grows). `missed`: the run `settle`
    last stopped at without an outcome; it is yielded without asking `settle` again (nothing of its workspace has
    changed since: its runs before it are handled)."""

    __slots__ = ("on", "share", "settle", "missed")

    def __init__(self, settle) -> None:
        self.on = False
        self.share = 0.0
        self.settle = settle
        self.missed: WaitingRun | None = None  # the run `settle` stopped at without an outcome: not asked again


def queue_order(
    snapshot: Snapshot, usage: dict[str, Usage], workspaces: dict[str, Workspace], batch: Batch | None = None
) -> Iterator[WaitingRun]:
    runs = snapshot.waiting
    if snapshot.fifo:
        yield from sorted(runs, key=_by_submission)
        return
    if not snapshot.fair_share:
        yield from sorted(runs, key=lambda r: (-r.priority, r.submitted_at, r.name))
        return
    # Per priority and workspace: the runs, and their submission times read at the same time (each run is read
    # once here, in the snapshot's order; the sorts below do not read the runs again).
    levels: dict[int, dict[str, tuple[list[WaitingRun], list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: ([], [])))
    for r in runs:
        lst, times = levels[r.priority][r.workspace]
        lst.append(r)
        times.append(r.submitted_at)
    specs: dict[str, ShareSpec | None] = {}
    heappop, heapreplace = heapq.heappop, heapq.heapreplace
    for priority in sorted(levels, reverse=True):
        per_ws: dict[str, list[WaitingRun]] = {}
        heap = []
        # Workspaces without a quota have share 0 for good: the heap would merge their runs by (submission,
        # name, workspace), so they are merged once here and stand in the heap's place as one sorted list.
        flat: list[WaitingRun] = []
        flat_times: list[float] = []
        for ws_id, (lst, times) in levels[priority].items():
            per_ws[ws_id] = lst
            if ws_id not in specs:
                specs[ws_id] = share_spec(workspaces.get(ws_id))
            spec = specs[ws_id]
            if spec is None:
                flat.extend(lst)
                flat_times.extend(times)
                continue
            _sort_by_submission(lst, times)
            lst.reverse()  # next run last: pop() walks the list in order
            first = lst[-1]
            heap.append((_share(usage[ws_id], spec), first.submitted_at, first.name, ws_id))
        _sort_by_submission(flat, flat_times, workspace=True)  # stable: a workspace's ties stay in snapshot order
        flat.reverse()
        heapq.heapify(heap)
        while True:
            if flat:
                if not heap or heap[0][0] > 0.0:
                    # Every run left in `flat` comes before the heap's first (handling them changes no share
                    # in the heap).
                    while flat:
                        if batch is not None:
                            batch.share = 0.0
                            if batch.on and flat[-1] is not batch.missed and batch.settle(flat, 0.0):
                                continue
                        yield flat.pop()
                    continue
                nxt = flat[-1]
                if (0.0, nxt.submitted_at, nxt.name, nxt.workspace) < heap[0]:
                    if batch is not None:
                        batch.share = 0.0
                        if batch.on and nxt is not batch.missed and batch.settle(flat, 0.0):
                            continue
                    yield flat.pop()
                    continue
            elif not heap:
                break
            top = heap[0]
            ws_id = top[3]
            lst = per_ws[ws_id]
            if batch is not None:
                batch.share = top[0]
                if batch.on and lst[-1] is not batch.missed and batch.settle(lst, top[0]):
                    # Settled runs start nothing: the workspace's share is the same, its next run takes its place.
                    if lst:
                        nxt = lst[-1]
                        heapreplace(heap, (top[0], nxt.submitted_at, nxt.name, ws_id))
                    else:
                        heappop(heap)
                    continue
            use = usage[ws_id]
            changes = use.changes
            yield lst.pop()  # the caller handles it (may start it, changing usage[ws_id]) before we continue
            if lst:
                # The workspace's next run takes its place in the heap, at its share now (the same share when
                # nothing of the workspace started: only its own runs change its usage).
                nxt = lst[-1]
                share = top[0] if use.changes == changes else _share(use, specs[ws_id])
                heapreplace(heap, (share, nxt.submitted_at, nxt.name, ws_id))
            else:
                heappop(heap)
