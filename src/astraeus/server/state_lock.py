"""The state lock: the one lock every transaction that changes state takes (in this process, and on PostgreSQL
across replicas), below everything else in the server so that any of its modules may take it."""

from __future__ import annotations

import threading

from sqlalchemy import bindparam, func, select, true
from sqlalchemy.orm import Session


# Every transaction that changes state takes this lock: API writes, agent reports and the scheduling loop's
# apply. One control-plane process then never applies a decision made on state that another write has since
# changed (a delete racing a scheduling cycle, say). Reads never take it. Across replicas on PostgreSQL the same
# transactions also take the advisory lock below (lock_state; why one lock: astraeus.server.leader).
class StateLock:
    """The state lock: reentrant, and it counts the threads waiting for it, so that a long write that changes no
    state (a flood's log lines on SQLite, whose one writer the state changes also need) can step aside for them
    between its chunks (services.let_state_changes_in)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Condition(threading.Lock())  # notified when no thread waits any more
        self.waiting = 0  # threads blocked in acquire

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        with self._count:
            self.waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._count:
                self.waiting -= 1
                if not self.waiting:
                    self._count.notify_all()

    def step_aside(self, at_most: float) -> None:
        """Release the lock (held once by this thread), wait until no thread waits for it (at most `at_most`
        seconds: more may keep coming), and take it again."""
        self.release()
        try:
            with self._count:
                self._count.wait_for(lambda: not self.waiting, at_most)
        finally:
            self.acquire()

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


STATE_LOCK = StateLock()

# pg_advisory_xact_lock's key for state changes (any bigint; "astraSTA").
STATE_LOCK_KEY = 0x6173747261535441
# A state change idle in its transaction this long (its process paused, SIGSTOP, or hung) is ended by PostgreSQL,
# which releases the lock for the other replicas; the changes themselves never wait that long between statements.
STATE_IDLE_TIMEOUT_MS = 10_000


# The state lock as columns of a SELECT (lock_state's statement), which a session's first read may also carry (the
# read and the lock in one round trip: the group-commit writer's caller); their values bound by STATE_LOCK_PARAMS
STATE_LOCK_COLUMNS = (func.set_config("idle_in_transaction_session_timeout", bindparam("state_lock_t"), true()),
                      func.pg_advisory_xact_lock(bindparam("state_lock_k")))
STATE_LOCK_PARAMS = {"state_lock_t": str(int(STATE_IDLE_TIMEOUT_MS)), "state_lock_k": STATE_LOCK_KEY}
_LOCK_STATE = select(*STATE_LOCK_COLUMNS)


def lock_state(session: Session, keep=()) -> None:
    """Make the session's transaction a state change that no other replica's runs beside: on PostgreSQL, take
    the transaction-level advisory lock (held until commit or rollback; one statement with the idle timeout), then
    forget what the session had loaded before it, so that everything the change reads is as committed by the
    writers before it; `keep`: rows not forgotten (read moments before, and only their ids and names are used: the
    caller's organisation and workspace). A holder that goes idle in the transaction for STATE_IDLE_TIMEOUT_MS is
    cut off by PostgreSQL (nothing of it is written). SQLite: one process, whose STATE_LOCK the caller holds;
    nothing to do."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_LOCK_STATE, STATE_LOCK_PARAMS)
        if keep:
            kept = {id(o) for o in keep}
            for o in list(session.identity_map.values()):
                if id(o) not in kept:
                    session.expire(o)
        else:
            session.expire_all()
