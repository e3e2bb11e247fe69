"""Group commit for POST $API/runs: concurrent submits are written together, in one transaction, by one writer
thread, and each is answered once that transaction has committed.

Each submit costs, on its own, a transaction: the state lock (and on PostgreSQL the advisory lock, a round trip),
its checks, four INSERTs and a commit (a WAL flush on PostgreSQL). Submitted at once by several clients, they
queue on the state lock one behind the other. Here the writer takes every submit waiting (up to MAX_BATCH), takes
the locks once, reads each workspace's cluster and access once, then checks each submit in the order it arrived
as submit_run would (the same refusals, each to its own request: a name taken by an earlier submit of the same
batch is a 409 as it would have been one after the other), writes the accepted runs (one multi-row INSERT that
skips a name a live run already has: that submit's 409), their workers, history lines and events (one INSERT per
table), and commits once.

Only plain submits come here: a run that names a template, drives, pools, a reservation, a dependency or a job
array goes the usual way (services.submit_run_body in its own transaction), as does everything else that submits
(schedules, replica groups, the console, what-if). Should the batch's writes fail (a database error), nothing of
it is kept and each of its submits is answered FALLBACK: its request then submits the usual way, on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import JSON, insert
from sqlalchemy.orm.attributes import set_committed_value

from astraeus import spec as S
from astraeus.server import lifecycle
from astraeus.server.bodies import INT64
from astraeus.server.core import STATE_LOCK, lock_state
from astraeus.server.db import Cluster, Run

if TYPE_CHECKING:
    from astraeus.server.services import Caller

MAX_BATCH = 256
IDLE_SECONDS = 5.0  # the writer thread ends after this long without a submit
FALLBACK = object()  # the batch could not be written: submit this one on its own


def batchable(parsed: S.RunCreate | None) -> bool:
    """A plain submit: nothing it names needs more than the checks made here for a whole batch."""
    if parsed is None:  # names a template
        return False
    sp = parsed.spec
    if sp.template or sp.array is not None or (sp.dependency is not None and sp.dependency.runs):
        return False
    tt = sp.task_template
    if tt.datavolume_refs or tt.network == "host":  # the drives' and the host network's checks read more
        return False
    rr = tt.requested_resources
    sel = rr.node_selection if rr is not None else None
    if sel is not None and (sel.pools or sel.reservation):
        return False
    # too much memory for the database: submit_run refuses it after the name check, which a batch makes only
    # when it writes (the refusals would come in another order)
    return rr is None or S.worker_resources(tt)[2] <= INT64


@dataclass
class Submit:
    ws_id: int | None  # None: the request is not authenticated yet (the writer does it: `authorization`, `org`, `ws`)
    ws_name: str | None
    ws_ns: str | None
    parsed: S.RunCreate
    at: float
    authorization: str | None = None  # the request's Authorization header, and the organisation and workspace named
    org: str | None = None            # in its path
    ws: str | None = None
    caller: Caller | None = None  # once authenticated by the writer
    done: threading.Event = field(default_factory=threading.Event)
    run: Run | None = None  # accepted: the run written (detached, loaded), and its cluster
    cluster: Cluster | None = None
    error: BaseException | None = None  # refused: the ApiError, as submit_run would raise it
    fallback: bool = False
    answered: Callable[[], None] | None = None  # called by the writer once done is set (submit_async)


class Batcher:
    """The writer thread of one control plane (started on first use; a daemon)."""

    def __init__(self, sessions, notifier) -> None:
        self.sessions, self.notifier = sessions, notifier
        self._q: queue.Queue[Submit] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._conn = None  # the writer's own connection, kept from batch to batch while its thread lives
        self.batches = 0  # how many transactions, and how many submits in them (for the benchmark)
        self.submits = 0

    def submit(self, item: Submit) -> Submit:
        """Queue `item` and wait until its batch has committed (or refused it, or fell back)."""
        self._put(item)
        item.done.wait()
        return item

    async def submit_async(self, item: Submit) -> Submit:
        """submit(), awaited on the event loop: no thread waits. Should the request be cancelled meanwhile (its
        client gone), the submit is written or refused all the same, answered to no one, as with submit()."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        item.answered = lambda: loop.call_soon_threadsafe(resolve)
        self._put(item)
        await fut
        return item

    def _put(self, item: Submit) -> None:
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="submit-writer", daemon=True)
                self._thread.start()
            self._q.put(item)

    def _run(self) -> None:
        while True:
            try:
                first = self._q.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._start:  # idle: the thread ends (the next submit starts another)
                    if self._q.empty():
                        self._thread = None
                        self._hand_back()
                        return
                continue
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write_or_fall_back(batch)
            finally:
                for it in batch:
                    it.done.set()
                    if it.answered is not None:
                        try:
                            it.answered()
                        except RuntimeError:  # its event loop closed (the server stopping): no one to answer
                            pass
            if any(it.run is not None for it in batch):  # only new plain runs: the loop may plan on what it kept
                self.notifier.wake_scheduler(submits=not any(it.fallback for it in batch))

    def _write_or_fall_back(self, batch: list[Submit]) -> None:
        try:
            self._write(batch)
        except BaseException:  # nothing of the batch was kept: each submits on its own (and is checked again
            for it in batch:     # there: a refusal may have come from a batch-mate that was not written)
                it.run, it.cluster, it.error, it.fallback = None, None, None, True
            self._hand_back()  # it may be the connection that failed: the next batch takes another

    def _session(self):
        """A session on the writer's own connection: taken from the pool once, not per batch (a checkout pings
        PostgreSQL first, a round trip per batch). Each batch is its own transaction on it, committed or rolled
        back before the next."""
        if self._conn is None:
            self._conn = self.sessions.kw["bind"].connect()
        return self.sessions(bind=self._conn)

    def _hand_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection: the pool drops it
                pass

    def _authenticate(self, s, batch: list[Submit], lock: bool) -> tuple[list[Submit], bool]:
        """The callers of the submits not authenticated yet, as the request's WsCaller and require("editor") would
        find them (the same refusals, each to its own submit), read in the batch's own session (the token and the
        workspace once per distinct token and path in the batch), instead of one trip through the thread pool and
        two statements per request. `lock` (PostgreSQL): the first caller's read also takes the state lock.
        Returns the submits still to write, and whether the state lock is surely held (its caller was found)."""
        from astraeus.server.services import ApiError

        locked = False
        todo = [it for it in batch if it.ws_id is None]
        if todo:
            callers: dict[tuple, Caller | ApiError] = {}
            for it in todo:
                key = (it.authorization, it.org, it.ws)
                if key not in callers:
                    first = lock and not callers
                    try:
                        callers[key] = editor(s, *key, lock=first)
                        locked = locked or first
                    except ApiError as e:
                        callers[key] = e
                c = callers[key]
                if isinstance(c, ApiError):
                    it.error = c
                    continue
                it.caller = c
                it.ws_id, it.ws_name, it.ws_ns = c.workspace.id, c.workspace.name, c.workspace.ns
        return [it for it in batch if it.error is None], locked

    def _write(self, batch: list[Submit]) -> None:
        from astraeus.server.services import ApiError

        with self._session() as s, STATE_LOCK:
            try:
                batch, locked = self._authenticate(s, batch, lock=s.get_bind().dialect.name == "postgresql")
                if not batch:
                    s.rollback()
                    return
                if not locked:
                    # the callers' rows stay as read (the request answers with their names)
                    lock_state(s, keep=[x for it in batch if it.caller is not None
                                        for x in (it.caller.token, it.caller.org, it.caller.workspace)])
                targets: dict[tuple[int, str | None], tuple | ApiError] = {}
                for it in batch:
                    key = (it.ws_id, it.parsed.spec.cluster)
                    if key not in targets:
                        targets[key] = _cluster_for(s, it.ws_id, it.ws_name, it.parsed.spec.cluster)
                # the names this batch takes, per workspace (a name taken before it is found by the runs' INSERT)
                taken: dict[int, set[str]] = {}
                accepted: list[Submit] = []
                for it in batch:
                    try:
                        it.run, it.cluster = _check_and_build(it, targets[(it.ws_id, it.parsed.spec.cluster)],
                                                              taken.setdefault(it.ws_id, set()))
                    except ApiError as e:
                        it.error = e
                        continue
                    accepted.append(it)
                if accepted:
                    accepted = _insert(s, accepted)
                if not accepted:
                    s.rollback()
                    return
                s.commit()
                self.batches += 1
                self.submits += len(accepted)
            except BaseException:
                s.rollback()
                raise


def _values(row, table) -> dict:
    """The row's column values as its INSERT writes them, as a flush would: what was set, else the column's default
    (which the object then holds as its committed value, as after a flush: the run is answered from it); a column
    left None is left out (SQL NULL: a JSON column given None would store JSON's null)."""
    out = {}
    state = row.__dict__
    for col in table.columns:
        if col.primary_key:
            continue
        key = col.key
        value = state.get(key)
        if key not in state:
            d = col.default
            value = None if d is None else (d.arg(None) if d.is_callable else d.arg)
            set_committed_value(row, key, value)  # what the row holds once inserted (no change of its own)
        if value is not None:
            out[key] = value
    return out


def _groups(rows: list[dict]) -> list[list[int]]:
    """The rows' positions grouped by the columns they set (one INSERT each; built alike, they are one group)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r), []).append(i)
    return list(groups.values())


def _insert(s, accepted: list[Submit]) -> list[Submit]:
    """The accepted runs, their workers, history lines and events, as Core INSERTs (one multi-row statement per
    table, no ORM unit of work): the runs' ids come back (RETURNING) and are set on the objects, which stay out of
    the session (transient: each request answers from its own; its workers' ids are not read).

    A run whose name a live run of its workspace already has is not inserted (ON CONFLICT DO NOTHING on the
    unique workspace, name and live key: the check and the write in one statement, under the state lock): its
    submit is refused as submit_run refuses it, and nothing of it is written. Returns the submits written."""
    from astraeus.server.db import Worker
    from astraeus.server.services import dialect_insert, name_holder_deleting, name_taken

    runs_t, workers_t = Run.__table__, Worker.__table__
    rows = [_values(it.run, runs_t) for it in accepted]
    # what belongs to each run: its workers, its history line, its event (the run's id is not known yet: on
    # PostgreSQL they are written in the runs' own round trip, each finding its run by uid; elsewhere once the ids
    # are back, for the runs written)
    owned = {id(it): ([_values(w, workers_t) for w in it.run.workers],
                      {"time": it.at, "state": "Pending", "reason": "Submitted"},
                      {"workspace_id": it.ws_id, "time": it.at, "kind": "RunSubmitted",
                       "object": it.parsed.metadata.name,
                       "message": lifecycle.submitted_message(it.parsed.metadata.name, it.parsed.spec.priority)})
             for it in accepted}
    pg = _Driver.of(s)
    if pg is not None:
        got = {(ws, name): rid for rid, ws, name in pg.write(
            [[rows[i] for i in g] for g in _groups(rows)], _owned_rows(accepted, owned, "run_uid"))}
    else:
        got = {}
        for group in _groups(rows):
            stmt = dialect_insert(s, runs_t).on_conflict_do_nothing(
                index_elements=["workspace_id", "name", "live_key"])
            got.update(((ws, name), rid) for rid, ws, name in s.execute(
                stmt.returning(runs_t.c.id, runs_t.c.workspace_id, runs_t.c.name), [rows[i] for i in group]))
    written = []
    for it in accepted:
        rid = got.get((it.ws_id, it.run.name))
        if rid is None:
            it.run, it.cluster = None, None
            name = it.parsed.metadata.name
            it.error = name_taken(name, it.ws_name, bool(name_holder_deleting(s, it.ws_id, name)))
            continue
        it.run.id = rid
        for w in it.run.workers:
            w.run_id = rid
        written.append(it)
    if pg is None and written:
        # the workers' ids are not needed (nothing answers them): no RETURNING, an executemany per table
        for table, params in _owned_rows(written, owned, "run_id"):
            s.execute(insert(table), params)
    return written


def _owned_rows(accepted: list[Submit], owned: dict, key: str) -> list[tuple]:
    """(table, rows) to insert for what belongs to the accepted runs (`owned`, by submit), each row naming its run
    by `key`: run_id (the run's id) or run_uid (its uid, which _Driver's statements look up)."""
    from astraeus.server.db import Event, History, Worker

    workers, history, events = [], [], []
    for it in accepted:
        ref = it.run.id if key == "run_id" else it.run.uid
        ws, h, e = owned[id(it)]
        workers.extend(dict(w, **{key: ref}) for w in ws)
        history.append(dict(h, **{key: ref}))
        events.append(e if key == "run_id" else dict(e, run_uid=ref))
    many = [(Worker.__table__, [workers[i] for i in group]) for group in _groups(workers)]
    many.append((History.__table__, history))
    many.append((Event.__table__, events))
    return many


class _Driver:
    """The batch's INSERTs on PostgreSQL, sent through psycopg itself on the session's connection (in its
    transaction): SQLAlchemy's part of each statement (building it, its multi-row VALUES for RETURNING, converted
    anew by psycopg for each batch size; its result) cost more CPU than the statements themselves. Each statement
    is short and the same for every batch, so psycopg prepares it once; the runs (executemany with RETURNING: one
    result per row) and the workers', history lines' and events' rows (each finding its run by uid) go in one
    pipeline, one round trip.
    JSON columns are sent as psycopg's Json (json.dumps, as SQLAlchemy's JSON type sends them); other values as
    they are. The columns and their values are _values' (what the ORM would insert)."""

    _sql: dict[tuple, str] = {}  # (table, columns) -> the statement
    _json: dict[str, list[str]] = {}  # table -> its JSON columns

    def __init__(self, conn, dialect) -> None:
        self.conn, self.dialect = conn, dialect

    @classmethod
    def of(cls, s) -> _Driver | None:
        bind = s.get_bind()
        if bind.dialect.name != "postgresql":
            return None
        return cls(s.connection().connection.driver_connection, bind.dialect)

    def _statement(self, table, columns: tuple[str, ...]) -> str:
        """The runs' INSERT (a name a live run has is skipped; the id, workspace and name of each run written come
        back), or a row that belongs to a run (`run_uid` among the columns: its run found by uid, and nothing
        written when that run was not)."""
        key = (table.name, columns)
        sql = self._sql.get(key)
        if sql is None:
            q = self.dialect.identifier_preparer.quote
            if table.name == Run.__tablename__:
                sql = (f"INSERT INTO {q(table.name)} ({', '.join(q(c) for c in columns)}) "
                       f"VALUES ({', '.join(f'%({c})s' for c in columns)})"
                       " ON CONFLICT (workspace_id, name, live_key) DO NOTHING RETURNING id, workspace_id, name")
            else:  # a SELECT's values have no target types: each is cast to its column's
                cols = [c for c in columns if c != "run_uid"]
                values = [f"CAST(%({c})s AS {table.c[c].type.compile(dialect=self.dialect)})" for c in cols]
                if "run_id" in table.c:
                    cols, values = ["run_id", *cols], ["r.id", *values]
                sql = (f"INSERT INTO {q(table.name)} ({', '.join(q(c) for c in cols)}) SELECT {', '.join(values)} "
                       f"FROM {q(Run.__tablename__)} AS r WHERE r.uid = %(run_uid)s")
            self._sql[key] = sql
        return sql

    @classmethod
    def _params(cls, table, rows: list[dict]) -> list[dict]:
        from psycopg.types.json import Json

        json_cols = cls._json.get(table.name)
        if json_cols is None:
            json_cols = cls._json[table.name] = [c.key for c in table.columns if isinstance(c.type, JSON)]
        if not json_cols:
            return rows
        out = []
        for r in rows:
            r = dict(r)
            for k in json_cols:
                if k in r:
                    r[k] = Json(r[k])
            out.append(r)
        return out

    def write(self, runs: list[list[dict]], many: list[tuple]) -> list[tuple[int, int, str]]:
        """The runs (groups of rows alike) and the rows that belong to them, in one pipeline (one round trip);
        (id, workspace id, name) of each run written."""
        with contextlib.ExitStack() as stack, self.conn.pipeline():
            # one cursor per group of runs (its results read once all is sent), closed whatever happens
            curs = [stack.enter_context(self.conn.cursor()) for _ in runs]
            for cur, rows in zip(curs, runs, strict=True):
                cur.executemany(self._statement(Run.__table__, tuple(rows[0])), self._params(Run.__table__, rows),
                                returning=True)
            other = stack.enter_context(self.conn.cursor())
            for table, rows in many:
                if rows:
                    other.executemany(self._statement(table, tuple(rows[0])), self._params(table, rows))
            got = []
            for cur in curs:
                while True:
                    got.extend(cur.fetchall())
                    if not cur.nextset():
                        break
        return got


def editor(s, authorization: str | None, org: str, ws: str, lock: bool = False) -> Caller:
    """The caller of a submit to workspace `org`/`ws` (routers/deps.ws_caller), who must be an editor; `lock`:
    services.user_caller's."""
    from astraeus.server import services

    caller = services.user_caller(s, authorization, org, ws, lock=lock)
    services.require(caller, "editor")
    return caller


def _cluster_for(s, ws_id: int, ws_name: str, name: str | None):
    """services.cluster_for: (cluster, access), or the ApiError it raises (answered to that submit alone)."""
    from astraeus.server.services import ApiError, cluster_for

    try:
        return cluster_for(s, ws_id, ws_name, name)
    except ApiError as e:
        return e


def _check_and_build(it: Submit, target, taken: set[str]) -> tuple[Run, Cluster]:
    """submit_run's checks, in its order (the role was checked by the request), and the new run with its
    workers; `taken` gains its name. (A name taken before the batch is found by its INSERT: _insert.)"""
    from astraeus.server.services import ApiError, name_taken

    if isinstance(target, ApiError):
        raise target
    cluster, access = target
    body = it.parsed
    if not S.priority_allowed(body.spec.priority, access.max_priority):
        raise ApiError(403, "PRIORITY_NOT_ALLOWED",
                       f"priority {body.spec.priority} is above namespace {it.ws_ns}'s maximum of "
                       f"{access.max_priority}")
    tt = body.spec.task_template
    name = body.metadata.name
    if name in taken:
        raise name_taken(name, it.ws_name)
    gpus, cpu, mem = S.worker_resources(tt)
    taken.add(name)
    spec = body.spec.model_dump(mode="json")
    if spec.get("template") is None:
        spec.pop("template", None)
    spec["cluster"] = cluster.name
    run = lifecycle.new_run(uid=uuid.uuid4().hex, workspace_id=it.ws_id, cluster_id=cluster.id, name=name,
                            labels=body.metadata.labels, spec=spec, priority=body.spec.priority, created_at=it.at)
    run.workers = [lifecycle.new_worker(name=f"{name}-{i}", index=i, gpus=gpus, cpu_cores=cpu, memory_bytes=mem,
                                        gpu_indices=[], why_not=[]) for i in range(S.worker_count(tt))]
    return run, cluster
