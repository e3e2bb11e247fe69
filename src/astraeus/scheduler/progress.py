"""Hung runs and the least work lost (issue 47), decided here, purely: the control plane's loop acts on the answers.

A worker reports progress (its ASTRAEUS_PROGRESS_FILE touched, or a log line matching `progress.pattern`) and
checkpoints (ASTRAEUS_CHECKPOINT_FILE written, or a line matching `checkpoint.pattern`); the control plane keeps
the last time and text of each on the worker. `stall` says whether a running worker has gone quiet for longer
than its run's `progress.stall_seconds`, and the reason shown; `work_lost` is what stopping it would throw away."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

ON_STALL = ("restart", "fail", "notify")


@dataclass(frozen=True)
class Stall:
    """A running worker without progress for `quiet` seconds (at least its run's stall_seconds)."""

    quiet: float
    reason: str


def clock(t: float) -> str:
    """`14:02 UTC`: when something happened, as reasons show it."""
    return time.strftime("%H:%M UTC", time.gmtime(t))


def span(seconds: float) -> str:
    """`20 min`, `45 s`, `2 h 5 min`: a duration as reasons show it (whole units, rounded down)."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    h, m = divmod(s // 60, 60)
    return f"{h} h {m} min" if m else f"{h} h"


def stall(now: float, started_at: float | None, last_progress: float | None, last_text: str | None,
          stall_seconds: float | None) -> Stall | None:
    """Whether a running worker is stalled: no progress for stall_seconds since its last report, or since its
    start when it never reported any. None: not stalled, not started, or the run asks for no watch."""
    if not stall_seconds or started_at is None:
        return None
    since = max(started_at, last_progress) if last_progress is not None else started_at
    quiet = now - since
    if quiet < stall_seconds:
        return None
    if last_progress is not None and last_progress >= started_at:
        last = f"{last_text.strip()} at {clock(last_progress)}" if last_text and last_text.strip() \
            else f"at {clock(last_progress)}"
        return Stall(quiet, f"No progress for {span(quiet)} (last: {last})")
    return Stall(quiet, f"No progress for {span(quiet)} (none reported since its start at {clock(started_at)})")


def gang_reason(stalled: Stall, worker: str, rank: int, machine: str | None) -> str:
    """A gang's reason names the stalled rank and its machine."""
    where = f" on {machine}" if machine else ""
    return f"{stalled.reason}: rank {rank} ({worker}){where}"


def matched(pattern: str | None, text: str) -> str | None:
    """The progress text a log line gives when it matches `pattern`: the matched part (`step 1234`)."""
    if not pattern:
        return None
    m = re.search(pattern, text)
    if m is None:
        return None
    return m.group(0)[:200]


def work_lost(now: float, started_at: float | None, last_checkpoint: float | None, gpus: int) -> float:
    """GPU-seconds a running worker loses when stopped now: since its last checkpoint of this attempt, else since
    its start."""
    if started_at is None:
        return 0.0
    since = max(started_at, last_checkpoint) if last_checkpoint is not None else started_at
    return max(0.0, now - since) * max(1, gpus)


def loss_words(now: float, started_at: float | None, last_checkpoint: float | None) -> str:
    """`loses 3 min of work since its checkpoint at 14:02` (or `since its start at …`)."""
    if started_at is None:
        return "loses no work (not started)"
    if last_checkpoint is not None and last_checkpoint >= started_at:
        return f"loses {span(now - last_checkpoint)} of work since its checkpoint at {clock(last_checkpoint)}"
    return f"loses {span(now - started_at)} of work since its start at {clock(started_at)} (no checkpoint)"
