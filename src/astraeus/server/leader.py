"""The scheduling leader: one replica of the control plane plans and applies, fenced by a lease in the database
(why: docs/design-fenced-lease.md).

Every replica serves the API, the console and the agent protocol against one database; only the replica that
holds the lease row `leases.name = "scheduler"` runs the scheduling loop and the timed duties (time limits, lost
machines). The lease has a `holder` (this process's `Leader.holder`: the replica id and a per-start suffix), an
`epoch` that grows by one each time the lease is taken anew (by another replica, or by the same one after it had
expired), and `expires_at`, judged by the database's clock: PostgreSQL's `clock_timestamp()`, never a replica's,
so replicas with skewed clocks agree on who leads. On SQLite (one process, see db.hold_sqlite) the process clock
serves.

Fencing: the leader renews every third of the lease, and every transaction in which it changes state (the
plan's apply, time limits, lost machines) first calls `fence(session, term)`, which, in that same transaction,
takes the state lock (below) and `SELECT … FOR UPDATE`s the lease row, and goes on only when the holder and epoch
are still this term's and the lease has not expired by the database's clock. A replica paused (SIGSTOP, a long GC,
a cut network) past its lease comes back to a lease that another replica holds with a higher epoch, or that has
expired: its apply is rolled back and nothing of its stale plan is written. A fenced transaction also sets
`idle_in_transaction_session_timeout` to the lease, so a leader paused *inside* its apply (holding the state
lock) is cut off by PostgreSQL rather than holding every replica's writes.

How state changes serialise across replicas (issue 16, and `state_lock.lock_state`): every state-changing
transaction (services.tx for the API, the agent protocol and the console; the loop's fenced transactions; the
bootstrap) takes one transaction-level advisory lock, `pg_advisory_xact_lock(state_lock.STATE_LOCK_KEY)`, before it
reads what it changes. We chose this over row locks on each touched row because the control plane's rules
were written for, and tested under, exactly one writer at a time (state_lock.STATE_LOCK in one process): the apply
relies on "only the loop places workers and nothing changed room meanwhile", a delete relies on no placement
racing it, quotas are checked against every run of a workspace. One lock keeps each of those true across
replicas without auditing every path for the rows it reads, and it cannot deadlock: it is the first lock any
writer takes (the lease row is only ever locked after it, or alone by the renewal). The cost is that writes
serialise across replicas as they did in one process; reads, long-polls and log follows never take it. READ
COMMITTED then shows each writer everything committed before it got the lock (tx expires what the session had
loaded before). Serialization failures and deadlocks that could still come from the database (40001, 40P01,
55P03) are retried by app.RetryConflicts, never answered with a 5xx.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from prometheus_client import Counter, Gauge
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from astraeus.server.db import Lease
from astraeus.server.state_lock import lock_state

log = logging.getLogger("astraeus.leader")

LEASE = "scheduler"

LEADER = Gauge("astraeus_leader", "1 while this replica holds the scheduling lease, else 0")
EPOCH = Gauge("astraeus_leader_epoch", "The scheduling lease's epoch as this replica last saw it")
RENEWALS = Counter("astraeus_lease_renewals_total", "Scheduling-lease renewals by this replica")
FAILOVERS = Counter("astraeus_leader_failovers_total",
                    "Times this replica took the scheduling lease over from another replica")


class NotLeader(Exception):
    """The fence found that this replica no longer holds its term: nothing of the transaction is written."""


@dataclass(frozen=True)
class Term:
    """One holding of the lease: who and which epoch."""

    holder: str
    epoch: int


def postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def db_now(session: Session) -> float:
    """Now by the database's clock (PostgreSQL's clock_timestamp(), epoch seconds); the process clock on SQLite."""
    if postgres(session):
        return float(session.scalar(text("SELECT extract(epoch FROM clock_timestamp())")))
    return time.time()


def _row(session: Session, name: str = LEASE, lock: bool = True) -> Lease:
    """The lease row, made on first use (an insert that does nothing when another replica made it first)."""
    row = session.get(Lease, name, with_for_update=lock, populate_existing=True)
    if row is not None:
        return row
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    session.execute(insert(Lease).values(name=name, holder=None, epoch=0, expires_at=0.0)
                    .on_conflict_do_nothing(index_elements=["name"]))
    return session.get(Lease, name, with_for_update=lock, populate_existing=True)


@dataclass(frozen=True)
class Outcome:
    """What one try to lead found: this replica's term (None when another replica leads), the lease's epoch and
    holder after the try, whether this try took it anew (and from whom)."""

    term: Term | None
    epoch: int
    holder: str | None
    taken: bool = False
    previous: str | None = None
    expires_in: float = 0.0


def try_lead(session: Session, holder: str, seconds: float, name: str = LEASE, take_over: bool = False) -> Outcome:
    """Renew the lease when `holder` holds it and it has not expired; take it (epoch + 1) when it has expired or
    is free; else leave it. `take_over`: take it even from another holder whose lease runs still (a process that
    knows that holder is gone: the one process serving a SQLite database, see db.hold_sqlite). Call inside a
    transaction; commit it for the outcome to hold. A lease row locked by a paused leader's apply is waited for
    at most `seconds` / 3 (lock_timeout): then this raises, and the caller tries again at its next renewal."""
    if postgres(session):
        # wait for the row at most a third of the lease; and a replica paused inside this transaction (holding
        # the row) is cut off by PostgreSQL after the lease, as a paused apply is (see fence)
        ms = max(100, int(seconds * 1000 / 3))
        session.execute(text("SELECT set_config('lock_timeout', :w, true), "
                             "set_config('idle_in_transaction_session_timeout', :i, true)"),
                        {"w": str(ms), "i": str(max(1000, int(seconds * 1000)))})
    row = _row(session, name)
    now = db_now(session)
    if row.holder == holder and row.expires_at > now:
        row.expires_at = now + seconds
        row.renewed_at = now
        return Outcome(Term(holder, row.epoch), row.epoch, holder, expires_in=seconds)
    if row.holder is not None and row.holder != holder and row.expires_at > now and not take_over:
        return Outcome(None, row.epoch, row.holder, expires_in=row.expires_at - now)
    previous = row.holder
    row.holder, row.epoch = holder, row.epoch + 1
    row.expires_at, row.acquired_at, row.renewed_at = now + seconds, now, now
    return Outcome(Term(holder, row.epoch), row.epoch, holder, taken=True, previous=previous, expires_in=seconds)


def break_stale_hold(session: Session, seconds: float, name: str = LEASE) -> int | None:
    """End the database session of a holder that keeps the lease row locked past its lease; the pid ended, or None.

    The idle timeout (fence, try_lead) cuts off a paused holder whose backend waits for it, but not one whose
    backend is itself stuck: a replica stopped while PostgreSQL sends it a result larger than the socket's buffers
    leaves its backend *active*, blocked in the send, holding the lease row (and the state lock) for as long as the
    pause lasts; no timeout but termination reaches a backend in that state. So a replica whose try to lead found
    the row locked looks, by the database's clock, for a lease expired and a locker whose transaction began more
    than a lease ago, and terminates that backend: its transaction is rolled back, nothing of it is written, and
    the lease can be taken at the next try. A holder whose lease still runs is never touched."""
    if not postgres(session):
        return None
    row = session.execute(text(
        "SELECT l.pid FROM leases r JOIN pg_locks l ON l.locktype = 'transactionid' AND l.granted "
        "AND l.transactionid = r.xmax JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE r.name = :n AND r.expires_at < extract(epoch FROM clock_timestamp()) "
        "AND a.xact_start < clock_timestamp() - make_interval(secs => :s) AND l.pid <> pg_backend_pid()"),
        {"n": name, "s": float(seconds)}).first()
    if row is None:
        return None
    session.execute(text("SELECT pg_terminate_backend(:p)"), {"p": row[0]})
    log.warning("ended database session %d: it held the expired scheduling lease's row for over %.1f s", row[0],
                seconds)
    return int(row[0])


def release(session: Session, holder: str, name: str = LEASE) -> bool:
    """Give the lease up now (a replica that stops cleanly), so another replica takes it at its next try rather
    than after the lease runs out. The epoch stays: the next holder raises it."""
    row = session.get(Lease, name, with_for_update=True, populate_existing=True)
    if row is None or row.holder != holder:
        return False
    row.expires_at = db_now(session)
    return True


def holds(session: Session, term: Term, name: str = LEASE) -> bool:
    """Whether `term` still holds the lease, by the database's clock, checked on the lease row locked FOR UPDATE
    (no replica can take it over until this transaction ends)."""
    row = session.get(Lease, name, with_for_update=True, populate_existing=True)
    if row is None:
        return False
    return row.holder == term.holder and row.epoch == term.epoch and row.expires_at > db_now(session)


def fence(session: Session, term: Term, lease_seconds: float | None = None) -> None:
    """Begin a leader's state-changing transaction: take the state lock, then check the lease in the same
    transaction; NotLeader (roll back, write nothing) when `term` no longer holds it."""
    lock_state(session)
    if postgres(session) and lease_seconds:
        ms = max(1000, int(lease_seconds * 1000))
        session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {ms}"))
    if not holds(session, term):
        raise NotLeader(f"{term.holder} no longer holds the scheduling lease at epoch {term.epoch}")


def current(session: Session, name: str = LEASE) -> tuple[int, str | None, bool]:
    """(epoch, holder, whether it is held and unexpired) of the lease as the database has it now; no lock."""
    row = session.scalar(select(Lease).where(Lease.name == name).execution_options(populate_existing=True))
    if row is None:
        return 0, None, False
    return row.epoch, row.holder, row.holder is not None and row.expires_at > db_now(session)


def default_replica_id(host: str, port: int) -> str:
    """host:port, with the machine's name for a wildcard host."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{host}:{port}"


class Leader:
    """This replica's side of the lease: tries to lead (and then renews) every third of the lease in a thread of
    its own, so that a long scheduling cycle never delays a renewal. `term()` is the term this replica may act in
    now, or None; the fence in each transaction is what makes acting safe, this only avoids useless cycles."""

    def __init__(self, sessions, replica_id: str, lease_seconds: float, on_lead=None, take_over: bool = False,
                 on_error=None):
        self.sessions = sessions
        # called with a renewal's exception: the reason when it failed for want of space (diskfull.WriteHealth)
        self.on_error = on_error
        self.replica_id = replica_id
        self.holder = f"{replica_id}#{secrets.token_hex(3)}"  # a fresh holder per start: a restart is a new term
        self.lease_seconds = lease_seconds
        self.on_lead = on_lead  # called (no arguments) when this replica becomes the leader
        # the first try takes the lease whoever holds it: this process alone serves its (SQLite) database, so a
        # holder left in the row is a process that died (a restart then schedules at once, not a lease later)
        self.take_over = take_over
        self.epoch = 0  # the lease's epoch as last seen
        self._term: Term | None = None
        self._valid_until = 0.0  # monotonic: the renewal's send time + the lease
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------------------- state
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def leading(self) -> bool:
        return self.term() is not None

    def term(self) -> Term | None:
        with self._lock:
            if self._term is not None and time.monotonic() < self._valid_until:
                return self._term
            return None

    def current(self) -> Term | None:
        """The term to act in: the renewing thread's, or, without that thread (a test calling loop.cycle), one
        try to lead now."""
        if not self.running:
            try:
                self.tick()
            except Exception:
                log.exception("could not reach the scheduling lease")
                return None
        return self.term()

    # --------------------------------------------------------------------------------------------- acting
    def tick(self) -> Outcome:
        sent = time.monotonic()
        with self.sessions() as s, s.begin():
            out = try_lead(s, self.holder, self.lease_seconds, take_over=self.take_over)
        self.take_over = False
        was = self.term()
        with self._lock:
            self.epoch = out.epoch
            if out.term is not None:
                self._term = out.term
                # a little under the lease: the database's clock started it after `sent`
                self._valid_until = sent + self.lease_seconds * 0.9
            else:
                self._term, self._valid_until = None, 0.0
        EPOCH.set(out.epoch)
        LEADER.set(1 if out.term is not None else 0)
        if out.term is not None and not out.taken:
            RENEWALS.inc()
        if out.taken:
            if out.previous is not None and out.previous != self.holder:
                FAILOVERS.inc()
            log.warning("%s leads the scheduler at epoch %d (after %s)", self.replica_id, out.epoch,
                        out.previous or "no leader")
        elif was is not None and out.term is None:
            log.warning("%s lost the scheduling lease to %s (epoch %d)", self.replica_id, out.holder, out.epoch)
        if out.term is not None and (was is None or out.taken) and self.on_lead:
            self.on_lead()
        return out

    def _lose(self, why: str = "its lease could not be renewed") -> None:
        with self._lock:
            lost = self._term is not None
            self._term, self._valid_until = None, 0.0
        LEADER.set(0)
        if lost:
            log.warning("%s stops leading: %s", self.replica_id, why)

    def start(self) -> None:
        """Try to lead once now (a lone replica leads from its first cycle), then keep trying in a thread."""
        self._stop.clear()
        try:
            self.tick()
        except Exception as e:
            if self.on_error is not None and self.on_error(e):
                log.warning("could not take the scheduling lease; trying again: %s", self.on_error(e))
            else:
                log.exception("could not reach the scheduling lease; trying again")
        self._thread = threading.Thread(target=self._run, name="leader-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        every = self.lease_seconds / 3
        while not self._stop.wait(every):
            try:
                self.tick()
            except Exception as e:  # the database is away, its disk full, or the row locked: not renewed this time
                why = self.on_error(e) if self.on_error is not None else None
                log.warning("scheduling lease not renewed (trying again every %.3g s): %s", every,
                            why or (str(e).splitlines()[0] if str(e) else type(e)))
                if self.term() is None:
                    self._lose()
                try:  # a holder stuck past its lease keeps the row locked: end its database session
                    with self.sessions() as s, s.begin():
                        break_stale_hold(s, self.lease_seconds)
                except Exception as e2:
                    log.warning("could not look for a stale lease holder: %s", str(e2).splitlines()[0])

    def stop(self, give_up: bool = True) -> None:
        """Stop renewing; `give_up`: release the lease so another replica leads at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        held = self._term is not None
        self._lose("it stops")
        if give_up and held:
            try:
                with self.sessions() as s, s.begin():
                    release(s, self.holder)
            except Exception:
                log.warning("could not release the scheduling lease; it expires by itself")
