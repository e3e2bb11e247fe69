"""Worker cgroups: the limits a worker asked for, enforced by the kernel, and a way to kill its whole tree.

`detect()` (in the agent, as root) finds where worker cgroups may go, once:
  - cgroup v2: `<cgroup2 mount>/astraeus`, with whichever of memory, cpu and pids can be enabled for its
    children (a v2 host: all three; a hybrid host such as this one: none, the v2 folder is still used for
    `cgroup.kill`);
  - cgroup v1: `<controller mount>/astraeus` for memory, cpu, pids not available on v2, and for devices (GPU
    device nodes) and freezer (to stop a tree from forking while it is killed).

`WorkerCgroup` is one worker attempt's cgroup(s) (the same name in every hierarchy): the shim (root) creates it
and writes the limits, moves the worker's main process in before it drops privileges and execs, reads
whether the kernel OOM-killed something in it, kills everything in it, and removes it when the worker is gone.

Limits (from the assignment; 0 or None: no limit):
  memory_bytes  v2 memory.max + memory.swap.max=0; v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes)
  cpu_cores     v2 cpu.max "<quota> 100000"; v1 cpu.cfs_quota_us / cpu.cfs_period_us (0.5 cores: 50000/100000)
  pids_max      pids.max (threads count too)
  deny_devices  ["c 195:1", ...]: v1 devices.deny (GPU nodes not assigned to the worker). v2 device filtering
                needs an eBPF program and is not done: a v2-only host logs that it cannot enforce it.
A limit that no hierarchy can enforce is logged by the shim (`warnings`), never silently dropped.

Stdlib only (the shim imports it).
"""

from __future__ import annotations

import os
import signal
import time

LIMITED = ("memory", "cpu", "pids")  # controllers that carry a worker's requested resources
V1_ONLY = ("devices", "freezer")  # v1 controllers used for GPU nodes and for killing a tree
CPU_PERIOD_US = 100_000
CPU_MIN_QUOTA_US = 1_000


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mounts(path: str = "/proc/self/mounts") -> list[list[str]]:
    try:
        with open(path) as f:
            return [line.split() for line in f]
    except OSError:
        return []


def _usable(root: str) -> bool:
    """Can we make child cgroups under `root` (creating it if needed)?"""
    try:
        os.makedirs(root, exist_ok=True)
        probe = os.path.join(root, f"probe-{os.getpid()}")
        os.makedirs(probe, exist_ok=True)
        ok = os.path.exists(os.path.join(probe, "cgroup.procs"))
        os.rmdir(probe)
        return ok
    except OSError:
        return False


class _Record:
    """A plain record compared and shown by its to_json(). Not a dataclass: this module is imported by the shim
    launcher, and dataclasses' imports (inspect, ast, dis ...) made each of its forks dearer."""

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.to_json() == self.to_json()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_json()!r})"


class Hierarchies(_Record):
    """Where this host's worker cgroups go (the agent finds them once; the spec.json of each worker carries them)."""

    def __init__(self, v2: str | None = None, v2_controllers: list[str] | None = None,
                 v1: dict[str, str] | None = None):
        self.v2 = v2  # <cgroup2 mount>/astraeus
        self.v2_controllers = v2_controllers if v2_controllers is not None else []  # of LIMITED, enabled for v2's
        self.v1 = v1 if v1 is not None else {}  # controller -> <its mount>/astraeus

    @property
    def root(self) -> str | None:
        """A folder worker cgroups go in (the v2 one first), or None when there is none at all."""
        return self.v2 or next(iter(self.v1.values()), None)

    def to_json(self) -> dict:
        return {"v2": self.v2, "v2_controllers": list(self.v2_controllers), "v1": dict(self.v1)}

    @classmethod
    def from_json(cls, d: dict | None) -> Hierarchies:
        d = d or {}
        return cls(d.get("v2"), list(d.get("v2_controllers") or []), dict(d.get("v1") or {}))

    def worker(self, name: str) -> WorkerCgroup:
        """The cgroup(s) of one worker attempt named `name` (not created yet)."""
        v1 = {c: os.path.join(root, name) for c, root in self.v1.items()
              if c in V1_ONLY or c not in self.v2_controllers}
        return WorkerCgroup(name, os.path.join(self.v2, name) if self.v2 else None, list(self.v2_controllers), v1)


def detect(mounts_file: str = "/proc/self/mounts", subdir: str = "astraeus") -> Hierarchies:
    """The cgroup hierarchies this process may create worker cgroups in (an empty Hierarchies without any)."""
    h = Hierarchies()
    for m in _mounts(mounts_file):
        if len(m) < 4:
            continue
        mount, fstype, options = m[1], m[2], m[3].split(",")
        if fstype == "cgroup2" and h.v2 is None:
            root = os.path.join(mount, subdir)
            if not _usable(root):
                continue
            h.v2 = root
            available = (_read(os.path.join(mount, "cgroup.controllers")) or "").split()
            for c in LIMITED:
                if c in available:
                    for folder in (mount, root):  # enable it down to the workers' parent; already on is fine
                        try:
                            _write(os.path.join(folder, "cgroup.subtree_control"), f"+{c}")
                        except OSError:
                            pass
            enabled = (_read(os.path.join(root, "cgroup.subtree_control")) or "").split()
            h.v2_controllers = [c for c in LIMITED if c in enabled]
        elif fstype == "cgroup":
            for c in (*LIMITED, *V1_ONLY):
                if c in options and c not in h.v1:
                    root = os.path.join(mount, subdir)
                    if _usable(root):
                        h.v1[c] = root
    return h


class Limits(_Record):
    def __init__(self, memory_bytes: int | None = None, cpu_cores: float | None = None, pids_max: int | None = None,
                 deny_devices: list[str] | None = None):
        self.memory_bytes, self.cpu_cores, self.pids_max = memory_bytes, cpu_cores, pids_max
        self.deny_devices = deny_devices if deny_devices is not None else []  # "c <major>:<minor>"

    def to_json(self) -> dict:
        return {"memory_bytes": self.memory_bytes, "cpu_cores": self.cpu_cores, "pids_max": self.pids_max,
                "deny_devices": list(self.deny_devices)}

    @classmethod
    def from_json(cls, d: dict | None) -> Limits:
        d = d or {}
        return cls(d.get("memory_bytes") or None, d.get("cpu_cores") or None, d.get("pids_max") or None,
                   list(d.get("deny_devices") or []))


def cpu_quota_us(cores: float) -> int:
    """The CFS quota per 100 ms period for `cores` (0.5 → 50000)."""
    return max(CPU_MIN_QUOTA_US, int(round(float(cores) * CPU_PERIOD_US)))


class WorkerCgroup(_Record):
    """One worker attempt's cgroup: a v2 folder and/or v1 folders (controller -> folder), all named `name`."""

    def __init__(self, name: str, v2: str | None = None, v2_controllers: list[str] | None = None,
                 v1: dict[str, str] | None = None):
        self.name, self.v2 = name, v2
        self.v2_controllers = v2_controllers if v2_controllers is not None else []
        self.v1 = v1 if v1 is not None else {}

    # ------------------------------------------------------------ records
    def to_json(self) -> dict:
        return {"name": self.name, "v2": self.v2, "v2_controllers": list(self.v2_controllers), "v1": dict(self.v1)}

    @classmethod
    def from_json(cls, d: dict | str | None) -> WorkerCgroup | None:
        """From to_json(), or from the single v2 path older records hold."""
        if not d:
            return None
        if isinstance(d, str):
            return cls(os.path.basename(d), d)
        return cls(d.get("name") or "", d.get("v2"), list(d.get("v2_controllers") or []), dict(d.get("v1") or {}))

    @property
    def dirs(self) -> list[str]:
        """Every folder of this cgroup, v2 first, each once (v1 controllers mounted together share one)."""
        out = [self.v2] if self.v2 else []
        for d in self.v1.values():
            if d not in out:
                out.append(d)
        return out

    @property
    def primary(self) -> str | None:
        return self.dirs[0] if self.dirs else None

    def _dir(self, controller: str) -> tuple[str | None, int]:
        """The folder enforcing `controller` and its cgroup version, or (None, 0)."""
        if self.v2 and controller in self.v2_controllers:
            return self.v2, 2
        if controller in self.v1:
            return self.v1[controller], 1
        return None, 0

    def exists(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs)

    # ------------------------------------------------------------ create
    def create(self, limits: Limits) -> list[str]:
        """Make the folders and write the limits. Returns warnings (limits that could not be enforced); a
        folder that cannot be made is dropped (OSError only when none could)."""
        made, wanted = [], self.dirs
        for d in wanted:
            try:
                os.makedirs(d, exist_ok=True)
                made.append(d)
            except OSError:
                self._drop(d)
        if wanted and not made:
            raise OSError(f"cannot create the worker's cgroup {self.name} in {wanted}")
        warnings: list[str] = []

        def put(controller: str, what: str, files: list[tuple[str, str, bool]]) -> None:
            d, _ = self._dir(controller)
            if d is None:
                warnings.append(f"{what} is not enforced: no {controller} cgroup controller")
                return
            for name, value, required in files:
                path = os.path.join(d, name)
                if not required and not os.path.exists(path):
                    continue
                try:
                    _write(path, value)
                except OSError as e:
                    if required:
                        warnings.append(f"{what} is not enforced: cannot write {path}: {e.strerror or e}")
                        return

        if limits.memory_bytes:
            b = str(int(limits.memory_bytes))
            if self._dir("memory")[1] == 2:
                put("memory", "the memory limit", [("memory.max", b, True), ("memory.swap.max", "0", False)])
            else:  # v1: memory first (memsw may never be below it), then memory+swap = the same: no swap
                put("memory", "the memory limit", [("memory.limit_in_bytes", b, True),
                                                   ("memory.memsw.limit_in_bytes", b, False)])
        if limits.cpu_cores:
            q = cpu_quota_us(limits.cpu_cores)
            if self._dir("cpu")[1] == 2:
                put("cpu", "the CPU quota", [("cpu.max", f"{q} {CPU_PERIOD_US}", True)])
            else:
                put("cpu", "the CPU quota", [("cpu.cfs_period_us", str(CPU_PERIOD_US), True),
                                             ("cpu.cfs_quota_us", str(q), True)])
        if limits.pids_max:
            put("pids", "the process limit", [("pids.max", str(int(limits.pids_max)), True)])
        if limits.deny_devices:
            d = self.v1.get("devices")
            if d is None:
                warnings.append("GPU device nodes of other workers are not blocked: no cgroup v1 devices "
                                "controller (cgroup v2 device filtering is not implemented)")
            else:
                for rule in limits.deny_devices:
                    try:
                        _write(os.path.join(d, "devices.deny"), f"{rule} rwm")
                    except OSError as e:
                        warnings.append(f"cannot deny device {rule}: {e.strerror or e}")
        return warnings

    def _drop(self, d: str) -> None:
        if self.v2 == d:
            self.v2, self.v2_controllers = None, []
        self.v1 = {c: p for c, p in self.v1.items() if p != d}

    # ------------------------------------------------------------ processes
    def add(self, pid: int) -> list[str]:
        """Move `pid` into every folder; a folder that refuses it is removed and dropped. Returns warnings."""
        warnings = []
        for d in self.dirs:
            try:
                _write(os.path.join(d, "cgroup.procs"), str(pid))
            except OSError as e:
                warnings.append(f"cannot move pid {pid} into {d}: {e.strerror or e}")
                try:
                    os.rmdir(d)
                except OSError:
                    pass
                self._drop(d)
        return warnings

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            text = _read(os.path.join(d, "cgroup.procs"))
            if text:
                out.update(int(x) for x in text.split() if x.isdigit())
        return out

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this cgroup (v2 memory.events; v1 memory.oom_control's
        oom_kill, or memory.failcnt on kernels older than 4.13)."""
        d, version = self._dir("memory")
        if d is None:
            return 0
        if version == 2:
            return _field(_read(os.path.join(d, "memory.events")), "oom_kill")
        text = _read(os.path.join(d, "memory.oom_control")) or ""
        if "oom_kill " in text:
            return _field(text, "oom_kill")
        failcnt = (_read(os.path.join(d, "memory.failcnt")) or "0").strip()
        return 1 if failcnt.isdigit() and int(failcnt) > 0 else 0

    def kill(self) -> None:
        """SIGKILL everything in the cgroup: v2 cgroup.kill; v1: freeze, SIGKILL every process, thaw (a frozen
        tree cannot fork while it is killed). Callers repeat until pids() is empty."""
        if self.v2:
            try:
                _write(os.path.join(self.v2, "cgroup.kill"), "1")
            except OSError:
                pass
        freezer = self.v1.get("freezer")
        frozen = False
        if freezer:
            try:
                _write(os.path.join(freezer, "freezer.state"), "FROZEN")
                frozen = True
                end = time.monotonic() + 0.5
                while time.monotonic() < end and (_read(os.path.join(freezer, "freezer.state")) or "").strip() \
                        not in ("FROZEN", ""):
                    time.sleep(0.01)
            except OSError:
                pass
        try:
            for p in self.pids():
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        finally:
            if frozen:
                try:
                    _write(os.path.join(freezer, "freezer.state"), "THAWED")
                except OSError:
                    pass

    def remove(self, timeout: float = 1.0) -> bool:
        """Remove every folder (each must be empty of processes); True when none is left."""
        end = time.monotonic() + timeout
        left = self.dirs
        while True:
            still = []
            for d in left:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(d)
            if not still or time.monotonic() >= end:
                return not still
            left = still
            time.sleep(0.02)


def _field(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def all_roots(h: Hierarchies, mounts_file: str = "/proc/self/mounts") -> set[str]:
    """The workers' parent folder (as h's roots are named) in every cgroup hierarchy mounted here: h's own, and those
    Astraeus does not manage but runc makes a container's cgroup in too (cpuacct, cpuset, blkio, name=systemd on a
    cgroup v1 host)."""
    roots = {h.v2, *h.v1.values()} - {None}
    subdir = os.path.basename(next(iter(roots))) if roots else "astraeus"
    for m in _mounts(mounts_file):
        if len(m) >= 3 and m[2] in ("cgroup", "cgroup2") and os.path.isdir(os.path.join(m[1], subdir)):
            roots.add(os.path.join(m[1], subdir))
    return roots


def remove_everywhere(h: Hierarchies, name: str) -> None:
    """Remove the worker cgroup `name` from every hierarchy (all_roots) where it is left and empty."""
    for root in all_roots(h):
        try:
            os.rmdir(os.path.join(root, name))
        except OSError:
            pass


def leftovers(h: Hierarchies, prefix: str) -> list[str]:
    """Folders of worker cgroups named `<prefix>...` in every hierarchy mounted here (all_roots; for tests and the
    agent's sweep)."""
    out = []
    for root in all_roots(h):
        try:
            out += [os.path.join(root, n) for n in sorted(os.listdir(root)) if n.startswith(prefix)]
        except OSError:
            pass
    return out
