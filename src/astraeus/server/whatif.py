"""What-if: `POST $API/runs?dry_run=true` answers what a run would do if it were submitted now, and stores nothing.

The run is submitted inside the request's transaction exactly as POST /runs submits it (so every refusal is the
submit's own: same status, code and message), the cluster's snapshot is read with the new run in it, the same
`plan()` the scheduling loop calls plans it, and `scheduler.answer` reads what the plan does with the run. Then the
transaction is rolled back: no run, worker, event or history row is written, and the scheduler is not woken.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from astraeus import scheduler as sched
from astraeus.scheduler.reasons import utc_minute
from astraeus.server import loop, submits
from astraeus.server.db import Cluster
from astraeus.server.services import Caller
from astraeus.server.state_lock import STATE_LOCK, lock_state


def what_if(session: Session, caller: Caller, body: Any, at: float) -> dict:
    """The answer for `body` as if POSTed to $API/runs at `at`; raises the submit's ApiError/InvalidBody. The
    session's transaction is rolled back whatever happens (it holds the state lock meanwhile, as a submit does, so
    the snapshot is the state a submit would have met)."""
    with STATE_LOCK:
        try:
            lock_state(session)
            run = submits.submit_run_body(session, caller, body, at)
            cluster = session.get(Cluster, run.cluster_id)
            snap, lookups = loop.build_snapshot(session, cluster, at)
            key = next((k for k, rid in lookups.runs.items() if rid == run.id), run.name)
            plan = sched.plan(snap, at)
            if any(r.name == key for r in snap.waiting):
                answer = sched.answer(plan, snap, key, at)
            else:  # not offered to the scheduler (cannot happen for a new run; kept as a plain answer)
                answer = sched.WhatIf("Waits", plan.reasons.get(key, ""))
            return view(answer, run.name, cluster.name, lookups.shown)
        finally:
            session.rollback()


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpus_text(p: sched.Placement) -> str:
    return f"{p.machine} (GPUs {','.join(str(i) for i in p.gpu_indices)})" if p.gpu_indices else p.machine


def view(a: sched.WhatIf, name: str, cluster: str, text: Callable[[str], str] = str) -> dict:
    """The JSON of a what-if answer; `text`: the snapshot's keys back to the names the workspace knows
    (loop.Lookups.shown, as the loop's apply step shows them)."""

    reason = text(a.reason)
    placements = [{"worker": f"{name}-{p.worker_index}", "machine": p.machine, "gpu_indices": list(p.gpu_indices),
                   **({"gpu_fraction": p.gpu_milli / 1000} if getattr(p, "gpu_milli", 0) else {})}
                  for p in a.placements]
    victims = [text(v) for v in a.victims]
    behind = text(a.behind) if a.behind is not None else None
    if a.outcome == "Starts":
        message = "Starts now on " + ", ".join(gpus_text(p) for p in a.placements)
    elif a.outcome == "Preempts":
        when = f" and start by {utc_minute(a.starts_by)}" if a.starts_by is not None else ""
        message = f"Would preempt {a.preempts_workers} worker(s) ({', '.join(victims)}){when}"
        if a.losses:  # least-work-lost (docs/progress.md): what each victim of its own namespace loses
            message += "; " + "; ".join(f"{text(r)} {words}" for r, words in a.losses)
    elif a.outcome == "Head":
        message = ("Would be next to run: starts by " + utc_minute(a.starts_by) if a.starts_by is not None
                   else "Would be next to run: waits for running work to end")
    elif a.outcome == "Queued":
        message = f"Would wait behind {behind}" + (f", which starts by {utc_minute(a.starts_by)}"
                                                    if a.starts_by is not None else "")
    else:
        message = reason
    return {
        "dry_run": True,
        "name": name,
        "cluster": cluster,
        "outcome": a.outcome,
        "message": message,
        "reason": reason,
        "placements": placements,
        "backfilled": a.backfilled,
        "preempts": victims,
        "preempts_workers": a.preempts_workers,
        "victims": [{"run": text(v.run), "loses_seconds": round(v.loses_seconds, 1),
                     "loses_gpu_seconds": round(v.loses_gpu_seconds, 1), "checkpoint_at": iso(v.checkpoint_at)}
                    for v in a.victim_losses],
        "starts_by": iso(a.starts_by),
        "behind": behind,
        "why_not": {text(w): [{"machine": m, "reason": text(r)} for m, r in lines] for w, lines in a.why_not.items()},
    }
