"""Every submit of a run, and the group commit of POST $API/runs.

One way in: whatever submits a run (POST $API/runs, a schedule's tick, a replica group's replacement, the console,
what-if; a run from a template, with drives, pools, a reservation, a dependency or a job array) is a `Submit`, and
`submit(session, batch)` submits a batch of them in the session's transaction (a single submit is a batch of one:
submit_run). For each, `read` reads what its checks need and `refusal` decides whether and why it is refused:
every refusal of a submit, in one place and one order. `new_run` builds an accepted run with its workers, and `write`
stores the accepted runs, their workers, History lines and RunSubmitted events (lifecycle.submitted_rows), one INSERT
per table.

Group commit: concurrent plain submits to POST $API/runs (`batchable`) wait for one writer thread (Batcher), which
takes every submit waiting (up to MAX_BATCH), authenticates them, takes the state lock once and submits them as one
batch, in one transaction: a name taken by an earlier submit of the same batch is a 409, as it would have been one
after the other; a name a live run already has is found by the runs' INSERT, which skips that run. Should the batch's
writes fail (a database error), nothing of it is kept and each of its submits is answered FALLBACK: its request then
submits on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import JSON, insert, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from astraeus import spec as S
from astraeus import templates
from astraeus.server import lifecycle, pools, reservations
from astraeus.server.bodies import INT64
from astraeus.server.db import Access, Cluster, Drive, Run, Template, Worker
from astraeus.server.services.auth import Caller, require, user_caller
from astraeus.server.services.errors import ApiError, InvalidBody
from astraeus.server.services.logs import dialect_insert
from astraeus.server.services.runs import cluster_for, name_holder_deleting, name_taken
from astraeus.server.state_lock import STATE_LOCK, lock_state

MAX_BATCH = 256
IDLE_SECONDS = 5.0  # the writer thread ends after this long without a submit
FALLBACK = object()  # the batch could not be written: submit this one on its own


def batchable(parsed: S.RunCreate | None) -> bool:
    """A submit the group commit takes: a plain run, whose checks read nothing but its workspace's cluster, and whose
    refusals come in submit_run's order when its name is found taken by the batch's INSERT."""
    if parsed is None:  # names a template: checked once its fields are merged in
        return False
    sp = parsed.spec
    if sp.template or sp.array is not None or (sp.dependency is not None and sp.dependency.runs):
        return False
    tt = sp.task_template
    if tt.datavolume_refs or tt.network == "host":
        return False
    rr = tt.requested_resources
    sel = rr.node_selection if rr is not None else None
    if sel is not None and (sel.pools or sel.reservation):
        return False
    # too much memory is refused after the name check, which a batch makes only when it writes
    return rr is None or S.worker_resources(tt)[2] <= INT64


@dataclass
class Submit:
    """One submit: its body, when it came, and who made it. `caller`: known (a request's, the control plane's for a
    schedule or a replica group); None until the group-commit writer authenticates the request's `authorization`
    for the organisation `org` and workspace `ws` its path names."""

    parsed: S.RunCreate
    at: float
    caller: Caller | None = None
    authorization: str | None = None
    org: str | None = None
    ws: str | None = None
    columns: dict = field(default_factory=dict)  # more of the run's columns: its template, schedule, group, array
    done: threading.Event = field(default_factory=threading.Event)
    run: Run | None = None  # accepted: the run written (out of any session, loaded), and its cluster
    cluster: Cluster | None = None
    error: BaseException | None = None  # refused: the ApiError, or what authenticating the request raised
    fallback: bool = False
    answered: Callable[[], None] | None = None  # called by the writer once done is set (submit_async)


@dataclass
class Found:
    """What one submit's checks read (read), for refusal to judge."""

    target: tuple[Cluster, Access] | ApiError | None = None  # cluster_for's answer
    missing_dependency: str | None = None  # the first run or job array its dependency names that does not exist
    missing_drive: str | None = None  # the first drive it mounts that the workspace does not have
    pools: frozenset[str] = frozenset()  # the cluster's pools (read when it asks for pools)
    reservation: ApiError | None = None  # the refusal of the reservation it names (reservations.check_run)
    holder: bool | None = None  # the live run holding its name: None none (or not read), else whether it is deleting


def read(s, it: Submit, targets: dict, names: bool) -> Found:
    """What `it`'s checks need: its cluster and the workspace's access to it (read once per workspace and cluster
    name in `targets`), and only what its body asks about: the runs its dependency names, the drives it mounts, the
    cluster's pools, the reservation it names. `names`: whether the live run holding its name is looked up (else the
    runs' INSERT finds it: write)."""

    ws = it.caller.workspace
    spec = it.parsed.spec
    found = Found()
    for name in spec.dependency.runs if spec.dependency is not None else ():
        if s.scalar(select(Run.id).where(Run.workspace_id == ws.id, or_(Run.name == name, Run.array_job == name))
                    .limit(1)) is None:
            found.missing_dependency = name
            return found  # refused first: nothing else matters
    key = (ws.id, spec.cluster)
    if key not in targets:
        try:
            targets[key] = cluster_for(s, ws.id, ws.name, spec.cluster)
        except ApiError as e:
            targets[key] = e
    found.target = targets[key]
    if isinstance(found.target, ApiError):
        return found
    cluster = found.target[0]
    tt = spec.task_template
    for ref in tt.datavolume_refs:
        if s.scalar(select(Drive.id).where(Drive.workspace_id == ws.id, Drive.name == ref.name)) is None:
            found.missing_drive = ref.name
            break
    sel = tt.requested_resources.node_selection if tt.requested_resources is not None else None
    if sel is not None and sel.pools:
        found.pools = frozenset(p.name for p in pools.cluster_pools(s, cluster.id))
    if sel is not None and sel.reservation:
        try:
            reservations.check_run(s, it.caller, cluster, sel.reservation, it.at)
        except ApiError as e:
            found.reservation = e
    if names:
        found.holder = name_holder_deleting(s, ws.id, it.parsed.metadata.name)
    return found


def refusal(it: Submit, found: Found, taken: set[str]) -> ApiError | None:
    """Why `it` is refused, from what was read for it (`found`) and the names earlier submits of its batch took in
    its workspace (`taken`); None when it is accepted. Every refusal of a submit is decided here, in this order."""

    c, body = it.caller, it.parsed
    ws = c.workspace
    if found.missing_dependency is not None:
        return ApiError(400, "DEPENDENCY_NOT_FOUND",
                        f"spec.dependency.runs: no run or job array named {found.missing_dependency} in workspace "
                        f"{ws.name}: submit it first, or check its name (astra slurm squeue)")
    try:
        require(c, "editor")
    except ApiError as e:
        return e
    if isinstance(found.target, ApiError):
        return found.target
    cluster, access = found.target
    if not S.priority_allowed(body.spec.priority, access.max_priority):
        return priority_refused(body.spec.priority, ws.ns, access.max_priority)
    tt = body.spec.task_template
    if tt.network == "host" and not access.host_network:
        return ApiError(403, "HOST_NETWORK_NOT_ALLOWED",
                        f"spec.task_template.network: host is not allowed for workspace {ws.name} on cluster "
                        f"{cluster.name}: remove it (each worker gets a network of its own), or ask an admin to "
                        f"allow it (clusters.{cluster.name}.host_network: true)")
    if found.missing_drive is not None:
        return drive_missing("spec.task_template.datavolume_refs", found.missing_drive, ws.name)
    sel = tt.requested_resources.node_selection if tt.requested_resources is not None else None
    field_ = "spec.task_template.requested_resources.node_selection.pools"
    for name in sel.pools if sel is not None else ():
        if name not in found.pools:
            return ApiError(422, "INVALID", f"{field_}: no pool named {name} in cluster {cluster.name}")
        if access.pools is not None and name not in access.pools:
            return ApiError(403, "POOL_NOT_ALLOWED",
                            f"{field_}: pool {name} is not one of workspace {ws.name}'s pools on cluster "
                            f"{cluster.name} ({', '.join(access.pools) or 'none'})")
    if found.reservation is not None:
        return found.reservation
    name = body.metadata.name
    if found.holder is not None or name in taken:
        return name_taken(name, ws.name, bool(found.holder))
    if S.worker_resources(tt)[2] > INT64:  # what the database holds (and far beyond any machine)
        return memory_too_large("spec.task_template")
    return None


# The words of refusals that what stores a run's spec for later (a template, a schedule, a replica group) shares
# with the submit, each where the spec sits in its own body.


def priority_refused(priority: int, ns: str, maximum: int) -> ApiError:
    return ApiError(403, "PRIORITY_NOT_ALLOWED", f"priority {priority} is above namespace {ns}'s maximum of {maximum}")


def drive_missing(field_: str, name: str, ws_name: str) -> ApiError:
    return ApiError(400, "DRIVE_NOT_FOUND", f"{field_}: drive {name} does not exist in workspace {ws_name}: create it "
                                            "first (POST $API/drives)")


def memory_too_large(task_template: str) -> ApiError:
    return ApiError(422, "INVALID", f"{task_template}.requested_resources.memory_bytes: too large: ask for at most "
                                    "2^63-1 bytes per worker")


def check_made(session: Session, caller: Caller, access: Access, priority: int | None, drives: list[str],
               where: str) -> None:
    """What makes a template, a schedule or a replica group refused when it is made, worded as its runs' submits
    would be refused: a priority above the workspace's maximum, a drive the workspace does not have (`where`: the
    field naming the drives, `{i}` for the index)."""
    if priority is not None and not S.priority_allowed(priority, access.max_priority):
        raise priority_refused(priority, caller.workspace.ns, access.max_priority)
    for i, name in enumerate(drives):
        if not session.scalar(select(Drive.id).where(Drive.workspace_id == caller.workspace.id, Drive.name == name)):
            raise drive_missing(where.format(i=i), name, caller.workspace.name)


def new_run(it: Submit, cluster: Cluster) -> Run:
    """The accepted submit's run, Pending, with its workers (not in any session: write stores them)."""
    body = it.parsed
    tt = body.spec.task_template
    name = body.metadata.name
    gpus, cpu, mem = S.worker_resources(tt)
    spec = body.spec.model_dump(mode="json")
    if spec.get("template") is None:
        spec.pop("template", None)  # a run from no template says nothing of one
    spec["cluster"] = cluster.name
    held = spec.pop("held", False)  # the run's `held` column says it from now on (scontrol release clears it)
    run = lifecycle.new_run(uid=uuid.uuid4().hex, workspace_id=it.caller.workspace.id, cluster_id=cluster.id,
                            name=name, labels=body.metadata.labels, spec=spec, priority=body.spec.priority,
                            created_at=it.at, created_by=it.caller.user, updated_by=it.caller.user, **it.columns)
    # Issue 46: a fraction of one GPU is stored as that GPU and its thousandths (gpu_milli).
    milli = round(gpus * 1000) if isinstance(gpus, float) else 0
    if tt.requested_resources.gpu_requests.memory_bytes:
        milli = 999  # GPU memory asked: its share is the placing machine's (the scheduler sets it on placement)
    run.workers = [lifecycle.new_worker(name=f"{name}-{i}", index=i, gpus=1 if milli else gpus, cpu_cores=cpu,
                                        memory_bytes=mem, gpu_indices=[], why_not=[], gpu_milli=milli)
                   for i in range(S.worker_count(tt))]
    if held:
        lifecycle.submitted_held(run)
    return run


def submit(s, batch: list[Submit], names: bool = True) -> list[Submit]:
    """Submit `batch` in the session's transaction, whose caller holds the state lock: each submit (its caller
    known) is read and judged in the order it came, against what is stored and what the earlier ones took, and the
    accepted are written. Each ends with its `run` and `cluster`, or its `error`; returns those written. `names`:
    look up the live runs holding the names (False: the runs' INSERT finds them, which the group commit relies on)."""
    targets: dict = {}
    taken: dict[int, set[str]] = {}
    accepted = []
    for it in batch:
        found = read(s, it, targets, names)
        mine = taken.setdefault(it.caller.workspace.id, set())
        it.error = refusal(it, found, mine)
        if it.error is not None:
            continue
        mine.add(it.parsed.metadata.name)
        it.cluster = found.target[0]
        it.run = new_run(it, it.cluster)
        accepted.append(it)
    if not accepted:
        return []
    s.flush()  # what the caller's transaction did before (a run deleted to free its name) comes first
    return write(s, accepted)


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
        """The callers of the submits not authenticated yet, as the request's WsCaller would find them (the same
        refusals, each to its own submit), read in the batch's own session (the token and the workspace once per
        distinct token and path in the batch), instead of one trip through the thread pool and two statements per
        request. `lock` (PostgreSQL): the first caller's read also takes the state lock. Returns the submits still
        to judge, and whether the state lock is surely held (its caller was found)."""

        locked = False
        callers: dict[tuple, Caller | ApiError] = {}
        for it in batch:
            if it.caller is not None:
                continue
            key = (it.authorization, it.org, it.ws)
            if key not in callers:
                first = lock and not callers
                try:
                    callers[key] = user_caller(s, *key, lock=first)
                    locked = locked or first
                except ApiError as e:
                    callers[key] = e
            c = callers[key]
            if isinstance(c, ApiError):
                it.error = c
            else:
                it.caller = c
        return [it for it in batch if it.error is None], locked

    def _write(self, batch: list[Submit]) -> None:
        with self._session() as s, STATE_LOCK:
            try:
                batch, locked = self._authenticate(s, batch, lock=s.get_bind().dialect.name == "postgresql")
                if not locked and batch:
                    # the callers' rows stay as read (the request answers with their names)
                    lock_state(s, keep=[x for it in batch for x in (it.caller.token, it.caller.org,
                                                                    it.caller.workspace) if x is not None])
                written = submit(s, batch, names=False) if batch else []
                if not written:
                    s.rollback()
                    return
                s.commit()
                self.batches += 1
                self.submits += len(written)
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


def write(s, accepted: list[Submit]) -> list[Submit]:
    """The accepted runs, their workers, History lines and events, as Core INSERTs (one multi-row statement per
    table, no ORM unit of work): the runs' ids come back (RETURNING) and are set on the objects, which stay out of
    the session (transient: each request answers from its own; its workers' ids are not read).

    A run whose name a live run of its workspace already has is not inserted (ON CONFLICT DO NOTHING on the
    unique workspace, name and live key: the check and the write in one statement, under the state lock): its
    submit gets the refusal of a name taken, and nothing of it is written. Returns the submits written."""

    runs_t, workers_t = Run.__table__, Worker.__table__
    rows = [_values(it.run, runs_t) for it in accepted]
    # what belongs to each run: its workers (and, from lifecycle, its History line and event; the run's id is not known yet: on
    # PostgreSQL they are written in the runs' own round trip, each finding its run by uid; elsewhere once the ids
    # are back, for the runs written)
    owned = {id(it): [_values(w, workers_t) for w in it.run.workers] for it in accepted}
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
        ws = it.caller.workspace
        rid = got.get((ws.id, it.run.name))
        if rid is None:
            it.run, it.cluster = None, None
            name = it.parsed.metadata.name
            it.error = name_taken(name, ws.name, bool(name_holder_deleting(s, ws.id, name)))
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

    workers, runs = [], []
    for it in accepted:
        ref = it.run.id if key == "run_id" else it.run.uid
        workers.extend(dict(w, **{key: ref}) for w in owned[id(it)])
        runs.append((it.run, it.at, ref))
    many = [(Worker.__table__, [workers[i] for i in group]) for group in _groups(workers)]
    return many + lifecycle.submitted_records(runs, key)


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


# The entries every submit goes through: a body (a template's fields merged in), then a batch of one.
@dataclass
class RunOrigin:
    """What made a run, when it is not a person's POST: a schedule's tick, a replica group, a job array."""

    schedule_id: int | None = None
    group_id: int | None = None
    array_job: str | None = None
    array_index: int | None = None
    array_max_running: int | None = None


def resolve_template(session: Session, caller: Caller, spec: dict) -> tuple[dict, Template | None]:
    """A run spec naming `template` completed from that template (astraeus.templates.merge), and the template;
    a spec naming none as it is. 404 TEMPLATE_NOT_FOUND when there is no such template in the workspace."""
    name = spec.get("template") if isinstance(spec, dict) else None
    if not name:
        return spec, None
    if not isinstance(name, str):
        raise InvalidBody([{"loc": ("template",), "msg": "must be a template's name", "type": "value_error"}],
                          ("spec",))
    t = session.scalar(select(Template).where(Template.workspace_id == caller.workspace.id, Template.name == name))
    if t is None:
        raise ApiError(404, "TEMPLATE_NOT_FOUND",
                       f"spec.template: template {name} does not exist in workspace {caller.workspace.name}: "
                       "create it first (POST $API/templates), or check its name (GET $API/templates)")
    return templates.merge(t.spec or {}, spec), t


def names_no_image(spec: dict) -> bool:
    """A run spec whose task_template names no image: the workspace's default image on its cluster fills it in."""
    tt = spec.get("task_template")
    return isinstance(tt, dict) and tt.get("image") is None


def with_default_image(session: Session, caller: Caller, spec):
    """A spec naming no image (nor a template that names one) given the workspace's default image on its cluster
    (`clusters.<cluster>.default_image`, issue 44: a batch script as written names none); 422 naming the next step
    where the workspace has none."""
    if not isinstance(spec, dict) or not names_no_image(spec):
        return spec
    want = spec.get("cluster") if isinstance(spec.get("cluster"), str) else None
    cluster, access = cluster_for(session, caller.workspace.id, caller.workspace.name, want)
    if not access.default_image:
        raise ApiError(422, "INVALID", f"spec.task_template.image: the run names no image and workspace "
                                       f"{caller.workspace.name} has no default image on cluster {cluster.name}: name "
                                       f"one, or ask an organisation admin to set clusters.{cluster.name}.default_image")
    return {**spec, "task_template": {**spec["task_template"], "image": access.default_image}}


def parse_run_body(body) -> S.RunCreate | None:
    """A run body checked as POST /runs checks it (InvalidBody naming the field), before any lock or statement;
    None when its spec names a template (checked only once the template's fields are merged in, in
    submit_run_body)."""
    from pydantic import ValidationError

    if not isinstance(body, dict):
        raise InvalidBody([{"loc": (), "msg": "the body must be a JSON object", "type": "value_error"}])
    spec = body.get("spec")
    if isinstance(spec, dict) and (spec.get("template") or names_no_image(spec)):
        return None
    try:
        return S.RunCreate.model_validate(body)
    except ValidationError as e:
        raise InvalidBody(e.errors()) from None


def submit_run_body(session: Session, caller: Caller, body: dict, at: float, origin: RunOrigin | None = None,
                    parsed: S.RunCreate | None = None) -> Run:
    """POST /runs from its raw body: the template it names merged in (its labels too), then checked as any run
    body is (InvalidBody naming the field; the ApiErrors of submit_run), then submitted with its origin.
    `parsed`: parse_run_body(body) already (the router checks the body before it takes the state lock)."""
    from pydantic import ValidationError

    t = None
    if parsed is None:
        if not isinstance(body, dict):
            raise InvalidBody([{"loc": (), "msg": "the body must be a JSON object", "type": "value_error"}])
        spec, t = resolve_template(session, caller, body.get("spec"))
        spec = with_default_image(session, caller, spec)
        merged = dict(body, spec=spec)
        if t is not None:
            meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
            merged["metadata"] = {**meta, "labels": templates.merge_labels(t.labels, meta.get("labels"))}
        try:
            parsed = S.RunCreate.model_validate(merged)
        except ValidationError as e:
            raise InvalidBody(e.errors()) from None
    if parsed.spec.array is not None and (origin is None or origin.array_job is None):
        a = parsed.spec.array  # a job array's run (spec.array): the scheduler keeps max_running of it running
        origin = RunOrigin(**{**(origin.__dict__ if origin else {}), "array_job": a.job, "array_index": a.index,
                              "array_max_running": a.max_running})
    extra = {}
    if t is not None:
        extra.update(template=t.name, template_version=t.version)
    if origin is not None:
        extra.update(schedule_id=origin.schedule_id, group_id=origin.group_id, array_job=origin.array_job,
                     array_index=origin.array_index, array_max_running=origin.array_max_running)
    return submit_run(session, caller, parsed, at, **extra)


def submit_run(session: Session, caller: Caller, body: S.RunCreate, at: float, **columns) -> Run:
    """Store a checked run body as a Pending run with its workers, its "Submitted" history line and its
    RunSubmitted event (`columns`: more of the run's columns, its template or origin): a batch of one through
    server/submits.py, which decides every refusal (raised here) and writes the run. The run stays out of the
    session, its id set; `run.cluster_row` is its cluster, for the answer."""
    it = Submit(body, at, caller=caller, columns=columns)
    submit(session, [it])
    if it.error is not None:
        raise it.error
    it.run.cluster_row = it.cluster
    return it.run
