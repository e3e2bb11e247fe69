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
from .model import Plan, QuotaReached, Snapshot, StartRun, StopUnit, WaitingRun, Workspace
from .queue import Usage, queue_order
from .whynot import Unstarted, WhyNot


def _quota_check(ws: Workspace | None, usage: Usage, workers) -> tuple[str, bool] | None:
    """(detail, alone) for the first quota resource the workers would exceed, or None."""
    if ws is None or ws.quota is None:
        return None
    asked = {
        "gpus": sum(w.gpus for w in workers),
        "cpu_cores": sum(w.cpu_cores for w in workers),
        "memory_bytes": sum(w.memory_bytes for w in workers),
        "workers": len(workers),
    }
    for field, word, fmt in R.QUOTA_RESOURCES:
        limit = getattr(ws.quota, field)
        if limit is not None and asked[field] > limit:
            return R.quota_alone(word, fmt, asked[field], limit), True
    for field, word, fmt in R.QUOTA_RESOURCES:
        limit = getattr(ws.quota, field)
        in_use = getattr(usage, field)
        if limit is not None and in_use + asked[field] > limit:
            return R.quota_in_use(word, fmt, in_use, asked[field], limit), False
    return None


def plan(snapshot: Snapshot, now: float) -> Plan:
    # 1. Room.
    cluster = Cluster(snapshot)
    workspaces = {ws.id: ws for ws in snapshot.workspaces}
    usage: dict[str, Usage] = defaultdict(Usage)
    run_machines: dict[str, set[int]] = defaultdict(set)  # machines holding workers of a run now
    for u in snapshot.running:
        use = usage[u.workspace]
        for w in u.workers:
            use.add(len(w.gpu_indices), w.cpu_cores, w.memory_bytes, 1)
            i = cluster.index.get(w.machine)
            if i is not None:
                run_machines[u.run].add(i)

    starts: list[StartRun] = []
    stops: list[StopUnit] = []
    reasons: dict[str, str] = {}
    quota_notes: list[QuotaReached] = []
    unstarted: list[tuple[Unstarted, int]] = []
    head: WaitingRun | None = None
    shadow_time: float | None = None
    failed: set[tuple] = set()  # placements known not to fit: free room only shrinks within a cycle
    never: dict[tuple, str | None] = {}
    quota_seen: dict[tuple, tuple[str, bool] | None] = {}  # same ask, same usage: same answer
    queued_behind: dict[str, str] = {}  # the reason behind the head, per workspace of the waiting run

    def try_place(run, workers, allowed_key, allowed, allowed_list, avoid, view_b):
        if len(workers) == 1:
            w = workers[0]
            shapes: tuple = (w.gpus, w.cpu_cores, w.memory_bytes)
        else:
            shapes = tuple(sorted((w.gpus, w.cpu_cores, w.memory_bytes) for w in workers))
        k = (shapes, allowed_key, avoid, view_b)
        if k in failed:
            return None
        chosen = cluster.place(workers, allowed, allowed_list, avoid, view_b)
        if chosen is None:
            failed.add(k)
        return chosen

    # 2. Order, 3. start what fits.
    for run in queue_order(snapshot, usage, workspaces):
        workers = run.workers
        if not workers:
            continue
        if run.node_selection.mode == "Any" and not run.excluded_machines:
            allowed_key, allowed, allowed_list = -1, None, None  # every schedulable machine
        else:
            allowed_key, allowed, allowed_list = cluster.allowed(run)
        if len(workers) == 1:
            w0 = workers[0]
            nk: tuple = (w0.gpus, w0.cpu_cores, w0.memory_bytes, allowed_key)
        else:
            nk = (tuple(sorted((w.gpus, w.cpu_cores, w.memory_bytes) for w in workers)), allowed_key)
        if nk not in never:
            never[nk] = cluster.never_fits(run, workers, allowed_list)
        why = never[nk]
        avoid = frozenset(run_machines.get(run.name, ()))
        if why is not None:
            reasons[run.name] = R.cannot_run(why)
            unstarted.append((Unstarted(run, workers, False, None, avoid), allowed_key))
            continue
        ws = workspaces.get(run.workspace)
        use = usage[run.workspace]
        # Behind the head a run may use the head's room only if its time limit ends it by the shadow time.
        ends_before = (
            head is not None
            and shadow_time is not None
            and run.time_limit_seconds is not None
            and now + run.time_limit_seconds <= shadow_time
        )
        view_b = head is not None and not ends_before
        groups = [workers] if run.start == "Gang" or len(workers) == 1 else [(w,) for w in workers]
        placements = []
        waiting: list = []
        quota = None
        for gi, group in enumerate(groups):
            q = None
            if ws is not None and ws.quota is not None:
                qk = (run.workspace, use.gpus, use.cpu_cores, use.memory_bytes, use.workers,
                      tuple((w.gpus, w.cpu_cores, w.memory_bytes) for w in group))
                if qk in quota_seen:
                    q = quota_seen[qk]
                else:
                    q = quota_seen[qk] = _quota_check(ws, use, group)
            if q is not None:
                quota = q
                for rest in groups[gi:]:
                    waiting.extend(rest)
                break
            if head is not None and not snapshot.backfill:
                chosen = None  # backfill off: nothing behind the head starts
            else:
                chosen = try_place(run, group, allowed_key, allowed, allowed_list, avoid, view_b)
            if chosen is None:
                waiting.extend(group)
                continue
            placements.extend(cluster.commit(run.name, run.workspace, run.priority, chosen, ends_before))
            for w, i in chosen:
                use.add(w.gpus, w.cpu_cores, w.memory_bytes, 1)
                avoid = avoid | {i}
        if placements:
            placements.sort(key=lambda p: p.worker_index)
            starts.append(StartRun(run.name, tuple(placements), backfilled=head is not None))
        if not waiting:
            continue
        waiting_t = tuple(waiting)
        if quota is not None:
            detail, alone = quota
            reasons[run.name] = R.waits_beyond_quota(detail) if alone else R.waits_for_quota(detail)
            if not run.quota_noted:
                quota_notes.append(QuotaReached(run.name, run.workspace, R.quota_reached(detail)))
            unstarted.append((Unstarted(run, waiting_t, view_b, detail, avoid), allowed_key))
            continue
        unstarted.append((Unstarted(run, waiting_t, view_b, None, avoid), allowed_key))
        if head is not None:
            behind = queued_behind.get(run.workspace)
            if behind is None:
                behind = R.queued_behind(R.shown(head.name, head.workspace, run.workspace), shadow_time)
                queued_behind[run.workspace] = behind
            reasons[run.name] = behind
            continue
        # 4. The head.
        head = run
        shadow_time, reasons[run.name], new_stops = _settle_head(
            snapshot, cluster, run, waiting_t, allowed_list, avoid, now
        )
        stops.extend(new_stops)

    # 6. Why not, for the first runs left waiting.
    why_not: dict[str, tuple[tuple[str, str], ...]] = {}
    limit = snapshot.why_not_limit
    if limit is None or limit > 0:
        explain = WhyNot(cluster, head)
        for u, allowed_key in unstarted if limit is None else unstarted[:limit]:
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
