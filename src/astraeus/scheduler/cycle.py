"""One scheduling cycle: `plan(snapshot, now) -> Plan`. Pure: no I/O, no clock, no randomness.

Phases:
  1. Room: build the cluster's free room from machines and running work (`Cluster`).
  2. Order: walk the queue lazily in priority → fair share → submission order (`queue_order`).
  3. For each run: can it ever run here? is it within quota? does it fit now? Start it if so.
  4. The first run that cannot start now but could here is the head: free room held for it by stopping work
     preempted for it, or new victims (`choose_victims`), or its shadow time (`shadow`). Its room is held.
  5. Runs behind the head start only in room the head does not need, or anywhere if their time limit ends
     them by the shadow time (backfill); the rest are queued behind it.
  6. Reasons for every run left waiting, and per-machine "why not" lines for the first ones.
"""

from __future__ import annotations

from collections import defaultdict

from . import reasons as R
from .cluster import Cluster
from .head import HeadFit, choose_victims, shadow, unit_grace
from .model import Placement, Plan, QuotaReached, Snapshot, StartRun, StopUnit, WaitingRun, Workspace
from .queue import Usage, queue_order
from .whynot import Unstarted, WhyNot

_UNSET = object()
_EMPTY: frozenset[int] = frozenset()

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
            if limit is not None and u + a > limit:
                found = R.quota_in_use(word, fmt, u, a, limit), False
                break
    if found is None:
        return None
    detail, alone = found
    reason = R.waits_beyond_quota(detail) if alone else R.waits_for_quota(detail)
    return detail, alone, reason, R.quota_reached(detail)


def _by_worker_index(p: Placement) -> int:
    return p.worker_index


def plan(snapshot: Snapshot, now: float) -> Plan:
    # 1. Room.
    cluster = Cluster(snapshot)
    workspaces = {ws.id: ws for ws in snapshot.workspaces}
    usage: dict[str, Usage] = defaultdict(Usage)
    run_machines: dict[str, set[int]] = defaultdict(set)  # machines holding workers of a run now
    index_get = cluster.index.get
    for u in snapshot.running:
        use = usage[u.workspace]
        for w in u.workers:
            use.add(len(w.gpu_indices), w.cpu_cores, w.memory_bytes, 1)
            i = index_get(w.machine)
            if i is not None:
                run_machines[u.run].add(i)

    starts: list[StartRun] = []
    stops: list[StopUnit] = []
    reasons: dict[str, str] = {}
    quota_notes: list[QuotaReached] = []
    unstarted: list[tuple[Unstarted, int]] = []
    limit = snapshot.why_not_limit
    keep = len(snapshot.waiting) if limit is None else max(limit, 0)  # runs left waiting that get why-not lines
    head: WaitingRun | None = None
    shadow_time: float | None = None
    failed: set[tuple] = set()  # placements known not to fit: free room only shrinks within a cycle
    never: dict[tuple, str | None] = {}
    never_reason: dict[str, str] = {}
    quota_specs = {ws_id: _quota_spec(ws) for ws_id, ws in workspaces.items()}
    # Per workspace with a quota: group shapes -> _quota_check's answer at the workspace's usage now; cleared
    # whenever that usage changes (same ask, same usage: same answer).
    quota_seen: dict[str, dict] = {ws_id: {} for ws_id, spec in quota_specs.items() if spec is not None}
    queued_behind: dict[str, str] = {}  # the reason behind the head, per workspace of the waiting run
    backfill = snapshot.backfill
    place, commit = cluster.place, cluster.commit

    # 2. Order, 3. start what fits.
    for run in queue_order(snapshot, usage, workspaces):
        workers = run.workers
        if not workers:
            continue
        name = run.name
        if run.node_selection.mode == "Any" and not run.excluded_machines:
            allowed_key, allowed, allowed_list = -1, None, None  # every schedulable machine
        else:
            allowed_key, allowed, allowed_list = cluster.allowed(run)
        n = len(workers)
        if n == 1:
            w0 = workers[0]
            ordered = shapes = (w0.gpus, w0.cpu_cores, w0.memory_bytes)  # one worker: its shape, not a 1-tuple
        else:
            ordered = tuple([(w.gpus, w.cpu_cores, w.memory_bytes) for w in workers])
            shapes = tuple(sorted(ordered))
        nk = (shapes, allowed_key)
        why = never.get(nk, _UNSET)
        if why is _UNSET:
            why = never[nk] = cluster.never_fits(run, workers, allowed_list)
        rm = run_machines.get(name)
        avoid = frozenset(rm) if rm else _EMPTY
        if why is not None:
            text = never_reason.get(why)
            if text is None:
                text = never_reason[why] = R.cannot_run(why)
            reasons[name] = text
            if len(unstarted) < keep:
                unstarted.append((Unstarted(run, workers, False, None, avoid), allowed_key))
            continue
        ws_id = run.workspace
        seen = quota_seen.get(ws_id)
        use = usage[ws_id]
        # Behind the head a run may use the head's room only if its time limit ends it by the shadow time.
        if head is None:
            ends_before = view_b = False
        else:
            tl = run.time_limit_seconds
            ends_before = shadow_time is not None and tl is not None and now + tl <= shadow_time
            view_b = not ends_before
        if n == 1 or run.start == "Gang":
            # One group, the whole run: placed all at once or not at all.
            quota = None
            if seen is not None:
                quota = seen.get(ordered, _UNSET)
                if quota is _UNSET:
                    quota = seen[ordered] = _quota_check(quota_specs[ws_id], use, workers)
            if quota is not None or (head is not None and not backfill):
                chosen = None  # over quota; or backfill off: nothing behind the head starts
            else:
                fk = (shapes, allowed_key, avoid, view_b)
                if fk in failed:
                    chosen = None
                else:
                    chosen = place(workers, allowed, allowed_list, avoid, view_b)
                    if chosen is None:
                        failed.add(fk)
            if chosen is not None:
                placed = commit(name, ws_id, run.priority, chosen, ends_before)  # in worker order
                for w, _ in chosen:
                    use.add(w.gpus, w.cpu_cores, w.memory_bytes, 1)
                if seen is not None:
                    seen.clear()
                starts.append(StartRun(name, placed, head is not None))
                continue
            waiting: tuple | list = workers
        else:
            # Independent workers: each one on its own.
            placements: list = []
            waiting = []
            quota = None
            for k, w in enumerate(workers):
                s = ordered[k]
                if seen is not None:
                    q = seen.get(s, _UNSET)
                    if q is _UNSET:
                        q = seen[s] = _quota_check(quota_specs[ws_id], use, (w,))
                    if q is not None:
                        quota = q
                        waiting.extend(workers[k:])
                        break
                if head is not None and not backfill:
                    chosen = None  # backfill off: nothing behind the head starts
                else:
                    fk = (s, allowed_key, avoid, view_b)
                    if fk in failed:
                        chosen = None
                    else:
                        chosen = place((w,), allowed, allowed_list, avoid, view_b)
                        if chosen is None:
                            failed.add(fk)
                if chosen is None:
                    waiting.append(w)
                    continue
                placements.extend(commit(name, ws_id, run.priority, chosen, ends_before))
                for cw, i in chosen:
                    use.add(cw.gpus, cw.cpu_cores, cw.memory_bytes, 1)
                    avoid = avoid | {i}
                if seen is not None:
                    seen.clear()
            if placements:
                if len(placements) > 1:
                    placements.sort(key=_by_worker_index)
                starts.append(StartRun(name, tuple(placements), head is not None))
            if not waiting:
                continue
        if quota is not None:
            reasons[name] = quota[2]
            if not run.quota_noted:
                quota_notes.append(QuotaReached(name, ws_id, quota[3]))
            if len(unstarted) < keep:
                unstarted.append((Unstarted(run, tuple(waiting), view_b, quota[0], avoid), allowed_key))
            continue
        if len(unstarted) < keep:
            unstarted.append((Unstarted(run, tuple(waiting), view_b, None, avoid), allowed_key))
        if head is not None:
            behind = queued_behind.get(ws_id)
            if behind is None:
                behind = R.queued_behind(R.shown(head.name, head.workspace, ws_id), shadow_time)
                queued_behind[ws_id] = behind
            reasons[name] = behind
            continue
        # 4. The head.
        head = run
        shadow_time, reasons[name], new_stops = _settle_head(
            snapshot, cluster, run, tuple(waiting), allowed_list, avoid, now
        )
        stops.extend(new_stops)

    # 6. Why not, for the first runs left waiting.
    why_not: dict[str, tuple[tuple[str, str], ...]] = {}
    if unstarted:
        explain = WhyNot(cluster, head)
        for u, allowed_key in unstarted:
            why_not.update(explain.lines(u, allowed_key))

    return Plan(
        starts=tuple(starts),
        stops=tuple(stops),
        reasons=reasons,
        why_not=why_not,
        head=head.name if head is not None else None,
        shadow_time=shadow_time,
        quota_reached=tuple(quota_notes),
    )


def _settle_head(
    snapshot: Snapshot, cluster: Cluster, head: WaitingRun, workers, allowed_list, avoid, now: float
) -> tuple[float | None, str, list[StopUnit]]:
    """Free or find room for the head and hold it. Returns (shadow time, the head's reason, stops)."""
    machines = [i for i in (cluster.all_schedulable if allowed_list is None else allowed_list) if i not in avoid]
    fit = HeadFit(cluster, workers, machines)
    running = snapshot.running

    # Work already stopping for the head: its room is the head's; no new victims if it suffices.
    for_head = [u for u in running if u.stopping and u.preempted_for == head.name]
    for u in for_head:
        fit.add(u)
    if for_head:
        chosen = fit.placement()
        if chosen is not None:
            cluster.held = fit.holds(chosen)
            t = now + max(unit_grace(cluster, u) for u in for_head)
            n = sum(len(u.workers) for u in for_head)
            return t, R.head_waiting_for_victims(n), []

    if snapshot.preemption:
        found = choose_victims(fit, head.priority, running)
        if found is not None:
            victims, chosen = found
            cluster.held = fit.holds(chosen)
            t = now + max(unit_grace(cluster, u) for u in victims + for_head)
            stops = [
                StopUnit(
                    run=u.run,
                    workers=tuple(w.name for w in u.workers),
                    preempted_by=head.name,
                    reason=R.preempted_by(R.shown(head.name, head.workspace, u.workspace)),
                )
                for u in victims
            ]
            n = sum(len(u.workers) for u in victims)
            first = victims[0]
            return t, R.head_preempting(n, R.shown(first.run, first.workspace, head.workspace)), stops

    for u in for_head:
        fit.add(u, -1)  # `shadow` counts all stopping work itself
    t, held = shadow(cluster, fit, running, now)
    cluster.held = held
    return t, R.head_next(head.priority, t), []
