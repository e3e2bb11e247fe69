"""Workers' log lines: stored with per-worker limits (bytes and lines), trimmed, read, deleted.

A worker keeps at most `max_bytes` of log text and `max_lines` lines, all its attempts together (the server's
ASTRAEUS_LOG_MAX_BYTES_PER_WORKER / _LINES_): past either, its oldest lines are deleted, down to 7/8 of the limits
so that a flood trims once in a while rather than on every batch. How many were dropped is kept in one row of its
own (attempt -1, seq = the count), which goes with the worker's lines.

Whether a worker is past a limit is told by its running count (table log_usage: the lines and bytes stored for it,
added to by each batch), not by counting its rows: a flood of batches costs one small upsert each. The count is a
hint: a trim counts the rows exactly (once per 1/8 of the limit) and sets it right."""

from __future__ import annotations

import time

from sqlalchemy import LargeBinary, cast, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from astraeus.server.db import (
    LogLine,
    LogUsage,
    Run,
    Worker,
)

LOG_LINES_PER_REQUEST = 10_000  # the most lines one POST /agent/logs stores (the agent sends ≤ 1 MiB batches)
DROPPED = -1  # the attempt of a worker's dropped-lines row
INT32 = 2**31 - 1


def _log_bytes(session: Session):
    """SQL for a line's size in bytes (as shown: with its newline; as the stores count it, agents._PG_STORE_LINES
    and agents._SQLITE_ADD_USAGE)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.octet_length(LogLine.text) + 1
    return func.length(cast(LogLine.text, LargeBinary)) + 1


def over_log_limits(usage: dict[int, tuple[int, int]], max_bytes: int, max_lines: int) -> list[int]:
    """The workers whose running count (lines, bytes) is past a limit, by id."""
    return sorted(w for w, (n, b) in usage.items() if n > max_lines or b > max_bytes)


def dialect_insert(session: Session, table):
    """An INSERT of `table` in the session's database's own dialect (for its ON CONFLICT clauses)."""
    return (pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert)(table)


def trim_logs(session: Session, worker_id: int, max_bytes: int, max_lines: int) -> int:
    """Drop a worker's oldest lines while it is over a limit (counted exactly, and its running count set to
    what it keeps); returns how many were dropped."""
    size = _log_bytes(session)
    mine = (LogLine.worker_id == worker_id, LogLine.attempt != DROPPED)
    n, total = session.execute(select(func.count(), func.coalesce(func.sum(size), 0)).where(*mine)).one()
    cut, dropped = None, 0
    if n > max_lines or total > max_bytes:
        keep_lines, keep_bytes = max_lines * 7 // 8, max_bytes * 7 // 8
        for lid, b in session.execute(select(LogLine.id, size).where(*mine).order_by(LogLine.id)
                                      .execution_options(yield_per=5000)):
            if n <= keep_lines and total <= keep_bytes:
                break
            cut, dropped, n, total = lid, dropped + 1, n - 1, total - b
    if cut is not None:
        session.execute(delete(LogLine).where(*mine, LogLine.id <= cut))
        marker = session.scalar(select(LogLine).where(LogLine.worker_id == worker_id, LogLine.attempt == DROPPED))
        if marker is None:
            session.add(LogLine(worker_id=worker_id, attempt=DROPPED, seq=min(dropped, INT32), time=time.time(),
                                stream="stdout", text=""))
        else:
            marker.seq = min(marker.seq + dropped, INT32)
    usage = session.scalar(select(LogUsage).where(LogUsage.worker_id == worker_id))
    if usage is None:
        session.add(LogUsage(worker_id=worker_id, lines=n, bytes=total))
    else:
        usage.lines, usage.bytes = n, total
    session.flush()
    return dropped


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


def logs_dropped_line(session: Session, worker: Worker, max_bytes: int, max_lines: int) -> str | None:
    """`… N earlier lines dropped (log limit 8 MiB)`, shown first when a worker's log was trimmed; else None."""
    n = session.scalar(select(LogLine.seq).where(LogLine.worker_id == worker.id, LogLine.attempt == DROPPED))
    if not n:
        return None
    return f"… {n} earlier lines dropped (log limit {mib(max_bytes)} or {max_lines} lines)"


def read_logs(session: Session, worker: Worker, after_id: int = 0, tail: int | None = None) -> list:
    """The worker's lines after `after_id` (the last `tail` of them), oldest first: rows with .id, .time and
    .text (not ORM objects: a full log is 100,000 of them)."""
    q = select(LogLine.id, LogLine.time, LogLine.text).where(LogLine.worker_id == worker.id,
                                                            LogLine.attempt != DROPPED, LogLine.id > after_id)
    if tail is not None:
        rows = list(session.execute(q.order_by(LogLine.id.desc()).limit(tail)))
        return rows[::-1]
    return list(session.execute(q.order_by(LogLine.id)))


def last_log_id(session: Session, worker: Worker) -> int:
    """The id of the worker's last stored line (0 when it has none): a follower that shows none of them yet
    (`--tail 0`) follows from there."""
    return session.scalar(select(func.max(LogLine.id)).where(LogLine.worker_id == worker.id)) or 0


def delete_logs(session: Session, run: Run) -> int:
    """Remove every log line of a run's workers (the run is being deleted)."""
    ids = [w.id for w in run.workers]
    if not ids:
        return 0
    session.execute(delete(LogUsage).where(LogUsage.worker_id.in_(ids)))
    return session.execute(delete(LogLine).where(LogLine.worker_id.in_(ids))).rowcount or 0
