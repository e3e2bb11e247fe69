"""The per-worker supervisor in C (shim_native.c, built by `make install` into `astraeus-shim` beside this file),
started by the shim launcher (astraeus.agent.runtime.launcher) for the workers it can supervise: isolated ones (an
agent that runs as root, with the launcher's prepared view) that are not containers, whose drives and configs
need no new entry in the view's root. Every other worker, and every worker where the binary is missing or turned off (ASTRAEUS_NATIVE_SHIM=0 in the agent's
environment), gets the Python shim (astraeus.agent.runtime.shim), which keeps the same files and guarantees.

Why: the Python shim and its worker's PID 1 are two forks of a Python process per worker (page tables copied,
pages faulted in, then torn down again), a third of a trivial run's CPU on a small machine; the binary is 40 KiB.

Here, in the launcher, before the binary starts: the host's part of the start (shim.prepare_host: folders and
config files; the stop reason folder; the worker's cgroups and limits), its drives opened and handed over
(mounts.open_drive_dir, mounts.hand_over) and cloned with its configs as detached mounts (mounts.open_tree: what the
Python shim's PID 1 does in the host's namespace), what the worker's view shows (shim.exposed_paths) and its HOME
(shim.worker_home), all shared with the Python shim. The binary gets its plan on descriptor 4 (a pipe: `key=value`
entries ended by NUL, so that the worker's environment is never on a command line; its seccomp filter is the Python
shim's BPF program, astraeus.agent.runtime.seccomp, as hex), the prepared view's mount
namespace on descriptor 3 and the detached mounts from descriptor 5 on.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal

BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "astraeus-shim")
ENV_VAR = "ASTRAEUS_NATIVE_SHIM"  # in the agent: 0 turns it off; in the launcher: the binary's path


# What a binary built from an older shim_native.c lacks (a checkout updated without `make install`): it would ignore
# the plan's signal before the time limit (older still, its worker network and its seccomp filter), so such a binary
# is not used (every worker gets the Python shim)
CURRENT = b"before its time limit"


def binary_for_agent() -> str | None:
    """The binary the agent's launcher may use (None: the Python shim for every worker)."""
    from astraeus.settings import internal  # the agent's side: the launcher, which imports this module, never does

    if internal(ENV_VAR) == "0" or os.geteuid() != 0:
        return None
    if not os.access(BINARY, os.X_OK):
        return None
    try:
        with open(BINARY, "rb") as f:
            return BINARY if CURRENT in f.read() else None
    except OSError:
        return None


# What the binary holds of each (its fixed tables; the launcher's check, so that nothing is cut short there)
MAX_ITEMS = {"arg": 4095, "env": 4095, "hide": 255, "expose": 255, "mounts": 64}


def _fits(spec: dict, template) -> list[str] | None:
    """The folders the worker's view shows of its Python environment (shim.exposed_paths) when the binary can
    supervise this worker exactly as the Python shim would, else None."""
    if template is None or spec.get("container"):
        return None
    iso = spec.get("isolation")
    if not iso or os.geteuid() != 0 or not spec.get("command"):
        return None
    mounts = [*(spec.get("mounts") or []), *(spec.get("configs") or [])]
    if (len(mounts) > MAX_ITEMS["mounts"] or len(spec.get("env") or {}) >= MAX_ITEMS["env"]
            or len(spec.get("args") or []) >= MAX_ITEMS["arg"] - 1 or len(iso.get("hide") or []) >= MAX_ITEMS["hide"]):
        return None
    # a path the view must make whose first missing folder would be a new entry in / needs a view built from
    # scratch (mounts.NeedFresh), and a path that is not absolute an error message: both are the Python shim's
    from astraeus.agent.runtime.shim import exposed_paths

    exposed = exposed_paths(spec, iso)
    if len(exposed) >= MAX_ITEMS["expose"]:
        return None
    for p in [*exposed, spec.get("cwd") or "/", *(str(m.get("mount_path") or "") for m in mounts)]:
        first = "/" + p.strip("/").split("/", 1)[0]
        if not os.path.isabs(p) or (first != "/" and not os.path.lexists(first)):
            return None
    return exposed


def _mountables(spec: dict, d: str, iso: dict) -> list[tuple[str, int, bool, str]]:
    """The drives' and configs' sources as detached mounts (open_tree, made here in the host's namespace, as the
    Python shim's PID 1 makes them): ("drive" or "config", descriptor, read-only, mount path). A drive's folder is
    opened without following symlinks and handed over to the workspace's user as the Python shim does."""
    from astraeus.agent.runtime import mounts

    out: list[tuple[str, int, bool, str]] = []
    try:
        for m in spec.get("mounts") or []:
            fd = mounts.open_drive_dir(m["host_path"], m.get("granted_root"), bool(m.get("create")), iso)
            try:
                if not m.get("read_only"):
                    mounts.hand_over(fd, iso["uid"], iso["gid"], bool(m.get("create")))
                tree = mounts.open_tree(fd)
            finally:
                os.close(fd)
            out.append(("drive", tree, bool(m.get("read_only")), os.path.normpath(m["mount_path"])))
        for i, c in enumerate(spec.get("configs") or []):
            fd = os.open(os.path.join(d, "configs", str(i)), os.O_PATH | os.O_CLOEXEC)
            try:
                tree = mounts.open_tree(fd)
            finally:
                os.close(fd)
            out.append(("config", tree, True, os.path.normpath(c["mount_path"])))
    except BaseException:
        for _, fd, _, _ in out:
            os.close(fd)
        raise
    return out


def _entries(key: str, values) -> list[bytes]:
    out = []
    for v in values:
        b = os.fsencode(str(v))
        if b"\0" in b:
            raise ValueError(f"{key} holds a NUL byte")
        out.append(key.encode() + b"=" + b)
    return out


def plan(spec_path: str, spec_text: str, spec: dict, exposed: list[str],
         mountables: list[tuple[str, int, bool, str]]) -> bytes:
    """Make the worker's cgroups with its limits and say what the binary needs: `exposed`, what its view shows of
    its Python environment (_fits); `mountables`, its drives and configs at the descriptors the binary will have
    them at. Raises OSError or ValueError when something here fails: the launcher then starts the Python shim,
    which does it all again and reports what failed (failed.json)."""
    from astraeus.agent.runtime import cgroups
    from astraeus.agent.runtime.shim import worker_home

    d = os.path.dirname(os.path.abspath(spec_path))
    iso = spec["isolation"]
    cwd = spec.get("cwd") or "/"
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    worker_home(env, cwd, iso)
    warns: list[str] = []
    limits = cgroups.Limits.from_json(spec.get("limits"))
    cg = cgroups.WorkerCgroup.from_json(spec.get("cgroups") or spec.get("cgroup"))
    if cg is None:
        if limits.memory_bytes or limits.cpu_cores or limits.pids_max or limits.deny_devices:
            warns.append("no cgroup on this machine: the worker's limits are not enforced")
    else:
        try:
            warns += cg.create(limits)
        except OSError as e:
            warns.append(f"no cgroup ({cg.name}): {e}; the worker's limits are not enforced")
            cg = None
    limit = (spec.get("limits") or {}).get("memory_bytes") or None
    if limit:
        from astraeus.units import human_bytes

        oom_message = f"killed by the kernel: out of memory (limit {human_bytes(limit)})"
    else:
        oom_message = "killed by the kernel: out of memory"

    items: list[bytes] = []
    one = {"dir": d, "cwd": cwd, "command": spec["command"], "marker": spec.get("marker") or "",
           "spec": spec_text, "uid": int(iso["uid"]), "gid": int(iso["gid"]),
           "stop_grace": float(spec.get("stop_grace", 30)),
           "log_half": max(32 * 1024, int(spec.get("log_file_bytes") or 64 * 1024**2) // 2),
           "limits": json.dumps(spec.get("limits")), "oom_message": oom_message,
           "oom_limit": json.dumps(limit)}
    if cg is not None and cg.dirs:
        mem, version = cg._dir("memory")
        one.update({"cgroup": json.dumps(cg.primary), "cgroups": json.dumps(cg.to_json())})
        if cg.v2:
            one["cg_v2"] = cg.v2
        if cg.v1.get("freezer"):
            one["cg_freezer"] = cg.v1["freezer"]
        if mem:
            one.update({"cg_mem": mem, "cg_mem_v": version})
        items += _entries("cg", cg.dirs)
    plan_signal = spec.get("signal")
    if plan_signal:  # "SIGNO AFTER BATCH_ONLY" (the Python shim's check_signal)
        one["signal"] = f"{int(plan_signal['signo'])} {float(plan_signal['after'])} {int(bool(plan_signal.get('batch_only')))}"
    for k, v in one.items():
        items += _entries(k, [v])
    if iso.get("netns"):
        items += _entries("netns", [iso["netns"]])
    items += _entries("arg", [spec["command"], *(spec.get("args") or [])])
    for k in env:
        if "=" in k or not k:
            raise ValueError(f"environment variable name {k!r}")
    items += _entries("env", [f"{k}={v}" for k, v in env.items()])
    items += _entries("hide", [os.path.normpath(h) for h in iso.get("hide") or []])
    items += _entries("expose", exposed)
    from astraeus.agent.runtime.shim import SECCOMP_PROGRAM

    if SECCOMP_PROGRAM is not None:  # the Python shim's filter, byte for byte: the binary holds no table of its own
        items += _entries("seccomp", [SECCOMP_PROGRAM.hex()])
    else:
        warns.append(f"no seccomp filter: this machine's system calls ({os.uname().machine}) are not known here")
    items += _entries("warn", warns)
    for kind, fd, ro, path in mountables:
        items += _entries(kind, [f"{fd} {int(ro)} {path}"])
    return b"".join(i + b"\0" for i in items)


def start(binary: str, req: dict, template) -> int | None:
    """In the launcher: start the binary for this request ({"argv": [spec.json], "env", "stderr"}) with the
    prepared view `template`; its pid, or None when the worker is not one for it (the Python shim is forked
    instead). Answers as soon as it has started, as the fork does."""
    spec_path = str(req["argv"][0])
    with open(spec_path) as f:
        spec_text = f.read()
    spec = json.loads(spec_text)
    exposed = _fits(spec, template)
    if exposed is None:
        return None
    from astraeus.agent.runtime.shim import prepare_host, signal_dir

    d = os.path.dirname(os.path.abspath(spec_path))
    iso = spec["isolation"]
    if prepare_host(spec, d, iso):
        raise OSError("the worker's folders cannot be made here")
    signal_dir(d, iso)
    held: list[int] = []  # ours, all above the descriptors the binary gets them at (3, 4, then 5, 6 ...)
    w = -1
    try:
        found = _mountables(spec, d, iso)
        try:
            held += [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for _, fd, _, _ in found]
        finally:
            for _, fd, _, _ in found:
                os.close(fd)
        at = [(kind, 5 + i, ro, path) for i, (kind, _, ro, path) in enumerate(found)]
        data = plan(spec_path, spec_text, spec, exposed, at)
        r, w = os.pipe()
        view = fcntl.fcntl(template[0], fcntl.F_DUPFD_CLOEXEC, 100)
        held.append(view)
        plan_r = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 100)
        held.append(plan_r)
        os.close(r)
        env = {str(k): str(v) for k, v in req["env"].items()}
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
                   (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_RDWR, 0),
                   (os.POSIX_SPAWN_OPEN, 2, str(req["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                   (os.POSIX_SPAWN_DUP2, view, 3), (os.POSIX_SPAWN_DUP2, plan_r, 4),
                   *((os.POSIX_SPAWN_DUP2, fd, n) for fd, (_, n, _, _) in zip(held, at, strict=False))]
        pid = os.posix_spawn(binary, ["astraeus-shim-native"], env, file_actions=actions, setsid=True, setsigmask=(),
                             setsigdef=(signal.SIGCHLD, signal.SIGPIPE, signal.SIGTERM, signal.SIGINT,
                                        signal.SIGHUP, signal.SIGUSR1, signal.SIGXFSZ))
    except BaseException:
        if w >= 0:
            os.close(w)
        raise
    finally:
        for fd in held:
            os.close(fd)
    try:
        _write_all(w, data)
    except OSError:
        pass  # it ended before reading its plan: it wrote nothing; the agent's start times out as for a crash
    finally:
        os.close(w)
    return pid


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
