"""The agent's disk: what it reports of its state dir's filesystem (disk pressure, issue 42 item 4)."""

from __future__ import annotations

import json
import logging
import os
import threading

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


def used_bytes(root: str) -> int:
    """The bytes the files under `root` take on disk (allocated blocks, as du), on `root`'s filesystem only (a
    mount inside it, such as a drive, is not counted); 0 when it is not there."""
    try:
        dev = os.lstat(root).st_dev
    except OSError:
        return 0
    total, stack = 0, [root]
    while stack:
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
    remembered in the attempt's folder (evicted.json), so a restarted agent still reports why."""

    def __init__(self, agent):
        self.agent = agent

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
        for key, asg in assigned.items():
            limit = getattr(asg, "ephemeral_storage_bytes", None)
            if not limit or asg.desired != "Running":
                continue
            st = a.runtime.status(*key)
            if st is None or st.final or st.stopping:
                continue
            used = sum(used_bytes(p) for p in ephemeral_paths(a.runtime, key[0], key[1], st.pid))
            reason = eviction(used, limit)
            if reason is None:
                continue
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
