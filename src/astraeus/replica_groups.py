"""Replica groups, the pure part: given a group's wanted count and what became of its runs, which runs to create
and which to delete. The control plane's duty (server/replica_groups.py) reads the rows, calls `reconcile`, and
acts on the Decision.

A replica is alive while its run is Pending, Starting, Running or Stopping and not being deleted: a preempted
replica is queued again like any run and stays alive (it is not replaced); a replica whose worker restarts within
its restart budget stays alive too. A replica that ended (Completed, or Failed past its budget) or was deleted is
gone: a new run takes its place, named `<group>-<serial>`.

Backoff: replicas that keep failing are not replaced at once each time. The failures in a row are counted from the
group's most recently ended replicas (a Completed one, or a failed one that ran for 10 minutes, ends the streak);
the first failure is replaced at once, the second after `base` seconds, then 2 × base, 4 × base, … at most 5
minutes, counted from the last failure's end (`base` is the crash-loop backoff's, ASTRAEUS_RESTART_BACKOFF_BASE).

Scale-down removes waiting (Pending) replicas first, the newest first, then the most recently started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LIVE = ("Pending", "Starting", "Running", "Stopping")
ENDED = ("Completed", "Failed", "Cancelled")
BACKOFF_CAP = 300.0  # seconds: as a worker's crash-loop backoff
STREAK_RESET = 600.0  # a replica that ran this long before failing starts the count again
KEEP_ENDED = 10  # ended replicas kept for inspection (their logs, their reason); older ones are deleted
MAX_REPLICAS = 1000
SERIAL_DIGITS = 7  # room kept in a run's 63 characters for "-<serial>"
MAX_GROUP_NAME = 63 - 1 - SERIAL_DIGITS


def replica_name(group: str, serial: int) -> str:
    """The run name of a group's replica number `serial`: `web-3`."""
    return f"{group}-{serial}"


@dataclass(frozen=True)
class Replica:
    """What the reconciler needs to know of one of the group's runs."""

    name: str
    state: str  # the run's state
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    deleting: bool = False  # being deleted (or deleted: its name freed)
    handled: bool = False  # gone, and already replaced or removed on purpose (scale-down): nothing more to do

    @property
    def alive(self) -> bool:
        return self.state in LIVE and not self.deleting

    @property
    def failed(self) -> bool:
        return self.state == "Failed" and not self.deleting


@dataclass(frozen=True)
class Decision:
    create: int  # how many new replicas to create now
    replaces: tuple[str, ...]  # the gone replicas the new ones stand for (most recent first; at most `create`)
    scale_down: tuple[str, ...]  # alive replicas to delete, in order
    forget: tuple[str, ...]  # ended replicas past the KEEP_ENDED most recent: deleted
    failures: int  # replicas failed in a row
    retry_at: float | None  # replacements wait until then (None: no wait)
    backing_off: bool  # replicas are missing, and wait for retry_at
    alive: int
    missing: int


def backoff_delay(failures: int, base: float) -> float:
    """Seconds between the last failure and the next replacement after `failures` failures in a row: none after
    the first, then base, 2 × base, 4 × base, … at most BACKOFF_CAP."""
    if failures <= 1:
        return 0.0
    return min(base * 2 ** min(failures - 2, 32), BACKOFF_CAP)


def _end(r: Replica) -> float:
    return r.finished_at if r.finished_at is not None else r.created_at


def failure_streak(replicas: Sequence[Replica]) -> tuple[int, float | None]:
    """(failures in a row, when the last of them ended) from the group's ended replicas, most recent first.
    Deleted replicas are left out: they did not fail."""
    ended = sorted((r for r in replicas if r.state in ("Completed", "Failed") and not r.deleting),
                   key=_end, reverse=True)
    streak, last = 0, None
    for r in ended:
        if r.state != "Failed":
            break
        streak += 1
        last = _end(r) if last is None else last
        ran = (_end(r) - r.started_at) if r.started_at is not None else 0.0
        if ran >= STREAK_RESET:
            break
    return streak, last


def scale_down_order(replicas: Sequence[Replica]) -> list[Replica]:
    """Alive replicas in the order scale-down removes them: waiting (Pending) ones first, the newest first, then
    the most recently started."""
    alive = [r for r in replicas if r.alive]
    waiting = sorted((r for r in alive if r.state == "Pending"), key=lambda r: (r.created_at, r.name), reverse=True)
    started = sorted((r for r in alive if r.state != "Pending"),
                     key=lambda r: (r.started_at if r.started_at is not None else r.created_at, r.created_at, r.name),
                     reverse=True)
    return waiting + started


def reconcile(wanted: int, replicas: Sequence[Replica], at: float, base: float,
              retry_at: float | None = None) -> Decision:
    """What to do now for a group that wants `wanted` replicas and has `replicas` (alive and gone). `retry_at`:
    the group's own wait (after a refusal), honoured as the backoff is."""
    alive = [r for r in replicas if r.alive]
    missing = max(0, wanted - len(alive))
    extra = max(0, len(alive) - wanted)
    failures, last = failure_streak(replicas)
    wait_until = last + backoff_delay(failures, base) if last is not None and failures > 1 else None
    if retry_at is not None and retry_at > at and (wait_until is None or retry_at > wait_until):
        wait_until = retry_at
    backing_off = missing > 0 and wait_until is not None and wait_until > at
    create = 0 if backing_off else missing
    gone = sorted((r for r in replicas if not r.alive and not r.handled), key=_end, reverse=True)
    replaces = tuple(r.name for r in gone[:create])
    scale_down = tuple(r.name for r in scale_down_order(replicas)[:extra])
    ended = sorted((r for r in replicas if r.state in ENDED and not r.deleting), key=_end, reverse=True)
    forget = tuple(r.name for r in ended[KEEP_ENDED:] if r.handled)
    return Decision(create=create, replaces=replaces, scale_down=scale_down, forget=forget, failures=failures,
                    retry_at=wait_until if wait_until is not None and wait_until > at else None,
                    backing_off=backing_off, alive=len(alive), missing=missing)
