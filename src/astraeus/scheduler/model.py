"""The scheduler's inputs and outputs: a snapshot of one cluster, and the plan it yields.

Everything here is plain, immutable data. `astraeus.scheduler.plan(snapshot, now)` reads a `Snapshot` and
returns a `Plan`; it does no I/O and reads no clock. The server's scheduling loop builds the snapshot from
the database and applies the plan; the simulator builds it from a trace.

Vocabulary (the product's own words):
- run: what a user submits; it has one or more workers (`<run>-<index>`).
- unit: what preemption stops at once: a gang run's workers together, or one worker of an independent run.
- head: the first run in queue order that cannot start now but could on this cluster.
- victim: running work stopped to make room for the head.
- shadow time: when the head will start at the latest, from the time limits of running work.
- stop grace: seconds between SIGTERM and SIGKILL on a machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Start = Literal["Gang", "Independent"]


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    gpus: int  # GPU count; indices are 0..gpus-1
    cpu_cores: float
    memory_bytes: int
    labels: tuple[tuple[str, str], ...] = ()
    stop_grace_seconds: float = 30.0
    schedulable: bool = True  # False when lost or cordoned: nothing new is placed there
    # Added for the per-machine "why not" lines: `machine is not schedulable (<this>)`.
    unschedulable_reason: str = "lost"
    gpu_model: str = ""  # the machine's GPU model as its agent reports it ("NVIDIA H100 80GB HBM3"); "" none
    quarantined_gpus: tuple[int, ...] = ()  # failed GPUs (issue 47): never free, nothing is placed on them
    gpu_memory_bytes: int = 0  # issue 46: memory of each of its GPUs (the smallest where they differ); 0 unknown
    # Issue 46: its NVLink/NVSwitch islands (sets of GPU indices, scheduler.topology); () none reported: one island
    nvlink_islands: tuple[tuple[int, ...], ...] = ()
    # Issue 46: per GPU its MIG devices, (profile, count) pairs; a GPU with any is a MIG GPU: it takes MIG workers
    # only (never a whole-GPU or fractional one)
    gpu_mig: tuple[tuple[tuple[str, int], ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Quota:
    """A workspace's hard ceiling on one cluster. None means no limit on that resource."""

    gpus: int | None = None
    cpu_cores: float | None = None
    memory_bytes: int | None = None
    workers: int | None = None


@dataclass(frozen=True, slots=True)
class Workspace:
    id: str  # namespace id, "ws-" + 12 hex: what reasons and errors show
    name: str
    quota: Quota | None = None  # None: no quota on this cluster, share 0
    weight: float = 1.0
    pools: tuple[str, ...] | None = None  # the pools it may use on this cluster; None: every machine
    max_gpus_per_user: int | None = None  # at most this many GPUs held by one user's runs here; None: no limit


@dataclass(frozen=True, slots=True)
class Pool:
    """A named group of the cluster's machines (resolved by the control plane from names and labels)."""

    name: str
    machines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Machines kept for some workspaces from `start` to `end` (epoch seconds; end None: no end).

    Inside the window only those workspaces' runs are placed on the machines, and work of others still there is
    stopped (`Plan.reservation_stops`). Before it, others' runs may use them only if their time limit and the
    machine's stop grace end them by `start`."""

    name: str
    machines: tuple[str, ...]
    workspaces: tuple[str, ...]  # Workspace.id of each workspace it is for
    start: float
    end: float | None = None


@dataclass(frozen=True, slots=True)
class PlacedWorker:
    """A worker that holds room on a machine now (Starting, Running or Stopping)."""

    name: str  # "<run>-<index>"
    index: int
    machine: str
    gpu_indices: tuple[int, ...]
    cpu_cores: float
    memory_bytes: int
    gpu_milli: int = 0  # issue 46: thousandths of its one GPU (gpu_indices[0]) it shares; 0: its GPUs whole
    # Issue 46: the MIG devices it holds, (gpu, profile, k): the k-th device of that profile on that GPU (its
    # gpu_milli is then their share of a GPU, gpushare.mig_milli, and no GPU is shared)
    mig_devices: tuple[tuple[int, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RunningUnit:
    """Running work that preemption can stop as one: a gang run's workers, or one independent worker."""

    run: str
    workspace: str  # Workspace.id
    priority: int
    started_at: float  # epoch seconds
    time_limit_seconds: float | None
    workers: tuple[PlacedWorker, ...]
    stopping: bool = False  # already told to stop (its room is still taken until it is gone)
    preempted_for: str | None = None  # when stopping for a head: that run's name (room held for it)
    array: str | None = None  # the job array the run belongs to (its `array_max_running` counts this run)
    user: str | None = None  # who submitted the run (its workspace's max_gpus_per_user counts it)
    # Issue 47: the oldest last checkpoint of its workers this attempt (None: none yet); least-work-lost reads it
    last_checkpoint: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    """What one waiting worker needs on one machine."""

    index: int
    gpus: int | float  # issue 46: 0 < gpus < 1 is a fraction of one GPU shared with others (gpushare)
    cpu_cores: float
    memory_bytes: int
    # Issue 46: GPU memory asked (bytes; 0 none): its share of a GPU is then per machine (gpushare.memory_milli), and
    # `gpus` the share it counts for quotas before it is placed
    gpu_memory_bytes: int = 0
    # Issue 46: MIG devices asked, `mig_count` of profile `mig` (as its NodeSelection.mig); `gpus` is then their
    # share of a GPU (gpushare.mig_milli)
    mig: str = ""
    mig_count: int = 0


@dataclass(frozen=True, slots=True)
class NodeSelection:
    mode: Literal["Any", "Names", "Labels"] = "Any"
    names: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    pools: tuple[str, ...] = ()  # only machines of one of these pools (and of the workspace's pools); () any
    gpu_model: str | None = None  # only machines whose GPU model contains this, case-insensitively ("a100")
    reservation: str | None = None  # only that reservation's machines, inside its window (waits before it)
    topology_same: str | None = None  # issue 46: "block" or "rack": a gang's machines all in one (topology.py)
    gpu_memory: int | None = None  # issue 46: only machines whose GPUs hold more than this many bytes
    mig: str | None = None  # issue 46: MIG devices of this profile ("1g.10gb"): only machines that have them


DependencyType = Literal["afterok", "afterany", "afternotok", "singleton"]


@dataclass(frozen=True, slots=True)
class Dependency:
    """What a run waits for before it may start (Slurm's `--dependency`), as the control plane sees it now.

    `runs` holds, for each name the dependency gives (a run, or a job array: all its runs), each run it stands
    for: (the name given, the run's name, the run's state: Pending, Starting, Running, Stopping, Completed,
    Failed or Cancelled). For `singleton`, the name given is the run's own job and `runs` its live earlier runs."""

    type: DependencyType
    runs: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WaitingRun:
    """A run with workers that wait to be placed.

    For a Gang run every worker in `workers` must be placed together (all or nothing). For an Independent
    run each worker may be placed on its own; `workers` lists only the ones still waiting.
    """

    name: str
    workspace: str  # Workspace.id
    priority: int
    submitted_at: float
    workers: tuple[WorkerRequest, ...]
    start: Start = "Gang"
    time_limit_seconds: float | None = None
    node_selection: NodeSelection = field(default_factory=NodeSelection)
    # Machines this run may not use, each with the reason shown for it (e.g. a drive that lives elsewhere).
    excluded_machines: tuple[tuple[str, str], ...] = ()
    quota_noted: bool = False  # a "Quota reached" entry was already recorded for this run
    # A job array's run: at most `array_max_running` runs of the array (same workspace) run at once.
    array: str | None = None
    array_max_running: int | None = None
    dependency: Dependency | None = None  # held until it is met; failed when it can no longer be
    user: str | None = None  # who submitted it: its workspace's `max_gpus_per_user` holds it back


@dataclass(frozen=True, slots=True)
class Snapshot:
    cluster: str
    machines: tuple[Machine, ...]
    running: tuple[RunningUnit, ...]
    waiting: tuple[WaitingRun, ...]
    workspaces: tuple[Workspace, ...]
    preemption: bool = True  # a cluster can run with preemption off
    backfill: bool = True  # switches for the simulator: turn rules off to see their effect
    fair_share: bool = True
    fifo: bool = False  # order by submission time only (ignores priority and fair share)
    # Issue 47: among victims of equal priority, "recent" stops the most recently started first (the pages' rule);
    # "least-work-lost" those that lose the fewest GPU-seconds since their last checkpoint.
    victims: str = "recent"
    pools: tuple[Pool, ...] = ()
    reservations: tuple[Reservation, ...] = ()  # those not yet ended (an ended one restricts nothing)
    # Added: how many waiting runs (in queue order, not started) get per-machine `why_not` lines. Each line
    # costs one entry per machine, so 10k waiting runs on 1,000 machines would be 10M lines; the console shows
    # the first page of the queue (50). The simulator sets 0; None means every waiting run.
    why_not_limit: int | None = 50
    # On a cluster with more machines than this, a worker's why-not lines are grouped: the machines it may use
    # with the most free GPUs (`whynot.EACH`) get a line each, every other machine is counted in one line per
    # reason ("gpu-00012, gpu-00013 and 9,978 more machines"). None: one line per machine whatever the size.
    why_not_machines: int | None = 100
    # Issue 46: who may share a GPU: "workspace" (tenants of one workspace only) or "any" (gpushare.SHARING).
    gpu_sharing: str = "workspace"
    # Issue 46: where a worker's GPUs go (fragments.POLICIES): "bestfit" (today's rule), "fgd" (where the
    # fragmentation against the workload's task sizes grows least) or "spread". `task_sizes`: that workload as
    # fragments.Sizes (the control plane's recent history); () makes it from the waiting and running workers.
    placement: str = "bestfit"
    task_sizes: tuple = ()


# ---------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Placement:
    worker_index: int
    machine: str
    gpu_indices: tuple[int, ...]
    cpu_cores: float
    memory_bytes: int
    gpu_milli: int = 0  # issue 46: thousandths of gpu_indices[0] the worker shares; 0: its GPUs whole
    mig_devices: tuple[tuple[int, str, int], ...] = ()  # issue 46: its MIG devices (PlacedWorker.mig_devices)


@dataclass(frozen=True, slots=True)
class StartRun:
    run: str
    placements: tuple[Placement, ...]
    backfilled: bool = False  # started behind the head, in room the head does not need or ending before it


@dataclass(frozen=True, slots=True)
class StopUnit:
    """Stop these workers (SIGTERM, stop grace, SIGKILL) because `preempted_by` needs their room."""

    run: str
    workers: tuple[str, ...]
    preempted_by: str
    reason: str  # "Preempted by higher-priority work (<run>)" or "... (a job in another namespace)"


class QuotaReached(NamedTuple):
    """A run that reached its namespace's quota (an event, once per run). A named tuple, not a dataclass: a cycle
    may make tens of thousands of them, at C speed (`Cycle._notes`)."""

    run: str
    workspace: str
    message: str  # "Quota reached: gpus 6 in use + 4 asked > 8"


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[StartRun, ...] = ()
    stops: tuple[StopUnit, ...] = ()
    # For every waiting run (not started by this plan): the reason shown as its status.reason.
    reasons: dict[str, str] = field(default_factory=dict)
    # For every waiting worker ("<run>-<index>"): one line per machine, what blocks it there.
    why_not: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    head: str | None = None
    shadow_time: float | None = None  # when the head starts at the latest; None when unknown
    quota_reached: tuple[QuotaReached, ...] = ()
    # Waiting runs whose dependency can no longer be met: they fail with this reason.
    fails: dict[str, str] = field(default_factory=dict)
    # Work of other workspaces still on a reservation's machines once its window is open: stopped like a
    # preemption (no restart spent), preempted_by the reservation's name, reason "Stopped for reservation <name>".
    reservation_stops: tuple[StopUnit, ...] = ()


# ------------------------------------------------------------------------------- made without __init__

# A frozen dataclass's __init__ sets each field through object.__setattr__; a cycle makes thousands of these (one per
# start and per placed worker), so they are made by setting their slots directly: the same objects.
_new = object.__new__
_set = {cls: tuple(getattr(cls, name).__set__ for name in cls.__dataclass_fields__)
        for cls in (Placement, StartRun)}
_pl_index, _pl_machine, _pl_gpus, _pl_cpu, _pl_memory, _pl_milli, _pl_mig = _set[Placement]
_st_run, _st_placements, _st_backfilled = _set[StartRun]


def placement(worker_index: int, machine: str, gpu_indices: tuple[int, ...], cpu_cores: float,
              memory_bytes: int, gpu_milli: int = 0, mig_devices: tuple = ()) -> Placement:
    """Placement(worker_index, machine, gpu_indices, cpu_cores, memory_bytes, gpu_milli, mig_devices)."""
    p = _new(Placement)
    _pl_index(p, worker_index)
    _pl_machine(p, machine)
    _pl_gpus(p, gpu_indices)
    _pl_cpu(p, cpu_cores)
    _pl_memory(p, memory_bytes)
    _pl_milli(p, gpu_milli)
    _pl_mig(p, mig_devices)
    return p


def start_run(run: str, placements: tuple[Placement, ...], backfilled: bool) -> StartRun:
    """StartRun(run, placements, backfilled)."""
    s = _new(StartRun)
    _st_run(s, run)
    _st_placements(s, placements)
    _st_backfilled(s, backfilled)
    return s


def interned_workers(interned: dict, asks: tuple[tuple, ...]) -> tuple[WorkerRequest, ...]:
    """The workers of a waiting run from their asks, each (index, gpus, cpu cores, memory bytes[, GPU memory bytes,
    MIG profile, MIG count]): one object for equal asks across a snapshot's runs (a cycle reads every run's
    workers: shared ones are read from the cache), made only for the first. Keyed with the GPUs' and cores' types
    too: a share of 1.0 equals the whole GPU 1 in Python but is placed otherwise."""
    key = (asks, tuple(x.__class__ for a in asks for x in a[1:3]))
    hit = interned.get(key)
    if hit is None:
        hit = interned[key] = tuple(WorkerRequest(*a) for a in asks)
    return hit
