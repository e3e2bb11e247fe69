"""The control plane's shared parts: the database handle, and the wake-ups between threads (and, on PostgreSQL,
between replicas). Its settings are one astraeus.settings.ServerSettings, given to ControlPlane.open."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import sessionmaker

from astraeus.server import db
from astraeus.settings import ServerSettings

log = logging.getLogger("astraeus.core")


def _stamp(old: int) -> int:
    """A machine's next version: past the last, and at least the time in milliseconds, so that versions from two
    replicas are comparable (an agent that moves to another replica with `after` from the first is answered at
    once when something changed since, not after its long-poll runs out)."""
    return max(old + 1, int(time.time() * 1000))


def _done(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Notifier:
    """Version counters that threads wait on: per machine (desired workers) and for logs.

    With several replicas (PostgreSQL), `bus` carries each bump to the other replicas (Bus, LISTEN/NOTIFY), and
    theirs come back here with `remote=True` (not sent again)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._machine: dict[int, int] = {}
        self._logs = 0
        self._wake = threading.Event()
        # Whether a wake since the loop last asked (woken_by_submits_only) was anything but a batch of local plain
        # submits (submits.Batcher): only then may the loop plan on the snapshot it kept (loop.Kept).
        self._wake_other = True
        self._wake_lock = threading.Lock()
        self.closing = False
        self.bus: Bus | None = None
        # Long-polls waiting on the event loop (await_machine): machine -> futures, each with its loop. They hold no
        # thread while they wait, so a thousand agents' long-polls do not take every request thread.
        self._awaiting: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}

    def close(self) -> None:
        """Let every waiting long-poll and log follower return now: the control plane is stopping."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
            for waiters in self._awaiting.values():
                self._resolve(waiters)

    @staticmethod
    def _resolve(waiters) -> None:
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_done, fut)
            except RuntimeError:
                pass  # its loop is closed: nobody waits any more

    # machines --------------------------------------------------------------------------------------
    def machine_version(self, machine_id: int) -> int:
        with self._cond:
            return self._machine.setdefault(machine_id, _stamp(0))

    def bump_machines(self, machine_ids, remote: bool = False) -> None:
        ids = [m for m in machine_ids if m is not None]
        with self._cond:
            for m in ids:
                self._machine[m] = _stamp(self._machine.get(m, 0))
                waiters = self._awaiting.get(m)
                if waiters:
                    self._resolve(waiters)
            self._cond.notify_all()
        if ids and self.bus is not None and not remote:
            self.bus.send(machines=ids)

    def bump_all(self) -> None:
        """Every machine, the logs and the scheduler, here only: what another replica said may have been missed
        (the bus reconnected, or is away)."""
        with self._cond:
            for m in list(self._machine):
                self._machine[m] = _stamp(self._machine[m])
            self._logs += 1
            self._cond.notify_all()
        with self._wake_lock:
            self._wake_other = True
        self._wake.set()

    def wait_machine(self, machine_id: int, after: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.closing or self._machine.setdefault(machine_id, _stamp(0)) > after,
                                timeout=timeout)
            return self._machine[machine_id]

    async def await_machine(self, machine_id: int, after: int, timeout: float) -> int:
        """wait_machine on the event loop: the machine's version once it is past `after` (or after `timeout`
        seconds, or when the control plane stops), holding no thread meanwhile."""
        loop = asyncio.get_running_loop()
        with self._cond:
            version = self._machine.setdefault(machine_id, _stamp(0))
            if self.closing or version > after:
                return version
            entry = (loop, loop.create_future())
            self._awaiting.setdefault(machine_id, set()).add(entry)
        try:
            await asyncio.wait([entry[1]], timeout=timeout)
        finally:
            with self._cond:
                waiters = self._awaiting.get(machine_id)
                if waiters is not None:
                    waiters.discard(entry)
                    if not waiters:
                        del self._awaiting[machine_id]
        with self._cond:
            return self._machine[machine_id]

    # logs ------------------------------------------------------------------------------------------
    def logs_version(self) -> int:
        with self._cond:
            return self._logs

    def bump_logs(self, remote: bool = False) -> None:
        with self._cond:
            self._logs += 1
            self._cond.notify_all()
        if self.bus is not None and not remote:
            self.bus.send(logs=True)

    def wait_logs(self, after: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.closing or self._logs > after, timeout=timeout)
            return self._logs

    # the scheduling loop ---------------------------------------------------------------------------
    def wake_scheduler(self, remote: bool = False, submits: bool = False) -> None:
        """`submits`: woken only because plain runs were submitted here (submits.Batcher): nothing else changed."""
        if not submits:
            with self._wake_lock:
                self._wake_other = True
        self._wake.set()
        if self.bus is not None and not remote:
            self.bus.send(scheduler=True)

    def wait_scheduler(self, timeout: float) -> bool:
        woke = self._wake.wait(timeout)
        self._wake.clear()
        return woke

    def woken_by_submits_only(self) -> bool:
        """Whether every wake since the last call was wake_scheduler(submits=True); resets (the loop asks once per
        cycle, just before it reads what changed)."""
        with self._wake_lock:
            other, self._wake_other = self._wake_other, False
        return not other


class Bus:
    """Wake-ups between replicas on PostgreSQL: LISTEN/NOTIFY on channel `astraeus`, on two connections of its
    own (psycopg 3, autocommit), in two threads. What one replica's Notifier bumps (a machine's assignments, the
    logs, the scheduler) is sent, coalesced over a few milliseconds, as one JSON payload
    `{"o": origin, "m": [machine ids], "l": 1, "s": 1}`; the others bump the same, locally. Payloads are sent
    after the change committed (the callers bump after their transaction), and NOTIFY is delivered only to
    listeners, so a replica reads the change as soon as it hears of it. Fallback: while the listening connection
    is down, and once each time it is back, every machine, the logs and the scheduler are woken (every
    `fallback_seconds`), so nothing waits longer than that for a missed message; a payload that could not be sent
    is made up for by a "wake everything" (`"a": 1`) before the next one. The leader's loop also looks at every
    waiting run every ASTRAEUS_SCHEDULE_INTERVAL, whatever it heard."""

    CHANNEL = "astraeus"
    MAX_IDS = 500  # more machines than this in one payload: wake them all instead (NOTIFY payloads < 8000 B)

    def __init__(self, url: str, notifier: Notifier, origin: str, fallback_seconds: float = 1.0):
        from sqlalchemy.engine import make_url

        self.dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.notifier, self.origin, self.fallback_seconds = notifier, origin, fallback_seconds
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.connected = threading.Event()  # the listener is listening
        self.received = 0
        self.dropped = False  # a payload could not be sent: the next one is preceded by "wake everything"

    def start(self) -> None:
        self._stop.clear()
        self.notifier.bus = self
        for target, name in ((self._listen, "bus-listen"), (self._publish, "bus-publish")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        if self.notifier.bus is self:
            self.notifier.bus = None
        self._q.put(None)
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def send(self, machines=(), logs: bool = False, scheduler: bool = False) -> None:
        self._q.put((tuple(machines), logs, scheduler))

    # ------------------------------------------------------------------------------------- publishing
    def _payloads(self, first) -> list[str]:
        items = [first]
        time.sleep(0.002)  # coalesce a burst (a cycle's bumps, a report's three) into one payload
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                break
        machines: set[int] = set()
        logs = scheduler = False
        for it in items:
            if it is None:
                continue
            machines.update(it[0])
            logs, scheduler = logs or it[1], scheduler or it[2]
        body: dict = {"o": self.origin}
        if len(machines) > self.MAX_IDS:
            body["a"] = 1
        elif machines:
            body["m"] = sorted(machines)
        if logs:
            body["l"] = 1
        if scheduler:
            body["s"] = 1
        return [json.dumps(body, separators=(",", ":"))] if len(body) > 1 else []

    def _publish(self) -> None:
        import psycopg

        conn = None
        while not self._stop.is_set():
            first = self._q.get()
            if first is None or self._stop.is_set():
                break
            for payload in self._payloads(first):
                for _ in range(2):  # once more on a fresh connection after PostgreSQL restarted
                    try:
                        if conn is None or conn.closed:
                            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                        if self.dropped:  # some were not sent: the others wake everything, once
                            conn.execute("SELECT pg_notify(%s, %s)", (self.CHANNEL, json.dumps(
                                {"o": self.origin, "a": 1})))
                            self.dropped = False
                        conn.execute("SELECT pg_notify(%s, %s)", (self.CHANNEL, payload))
                        break
                    except Exception as e:
                        log.info("bus: could not notify the other replicas (%s)", str(e).splitlines()[0] if
                                 str(e) else type(e).__name__)
                        try:
                            if conn is not None:
                                conn.close()
                        except Exception:
                            pass
                        conn = None
                else:
                    self.dropped = True
        if conn is not None:
            conn.close()

    # -------------------------------------------------------------------------------------- listening
    def _deliver(self, payload: str) -> None:
        try:
            body = json.loads(payload)
        except ValueError:
            return
        if body.get("o") == self.origin:
            return
        self.received += 1
        n = self.notifier
        if body.get("a"):
            n.bump_all()
            return
        if body.get("m"):
            n.bump_machines(body["m"], remote=True)
        if body.get("l"):
            n.bump_logs(remote=True)
        if body.get("s"):
            n.wake_scheduler(remote=True)

    def _listen(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                    conn.execute(f"LISTEN {self.CHANNEL}")
                    self.connected.set()
                    self.notifier.bump_all()  # whatever was said while this connection was away
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._deliver(note.payload)
                        conn.execute("SELECT 1")  # a dead server is noticed here, within half a second
            except Exception as e:
                self.connected.clear()
                if self._stop.is_set():
                    break
                log.info("bus: not listening (%s); waking everything every %g s meanwhile",
                         str(e).splitlines()[0] if str(e) else type(e).__name__, self.fallback_seconds)
                self.notifier.bump_all()
                self._stop.wait(self.fallback_seconds)
        self.connected.clear()


_SUBMITS_LOCK = threading.Lock()


@dataclass
class ControlPlane:
    settings: ServerSettings
    engine: object
    sessions: sessionmaker
    notifier: Notifier
    leader: object = None  # astraeus.server.leader.Leader: this replica's side of the scheduling lease
    bus: Bus | None = None  # PostgreSQL: wake-ups between replicas, while the replica serves
    sqlite_lock: object = None  # the open lock file while this process serves its SQLite database alone
    writes: object = None  # astraeus.server.diskfull.WriteHealth: whether writes fail for want of space
    _submits: object = None

    @property
    def submits(self):
        """The group-commit writer for POST $API/runs (astraeus.server.submits.Batcher)."""
        if self._submits is None:
            with _SUBMITS_LOCK:
                if self._submits is None:
                    from astraeus.server.submits import Batcher

                    self._submits = Batcher(self.sessions, self.notifier)
        return self._submits

    @classmethod
    def open(cls, settings: ServerSettings, exclusive: bool = False, share: int = 1) -> ControlPlane:
        """Open the database and migrate it. `exclusive` (a serving process, `astraeus server`): on SQLite, hold
        the database's lock file (db.AlreadyServing when another process serves it). db.SchemaTooNew when the
        database was migrated by a newer astraeus."""
        from astraeus.server.leader import Leader, default_replica_id

        url = settings.url()
        held = db.hold_sqlite(url) if exclusive else None
        try:
            engine = db.make_engine(url, share)  # share: one of `astraeus server --processes N`
            db.migrate(engine)
        except BaseException:
            if held is not None:
                held.close()
            raise
        notifier = Notifier()
        from astraeus.server import diskfull
        from astraeus.server.diskfull import WriteHealth, watch

        diskfull.PRESSURE_BELOW = settings.disk_pressure_free_percent
        diskfull.EPHEMERAL_DEFAULT = settings.default_ephemeral_storage_bytes

        where = engine.url.database if engine.dialect.name == "sqlite" else None
        writes = WriteHealth(None if engine.dialect.name == "postgresql" else
                             Path(where).parent if where and not where.startswith(":") else settings.home)
        watch(engine, writes)
        cp = cls(settings=settings, engine=engine, sessions=db.session_factory(engine), notifier=notifier,
                 sqlite_lock=held, writes=writes)
        replica = settings.replica_id or default_replica_id(settings.host, settings.port)
        cp.leader = Leader(cp.sessions, replica, settings.leader_lease_seconds,
                           on_lead=lambda: notifier.wake_scheduler(remote=True), take_over=held is not None,
                           on_error=writes.failed)
        return cp

    @property
    def postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def start_bus(self) -> None:
        """PostgreSQL: start hearing the other replicas' wake-ups (SQLite: one process, nothing to do)."""
        if self.postgres and self.bus is None:
            self.bus = Bus(self.engine.url.render_as_string(hide_password=False), self.notifier,
                           self.leader.holder if self.leader else "replica")
            self.bus.start()

    def stop_bus(self) -> None:
        if self.bus is not None:
            self.bus.stop()
            self.bus = None
