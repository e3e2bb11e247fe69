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

from .model import Quota, Snapshot, WaitingRun, Workspace


class Usage:
    """What a workspace holds on the cluster: running + stopping + started this cycle."""

    __slots__ = ("gpus", "cpu_cores", "memory_bytes", "workers")

    def __init__(self) -> None:
        self.gpus = 0
        self.cpu_cores = 0.0
        self.memory_bytes = 0
        self.workers = 0

    def add(self, gpus: int, cpu_cores: float, memory_bytes: int, workers: int) -> None:
        self.gpus += gpus
        self.cpu_cores += cpu_cores
        self.memory_bytes += memory_bytes
        self.workers += workers


def dominant_share(usage: Usage, ws: Workspace | None) -> float:
    """Largest fraction of any quota in use, divided by the weight. No quota: 0."""
    if ws is None or ws.quota is None:
        return 0.0
    q: Quota = ws.quota
    share = 0.0
    for field in ("gpus", "cpu_cores", "memory_bytes", "workers"):
        limit = getattr(q, field)
        if limit is None:
            continue
        used = getattr(usage, field)
        if limit <= 0:
            frac = float("inf") if used > 0 else 0.0
        else:
            frac = used / limit
        share = max(share, frac)
    return share / ws.weight if ws.weight > 0 else float("inf")


def queue_order(
    snapshot: Snapshot, usage: dict[str, Usage], workspaces: dict[str, Workspace]
) -> Iterator[WaitingRun]:
    runs = snapshot.waiting
    if snapshot.fifo:
        yield from sorted(runs, key=lambda r: (r.submitted_at, r.name))
        return
    if not snapshot.fair_share:
        yield from sorted(runs, key=lambda r: (-r.priority, r.submitted_at, r.name))
        return
    levels: dict[int, dict[str, list[WaitingRun]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        levels[r.priority][r.workspace].append(r)
    for priority in sorted(levels, reverse=True):
        per_ws = levels[priority]
        heap = []
        pos: dict[str, int] = {}
        for ws_id, lst in per_ws.items():
            lst.sort(key=lambda r: (r.submitted_at, r.name))
            pos[ws_id] = 0
            share = dominant_share(usage[ws_id], workspaces.get(ws_id))
            heap.append((share, lst[0].submitted_at, lst[0].name, ws_id))
        heapq.heapify(heap)
        while heap:
            _, _, _, ws_id = heapq.heappop(heap)
            lst = per_ws[ws_id]
            run = lst[pos[ws_id]]
            yield run  # the caller handles it (may start it, changing usage[ws_id]) before we continue
            pos[ws_id] += 1
            if pos[ws_id] < len(lst):
                nxt = lst[pos[ws_id]]
                share = dominant_share(usage[ws_id], workspaces.get(ws_id))
                heapq.heappush(heap, (share, nxt.submitted_at, nxt.name, ws_id))
