"""ProcessRuntime: runs each worker attempt's command on the host (like Slurm without containers).

Layout under `state_dir/workers/<worker>.<attempt>/`, where <worker> is the worker's identity (`Assignment.worker`,
`<workspace ns>.<name>`: two workspaces' workers of one name are two folders; astraeus.protocol). A folder an
older agent made, `<name>.<attempt>`, is found again under the identity its spec.json's ASTRAEUS_JOB_NAME gives
(`<ns>.<run>`), so workers started before an upgrade are adopted, not restarted:
  spec.json     what the shim runs (written by the runtime; the shim rewrites it if the folder is wiped)
  shim.json     the shim's pid and create time (written first thing by the shim)
  started.json  the command's pid, create time, pgid, cgroup (the command's PID is the worker's main process)
  failed.json   {"message"}: the attempt could not start (StartFailed)
  stop.json     {"grace", "requested_at"}: a stop request, read by the shim (SIGUSR1 wakes it)
  exit.json     {"exit_code", "signal", "killed", "finished_at", "message"}: written by the shim when it ends
  log.jsonl     one {"seq", "time", "stream", "text"} per output line
  shim.log      the shim's own diagnostics
  work/         the default working directory of the command

Each worker gets its own session/process group, its own private mount namespace (drives and configs are bind
mounts that exist only there), its cgroup(s) (<hierarchy>/astraeus/<owner>-<id> on cgroup v2 and/or v1:
its memory, CPU quota, pids limit and GPU device nodes are enforced there, and the whole tree is SIGKILLed
through it; astraeus.agent.runtime.cgroups), and the marker ASTRAEUS_WORKER_ID=<owner>:<worker>.<attempt> in its
environment (inherited by every descendant) so escaped processes are found even without a cgroup or records.
`owner` is derived from the state dir, so several agents on one host (a local cluster) never touch each
other's workers.

Isolation (spec.json "isolation", astraeus.agent.runtime.mounts): the command runs as its workspace's
unprivileged user, with no capabilities and no_new_privs, in its own PID namespace and its own view of the
machine (the host read-only, a private /tmp, the agent's state dir and home hidden). Mount points are made in
that view only, never on the host. Configs are written under the worker folder (0440, root:the worker's group)
and bind-mounted read-only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import psutil
from pydantic import ValidationError

from astraeus import rendezvous
from astraeus.agent.gpus import gpu_deny_rules, gpu_device_nodes, nvml_minor_numbers
from astraeus.agent.runtime import cgroups, mounts, native
from astraeus.agent.runtime.base import (
    EXITED,
    RUNNING,
    START_FAILED,
    STARTING,
    LogLine,
    Runtime,
    StartFailed,
    WorkerStatus,
)
from astraeus.agent.runtime.images import ImageMap
from astraeus.agent.runtime.launcher import Launcher
from astraeus.agent.runtime.progress import progress_env
from astraeus.agent.runtime.shim import stat_fields
from astraeus.agent.slurm import BIN as SLURM_BIN
from astraeus.protocol import Assignment
from astraeus.settings import agent_settings, environment, internal

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
SHIM_MODULE = "astraeus.agent.runtime.shim"
log = logging.getLogger("astraeus.agent.runtime")
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def _write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # env values: 0600
        json.dump(obj, f)
    os.replace(tmp, path)


# (pid, create time) -> that process's start time in clock ticks (field 22 of /proc/PID/stat), once psutil matched
# it: the next checks read /proc/PID/stat once (the agent checks each live attempt's shim at every look at it).
_START_TICKS: dict[tuple[int, float], int] = {}


def _alive(pid: int | None, ctime: float | None) -> bool:
    """Is `pid` still the process that was started at `ctime` (guards against PID reuse), and not a zombie?"""
    if not pid:
        return False
    ticks = _START_TICKS.get((pid, ctime)) if ctime is not None else None
    if ticks is not None:
        fields = stat_fields(pid)
        return fields is not None and len(fields) > 19 and int(fields[19]) == ticks and fields[0] != "Z"
    try:
        p = psutil.Process(pid)
        if ctime is not None and abs(p.create_time() - ctime) > 0.05:
            return False
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    if ctime is not None:
        fields = stat_fields(pid)
        if fields is not None and len(fields) > 19 and fields[0] != "Z":
            if len(_START_TICKS) >= 10_000:
                _START_TICKS.clear()
            # the same process as psutil's (its start time cannot change; a reused pid has another)
            _START_TICKS[(pid, ctime)] = int(fields[19])
    return True


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _scan_env(prefix: bytes) -> dict[int, str]:
    """pid -> value for every process whose environment has a variable starting with `prefix`."""
    found: dict[int, str] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        for item in _environ(int(name)):
            if item.startswith(prefix):
                found[int(name)] = item[len(prefix):].decode(errors="replace")
                break
    return found


def find_cgroup_root() -> str | None:
    """A folder this process may create worker cgroups in (v2 first, else v1), or None
    (astraeus.agent.runtime.cgroups.detect() has them all)."""
    return cgroups.detect().root


def signal_plan(a: Assignment) -> dict | None:
    """What the worker's supervisor sends before the time limit (spec task_template.signal): the signal's number,
    how long after the command's start, and whether to its main process alone (Slurm's `B:`)."""
    if not a.signal or not a.time_limit_seconds:
        return None
    name = str(a.signal.get("name") or "USR1")
    signo = int(name) if name.isdigit() else int(signal.Signals["SIG" + name])
    after = max(0.0, float(a.time_limit_seconds) - float(a.signal.get("seconds_before_limit") or 0))
    return {"signo": signo, "name": name, "after": after, "batch_only": bool(a.signal.get("batch_only"))}


def job_hosts(env: dict[str, str], configs: list[dict]) -> list[dict]:
    """A multi-machine job's /etc/hosts (rendezvous.hosts_file: the machine's, then each of SLURM_JOB_NODELIST's
    names at its address in ASTRAEUS_NODE_ADDRS) as a config, unless the run brings its own or is no gang."""
    names = [n for n in env.get("SLURM_JOB_NODELIST", "").split(",") if n]
    addrs = [a for a in env.get("ASTRAEUS_NODE_ADDRS", "").split(",") if a]
    if (len(names) < 2 or len(names) != len(addrs) or any("[" in n for n in names)
            or any(c.get("mount_path") == "/etc/hosts" for c in configs)):
        return []
    try:
        with open("/etc/hosts") as f:
            base = f.read()
    except OSError:
        base = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    return [{"mount_path": "/etc/hosts", "value": rendezvous.hosts_file(base, names, addrs)}]


class ProcessRuntime(Runtime):
    SHIM_PRELOAD: tuple[str, ...] = ()  # modules the shim launcher imports beyond the shim's own (Launcher)
    SHIM_MODULE = SHIM_MODULE  # the shim's entry: `python -m` it, or the launcher calls its main()

    def __init__(self, state_dir: str, image_map: ImageMap | None = None, stop_grace: float = 30.0,
                 use_cgroups: bool = True, start_timeout: float = 30.0, pids_max: int | None = None,
                 device_dir: str = "/dev", networks=None):
        self.state_dir = os.path.abspath(state_dir)
        # Each worker's own network (astraeus.agent.network.WorkerNetworks, set up by the agent); None: workers
        # share the machine's network
        self.networks = networks
        self.workers_dir = os.path.join(self.state_dir, "workers")
        os.makedirs(self.workers_dir, mode=0o700, exist_ok=True)
        for folder in (self.state_dir, self.workers_dir):  # workers' env, configs and logs: the agent's only
            os.chmod(folder, 0o700)
        self.owner = hashlib.sha1(os.path.realpath(self.state_dir).encode()).hexdigest()[:12]
        self.image_map = image_map or agent_settings().images()
        self.stop_grace = float(stop_grace)
        # Worker cgroups (limits, and killing a whole tree): v2 and/or v1 hierarchies; none without cgroups.
        self.cgroups = cgroups.detect() if use_cgroups else cgroups.Hierarchies()
        self.cgroup_root = self.cgroups.root
        if pids_max is None:
            pids_max = agent_settings().worker_pids_max
        self.pids_max = int(pids_max)  # 0: no limit
        self.device_dir = device_dir  # where the GPU device nodes are (/dev/nvidia<N>)
        self._gpu_minors: dict[int, int] | None = None
        self.start_timeout = start_timeout
        self._final: dict[tuple[str, int], WorkerStatus] = {}
        self._specs: dict[tuple[str, int], dict] = {}  # a live attempt's environment and created_at (spec.json)
        self._shims: dict[tuple[str, int], dict] = {}  # a live attempt's shim.json
        self._started: dict[tuple[str, int], dict] = {}  # a live attempt's started.json (also written once)
        self._legacy: dict[tuple[str, int], str] = {}  # (identity, attempt) -> an older agent's folder name
        self._adopted: dict[str, tuple[str, int]] = {}  # an older agent's folder -> the key it was adopted as
        self._lock = threading.RLock()
        self._remover: threading.Thread | None = None  # deletes forgotten attempts' folders (_remove)
        self._removing = threading.Event()
        self._events_fd: int | None = None
        self._event = threading.Condition()
        self._events_seen = 0
        # Shims are forked by a pre-started launcher (no interpreter start per worker); ASTRAEUS_SHIM_LAUNCHER=0
        # starts each with its own interpreter, as before.
        self.launcher: Launcher | None = None
        if internal("ASTRAEUS_SHIM_LAUNCHER") != "0":
            env = self._shim_base_env()
            if (binary := native.binary_for_agent()) is not None:
                env[native.ENV_VAR] = binary  # the launcher starts the C supervisor for the workers it fits
            self.launcher = Launcher(env, os.path.join(self.state_dir, "launcher.log"), preload=self.SHIM_PRELOAD)

    # ------------------------------------------------------------ helpers
    def dir(self, worker: str, attempt: int) -> str:
        """The attempt's folder, `<identity>.<attempt>` (or the folder an older agent made for it)."""
        legacy = self._legacy.get((worker, int(attempt)))
        return os.path.join(self.workers_dir, legacy or f"{worker}.{int(attempt)}")

    @staticmethod
    def _shim_base_env() -> dict[str, str]:
        env = environment()
        return {
            "PATH": env.get("PATH", os.defpath),
            "PYTHONPATH": _PKG_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        }

    def marker(self, worker: str, attempt: int) -> str:
        return f"{self.owner}:{os.path.basename(self.dir(worker, attempt))}"

    @staticmethod
    def _parse_dirname(name: str) -> tuple[str, int] | None:
        worker, _, attempt = name.rpartition(".")
        if not worker or not attempt.isdigit():
            return None
        return worker, int(attempt)

    def _key_of(self, dirname: str) -> tuple[str, int] | None:
        """The (worker identity, attempt) a folder holds. An identity is `<ns>.<name>.<run uid>`. An older agent's
        folder holds `<ns>.<name>` or a name alone: its key is the identity it was adopted as (its `identity`
        file, `adopt_as`), else `<ns>.<name>`, the ns of a name alone coming from the job name it recorded."""
        parsed = self._parse_dirname(dirname)
        if parsed is None or parsed[0].count(".") >= 2:
            return parsed
        if (known := self._adopted.get(dirname)) is not None:
            return known
        try:
            with open(os.path.join(self.workers_dir, dirname, "identity")) as f:
                identity = f.read().strip()
        except OSError:
            identity = ""
        if identity:
            key = (identity, parsed[1])
            self._adopted[dirname] = key
        elif "." in parsed[0]:
            return parsed
        else:
            spec = _read_json(os.path.join(self.workers_dir, dirname, "spec.json")) or {}
            job = str((spec.get("env") or {}).get("ASTRAEUS_JOB_NAME") or "")
            ns = job.partition(".")[0] if "." in job else ""
            if not ns:
                return parsed  # no workspace known: keyed by its name, which nothing assigns (so it is stopped)
            key = (f"{ns}.{parsed[0]}", parsed[1])
        self._legacy[key] = dirname
        return key

    def adopt_as(self, worker: str, attempt: int, identity: str) -> bool:
        with self._lock:
            d = self.dir(worker, attempt)
            if not os.path.isdir(d):
                return False
            tmp = os.path.join(d, "identity.tmp")
            with open(tmp, "w") as f:
                f.write(identity + "\n")
            os.replace(tmp, os.path.join(d, "identity"))
            old, new = (worker, int(attempt)), (identity, int(attempt))
            self._legacy.pop(old, None)
            self._legacy[new] = os.path.basename(d)
            self._adopted[os.path.basename(d)] = new
            if old in self._final:  # an ended attempt's status, under its new name
                self._final[new] = dataclasses.replace(self._final.pop(old), worker=identity)
            for kept in (self._specs, self._shims, self._started):
                if old in kept:
                    kept[new] = kept.pop(old)
            return True

    requires_command = True  # a container may start its image's entrypoint instead

    def extra_spec(self, assignment: Assignment, d: str) -> dict:
        """More of spec.json, for a runtime built on this one."""
        return {}

    def write_secrets(self, assignment: Assignment, d: str) -> None:
        """Files only the shim reads (0600), for a runtime built on this one."""

    def stop_reason_file(self, d: str) -> str:
        """Where the worker reads why it is stopped (written by its shim before SIGTERM)."""
        return os.path.join(d, "signal", "stop-reason")

    def build_env(self, assignment: Assignment) -> tuple[dict[str, str], str]:
        own = environment()
        env: dict[str, str] = {"PATH": own.get("PATH", os.defpath), "HOME": own.get("HOME", "/root")}
        for k in ("LANG", "LC_ALL", "TZ"):
            if k in own:
                env[k] = own[k]
        local = self.image_map.resolve(assignment.image)
        local.apply(env)
        env["PYTHONUNBUFFERED"] = "1"  # logs line by line; a run may set it to "" to opt out
        env.update(assignment.env)
        if "CUDA_VISIBLE_DEVICES" not in env:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in assignment.gpu_indices)
        env["ASTRAEUS_WORKER_ID"] = self.marker(assignment.worker, assignment.attempt)
        env["ASTRAEUS_STOP_REASON_FILE"] = self.stop_reason_file(self.dir(assignment.worker, assignment.attempt))
        env.update(progress_env(self.dir(assignment.worker, assignment.attempt)))
        env["PATH"] = f"{SLURM_BIN}:{env['PATH']}" if env.get("PATH") else SLURM_BIN  # srun, scontrol in a job
        return env, local.name

    def cgroup_name(self, worker: str, attempt: int) -> str:
        """`<owner>-<the attempt's folder name>` in every cgroup hierarchy (the folder name is its shim's id); a
        name too long for a cgroup folder is hashed."""
        name = os.path.basename(self.dir(worker, attempt))
        if len(name) > 200:
            name = hashlib.sha1(name.encode()).hexdigest()
        return f"{self.owner}-{name}"

    def limits(self, assignment: Assignment) -> cgroups.Limits:
        """What the worker's cgroup enforces: its memory (none when unspecified or 0), CPU cores, the machine's
        pids limit, and every GPU device node but those of its own GPUs."""
        deny: list[str] = []
        if gpu_device_nodes(self.device_dir):  # real NVIDIA nodes; simulated GPUs have none to block
            if self._gpu_minors is None:
                self._gpu_minors = nvml_minor_numbers() or {}
            deny = gpu_deny_rules(list(assignment.gpu_indices), self.device_dir, self._gpu_minors)
        return cgroups.Limits(memory_bytes=assignment.memory_bytes or None, cpu_cores=assignment.cpu_cores or None,
                              pids_max=self.pids_max or None, deny_devices=deny)

    # ------------------------------------------------------------ start
    def start(self, assignment: Assignment | dict) -> WorkerStatus:
        """A dict is checked as an Assignment first (astraeus.protocol)."""
        if not isinstance(assignment, Assignment):
            try:
                assignment = Assignment.model_validate(assignment)
            except ValidationError as e:
                raise StartFailed(f"invalid assignment: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
        worker, attempt = assignment.worker, assignment.attempt
        if not NAME_RE.match(worker):
            raise StartFailed(f"invalid worker name {worker!r}")
        if not assignment.command and self.requires_command:
            raise StartFailed("the run has no command")
        with self._lock:
            existing = self.status(worker, attempt)
            if existing is not None:
                if existing.state == START_FAILED:
                    raise StartFailed(existing.message or "start failed")
                return existing  # never two of the same attempt
            env, env_name = self.build_env(assignment)
            try:
                isolation = mounts.isolation_spec(self.state_dir, worker, env, assignment.workspace_number)
            except ValueError as e:
                raise StartFailed(str(e)) from None
            d = self.dir(worker, attempt)
            os.makedirs(d, mode=0o700, exist_ok=True)
            configs = [c.model_dump() for c in assignment.configs]
            if isolation is not None and self.networks is not None and assignment.network == "isolated":
                configs += self._own_network(assignment, os.path.basename(d), isolation, env, configs)
            if isolation is not None:
                configs += job_hosts(env, configs)
            spec = {
                "worker": worker, "attempt": attempt, "run": assignment.run,
                "marker": self.marker(worker, attempt),
                "image": assignment.image, "environment": env_name,
                "command": assignment.command, "args": list(assignment.args),
                "env": env, "cwd": os.path.join(d, "work"),
                "mounts": [m.model_dump() for m in assignment.mounts],
                "configs": configs,
                "cgroups": self.cgroups.worker(self.cgroup_name(worker, attempt)).to_json() if self.cgroup_root
                else None,
                "limits": self.limits(assignment).to_json(),
                "stop_grace": self.stop_grace, "created_at": time.time(),
                "log_file_bytes": agent_settings().worker_log_file_bytes,
                "isolation": isolation,  # the worker's user and view
                "tools": SLURM_BIN,  # shown read-only (process) or bound at oci_spec.TOOLS_DIR (container), on PATH
                "signal": signal_plan(assignment),
            }
            spec.update(self.extra_spec(assignment, d))
            _write_json(os.path.join(d, "spec.json"), spec)
            self.write_secrets(assignment, d)
            shim_env = {
                **self._shim_base_env(),
                "ASTRAEUS_SHIM_OWNER": self.owner,
                "ASTRAEUS_SHIM_ID": os.path.basename(d),
                "ASTRAEUS_SHIM_DIR": d,
            }
            self._launch_shim(d, shim_env)
        # Waited for outside the lock, so that several workers start at once: from here on a second start() of
        # this attempt finds its folder (Starting) and returns that.
        # Each look reads the attempt's files: woken by the shim's byte on events.fifo where the agent's event
        # loop reads it (wait_event), else looking again after 5, 10, 20, 40, 50, 50 ... ms.
        deadline = time.monotonic() + self.start_timeout
        delay = 0.005
        while True:
            seen = self._events_seen
            st = self.status(worker, attempt)
            if st is not None and (st.state != STARTING or st.message):
                break  # started, failed, or telling what it does (pulling an image: that takes its time)
            if time.monotonic() > deadline:
                self.stop(worker, attempt, grace=0, wait=False)
                raise StartFailed(f"the worker did not start within {self.start_timeout:.0f}s")
            with self._event:
                if self._events_seen == seen:
                    self._event.wait(delay)
            delay = min(delay * 2, 0.05)
        if st.state == START_FAILED:
            raise StartFailed(st.message or "start failed")
        return st

    def _own_network(self, a: Assignment, key: str, isolation: dict, env: dict, configs: list[dict]) -> list[dict]:
        """Make the attempt's own network (astraeus.agent.network): its namespace goes in `isolation` (the shim
        enters it), its address in ASTRAEUS_WORKER_ADDR; the answer is the config of its /etc/resolv.conf (unless
        the run has its own)."""
        from astraeus.agent import network

        try:
            net = self.networks.create(key, a.address, [network.Peer(p.address, p.machine_address) for p in a.peers])
        except (network.NetworkError, ValueError) as e:
            raise StartFailed(f"cannot make the worker's network: {e}") from None
        isolation["netns"] = net.path
        env["ASTRAEUS_WORKER_ADDR"] = net.address
        if any(c.get("mount_path") == "/etc/resolv.conf" for c in configs):
            return []
        resolv = self.networks.resolv_conf or network.worker_resolv_conf_of_host()  # set up by the agent, or read now
        return [{"mount_path": "/etc/resolv.conf", "value": resolv}]

    def _launch_shim(self, d: str, shim_env: dict[str, str]) -> None:
        """Start the attempt's shim: forked by the pre-started launcher (astraeus.agent.runtime.launcher), or, when
        that is off or fails, `python -m astraeus.agent.runtime.shim` of its own. Either way it detaches at once."""
        spec, shim_log = os.path.join(d, "spec.json"), os.path.join(d, "shim.log")
        if self.launcher is not None:
            try:
                self.launcher.launch([spec], shim_env, shim_log, self.SHIM_MODULE)
                return  # its status: as with Popen below, what the shim did is read from its files
            except OSError as e:
                log.warning("%s; starting the shim with its own interpreter", e)
        with os.fdopen(os.open(shim_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as errf:
            p = subprocess.Popen([sys.executable, "-m", self.SHIM_MODULE, spec],
                                 env=shim_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf,
                                 cwd="/", start_new_session=True, close_fds=True)
        p.wait()  # the shim forks away at once

    def close(self) -> None:
        """Stop the shim launcher (the shims it started run on)."""
        if self.launcher is not None:
            self.launcher.close()

    # ------------------------------------------------------------ status
    def status(self, worker: str, attempt: int) -> WorkerStatus | None:
        key = (worker, int(attempt))
        cached = self._final.get(key)
        if cached is not None:
            return cached
        d = self.dir(worker, attempt)
        spec = self._specs.get(key)  # what status reads of spec.json, which an attempt never changes
        if spec is None:
            spec = _read_json(os.path.join(d, "spec.json"))
            if spec is None and not os.path.isdir(d):
                return None
            spec = {"environment": spec.get("environment"), "created_at": spec.get("created_at")} if spec else {}
            if spec.get("created_at") is not None:
                self._specs[key] = spec
        elif not os.path.isdir(d):
            return None
        env_name = spec.get("environment")
        failed = _read_json(os.path.join(d, "failed.json"))
        if failed is not None:
            return self._finalize(WorkerStatus(worker, attempt, START_FAILED, message=failed.get("message"),
                                               environment=env_name, finished_at=failed.get("time")))
        started = self._started.get(key)  # read at each look at a running worker (the agent's most read file)
        if started is None:
            started = _read_json(os.path.join(d, "started.json")) or {}
            if started.get("pid"):
                self._started[key] = started
        exit_ = _read_json(os.path.join(d, "exit.json"))
        stopping = os.path.exists(os.path.join(d, "stop.json"))
        if exit_ is not None:
            return self._finalize(WorkerStatus(
                worker, attempt, EXITED, pid=started.get("pid"), exit_code=exit_.get("exit_code"),
                signal=exit_.get("signal"), message=exit_.get("message"), environment=env_name,
                started_at=started.get("started_at"), finished_at=exit_.get("finished_at"),
                extra={"killed": exit_.get("killed"), "stop_requested": exit_.get("stop_requested"),
                       "oom": bool(exit_.get("oom")), "oom_limit_bytes": exit_.get("oom_limit_bytes")}))
        shim = self._shims.get(key)  # the shim's pid and start time: written once, again the same if wiped
        if shim is None:
            shim = _read_json(os.path.join(d, "shim.json")) or {}
            if shim.get("shim_pid"):
                self._shims[key] = shim
        shim_alive = _alive(shim.get("shim_pid"), shim.get("shim_create_time"))
        if started:
            if shim_alive:
                return WorkerStatus(worker, attempt, RUNNING, pid=started.get("pid"), environment=env_name,
                                    started_at=started.get("started_at"), stopping=stopping)
            exit_ = _read_json(os.path.join(d, "exit.json"))  # the shim may just have written it
            if exit_ is not None:
                return self.status(worker, attempt)
            if _alive(started.get("pid"), started.get("pid_create_time")) or self._marked_pids(worker, attempt):
                # the shim is gone but the command is not: unsupervised; the agent stops it (adopt())
                return WorkerStatus(worker, attempt, RUNNING, pid=started.get("pid"), environment=env_name,
                                    started_at=started.get("started_at"), stopping=stopping,
                                    extra={"orphan": True})
            self._supervisor_gone(worker, attempt)
            return self._finalize(WorkerStatus(
                worker, attempt, EXITED, pid=started.get("pid"), environment=env_name,
                started_at=started.get("started_at"), finished_at=time.time(),
                message="the worker ended while its supervisor was gone; exit status unknown"))
        if shim_alive:
            phase = _read_json(os.path.join(d, "phase.json")) or {}
            return WorkerStatus(worker, attempt, STARTING, environment=env_name, message=phase.get("message"))
        created = spec.get("created_at")
        if created is None:  # the folder is being made (start() writes spec.json next): not a failure yet
            try:
                created = os.stat(d).st_mtime
            except OSError:
                created = 0
        if shim or time.time() - created > self.start_timeout + 5:
            if os.path.exists(os.path.join(d, "started.json")) or os.path.exists(os.path.join(d, "exit.json")):
                # A fast worker: the shim started it, saw it exit and left between our reads above. Its
                # files are final now that the shim is gone: read them again.
                return self.status(worker, attempt)
            failed = _read_json(os.path.join(d, "failed.json"))
            msg = failed.get("message") if failed else "the worker's supervisor exited before starting it: " + self._shim_log_tail(d)
            return self._finalize(WorkerStatus(worker, attempt, START_FAILED, message=msg, environment=env_name))
        return WorkerStatus(worker, attempt, STARTING, environment=env_name)

    def _finalize(self, st: WorkerStatus) -> WorkerStatus:
        self._final[st.key] = st
        self._drop_kept(st.key)
        return st

    def _drop_kept(self, key: tuple[str, int]) -> None:
        """Forget what status() keeps of a live attempt's files written once (spec.json, shim.json, started.json)."""
        for kept in (self._specs, self._shims, self._started):
            kept.pop(key, None)

    @staticmethod
    def _shim_log_tail(d: str) -> str:
        try:
            with open(os.path.join(d, "shim.log"), errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
            return lines[-1] if lines else "no diagnostics"
        except OSError:
            return "no diagnostics"

    def wait_event(self, timeout: float) -> bool:
        """Wait for a shim to write a byte to `events.fifo` (it does on start, exit and failed start)."""
        if self._events_fd is None:
            path = os.path.join(self.state_dir, "events.fifo")
            try:
                if not stat.S_ISFIFO(os.stat(path).st_mode):
                    os.unlink(path)
                    raise FileNotFoundError
            except FileNotFoundError:
                os.mkfifo(path, 0o600)
            # O_RDWR: this end also counts as a writer, so the FIFO never reads as closed between shims.
            self._events_fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        ready, _, _ = select.select([self._events_fd], [], [], timeout)
        if not ready:
            return False
        try:
            os.read(self._events_fd, 4096)
        except BlockingIOError:
            return False
        with self._event:  # wake start()s waiting for their shims
            self._events_seen += 1
            self._event.notify_all()
        return True

    def list(self) -> list[WorkerStatus]:
        out = []
        try:
            names = sorted(os.listdir(self.workers_dir))
        except FileNotFoundError:
            os.makedirs(self.workers_dir, exist_ok=True)
            names = []
        for name in names:
            if not os.path.isdir(os.path.join(self.workers_dir, name)):
                continue
            parsed = self._key_of(name)
            if parsed is None:
                continue
            st = self.status(*parsed)
            if st is not None:
                out.append(st)
        return out

    # ------------------------------------------------------------ stop
    def stop(self, worker: str, attempt: int, grace: float | None = None, wait: bool = True,
             reason: str | None = None) -> WorkerStatus | None:
        grace = self.stop_grace if grace is None else max(0.0, float(grace))
        st = self.status(worker, attempt)
        if st is None or st.final:
            return st
        d = self.dir(worker, attempt)
        stop_path = os.path.join(d, "stop.json")
        if not os.path.exists(stop_path):
            _write_json(stop_path, {"grace": grace, "requested_at": time.time(), "reason": reason})
        shim = _read_json(os.path.join(d, "shim.json")) or {}
        if _alive(shim.get("shim_pid"), shim.get("shim_create_time")):
            try:
                os.kill(shim["shim_pid"], signal.SIGUSR1)
            except OSError:
                pass
        elif st.extra.get("orphan"):
            self._stop_orphan(worker, attempt, grace)
        if not wait:
            return self.status(worker, attempt)
        deadline = time.monotonic() + grace + 15
        while time.monotonic() < deadline:
            st = self.status(worker, attempt)
            if st is None or st.final:
                return st
            time.sleep(0.02)
        return self.status(worker, attempt)

    def _supervisor_gone(self, worker: str, attempt: int, cg: cgroups.WorkerCgroup | None = None) -> None:
        """An attempt whose shim is gone has ended (its processes stopped by the agent, or ended by themselves):
        remove what the shim would have removed at its end, here its cgroups (`cg`, else as started.json names
        them), after killing what is left in them (the worker's PID 1, which ends once the command has: it carries
        no worker marker). Without this, a worker whose shim was killed and whose command then ended by itself
        left its cgroups on the machine until the agent's next restart."""
        if cg is None:
            started = _read_json(os.path.join(self.dir(worker, attempt), "started.json")) or {}
            cg = cgroups.WorkerCgroup.from_json(started.get("cgroups") or started.get("cgroup"))
        if cg is None:
            return
        for _ in range(20):
            if not cg.pids():
                break
            cg.kill()
            time.sleep(0.05)
        cg.remove(timeout=1.0)

    def _marked_pids(self, worker: str, attempt: int) -> list[int]:
        want = f"ASTRAEUS_WORKER_ID={self.marker(worker, attempt)}".encode()
        return [pid for pid in _scan_env(want)]

    def _stop_orphan(self, worker: str, attempt: int, grace: float) -> None:
        """SIGTERM → grace → SIGKILL for a worker whose shim is gone, from the agent."""
        key = (worker, attempt)
        with self._lock:
            if key in getattr(self, "_orphan_stops", set()):
                return
            self._orphan_stops = getattr(self, "_orphan_stops", set()) | {key}

        def run() -> None:
            d = self.dir(worker, attempt)
            started = _read_json(os.path.join(d, "started.json")) or {}
            main = started.get("pid")
            cg = cgroups.WorkerCgroup.from_json(started.get("cgroups") or started.get("cgroup")) or \
                (self.cgroups.worker(self.cgroup_name(worker, attempt)) if self.cgroup_root else None)
            if _alive(main, started.get("pid_create_time")):
                os.kill(main, signal.SIGTERM)
            end = time.monotonic() + grace
            while time.monotonic() < end and self._marked_pids(worker, attempt):
                time.sleep(0.1)
            killed = False
            for _ in range(20):
                pids = self._marked_pids(worker, attempt)
                if not pids:
                    break
                killed = True
                if cg is not None:
                    cg.kill()
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.05)
            self._supervisor_gone(worker, attempt, cg)
            os.makedirs(d, exist_ok=True)
            _write_json(os.path.join(d, "exit.json"), {
                "exit_code": None, "signal": signal.SIGKILL if killed else None, "killed": killed,
                "finished_at": time.time(), "stop_requested": True,
                "message": "its supervisor (shim) was lost, so it was stopped; exit status unknown"})

        threading.Thread(target=run, name=f"orphan-stop-{worker}.{attempt}", daemon=True).start()

    # ------------------------------------------------------------ adoption
    def adopt(self) -> list[WorkerStatus]:
        """Find this agent's live workers even if the state dir was wiped: shims (ASTRAEUS_SHIM_OWNER) rewrite
        their folder within half a second; worker processes whose shim is gone (ASTRAEUS_WORKER_ID) are
        stopped, since nothing could report their exit."""
        self._final.clear()
        for kept in (self._specs, self._shims, self._started):
            kept.clear()
        os.makedirs(self.workers_dir, exist_ok=True)
        shims = _scan_env(f"ASTRAEUS_SHIM_OWNER={self.owner}".encode())
        shim_ids: set[str] = set()
        for pid in shims:
            for item in _environ(pid):
                if item.startswith(b"ASTRAEUS_SHIM_ID="):
                    shim_ids.add(item.split(b"=", 1)[1].decode())
        deadline = time.monotonic() + 2.0
        for sid in shim_ids:
            path = os.path.join(self.workers_dir, sid, "started.json")
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
        workers = _scan_env(f"ASTRAEUS_WORKER_ID={self.owner}:".encode())
        for wid in sorted(set(workers.values()) - shim_ids):
            parsed = self._parse_dirname(wid)
            if parsed is None:
                continue
            d = self.dir(*parsed)
            os.makedirs(d, exist_ok=True)
            if not os.path.exists(os.path.join(d, "spec.json")):
                _write_json(os.path.join(d, "spec.json"), {"worker": parsed[0], "attempt": parsed[1],
                                                           "marker": self.marker(*parsed), "created_at": 0})
            if not os.path.exists(os.path.join(d, "started.json")):
                mains = [p for p, v in workers.items() if v == wid]
                pid = min(mains, key=lambda p: psutil.Process(p).create_time() if psutil.pid_exists(p) else 0)
                _write_json(os.path.join(d, "started.json"), {"pid": pid, "pid_create_time": None, "pgid": pid})
            key = self._key_of(wid) or parsed
            self._stop_orphan(key[0], key[1], self.stop_grace)
        self._sweep_cgroups(shim_ids)
        if self.networks is not None:  # the networks of attempts this agent no longer keeps (forgotten while down)
            keep = {self.networks.name_of(n) for n in os.listdir(self.workers_dir)}
            for name in self.networks.existing():
                if name not in keep:
                    self.networks.discard(name)
        return self.list()

    def _sweep_cgroups(self, live: set[str]) -> None:
        """Remove this agent's worker cgroups that no live shim holds (a shim killed while the agent was down
        leaves its cgroup behind); one with processes in it cannot be removed and stays until they are stopped."""
        prefix = f"{self.owner}-"
        for d in cgroups.leftovers(self.cgroups, prefix):
            if os.path.basename(d)[len(prefix):] not in live:
                try:
                    os.rmdir(d)
                except OSError:
                    pass

    # ------------------------------------------------------------ logs
    def read_logs(self, worker: str, attempt: int, offset: int = 0, limit: int = 1000) -> tuple[list[LogLine], int]:
        """Up to `limit` lines from `offset`, a byte offset in the attempt's whole log, and the offset after them.

        The shim keeps the log in log.jsonl.1 (older) and log.jsonl (newer, its header line giving the offset
        where it starts); an offset in a dropped file resumes at the oldest line still kept."""
        d = self.dir(worker, attempt)
        out: list[LogLine] = []
        for name in ("log.jsonl.1", "log.jsonl"):
            path = os.path.join(d, name)
            try:
                with open(path, "rb") as f:
                    first = f.readline(256)
                    base = 0
                    if first.startswith(b'{"base":'):
                        try:
                            base = int(json.loads(first)["base"])
                        except (ValueError, KeyError, TypeError):
                            base = 0
                    size = os.fstat(f.fileno()).st_size
                    if name == "log.jsonl.1" and offset >= base + size:
                        continue  # everything in the older file was read
                    if offset < base or offset > base + size:
                        # lines dropped before they were read, or the file was replaced (state wiped): from its
                        # start (the server keeps one copy per seq)
                        offset = base
                    f.seek(offset - base)
                    while len(out) < limit:
                        raw = f.readline()
                        if not raw or not raw.endswith(b"\n"):
                            break
                        offset += len(raw)
                        try:
                            rec = json.loads(raw)
                            line = LogLine(worker, int(attempt), int(rec["seq"]), float(rec["time"]),
                                           rec.get("stream", "stdout"), rec.get("text", ""))
                        except (ValueError, KeyError, TypeError):
                            continue  # a header line, or a torn one
                        if out and line.seq <= out[-1].seq:
                            continue  # the files turned over while this call read them: a line it already has
                        out.append(line)
                    if len(out) >= limit or name == "log.jsonl":
                        return out, offset
                    # the older file is read to its end: go on in the newer one, where it starts
                    offset = base + size
            except FileNotFoundError:
                continue
        return out, offset

    def logs(self, worker: str, attempt: int) -> list[LogLine]:
        """Every log line of an attempt (for tests and debugging)."""
        lines: list[LogLine] = []
        offset = 0
        while True:
            batch, offset = self.read_logs(worker, attempt, offset)
            if not batch:
                return lines
            lines += [ln for ln in batch if not lines or ln.seq > lines[-1].seq]

    def forget(self, worker: str, attempt: int) -> None:
        st = self.status(worker, attempt)
        if st is not None and not st.final:
            raise RuntimeError(f"{worker} attempt {attempt} is still {st.state}")
        d = self.dir(worker, attempt)
        self._remove(d)
        if self.networks is not None:
            self.networks.remove(os.path.basename(d))
        self._final.pop((worker, int(attempt)), None)
        self._drop_kept((worker, int(attempt)))
        self._legacy.pop((worker, int(attempt)), None)
        self._adopted.pop(os.path.basename(d), None)

    def _remove(self, d: str) -> None:
        """Remove an attempt's folder: renamed out of the workers' folder at once (gone for list() and status()),
        deleted by a thread of its own (its files, logs and working folder: a dozen unlinks or more, which the
        agent's reconcile, which starts the next workers, does not wait for)."""
        trash = os.path.join(self.state_dir, "forgotten")
        try:
            os.makedirs(trash, mode=0o700, exist_ok=True)
            gone = os.path.join(trash, f"{os.path.basename(d)}.{os.urandom(4).hex()}")
            os.rename(d, gone)
        except FileNotFoundError:
            return
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
            return
        with self._lock:
            if self._remover is None or not self._remover.is_alive():
                self._remover = threading.Thread(target=self._remove_forgotten, name="runtime-remove", daemon=True)
                self._remover.start()
            self._removing.set()

    def _remove_forgotten(self) -> None:
        trash = os.path.join(self.state_dir, "forgotten")
        while self._removing.wait(5.0):
            self._removing.clear()
            try:
                names = os.listdir(trash)
            except OSError:
                continue
            for name in names:
                shutil.rmtree(os.path.join(trash, name), ignore_errors=True)
