"""The scheduler: a pure function from a snapshot of one cluster to a plan.

    from astraeus.scheduler import plan, Snapshot
    result = plan(snapshot, now=time.time())

See `model.py` for the data contract and `cycle.py` for the phases of one cycle; why it is pure:
docs/design-pure-scheduler.md.
"""

from .cycle import plan
from .model import (
    Dependency,
    Machine,
    NodeSelection,
    PlacedWorker,
    Placement,
    Plan,
    Pool,
    Quota,
    QuotaReached,
    Reservation,
    RunningUnit,
    Snapshot,
    Start,
    StartRun,
    StopUnit,
    WaitingRun,
    WorkerRequest,
    Workspace,
    interned_workers,
)
from .whatif import WhatIf, answer, what_if

__all__ = [
    "Dependency",
    "Machine",
    "NodeSelection",
    "Placement",
    "PlacedWorker",
    "Plan",
    "Pool",
    "Quota",
    "QuotaReached",
    "Reservation",
    "RunningUnit",
    "Snapshot",
    "Start",
    "StartRun",
    "StopUnit",
    "WaitingRun",
    "WhatIf",
    "WorkerRequest",
    "Workspace",
    "answer",
    "interned_workers",
    "plan",
    "what_if",
]
