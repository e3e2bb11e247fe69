"""Transactions: tx (a state change, under the state lock) and side_tx (a write that changes no state), and
handing a read-only session's connection back while it waits."""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import event
from sqlalchemy.orm import Session

from astraeus.server.state_lock import STATE_LOCK, lock_state


@contextmanager
def tx(s: Session, keep=()):
    """Commit what the block did, or nothing at all; one state change at a time, in this process (state_lock.STATE_LOCK)
    and across replicas on PostgreSQL (state_lock.lock_state: an advisory lock, then the block reads fresh rows; `keep`:
    rows not read again, such as the caller's organisation and workspace, whose ids and names the block uses)."""
    if not STATE_LOCK.acquire(blocking=False):
        hand_back_connection(s)  # another state change runs: wait for it holding no pooled connection
        STATE_LOCK.acquire()
    try:
        lock_state(s, keep)
        yield
        s.commit()
    except BaseException:
        s.rollback()
        raise
    finally:
        STATE_LOCK.release()


@contextmanager
def side_tx(s: Session):
    """Commit what the block did, or nothing, for a write that changes no state (a heartbeat's time, log lines):
    on PostgreSQL without the state lock or the advisory lock, so that submits, reports and the scheduling loop
    never wait for it; on SQLite (one writer) under the process's state lock, held for the block only and waited
    for holding no pooled connection, rather than racing state changes for the database's write lock."""
    sqlite = s.get_bind().dialect.name == "sqlite"
    if sqlite and not STATE_LOCK.acquire(blocking=False):
        hand_back_connection(s)
        STATE_LOCK.acquire()
    try:
        yield
        s.commit()
    except BaseException:
        s.rollback()
        raise
    finally:
        if sqlite:
            STATE_LOCK.release()


# How long a side write steps aside at most (let_state_changes_in) while state changes keep queueing for the lock.
STEP_ASIDE_MAX = 0.2


def let_state_changes_in(s: Session) -> None:
    """Within side_tx on SQLite, between the chunks of a long write: commit what is written so far and, when state
    changes (a submit, a report, the scheduling loop's apply) wait for the state lock, let them go first, then take
    the lock again (for at most STEP_ASIDE_MAX while more keep coming). A submit then waits for one chunk of a
    flood's log lines, not for the whole batch (and a chunk that no one waits for is not committed on its own).
    PostgreSQL: nothing to do (side_tx holds no lock there)."""
    if s.get_bind().dialect.name != "sqlite" or not STATE_LOCK.waiting:
        return
    s.commit()
    STATE_LOCK.step_aside(STEP_ASIDE_MAX)


@event.listens_for(Session, "after_flush")
def _wrote(session: Session, _context) -> None:
    session.info["wrote"] = True


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_rollback")
def _ended(session: Session) -> None:
    session.info.pop("wrote", None)


def hand_back_connection(s: Session) -> None:
    """End the session's transaction if it has only read (authentication, a lookup), so that its connection goes
    back to the pool while the request waits for the state lock. Without this, requests waiting for the lock each
    held a connection, and with the pool empty the lock's holder could not get the one it needed: every request
    then waited out the pool's timeout (found with 200 agents' heartbeats, benchmarks/bench_agents.py). What it
    loaded stays usable (sessions do not expire on commit); a session that wrote keeps its transaction."""
    if s.in_transaction() and not (s.new or s.dirty or s.deleted or s.info.get("wrote")):
        s.commit()
