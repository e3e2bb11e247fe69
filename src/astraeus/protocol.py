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
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

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
class Register(Body):
    name: str = Field(description="The machine's name (a DNS label), unique in its cluster")
    gpus: Annotated[int, Field(ge=0, le=4096)] = 0
    gpu_models: list[str] = Field(default_factory=list)
    cpu_cores: Annotated[float, Field(ge=0, le=1e6)] = 1.0
    memory_bytes: Annotated[int, Field(ge=0, le=INT64)] = 0
    stop_grace_seconds: Annotated[float, Field(ge=0, le=86400)] = Field(
        30.0, description="Seconds between SIGTERM and SIGKILL when this machine stops a worker (0: at once)")
    labels: dict[str, str] = Field(default_factory=dict)


class Registered(Answer):
    machine: str
    cluster: str
    heartbeat_seconds: float = Field(description="Report at least this often")
    lost_after_seconds: float | None = None


# --------------------------------------------------------------------------------------- assignments
class Mount(Answer):
    """A drive bound into the worker: host_path at mount_path, inside granted_root (never following a symlink
    out of it)."""

    drive: str | None = None
    host_path: str
    mount_path: str
    read_only: bool = False
    create: bool = False
    granted_root: str | None = None


class ConfigFile(Answer):
    """A run's config value, written to a file at mount_path."""

    mount_path: str
    value: str


class Assignment(Answer):
    """Everything the agent needs to start or stop one worker attempt."""

    worker: str
    attempt: Annotated[int, Field(ge=0, le=INT32)]
    run: str = ""
    workspace: str = ""
    desired: Literal["Running", "Stopped"] = Field(
        "Running", description="Stopped: SIGTERM the main process, stop grace, SIGKILL the group")
    stop_reason: str | None = None
    image: str = ""
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    gpu_indices: list[int] = Field(default_factory=list)
    cpu_cores: float | None = None
    memory_bytes: int | None = None
    mounts: list[Mount] = Field(default_factory=list)
    configs: list[ConfigFile] = Field(default_factory=list)
    time_limit_seconds: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker, self.attempt)


class Assignments(Answer):
    version: int
    assignments: list[Assignment] = Field(default_factory=list)


# -------------------------------------------------------------------------------- report (heartbeat)
class WorkerReport(Body):
    """One worker attempt's state as the agent sees it."""

    worker: str
    attempt: Annotated[int, Field(ge=0, le=INT32)]
    state: WorkerState
    pid: Annotated[int, Field(ge=0, le=INT32)] | None = None
    exit_code: Annotated[int, Field(ge=-INT32, le=INT32)] | None = None
    signal: Annotated[int, Field(ge=0, le=255)] | None = None
    message: str | None = None
    environment: str | None = Field(None, description="The local environment the image mapped to")
    started_at: float | None = None
    finished_at: float | None = None
    oom_limit_bytes: Annotated[int, Field(ge=0, le=INT64)] | None = Field(
        None, description="Set when the kernel OOM-killed the worker at its memory limit: that limit")


class Report(Body):
    """The heartbeat: sent on every change and at least every heartbeat_seconds."""

    machine: str
    workers: list[WorkerReport] = Field(default_factory=list)


class Ack(Answer):
    ok: bool = True


# ----------------------------------------------------------------------------------------------- logs
class WorkerLogLine(Body):
    worker: str
    attempt: Annotated[int, Field(ge=0, le=INT32)] = 0
    seq: Annotated[int, Field(ge=0, le=INT32)]
    time: float = 0.0
    stream: Literal["stdout", "stderr"] = "stdout"
    text: str = ""


class Logs(Body):
    machine: str
    lines: list[WorkerLogLine] = Field(default_factory=list)


class LogsStored(Answer):
    ok: bool = True
    stored: int = 0
