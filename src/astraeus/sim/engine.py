"""The simulator: the real scheduler (`astraeus.scheduler.plan`) driven by a virtual clock over a trace.

Discrete events, in virtual seconds:

- arrival: a task is submitted and waits;
- end: a task's worker finishes (or reaches its time limit: it is stopped and fails, as in the product);
- stop grace end: a stopped worker is gone and its room is free; a preempted task is queued again.

All events at one time are applied together, then `plan(snapshot, now)` is called once for that time (and
only when some run waits: with an empty queue there is nothing to decide). Its starts are placed, its stops
become `Stopping` units that keep their room for the machine's stop grace (SIGTERM → grace → SIGKILL, the
worst case of a run that does not exit sooner). Nothing changes between events, so no periodic cycle is
needed: the product's 15-second cycle would find the same plan.

A preempted task goes back to the queue with its submission time unchanged, and loses the work since its
last checkpoint: with a checkpoint interval C it saves every C seconds of run time, so after running e
seconds it keeps floor(e / C) * C of them; with C = 0 it never saves and loses the whole attempt. Its
remaining duration is what is left after the work it kept.

Placements are checked against the simulator's own books (GPU indices free, CPU and memory within the
machine): a start that does not fit is not applied and is counted as an invalid placement.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from astraeus.scheduler.model import (
    Machine,
    NodeSelection,
    PlacedWorker,
    Plan,
    Quota,
    RunningUnit,
    Snapshot,
    StartRun,
    WaitingRun,
    Workspace,
    interned_workers,
)
from astraeus.sim.trace import Task, Trace

PlanFn = Callable[[Snapshot, float], Plan]

# Event kinds; at one time they are all applied before the plan, so their order only keeps the heap stable.
_END, _GRACE_END, _ARRIVAL = 0, 1, 2
# A plan that keeps changing state at one virtual time (each change triggering another plan) is a bug in
# the scheduler or here; 1,000 plans at one instant is far beyond any real cascade of starts and stops.
_MAX_PLANS_AT_ONE_TIME = 1000
_ANY = NodeSelection()  # the selection of a task that names no machines


@dataclass(frozen=True, slots=True)
class SimOptions:
    backfill: bool = True
    preemption: bool = True
    fifo: bool = False
    fair_share: bool = True
    checkpoint_interval: float = 0.0  # seconds of run time between saves; 0: never saves
    cluster: str = "sim"
    # victims of equal priority stopped first: "recent" (the pages' rule) or "least-work-lost" (issue 47)
    victims: str = "recent"


@dataclass(slots=True)
class TaskState:
    task: Task
    remaining: float  # seconds of work still to do
    first_start: float | None = None
    attempt_start: float | None = None
    attempt: int = 0  # starts so far; end events carry it, so a stale one is ignored
    stopping: bool = False
    preemptions: int = 0
    queued_seconds: float = 0.0  # all time spent waiting, over every attempt
    queued_since: float = 0.0
    finished_at: float | None = None
    outcome: str = "Pending"  # Pending, Running, Completed, Failed (time limit)


@dataclass
class SimResult:
    trace: Trace
    options: SimOptions
    states: dict[str, TaskState]
    busy_series: list[tuple[float, int]]  # (time, GPUs held by workers) after each event time
    total_gpus: int
    plan_seconds: list[float]  # wall time of each plan() call
    plans: int = 0
    event_times: int = 0
    preemptions: int = 0
    lost_gpu_seconds: float = 0.0  # GPUs x run time lost since the victims' last checkpoints
    grace_gpu_seconds: float = 0.0  # GPUs x time held by stopping victims
    backfilled_starts: int = 0
    invalid_placements: int = 0
    invalid_examples: list[str] = field(default_factory=list)
    never_started_reasons: dict[str, str] = field(default_factory=dict)
    wall_seconds: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0


def default_plan() -> PlanFn:
    from astraeus.scheduler import plan  # the real scheduler; imported late so the readers work without it

    return plan


class Simulator:
    def __init__(self, trace: Trace, options: SimOptions | None = None, plan_fn: PlanFn | None = None):
        self.trace = trace
        self.options = options or SimOptions()
        self.plan_fn = plan_fn or default_plan()
        self.machines: tuple[Machine, ...] = tuple(trace.machines)
        self.machine_by_name = {m.name: m for m in self.machines}
        self.total_gpus = sum(m.gpus for m in self.machines)
        ws_ids = sorted({t.workspace for t in trace.tasks} | set(trace.workspaces))
        # Quota = twice the cluster's GPUs: in use + asked never exceeds it, so it is never a ceiling, but it
        # gives each workspace a share (GPUs in use / quota) for fair share to order by. (A workspace without
        # a quota has share 0, and fair share would have nothing to order.)
        self.workspaces = tuple(
            Workspace(id=w, name=trace.workspaces.get(w, w), quota=Quota(gpus=max(1, 2 * self.total_gpus)))
            for w in ws_ids
        )
        self.states: dict[str, TaskState] = {t.name: TaskState(task=t, remaining=t.duration) for t in trace.tasks}
        if len(self.states) != len(trace.tasks):
            raise ValueError("task names must be unique")
        self.waiting: dict[str, WaitingRun] = {}
        self._interned: dict = {}  # `_waiting_run`'s shared workers and selections
        self.running: dict[str, RunningUnit] = {}
        # The simulator's own books, to check each placement: GPU indices, CPU and memory in use per machine.
        self.gpus_used: dict[str, set[int]] = {m.name: set() for m in self.machines}
        self.cpu_used: dict[str, float] = {m.name: 0.0 for m in self.machines}
        self.mem_used: dict[str, int] = {m.name: 0 for m in self.machines}
        self.busy = 0
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.result = SimResult(
            trace=trace, options=self.options, states=self.states, busy_series=[], total_gpus=self.total_gpus,
            plan_seconds=[],
        )

    # ------------------------------------------------------------------------------------------ events

    def _push(self, when: float, kind: int, name: str, attempt: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (when, self._seq, kind, name, attempt))

    def _waiting_run(self, task: Task) -> WaitingRun:
        # Equal workers and selections are one object each, as the control plane gives them (server/loop.waiting_run)
        interned = self._interned
        asks = ((0, task.gpus, task.cpu_cores, task.memory_bytes),)
        sel = NodeSelection(mode="Names", names=task.machine_names) if task.machine_names is not None else _ANY
        return WaitingRun(
            name=task.name,
            workspace=task.workspace,
            priority=task.priority,
            submitted_at=task.submit_time,
            workers=interned_workers(interned, asks),
            start="Gang",
            time_limit_seconds=task.time_limit,
            node_selection=interned.setdefault(sel, sel),
        )

    def _arrive(self, name: str, now: float) -> None:
        st = self.states[name]
        st.queued_since = now
        self.waiting[name] = self._waiting_run(st.task)

    def _release(self, unit: RunningUnit) -> int:
        gpus = 0
        for w in unit.workers:
            self.gpus_used[w.machine].difference_update(w.gpu_indices)
            self.cpu_used[w.machine] -= w.cpu_cores
            self.mem_used[w.machine] -= w.memory_bytes
            gpus += len(w.gpu_indices)
        self.busy -= gpus
        return gpus

    def _end(self, name: str, attempt: int, now: float) -> None:
        st = self.states[name]
        unit = self.running.get(name)
        if unit is None or st.attempt != attempt or st.stopping:
            return  # stale: the attempt was stopped
        assert st.attempt_start is not None
        ran = now - st.attempt_start
        limit = st.task.time_limit
        if limit is not None and ran >= limit and st.remaining > limit:
            # Stopped at its time limit: SIGTERM, stop grace, SIGKILL; it fails and is not restarted.
            st.remaining -= ran
            st.stopping = True
            st.outcome = "Failed"
            self.running[name] = dataclasses.replace(unit, stopping=True)
            self._push(now + self._grace(unit), _GRACE_END, name, attempt)
            return
        st.remaining = 0.0
        st.outcome = "Completed"
        st.finished_at = now
        del self.running[name]
        self._release(unit)

    def _grace(self, unit: RunningUnit) -> float:
        return max((self.machine_by_name[w.machine].stop_grace_seconds for w in unit.workers), default=0.0)

    def _grace_end(self, name: str, now: float) -> None:
        st = self.states[name]
        unit = self.running.pop(name)
        gpus = self._release(unit)
        self.result.grace_gpu_seconds += gpus * self._grace(unit) if unit.preempted_for else 0.0
        st.stopping = False
        st.attempt_start = None
        if st.outcome == "Failed":
            st.finished_at = now
            return
        st.outcome = "Pending"
        self._arrive(name, now)  # queued again, with its original submission time

    # ------------------------------------------------------------------------------------------ plans

    def _checkpointed(self, unit: RunningUnit, now: float) -> RunningUnit:
        """The unit with its last checkpoint at `now` (every checkpoint_interval of its attempt's run time)."""
        interval = self.options.checkpoint_interval
        if interval <= 0 or unit.stopping:
            return unit
        saved = unit.started_at + math.floor((now - unit.started_at) / interval) * interval
        return dataclasses.replace(unit, last_checkpoint=saved) if saved > unit.started_at else unit

    def _snapshot(self, now: float = 0.0) -> Snapshot:
        o = self.options
        running = tuple(self.running.values())
        if o.victims == "least-work-lost":
            running = tuple(self._checkpointed(u, now) for u in running)
        return Snapshot(
            cluster=o.cluster,
            machines=self.machines,
            running=running,
            victims=o.victims,
            waiting=tuple(self.waiting.values()),
            workspaces=self.workspaces,
            preemption=o.preemption,
            backfill=o.backfill,
            fair_share=o.fair_share,
            fifo=o.fifo,
            why_not_limit=0,  # per-machine "why not" lines are for the console; the simulator reads none
        )

    def _invalid(self, what: str) -> None:
        self.result.invalid_placements += 1
        if len(self.result.invalid_examples) < 5:
            self.result.invalid_examples.append(what)

    def _start(self, start: StartRun, now: float) -> bool:
        run = self.waiting.get(start.run)
        if run is None:
            self._invalid(f"{start.run}: started but not waiting")
            return False
        need = {w.index: w for w in run.workers}
        if sorted(p.worker_index for p in start.placements) != sorted(need):
            self._invalid(f"{start.run}: placements do not cover its workers")
            return False
        taken: dict[str, set[int]] = {}
        cpu: dict[str, float] = {}
        mem: dict[str, int] = {}
        for p in start.placements:
            m = self.machine_by_name.get(p.machine)
            req = need[p.worker_index]
            idx = set(p.gpu_indices)
            mine = taken.setdefault(p.machine, set())
            if m is None or not m.schedulable:
                self._invalid(f"{start.run}: machine {p.machine} unknown or not schedulable")
                return False
            if len(idx) != len(p.gpu_indices) or len(idx) != req.gpus or any(i < 0 or i >= m.gpus for i in idx):
                self._invalid(f"{start.run}: GPU indices {p.gpu_indices} on {p.machine} for {req.gpus} GPU(s)")
                return False
            if idx & self.gpus_used[p.machine] or idx & mine:
                self._invalid(f"{start.run}: GPUs {sorted(idx & (self.gpus_used[p.machine] | mine))} of {p.machine} in use")
                return False
            mine |= idx
            cpu[p.machine] = cpu.get(p.machine, 0.0) + req.cpu_cores
            mem[p.machine] = mem.get(p.machine, 0) + req.memory_bytes
            if (
                self.cpu_used[p.machine] + cpu[p.machine] > m.cpu_cores + 1e-6
                or self.mem_used[p.machine] + mem[p.machine] > m.memory_bytes
            ):
                self._invalid(f"{start.run}: CPU or memory of {p.machine} exceeded")
                return False
        workers = []
        for p in start.placements:
            req = need[p.worker_index]
            self.gpus_used[p.machine].update(p.gpu_indices)
            self.cpu_used[p.machine] += req.cpu_cores
            self.mem_used[p.machine] += req.memory_bytes
            workers.append(
                PlacedWorker(
                    name=f"{run.name}-{p.worker_index}",
                    index=p.worker_index,
                    machine=p.machine,
                    gpu_indices=tuple(p.gpu_indices),
                    cpu_cores=req.cpu_cores,
                    memory_bytes=req.memory_bytes,
                )
            )
            self.busy += len(p.gpu_indices)
        del self.waiting[run.name]
        st = self.states[run.name]
        st.attempt += 1
        st.attempt_start = now
        st.outcome = "Running"
        st.queued_seconds += now - st.queued_since
        if st.first_start is None:
            st.first_start = now
        if start.backfilled:
            self.result.backfilled_starts += 1
        self.running[run.name] = RunningUnit(
            run=run.name,
            workspace=run.workspace,
            priority=run.priority,
            started_at=now,
            time_limit_seconds=run.time_limit_seconds,
            workers=tuple(workers),
        )
        limit = st.task.time_limit
        runs_for = st.remaining if limit is None else min(st.remaining, limit)
        self._push(now + runs_for, _END, run.name, st.attempt)
        return True

    def _stop(self, run: str, preempted_by: str, now: float) -> None:
        unit = self.running.get(run)
        if unit is None or unit.stopping:
            self._invalid(f"{run}: stopped but not running")
            return
        st = self.states[run]
        assert st.attempt_start is not None
        elapsed = now - st.attempt_start
        interval = self.options.checkpoint_interval
        kept = math.floor(elapsed / interval) * interval if interval > 0 else 0.0
        kept = min(kept, st.remaining)
        lost = elapsed - kept
        st.remaining -= kept
        st.preemptions += 1
        st.stopping = True
        gpus = sum(len(w.gpu_indices) for w in unit.workers)
        self.result.preemptions += 1
        self.result.lost_gpu_seconds += lost * gpus
        self.running[run] = dataclasses.replace(unit, stopping=True, preempted_for=preempted_by)
        self._push(now + self._grace(unit), _GRACE_END, run, st.attempt)

    def _plan(self, now: float) -> bool:
        """One scheduling cycle at `now`; True when it changed anything."""
        snapshot = self._snapshot(now)
        t0 = time.perf_counter()
        plan = self.plan_fn(snapshot, now)
        self.result.plan_seconds.append(time.perf_counter() - t0)
        self.result.plans += 1
        changed = False
        for stop in plan.stops:
            self._stop(stop.run, stop.preempted_by, now)
            changed = True
        for start in plan.starts:
            changed |= self._start(start, now)
        for q in plan.quota_reached:
            run = self.waiting.get(q.run)
            if run is not None and not run.quota_noted:
                self.waiting[q.run] = dataclasses.replace(run, quota_noted=True)
        self._last_reasons = plan.reasons
        return changed

    # ------------------------------------------------------------------------------------------ loop

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        self._last_reasons: dict[str, str] = {}
        for t in self.trace.tasks:
            self._push(t.submit_time, _ARRIVAL, t.name)
        series = self.result.busy_series
        if self.trace.tasks:
            self.result.start_time = self.trace.tasks[0].submit_time
        now = self.result.start_time
        while self.events:
            now = self.events[0][0]
            self.result.event_times += 1
            plans_here = 0
            while True:
                while self.events and self.events[0][0] <= now:
                    _, _, kind, name, attempt = heapq.heappop(self.events)
                    if kind == _ARRIVAL:
                        self._arrive(name, now)
                    elif kind == _END:
                        self._end(name, attempt, now)
                    else:
                        self._grace_end(name, now)
                if not self.waiting:
                    break
                changed = self._plan(now)
                plans_here += 1
                # A zero-length task started now ends now: apply that, then plan again at the same time.
                if not (changed and self.events and self.events[0][0] <= now):
                    break
                if plans_here >= _MAX_PLANS_AT_ONE_TIME:
                    raise RuntimeError(f"more than {_MAX_PLANS_AT_ONE_TIME} plans at t={now}: no progress")
            if not series or series[-1][1] != self.busy:
                series.append((now, self.busy))
        self.result.end_time = max(
            (st.finished_at for st in self.states.values() if st.finished_at is not None), default=now
        )
        self.result.never_started_reasons = {
            name: self._last_reasons.get(name, "") for name in self.waiting
        }
        self.result.wall_seconds = time.perf_counter() - wall0
        return self.result


def simulate(trace: Trace, options: SimOptions | None = None, plan_fn: PlanFn | None = None) -> SimResult:
    return Simulator(trace, options, plan_fn).run()
