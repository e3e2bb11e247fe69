"""The agent protocol (docs/api.md, "Agent API"): the bodies a machine's agent and the control plane exchange,
one pydantic model each, used by both sides.

Agent → control plane (`Body`: an unknown field, or a missing required one, is a 422 naming the field):
  POST /register  `Register`   → `Registered`
  POST /report    `Report` (the heartbeat: every worker's state) → `Ack`
  POST /logs      `Logs`       → `LogsStored`
Control plane → agent (`Answer`: fields this agent does not know are ignored, so a newer control plane can add
some without breaking older agents):
  GET /assignments → `Assignments`: a version and one `Assignment` per worker attempt that belongs here.

Integers are bounded by what the database columns hold.

Worker identity. A worker is named to the agent, in its reports and in its log lines by a cluster-unique
identity, `<workspace ns>.<worker name>.<run uid>` (`worker_identity()`; ns is `ws-<12 hex>`, a worker name a
DNS label, a run's uid 32 hex: the dots split it unambiguously), never by its name alone: two workspaces' runs both
named `train` on one machine are two folders, two processes, two sets of log lines, and a run deleted and submitted
again under the same name is a new worker whose first attempt is its own, even while the old one is still stopping
(an ended attempt's report about the deleted run never reaches the new one). `Assignment.name` is the bare name,
for display. The identity is readable in the agent's folders and process markers and needs no database to
interpret. An older agent named a worker `<ns>.<worker name>` (one dot, no uid); an upgraded agent adopts such a
live worker as the assigned worker of that ns, name and attempt (`Runtime.adopt_as`), so an upgrade mid-run
restarts nothing.

Credentials. `POST /register` is called with a join token (an admin's token of kind "machine", not bound to any
machine) or with the machine's own credential. With a join token, the answer carries `credential`: the
machine's own token, shown this once; the agent keeps it (0600, in its state dir) and uses it for everything
else. A machine credential reads only its own machine's assignments and reports and ships logs only for
workers placed on its machine.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT32 = 2**31 - 1
INT64 = 2**63 - 1

# States an agent reports for a worker attempt.
WorkerState = Literal["Starting", "Running", "Exited", "StartFailed"]


class Body(BaseModel):
    """A body the agent sends: nothing unknown is accepted."""

    model_config = ConfigDict(extra="forbid")


class Answer(BaseModel):
    """A body the control plane sends back."""

    model_config = ConfigDict(extra="ignore")


# ------------------------------------------------------------------------------------------ register
class NfsAbility(Body):
    """What a machine can do for a drive kept on one machine and used from another (found by the agent)."""

    server: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="How it exports a drive it keeps: \"ganesha\" (NFS-Ganesha) or \"kernel\" (nfsd through "
        "exportfs); None: it cannot")
    client: bool = Field(False, description="Its kernel can mount NFS (nfs4 in /proc/filesystems, or mount.nfs4)")
    rdma: bool = Field(False, description="It has an RDMA device (/sys/class/infiniband): NFS over RDMA, port 20049")


class Disk(Body):
    """The filesystem of the agent's state dir (where worker folders, logs and container layers are), as statvfs
    sees it: a machine whose free share falls below the control plane's ASTRAEUS_DISK_PRESSURE_FREE_PERCENT takes
    no new workers (`Disk pressure: 3% free on /var/lib/astraeus`)."""

    path: Annotated[str, Field(max_length=4096)] = Field(description="The agent's state dir")
    free_bytes: Annotated[int, Field(ge=0, le=INT64)] = Field(description="Bytes free for unprivileged users")
    total_bytes: Annotated[int, Field(ge=0, le=INT64)]


class Register(Body):
    name: str = Field(description="The machine's name (a DNS label), unique in its cluster")
    gpus: Annotated[int, Field(ge=0, le=4096)] = 0
    gpu_models: list[str] = Field(default_factory=list)
    gpu_memory_bytes: list[Annotated[int, Field(ge=0, le=INT64)]] = Field(
        default_factory=list, max_length=4096, description="Issue 46: each GPU's memory in bytes, by index (NVML's, or "
        "the simulated agent's --gpu-memory-gib); [] from an older agent: runs asking GPU memory do not fit here")
    gpu_mig: list[dict[str, Annotated[int, Field(ge=0, le=64)]]] = Field(
        default_factory=list, max_length=4096, description="Issue 46: each GPU's MIG devices, profile -> count "
        "({\"1g.10gb\": 7}); {} for a GPU without MIG")
    nvlink_islands: list[list[Annotated[int, Field(ge=0, le=4095)]]] = Field(
        default_factory=list, max_length=4096, description="Issue 46: the GPUs (indices) joined by NVLink or one "
        "NVSwitch, one list per island (NVML's, or the simulated agent's --nvlink-islands); [] none reported: the "
        "machine is one island")
    cpu_cores: Annotated[float, Field(ge=0, le=1e6)] = 1.0
    memory_bytes: Annotated[int, Field(ge=0, le=INT64)] = 0
    stop_grace_seconds: Annotated[float, Field(ge=0, le=86400)] = Field(
        30.0, description="Seconds between SIGTERM and SIGKILL when this machine stops a worker (0: at once)")
    labels: dict[str, str] = Field(default_factory=dict)
    runtime: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="How this machine runs workers: \"container (runc 1.1.5)\" or \"process\" (shown "
        "with the machine; None from an older agent)")
    address: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="The address other machines and the control plane reach this machine at (`--address`, or "
        "the source address of the route to the control plane): rank 0's is a gang's ASTRAEUS_MASTER_ADDR, and NFS "
        "exports are granted to it")
    shared_filesystems: dict[str, str] = Field(
        default_factory=dict, description="Shared filesystems this machine has mounted (`--shared-fs NAME=/mnt/path`):"
        " name -> where it is mounted here. A drive on filesystem NAME is placed only on machines that have it")
    nfs: NfsAbility | None = Field(None, description="What this machine can do for drives across machines (None: "
                                                     "nothing; from an older agent)")
    disk: Disk | None = Field(None, description="Its state dir's filesystem (None: from an older agent)")

    @model_validator(mode="after")
    def _islands_of_its_gpus(self) -> Register:
        """Issue 46: each island names GPUs of this machine, each GPU in one island at most."""
        seen: set[int] = set()
        for island in self.nvlink_islands:
            for g in island:
                if g >= self.gpus:
                    raise ValueError(f"nvlink_islands: GPU {g} is not one of the machine's {self.gpus} GPUs "
                                     f"(indices 0-{self.gpus - 1})")
                if g in seen:
                    raise ValueError(f"nvlink_islands: GPU {g} is in two islands; a GPU is in one island at most")
                seen.add(g)
        return self


class Registered(Answer):
    machine: str
    cluster: str
    heartbeat_seconds: float = Field(description="Report at least this often")
    lost_after_seconds: float | None = None
    credential: str | None = Field(
        None, description="The machine's own credential (a token bound to this machine), shown this once: given "
        "when the agent registered with a join token, None when it registered with its credential (keep it)")


def worker_identity(ns: str, name: str, run_uid: str) -> str:
    """The cluster-unique identity the agent and the control plane name a worker by (see the module docstring)."""
    return f"{ns}.{name}.{run_uid}"


def identity_name(identity: str) -> str:
    """The worker's name in an identity (`<ns>.<name>.<run uid>`, or an older agent's `<ns>.<name>`)."""
    return identity.split(".")[1] if "." in identity else identity


def older_identity(identity: str) -> str:
    """The identity an older agent gave the same worker: `<ns>.<name>`, without the run's uid."""
    return ".".join(identity.split(".")[:2])


# --------------------------------------------------------------------------------------- assignments
class NfsSource(Answer):
    """Where a drive kept on another machine is mounted from: `mount -t nfs4 -o proto=<transport>,port=<port>
    server:export_path`. The agent mounts it (in a child with a deadline, never blocking itself) under its state
    dir, then binds it into the worker like any drive."""

    server: str = Field(description="The keeping machine's address")
    machine: str = Field("", description="The keeping machine's name, for reasons")
    export_path: str = Field(description="Where the drive is in the keeping machine's NFSv4 namespace: "
                                         "/astraeus/<workspace ns>.<drive name>, one flat folder per drive")
    transport: Literal["tcp", "rdma"] = "tcp"
    port: Annotated[int, Field(ge=1, le=65535)] = 2049


class Export(Answer):
    """A folder this machine keeps for a drive, to export over NFS to the machines that run its workers
    elsewhere. The agent's exports are exactly the list it was last given: a folder no longer listed is
    unexported."""

    drive: str = Field(description="`<workspace ns>.<drive name>`, unique in the cluster")
    workspace_number: Annotated[int, Field(ge=1, le=INT32)] | None = Field(
        None, description="The drive's workspace's number: the export maps every client user to that workspace's "
                          "uid (as Assignment.workspace_number), the uid its workers run as")
    path: str = Field(description="The folder on this machine (inside granted_root)")
    granted_root: str | None = None
    clients: list[str] = Field(default_factory=list, description="The addresses allowed to mount it")
    read_only: bool = False
    create: bool = False


class Mount(Answer):
    """A drive bound into the worker: host_path at mount_path, inside granted_root (never following a symlink
    out of it). With `nfs`, host_path is relative to what the agent mounted from the keeping machine."""

    drive: str | None = None
    nfs: NfsSource | None = None
    host_path: str
    mount_path: str
    read_only: bool = False
    create: bool = False
    granted_root: str | None = None
    size_bytes: Annotated[int, Field(ge=1, le=INT64)] | None = Field(
        None, description="The drive's size (`spec.size_bytes`): the agent keeping its folder measures it, and over "
        "it stops every worker there writing to it (`Evicted: drive ckpt over its size (64 MiB)`); older agents "
        "ignore it")


class ConfigFile(Answer):
    """A run's config value, written to a file at mount_path."""

    mount_path: str
    value: str


class RegistryAuth(Answer):
    """The credential of the run's workspace for the registry its image is pulled from (`PUT $API/registries/
    <host>`): given only with a `desired == "Running"` assignment, never to another workspace's worker. The
    password is never in a repr, a log line or an event."""

    registry: str = Field(description="host[:port] as astraeus.imageref.registry_of names it (docker.io for Docker Hub)")
    username: str
    password: str = Field(repr=False)


class Peer(Answer):
    """A gang mate of a worker: its worker address, and its machine's address (the route to it)."""

    address: str
    machine_address: str | None = None


class Assignment(Answer):
    """Everything the agent needs to start or stop one worker attempt."""

    worker: str = Field(description="The worker's identity, `<workspace ns>.<worker name>.<run uid>`: the agent's key")
    name: str = Field("", description="The worker's name in its workspace, for display")
    attempt: Annotated[int, Field(ge=0, le=INT32)]
    run: str = ""
    workspace: str = ""
    workspace_number: Annotated[int, Field(ge=1, le=INT32)] | None = Field(
        None, description="The workspace's number in this control plane, unique: the worker's uid is "
                          "ASTRAEUS_WORKER_UID_BASE + this number, so no two workspaces ever share a uid")
    desired: Literal["Running", "Stopped"] = Field(
        "Running", description="Stopped: SIGTERM the main process, stop grace, SIGKILL the group")
    stop_reason: str | None = Field(
        None, description="Why the control plane stops this attempt, in words (\"Preempted by higher-priority work "
        "(urgent)\", \"Stopping: time limit of 5m reached\", \"Stopping: the run was deleted\", …): the agent writes "
        "it to the worker's ASTRAEUS_STOP_REASON_FILE before SIGTERM")
    image: str = ""
    registry_auth: RegistryAuth | None = Field(
        None, description="The workspace's credential for the image's registry, when it has one (Running only)")
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_fraction: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="Issue 46: the share of its one GPU (gpu_indices[0]) the worker has; the agent runs it as a "
        "CUDA MPS client with that compute share and memory limit (docs/gpu-sharing.md). None: its GPUs whole")
    gpu_memory_bytes: Annotated[int, Field(gt=0, le=INT64)] | None = Field(
        None, description="Issue 46: the GPU memory the run asked (gpu_requests.memory_bytes): a sharing worker's MPS "
        "memory limit; None: its fraction of the GPU's memory")
    mig_devices: list[tuple[int, str, int]] = Field(
        default_factory=list, description="Issue 46: the MIG devices the worker holds, each whole: (gpu, profile, k), "
        "the k-th device of that profile on that GPU as the agent lists them; the agent sets CUDA_VISIBLE_DEVICES to "
        "their UUIDs (names on simulated GPUs)")
    cpu_cores: float | None = None
    memory_bytes: int | None = None
    mounts: list[Mount] = Field(default_factory=list)
    configs: list[ConfigFile] = Field(default_factory=list)
    time_limit_seconds: float | None = None
    signal: dict | None = Field(
        None, description="The spec's task_template.signal ({name, seconds_before_limit, batch_only}): the worker's "
        "supervisor sends it that long before time_limit_seconds, counted from the command's start")
    ephemeral_storage_bytes: Annotated[int, Field(ge=1, le=INT64)] | None = Field(
        None, description="The most disk the worker may use (its work folder, its container's writable layer, its "
        "own /tmp and /dev/shm), measured by the agent: over it the worker is stopped, and its end is reported with "
        "the message `Evicted: disk use over its limit (10 GiB)`")
    network: Literal["isolated", "host"] = Field(
        "isolated", description="isolated: the worker gets a network namespace of its own (astraeus.agent.network); "
        "host: the machine's, where an admin allowed it")
    address: str | None = Field(
        None, description="A gang's worker: its address, chosen by the control plane (cluster-unique, routed between "
        "machines); None: the agent picks one of its machine's own")
    peers: list[Peer] = Field(default_factory=list, description="A gang's other workers: the only workers this one "
                              "reaches, and the only ones that reach it")

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker, self.attempt)


class Assignments(Answer):
    version: int
    assignments: list[Assignment] = Field(default_factory=list)
    exports: list[Export] = Field(default_factory=list, description="The drives this machine exports over NFS")
    epoch: int | None = Field(None, description="The scheduling leader's epoch this answer was made under: an agent "
                                                "ignores an answer older than the newest epoch it has seen")


# -------------------------------------------------------------------------------- report (heartbeat)
class WorkerReport(Body):
    """One worker attempt's state as the agent sees it."""

    worker: str = Field(description="The worker's identity, as its assignment named it")
    attempt: Annotated[int, Field(ge=0, le=INT32)]
    state: WorkerState
    pid: Annotated[int, Field(ge=0, le=INT32)] | None = None
    exit_code: Annotated[int, Field(ge=-INT32, le=INT32)] | None = None
    signal: Annotated[int, Field(ge=0, le=255)] | None = None
    message: str | None = Field(
        None, description="Starting: what the machine is doing (\"Pulling image 127.0.0.1:5000/x:1\"), shown as the "
        "worker's reason; StartFailed: why it could not start")
    environment: str | None = Field(None, description="The local environment the image mapped to")
    started_at: float | None = None
    finished_at: float | None = None
    oom_limit_bytes: Annotated[int, Field(ge=0, le=INT64)] | None = Field(
        None, description="Set when the kernel OOM-killed the worker at its memory limit: that limit")
    progress_at: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        None, description="When the worker last touched its ASTRAEUS_PROGRESS_FILE (None: never, this attempt)")
    progress_text: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="What that file says (\"step 1234\"), its first line")
    checkpoint_at: Annotated[float, Field(allow_inf_nan=False)] | None = Field(
        None, description="When the worker last wrote its ASTRAEUS_CHECKPOINT_FILE (after a checkpoint's save)")


class GpuFault(Body):
    """A GPU's fault as its agent sees it (agent/health.py; issue 47). A fatal one quarantines the GPU until an admin
    clears it; a slowdown (thermal, power) is shown only."""

    index: Annotated[int, Field(ge=0, le=4095)]
    what: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description='In words: "XID 79", "uncorrectable ECC errors (2)", "row remap pending", "not answering", …')
    xid: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    fatal: bool = True


class HealthCheck(Body):
    """The site health-check command's last result (ASTRAEUS_HEALTH_CHECK_COMMAND): a failure drains the machine."""

    ok: bool
    output: Annotated[str, Field(max_length=500)] = Field("", description="Its first line of output, trimmed")


# WorkerReport fields an agent leaves out when None: a control plane older than them takes the report without them
WORKER_REPORT_OPTIONAL = ("progress_at", "progress_text", "checkpoint_at")


class Report(Body):
    """The heartbeat: sent on every change and at least every heartbeat_seconds."""

    machine: str
    workers: list[WorkerReport] = Field(default_factory=list)
    lines: list[WorkerLogLine] | None = Field(
        default=None, description="The last log lines of attempts this report says ended, when they fit one request: "
        "stored (as POST /logs stores them) before the states, in the same transaction")
    disk: Disk | None = Field(None, description="Its state dir's filesystem now (None: from an older agent)")
    gpu_faults: list[GpuFault] | None = Field(None, description="Its GPUs' faults now (None: from an older agent)")
    health_check: HealthCheck | None = Field(None, description="The site health check's last result (None: none)")


class Ack(Answer):
    ok: bool = True


# ----------------------------------------------------------------------------------------------- logs
class WorkerLogLine(Body):
    worker: str = Field(description="The worker's identity, as its assignment named it")
    attempt: Annotated[int, Field(ge=0, le=INT32)] = 0
    seq: Annotated[int, Field(ge=0, le=INT32)]
    time: Annotated[float, Field(allow_inf_nan=False, description="When it was printed (Unix seconds)")] = 0.0
    stream: Literal["stdout", "stderr"] = "stdout"
    text: str = ""


class Logs(Body):
    machine: str
    lines: list[WorkerLogLine] = Field(default_factory=list)


class LogsStored(Answer):
    ok: bool = True
    stored: int = 0


# ------------------------------------------------------------------------ exec, shell and port-forward
# A user's session into a running worker (astraeus.server.exec_sessions): the control plane tells the worker's
# machine of it (GET /api/v1/agent/exec-sessions, a long-poll), and the agent opens a WebSocket back to
# /api/v1/agent/exec-sessions/{id}, which the control plane pairs with the user's. On both WebSockets, binary
# frames are data, their first byte the stream (EXEC_STDIN, EXEC_STDOUT, EXEC_STDERR); text frames are ExecControl.
EXEC_STDIN, EXEC_STDOUT, EXEC_STDERR = 0, 1, 2


class ExecSession(Answer):
    """One session the agent is to open: a command in the worker (`port` None) or a TCP connection to `port`."""

    id: str
    worker: str  # the worker's identity (worker_identity)
    attempt: int = 0
    command: list[str] = Field(default_factory=list)
    tty: bool = False
    cols: int = 80
    rows: int = 24
    port: int | None = None


class ExecSessions(Answer):
    sessions: list[ExecSession] = Field(default_factory=list)


class ExecControl(BaseModel):
    """A text frame: `resize` (cols, rows), `eof` (no more input), `exit` (code: the command's exit status, or
    128 + the signal that ended it), `error` (message: why the session could not go on, in words)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["resize", "eof", "exit", "error"]
    cols: int | None = None
    rows: int | None = None
    code: int | None = None
    message: str | None = None
