"""A tiny stand-in scheduler for exercising the simulator's bookkeeping apart from the real policy.

Priority order (or FIFO), first fit, no backfill (strict head blocking), preemption of strictly lower
priority, most recently started first. It only places single-worker runs.
"""

from __future__ import annotations

from astraeus.scheduler.model import Placement, Plan, Snapshot, StartRun, StopUnit


def greedy_plan(snapshot: Snapshot, now: float) -> Plan:
    free = {m.name: set(range(m.gpus)) for m in snapshot.machines}
    for unit in snapshot.running:
        for w in unit.workers:
            free[w.machine].difference_update(w.gpu_indices)
    held = {u.preempted_for for u in snapshot.running if u.preempted_for}
    if snapshot.fifo:
        order = sorted(snapshot.waiting, key=lambda r: (r.submitted_at, r.name))
    else:
        order = sorted(snapshot.waiting, key=lambda r: (-r.priority, r.submitted_at, r.name))
    starts, stops = [], []
    for run in order:
        need = run.workers[0].gpus
        if run.name in held:
            break  # waiting for its victims to stop
        spot = next((m for m in snapshot.machines if len(free[m.name]) >= need), None)
        if spot is not None:
            idx = tuple(sorted(free[spot.name])[:need])
            free[spot.name].difference_update(idx)
            starts.append(StartRun(run.name, (Placement(0, spot.name, idx, 0.0, 0),)))
            continue
        if snapshot.preemption:
            for m in snapshot.machines:
                victims = sorted(
                    (u for u in snapshot.running if not u.stopping and u.priority < run.priority
                     and all(w.machine == m.name for w in u.workers)),
                    key=lambda u: (u.priority, -u.started_at),
                )
                room, chosen = len(free[m.name]), []
                for u in victims:
                    if room >= need:
                        break
                    chosen.append(u)
                    room += sum(len(w.gpu_indices) for w in u.workers)
                if room >= need and chosen:
                    for u in chosen:
                        stops.append(StopUnit(u.run, tuple(w.name for w in u.workers), run.name,
                                              f"Preempted by higher-priority work ({run.name})"))
                    break
        break  # the head blocks everything behind it
    return Plan(starts=tuple(starts), stops=tuple(stops))
