"""What every route answers, as pydantic models: the shapes /openapi.json documents and the routers declare
(`response_model=`, or `responses=` where a route answers a JSONResponse of its own for speed).

The views in services.py and the resource modules build the answers as dicts; these models describe them and
change nothing of them: each field is named and ordered as its view writes it, a key a view writes only sometimes
(a run's "history") is a field with a default that the routes leave out when unset (`response_model_exclude_unset`),
and a key no model names yet is kept (`extra="allow"`; tests/api/test_openapi_responses.py fails on one). Times are
the ISO 8601 strings the views write ("2030-01-01T00:00:00Z"). The agent protocol's answers are astraeus.protocol's.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

# A number as the view wrote it: an int stays an int, a float a float (a plain `float` field would turn 8 into 8.0).
Num = Annotated[int | float, WithJsonSchema({"type": "number"})]
Time = Annotated[str, Field(description="UTC, ISO 8601: 2030-01-01T00:00:00Z")]
Spec = Annotated[dict[str, Any], Field(description="The specification as submitted (with defaults filled in)")]


class Out(BaseModel):
    """An answer: keys no field names are kept as they are (never dropped from what users get)."""

    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------------------------------- common


class Deleted(Out):
    name: str
    deleted: bool


class WhyNot(Out):
    """Why a worker is not placed on one machine."""

    machine: str
    reason: str


# ------------------------------------------------------------------------------------------- workspace


class QuotaOut(Out):
    gpus: int | None
    cpu_cores: Num | None
    memory_bytes: int | None
    workers: int | None


class ClusterAccessOut(Out):
    """A workspace's access to one cluster."""

    name: str
    max_priority: int
    weight: Num
    host_paths: list[str]
    host_network: bool
    default_image: str | None = Field(None, description="The image its runs use when they name none")
    max_gpus_per_user: int | None = Field(None, description="The most GPUs one user's runs hold at once here")
    preemption: bool
    pools: list[str] | None = Field(description="The pools it may use (null: every machine of the cluster)")
    quota: QuotaOut


class WorkspaceOut(Out):
    """The workspace as its token sees it."""

    name: str
    id: str = Field(description="The workspace's namespace (ws-...)")
    org: str
    role: str | None
    console_url: str
    clusters: list[ClusterAccessOut]


# ------------------------------------------------------------------------------------------- workers


class WorkerOut(Out):
    name: str
    run: str
    index: int
    state: str
    reason: str | None
    restarts: int
    preemptions: int
    exit_code: int | None
    machine: str | None
    gpu_indices: list[int]
    cpu_cores: Num | None
    memory_bytes: int | None
    attempt: int
    pid: int | None
    image: str | None
    environment: str | None
    placed_at: Time | None
    started_at: Time | None
    finished_at: Time | None
    why_not: list[WhyNot]
    # Issue 46 (docs/gpu-sharing.md), each only where it applies:
    gpu_fraction: Num | None = Field(None, description="The share of its one GPU a fractional worker has (0.5)")
    mig_devices: list[tuple[int, str, int]] | None = Field(
        None, description="A MIG worker's devices, each [gpu, profile, k]: the k-th device of that profile on that "
                          "GPU (e.g. [[0, \"1g.10gb\", 2]])")


class WorkerPage(Out):
    items: list[WorkerOut]
    next_cursor: str | None


# ------------------------------------------------------------------------------------------- runs


class TemplateRef(Out):
    name: str
    version: int | None


class RunMeta(Out):
    created_by: str | None = Field(None, description="Who made it: a user, or service:NAME (null: before users)")
    updated_by: str | None = Field(None, description="Who changed it last (as created_by)")
    name: str
    job_id: int | None = Field(None, description="The run's numeric job id (Slurm's JobID, SLURM_JOB_ID in its "
                                                 "workers): GET runs?job_id=N finds it")
    labels: dict[str, str]
    uid: str
    workspace: str
    namespace: str
    cluster: str
    created_at: Time | None
    template: TemplateRef | None = Field(description="The run template it was made from, at its version then")


class HistoryOut(Out):
    time: Time | None
    state: str
    reason: str | None


class RunStatus(Out):
    state: str
    reason: str | None
    queue_reason: str | None
    workers: list[WorkerOut]
    preemptions: int
    restarts: int
    started_at: Time | None
    finished_at: Time | None
    console_url: str
    console_reason: str | None = Field(None, description="Only while a preempted run waits")
    held: bool = Field(False, description="Held (scontrol hold): it waits, never placed, until released")
    history: list[HistoryOut] | None = Field(None, description="Only when one run is shown")


class RunOut(Out):
    metadata: RunMeta
    spec: Spec
    status: RunStatus


class RunPage(Out):
    items: list[RunOut]
    next_cursor: str | None


class RunDeleted(Deleted):
    state: str


class Placement(Out):
    worker: str
    machine: str
    gpu_indices: list[int]


class WhatIfVictim(Out):
    run: str
    loses_seconds: float = Field(description="Seconds of its work since its last checkpoint (else its start)")
    loses_gpu_seconds: float = Field(description="The same in GPU-seconds (its GPUs, at least one)")
    checkpoint_at: Time | None = Field(description="Its last checkpoint this attempt (null: none yet)")


class WhatIfOut(Out):
    """A dry run's answer (POST /runs?dry_run=true): what the run would do now; nothing is stored."""

    dry_run: bool
    name: str
    cluster: str
    outcome: str = Field(description="Starts | Preempts | Head | Queued | or why it cannot run")
    message: str
    reason: str
    placements: list[Placement]
    backfilled: bool
    preempts: list[str]
    preempts_workers: int
    victims: list[WhatIfVictim] = Field([], description="Each victim run of your workspace and what it loses")
    starts_by: Time | None
    behind: str | None
    why_not: dict[str, list[WhyNot]]


# ------------------------------------------------------------------------------------------- drives


class DriveMeta(Out):
    created_by: str | None = Field(None, description="Who made it: a user, or service:NAME (null: before users)")
    updated_by: str | None = Field(None, description="Who changed it last (as created_by)")
    name: str
    workspace: str
    namespace: str
    cluster: str
    created_at: Time | None


class DriveStatus(Out):
    state: str


class DriveOut(Out):
    metadata: DriveMeta
    spec: Spec
    status: DriveStatus


class DrivePage(Out):
    items: list[DriveOut]
    next_cursor: str | None


# ------------------------------------------------------------------------------------------- events


class EventOut(Out):
    time: Time | None
    kind: str
    object: str | None
    message: str


class EventPage(Out):
    items: list[EventOut]
    next_cursor: str | None


# ------------------------------------------------------------------------------------------- machines


class NfsOut(Out):
    server: str | None = None
    client: bool = False
    rdma: bool = False


class DiskOut(Out):
    path: str | None
    free_bytes: int | None
    total_bytes: int | None
    free_percent: Num | None


class GpuFaultOut(Out):
    index: int
    what: str | None
    xid: int | None
    fatal: bool | None
    at: Time | None


class MachineOut(Out):
    name: str
    cluster: str | None
    state: str
    gpus: int
    pools: list[str]
    gpus_used: int
    gpus_free: int
    gpu_models: list[str]
    cpu_cores: Num | None
    memory_bytes: int | None
    stop_grace_seconds: Num | None
    labels: dict[str, str]
    runtime: str | None
    address: str | None
    shared_filesystems: dict[str, str]
    nfs: NfsOut
    schedulable: bool
    reason: str | None = Field(description="Why it takes no new workers (null: it does, or its state says)")
    disk: DiskOut | None
    last_heartbeat: Time | None
    # Issue 47 (server/health.py): its cordon (null | cordon | drain), why and by whom, its failed GPUs
    cordon: str | None = None
    cordon_reason: str | None = None
    cordon_by: str | None = None
    quarantined_gpus: list[int] = Field(default_factory=list)
    gpu_faults: list[GpuFaultOut] = Field(default_factory=list)
    # Issue 46 (docs/gpu-sharing.md, "MIG devices"): per GPU, its MIG devices by profile; [] without MIG
    gpu_mig: list[dict[str, int]] = Field(
        default_factory=list, description="Per GPU its MIG devices by profile as its agent reports them "
                                          "([{\"1g.10gb\": 7}, {}]); [] on a machine without MIG")
    gpu_mig_used: list[dict[str, int]] = Field(
        default_factory=list, description="Per GPU how many of its MIG devices of each profile workers hold "
                                          "([{\"1g.10gb\": 2}, {}]); [] on a machine without MIG")
    # Issue 46 (docs/gpu-sharing.md): how much of each GPU workers hold, whole, by fractions or by MIG devices
    gpu_allocated: list[Num] = Field(
        default_factory=list, description="Per GPU the part of it workers hold: 1 held whole, 0.5 by fractional "
                                          "workers or MIG devices making half of it, 0 free ([1, 0.5, 0, 0])")
    gpus_allocated: Num = Field(0, description="The GPUs workers hold, fractions and MIG devices counted by their "
                                               "share (gpu_allocated's sum: 1.5); gpus_used counts a GPU shared "
                                               "at all as one")
    gpu_memory_bytes: list[int] = Field(
        default_factory=list, description="Each GPU's memory in bytes as its agent reports it (NVML); [] where "
                                          "none is reported")


class MachinePage(Out):
    items: list[MachineOut]
    next_cursor: str | None


# ------------------------------------------------------------------------------------------- templates


class TemplateMeta(Out):
    created_by: str | None = Field(None, description="Who made it: a user, or service:NAME (null: before users)")
    updated_by: str | None = Field(None, description="Who changed it last (as created_by)")
    name: str
    labels: dict[str, str]
    workspace: str
    namespace: str
    version: int
    created_at: Time | None
    updated_at: Time | None


class TemplateStatus(Out):
    version: int


class TemplateOut(Out):
    metadata: TemplateMeta
    spec: Spec
    status: TemplateStatus


class TemplateList(Out):
    items: list[TemplateOut]


# ------------------------------------------------------------------------------------------- schedules


class ScheduleMeta(Out):
    created_by: str | None = Field(None, description="Who made it: a user, or service:NAME (null: before users)")
    updated_by: str | None = Field(None, description="Who changed it last (as created_by)")
    name: str
    workspace: str
    namespace: str
    created_at: Time | None
    updated_at: Time | None


class TickOut(Out):
    tick: str
    at: Time | None
    outcome: str = Field(description="Created | Skipped | Refused")
    run: str | None
    message: str | None
    handled_at: Time | None


class NextTick(Out):
    tick: str
    at: Time | None


class ScheduleRunOut(Out):
    name: str
    state: str
    created_at: Time | None
    finished_at: Time | None


class ScheduleStatus(Out):
    suspended: bool
    last_tick: TickOut | None
    next_tick: NextTick | None
    active: list[str]
    runs: list[ScheduleRunOut] | None = Field(None, description="Only when one schedule is shown")
    ticks: list[TickOut] | None = Field(None, description="Only when one schedule is shown: the latest ticks")


class ScheduleOut(Out):
    metadata: ScheduleMeta
    spec: Spec
    status: ScheduleStatus


class ScheduleList(Out):
    items: list[ScheduleOut]


# ------------------------------------------------------------------------------------------- replica groups


class GroupMeta(Out):
    created_by: str | None = Field(None, description="Who made it: a user, or service:NAME (null: before users)")
    updated_by: str | None = Field(None, description="Who changed it last (as created_by)")
    name: str
    labels: dict[str, str]
    workspace: str
    namespace: str
    created_at: Time | None
    updated_at: Time | None


class GroupSpecOut(Out):
    replicas: int
    run: Spec


class GroupRunOut(Out):
    name: str
    state: str
    reason: str | None
    created_at: Time | None
    started_at: Time | None
    finished_at: Time | None


class GroupStatus(Out):
    replicas: int
    alive: int
    running: int
    failures: int
    retry_at: Time | None
    runs: list[GroupRunOut]


class ReplicaGroupOut(Out):
    metadata: GroupMeta
    spec: GroupSpecOut
    status: GroupStatus


class ReplicaGroupList(Out):
    items: list[ReplicaGroupOut]


# ------------------------------------------------------------------------------------------- registries


class RegistryOut(Out):
    registry: str
    username: str = Field(description="****** unless the token is an editor's or an admin's; never the password")
    created_at: Time | None
    updated_at: Time | None


class RegistryList(Out):
    items: list[RegistryOut]


class RegistryDeleted(Out):
    registry: str
    deleted: bool


# ------------------------------------------------------------------------------------------- pools


class PoolSelector(Out):
    machines: list[str]
    labels: dict[str, str]


class PoolOut(Out):
    name: str
    cluster: str
    selector: PoolSelector
    machines: list[str]
    gpus: int
    free_gpus: int
    created_at: Time | None


class PoolList(Out):
    items: list[PoolOut]


class WorkspacePoolOut(Out):
    """A pool the workspace may use."""

    name: str
    cluster: str
    machines: list[str]
    gpus: int
    free_gpus: int
    gpu_models: list[str]


class WorkspacePoolList(Out):
    items: list[WorkspacePoolOut]


# ------------------------------------------------------------------------------------------- reservations


class ReservationOut(Out):
    created_by: str | None = Field(None, description="Who made it: a user, or service:NAME (null: before users)")
    updated_by: str | None = Field(None, description="Who changed it last (as created_by)")
    name: str
    cluster: str
    workspaces: list[str]
    machines: list[str]
    pool: str | None
    count: int | None
    start: Time | None
    end: Time | None
    state: str = Field(description="Scheduled | Active | Ended")
    created_at: Time | None


class ReservationList(Out):
    items: list[ReservationOut]


# ------------------------------------------------------------------------------------------- organisation


class OrgWorkspaceOut(Out):
    """A workspace as its organisation's admins see it: its access to each cluster, by cluster name."""

    name: str
    id: str = Field(description="The workspace's namespace (ws-...)")
    clusters: dict[str, ClusterAccessOut]


class OrgWorkspaceList(Out):
    items: list[OrgWorkspaceOut]


class ClusterOut(Out):
    name: str
    preemption: bool
    lost_after_seconds: Num | None
    gpu_sharing: str | None = None  # issue 46: "workspace" (tenants of one workspace share a GPU) or "any"
    # issue 47: victims of equal priority stopped first, "recent" or "least-work-lost" (docs/progress.md)
    preemption_victims: str | None = None
    # issue 46: how machines and GPUs are chosen, "fgd", "bestfit" or "spread" (docs/gpu-sharing.md)
    placement: str | None = None


class ClusterList(Out):
    items: list[ClusterOut]


class TokenIssued(Out):
    """A new token: its secret is shown this once."""

    id: int
    kind: str
    role: str | None
    token: str


class TokenOut(Out):
    id: int
    kind: str
    role: str | None
    revoked: bool
    expires_at: Time | None
    cluster: str | None = Field(None, description="Machine tokens only")
    machine: str | None = Field(None, description="Machine tokens only: the machine it acts for (null: a join token)")


class TokenList(Out):
    items: list[TokenOut]


class TokenRevoked(Out):
    id: int
    revoked: bool


# ------------------------------------------------------------------------------------------- plumbing


class HealthOut(Out):
    role: str = Field(description="leader | follower")
    epoch: int
    database: str = Field(description="ok | unreachable | cannot write")
    reason: str | None = Field(None, description="Why writes fail (only with \"cannot write\")")


# ------------------------------------------------------------------------------------------- usage


class UsageTotals(Out):
    """Usage added up over worker attempts (GPU-hours = GPUs × hours each attempt held its machine)."""

    gpu_hours: Num
    gpu_seconds: Num
    cpu_core_hours: Num
    attempts: int
    preemptions: int
    queue_wait_seconds: Num


class UsageRow(Out):
    """One group's usage: the keys asked for in group_by (cluster, workspace, user, run, gpu_model, day), then its
    totals (as UsageTotals)."""

    cluster: str | None = None
    workspace: str | None = None
    user: str | None = None
    run: str | None = None
    gpu_model: str | None = None
    day: str | None = None
    gpu_hours: Num
    gpu_seconds: Num
    cpu_core_hours: Num
    attempts: int
    preemptions: int
    queue_wait_seconds: Num


class UsageOut(Out):
    since: Time
    until: Time
    group_by: list[str]
    items: list[UsageRow]
    total: UsageTotals


class UsageRecordOut(Out):
    """One worker attempt's usage record."""

    workspace: str
    cluster: str
    run: str
    run_uid: str
    worker: str
    attempt: int
    user: str | None
    pool: str | None
    machine: str | None
    gpu_model: str | None
    gpus: int
    cpu_cores: Num
    memory_bytes: int
    start: Time
    end: Time
    seconds: Num = Field(description="end − start: how long the attempt held its machine")
    gpu_seconds: Num = Field(description="gpus × seconds")
    wait_seconds: Num
    state: str
    reason: str
    preempted_by: str | None


class UsageRecordList(Out):
    since: Time
    until: Time
    items: list[UsageRecordOut]
