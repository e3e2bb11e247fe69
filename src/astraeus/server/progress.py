"""Hung runs and checkpoints (issue 47, docs/progress.md): the control plane's side. What a worker's agent reports
(its progress and checkpoint files' times) and what its log lines say (`progress.pattern`, `checkpoint.pattern`) are
kept on the worker; the loop's `watch` finds the running workers of watched runs stalled past their run's
`progress.stall_seconds` (astraeus.scheduler.progress decides) and acts as `progress.on_stall` asks: notify (the
reason and an event), restart (stopped as a failure: a restart spends the budget) or fail. A notified stall's
reason stays until the worker makes progress again (`Progress again: step 1240`) or the run's state changes."""

from __future__ import annotations

from prometheus_client import Gauge
from sqlalchemy import Text, cast, or_, select
from sqlalchemy.orm import Session, selectinload

from astraeus import protocol as P
from astraeus.scheduler import progress as rules
from astraeus.server import lifecycle
from astraeus.server.db import LogLine, Run, Worker, Workspace

SINCE_PROGRESS = Gauge("astraeus_seconds_since_progress", "Seconds since a watched running worker last reported "
                       "progress (since its start when it never did)", ["workspace", "run", "worker"])
STALLED = lifecycle.Record("{reason}", "RunStalled")
PROGRESS_AGAIN = lifecycle.Record("Progress again: {said}", "RunProgressAgain")
WATCH_EVERY = 1.0  # seconds between two looks at the watched workers
LINES_PER_LOOK = 5000  # new log lines read per worker and look (the newest are matched first)

# A run's stored spec names both keys (null when not asked): the watched ones have an object there
_WATCHED = (cast(Run.spec, Text).like('%"progress": {%'), cast(Run.spec, Text).like('%"checkpoint": {%'))
_RUNNING = select(Worker).join(Run, Worker.run_id == Run.id).where(
    Worker.state == lifecycle.WorkerState.RUNNING.value, Run.live_key == "", or_(*_WATCHED))
_last_look: dict[int, float] = {}  # control plane -> when it last looked
_seen_lines: dict[tuple[int, int], int] = {}  # (worker id, attempt) -> the last log line id matched
_gauged: dict[tuple[int, int], tuple[str, str, str]] = {}  # (worker id, attempt) -> its SINCE_PROGRESS labels


def _this_attempt(w: Worker, t: float) -> float:
    """The time of progress made by the worker's current attempt, at least its start: the control plane marks the
    start when the agent's report comes, after a quick worker may have written its file or printed its step (an
    earlier time reads as an earlier attempt's, scheduler.progress.stall)."""
    return max(t, w.started_at) if w.started_at is not None else t


def note_report(w: Worker, r: P.WorkerReport) -> None:
    """A running worker's report: its progress and checkpoint files' times, when newer than those kept."""
    if r.progress_at is not None and (w.progress_at is None or r.progress_at > w.progress_at):
        w.progress_at, w.progress_text = _this_attempt(w, r.progress_at), (r.progress_text or None)
    if r.checkpoint_at is not None and (w.checkpoint_at is None or r.checkpoint_at > w.checkpoint_at):
        w.checkpoint_at = r.checkpoint_at


def due(cp, session: Session, at: float) -> bool:
    """Whether to look now: once a WATCH_EVERY, and only while a watched run has a running worker (one read), or
    a gauge series is left of one that ended."""
    if at - _last_look.get(id(cp), 0.0) < WATCH_EVERY:
        return False
    _last_look[id(cp)] = at
    return bool(_gauged) or bool(session.execute(select(_RUNNING.exists())).scalar())


def resumed(stalled_at: float | None, progress_at: float | None, stall_seconds: float) -> bool:
    """Whether a worker whose stall was acted on at `stalled_at` has made progress since: its last progress then
    was at most `stall_seconds` before, so any later one is new."""
    return stalled_at is not None and progress_at is not None and progress_at > stalled_at - stall_seconds


def _from_lines(session: Session, w: Worker, spec: dict) -> None:
    """Progress and checkpoints from the worker's new log lines matching its run's patterns."""
    progress_pattern = (spec.get("progress") or {}).get("pattern")
    checkpoint_pattern = (spec.get("checkpoint") or {}).get("pattern")
    if not progress_pattern and not checkpoint_pattern:
        return
    key = (w.id, w.attempt)
    after = _seen_lines.get(key, 0)
    rows = session.execute(select(LogLine.id, LogLine.time, LogLine.text).where(
        LogLine.worker_id == w.id, LogLine.attempt == w.attempt, LogLine.id > after)
        .order_by(LogLine.id.desc()).limit(LINES_PER_LOOK)).all()
    if not rows:
        return
    _seen_lines[key] = rows[0].id
    for _, t, text in rows:  # newest first: the first match of each is the one kept
        said = rules.matched(progress_pattern, text)
        if said is not None:
            if w.progress_at is None or t > w.progress_at:
                w.progress_at, w.progress_text = _this_attempt(w, t), said
            progress_pattern = None
        if rules.matched(checkpoint_pattern, text) is not None:
            if w.checkpoint_at is None or t > w.checkpoint_at:
                w.checkpoint_at = t
            checkpoint_pattern = None
        if not progress_pattern and not checkpoint_pattern:
            break


def watch(session: Session, at: float) -> set[int]:
    """Read the watched workers' new progress and checkpoints and act on each stall found. Returns the machines
    whose workers were asked to stop."""
    touched: set[int] = set()
    workers = session.scalars(_RUNNING.options(selectinload(Worker.run).selectinload(Run.workers),
                                               selectinload(Worker.machine))).all()
    live = {(w.id, w.attempt) for w in workers}
    for key in [k for k in _seen_lines if k not in live]:
        del _seen_lines[key]
    for key in [k for k in _gauged if k not in live]:  # an attempt that ended: its series goes
        try:
            SINCE_PROGRESS.remove(*_gauged.pop(key))
        except KeyError:
            pass
    for w in workers:
        run = w.run
        spec = run.spec or {}
        _from_lines(session, w, spec)
        watch_spec = spec.get("progress")
        if not watch_spec or w.started_at is None:
            continue
        since = max(w.started_at, w.progress_at or 0.0)
        ws = session.get(Workspace, run.workspace_id)
        labels = (ws.name if ws else "", run.name, w.name)
        _gauged[(w.id, w.attempt)] = labels
        SINCE_PROGRESS.labels(*labels).set(at - since)
        on_stall = watch_spec.get("on_stall", "notify")
        if on_stall == "notify" and resumed(w.stalled_at, w.progress_at, watch_spec.get("stall_seconds") or 0):
            w.stalled_at = None  # the watch starts again
            still = any(o.id != w.id and o.state == lifecycle.WorkerState.RUNNING.value and o.stalled_at is not None
                        for o in run.workers)
            lifecycle.progress_again(session, run, PROGRESS_AGAIN, w.progress_text or rules.clock(w.progress_at),
                                     at, still)
            continue
        stalled = rules.stall(at, w.started_at, w.progress_at, w.progress_text, watch_spec.get("stall_seconds"))
        if stalled is None or (w.stalled_at is not None and w.stalled_at >= since):
            continue  # not stalled, or this stall was already acted on
        w.stalled_at = at
        gang = spec.get("start", "Gang") != "Independent" and len(run.workers) > 1
        reason = rules.gang_reason(stalled, w.name, w.index, w.machine.name if w.machine else None) if gang \
            else stalled.reason
        if on_stall == "notify":
            lifecycle.stall_noted(session, run, STALLED, reason, on_stall, at)
            continue
        lifecycle.record(session, STALLED, at, run=run, reason=f"{reason}; on_stall: {on_stall}")
        lifecycle.request_stop(session, run, w, lifecycle.StopKind.STALL, reason, at)
        lifecycle.refresh_run(session, run, at)
        touched.add(w.machine_id)
    return touched

