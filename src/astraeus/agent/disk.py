"""The agent's disk: what it reports of its state dir's filesystem (disk pressure, issue 42 item 4), and the
measured limits it enforces: each worker's ephemeral storage and each sized drive's folder (eviction)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from astraeus import protocol as P

log = logging.getLogger("astraeus.agent")


def disk_of(path: str) -> P.Disk | None:
    """The filesystem of `path` as statvfs sees it (the free bytes an unprivileged user may still write: the
    workers'), or None when it cannot be looked at."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return P.Disk(path=path, free_bytes=st.f_bavail * st.f_frsize, total_bytes=st.f_blocks * st.f_frsize)


# ------------------------------------------------------------------------------- ephemeral storage (eviction)
# How often the agent measures its workers' disk use (as the kubelet's housekeeping, a measured limit: a worker may
# pass its limit by what it writes in one period before it is stopped).
MEASURE_EVERY = 2.0
EVICTED = "Evicted: "


def used_bytes(root: str, stop_above: int | None = None) -> int:
    """The bytes the files under `root` take on disk (allocated blocks, as du), on `root`'s filesystem only (a
    mount inside it, such as a drive, is not counted); 0 when it is not there. With `stop_above`, the walk ends as
    soon as the sum passes it (the answer is then only "more than stop_above": a full drive costs little)."""
    try:
        dev = os.lstat(root).st_dev
    except OSError:
        return 0
    total, stack = 0, [root]
    while stack:
        if stop_above is not None and total > stop_above:
            break
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_dev != dev:
                        continue
                    total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            continue
    return total


def eviction(used: int, limit: int | None) -> str | None:
    """The reason a worker using `used` bytes of ephemeral storage is stopped for, or None (no limit, or under it)."""
    if not limit or used <= limit:
        return None
    from astraeus.units import human_bytes

    return f"{EVICTED}disk use over its limit ({human_bytes(limit)})"


def drive_eviction(drive: str, used: int, size: int | None) -> str | None:
    """The reason a worker writing to drive `drive` whose folder holds `used` bytes is stopped for, or None."""
    if not size or used <= size:
        return None
    from astraeus.units import human_bytes

    return f"{EVICTED}drive {drive} over its size ({human_bytes(size)})"


# A drive of many files costs a long walk: the next measure of a folder comes after at least 1/DRIVE_SHARE times
# what the last one took (a walk of 1 s: every 10 s), so measuring drives takes at most about a tenth of a core.
DRIVE_SHARE = 0.1


def measured(m: P.Mount) -> bool:
    """Whether the agent measures this mount's drive: a sized drive the worker writes to (ReadWrite) whose folder
    is on this machine (its own disk, or a shared filesystem mounted here). A drive kept on another machine and
    mounted over NFS is not measured here (a walk over the network each time would be costly): the keeping
    machine's own writers are evicted, the NFS writers are not."""
    return bool(m.size_bytes) and not m.read_only and m.nfs is None


def drive_used_bytes(host_path: str, granted_root: str | None, stop_above: int | None = None) -> int | None:
    """The bytes in a drive's folder, opened as the runtime opens it to mount it (below its granted root, never
    through a symlink: runtime.mounts.open_drive_dir), or None when it cannot be opened."""
    from astraeus.agent.runtime.mounts import MountError, open_drive_dir

    try:
        fd = open_drive_dir(host_path, granted_root, False)
    except (MountError, OSError):
        return None
    try:
        return used_bytes(f"/proc/self/fd/{fd}/", stop_above)  # the trailing / resolves the descriptor's folder
    finally:
        os.close(fd)


def ephemeral_paths(runtime, worker: str, attempt: int, pid: int | None) -> list[str]:
    """What counts toward a worker's ephemeral storage: its work folder, its container's writable layer, and its
    /tmp and /dev/shm where they are its own (a private filesystem, not the host's)."""
    d = runtime.dir(worker, attempt)
    out = [os.path.join(d, "work")]
    if hasattr(runtime, "containers_dir") and hasattr(runtime, "container_id"):
        out.append(os.path.join(runtime.containers_dir, runtime.container_id(worker, attempt)))
    if pid:
        for p in ("/tmp", "/dev/shm"):
            mine = f"/proc/{pid}/root{p}"
            try:
                if os.stat(mine).st_dev != os.stat(p).st_dev:
                    out.append(mine)
            except OSError:
                pass
    return out


class EvictionWatch:
    """The agent's thread that measures each running worker with an ephemeral storage limit every MEASURE_EVERY
    seconds and stops one over it, with `Evicted: disk use over its limit (10 GiB)` as its stop reason and as the
    message of its end in the agent's reports (the control plane then applies its restart policy). Evictions are
    remembered in the attempt's folder (evicted.json), so a restarted agent still reports why.

    It measures the folders of sized drives as well (`spec.size_bytes`, `measured`): each folder once per check
    whatever number of workers write to it (a folder of many files less often: DRIVE_SHARE); over its size, every
    running worker here writing to it is stopped with `Evicted: drive ckpt over its size (64 MiB)`, the same way.
    A restarted attempt finds the drive still full, and is evicted again until files are removed from it."""

    def __init__(self, agent):
        self.agent = agent
        self.drive_due: dict[tuple[str, str | None], float] = {}  # a drive folder -> when it is measured next

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, name="agent-disk", daemon=True)
        t.start()
        return t

    def _run(self) -> None:
        a = self.agent
        while not a.stopping.wait(MEASURE_EVERY):
            try:
                self.check()
            except Exception:  # noqa: BLE001 -- measuring must never stop the agent
                log.exception("measuring the workers' disk use failed")

    def check(self) -> None:
        a = self.agent
        with a.lock:
            assigned = dict(a.assignments or {})
        running = {}
        for key, asg in assigned.items():
            limit = getattr(asg, "ephemeral_storage_bytes", None)
            if asg.desired != "Running" or not (limit or any(measured(m) for m in asg.mounts)):
                continue
            st = a.runtime.status(*key)
            if st is None or st.final or st.stopping:
                continue
            running[key] = asg
            if not limit:
                continue
            used = sum(used_bytes(p) for p in ephemeral_paths(a.runtime, key[0], key[1], st.pid))
            reason = eviction(used, limit)
            if reason is not None:
                self.evict(key, reason, used)
                del running[key]
        self.check_drives(running)

    def check_drives(self, running: dict) -> None:
        """Measure the sized drive folders the running workers `running` ({key: assignment}) write to, where due,
        and evict each writer of a folder over its drive's size."""
        writers: dict[tuple[str, str | None], list[tuple[tuple[str, int], P.Mount]]] = {}
        for key, asg in running.items():
            for m in asg.mounts:
                if measured(m):
                    writers.setdefault((m.host_path, m.granted_root), []).append((key, m))
        self.drive_due = {k: v for k, v in self.drive_due.items() if k in writers}
        for folder, ws in writers.items():
            start = time.monotonic()
            if self.drive_due.get(folder, 0.0) > start:
                continue
            used = drive_used_bytes(*folder, stop_above=max(m.size_bytes for _, m in ws))
            self.drive_due[folder] = start + (time.monotonic() - start) / DRIVE_SHARE
            if used is None:
                continue
            for key, m in ws:
                reason = drive_eviction(m.drive or m.mount_path, used, m.size_bytes)
                if reason is not None:
                    self.evict(key, reason, used)

    def evict(self, key: tuple[str, int], reason: str, used: int) -> None:
        """Stop attempt `key` with `reason`, remembered in its folder (evicted.json) for its reports."""
        a = self.agent
        log.warning("evicting %s attempt %s: %d bytes on disk; %s", key[0], key[1], used, reason)
        try:
            with open(os.path.join(a.runtime.dir(*key), "evicted.json"), "w") as f:
                json.dump({"reason": reason, "used_bytes": used}, f)
        except OSError:
            pass
        a.runtime.stop(key[0], key[1], grace=a.stop_grace, wait=False, reason=reason)
        a.wake_report.set()


def mark_evicted(runtime, reports: list[P.WorkerReport]) -> list[P.WorkerReport]:
    """The reports of ended attempts that were evicted, with the eviction as their message."""
    out = []
    for r in reports:
        if r.state == "Exited":
            try:
                with open(os.path.join(runtime.dir(r.worker, r.attempt), "evicted.json")) as f:
                    r = r.model_copy(update={"message": json.load(f)["reason"]})
            except (OSError, ValueError, KeyError, TypeError):
                pass
        out.append(r)
    return out
