"""Fluent fixtures for scheduler tests: one line of data per machine, running unit and waiting run.

    snap = (cluster(machine("gpu-01", gpus=8))
            .running("finetune-r50", prio=-100, gpus=1, on="gpu-01")
            .waiting("urgent-eval", gpus=8)
            .build())

GPU indices of running work are assigned lowest free first, per machine, in the order the lines are written.
Every run is in workspace WS_A unless `ws=` says otherwise; workspaces are added as they are named.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from astraeus.scheduler import (
    Machine,
    NodeSelection,
    PlacedWorker,
    Pool,
    Quota,
    Reservation,
    RunningUnit,
    Snapshot,
    WaitingRun,
    WorkerRequest,
    Workspace,
)

GIB = 1 << 30
NOW = datetime(2026, 10, 1, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0
WS_A = "ws-3f9c2a1b7d4e"
WS_B = "ws-8a7b6c5d4e3f"


def machine(name: str, gpus: int = 8, cpu: float = 64, mem_gib: int = 512, labels: dict | None = None,
            schedulable: bool = True, grace: float = 30.0, unschedulable_reason: str = "lost",
            model: str = "") -> Machine:
    return Machine(name, gpus, cpu, mem_gib * GIB, tuple(sorted((labels or {}).items())), grace, schedulable,
                   unschedulable_reason, model)


class ClusterBuilder:
    def __init__(self, *machines: Machine):
        self.machines = list(machines)
        self.units: list[RunningUnit] = []
        self.runs: list[WaitingRun] = []
        self.spaces: dict[str, Workspace] = {}
        self.used: dict[str, set[int]] = {m.name: set() for m in machines}
        self.switches: dict = {}
        self.pools: list[Pool] = []
        self.reservations: list[Reservation] = []
        self._t = NOW - 100 * HOUR

    def workspace(self, ws: str, quota: Quota | None = None, weight: float = 1.0,
                  pools: tuple[str, ...] | None = None) -> ClusterBuilder:
        self.spaces[ws] = Workspace(ws, ws, quota, weight, pools)
        return self

    def pool(self, name: str, *machines: str) -> ClusterBuilder:
        self.pools.append(Pool(name, tuple(machines)))
        return self

    def reservation(self, name: str, machines: str | list[str], start: float, end: float | None = None,
                    ws: str | tuple[str, ...] = WS_B) -> ClusterBuilder:
        """Machines kept for `ws` (WS_B unless said: the default runs, in WS_A, are outsiders) from start to end."""
        spaces = (ws,) if isinstance(ws, str) else tuple(ws)
        for w in spaces:
            self._ws(w)
        ms = (machines,) if isinstance(machines, str) else tuple(machines)
        self.reservations.append(Reservation(name, ms, spaces, start, end))
        return self

    def _ws(self, ws: str) -> None:
        self.spaces.setdefault(ws, Workspace(ws, ws))

    def running(self, run: str, prio: int = 0, gpus: int = 1, on: str | list[str] = "gpu-01", ws: str = WS_A,
                started: float | None = None, limit: float | None = None, cpu: float = 1, mem_gib: float = 1,
                stopping: bool = False, preempted_for: str | None = None) -> ClusterBuilder:
        """One unit: a worker on each machine in `on` (a gang when several), `gpus` GPUs each."""
        self._ws(ws)
        ons = [on] if isinstance(on, str) else on
        workers = []
        for k, m in enumerate(ons):
            free = [g for g in range(self._gpus(m)) if g not in self.used[m]]
            take = tuple(free[:gpus])
            assert len(take) == gpus, f"{m} has no {gpus} free GPUs for {run}"
            self.used[m].update(take)
            workers.append(PlacedWorker(f"{run}-{k}", k, m, take, cpu, int(mem_gib * GIB)))
        self.units.append(RunningUnit(run, ws, prio, NOW - HOUR if started is None else started, limit,
                                      tuple(workers), stopping, preempted_for))
        return self

    def _gpus(self, name: str) -> int:
        return next(m.gpus for m in self.machines if m.name == name)

    def waiting(self, run: str, gpus: int = 1, workers: int = 1, prio: int = 0, ws: str = WS_A,
                submitted: float | None = None, limit: float | None = None, cpu: float = 1, mem_gib: float = 1,
                start: str = "Gang", names: tuple[str, ...] = (), labels: dict | None = None,
                excluded: tuple[tuple[str, str], ...] = (), quota_noted: bool = False, pools: tuple[str, ...] = (),
                model: str | None = None, reservation: str | None = None) -> ClusterBuilder:
        self._ws(ws)
        if submitted is None:
            self._t += 1
            submitted = self._t
        if names:
            sel = NodeSelection("Names", tuple(names))
        elif labels:
            sel = NodeSelection("Labels", labels=tuple(sorted(labels.items())))
        else:
            sel = NodeSelection()
        if pools or model or reservation:
            sel = replace(sel, pools=tuple(pools), gpu_model=model, reservation=reservation)
        reqs = tuple(WorkerRequest(i, gpus, cpu, int(mem_gib * GIB)) for i in range(workers))
        self.runs.append(WaitingRun(run, ws, prio, submitted, reqs, start, limit, sel, excluded, quota_noted))
        return self

    def set(self, **switches) -> ClusterBuilder:
        self.switches.update(switches)
        return self

    def build(self) -> Snapshot:
        snap = Snapshot("c1", tuple(self.machines), tuple(self.units), tuple(self.runs),
                        tuple(self.spaces.values()), pools=tuple(self.pools), reservations=tuple(self.reservations))
        return replace(snap, **self.switches)


def cluster(*machines: Machine) -> ClusterBuilder:
    return ClusterBuilder(*machines)


def started(plan, run: str):
    return next((s for s in plan.starts if s.run == run), None)


def started_names(plan) -> list[str]:
    return [s.run for s in plan.starts]


def stopped_names(plan) -> list[str]:
    return [s.run for s in plan.stops]
