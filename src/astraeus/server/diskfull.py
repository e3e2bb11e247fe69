"""The control plane on a full disk (issue 42, item 4): what a write that failed for want of space is, and this
process's memory of it.

A write fails for want of space as SQLite's `database or disk is full` (SQLITE_FULL), PostgreSQL's `disk_full`
(SQLSTATE 53100, `could not extend file …: No space left on device`) or an OSError ENOSPC / EDQUOT. Such a request
is answered 503 `DISK_FULL` with `The control plane cannot write: no space left on the disk of <path> (<what the
database said>); free space there` (nothing of it was written: its transaction was rolled back, and a client may
send it again), `/healthz` answers 503 with the same reason, and the scheduling lease and loop keep trying.

Nothing is refused up front: every request still tries its write, so the control plane writes again the moment
space returns, with no restart. `/healthz` stops saying so when it has reason to think space is back: on SQLite
once the home's filesystem has SPACE_BACK bytes free again (a small write may still fit in SQLite's write-ahead
log while a larger one fails, so a write that succeeded proves little there); on PostgreSQL, whose disk this
process cannot look at, once a write is committed again.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger("astraeus.diskfull")

SQLITE_FULL = 13
PG_DISK_FULL = "53100"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# SQLite: free bytes on the home's filesystem from which /healthz takes it that writes fit again
SPACE_BACK = 4 << 20


def cause(exc: BaseException | None) -> tuple[str, str | None] | None:
    """(what the writer said, the path whose disk is full or None) when `exc` (or what it was raised from) is a
    write that failed for want of space; else None."""
    seen = 0
    while exc is not None and seen < 8:
        seen += 1
        orig = getattr(exc, "orig", None)  # sqlalchemy's DBAPIError: the driver's error
        for e in (orig, exc) if orig is not None else (exc,):
            if isinstance(e, OSError) and e.errno in NO_SPACE:
                return (e.strerror or "No space left on device"), e.filename
            code = getattr(e, "sqlite_errorcode", None)
            text = str(e).splitlines()[0] if str(e) else ""
            if code == SQLITE_FULL or (type(e).__module__.startswith("sqlite3") and "disk is full" in text):
                return "database or disk is full", None
            state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
            if state == PG_DISK_FULL or (state and "No space left on device" in text):
                return text.removeprefix("ERROR:  ").strip() or "disk full", None
        exc = exc.__cause__ or exc.__context__
    return None


def free_bytes(path: Path) -> int | None:
    """The bytes this process may still write on `path`'s filesystem (root may use the reserved blocks)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


class WriteHealth:
    """Whether this control plane can write, as its last writes found. `home`: where the SQLite database is (its
    filesystem is looked at); None on PostgreSQL (the database server's disk)."""

    def __init__(self, home: Path | None):
        self.home = home
        self._lock = threading.Lock()
        self._reason: str | None = None
        self.since: float | None = None

    def message(self, said: str, path: str | None) -> str:
        if self.home is not None or path:
            where = os.path.dirname(path) if path and not os.path.isdir(path) else path
            where = where or str(self.home)
            return (f"The control plane cannot write: no space left on the disk of {where} ({said}); free space "
                    "there")
        return (f"The control plane cannot write: no space left on the database server's disk ({said}); free "
                "space there")

    def failed(self, exc: BaseException) -> str | None:
        """The reason when `exc` is a write that failed for want of space (remembered for /healthz), else None."""
        found = cause(exc)
        if found is None:
            return None
        reason = self.message(*found)
        with self._lock:
            new = self._reason is None
            self._reason = reason
            if new:
                self.since = time.time()
        if new:
            log.error("%s", reason)
        return reason

    def wrote(self) -> None:
        """A write was committed: on PostgreSQL, space is back (SQLite: see reason())."""
        if self._reason is not None and self.home is None:
            self._clear()

    def _clear(self) -> None:
        with self._lock:
            was, self._reason, self.since = self._reason, None, None
        if was is not None:
            log.warning("the control plane writes again (space is back)")

    @property
    def reason(self) -> str | None:
        """Why this control plane cannot write now, or None."""
        if self._reason is not None and self.home is not None:
            free = free_bytes(self.home)
            if free is not None and free >= SPACE_BACK:
                self._clear()
        return self._reason


# Sessions commit through any engine; each engine's WriteHealth hears of the commits that wrote.
_BY_ENGINE: dict[int, WriteHealth] = {}


def watch(engine, health: WriteHealth) -> None:
    _BY_ENGINE[id(engine)] = health


@event.listens_for(Session, "after_commit", insert=True)  # ahead of services' listener, which forgets "wrote"
def _committed(session: Session) -> None:
    if not _BY_ENGINE or not session.info.get("wrote"):
        return
    try:
        bind = session.get_bind()
    except Exception:
        return
    health = _BY_ENGINE.get(id(getattr(bind, "engine", bind)))
    if health is not None:
        health.wrote()


# --------------------------------------------------------------------------------- a machine's disk pressure
# This control plane's ASTRAEUS_DISK_PRESSURE_FREE_PERCENT (set by ControlPlane.open), for every snapshot it builds
PRESSURE_BELOW = 5.0
# ASTRAEUS_DEFAULT_EPHEMERAL_STORAGE_BYTES: a worker's ephemeral storage limit when its run sets none (None: none)
EPHEMERAL_DEFAULT: int | None = None

def disk_pressure(path: str | None, free: int | None, total: int | None, below_percent: float) -> str | None:
    """A machine's reason to take no new workers when its agent's state dir has less than `below_percent` of its
    filesystem free (`Disk pressure: 3% free on /var/lib/astraeus`), else None (also for an older agent that does
    not say, and with `below_percent` 0)."""
    if not below_percent or free is None or not total:
        return None
    share = 100.0 * free / total
    if share >= below_percent:
        return None
    shown = f"{share:.1f}" if share < 1 and free else f"{int(share)}"
    return f"Disk pressure: {shown}% free on {path or 'its state dir'}"


def record_disk(m, disk) -> bool:
    """Keep what an agent reported of its disk (protocol.Disk, or None: nothing said) on machine row `m`; whether
    that changes the machine's disk pressure (the scheduler should look again)."""
    if disk is None:
        return False
    before = disk_pressure(m.disk_path, m.disk_free_bytes, m.disk_total_bytes, PRESSURE_BELOW)
    m.disk_path, m.disk_free_bytes, m.disk_total_bytes = disk.path, disk.free_bytes, disk.total_bytes
    after = disk_pressure(m.disk_path, m.disk_free_bytes, m.disk_total_bytes, PRESSURE_BELOW)
    return (before is None) != (after is None)


def disk_changed(m, disk) -> bool:
    """Whether a report's disk differs enough from the row's to be written (a whole percent, or the path)."""
    if disk is None:
        return False
    if m.disk_path != disk.path or not m.disk_total_bytes or m.disk_total_bytes != disk.total_bytes:
        return True
    was = int(100 * (m.disk_free_bytes or 0) / m.disk_total_bytes)
    return was != int(100 * disk.free_bytes / disk.total_bytes) if disk.total_bytes else False
