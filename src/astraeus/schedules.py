"""Schedules, the pure part: the ticks of a cron line in a time zone, and which ticks are due at an instant.

A schedule's `schedule` is a five-field cron line ("0 2 * * *", parsed by the `croniter` library, so every form
cron knows works: lists, ranges, steps, names, `@daily`); its `timezone` is an IANA name ("Europe/Berlin",
read with `zoneinfo`). The cron line is read on the zone's wall clock. Where the wall clock is not a straight line,
the rules are cron's (Vixie cron's, which Kubernetes' CronJobs also follow for fixed-time jobs):

- **A skipped hour** (the clocks go forward: 02:00-03:00 does not exist in Berlin on the last Sunday of March):
  each tick inside it happens once, at the shift (03:00 local), and all of them together are one tick there;
  a tick the cron line has at the shift itself is that same tick. Its name is the wall time it happens at
  (`202603290300`), never a time that did not exist.
- **A repeated hour** (the clocks go back: 02:00-03:00 happens twice on the last Sunday of October): it ticks once,
  on its first pass (summer time); the second pass has no ticks. So a tick's name (its wall time,
  `YYYYMMDDHHMM`) is never used twice, which is what makes it a key: one run `<schedule>-<YYYYMMDDHHMM>` per tick.

Ticks that were missed (the control plane was down, or no replica led) are treated by the starting deadline:
**each** missed tick that is at most `starting_deadline_seconds` old is caught up, oldest first, exactly as if it
had been on time (the concurrency policy applies to each); the ticks older than that are skipped together, with
one event saying how many and from when to when. (Kubernetes makes only the newest missed tick; we make each, so
that a tick inside the deadline is never lost: a restart of a few seconds across a tick does not change what runs.)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

UTC = dt.UTC
CONCURRENCY = ("Allow", "Forbid", "Replace")
MAX_DUE = 50  # the most ticks handled in one pass (the rest in the next)
MAX_MISSED_COUNTED = 1_000  # beyond this many missed ticks, the count says "more than"


def check_cron(line: str) -> str:
    """The cron line, or ValueError saying what is wrong with it."""
    if not isinstance(line, str) or not line.strip():
        raise ValueError("give a cron line of five fields: minute hour day-of-month month day-of-week, "
                         "e.g. '0 2 * * *' (02:00 every day)")
    line = " ".join(line.split())
    if len(line.split()) != 5 and not line.startswith("@"):
        raise ValueError(f"{line!r} has {len(line.split())} fields: a cron line has five (minute hour day-of-month "
                         "month day-of-week), e.g. '0 2 * * *' (02:00 every day)")
    if not croniter.is_valid(line):
        raise ValueError(f"{line!r} is not a valid cron line: five fields (minute 0-59, hour 0-23, day-of-month "
                         "1-31, month 1-12, day-of-week 0-6), each *, a number, a range a-b, a list a,b or a step "
                         "*/n; e.g. '0 2 * * *'")
    try:
        croniter(line, dt.datetime(2000, 1, 1)).get_next(dt.datetime)
    except ValueError:  # croniter's CroniterBadDateError: a day that no month has ('0 0 31 2 *')
        raise ValueError(f"{line!r} never ticks: no date matches it (check the day of the month against the "
                         "month)") from None
    return line


def check_timezone(name: str) -> ZoneInfo:
    """The zone, or ValueError naming the problem (an IANA name such as "Europe/Berlin" or "UTC")."""
    if not isinstance(name, str) or not name or name not in _zones():
        raise ValueError(f"unknown time zone {name!r}: use an IANA time zone name such as 'UTC', "
                         "'Europe/Berlin' or 'America/New_York'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(f"unknown time zone {name!r}: {e}") from None


_ZONES: set[str] | None = None


def _zones() -> set[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = set(available_timezones()) | {"UTC"}
    return _ZONES


@dataclass(frozen=True)
class Tick:
    at: float  # the instant (seconds since the epoch)
    name: str  # its wall time in the schedule's zone, YYYYMMDDHHMM: the run is <schedule>-<name>


def _instant(wall: dt.datetime, tz: ZoneInfo) -> float:
    """The instant a tick at naive wall time `wall` happens: its first occurrence if the wall time happens twice,
    the shift itself if it does not exist."""
    first = wall.replace(tzinfo=tz, fold=0)
    t = first.timestamp()
    if dt.datetime.fromtimestamp(t, tz).replace(tzinfo=None) == wall:
        return t  # exists (once, or this is its first pass)
    # In a skipped hour: find the shift, between the instants the two offsets give.
    lo = wall.replace(tzinfo=tz, fold=1).timestamp()
    hi = t
    lo, hi = min(lo, hi), max(lo, hi)
    off_lo = dt.datetime.fromtimestamp(lo, tz).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dt.datetime.fromtimestamp(mid, tz).utcoffset() == off_lo:
            lo = mid
        else:
            hi = mid
    return float(hi)


def tick_name(at: float, tz: ZoneInfo) -> str:
    return dt.datetime.fromtimestamp(at, tz).strftime("%Y%m%d%H%M")


def next_tick(cron: str, tz: ZoneInfo | str, after: float) -> Tick:
    """The first tick strictly after instant `after`."""
    tz = check_timezone(tz) if isinstance(tz, str) else tz
    # From `after`'s wall time: in the second pass of a repeated hour the wall times ahead were had on the first
    # pass (their instants are before `after`, and are passed over); a wall time in a skipped hour maps to the shift.
    start = dt.datetime.fromtimestamp(after, tz).replace(tzinfo=None, fold=0) - dt.timedelta(minutes=1)
    it = croniter(cron, start, ret_type=dt.datetime)
    for _ in range(100_000):
        wall = it.get_next(dt.datetime)
        t = _instant(wall, tz)
        if t > after:
            return Tick(at=t, name=tick_name(t, tz))
    raise ValueError(f"cron line {cron!r} has no tick after {after}")  # pragma: no cover (e.g. '0 0 31 2 *')


def next_ticks(cron: str, tz: ZoneInfo | str, after: float, n: int) -> list[Tick]:
    out: list[Tick] = []
    t = after
    for _ in range(n):
        tick = next_tick(cron, tz, t)
        out.append(tick)
        t = tick.at
    return out


@dataclass
class Missed:
    """Ticks older than the starting deadline, skipped together."""

    count: int  # how many (at most MAX_MISSED_COUNTED; `more` when there were more)
    first: Tick
    last: Tick
    more: bool = False

    def describe(self, deadline: float) -> str:
        n = f"more than {self.count}" if self.more else str(self.count)
        ticks = "tick" if self.count == 1 and not self.more else "ticks"
        span = (f"{self.first.name}" if self.first.name == self.last.name else
                f"{self.first.name} to {self.last.name}")
        return (f"{n} {ticks} ({span}) missed by more than the starting deadline of {int(deadline)}s "
                "(the control plane was down or no replica led): skipped, no run made")


@dataclass
class Due:
    """What a schedule has to do at an instant: the missed ticks to skip, the ticks to handle now (oldest first),
    and its next tick once those are handled."""

    missed: Missed | None = None
    due: list[Tick] = field(default_factory=list)
    next: Tick | None = None


def due(cron: str, tz: ZoneInfo | str, first: float, at: float, deadline: float, limit: int = MAX_DUE) -> Due:
    """The ticks from `first` (the schedule's next tick, not handled yet) up to `at`: those older than `deadline`
    seconds are missed, the others are due (at most `limit`; `next` is then the first not handled)."""
    tz = check_timezone(tz) if isinstance(tz, str) else tz
    out = Due()
    cur = Tick(at=first, name=tick_name(first, tz))
    edge = at - deadline
    while cur.at <= at and cur.at < edge:
        if out.missed is None:
            out.missed = Missed(count=1, first=cur, last=cur)
        elif out.missed.count < MAX_MISSED_COUNTED:
            out.missed.count += 1
            out.missed.last = cur
        else:  # too many to walk: jump to the deadline
            out.missed.more = True
            cur = next_tick(cron, tz, edge - 0.001)
            while cur.at < edge:
                cur = next_tick(cron, tz, cur.at)
            break
        cur = next_tick(cron, tz, cur.at)
    while cur.at <= at and len(out.due) < limit:
        out.due.append(cur)
        cur = next_tick(cron, tz, cur.at)
    out.next = cur
    return out
