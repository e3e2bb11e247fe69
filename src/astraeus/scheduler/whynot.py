"""Per-machine "Why it is not running yet" lines for waiting workers.

One line per machine for every waiting worker is the costliest output of a cycle (10k runs × 1,000 machines
would be 10M lines), so `Snapshot.why_not_limit` caps how many runs, in queue order, get them, and lines are
shared between workers that ask for the same thing under the same conditions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cluster, Shape, shape
from .model import WaitingRun
from .reasons import gib, number, shown


@dataclass
class Unstarted:
    """A waiting run (or the workers of it still waiting) at the end of the cycle, as it was judged."""

    run: WaitingRun
    workers: tuple
    view_b: bool  # judged against the room left after the head's hold
    quota: str | None  # the quota detail when quota blocked it
    avoid: frozenset[int]  # machines holding another worker of the run


class WhyNot:
    def __init__(self, cluster: Cluster, head: WaitingRun | None):
        self.cluster = cluster
        self.head = head
        self._base: dict[tuple, tuple[tuple, list]] = {}
        self._lines: dict[tuple, tuple[tuple[str, str], ...]] = {}
        self._holders: dict[int, tuple[list, frozenset[str], str]] = {}
        self._own: dict[tuple[int, str], str] = {}
        self.free_gpus = [len(f) for f in cluster.free_g]

    def holders(self, i: int, viewer: str) -> str:
        """` (7 held by finetune-r50 at priority -100, ...)` for machine i, as `viewer` may see it."""
        hit = self._holders.get(i)
        if hit is None:
            items = sorted(
                ((h[2], run, h[0], h[1]) for run, h in self.cluster.holders[i].items() if h[2] > 0),
                key=lambda t: (-t[0], t[1]),
            )
            hit = (items, frozenset(t[2] for t in items[:3]), self._holders_text(items, ""))
            self._holders[i] = hit
        items, spaces, anonymous = hit
        if viewer not in spaces:
            return anonymous  # nobody of the viewer's workspace is named: one text for every such viewer
        k = (i, viewer)
        own = self._own.get(k)
        if own is None:
            own = self._own[k] = self._holders_text(items, viewer)
        return own

    @staticmethod
    def _holders_text(items: list, viewer: str) -> str:
        parts = [f"{g} held by {shown(run, ws, viewer)} at priority {p}" for g, run, ws, p in items[:3]]
        if len(items) > 3:
            parts.append(f"{sum(t[0] for t in items[3:])} held by {len(items) - 3} more")
        return f" ({', '.join(parts)})" if parts else ""

    def lines(self, u: Unstarted, allowed_key: int) -> dict[str, tuple[tuple[str, str], ...]]:
        out = {}
        run = u.run
        head = self.head
        head_shown = None
        if head is not None and head.name != run.name and u.view_b:
            head_shown = shown(head.name, head.workspace, run.workspace)
        for w in u.workers:
            s = shape(w)
            k = (s, allowed_key, u.view_b, u.quota, len(u.workers), u.avoid, head_shown)
            base = self._base.get(k)
            if base is None:
                base = self._base[k] = self._compute(run, s, u, head_shown)
            lines, named = base
            kv = (k, run.workspace)
            mine = self._lines.get(kv)
            if mine is None:
                # Lines are computed once with every holder unnamed; only machines where the viewer's own
                # workspace holds GPUs (among the first three holders) are redone with names.
                viewer = run.workspace
                patch = [(pos, prefix + self.holders(i, viewer)) for pos, i, prefix in named
                         if viewer in self._holders[i][1]]
                if patch:
                    lst = list(lines)
                    for pos, line in patch:
                        lst[pos] = (lst[pos][0], line)
                    mine = tuple(lst)
                else:
                    mine = lines
                self._lines[kv] = mine
            out[f"{run.name}-{w.index}"] = mine
        return out

    def _compute(self, run: WaitingRun, s: Shape, u: Unstarted, head_shown: str | None) -> tuple[tuple, list]:
        c = self.cluster
        g, cpu, mem = s
        excluded = dict(run.excluded_machines)
        selection = run.node_selection
        any_machine = selection.mode == "Any"
        named: list[tuple[int, int, str]] = []  # (position, machine, line without holders) of GPU shortage lines
        fits = self._fits_line(u)
        cap_g, cap_c, cap_m = c.cap_g, c.cap_c, c.cap_m
        free_g, free_c, free_m = self.free_gpus, c.free_c, c.free_m
        held = c.held
        out = []
        for i, name in enumerate(c.names):
            if not c.schedulable[i]:
                line = f"machine is not schedulable ({c.machines[i].unschedulable_reason})"
            elif excluded and name in excluded:
                line = excluded[name]
            elif not any_machine and not c.selected(selection, i):
                line = "not selected by node_selection"
            elif cap_g[i] < g:
                line = f"machine has {cap_g[i]} GPUs, {g} asked"
            elif cap_c[i] < cpu:
                line = f"machine has {number(cap_c[i])} CPU cores, {number(cpu)} asked"
            elif cap_m[i] < mem:
                line = f"machine has {gib(cap_m[i])} of memory, {gib(mem)} asked"
            elif u.quota is not None:
                line = f"namespace quota: {u.quota}"
            elif i in u.avoid:
                line = "another worker of this run is on this machine"
            elif free_g[i] < g:
                prefix = f"not enough free GPUs: {free_g[i]} free, {g} asked"
                line = prefix + self.holders(i, "")
                named.append((i, i, prefix))
            elif free_c[i] < cpu:
                line = f"not enough free CPU cores: {number(max(free_c[i], 0))} free, {number(cpu)} asked"
            elif free_m[i] < mem:
                line = f"not enough free memory: {gib(max(free_m[i], 0))} free, {gib(mem)} asked"
            elif head_shown is not None and i in held:
                bg, bc, bm = c.room(i, True)
                line = f"held for the head ({head_shown})" if bg < g or bc < cpu or bm < mem else fits
            else:
                line = fits
            out.append((name, line))
        return tuple(out), named

    @staticmethod
    def _fits_line(u: Unstarted) -> str:
        if len(u.workers) > 1:
            return f"room here, but not for all {len(u.workers)} workers of the run at once"
        return "room here, but the run waits its turn"
