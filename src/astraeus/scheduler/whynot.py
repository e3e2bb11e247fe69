"""Per-machine "Why it is not running yet" lines for waiting workers.

One line per machine for every waiting worker is the costliest output of a cycle (10k runs × 1,000 machines
would be 10M lines), so `Snapshot.why_not_limit` caps how many runs, in queue order, get them, and lines are
shared between workers that ask for the same thing under the same conditions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cluster, Shape, shape
from .model import WaitingRun
from .reasons import OTHER_NAMESPACE, gib, number, shown


def _size_short(s: Shape, gpus: int, cpu_cores: float, memory_bytes: int) -> str | None:
    """What a machine of this size lacks for one worker of shape s, or None."""
    g, cpu, mem = s
    if gpus < g:
        return f"machine has {gpus} GPUs, {g} asked"
    if cpu_cores < cpu:
        return f"machine has {number(cpu_cores)} CPU cores, {number(cpu)} asked"
    if memory_bytes < mem:
        return f"machine has {gib(memory_bytes)} of memory, {gib(mem)} asked"
    return None


@dataclass
class Unstarted:
    """A waiting run (or the workers of it still waiting) at the end of the cycle, as it was judged."""

    run: WaitingRun
    workers: tuple
    view_b: bool  # judged against the room left after the head's hold
    quota: str | None  # the quota detail when quota blocked it
    avoid: frozenset[int]  # machines holding another worker of the run


# Lines of restricted runs laid over the per-shape template (False in tests: the machine-by-machine reference).
FROM_TEMPLATE = True


class WhyNot:
    """Lines are built in layers, each computed at most once per cycle: per machine (not schedulable), per worker
    shape (capacity short; free room short, with the holders of the GPUs; short of room held for the head),
    then per run what its selection, quota and other workers add. The cluster does not change any more."""

    def __init__(self, cluster: Cluster, head: WaitingRun | None):
        self.cluster = cluster
        self.head = head
        self._base: dict[tuple, tuple[tuple, list]] = {}
        self._lines: dict[tuple, tuple[tuple[str, str], ...]] = {}
        self._holders: dict[int, tuple[list, frozenset[str], str]] = {}
        self._own: dict[tuple[int, str], str] = {}
        self._by_viewer: dict[str, list[int]] | None = None  # workspace -> machines where it is named
        self._caps: dict[Shape, list[str | None]] = {}
        self._frees: dict[Shape, tuple[list[str | None], dict[int, str], frozenset[int]]] = {}
        self._templates: dict[tuple, tuple[list, list[int], dict[int, str]]] = {}
        self._overlays: dict[int, dict[int, tuple[str, str]]] = {}  # allowed key -> lines of machines kept from it
        self.free_gpus = [len(f) for f in cluster.free_g]
        self._unschedulable = [
            None if ok else f"machine is not schedulable ({m.unschedulable_reason})"
            for ok, m in zip(cluster.schedulable, cluster.machines, strict=True)
        ]

    def _holder_items(self, i: int) -> tuple[list, frozenset[str], str, str]:
        """(the first three holders as (workspace, run, "<gpus> held by ", " at priority <p>"), their workspaces,
        the text with nobody named, the tail for the holders past three) for machine i."""
        hit = self._holders.get(i)
        if hit is None:
            # (-gpus, run, workspace, priority): run names are unique per machine, so this sorts as
            # (most GPUs first, then by run name) would.
            items = sorted([(-h[2], run, h[0], h[1]) for run, h in self.cluster.holders[i].items() if h[2] > 0])
            top = [(ws, run, f"{-g} held by ", f" at priority {p}") for g, run, ws, p in items[:3]]
            tail = f", {-sum([t[0] for t in items[3:]])} held by {len(items) - 3} more" if len(items) > 3 else ""
            hit = (top, frozenset([t[0] for t in top]), self._holders_text(top, tail, ""), tail)
            self._holders[i] = hit
        return hit

    def holders(self, i: int, viewer: str) -> str:
        """` (7 held by finetune-r50 at priority -100, ...)` for machine i, as `viewer` may see it."""
        top, spaces, anonymous, tail = self._holder_items(i)
        if viewer not in spaces:
            return anonymous  # nobody of the viewer's workspace is named: one text for every such viewer
        k = (i, viewer)
        own = self._own.get(k)
        if own is None:
            own = self._own[k] = self._holders_text(top, tail, viewer)
        return own

    @staticmethod
    def _holders_text(top: list, tail: str, viewer: str) -> str:
        if not top:
            return ""
        parts = [held + (run if ws == viewer else OTHER_NAMESPACE) + prio for ws, run, held, prio in top]
        return f" ({', '.join(parts)}{tail})"

    def _named_in(self, viewer: str) -> list[int]:
        """Machines (in order) where `viewer`'s workspace is among the holders named."""
        if self._by_viewer is None:
            by: dict[str, list[int]] = {}
            for i in range(len(self.cluster.names)):
                for ws in self._holder_items(i)[1]:
                    by.setdefault(ws, []).append(i)
            self._by_viewer = by
        return self._by_viewer.get(viewer, [])

    def _open_lines(self, s, u: Unstarted, head_shown: str | None) -> tuple[list, object]:
        """The shape's lines in view B, with the machines where it would fit saying why it still waits: the
        run's own reason, or that the room there is held for the head."""
        t, open_, named = self._template(s, True)
        out = list(t)
        names = self.cluster.names
        fits = self._fits_line(u)
        if head_shown is None:
            for i in open_:
                out[i] = (names[i], fits)
        else:
            held_short = self._free_lines(s)[2]
            held_line = f"held for the head ({head_shown})"
            for i in open_:
                out[i] = (names[i], held_line if i in held_short else fits)
        return out, named

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
                base = self._base[k] = self._compute(run, s, u, head_shown, allowed_key)
            lines, named = base
            kv = (k, run.workspace)
            mine = self._lines.get(kv)
            if mine is None:
                # Lines are computed once with every holder unnamed; only machines where the viewer's own
                # workspace holds GPUs (among the first three holders) are redone with names.
                viewer = run.workspace
                patch = []
                if named:
                    patch = [(i, named[i] + self.holders(i, viewer)) for i in self._named_in(viewer) if i in named]
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

    def _cap_lines(self, s: Shape) -> list[str | None]:
        """Per machine: what its size lacks for one worker of shape s, or None."""
        hit = self._caps.get(s)
        if hit is None:
            c = self.cluster
            hit = self._caps[s] = [_size_short(s, *size) for size in zip(c.cap_g, c.cap_c, c.cap_m, strict=True)]
        return hit

    def _free_lines(self, s: Shape) -> tuple[list[str | None], dict[int, str], frozenset[int]]:
        """Per machine: what its free room lacks for shape s (holders unnamed), or None; the machines short of
        GPUs with the line less its holders; the held machines whose room less the hold is short."""
        hit = self._frees.get(s)
        if hit is not None:
            return hit
        c = self.cluster
        g, cpu, mem = s
        out: list[str | None] = []
        short: dict[int, str] = {}
        sched = c.schedulable
        prefixes = [f"not enough free GPUs: {n} free, {g} asked" for n in range(max(g, 0))]  # by free GPUs
        holders = self.holders
        for i, (fg, fc, fm) in enumerate(zip(self.free_gpus, c.free_c, c.free_m, strict=True)):
            if not sched[i]:
                out.append(None)  # never asked: its line says it is not schedulable
            elif fg < g:
                prefix = short[i] = prefixes[fg] if fg >= 0 else f"not enough free GPUs: {fg} free, {g} asked"
                out.append(prefix + holders(i, ""))
            elif fc < cpu:
                out.append(f"not enough free CPU cores: {number(max(fc, 0))} free, {number(cpu)} asked")
            elif fm < mem:
                out.append(f"not enough free memory: {gib(max(fm, 0))} free, {gib(mem)} asked")
            else:
                out.append(None)
        held_short = []
        for i in c.held:
            bg, bc, bm = c.room(i, True)
            if bg < g or bc < cpu or bm < mem:
                held_short.append(i)
        hit = self._frees[s] = (out, short, frozenset(held_short))
        return hit

    def _template(self, s: Shape, free: bool) -> tuple[list, list[int], dict[int, str]]:
        """For a run that may use every machine, with no other worker placed: per machine (name, line) as far as
        the machine's state and size (free=False) or also its free room (free=True) decide it, None where they
        do not; the machines where it is None; the machines short of GPUs (line without holders)."""
        k = (s, free)
        hit = self._templates.get(k)
        if hit is not None:
            return hit
        if not free:
            caps = self._cap_lines(s)
            t: list = []
            open_: list[int] = []
            for i, (name, line) in enumerate(zip(self.cluster.names, self._unschedulable, strict=True)):
                if line is None:
                    line = caps[i]
                    if line is None:
                        open_.append(i)
                        t.append(None)  # filled in by the caller
                        continue
                t.append((name, line))
            hit = (t, open_, {})
        else:
            t1, open1, _ = self._template(s, False)
            frees, short, _ = self._free_lines(s)
            names = self.cluster.names
            t = list(t1)
            open_ = []
            named: dict[int, str] = {}
            for i in open1:
                line = frees[i]
                if line is None:
                    open_.append(i)
                else:
                    t[i] = (names[i], line)
                    prefix = short.get(i)
                    if prefix is not None:
                        named[i] = prefix
            hit = (t, open_, named)
        self._templates[k] = hit
        return hit

    def _compute(
        self, run: WaitingRun, s: Shape, u: Unstarted, head_shown: str | None, allowed_key: int
    ) -> tuple[tuple, dict]:
        c = self.cluster
        excluded = dict(run.excluded_machines)
        selection = run.node_selection
        any_machine = selection.mode == "Any"
        # Pools, the GPU model and reservations: the line of each machine they keep from the run.
        restricted = c.restricted.get(allowed_key)
        avoid = u.avoid
        quota = None if u.quota is None else f"namespace quota: {u.quota}"
        if any_machine and not excluded and not restricted and (quota is not None or not avoid):
            names = c.names
            if quota is not None:
                t, open_, named = self._template(s, False)
                out = list(t)
                for i in open_:
                    out[i] = (names[i], quota)
                return tuple(out), named
            out, named = self._open_lines(s, u, head_shown)
            return tuple(out), named
        chosen = c.selected_set(selection)
        if FROM_TEMPLATE and not excluded and quota is None and not avoid:
            return self._restricted(s, u, head_shown, allowed_key, None if any_machine else chosen, restricted)
        named = {}  # machine (= position) -> GPU shortage line without holders
        caps = self._cap_lines(s)
        unschedulable = self._unschedulable
        frees = None
        out = []
        for i, name in enumerate(c.names):
            line = unschedulable[i]
            if line is not None:
                pass
            elif excluded and name in excluded:
                line = excluded[name]
            elif not any_machine and i not in chosen:
                line = "not selected by node_selection"
            elif restricted and i in restricted:
                line = restricted[i]
            elif (line := caps[i]) is not None:
                pass
            elif quota is not None:
                line = quota
            elif i in avoid:
                line = "another worker of this run is on this machine"
            else:
                if frees is None:
                    frees, short, held_short = self._free_lines(s)
                    fits = self._fits_line(u)
                line = frees[i]
                if line is not None:
                    prefix = short.get(i)
                    if prefix is not None:
                        named[i] = prefix
                elif head_shown is not None and i in held_short:
                    line = f"held for the head ({head_shown})"
                else:
                    line = fits
            out.append((name, line))
        return tuple(out), named

    def _restricted(self, s: Shape, u: Unstarted, head_shown: str | None, allowed_key: int,
                    chosen: frozenset[int] | None, restricted: dict[int, str] | None) -> tuple[tuple, dict]:
        """`_compute`'s lines for a run whose selection, pools, GPU model or reservations keep it from some
        machines (and nothing else: no exclusions, quota or other workers): the machines' lines that do not
        depend on the run (the template), with the lines of the machines kept from it laid over them. The
        overlay is made once per allowed key."""
        over = self._overlays.get(allowed_key)
        if over is None:
            c = self.cluster
            names = c.names
            over = {}
            if chosen is not None:
                for i in c.all_schedulable:
                    if i not in chosen:
                        over[i] = (names[i], "not selected by node_selection")
            if restricted:
                sched = c.schedulable
                for i, line in restricted.items():
                    if sched[i] and i not in over:
                        over[i] = (names[i], line)
            self._overlays[allowed_key] = over
        out, named_t = self._open_lines(s, u, head_shown)
        for i, entry in over.items():
            out[i] = entry
        named = {i: p for i, p in named_t.items() if i not in over} if over else named_t
        return tuple(out), named

    @staticmethod
    def _fits_line(u: Unstarted) -> str:
        if len(u.workers) > 1:
            return f"room here, but not for all {len(u.workers)} workers of the run at once"
        return "room here, but the run waits its turn"
