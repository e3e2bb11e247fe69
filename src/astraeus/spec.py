"""The public API objects, in the pages' JSON shape, validated by pydantic.

Unknown or misspelt fields are refused (extra="forbid"), so a typo never silently does nothing.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from astraeus.units import check_mig_profile, mig_milli

# Limits, documented in docs/api.md. They keep one run's row and one agent's assignment small.
MAX_CONFIG_BYTES = 1024 * 1024  # all configs of a run together: 1 MiB (a script, a small config file)
MAX_ENV_ENTRIES = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ARGS = 1024
MAX_ARG_BYTES = 128 * 1024
MAX_LABELS = 64
MAX_LABEL_NAME = 63  # a label key's name part, and a label value (as Kubernetes)
MAX_LABEL_PREFIX = 253  # a label key's optional DNS-subdomain prefix
MAX_ENV_BYTES = 256 * 1024  # all env values of a run together
MAX_ENV_NAME = 256
MAX_CONFIGS = 64
MAX_CONFIG_MOUNTS = 16  # mount paths of one config
MAX_DATAVOLUME_REFS = 32
MAX_PATH = 4096  # any path in a spec
MAX_NODE_NAMES = 256  # node_selection.names
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
DEFAULT_RESTART_BUDGET = 10  # the pages: "The preemption does not count against its 10 restarts"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by Astraeus for every worker; a spec cannot override them.
RESERVED_ENV = frozenset({"ASTRAEUS_JOB_NAME", "ASTRAEUS_RUN_NAME", "ASTRAEUS_WORKER_NAME", "ASTRAEUS_WORKER_INDEX",
                          "ASTRAEUS_NUM_WORKERS", "ASTRAEUS_GPU_COUNT", "ASTRAEUS_ATTEMPT", "ASTRAEUS_WORKER_ID",
                          "CUDA_VISIBLE_DEVICES", "SLURM_JOB_NAME", "ASTRAEUS_PROGRESS_FILE",
                          "ASTRAEUS_CHECKPOINT_FILE"})


def check_dns_label(value: str, what: str = "name") -> str:
    if not DNS_LABEL.match(value or ""):
        raise ValueError(
            f"{what} {value!r} is not a DNS label: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def _shown(value: str, n: int = 40) -> str:
    """A value for an error message: quoted, and cut short (a 20 MB label value is not echoed back)."""
    return repr(value) if len(value) <= n else repr(value[:n]) + f"… ({len(value)} characters)"


def check_labels(labels: dict[str, str], what: str = "labels") -> dict[str, str]:
    """Kubernetes' rules: at most 64; a key is an optional DNS-subdomain prefix (≤ 253) and '/', then a name of
    1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit; a value is empty or
    such a name."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{len(labels)} {what}: at most {MAX_LABELS} are allowed")
    for k, v in labels.items():
        prefix, slash, name = k.rpartition("/")
        if slash and not (len(prefix) <= MAX_LABEL_PREFIX and DNS_SUBDOMAIN.match(prefix)):
            raise ValueError(f"{what} key {_shown(k)}: the prefix before '/' must be a DNS subdomain of at most "
                             f"{MAX_LABEL_PREFIX} characters (lowercase letters, digits, '-' and '.')")
        if len(name) > MAX_LABEL_NAME:
            raise ValueError(f"{what} key {_shown(k)}: the name is {len(name)} characters, over the limit of "
                             f"{MAX_LABEL_NAME}")
        if not LABEL_NAME.match(name):
            raise ValueError(f"{what} key {_shown(k)}: use 1-{MAX_LABEL_NAME} letters, digits, '-', '_' and '.', "
                             "starting and ending with a letter or digit (with an optional 'prefix/')")
        if len(v) > MAX_LABEL_NAME:
            raise ValueError(f"{what} value of {_shown(k)} is {len(v)} characters, over the limit of "
                             f"{MAX_LABEL_NAME}")
        if v and not LABEL_NAME.match(v):
            raise ValueError(f"{what} value of {_shown(k)} ({_shown(v)}): use at most {MAX_LABEL_NAME} letters, "
                             "digits, '-', '_' and '.', starting and ending with a letter or digit (or leave it empty)")
    return labels


def check_absolute_path(value: str, what: str) -> str:
    """Lexical checks on a path from a user: absolute, normalised, no NUL, no '..', at most 4096 bytes."""
    if len(value.encode()) > MAX_PATH:
        raise ValueError(f"{what} {_shown(value)} is longer than {MAX_PATH} bytes")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain a NUL byte")
    if not value.startswith("/"):
        raise ValueError(f"{what} {value!r} must be an absolute path (start with /)")
    if ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} must not contain '..'")
    if value != "/" and (value.endswith("/") or posixpath.normpath(value) != value or "//" in value):
        raise ValueError(f"{what} {value!r} is not in normal form: write it as {posixpath.normpath(value)!r}")
    return value


def _nul_free(value, where: str = "") -> None:
    """Refuse NUL characters anywhere in a body: no field means anything with one, and PostgreSQL cannot store them."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where or 'a value'} contains a NUL character: remove it")
    elif isinstance(value, dict):
        for k, v in value.items():
            _nul_free(k, where)
            _nul_free(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _nul_free(v, f"{where}[{i}]")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data):
        _nul_free(data)
        return data


class Metadata(Strict):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if ARRAY_RUN_NAME.match(v or "") and len(v) <= 63:
            return v  # "<job>_<index>": a job array's run (RunCreate checks that its spec.array says so)
        return check_dns_label(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)


class GpuRequests(Strict):
    count: Annotated[int, Field(ge=0, le=4096)] = 0
    # Revision 0009: only machines whose GPU model contains this, case-insensitively ("a100", "H100"); Slurm's
    # `--gres=gpu:<type>:<n>` and `--gpus=<type>:<n>`.
    model: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")] | None = None
    min_per_machine: Annotated[int, Field(ge=1, le=64)] | None = None
    # Issue 46: part of one GPU (count 1), shared with other workers under CUDA MPS limits (docs/gpu-sharing.md):
    # a fraction (0.25), or GPU memory (bytes), or a MIG profile of a machine whose GPUs are partitioned.
    fraction: float | None = None
    memory_bytes: int | None = None
    mig: Annotated[str, Field(min_length=1, max_length=32)] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # The shared-GPU keys appear only where asked: specs of whole-GPU runs read as before issue 46.
        out = handler(self)
        for k in ("fraction", "memory_bytes", "mig"):
            if isinstance(out, dict) and out.get(k) is None:
                out.pop(k, None)
        return out

    @model_validator(mode="after")
    def _shared(self) -> GpuRequests:
        asked = [k for k in ("fraction", "memory_bytes", "mig") if getattr(self, k) is not None]
        if not asked:
            return self
        k = asked[0]
        if len(asked) > 1:
            raise ValueError(f"gpu_requests: give one of {' or '.join(asked)}, not both")
        if self.mig is not None:  # `count` MIG devices of the profile, on one machine (docs/gpu-sharing.md)
            try:
                check_mig_profile(self.mig)
            except ValueError as e:
                raise ValueError(f"gpu_requests.mig: {e}") from None
            if self.count < 1:
                raise ValueError("gpu_requests.mig: set count to how many MIG devices of the profile (1 or more)")
            if self.min_per_machine is not None:
                raise ValueError("gpu_requests.mig: MIG devices are for one worker on one machine: leave out "
                                 "min_per_machine")
            return self
        if self.count != 1:
            raise ValueError(f"gpu_requests.{k} is part of one GPU: set count to 1 (it is {self.count})")
        if self.min_per_machine is not None:
            raise ValueError(f"gpu_requests.{k} is part of one GPU: leave out min_per_machine")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise ValueError(f"gpu_requests.fraction must be between 0 and 1 (e.g. 0.25), not {self.fraction}; "
                             "for whole GPUs leave it out and set count")
        if self.fraction is not None and round(self.fraction * 1000) < 1:
            raise ValueError(f"gpu_requests.fraction {self.fraction} is under a thousandth of a GPU: ask 0.001 or more")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"gpu_requests.memory_bytes must be more than 0, not {self.memory_bytes}")
        return self


class PerGpu(Strict):
    cpu_cores: Annotated[float, Field(gt=0, le=4096)] | None = None
    memory_bytes: Annotated[int, Field(gt=0)] | None = None


class NodeSelection(Strict):
    mode: Literal["Any", "Names", "Labels"] = "Any"
    names: list[str] = Field(default_factory=list, max_length=MAX_NODE_NAMES)
    labels: dict[str, str] = Field(default_factory=dict)
    # Revision 0009: only machines of these pools (with any mode); and a reservation the run waits for and runs in.
    pools: list[str] = Field(default_factory=list, max_length=64)
    reservation: str | None = None
    # Issue 46: a gang's machines all in one network block (or rack): {"same": "block"} (machine labels
    # topology.astraeus.io/block, /rack; scheduler/topology.py).
    topology: dict[str, str] | None = None

    @field_validator("topology")
    @classmethod
    def _topology(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if not v:
            return None
        extra = sorted(set(v) - {"same"})
        if extra:
            raise ValueError(f"unknown key {extra[0]!r}: the one key is \"same\", as in {{\"same\": \"block\"}}")
        if v.get("same") not in ("block", "rack"):
            raise ValueError(f"\"same\" must be \"block\" or \"rack\", not {v.get('same')!r}")
        return v

    @field_validator("pools")
    @classmethod
    def _pools(cls, v: list[str]) -> list[str]:
        for n in v:
            check_dns_label(n, "pool name")
        return v

    @field_validator("reservation")
    @classmethod
    def _reservation(cls, v: str | None) -> str | None:
        return v if v is None else check_dns_label(v, "reservation name")

    @field_validator("names")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for n in v:
            check_dns_label(n, "machine name")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)


class RequestedResources(Strict):
    cpu_cores: Annotated[float, Field(gt=0, le=100_000)] | None = None
    memory_bytes: Annotated[int, Field(gt=0)] | None = None
    gpu_requests: GpuRequests = Field(default_factory=GpuRequests)
    machines: Annotated[int, Field(ge=1, le=1024)] | None = None
    per_gpu: PerGpu | None = None
    node_selection: NodeSelection = Field(default_factory=NodeSelection)
    # Issue 42: the most disk each worker may use (work folder, writable layer, its own /tmp and /dev/shm), measured
    # by its agent; over it the worker is evicted under its restart policy. None: the cluster's default (if any).
    ephemeral_storage_bytes: Annotated[int, Field(gt=0, le=2**63 - 1)] | None = None


class DatavolumeRef(Strict):
    name: str
    mount_path: str
    mode: Literal["ReadWrite", "ReadOnly"] = "ReadWrite"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, "drive name")

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, v: str) -> str:
        check_absolute_path(v, "mount_path")
        if v == "/":
            raise ValueError("mount_path must not be /")
        return v


class EnvValue(Strict):
    """An env entry given as an object: `{"value": "...", "secret": true}`. A secret value reaches the worker
    but is never shown back (API, console, CLI): it reads "******" there."""

    value: str
    secret: bool = False


def env_values(env: dict | None) -> dict[str, str]:
    """NAME → value, whether each entry was given as a string or as {"value": ..., "secret": ...}."""
    out = {}
    for k, v in (env or {}).items():
        if isinstance(v, EnvValue):
            v = v.value
        elif isinstance(v, dict):
            v = v.get("value", "")
        out[k] = v
    return out


class ConfigFile(Strict):
    mounts: list[str] = Field(min_length=1, max_length=MAX_CONFIG_MOUNTS)
    value: str
    secret: bool = False  # never shown back (API, console, CLI); the worker still gets the file

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            check_absolute_path(m, "configs mount")
            if m == "/":
                raise ValueError("a configs mount must be a file path, not /")
        return v


# The signals a run may ask for before its time limit (Slurm's --signal names; a number 1-64 too)
SIGNAL_NAMES = ("HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "CONT", "URG", "ALRM", "XCPU", "PWR", "WINCH")


class SignalSpec(Strict):
    """Slurm's `--signal=[B:]SIG@SECS`: the worker's processes (`batch_only`: its main process alone, Slurm's batch
    shell) get SIG `seconds_before_limit` seconds before its time limit; it then runs on to its end or the limit."""

    name: str = Field(description="USR1, SIGUSR1, or a number from 1 to 64")
    seconds_before_limit: Annotated[int, Field(ge=0, le=365 * 86400)] = 60
    batch_only: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        s = v.strip().upper().removeprefix("SIG")
        if s in SIGNAL_NAMES or (s.isdigit() and 0 < int(s) < 65 and int(s) not in (9, 19)):
            return s
        raise ValueError(f"signal {v!r} is not one a worker can be sent before its time limit: give one of "
                         f"{', '.join(SIGNAL_NAMES)} (or its number)")


class InteractiveSpec(Strict):
    """An interactive run's (srun --pty, salloc): `idle_timeout_seconds`, how long it may run with no exec or shell
    session attached before it ends (None: as long as its time limit allows)."""

    idle_timeout_seconds: Annotated[int, Field(ge=1, le=365 * 86400)] | None = None


class TaskTemplate(Strict):
    image: str = Field(min_length=1, max_length=512)
    command: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str | EnvValue] = Field(default_factory=dict)
    restart_policy: Literal["OnFailure", "Never"] = "OnFailure"
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = DEFAULT_RESTART_BUDGET
    time_limit_seconds: Annotated[int, Field(gt=0, le=365 * 86400)] | None = None
    signal: SignalSpec | None = None  # sent before time_limit_seconds, which it needs
    requested_resources: RequestedResources = Field(default_factory=RequestedResources)
    datavolume_refs: list[DatavolumeRef] = Field(default_factory=list, max_length=MAX_DATAVOLUME_REFS)
    configs: list[ConfigFile] = Field(default_factory=list, max_length=MAX_CONFIGS)
    # "isolated": a network namespace of its own per worker; "host": the machine's, where an admin allows it
    network: Literal["isolated", "host"] = "isolated"

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        from astraeus.imageref import ImageRef

        ImageRef.parse(v)  # a ValueError says what to change
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        if len(v) > MAX_ARGS:
            raise ValueError(f"at most {MAX_ARGS} args")
        if sum(len(a.encode()) for a in v) > MAX_ARG_BYTES:
            raise ValueError(f"args are larger than {MAX_ARG_BYTES // 1024} KiB in all: put long input in configs")
        if any("\x00" in a for a in v):
            raise ValueError("args must not contain NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str | EnvValue]) -> dict[str, str | EnvValue]:
        if len(v) > MAX_ENV_ENTRIES:
            raise ValueError(f"at most {MAX_ENV_ENTRIES} env entries")
        for k, val in env_values(v).items():
            if len(k) > MAX_ENV_NAME:
                raise ValueError(f"env name {_shown(k)} is longer than {MAX_ENV_NAME} characters")
            if not ENV_NAME.match(k):
                raise ValueError(f"env name {k!r} is not a valid variable name (letters, digits, _)")
            if k in RESERVED_ENV:
                raise ValueError(f"env name {k!r} is set by Astraeus and cannot be set in the spec")
            if len(val.encode()) > MAX_ENV_VALUE_BYTES:
                raise ValueError(f"env {k} is larger than {MAX_ENV_VALUE_BYTES // 1024} KiB: put it in configs")
            if "\x00" in val:
                raise ValueError(f"env {k} must not contain NUL bytes")
        total = sum(len(val.encode()) for val in env_values(v).values())
        if total > MAX_ENV_BYTES:
            raise ValueError(f"env values are {total} bytes in all, over the limit of {MAX_ENV_BYTES // 1024} KiB: "
                             "put large values in configs")
        return v

    @field_validator("configs")
    @classmethod
    def _configs(cls, v: list[ConfigFile]) -> list[ConfigFile]:
        total = sum(len(c.value.encode()) for c in v)
        if total > MAX_CONFIG_BYTES:
            raise ValueError(
                f"configs are {total} bytes in all, over the limit of {MAX_CONFIG_BYTES} bytes (1 MiB): "
                "put large files on a drive"
            )
        return v

    @model_validator(mode="after")
    def _shape(self) -> TaskTemplate:
        rr = self.requested_resources
        gpus = rr.gpu_requests.count
        mpm = rr.gpu_requests.min_per_machine
        if rr.machines is not None and mpm is not None and gpus and gpus != rr.machines * mpm:
            raise ValueError(
                f"requested_resources: gpu_requests.count {gpus} is not machines {rr.machines} × min_per_machine {mpm}"
            )
        machines = worker_count(self)
        if rr.gpu_requests.fraction is not None and machines != 1:
            raise ValueError(f"requested_resources: gpu_requests.fraction is part of one GPU for one worker; "
                             f"leave out machines (it is {machines})")
        if rr.gpu_requests.mig is not None and machines != 1:
            raise ValueError(f"requested_resources: gpu_requests.mig devices are for one worker on one machine; "
                             f"leave out machines (it is {machines})")
        if gpus % machines:
            raise ValueError(
                f"requested_resources: gpu_requests.count {gpus} does not divide evenly over {machines} machines"
            )
        if self.signal is not None and self.time_limit_seconds is None:
            raise ValueError(f"signal: SIG{self.signal.name} is sent {self.signal.seconds_before_limit} s before the "
                             "time limit: give time_limit_seconds too (sbatch --time)")
        paths = [d.mount_path for d in self.datavolume_refs] + [m for c in self.configs for m in c.mounts]
        if len(set(paths)) != len(paths):
            raise ValueError("two drives or configs are mounted at the same path")
        return self


def worker_count(t: TaskTemplate) -> int:
    """One worker per machine: `machines`, else count / min_per_machine, else 1."""
    rr = t.requested_resources
    if rr.machines:
        return rr.machines
    if rr.gpu_requests.min_per_machine and rr.gpu_requests.count:
        return max(1, rr.gpu_requests.count // rr.gpu_requests.min_per_machine)
    return 1


def worker_resources(t: TaskTemplate) -> tuple[int, float, int]:
    """(gpus, cpu_cores, memory_bytes) of each worker.

    cpu_cores and memory_bytes are for the whole run, split over its machines; `per_gpu` multiplies by the
    worker's GPUs instead. Without either: 1 core and 1 GiB per worker.
    """
    rr = t.requested_resources
    n = worker_count(t)
    gpus = rr.gpu_requests.count // n
    if rr.gpu_requests.fraction is not None:
        gpus = rr.gpu_requests.fraction  # issue 46: part of one GPU (a float: the scheduler shares a GPU)
    elif rr.gpu_requests.mig is not None:  # issue 46: MIG devices count as their slices of a GPU (N/7 each)
        gpus = mig_milli(rr.gpu_requests.mig, rr.gpu_requests.count) / 1000
    cpu = rr.cpu_cores / n if rr.cpu_cores else None
    mem = rr.memory_bytes // n if rr.memory_bytes else None
    if rr.per_gpu and gpus:
        if rr.per_gpu.cpu_cores and cpu is None:
            cpu = rr.per_gpu.cpu_cores * gpus
        if rr.per_gpu.memory_bytes and mem is None:
            mem = rr.per_gpu.memory_bytes * gpus
    return gpus, cpu if cpu is not None else 1.0, mem if mem is not None else 1 << 30


def priority_allowed(priority: int, maximum: int) -> bool:
    """A workspace may ask for priorities up to its maximum on the cluster. Negative priorities are always
    allowed (a scavenger run needs no grant), even where an organisation admin set a negative maximum."""
    return priority < 0 or priority <= maximum


def highest_priority_allowed(maximum: int) -> int:
    """The highest priority a run may ask for under `maximum` (what the console's hint shows): the maximum, or
    -1 where an admin set a negative maximum, since negative priorities are always allowed."""
    return max(maximum, -1)


ARRAY_RUN_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?_[0-9]+$")
MAX_ARRAY_INDEX = 1_000_000


class ArraySpec(Strict):
    """This run is task `index` of job array `job` (Slurm's `--array`): named `<job>_<index>`; at most
    `max_running` runs of the array run at once; its workers get SLURM_ARRAY_* and ASTRAEUS_ARRAY_INDEX."""

    job: str
    index: Annotated[int, Field(ge=0, le=MAX_ARRAY_INDEX)]
    count: Annotated[int, Field(ge=1, le=MAX_ARRAY_INDEX + 1)]
    min_index: Annotated[int, Field(ge=0, le=MAX_ARRAY_INDEX)] | None = None
    max_index: Annotated[int, Field(ge=0, le=MAX_ARRAY_INDEX)] | None = None
    max_running: Annotated[int, Field(ge=1, le=MAX_ARRAY_INDEX + 1)] | None = None

    @field_validator("job")
    @classmethod
    def _job(cls, v: str) -> str:
        return check_dns_label(v, "array job")

    @model_validator(mode="after")
    def _range(self) -> ArraySpec:
        lo = 0 if self.min_index is None else self.min_index
        hi = self.count - 1 if self.max_index is None else self.max_index
        if not lo <= self.index <= hi:
            raise ValueError(f"index {self.index} is outside the array's indices {lo}-{hi} (min_index, max_index)")
        if len(f"{self.job}_{self.index}") > 63:
            raise ValueError(f"the run name {self.job}_{self.index} is longer than 63 characters: use a shorter job")
        return self


def array_env(array: dict | None) -> dict[str, str]:
    """A job array's run's environment (from its stored spec.array): Slurm's names, and ASTRAEUS_ARRAY_INDEX."""
    if not array:
        return {}
    lo = array.get("min_index")
    hi = array.get("max_index")
    return {
        "ASTRAEUS_ARRAY_INDEX": str(array["index"]),
        "ASTRAEUS_ARRAY_JOB": array["job"],
        "SLURM_ARRAY_JOB_ID": array["job"],
        "SLURM_ARRAY_TASK_ID": str(array["index"]),
        "SLURM_ARRAY_TASK_COUNT": str(array["count"]),
        "SLURM_ARRAY_TASK_MIN": str(0 if lo is None else lo),
        "SLURM_ARRAY_TASK_MAX": str(array["count"] - 1 if hi is None else hi),
    }


DEPENDENCY_TYPES = ("afterok", "afterany", "afternotok", "singleton")


class DependencySpec(Strict):
    """Slurm's `--dependency`: the run stays Pending until the runs it names (a job array's name: all its runs)
    have ended as `type` asks, and fails when that can no longer be; `singleton`: until no run of its job (its
    array, or its name) submitted before it is still live."""

    type: Literal["afterok", "afterany", "afternotok", "singleton"]
    runs: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("runs")
    @classmethod
    def _runs(cls, v: list[str]) -> list[str]:
        for name in v:
            if not (ARRAY_RUN_NAME.match(name or "") and len(name) <= 63):
                check_dns_label(name, "run")
        return v

    @model_validator(mode="after")
    def _needs_runs(self) -> DependencySpec:
        if self.type == "singleton" and self.runs:
            raise ValueError("singleton names no runs: it waits for the earlier runs of its own job")
        if self.type != "singleton" and not self.runs:
            raise ValueError(f"{self.type} needs the runs it waits for, e.g. {{\"type\": \"{self.type}\", "
                             "\"runs\": [\"prep\"]}")
        return self


def _check_pattern(v: str | None) -> str | None:
    if v is None:
        return v
    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"{v!r} is not a regular expression ({e}): write e.g. \"step (\\\\d+)\"") from None
    return v


class ProgressSpec(Strict):
    """Hung runs (docs/progress.md): without progress for stall_seconds, on_stall decides."""

    stall_seconds: Annotated[int, Field(ge=1, le=30 * 86400)]
    pattern: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    on_stall: Literal["restart", "fail", "notify"] = "notify"

    _pattern = field_validator("pattern")(classmethod(lambda cls, v: _check_pattern(v)))


class CheckpointSpec(Strict):
    """The least work lost (docs/progress.md): a log line matching `pattern` reports a checkpoint."""

    pattern: Annotated[str, Field(min_length=1, max_length=200)] | None = None

    _pattern = field_validator("pattern")(classmethod(lambda cls, v: _check_pattern(v)))


class RunSpecBody(Strict):
    priority: Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)] = 0
    start: Literal["Gang", "Independent"] = "Gang"
    cluster: str | None = None
    template: str | None = Field(None, description="The run template this run's spec was completed from "
                                                   "(astraeus.templates): its fields under the run's own")
    array: ArraySpec | None = None
    dependency: DependencySpec | None = None
    progress: ProgressSpec | None = None  # hung runs (docs/progress.md)
    checkpoint: CheckpointSpec | None = None  # the least work lost (docs/progress.md)
    # false (Slurm's --no-requeue): a preempted run is not queued again; it ends Cancelled, its reason says why
    requeue: bool = True
    # true (sbatch -H/--hold): submitted held, in the submit's own transaction; `scontrol release` lets it start
    held: Annotated[bool, Field(strict=True)] = False
    interactive: InteractiveSpec | None = None
    task_template: TaskTemplate

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        return None if v is None else check_dns_label(v, "template")


class RunCreate(Strict):
    metadata: Metadata
    spec: RunSpecBody

    @model_validator(mode="after")
    def _array_name(self) -> RunCreate:
        name, array = self.metadata.name, self.spec.array
        if "_" in name and (array is None or name != f"{array.job}_{array.index}"):
            check_dns_label(name)  # only a job array's run is named "<job>_<index>"
        return self


class DriveSource(Strict):
    """Where a drive's bytes are: a folder on one machine (`node`, `path` on it: a worker on that machine binds it, a
    worker elsewhere mounts it over NFS), or a folder of a shared filesystem that machines have mounted already
    (`filesystem`, `path` inside it: a worker is placed only on machines that declare that filesystem)."""

    node: str | None = None
    filesystem: str | None = None
    path: str
    mount_path: str
    mode: Literal["ReadWrite", "ReadOnly"] = "ReadWrite"

    @field_validator("node")
    @classmethod
    def _node(cls, v: str | None) -> str | None:
        return None if v is None else check_dns_label(v, "node")

    @field_validator("filesystem")
    @classmethod
    def _filesystem(cls, v: str | None) -> str | None:
        return None if v is None else check_dns_label(v, "filesystem")

    @model_validator(mode="after")
    def _one_place(self):
        if (self.node is None) == (self.filesystem is None):
            raise ValueError("give either node (a drive on one machine: its name) or filesystem (a shared filesystem "
                             "the machines have mounted: its name, as the agents declare it with --shared-fs), not "
                             + ("both" if self.node else "neither"))
        return self

    def where(self) -> str:
        """For events and messages: `gpu-01 at /data/x` or `shared filesystem lab at /x`."""
        return f"{self.node} at {self.path}" if self.node else f"shared filesystem {self.filesystem} at {self.path}"

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_absolute_path(v, "path")

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, v: str) -> str:
        check_absolute_path(v, "mount_path")
        if v == "/":
            raise ValueError("mount_path must not be /")
        return v


class DrivePermissions(Strict):
    create: bool = False


class DriveSpecBody(Strict):
    sources: list[DriveSource] = Field(min_length=1, max_length=1)
    transport: Literal["Auto", "TCP", "RDMA"] = "Auto"
    permissions: DrivePermissions = Field(default_factory=DrivePermissions)
    # The most its folder may hold, measured by the agent of the machine keeping it (agent/disk.py): over it, the
    # workers there writing to it are evicted. A whole number of bytes (strict: "64Mi" or "5" is refused by name).
    size_bytes: Annotated[int, Field(strict=True, gt=0, le=2**63 - 1)] | None = None


class DriveCreate(Strict):
    metadata: Metadata
    spec: DriveSpecBody


def check_address(value: str) -> str:
    """A machine's address: an IPv4 or IPv6 address, in its normal form."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address (such as 10.0.0.12 or fd00::12)") from None


def parse_shared_filesystems(items: list[str]) -> dict[str, str]:
    """`NAME=/mnt/path` entries (a machine's shared filesystems) to {name: path}; ValueError naming the bad one."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in items):
        if not item:
            continue
        name, eq, path = item.partition("=")
        name, path = name.strip(), path.strip()
        path = path.rstrip("/") or path  # /mnt/lab/ is /mnt/lab
        if not eq or not name or not path:
            raise ValueError(f"{item!r}: write NAME=/mnt/path (the filesystem's name, then where it is mounted here)")
        try:
            check_dns_label(name, "shared filesystem name")
            check_absolute_path(path, "shared filesystem path")
        except ValueError as e:
            raise ValueError(f"{item!r}: {e}") from None
        if name in out and out[name] != path:
            raise ValueError(f"shared filesystem {name} is given twice ({out[name]} and {path})")
        out[name] = path
    return out


def check_host_path(value: str) -> str:
    """A host path grant: `/abs/path` (folders on the machines) or `NAME:/path` (inside shared filesystem NAME)."""
    name, colon, rest = value.partition(":")
    if colon and not value.startswith("/"):
        check_dns_label(name, f"host path {value!r}: shared filesystem name")
        check_absolute_path(rest, f"host path {value!r}: path inside shared filesystem {name}")
        return value
    return check_absolute_path(value, "host path")


def granted_root(source: dict, host_paths: list[str]) -> str | None:
    """The grant (one of `host_paths`) a drive source lies within, or None: a machine folder needs a `/path` grant,
    a shared filesystem's folder a `NAME:/path` grant of that filesystem."""
    fs = source.get("filesystem")
    for root in host_paths or []:
        name, colon, rest = root.partition(":")
        if fs:
            if colon and not root.startswith("/") and name == fs and path_within(source["path"], rest):
                return root
        elif root.startswith("/") and path_within(source["path"], root):
            return root
    return None


def path_within(path: str, root: str) -> bool:
    """True when `path` is `root` or below it (so /data/astraeus-evil is not within /data/astraeus)."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"
