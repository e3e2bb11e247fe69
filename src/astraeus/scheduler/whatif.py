"""What-if: what a run would do if it were submitted now, read from the plan of the same `plan()`.

`what_if(snapshot, run, now)` adds the run to the snapshot's queue and plans; `answer(plan, snapshot, key)` reads
what that plan does with the run. The control plane's `POST $API/runs?dry_run=true` builds the snapshot with the
run in it (inside a transaction it rolls back) and calls `answer`, so the answer is the plan the loop would make
if nothing else changed. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from .cycle import plan as make_plan
from .model import Placement, Plan, RunningUnit, Snapshot, WaitingRun
from .progress import work_lost
from .reasons import OTHER_NAMESPACE

Outcome = Literal["Starts", "Preempts", "Head", "Queued", "Waits", "Fails"]


@dataclass(frozen=True)
class VictimLoss:
    """What stopping a victim run of the asker's own namespace throws away (issue 47): its work since its last
    checkpoint this attempt (`checkpoint_at`; None: none, since its start), in seconds and in GPU-seconds."""

    run: str
    loses_seconds: float
    loses_gpu_seconds: float
    checkpoint_at: float | None


def victim_loss(u: RunningUnit, now: float) -> VictimLoss:
    gpus = sum(len(w.gpu_indices) for w in u.workers)
    ckpt = u.last_checkpoint if u.last_checkpoint is not None and u.last_checkpoint >= u.started_at else None
    since = ckpt if ckpt is not None else u.started_at
    return VictimLoss(u.run, max(0.0, now - since), work_lost(now, u.started_at, ckpt, gpus), ckpt)


@dataclass(frozen=True)
class WhatIf:
    """outcome:
    - Starts: placed now (`placements`; `backfilled` when it starts behind the head);
    - Preempts: it is the head and stops `victims` (`preempts_workers` workers in all) to start by `starts_by`;
    - Head: it is the head and starts by `starts_by` as running work ends (None: when work without a time limit
      ends);
    - Queued: it waits behind the head (`behind`, as the workspace may see it);
    - Waits: it waits for another reason (quota, its dependency, its job array, its reservation, or it cannot run
      on this cluster): `reason`;
    - Fails: it would fail at once (its dependency can no longer be met): `reason`.
    `reason` is what the run's status would say; `why_not` its workers' per-machine lines (when the run is among
    the first waiting runs that get them)."""

    outcome: Outcome
    reason: str = ""
    placements: tuple[Placement, ...] = ()
    backfilled: bool = False
    victims: tuple[str, ...] = ()
    preempts_workers: int = 0
    starts_by: float | None = None
    behind: str | None = None
    why_not: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # least-work-lost (issue 47): (victim run of its own namespace, "loses 3 min of work since its checkpoint at …")
    losses: tuple[tuple[str, str], ...] = ()
    # each victim run of its own namespace, whatever the rule: what it loses (answer given `now`)
    victim_losses: tuple[VictimLoss, ...] = ()


def what_if(snapshot: Snapshot, run: WaitingRun, now: float) -> WhatIf:
    snap = replace(snapshot, waiting=snapshot.waiting + (run,))
    return answer(make_plan(snap, now), snap, run.name, now)


def answer(plan: Plan, snapshot: Snapshot, key: str, now: float | None = None) -> WhatIf:
    """What `plan` does with the waiting run `key` of `snapshot` (planned at `now`: with it, what each victim of
    its own namespace loses)."""
    run = next(r for r in snapshot.waiting if r.name == key)
    ws = run.workspace
    why_not = {w: lines for w, lines in plan.why_not.items() if w.rpartition("-")[0] == key}
    reason = plan.reasons.get(key, "")
    if key in plan.fails:
        return WhatIf("Fails", plan.fails[key], why_not=why_not)
    start = next((s for s in plan.starts if s.run == key), None)
    if start is not None and len(start.placements) == len(run.workers):
        return WhatIf("Starts", "", start.placements, start.backfilled)
    placements = start.placements if start is not None else ()
    backfilled = start.backfilled if start is not None else False
    if plan.head == key:
        stops = [s for s in plan.stops if s.preempted_by == key]
        victims: list[str] = []  # its own namespace's workers by name, in the plan's order; then the others as one
        n = 0
        others = False
        own = {u.run: u.workspace for u in snapshot.running}
        for s in stops:
            n += len(s.workers)
            if own.get(s.run) == ws:
                victims.extend(s.workers)
            else:
                others = True
        if others:
            victims.append(OTHER_NAMESPACE)
        losses = tuple((s.run, s.reason.split("; loses ", 1)[1]) for s in stops
                       if own.get(s.run) == ws and "; loses " in s.reason)
        units = {u.run: u for u in snapshot.running}
        figures = tuple(victim_loss(units[s.run], now) for s in stops
                        if now is not None and own.get(s.run) == ws and s.run in units)
        if stops or reason.startswith("Starting: waiting for"):
            return WhatIf("Preempts", reason, placements, backfilled, tuple(victims), n, plan.shadow_time,
                          why_not=why_not, losses=tuple((r, "loses " + words) for r, words in losses),
                          victim_losses=figures)
        return WhatIf("Head", reason, placements, backfilled, starts_by=plan.shadow_time, why_not=why_not)
    if plan.head is not None and reason.startswith("Queued behind "):
        head = next((r for r in snapshot.waiting if r.name == plan.head), None)
        behind = plan.head if head is not None and head.workspace == ws else OTHER_NAMESPACE
        return WhatIf("Queued", reason, placements, backfilled, starts_by=plan.shadow_time, behind=behind,
                      why_not=why_not)
    return WhatIf("Waits", reason, placements, backfilled, why_not=why_not)
