"""Trace readers: machines and tasks for the simulator, from the Alibaba GPU trace or a plain CSV.

Two task formats:

- ``alibaba``: ``openb_pod_list_*.csv`` of the Alibaba cluster-trace-gpu-v2023 (USENIX ATC 2023, "Beware of
  Fragmentation"; CC BY 4.0). Each pod becomes one single-worker run:
    * arrival = ``creation_time``; duration = ``deletion_time - scheduled_time`` (what it ran in production);
    * pods without ``scheduled_time`` (still pending when the trace was cut) have no known duration: skipped
      and counted;
    * ``gpu_milli < 1000`` marks a pod that shared one GPU: Astraeus has no GPU sharing, so it asks for one
      whole GPU (counted, and said in the report);
    * QoS → priority: ``LS`` 100, ``Guaranteed`` 50, ``Burstable`` 0, ``BE`` −100 (the preemptible scavenger
      class: everything above it may stop it);
    * workspace: the pod name hashed (CRC-32) into four workspaces ``trace-0..3`` — the trace has no
      owners, and hashing spreads every QoS class over all four so fair share has something to order;
    * CPU (``cpu_milli``/1000 cores) and memory (``memory_mib``) are asked as recorded;
    * ``gpu_spec`` (only in ``openb_pod_list_gpuspec33.csv``) restricts a pod to machines of those models;
    * the trace has no time limits; ``honest_time_limits`` gives every task its duration rounded up to the
      next minute, so backfill can compute a shadow time.
- ``csv``: ``submit_time,duration,gpus,priority,workspace,time_limit`` (seconds; ``time_limit`` may be
  empty; optional columns ``name``, ``cpu_cores``, ``memory_gib``).

Machines: the Alibaba node list (``sn,cpu_milli,memory_mib,gpu,model``) or a plain CSV
``name,gpus[,cpu_cores,memory_gib]``; the header tells which.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from astraeus.scheduler.model import Machine

MIB = 1024 * 1024
GIB = 1024 * MIB

# QoS → priority. LS (latency-sensitive) serving work outranks everything; BE (best effort) is the
# scavenger class that any other class may preempt.
QOS_PRIORITY: dict[str, int] = {"LS": 100, "Guaranteed": 50, "Burstable": 0, "BE": -100}
# Four workspaces: enough for fair share to reorder equal-priority work, few enough to read in a report.
TRACE_WORKSPACES = 4


@dataclass(frozen=True, slots=True)
class Task:
    """One run of the trace: a single worker that needs `gpus` GPUs on one machine for `duration` seconds."""

    name: str
    submit_time: float
    duration: float
    gpus: int
    priority: int
    workspace: str  # Workspace.id
    cpu_cores: float = 0.0
    memory_bytes: int = 0
    time_limit: float | None = None
    priority_class: str = ""  # the label waits are grouped by ("LS", "BE", "priority 10", ...)
    recorded_wait: float | None = None  # production scheduler's wait (Alibaba: scheduled - creation)
    shared_gpu: bool = False  # asked for part of one GPU in the trace; simulated as one whole GPU
    machine_names: tuple[str, ...] | None = None  # only these machines (gpu_spec); None = any


@dataclass
class Trace:
    tasks: list[Task]
    machines: list[Machine]
    fmt: str
    skipped_unknown_duration: int = 0  # pods with no scheduled_time
    shared_gpu_as_whole: int = 0  # pods with gpu_milli < 1000 simulated as one whole GPU
    limited_to: int | None = None
    # False when arrivals were compressed or machines dropped: production's utilisation then says nothing
    # about this run (its recorded waits are still shown, as the production baseline of the same tasks).
    comparable_to_production: bool = True
    workspaces: dict[str, str] = field(default_factory=dict)  # Workspace.id -> name
    notes: list[str] = field(default_factory=list)

    @property
    def total_gpus(self) -> int:
        return sum(m.gpus for m in self.machines)


def workspace_id(index: int) -> str:
    """A namespace id of the product's shape, "ws-" + 12 hex digits."""
    return f"ws-{0xace000000000 + index:012x}"


def trace_workspace(name: str) -> str:
    return workspace_id(zlib.crc32(name.encode()) % TRACE_WORKSPACES)


def honest_limit(duration: float) -> float:
    """A time limit a user could honestly give: the duration rounded up to the next whole minute."""
    return float(max(60, math.ceil(duration / 60.0) * 60))


# ---------------------------------------------------------------------------------------------- machines


def read_machines(path: str | Path, stop_grace_seconds: float = 30.0) -> list[Machine]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = set(reader.fieldnames or ())
        machines: list[Machine] = []
        for row in reader:
            if "sn" in header:  # Alibaba node list
                model = (row.get("model") or "").strip()
                machines.append(
                    Machine(
                        name=row["sn"].strip(),
                        gpus=int(row["gpu"]),
                        cpu_cores=int(row["cpu_milli"]) / 1000.0,
                        memory_bytes=int(row["memory_mib"]) * MIB,
                        labels=(("model", model),) if model else (),
                        stop_grace_seconds=stop_grace_seconds,
                    )
                )
            elif {"name", "gpus"} <= header:
                cpu = row.get("cpu_cores") or ""
                mem = row.get("memory_gib") or ""
                machines.append(
                    Machine(
                        name=row["name"].strip(),
                        gpus=int(row["gpus"]),
                        cpu_cores=float(cpu) if cpu.strip() else 1e9,
                        memory_bytes=int(float(mem) * GIB) if mem.strip() else 1 << 60,
                        stop_grace_seconds=stop_grace_seconds,
                    )
                )
            else:
                raise ValueError(
                    f"{path}: machines CSV needs the header sn,cpu_milli,memory_mib,gpu,model (Alibaba) "
                    f"or name,gpus[,cpu_cores,memory_gib]; found {sorted(header)}"
                )
    if not machines:
        raise ValueError(f"{path}: no machines")
    return machines


# ---------------------------------------------------------------------------------------------- tasks


def _models_to_machines(machines: list[Machine]) -> dict[str, tuple[str, ...]]:
    by_model: dict[str, list[str]] = {}
    for m in machines:
        for key, value in m.labels:
            if key == "model":
                by_model.setdefault(value, []).append(m.name)
    return {k: tuple(v) for k, v in by_model.items()}


def read_alibaba_tasks(
    path: str | Path,
    machines: list[Machine] | None = None,
    *,
    limit: int | None = None,
    honest_time_limits: bool = False,
) -> tuple[list[Task], Counter[str]]:
    """Tasks of an ``openb_pod_list_*.csv``; also a Counter of what was skipped or adapted."""
    counts: Counter[str] = Counter()
    by_model = _models_to_machines(machines or [])
    spec_cache: dict[str, tuple[str, ...]] = {}
    tasks: list[Task] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if limit is not None and counts["read"] >= limit:
                break
            counts["read"] += 1
            scheduled = (row.get("scheduled_time") or "").strip()
            deleted = (row.get("deletion_time") or "").strip()
            if not scheduled or not deleted:
                counts["unknown_duration"] += 1
                continue
            created = float(row["creation_time"])
            duration = max(0.0, float(deleted) - float(scheduled))
            num_gpu = int(row["num_gpu"] or 0)
            gpu_milli = int(row["gpu_milli"] or 0)
            shared = num_gpu > 0 and gpu_milli < 1000
            if shared:
                counts["shared_gpu"] += 1
                num_gpu = 1  # a share of one GPU: one whole GPU here
            qos = row["qos"].strip()
            if qos not in QOS_PRIORITY:
                raise ValueError(f"{path}: unknown qos {qos!r} for {row['name']}")
            spec = (row.get("gpu_spec") or "").strip()
            names: tuple[str, ...] | None = None
            if spec and num_gpu > 0:
                if spec not in spec_cache:
                    spec_cache[spec] = tuple(n for model in spec.split("|") for n in by_model.get(model, ()))
                names = spec_cache[spec]
                counts["gpu_spec"] += 1
            tasks.append(
                Task(
                    name=row["name"].strip(),
                    submit_time=created,
                    duration=duration,
                    gpus=num_gpu,
                    priority=QOS_PRIORITY[qos],
                    workspace=trace_workspace(row["name"]),
                    cpu_cores=int(row["cpu_milli"] or 0) / 1000.0,
                    memory_bytes=int(row["memory_mib"] or 0) * MIB,
                    time_limit=honest_limit(duration) if honest_time_limits else None,
                    priority_class=qos,
                    recorded_wait=float(scheduled) - created,
                    shared_gpu=shared,
                    machine_names=names,
                )
            )
    return tasks, counts


def read_csv_tasks(
    path: str | Path,
    *,
    limit: int | None = None,
    honest_time_limits: bool = False,
    workspaces: dict[str, str] | None = None,
) -> tuple[list[Task], Counter[str]]:
    """Tasks of a plain ``submit_time,duration,gpus,priority,workspace,time_limit`` CSV.

    `workspaces`, when given, is filled with name -> Workspace.id.
    """
    counts: Counter[str] = Counter()
    tasks: list[Task] = []
    workspaces = {} if workspaces is None else workspaces
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"submit_time", "duration", "gpus", "priority", "workspace"}
        missing = need - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for i, row in enumerate(reader):
            if limit is not None and counts["read"] >= limit:
                break
            counts["read"] += 1
            duration = float(row["duration"])
            limit_s = (row.get("time_limit") or "").strip()
            time_limit = float(limit_s) if limit_s else None
            if time_limit is None and honest_time_limits:
                time_limit = honest_limit(duration)
            ws = (row["workspace"] or "default").strip()
            if ws not in workspaces:
                workspaces[ws] = ws if ws.startswith("ws-") else workspace_id(len(workspaces))
            priority = int(row["priority"] or 0)
            cpu = (row.get("cpu_cores") or "").strip()
            mem = (row.get("memory_gib") or "").strip()
            tasks.append(
                Task(
                    name=(row.get("name") or "").strip() or f"task-{i:05d}",
                    submit_time=float(row["submit_time"]),
                    duration=duration,
                    gpus=int(row["gpus"]),
                    priority=priority,
                    workspace=workspaces[ws],
                    cpu_cores=float(cpu) if cpu else 0.0,
                    memory_bytes=int(float(mem) * GIB) if mem else 0,
                    time_limit=time_limit,
                    priority_class=f"priority {priority}",
                )
            )
    return tasks, counts


def load_trace(
    machines_csv: str | Path,
    tasks_csv: str | Path,
    fmt: str = "alibaba",
    *,
    limit: int | None = None,
    honest_time_limits: bool = False,
    stop_grace_seconds: float = 30.0,
    arrival_scale: float = 1.0,
    max_machines: int | None = None,
) -> Trace:
    """Read a trace. `arrival_scale` < 1 packs arrivals closer (0.01: the trace's 149 days of arrivals in
    1.5 days; durations unchanged) and `max_machines` keeps only the first N machines: both raise the load,
    since the Alibaba trace on its own 6,212 GPUs peaks at 70 GPUs in use."""
    if arrival_scale <= 0:
        raise ValueError("arrival_scale must be > 0")
    machines = read_machines(machines_csv, stop_grace_seconds=stop_grace_seconds)
    if max_machines is not None:
        machines = machines[:max_machines]
    if fmt == "alibaba":
        tasks, counts = read_alibaba_tasks(tasks_csv, machines, limit=limit, honest_time_limits=honest_time_limits)
    elif fmt == "csv":
        names: dict[str, str] = {}
        tasks, counts = read_csv_tasks(
            tasks_csv, limit=limit, honest_time_limits=honest_time_limits, workspaces=names
        )
    else:
        raise ValueError(f"unknown trace format {fmt!r}: use alibaba or csv")
    if arrival_scale != 1.0:
        tasks = [dataclasses.replace(t, submit_time=t.submit_time * arrival_scale) for t in tasks]
    tasks.sort(key=lambda t: (t.submit_time, t.name))
    trace = Trace(
        tasks=tasks,
        machines=machines,
        fmt=fmt,
        skipped_unknown_duration=counts["unknown_duration"],
        shared_gpu_as_whole=counts["shared_gpu"],
        limited_to=limit,
        comparable_to_production=arrival_scale == 1.0 and max_machines is None,
    )
    if arrival_scale != 1.0:
        trace.notes.append(f"Arrival times scaled by {arrival_scale:g} (durations unchanged).")
    if max_machines is not None:
        trace.notes.append(f"Only the first {len(machines)} machines of the machines file.")
    if fmt == "alibaba":
        trace.workspaces = {workspace_id(i): f"trace-{i}" for i in range(TRACE_WORKSPACES)}
    else:
        trace.workspaces = {ws_id: name for name, ws_id in names.items()}
    if fmt == "alibaba":
        trace.notes.append(
            "QoS → priority: LS 100, Guaranteed 50, Burstable 0, BE −100 (preemptible scavenger class)."
        )
        trace.notes.append(
            f"Workspaces: pod name hashed (CRC-32) into {TRACE_WORKSPACES}; each has a GPU quota of twice the "
            "cluster's GPUs, so fair share orders by GPUs in use without capping anyone."
        )
        trace.notes.append(
            f"{trace.shared_gpu_as_whole} tasks asked for part of one GPU (gpu_milli < 1000): simulated as one "
            "whole GPU each (Astraeus has no GPU sharing)."
        )
        trace.notes.append(
            f"{trace.skipped_unknown_duration} tasks had no scheduled_time (pending when the trace was cut, "
            "so their duration is unknown): skipped."
        )
        if counts["gpu_spec"]:
            trace.notes.append(f"{counts['gpu_spec']} tasks restricted to machines of their gpu_spec models.")
    if honest_time_limits:
        trace.notes.append("Time limits: each task's duration rounded up to the next minute (--honest-time-limits).")
    elif fmt == "alibaba":
        trace.notes.append("Time limits: none (the trace has none), so backfill only uses room the head does not need.")
    return trace
