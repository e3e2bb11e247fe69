"""Accounting, the pure part: what a worker attempt's end means for its usage record, and how usage records add up
(GET $API/usage, `astra astraeus usage`, `astra slurm sreport`). Standard library only: the server reads the rows
and writes them (astraeus.server.services.usage); this module only decides and counts.

GPU-seconds of an attempt = its GPUs × (end − start), clipped to the window asked for; an attempt still running
counts until now. With `day` among the groups, an attempt's GPU-seconds are split at UTC midnights; its count, its
queue wait and whether it was preempted go to the group of the day it started in (within the window).
"""

from __future__ import annotations

import calendar
import math
import re
import time
from dataclasses import dataclass

# What usage can be grouped by (GET $API/usage?group_by=…), in the order the answer's keys follow.
GROUPS = ("cluster", "workspace", "user", "run", "gpu_model", "day")
DEFAULT_SINCE = 7 * 86400  # no `since`: the last 7 days

# How an attempt ended, in the product's words (a usage record's `state`).
PREEMPTED = "Preempted"


class UsageError(ValueError):
    """Bad input to a usage report: the message says what to change."""


@dataclass(frozen=True)
class Attempt:
    """One worker attempt as accounting sees it (a usage record, or a worker still holding its machine)."""

    workspace: str
    user: str | None
    run: str
    cluster: str
    gpu_model: str | None
    gpus: int
    cpu_cores: float
    start: float
    end: float | None  # None: still running
    wait_seconds: float
    state: str  # Succeeded | Failed | Cancelled | Preempted | Running
    run_uid: str = ""


# ------------------------------------------------------------------------------------ an attempt's end


def outcome(stop_kind: str | None, exit_code: int | None, evicted: bool) -> str:
    """How a worker attempt ended, from the stop asked of it (lifecycle.StopKind's value, None: none) and its exit:
    a preemption (or a reservation opening) reads Preempted; a delete, or a gang mate stopped with its gang,
    Cancelled; a time limit Failed; with no stop asked, code 0 Succeeded and anything else Failed (restarted or not:
    the record's reason says which)."""
    if stop_kind in ("preempt", "reservation"):
        return PREEMPTED
    if stop_kind in ("delete", "gang", "timelimit_gang"):
        return "Cancelled"
    if stop_kind == "timelimit":
        return "Failed"
    return "Succeeded" if exit_code == 0 and not evicted else "Failed"


def in_pool(pool_machines: list[str] | None, pool_labels: dict | None, machine: str, labels: dict | None) -> bool:
    """A machine is in a pool it names, or whose labels it has every one of (server/pools.py's membership)."""
    want = pool_labels or {}
    have = labels or {}
    return machine in set(pool_machines or []) or bool(want and all(have.get(k) == v for k, v in want.items()))


def wait_seconds(placed_at: float | None, queued_since: float | None) -> float:
    """The queue wait of an attempt placed at `placed_at`: since the run was submitted (first attempt), or since
    the previous attempt of the worker ended and any restart backoff was over; never negative."""
    if placed_at is None or queued_since is None:
        return 0.0
    return max(0.0, placed_at - queued_since)


def gpu_seconds(a: Attempt, since: float, until: float, now: float) -> float:
    """The attempt's GPU-seconds within [since, until) (a running attempt counts until `now`)."""
    start, end = max(a.start, since), min(a.end if a.end is not None else now, until)
    return a.gpus * max(0.0, end - start)


# ------------------------------------------------------------------------------------------ input


def parse_group_by(values: list[str] | None) -> tuple[str, ...]:
    """`group_by` as given (repeated, or comma-separated) → the groups in GROUPS' order, each once."""
    asked: list[str] = []
    for v in values or []:
        asked += [p.strip() for p in v.split(",") if p.strip()]
    bad = [g for g in asked if g not in GROUPS]
    if bad:
        raise UsageError(f"group_by={bad[0]!r} is not a grouping: use one or more of {', '.join(GROUPS)} "
                         "(e.g. group_by=workspace&group_by=user, or group_by=workspace,user)")
    return tuple(g for g in GROUPS if g in asked)


_AGO = re.compile(r"^(\d+(?:\.\d+)?)(d|h|m|s)$")
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")


def parse_time(text: str, now: float, name: str) -> float:
    """A time as usage reports take it: `now`, a duration back from now (`7d`, `12h`, `30m`, `90s`), an ISO 8601
    date or time in UTC (`2030-01-01`, `2030-01-01T12:00:00Z`), or epoch seconds."""
    s = text.strip()
    if s.lower() == "now":
        return now
    m = _AGO.match(s.lower())
    if m:
        return now - float(m.group(1)) * _SECONDS[m.group(2)]
    try:
        t = float(s)
        if math.isfinite(t) and t >= 0:
            return t
    except ValueError:
        pass
    bare = s[:-1] if s.endswith(("Z", "z")) else s.removesuffix("+00:00")
    for f in _FORMATS:
        try:
            return float(calendar.timegm(time.strptime(bare, f)))
        except ValueError:
            continue
    raise UsageError(f"{name}={text!r} is not a time: give a duration back from now (7d, 12h, 30m), an ISO 8601 "
                     "date or time in UTC (2030-01-01, 2030-01-01T12:00:00Z), epoch seconds, or now")


def window(since: str | None, until: str | None, now: float) -> tuple[float, float]:
    """The report's [since, until): by default the last 7 days up to now."""
    lo = parse_time(since, now, "since") if since else now - DEFAULT_SINCE
    hi = parse_time(until, now, "until") if until else now
    if hi <= lo:
        raise UsageError(f"since={since or '7d'!s} is not before until={until or 'now'!s}: give a since earlier "
                         "than until")
    return lo, hi


# ------------------------------------------------------------------------------------------ adding up


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def _days(start: float, end: float) -> list[tuple[str, float]]:
    """[start, end) cut at UTC midnights: (day, seconds in it)."""
    out = []
    while start < end:
        midnight = (math.floor(start / 86400) + 1) * 86400
        cut = min(end, midnight)
        out.append((day_of(start), cut - start))
        start = cut
    return out


def _key(a: Attempt, groups: tuple[str, ...], day: str) -> tuple:
    values = {"cluster": a.cluster, "workspace": a.workspace, "user": a.user, "run": a.run,
              "gpu_model": a.gpu_model, "day": day}
    return tuple(values[g] for g in groups)


def _empty() -> dict:
    return {"gpu_seconds": 0.0, "cpu_core_seconds": 0.0, "attempts": 0, "preemptions": 0, "queue_wait_seconds": 0.0}


def _finish(totals: dict) -> dict:
    out = {"gpu_hours": round(totals["gpu_seconds"] / 3600, 6), "gpu_seconds": round(totals["gpu_seconds"], 3),
           "cpu_core_hours": round(totals["cpu_core_seconds"] / 3600, 6), "attempts": totals["attempts"],
           "preemptions": totals["preemptions"], "queue_wait_seconds": round(totals["queue_wait_seconds"], 3)}
    return out


def aggregate(attempts: list[Attempt], groups: tuple[str, ...], since: float, until: float,
              now: float) -> tuple[list[dict], dict]:
    """The usage of `attempts` within [since, until), one row per group (sorted by its keys; one row when `groups`
    is empty), and the total. An attempt outside the window counts nowhere."""
    rows: dict[tuple, dict] = {}
    total = _empty()
    for a in attempts:
        end = min(a.end if a.end is not None else now, until)
        start = max(a.start, since)
        if end <= start and not (a.start >= since and a.start < until):
            continue  # ran wholly outside the window
        pieces = _days(start, end) if "day" in groups else [(day_of(start), max(0.0, end - start))]
        for i, (day, seconds) in enumerate(pieces or [(day_of(start), 0.0)]):
            r = rows.setdefault(_key(a, groups, day), _empty())
            for acc in (r, total):
                acc["gpu_seconds"] += a.gpus * seconds
                acc["cpu_core_seconds"] += a.cpu_cores * seconds
                if i == 0:  # the attempt itself counts once, on its first day in the window
                    acc["attempts"] += 1
                    acc["preemptions"] += a.state == PREEMPTED
                    acc["queue_wait_seconds"] += a.wait_seconds
    out = []
    for key in sorted(rows, key=lambda k: tuple("" if v is None else str(v) for v in k)):
        out.append({**dict(zip(groups, key, strict=True)), **_finish(rows[key])})
    return out, _finish(total)
