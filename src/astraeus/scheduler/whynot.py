"""Per-machine "Why it is not running yet" lines for waiting workers.

One line per machine for every waiting worker is the costliest output of a cycle (10k runs × 1,000 machines
would be 10M lines), so `Snapshot.why_not_limit` caps how many runs, in queue order, get them, and lines are
shared between workers that ask for the same thing under the same conditions.

On a cluster with more machines than `Snapshot.why_not_machines`, 10,000 lines per worker are useless to read and
costly to store, so they are grouped: the `EACH` machines the worker may use with the most free GPUs (the closest
to fitting; ties by name) keep their own line, holders named as on a small cluster; every other machine is counted
in one line per reason (its line less the holders), `("gpu-00012, gpu-00013 and 9,978 more machines", reason)`,
the reasons of the machines it may use first, each group where its first machine comes in that order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import compress, filterfalse, repeat
from operator import is_, itemgetter

from .cluster import Cluster, Shape, shape
from .model import WaitingRun
from .reasons import OTHER_NAMESPACE, gib, number, shown
from .topology import island_too_small, no_island_free


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


def quarantine_note(gpus: tuple[int, ...]) -> str:
    """`GPU 3 quarantined`, `GPUs 3, 5 quarantined`: the failed GPUs a machine's GPU line names (issue 47)."""
    return f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(str(g) for g in sorted(gpus))} quarantined"


@dataclass
class Unstarted:
    """A waiting run (or the workers of it still waiting) at the end of the cycle, as it was judged."""

    run: WaitingRun
    workers: tuple
    view_b: bool  # judged against the room left after the head's hold
    quota: str | None  # the quota detail when quota blocked it
    avoid: frozenset[int]  # machines holding another worker of the run


EACH = 20  # on a cluster past `Snapshot.why_not_machines`: the machines that keep a line each, per worker


_second = itemgetter(1)


def _interned(values: list) -> tuple[list, list[int]]:
    """(the distinct values in order, each value's position among them): a line made per distinct value is laid
    over the machines by list index, at C speed (no tuple hashed per machine and shape)."""
    distinct = list(dict.fromkeys(values))
    return distinct, list(map({v: k for k, v in enumerate(distinct)}.__getitem__, values))


class _Prefixes:
    """Per machine the line of a machine short of GPUs (holders left out), or None, read as a mapping of the machines
    that have one; given a template's lines (`open_`, None where a machine is open), of the open ones among them. A
    grouped cluster's: a list made at C speed, of which only the few machines shown are read."""

    __slots__ = ("lines", "open")

    def __init__(self, lines: list[str | None], open_: list[str | None] | None = None):
        self.lines = lines
        self.open = open_

    def __contains__(self, i: int) -> bool:
        return self.lines[i] is not None and (self.open is None or self.open[i] is None)

    def __getitem__(self, i: int) -> str:
        if i not in self:
            raise KeyError(i)
        return self.lines[i]

    def __setitem__(self, i: int, line: str) -> None:
        self.lines[i] = line

    def get(self, i: int, default: str | None = None) -> str | None:
        return self.lines[i] if i in self else default


def group_name(shown: list[str], count: int) -> str:
    """How a line of `count` grouped machines names them, from the first two: `gpu-1`, `gpu-1, gpu-2`,
    `gpu-1, gpu-2 and 9,978 more machines`."""
    if count <= 2:
        return ", ".join(shown)
    return f"{shown[0]}, {shown[1]} and {count - 2:,} more machines"


class WhyNot:
    """Lines are built in layers, each computed at most once per cycle: per machine (not schedulable), per worker
    shape (capacity short; free room short, with the holders of the GPUs; short of room held for the head),
    then per run what its selection, quota and other workers add. The cluster does not change any more."""

    def __init__(self, cluster: Cluster, head: WaitingRun | None, group_above: int | None = None,
                 from_template: bool = True):
        self.cluster = cluster
        self.head = head
        # Lines of restricted runs laid over the per-shape template; False: the machine-by-machine reference.
        self.from_template = from_template
        # Grouped lines (a cluster past `Snapshot.why_not_machines`): the free-room lines leave the holders out
        # (only the machines that keep a line of their own name them).
        self.grouped = group_above is not None and len(cluster.names) > group_above
        self._groups: dict[tuple, tuple[list[int], tuple]] = {}
        self._walk: list[int] | None = None
        self._orders: dict[tuple, tuple[list[int], tuple[int, ...]]] = {}
        self._getters: dict[tuple, object] = {}  # per `_orders` key: the lines of its machines not shown each
        self._allowed_sets: dict[int, frozenset[int] | None] | None = None
        self._base: dict[tuple, tuple[tuple, list]] = {}
        self._lines: dict[tuple, tuple[tuple[str, str], ...]] = {}
        self._holders: dict[int, tuple[list, frozenset[str], str]] = {}
        self._own: dict[tuple[int, str], str] = {}
        self._by_viewer: dict[str, list[int]] | None = None  # workspace -> machines where it is named
        self._caps: dict[Shape, list[str | None]] = {}
        self._sizes: tuple[list, list[int]] | None = None  # machines' sizes (GPUs, CPU cores, memory): `_interned`
        self._frees: dict[Shape, tuple[list[str | None], dict[int, str], frozenset[int]]] = {}
        self._templates: dict[tuple, tuple[list, list[int], dict[int, str]]] = {}
        self._overlays: dict[int, dict[int, str]] = {}  # allowed key -> the reasons of the machines kept from it
        self.free_gpus = [len(f) for f in cluster.free_g]
        self._unschedulable = [
            None if ok else f"machine is not schedulable ({m.unschedulable_reason})"
            for ok, m in zip(cluster.schedulable, cluster.machines, strict=True)
        ]
        self._unschedulable_idx = [i for i, ok in enumerate(cluster.schedulable) if not ok]
        self._states: tuple[list, list[int]] | None = None  # machines' free (GPUs, CPU cores, memory): `_interned`
        # machine -> its failed GPUs, named in its line when it is short of GPUs (a few machines at most)
        self._quarantined = {i: quarantine_note(m.quarantined_gpus) for i, m in enumerate(cluster.machines)
                             if m.quarantined_gpus}
        if cluster.fleet.any_mig:  # issue 46: its MIG GPUs are not among its GPUs for whole or fractional workers
            for i, m in enumerate(cluster.machines):
                mig = [g for g, ps in enumerate(m.gpu_mig) if ps]
                if mig:
                    note = f"GPU{'s' if len(mig) > 1 else ''} {', '.join(map(str, mig))} MIG"
                    self._quarantined[i] = f"{self._quarantined[i]}, {note}" if i in self._quarantined else note

    def _holder_items(self, i: int) -> tuple[list, frozenset[str], str, str]:
        """(the first three holders as (workspace, run, "<gpus> held by ", " at priority <p>"), their workspaces,
        the text with nobody named, the tail for the holders past three) for machine i."""
        hit = self._holders.get(i)
        if hit is None:
            # (-gpus, run, workspace, priority): run names are unique per machine, so this sorts as
            # (most GPUs first, then by run name) would.
            items = sorted([(-h[2], run, h[0], h[1]) for run, h in self.cluster.holders_of(i).items() if h[2] > 0])
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

    def _open_lines(self, s, u: Unstarted, head_shown: str | None) -> tuple[list, object, tuple]:
        """The shape's lines in view B, with the machines where it would fit saying why it still waits: the
        run's own reason, or that the room there is held for the head; and what the lines depend on (equal for
        equal lines: the grouped lines are made once per content, `_grouped_lines`)."""
        t, open_, named = self._template(s, True)
        out = list(t)
        names = self.cluster.names
        fits = self._fits_line(u)
        held_short = self._free_lines(s)[2] if head_shown is not None else ()
        held_line = f"held for the head ({head_shown})" if held_short else ""
        if self.grouped:  # lines alone (`_template`)
            if held_short:
                for i in open_:
                    out[i] = held_line if i in held_short else fits
            else:
                for i in open_:
                    out[i] = fits
        else:
            for i in open_:
                out[i] = (names[i], held_line if i in held_short else fits)
        return out, named, (("open", s, fits, head_shown) if open_ else ("open", s))

    def lines(self, u: Unstarted, allowed_key: int) -> dict[str, tuple[tuple[str, str], ...]]:
        out = {}
        run = u.run
        head = self.head
        head_shown = None
        if head is not None and head.name != run.name and u.view_b:
            head_shown = shown(head.name, head.workspace, run.workspace)
        for w in u.workers:
            if w.mig_count:  # issue 46: MIG devices, counted by profile (rare: a line per machine, made here)
                out[f"{run.name}-{w.index}"] = self._mig_lines(run, w, u, allowed_key)
                continue
            s = shape(w)
            k = (s, allowed_key, u.view_b, u.quota, len(u.workers), u.avoid, head_shown)
            base = self._base.get(k)
            if base is None:
                base = self._base[k] = self._compute(run, s, u, head_shown, allowed_key)
            lines, named = base[0], base[1]
            kv = (k, run.workspace)
            mine = self._lines.get(kv)
            if mine is None and self.grouped:
                # Grouped restricted lines come with their overlay, not laid yet.
                mine = self._lines[kv] = self._grouped_lines(k, lines, named, allowed_key, u.avoid, run.workspace,
                                                             base[2], base[3])
            elif mine is None:
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

    def _grouped_lines(self, k: tuple, lines: tuple, named: dict, allowed_key: int, avoid: frozenset[int],
                       viewer: str, over: dict[int, str] | None = None,
                       content: tuple | None = None) -> tuple[tuple[str, str], ...]:
        """The worker's lines on a big cluster: the machines closest to fitting each with its line (holders named
        as `viewer` may see them), then one line per reason for all other machines. `over`: the reason of each
        machine kept from the run, laid over `lines` (none of them keeps a line of its own). `content`: what
        `lines` depend on, when known: workers with equal lines share their groups (on a full cluster the keys
        that differ by view, quota or workers alone have the same lines)."""
        gk = k if content is None else (content, allowed_key, avoid)
        hit = self._groups.get(gk)
        if hit is None:
            hit = self._groups[gk] = self._group(lines, allowed_key, avoid, over)
        each, rest = hit
        names = self.cluster.names
        holders = self.holders
        return tuple([(names[i], named[i] + holders(i, viewer) if i in named else lines[i]) for i in each]) + rest

    def _order(self, allowed_key: int, avoid: frozenset[int]) -> tuple[list[int], tuple[int, ...]]:
        """(the `EACH` machines that keep a line, every other machine in the order its group is placed): the
        schedulable machines the worker may use by free GPUs (most first, ties by name), then the others."""
        k = (allowed_key, avoid)
        hit = self._orders.get(k)
        if hit is None:
            c = self.cluster
            if self._walk is None:
                c.tidy()
                walk = [i for b in reversed(c.buckets) for i in b]  # buckets hold the schedulable machines
                sched = c.schedulable
                walk.extend(i for i in range(len(c.names)) if not sched[i])
                self._walk = walk
                self._allowed_sets = {v[0]: v[1] for v in c._allowed_cache.values()}
            allowed = None if allowed_key < 0 else self._allowed_sets.get(allowed_key)
            walk = self._walk
            usable = walk[:len(c.all_schedulable)]  # the schedulable machines come first in the walk
            if allowed is not None:
                usable = list(filter(allowed.__contains__, usable))
            if avoid:
                usable = list(filterfalse(avoid.__contains__, usable))
            seen = set(usable)
            rest = usable[EACH:] + list(filterfalse(seen.__contains__, walk))
            hit = self._orders[k] = (usable[:EACH], tuple(rest))
        return hit

    def _group(self, lines: tuple, allowed_key: int, avoid: frozenset[int],
               over: dict[int, str] | None = None) -> tuple[list[int], tuple]:
        """(the `EACH` machines that keep a line, the grouped lines of all the others)."""
        each, rest = self._order(allowed_key, avoid)
        if not rest:
            return each, ()
        k = (allowed_key, avoid)
        get = self._getters.get(k)
        if get is None:
            get = self._getters[k] = itemgetter(*rest) if len(rest) > 1 else (lambda lines: (lines[rest[0]],))
        texts = list(get(lines))
        if over:
            texts = list(map(over.get, rest, texts))
        # A Counter keeps its reasons in the order they are first seen: each group where its first machine comes.
        out = []
        index = texts.index
        names = self.cluster.names
        for reason, count in Counter(texts).items():
            at = index(reason)
            shown = [names[rest[at]]]
            if count > 1:
                shown.append(names[rest[index(reason, at + 1)]])
            out.append((group_name(shown, count), reason))
        return each, tuple(out)

    def _cap_lines(self, s: Shape) -> list[str | None]:
        """Per machine: what its size lacks for one worker of shape s, or None."""
        hit = self._caps.get(s)
        if hit is None:
            if self._sizes is None:
                c = self.cluster
                self._sizes = _interned(list(zip(c.cap_g, c.cap_c, c.cap_m, strict=True)))
            sizes, size_of = self._sizes  # machines come in a few sizes: a line per size, laid over them
            hit = list(map([_size_short(s, *size) for size in sizes].__getitem__, size_of))
            for i, note in self._quarantined.items():  # `machine has 7 GPUs (GPU 3 quarantined), 8 asked`
                said = f"machine has {self.cluster.cap_g[i]} GPUs, "
                if hit[i] is not None and hit[i].startswith(said):
                    hit[i] = f"machine has {self.cluster.cap_g[i]} GPUs ({note}), " + hit[i][len(said):]
            f = self.cluster.fleet
            if f.any_islands and s[0] > 1:  # issue 46: a worker's GPUs lie in one NVLink island
                for i, isl in enumerate(f.islands):
                    if isl and hit[i] is None and f.island_cap[i] < s[0]:
                        hit[i] = island_too_small(f.island_cap[i], s[0])
            self._caps[s] = hit
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
        prefixes = [f"not enough free GPUs: {n} free, {g} asked" for n in range(max(int(-(-g // 1)), 0))]  # by free GPUs (0.5 asked: one line)
        holders = self.holders
        grouped = self.grouped
        if grouped:
            # No holders in these lines: a line per free room (GPUs, CPU cores, memory), of which machines have a
            # few, laid over the machines at C speed.
            if self._states is None:
                self._states = _interned(list(zip(self.free_gpus, c.free_c, c.free_m, strict=True)))
            states, state_of = self._states
            line: list[str | None] = []
            gpu_short: list[str | None] = []
            for fg, fc, fm in states:
                if fg < g:
                    short_line = prefixes[fg] if fg >= 0 else f"not enough free GPUs: {fg} free, {g} asked"
                    line.append(short_line)
                    gpu_short.append(short_line)
                    continue
                gpu_short.append(None)
                if fc < cpu:
                    line.append(f"not enough free CPU cores: {number(max(fc, 0))} free, {number(cpu)} asked")
                elif fm < mem:
                    line.append(f"not enough free memory: {gib(max(fm, 0))} free, {gib(mem)} asked")
                else:
                    line.append(None)
            out = list(map(line.__getitem__, state_of))
            prefix_of = list(map(gpu_short.__getitem__, state_of))
            for i, note in self._quarantined.items():
                if prefix_of[i] is not None:
                    fg = states[state_of[i]][0]
                    out[i] = prefix_of[i] = f"not enough free GPUs: {fg} free ({note}), {g} asked"
            for i in self._unschedulable_idx:
                out[i] = prefix_of[i] = None  # never asked: its line says it is not schedulable
            short = _Prefixes(prefix_of)
        else:
            for i, (fg, fc, fm) in enumerate(zip(self.free_gpus, c.free_c, c.free_m, strict=True)):
                if not sched[i]:
                    out.append(None)  # never asked: its line says it is not schedulable
                elif fg < g:
                    note = self._quarantined.get(i)
                    prefix = short[i] = (f"not enough free GPUs: {fg} free ({note}), {g} asked" if note else
                                         prefixes[fg] if fg >= 0 else f"not enough free GPUs: {fg} free, {g} asked")
                    out.append(prefix + holders(i, ""))
                elif fc < cpu:
                    out.append(f"not enough free CPU cores: {number(max(fc, 0))} free, {number(cpu)} asked")
                elif fm < mem:
                    out.append(f"not enough free memory: {gib(max(fm, 0))} free, {gib(mem)} asked")
                else:
                    out.append(None)
        if c.fleet.any_islands and g > 1:  # issue 46: enough free GPUs, but not in one NVLink island
            for i, isl in enumerate(c.fleet.islands):
                if isl and sched[i] and out[i] is None and not c.island_fits(i, g):
                    short[i] = no_island_free(g)
                    out[i] = short[i] if grouped else short[i] + holders(i, "")
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
        do not (on a grouped cluster the line alone: `_group` names the few machines it shows); the machines where
        it is None; the machines short of GPUs (line without holders)."""
        k = (s, free)
        hit = self._templates.get(k)
        if hit is not None:
            return hit
        names = self.cluster.names
        if not free:
            lines = self._cap_lines(s)
            if self._unschedulable_idx:
                lines = list(lines)
                unschedulable = self._unschedulable
                for i in self._unschedulable_idx:
                    lines[i] = unschedulable[i]
            t: list = lines if self.grouped else list(zip(names, lines, strict=True))  # None where open: the
            open_ = list(compress(range(len(lines)), map(is_, lines, repeat(None))))  # caller fills them in
            hit = (t, open_, {})
        else:
            t1, open1, _ = self._template(s, False)
            frees, short, _ = self._free_lines(s)
            lines1 = t1 if self.grouped else list(map(_second, t1))  # None where open
            # Each machine's line, or where it is None its free-room line, at C speed: a line found in `kept` is
            # kept, None is not found there and gives the free-room line.
            kept = {line: line for line in set(lines1) if line is not None}
            lines = list(map(kept.get, lines1, frees))
            t = lines if self.grouped else list(zip(names, lines, strict=True))  # None where open: filled in later
            open_ = list(compress(range(len(lines)), map(is_, lines, repeat(None))))
            named: dict[int, str] = {}
            if self.grouped:  # looked up for the few machines shown
                named = _Prefixes(short.lines, lines1)
            elif short:  # the machines short of GPUs have a free-room line: none of them is open
                gpus_short = list(filter(short.__contains__, open1))
                named = dict(zip(gpus_short, map(short.__getitem__, gpus_short), strict=True))
            hit = (t, open_, named)
        self._templates[k] = hit
        return hit

    def _compute(
        self, run: WaitingRun, s: Shape, u: Unstarted, head_shown: str | None, allowed_key: int
    ) -> tuple[tuple, dict, dict | None, tuple | None]:
        """(the lines, the machines short of GPUs (holders to name), on a grouped cluster the overlay of a
        restricted run not laid yet, what the lines depend on or None)."""
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
                if self.grouped:
                    for i in open_:
                        out[i] = quota
                else:
                    for i in open_:
                        out[i] = (names[i], quota)
                return tuple(out), named, None, (("quota", s, quota) if open_ else ("quota", s))
            out, named, content = self._open_lines(s, u, head_shown)
            return tuple(out), named, None, content
        chosen = c.selected_set(selection)
        if self.from_template and not excluded and quota is None and not avoid:
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
            out.append(line if self.grouped else (name, line))
        return tuple(out), named, None, None

    def _restricted(self, s: Shape, u: Unstarted, head_shown: str | None, allowed_key: int,
                    chosen: frozenset[int] | None, restricted: dict[int, str] | None) -> tuple:
        """`_compute`'s lines for a run whose selection, pools, GPU model or reservations keep it from some
        machines (and nothing else: no exclusions, quota or other workers): the machines' lines that do not
        depend on the run (the template), with the lines of the machines kept from it laid over them. The
        overlay is made once per allowed key."""
        over = self._overlays.get(allowed_key)
        if over is None:
            c = self.cluster
            over = {}
            if chosen is not None:
                over = dict.fromkeys(filterfalse(chosen.__contains__, c.all_schedulable), "not selected by node_selection")
            if restricted:
                idx = list(filterfalse(over.__contains__, filter(c.schedulable.__getitem__, restricted)))
                over.update(zip(idx, map(restricted.__getitem__, idx), strict=True))
            self._overlays[allowed_key] = over
        out, named_t, content = self._open_lines(s, u, head_shown)
        if self.grouped:
            # Grouped: only the machines the run may use (none laid over) keep a line; `_group` reads the reasons
            # of the others from the overlay (no (name, line) pair made for each of them). The overlay is the
            # allowed key's, which keys the groups too.
            return tuple(out), named_t, over, ("over", content)
        if not over:
            return tuple(out), named_t, None, None
        names = self.cluster.names
        for i, line in over.items():
            out[i] = (names[i], line)
        named = {i: p for i, p in named_t.items() if i not in over}
        return tuple(out), named, None, None

    def _mig_lines(self, run: WaitingRun, w, u: Unstarted, allowed_key: int) -> tuple[tuple[str, str], ...]:
        """A MIG worker's lines: per machine what keeps it (its state, the run's selection, quota), else how many
        devices of the profile it has and has free, else its CPU cores and memory; grouped by reason on a big
        cluster."""
        c = self.cluster
        excluded = dict(run.excluded_machines)
        chosen = None if run.node_selection.mode == "Any" else c.selected_set(run.node_selection)
        restricted = c.restricted.get(allowed_key) or {}
        quota = None if u.quota is None else f"namespace quota: {u.quota}"
        mig_of = c.fleet.mig_of
        profile, n = w.mig, w.mig_count
        out = []
        for i, name in enumerate(c.names):
            line = self._unschedulable[i]
            if line is not None:
                pass
            elif name in excluded:
                line = excluded[name]
            elif chosen is not None and i not in chosen:
                line = "not selected by node_selection"
            elif i in restricted:
                line = restricted[i]
            elif quota is not None:
                line = quota
            elif i in u.avoid:
                line = "another worker of this run is on this machine"
            else:
                has = len(mig_of[i].get(profile, ())) if mig_of else 0
                free = len(c.mig_free(i, profile))
                _, fc, fm = c.room(i, u.view_b)
                if has < n:
                    line = f"machine has {has} MIG {profile} devices, {n} asked"
                elif free < n:
                    line = f"not enough free MIG {profile} devices: {free} free, {n} asked"
                elif fc < w.cpu_cores:
                    line = f"not enough free CPU cores: {number(max(fc, 0))} free, {number(w.cpu_cores)} asked"
                elif fm < w.memory_bytes:
                    line = f"not enough free memory: {gib(max(fm, 0))} free, {gib(w.memory_bytes)} asked"
                else:
                    line = self._fits_line(u)
            out.append((name, line))
        if not self.grouped:
            return tuple(out)
        by: dict[str, list[str]] = {}
        for name, line in out:
            by.setdefault(line, []).append(name)
        return tuple((group_name(names[:2], len(names)), line) for line, names in by.items())

    @staticmethod
    def _fits_line(u: Unstarted) -> str:
        if len(u.workers) > 1:
            return f"room here, but not for all {len(u.workers)} workers of the run at once"
        return "room here, but the run waits its turn"
