"""The OCI runtime configuration (runc's config.json) of one container worker: a pure function of what the shim
knows (the image's config, the worker's spec, the paths it prepared). Stdlib only: the shim imports it.

What a container worker gets (issue 14; docs/api.md):
- the image's root filesystem (an overlay made by the shim: a fresh upper layer per attempt), the image's `Env`,
  `WorkingDir`, entrypoint and cmd, overridden as Kubernetes does: a run's `command` replaces the image's
  entrypoint (and its cmd), its `args` replace the cmd;
- the workspace's unprivileged uid/gid whatever user the image names (no capabilities at all, no_new_privs);
- its own PID (joined: the shim's reaper is PID 1, so the command is PID 2 and gets SIGTERM as any process
  does), mount, IPC and UTS namespaces; the host's network (NCCL and torchrun need the machine's interfaces);
- /dev/shm sized for data loaders; the host's /etc/hosts and /etc/resolv.conf read-only;
- drives and configs at their mount paths; the stop reason folder at /run/astraeus (read-only), and in it
  /run/astraeus/work, the worker's own folder (read-write, noexec) for its progress and checkpoint files;
- only its assigned GPU device nodes (the device cgroup denies every other device but the usual /dev ones).
"""

from __future__ import annotations

from astraeus.agent.runtime import seccomp

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SIGNAL_DIR = "/run/astraeus"  # where the worker reads its stop reason (ASTRAEUS_STOP_REASON_FILE)
STOP_REASON_FILE = SIGNAL_DIR + "/stop-reason"
WORK_DIR = SIGNAL_DIR + "/work"  # the worker's own writable folder: its progress and checkpoint files (issue 47)
TOOLS_DIR = "/opt/astraeus/bin"  # Astraeus' srun and scontrol (astraeus.agent.slurm), read-only, first on PATH

# Docker's defaults: kernel interfaces a container has no business reading or writing.
MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


# The system calls a worker may not make (new namespaces, mounts, keyrings, BPF, ...): one definition for both
# runtimes, astraeus.agent.runtime.seccomp (the process runtime installs the same refusals as a BPF program).
SECCOMP_DENIED = list(seccomp.DENIED)
CLONE_NAMESPACE_FLAGS = seccomp.CLONE_NAMESPACE_FLAGS


def seccomp_profile() -> dict:
    """Allow by default; EPERM for SECCOMP_DENIED and for clone() asking for a new namespace; clone3 answers
    ENOSYS so that the C library falls back to clone(), whose flags a filter can read (seccomp.oci_profile)."""
    return seccomp.oci_profile()


def process_args(command: str | None, args: list[str] | None, entrypoint: list[str] | None,
                 cmd: list[str] | None) -> list[str]:
    """The container's argv. A command replaces the image's entrypoint and cmd; args alone replace its cmd."""
    args = [str(a) for a in args or []]
    if command:
        return [command, *args]
    return [*(entrypoint or []), *(args if args else (cmd or []))]


def merge_env(image_env: list[str] | None, env: dict[str, str]) -> dict[str, str]:
    """The image's Env, then the worker's own variables over it; PATH as Docker's default when neither sets it."""
    out: dict[str, str] = {}
    for item in image_env or []:
        k, sep, v = str(item).partition("=")
        if sep and k:
            out[k] = v
    out.update({str(k): str(v) for k, v in env.items()})
    out.setdefault("PATH", DEFAULT_PATH)
    return out


def _bind(source: str, destination: str, read_only: bool) -> dict:
    opts = ["rbind", "nosuid", "nodev", "ro" if read_only else "rw"]
    return {"destination": destination, "type": "bind", "source": source, "options": opts}


def build_config(*, rootfs: str, argv: list[str], env: dict[str, str], cwd: str, uid: int, gid: int,
                 hostname: str, pid_namespace: str, cgroups_path: str, shm_bytes: int,
                 nofile: int = 1048576, binds: list[tuple[str, str, bool]] = (),
                 devices: list[dict] = (), host_files: list[str] = (), hooks: dict | None = None,
                 memory_bytes: int | None = None, cpu_cores: float | None = None,
                 pids_max: int | None = None, network: str | None = None, work: str | None = None) -> dict:
    """runc's config.json. `binds`: (source on the host, path in the container, read-only); `devices`:
    {"path", "type", "major", "minor"} of device nodes the worker may use (its GPUs); `host_files`: host files
    shown read-only at the same path (/etc/hosts, /etc/resolv.conf); `network`: the
    worker's own network namespace (astraeus.agent.network), None for the machine's; `work`: the host folder
    shown read-write (nosuid, nodev, noexec) at WORK_DIR, after the read-only stop reason folder it lies in."""
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={max(1 << 20, int(shm_bytes))}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
    ]
    mounts += [_bind(f, f, True) for f in host_files]
    mounts += [_bind(src, dst, ro) for src, dst, ro in binds]
    if work:
        mounts.append({"destination": WORK_DIR, "type": "bind", "source": work,
                       "options": ["rbind", "nosuid", "nodev", "noexec", "rw"]})
    allow = [{"allow": False, "access": "rwm"}]
    nodes = []
    for d in devices:
        nodes.append({"path": d["path"], "type": d.get("type", "c"), "major": int(d["major"]),
                      "minor": int(d["minor"]), "fileMode": 0o666, "uid": 0, "gid": 0})
        allow.append({"allow": True, "type": d.get("type", "c"), "major": int(d["major"]),
                      "minor": int(d["minor"]), "access": "rwm"})
    resources: dict = {"devices": allow}
    # The shim made the cgroup with these limits already; runc writes them too, so they hold wherever runc
    # places the container.
    if memory_bytes:
        resources["memory"] = {"limit": int(memory_bytes)}
    if cpu_cores:
        resources["cpu"] = {"quota": max(1000, int(round(cpu_cores * 100_000))), "period": 100_000}
    if pids_max:
        resources["pids"] = {"limit": int(pids_max)}
    no_caps: list[str] = []
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid), "additionalGids": []},
            "args": list(argv),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd or "/",
            "capabilities": {k: list(no_caps) for k in ("bounding", "effective", "inheritable", "permitted",
                                                          "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": int(nofile), "soft": int(nofile)}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid", "path": pid_namespace}, {"type": "ipc"}, {"type": "uts"},
                           {"type": "mount"}] + ([{"type": "network", "path": network}] if network else []),
            "cgroupsPath": cgroups_path,
            "resources": resources,
            "devices": nodes,
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
            "seccomp": seccomp_profile(),
        },
    }
    if hooks:
        config["hooks"] = {k: list(v) for k, v in hooks.items()}
    return config


def with_path_prepended(env: dict[str, str], prepend: dict[str, str]) -> dict[str, str]:
    """`env` with each folder put in front of its variable (PATH, LD_LIBRARY_PATH), unless already there."""
    out = dict(env)
    for var, folder in prepend.items():
        parts = [p for p in out.get(var, "").split(":") if p]
        if folder not in parts:
            out[var] = ":".join([folder, *parts])
    return out
