"""The scheduling loop: load a snapshot, call the pure scheduler, apply its plan in one transaction.

It also does the control plane's other timed duties: a worker past its time limit is stopped, a machine
that stopped heartbeating is lost. It wakes at least every `schedule_interval` seconds (15 s, the pages'
promise), within a few milliseconds of any change (a submit, a delete, a worker's exit, a machine joining), and
when a failed worker's crash-loop backoff ends. State changes themselves are lifecycle's (server/lifecycle.py).
With several replicas on one PostgreSQL database, only the scheduling leader runs it, and each of its writing
transactions is fenced by the lease (server/leader.py): a replica that lost the lead writes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from prometheus_client import Counter, Histogram
from sqlalchemy import Text, bindparam, cast, func, or_, select
from sqlalchemy.orm import Session, selectinload

from astraeus import drives as drive_rules
from astraeus import rendezvous
from astraeus import scheduler as sched
from astraeus.scheduler import gpushare, topology
from astraeus.server import agents, diskfull, health, lifecycle
from astraeus.server import pools as pool_rules
from astraeus.server import progress as progress_watch
from astraeus.server import replica_groups as replica_group_duty
from astraeus.server import reservations as reservation_duty
from astraeus.server import schedules as schedule_ticks
from astraeus.server.core import ControlPlane
from astraeus.server.db import Access, Cluster, Drive, Machine, Reservation, Run, Worker, Workspace
from astraeus.server.leader import NotLeader, Term, fence
from astraeus.server.state_lock import STATE_LOCK

log = logging.getLogger("astraeus.loop")

CYCLE_SECONDS = Histogram("astraeus_schedule_cycle_seconds", "Time of one scheduling cycle (load, plan, apply)")
PLAN_SECONDS = Histogram("astraeus_plan_seconds", "Time the pure scheduler takes for one cluster")
STARTS = Counter("astraeus_workers_placed_total", "Workers placed on machines")


class RunKey(str):
    """A run as the scheduler names it in a snapshot and its plan: the run's name, or `name@ns` when live runs of
    two workspaces share the name (the scheduler keys its plan by name). `name` is the run's own name, `run_id`
    its row."""

    name: str
    run_id: int
    ns: str | None  # the workspace's, only where the name is shared

    def __new__(cls, run_id: int, name: str, ns: str | None = None) -> RunKey:
        k = super().__new__(cls, name if ns is None else f"{name}@{ns}")
        k.name, k.run_id, k.ns = name, run_id, ns
        return k

    def __reduce__(self):
        return RunKey, (self.run_id, self.name, self.ns)


@dataclass(frozen=True)
class Lookups:
    """What the apply step needs to find a snapshot's rows again (under the state lock, in its own session) and to
    write only what changed: ids by the scheduler's keys, and the reasons and per-machine lines the snapshot saw
    (`queue_reasons` and `why_not` are brought up to date by each apply: a kept snapshot's next apply writes only
    what changes again). `interned` and `max_run_id`: for Kept.extend."""

    runs: dict[str, int]  # RunKey -> run id
    machines: dict[str, int]  # machine name -> id
    # One object per distinct node selection and per distinct workers tuple of the waiting runs (`waiting_run`)
    interned: dict
    max_run_id: int
    queue_reasons: dict[str, str]  # RunKey -> the run's queue reason
    why_not: dict[str, list]  # "<run key>-<index>" of each waiting worker -> its per-machine lines
    workers: dict[str, int]  # "<run key>-<index>" of each waiting worker -> its id
    shared: tuple[RunKey, ...] = ()  # the keys that are not their run's name (`name@ns`)

    def plus(self, runs: list[RunRow], keys: dict[int, RunKey]) -> Lookups:
        """These lookups with `runs` (keyed by `keys`, run id -> key) added: the one way both reads fill them."""
        waiting = [(keys[r.id], w) for r in runs for w in r.workers if w.state == lifecycle.WorkerState.PENDING]
        return replace(
            self, runs={**self.runs, **{keys[r.id]: r.id for r in runs}},
            max_run_id=max(self.max_run_id, max((r.id for r in runs), default=0)),
            queue_reasons={**self.queue_reasons, **{keys[r.id]: r.queue_reason for r in runs}},
            why_not={**self.why_not, **{f"{k}-{w.index}": w.why_not for k, w in waiting}},
            workers={**self.workers, **{f"{k}-{w.index}": w.id for k, w in waiting}},
            shared=self.shared + tuple(k for r in runs if (k := keys[r.id]) != r.name))

    def shown(self, text: str) -> str:
        """`text` of the plan as its run's workspace sees it: `name@ns` keys back to the names (a run's name is only
        ever shown inside its own workspace). The scheduler words its reasons with the keys it was given (and builds
        its why-not keys from them), so a name two workspaces share can only be told apart there by its key."""
        for k in self.shared:
            text = text.replace(k, k.name)
        return text


@dataclass(frozen=True)
class Offer:
    """What decides which waiting workers of a run a snapshot offers the scheduler, and where they may not go:
    the time, the cluster's machines (and their facts for drives), the workspace's drives and the dependencies
    judged for this read."""

    at: float
    machines: tuple = ()
    drives: dict = field(default_factory=dict)  # (workspace id, name) -> Drive
    facts: dict = field(default_factory=dict)  # machine name -> drive_rules.MachineFacts
    deps: dict = field(default_factory=dict)  # run id -> sched.Dependency


def waiting_of(run: RunRow, key: RunKey, ns: str, offer: Offer, active: bool,
               interned: dict) -> sched.WaitingRun | None:
    """The run's waiting workers as the snapshot offers them (None: none to offer): not while a gang still holds
    room (it is queued again only once none of its workers still stops), nor a worker backing off after a failure
    (a gang waits for the latest restart_at of its workers). Shared by the full read and Kept.extend."""
    if run.deleting or run.held:  # held (scontrol hold): waits, never placed, until released
        return None
    independent = run.spec.get("start") == "Independent"
    pending = [w for w in run.workers if w.state == lifecycle.WorkerState.PENDING]
    if not pending or (not independent and active):
        return None
    if independent:
        pending = [w for w in pending if not (w.restart_at and w.restart_at > offer.at)]
    elif (lifecycle.restart_due(pending) or 0) > offer.at:
        pending = []
    if not pending:
        return None  # backing off after a failure: offered again when its restart_at comes
    excluded = []
    for ref in run.spec["task_template"].get("datavolume_refs") or []:
        d = offer.drives.get((run.workspace_id, ref["name"]))
        if d is None:
            excluded += [(m.name, f"drive {ref['name']} no longer exists") for m in offer.machines]
            continue
        src = d.spec["sources"][0]
        keeper = offer.facts.get(src.get("node"))
        for m in offer.machines:
            why = drive_rules.unreachable(ref["name"], src, d.spec.get("transport", "Auto"), offer.facts[m.name],
                                          keeper)
            if why:
                excluded.append((m.name, why))
    return waiting_run(run, key, ns, pending, excluded, offer.deps.get(run.id), interned, offer.machines)


def build_snapshot(session: Session, cluster: Cluster, at: float | None = None) -> tuple[sched.Snapshot, Lookups]:
    """The snapshot for one cluster, plus the lookups the apply step needs (runs and machines by name).

    A worker that waits out its crash-loop backoff (restart_at after `at`) is not offered to the scheduler; a
    gang waits for the latest restart_at of its workers."""
    at = time.time() if at is None else at
    of = {"cluster_id": cluster.id}
    machines = list(session.scalars(_MACHINES, of))
    mby_id = {m.id: m for m in machines}
    runs = live_runs(session, cluster.id)
    wss = {w.id: w for w in session.scalars(_WORKSPACES)}
    accesses = list(session.scalars(_ACCESSES, of))
    drives = {(d.workspace_id, d.name): d for d in session.scalars(_DRIVES, of)}
    ready = lifecycle.MachineState.READY

    pressure = {m.id: diskfull.disk_pressure(m.disk_path, m.disk_free_bytes, m.disk_total_bytes,
                                             diskfull.PRESSURE_BELOW) for m in machines}
    cordoned = {m.id: health.unschedulable(m) for m in machines}  # drained or cordoned (server/health.py)
    snap_machines = tuple(
        sched.Machine(name=m.name, gpus=m.gpus, cpu_cores=m.cpu_cores, memory_bytes=m.memory_bytes,
                      labels=tuple(sorted((m.labels or {}).items())), stop_grace_seconds=m.stop_grace_seconds,
                      schedulable=m.state == ready and pressure[m.id] is None and cordoned[m.id] is None,
                      unschedulable_reason=("lost" if m.state != ready else pressure[m.id] or cordoned[m.id]
                                            or "lost"),
                      gpu_model=(m.gpu_models or [""])[0] or "", quarantined_gpus=health.quarantined(m),
                      gpu_memory_bytes=gpu_memory_of(m), nvlink_islands=islands_of(m), gpu_mig=mig_of(m))
        for m in sorted(machines, key=lambda m: m.name))
    snap_pools = tuple(sched.Pool(name=p.name, machines=tuple(pool_rules.pool_members(p, machines)))
                       for p in pool_rules.cluster_pools(session, cluster.id))
    snap_reservations = tuple(
        sched.Reservation(name=r.name, machines=tuple(r.machines or ()),
                          workspaces=tuple(wss[w].ns for w in r.workspaces or () if w in wss),
                          start=r.start_at, end=r.end_at)
        for r in session.scalars(_RESERVATIONS, of)
        if r.end_at is None or r.end_at > at)
    facts = {m.name: drive_rules.MachineFacts.of(m.name, m.state == ready, m.address, m.shared_filesystems, m.nfs)
             for m in machines}
    # Runs are named in the plan by name; two workspaces may use one name, so those get "name@ns" keys.
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1
    keys = {r.id: RunKey(r.id, r.name, None if seen[r.name] == 1 else wss[r.workspace_id].ns) for r in runs}
    deps = dependencies(session, [r for r in runs if r.spec.get("dependency") and not r.deleting
                                  and r.state == lifecycle.RunState.PENDING])
    offer = Offer(at, tuple(machines), drives, facts, deps)
    running: list[sched.RunningUnit] = []
    waiting: list[sched.WaitingRun] = []
    interned: dict = {}
    for run in runs:
        ns = wss[run.workspace_id].ns
        key = keys[run.id]
        active = [w for w in run.workers if w.state in lifecycle.ACTIVE and w.machine_id in mby_id]
        independent = run.spec.get("start") == "Independent"
        for g in [[w] for w in active] if independent else ([active] if active else []):
            running.append(running_unit(run, key, ns, g, mby_id))
        offered = waiting_of(run, key, ns, offer, bool(active), interned)
        if offered is not None:
            waiting.append(offered)
    workspaces = []
    for a in accesses:
        ws = wss[a.workspace_id]
        has_quota = any(v is not None for v in (a.quota_gpus, a.quota_cpu_cores, a.quota_memory_bytes,
                                                a.quota_workers))
        quota = sched.Quota(gpus=a.quota_gpus, cpu_cores=a.quota_cpu_cores, memory_bytes=a.quota_memory_bytes,
                            workers=a.quota_workers) if has_quota else None
        workspaces.append(sched.Workspace(id=ws.ns, name=ws.name, quota=quota, weight=a.weight or 1.0,
                                          pools=tuple(a.pools) if a.pools is not None else None,
                                          max_gpus_per_user=a.max_gpus_per_user))
    snap = sched.Snapshot(cluster=cluster.name, machines=snap_machines, running=tuple(running),
                          waiting=tuple(waiting), workspaces=tuple(workspaces), preemption=cluster.preemption,
                          pools=snap_pools, reservations=snap_reservations,
                          victims=getattr(cluster, "preemption_victims", None) or "recent",
                          gpu_sharing=getattr(cluster, "gpu_sharing", None) or "workspace",
                          placement=getattr(cluster, "placement", None) or "bestfit")
    lookups = Lookups(runs={}, machines={m.name: m.id for m in machines}, interned=interned, max_run_id=0,
                      queue_reasons={}, why_not={}, workers={})
    return snap, lookups.plus(runs, keys)


def gpu_memory_of(m) -> int:
    """A machine's GPU memory as the scheduler counts it: its smallest GPU's (0: its agent reports none)."""
    return min(m.gpu_memory or [0]) if m.gpus else 0


def islands_of(m) -> tuple[tuple[int, ...], ...]:
    """A machine's NVLink islands as the scheduler keeps them (topology.full_islands); () none reported."""
    return topology.full_islands(m.nvlink_islands, m.gpus) if m.nvlink_islands and m.gpus else ()


def mig_of(m) -> tuple[tuple[tuple[str, int], ...], ...]:
    """A machine's MIG devices per GPU as the scheduler keeps them ((profile, count) pairs, sorted); () none."""
    if not m.gpu_mig or not any(m.gpu_mig):
        return ()
    return tuple(tuple(sorted((p, int(n)) for p, n in (d or {}).items() if n)) for d in m.gpu_mig[:m.gpus])


def gpu_share_asked(gpu_memory: int, machines) -> float:
    """The share of one GPU a run asking `gpu_memory` bytes counts for quotas while it waits: the largest it takes on
    a machine that holds it (the smallest such GPU), 0.999 where none does."""
    held = [g for g in (m.gpu_memory_bytes if isinstance(m, sched.Machine) else gpu_memory_of(m) for m in machines)
            if g > gpu_memory]
    return (gpushare.memory_milli(gpu_memory, min(held)) if held else gpushare.FULL - 1) / gpushare.FULL


def running_unit(run: RunRow, key: RunKey, ns: str, group: list[WorkerRow], mby_id: dict) -> sched.RunningUnit:
    """Workers of `run` holding room that preemption stops as one (a gang's, or one independent worker)."""
    placed = tuple(sched.PlacedWorker(name=w.name, index=w.index, machine=mby_id[w.machine_id].name,
                                      gpu_indices=tuple(w.gpu_indices or ()), cpu_cores=w.cpu_cores,
                                      memory_bytes=w.memory_bytes, gpu_milli=w.gpu_milli or 0,
                                      mig_devices=tuple(tuple(d) for d in w.mig_devices or ())) for w in group)
    stopping = any(w.state == lifecycle.WorkerState.STOPPING for w in group)
    return sched.RunningUnit(
        run=key, workspace=ns, priority=run.priority,
        started_at=min(w.placed_at or run.created_at for w in group),
        time_limit_seconds=run.spec["task_template"].get("time_limit_seconds"), workers=placed, stopping=stopping,
        preempted_for=next((w.preempted_for for w in group if w.preempted_for), None) if stopping else None,
        array=run.array_job, last_checkpoint=_last_checkpoint(group), user=run.created_by)


def _last_checkpoint(group: list[WorkerRow]) -> float | None:
    """A unit's last checkpoint: its workers' oldest (a gang resumes from the checkpoint all of them wrote)."""
    times = [w.checkpoint_at for w in group]
    return None if not times or None in times else min(times)


def waiting_run(run, key: str, ns: str, pending: list, excluded: list, dependency: sched.Dependency | None,
                interned: dict, machines=()) -> sched.WaitingRun:
    """A waiting run of the snapshot (its `pending` workers), from its row (live_runs)."""
    tt = run.spec["task_template"]
    sel = tt.get("requested_resources", {}).get("node_selection") or {}
    gpu_requests = tt.get("requested_resources", {}).get("gpu_requests") or {}
    gpu_memory = gpu_requests.get("memory_bytes") or 0
    mig = gpu_requests.get("mig")  # issue 46: `count` MIG devices of this profile on one machine
    # one object per distinct selection (and workers tuple, below): the scheduler keeps a selection's answer (its
    # machines, buckets, never-fits) by the object, and a cycle reads every waiting run's selection and workers:
    # shared objects are read from the cache, not from memory, run after run
    selection = sched.NodeSelection(mode=sel.get("mode", "Any"), names=tuple(sel.get("names") or ()),
                                    labels=tuple(sorted((sel.get("labels") or {}).items())),
                                    pools=tuple(sel.get("pools") or ()),
                                    gpu_model=(tt.get("requested_resources", {}).get("gpu_requests")
                                               or {}).get("model"),
                                    reservation=sel.get("reservation"),
                                    topology_same=(sel.get("topology") or {}).get("same"),
                                    gpu_memory=gpu_memory or None, mig=mig)
    selection = interned.setdefault(selection, selection)
    independent = run.spec.get("start") == "Independent"
    # each worker's ask in sched.WorkerRequest's field order: index, gpus, cpu cores, memory, GPU memory, MIG
    mig_count = gpu_requests.get("count", 0) if mig else 0
    asks = tuple((w.index, (gpu_share_asked(gpu_memory, machines) if gpu_memory
                            else w.gpu_milli / 1000 if w.gpu_milli else w.gpus),
                  w.cpu_cores, w.memory_bytes, gpu_memory, mig or "", mig_count) for w in pending)
    return sched.WaitingRun(
        name=key, workspace=ns, priority=run.priority, submitted_at=run.created_at,
        workers=sched.interned_workers(interned, asks),
        start="Independent" if independent else "Gang", time_limit_seconds=tt.get("time_limit_seconds"),
        node_selection=selection,
        excluded_machines=tuple(excluded), quota_noted=run.quota_noted,
        array=run.array_job, array_max_running=run.array_max_running, dependency=dependency, user=run.created_by)


class Kept:
    """A cluster's snapshot kept after a cycle whose plan changed nothing but the queue's words (no start, stop,
    failure or quota note), so that the next cycle woken only by plain submits made here (Notifier.
    woken_by_submits_only) plans on it plus the new runs (`extend`), instead of reading the whole queue again: with
    a long queue that read was most of a cycle's cost, and a burst of submits woke a cycle per group commit. Plans
    are the same as on a snapshot read afresh: nothing it holds has changed (anything else that changes state wakes
    the loop another way, and the next cycle reads everything), the new runs are read in full and added in id
    order through the full read's own conversions (waiting_of, Lookups.plus), and a run the kept snapshot cannot
    take as is (a dependency, drives, a name already in the snapshot, not plainly waiting) means a full read. It is
    read afresh at least every MAX_AGE seconds and when a reservation's window opened or closed since it was read."""

    MAX_AGE = 5.0

    def __init__(self, snap: sched.Snapshot, lookups: Lookups, built_at: float):
        self.snap, self.lookups, self.built_at = snap, lookups, built_at
        self.names = {getattr(k, "name", k) for k in lookups.runs}
        self.wss: dict[int, str] | None = None

    def fresh(self, at: float) -> bool:
        if at - self.built_at > self.MAX_AGE or at < self.built_at:
            return False
        return not any(self.built_at < t <= at for r in self.snap.reservations for t in (r.start, r.end)
                       if t is not None)

    def extend(self, session: Session, cluster_id: int) -> tuple[sched.Snapshot, Lookups] | None:
        """The kept snapshot plus the runs submitted since (those of ids above the last it holds), or None when one
        of them needs a full read. The same (snapshot, lookups) when there is none."""
        lookups = self.lookups
        new = live_runs(session, cluster_id, after_id=lookups.max_run_id)
        if not new:
            return self.snap, lookups
        if self.wss is None:
            self.wss = {w.id: w.ns for w in self.snap_workspaces(session)}
        offer = Offer(self.built_at, self.snap.machines)  # no dependency, drive or backoff among them (checked below)
        waiting = []
        names = set()
        for run in new:
            ns = self.wss.get(run.workspace_id)
            if (ns is None or run.deleting or run.held or run.state != lifecycle.RunState.PENDING
                    or run.spec.get("dependency")
                    or run.spec["task_template"].get("datavolume_refs") or run.name in self.names
                    or run.name in names or not run.workers
                    or any(w.state != lifecycle.WorkerState.PENDING or w.restart_at for w in run.workers)):
                return None
            names.add(run.name)
            waiting.append(waiting_of(run, RunKey(run.id, run.name), ns, offer, False, lookups.interned))
        lookups = lookups.plus(new, {r.id: RunKey(r.id, r.name) for r in new})
        return replace(self.snap, waiting=self.snap.waiting + tuple(waiting)), lookups

    @staticmethod
    def snap_workspaces(session: Session):
        return session.execute(select(Workspace.id, Workspace.ns)).all()

    def kept(self, snap: sched.Snapshot, lookups: Lookups) -> Kept:
        """This kept snapshot moved on to `snap` (the same read, new runs added), its lookups as applied."""
        k = Kept.__new__(Kept)
        k.snap, k.lookups, k.built_at, k.wss = snap, lookups, self.built_at, self.wss
        k.names = self.names | {getattr(n, "name", n) for n in lookups.runs if n not in self.lookups.runs}
        return k


class WorkerRow(NamedTuple):
    """A live run's worker as the snapshot reads it (_WORKER's columns, JSON decoded)."""

    id: int
    run_id: int
    name: str
    index: int
    state: str
    machine_id: int | None
    gpu_indices: list | None
    gpus: int
    cpu_cores: float
    memory_bytes: int
    placed_at: float | None
    preempted_for: str | None
    restart_at: float | None
    why_not: list | None
    checkpoint_at: float | None = None  # revision 0020: its last checkpoint this attempt
    gpu_milli: int = 0  # revision 0021: thousandths of one GPU it shares; 0: whole GPUs
    mig_devices: list | None = None  # revision 0025: its MIG devices, [gpu, profile, k] each


class RunRow(NamedTuple):
    """A live run as the snapshot reads it (_RUN's columns, its spec and its workers by index)."""

    id: int
    workspace_id: int
    name: str
    uid: str
    priority: int
    state: str
    created_at: float
    deleting: bool
    queue_reason: str | None
    quota_noted: bool
    array_job: str | None
    array_max_running: int | None
    held: bool
    created_by: str | None  # revision 0018: who submitted it (a workspace's max_gpus_per_user counts it)
    spec: dict
    workers: tuple[WorkerRow, ...]


_RUN = (Run.id, Run.workspace_id, Run.name, Run.uid, Run.priority, Run.state, Run.created_at, Run.deleting,
        Run.queue_reason, Run.quota_noted, Run.array_job, Run.array_max_running, Run.held, Run.created_by)
# A worker's two JSON columns are read as their text and decoded here (_json): most are "[]" (a waiting worker has no
# GPUs, and only the first runs of the queue have why-not lines), decoded without json.loads' cost per row.
_WORKER = (Worker.id, Worker.run_id, Worker.name, Worker.index, Worker.state, Worker.machine_id,
           cast(Worker.gpu_indices, Text).label("gpu_indices"), Worker.gpus, Worker.cpu_cores, Worker.memory_bytes,
           Worker.placed_at, Worker.preempted_for, Worker.restart_at, cast(Worker.why_not, Text).label("why_not"),
           Worker.checkpoint_at, Worker.gpu_milli, Worker.mig_devices)


# The full read's statements, built once (the cluster and the last run id bound at each read): building them (their
# columns' and clauses' coercions, their cache keys) at each read was a large share of a short queue's cycle.
_LIVE = (Run.cluster_id == bindparam("cluster_id"), Run.state.not_in(lifecycle.RUN_ENDED))
_NEW = (*_LIVE, Run.id > bindparam("after_id"))  # only those submitted since (Kept.extend), read with their specs
_LIVE_RUNS = select(*_RUN).where(*_LIVE).order_by(Run.id)
_NEW_RUNS = select(*_RUN, Run.spec).where(*_NEW).order_by(Run.id)
_LIVE_WORKERS, _NEW_WORKERS = (select(*_WORKER).join(Run, Worker.run_id == Run.id).where(*of)
                                .order_by(Worker.run_id, Worker.index) for of in (_LIVE, _NEW))
_MACHINES = select(Machine).where(Machine.cluster_id == bindparam("cluster_id"))
_WORKSPACES = select(Workspace)
_ACCESSES = select(Access).where(Access.cluster_id == bindparam("cluster_id"))
_DRIVES = select(Drive).where(Drive.cluster_id == bindparam("cluster_id"))
_RESERVATIONS = select(Reservation).where(Reservation.cluster_id == bindparam("cluster_id")).order_by(
    Reservation.start_at, Reservation.name)


def _json(text: str | None):
    if text is None:
        return None
    return [] if text == "[]" else json.loads(text)


# Per engine (database) and cluster: the specs of the runs its last full read found, by run uid. A run's spec never
# changes once written and a uid is never given twice, so a full read decodes only the specs of the runs it had not
# seen (decoding every live run's JSON spec on every cycle was the largest part of a full read with a long queue).
_SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> {cluster id: {uid: spec}}
_SPECS_CHUNK = 500  # uids per IN (...) of the specs not kept


def forget_spec(uid: str) -> None:
    """Read this run's spec again at the next read (its priority or time limit changed: PATCH $API/runs/{name})."""
    for kept in list(_SPECS.values()):
        for specs in kept.values():
            specs.pop(uid, None)


def live_runs(session: Session, cluster_id: int, after_id: int = 0) -> list[RunRow]:
    """The cluster's runs that have not ended, each with its `workers` by index, as plain rows (the columns the
    snapshot reads; `spec` decoded once per run, see _SPECS), in id order; with `after_id`, only those above it.
    Each run read is a Core row, not an ORM object: loading every live run and worker as ORM objects was most of a
    cycle's CPU with a long queue (every submit shares the cores with it). Runs first, then their workers: a run is
    written with its workers in one transaction, so each run read has its workers in the second read."""
    conn = session.connection()  # Core rows: no ORM loading
    of = {"cluster_id": cluster_id, "after_id": after_id} if after_id else {"cluster_id": cluster_id}
    runs = conn.execute(_NEW_RUNS if after_id else _LIVE_RUNS, of).all()
    workers: dict[int, list] = {}
    for row in conn.execute(_NEW_WORKERS if after_id else _LIVE_WORKERS, of):
        w = WorkerRow(*row[:6], _json(row[6]), *row[7:13], _json(row[13]), *row[14:])
        workers.setdefault(w.run_id, []).append(w)
    if after_id:  # read with their specs
        return [RunRow(*r, tuple(workers.get(r[0], ()))) for r in runs]
    specs = _specs(conn, cluster_id, runs)
    return [RunRow(*r, specs[r.uid], tuple(workers.get(r[0], ()))) for r in runs]


def _specs(conn, cluster_id: int, runs: list) -> dict[str, dict]:
    """The specs of `runs` by uid: those kept from the cluster's last full read, the others read now (and kept
    for the next, in place of the last's)."""
    by_cluster = _SPECS.get(conn.engine)
    if by_cluster is None:
        by_cluster = _SPECS.setdefault(conn.engine, {})
    kept = by_cluster.get(cluster_id, {})
    specs = {r.uid: kept[r.uid] for r in runs if r.uid in kept}
    missing = [r.id for r in runs if r.uid not in specs]
    for i in range(0, len(missing), _SPECS_CHUNK):
        specs.update(conn.execute(select(Run.uid, Run.spec).where(Run.id.in_(missing[i:i + _SPECS_CHUNK]))).all())
    by_cluster[cluster_id] = specs
    return specs


def dependencies(session: Session, runs: list[Run]) -> dict[int, sched.Dependency]:
    """What each of these waiting runs' dependencies (spec.dependency) stands for now, for the scheduler to judge:
    every run each name given stands for (a run of that name, or every run of a job array of that name; the
    latest row of each name), with its state; a run deleted while it stops counts as Cancelled. `singleton`: the
    live runs of the run's own job (its array, or its name) submitted before it."""
    if not runs:
        return {}
    wanted: set[str] = set()
    for r in runs:
        d = r.spec["dependency"]
        if d["type"] == "singleton":
            wanted.add(r.array_job or r.name)
        else:
            wanted.update(d.get("runs") or ())
    rows = session.execute(select(Run.id, Run.workspace_id, Run.name, Run.array_job, Run.state, Run.deleting).where(
        Run.workspace_id.in_({r.workspace_id for r in runs}), or_(Run.name.in_(wanted), Run.array_job.in_(wanted))))
    by_name: dict[tuple[int, str], dict[str, tuple]] = {}  # (workspace, name given) -> run name -> its latest row
    for row in rows:
        for given in {row.name, row.array_job} & wanted:
            latest = by_name.setdefault((row.workspace_id, given), {})
            if row.name not in latest or latest[row.name].id < row.id:
                latest[row.name] = row
    out: dict[int, sched.Dependency] = {}
    for r in runs:
        d = r.spec["dependency"]
        found: list[tuple[str, str, str]] = []
        if d["type"] == "singleton":
            job = r.array_job or r.name
            found = [(job, x.name, x.state) for x in by_name.get((r.workspace_id, job), {}).values()
                     if x.id < r.id and x.state in lifecycle.RUN_LIVE and not x.deleting]
        else:
            for given in d.get("runs") or ():
                named = [x for x in by_name.get((r.workspace_id, given), {}).values() if x.id != r.id]
                if not named:
                    found.append((given, given, lifecycle.RunState.CANCELLED.value))  # gone: it will never end well
                for x in named:
                    state = lifecycle.RunState.CANCELLED.value if x.deleting and x.state in lifecycle.RUN_LIVE else x.state
                    found.append((given, x.name, state))
        out[r.id] = sched.Dependency(type=d["type"], runs=tuple(sorted(found)))
    return out


def set_rendezvous(session: Session, run: Run) -> None:
    """A gang just placed gets its attempt's rendezvous (astraeus.rendezvous): ranks by worker index, rank 0's
    machine address, and a port no other live gang of the cluster uses. Kept on each worker row."""
    if not rendezvous.is_gang(run.spec.get("start"), len(run.workers)):
        return
    workers = sorted(run.workers, key=lambda w: w.index)
    if any(w.machine_id is None or w.state not in lifecycle.ACTIVE for w in workers):
        return  # not all placed (cannot happen for a gang): nothing to meet
    machines = {m.id: m for m in session.scalars(select(Machine).where(
        Machine.id.in_({w.machine_id for w in workers})))}
    used, taken = set(), set()  # the ports of the cluster's other live gangs, and their workers' addresses
    for env in session.scalars(select(Worker.rendezvous).join(Run, Worker.run_id == Run.id).where(
            Run.cluster_id == run.cluster_id, Run.id != run.id,
            Worker.state.in_(lifecycle.ACTIVE), Worker.rendezvous.is_not(None))):
        if env and str(env.get("ASTRAEUS_MASTER_PORT", "")).isdigit():
            used.add(int(env["ASTRAEUS_MASTER_PORT"]))
        if env and env.get("ASTRAEUS_WORKER_ADDR"):
            taken.add(env["ASTRAEUS_WORKER_ADDR"])
    seed = f"{run.uid}:{workers[0].attempt}"
    port = rendezvous.choose_port(used, seed)
    isolated = (run.spec["task_template"].get("network") or "isolated") == "isolated"
    addresses = rendezvous.choose_addresses(taken, seed, len(workers)) if isolated else [None] * len(workers)
    nodes = [rendezvous.Node(machine=machines[w.machine_id].name, address=machines[w.machine_id].address,
                             gpus=len(w.gpu_indices or []), worker_address=a)
             for w, a in zip(workers, addresses, strict=True)]
    for w, env in zip(workers, rendezvous.environments(run.name, nodes, port), strict=True):
        w.rendezvous = env


def apply_plan(session: Session, plan: sched.Plan, lookups: Lookups, at: float) -> tuple[set[int], bool]:
    """Write the plan: placements, stops, reasons. Runs under the state lock, in a session of its own, on rows
    read again: the plan was made on a snapshot read without the lock, so each step checks that what it acts on
    is still as the snapshot saw it (a run deleted meanwhile is not started, a victim that ended is not stopped).
    Room cannot have been taken meanwhile: only this loop places workers. Returns the machines whose desired
    workers changed, and whether a step was skipped (so the loop plans again at once)."""
    touched: set[int] = set()
    skipped = False
    ids = lookups.runs
    machine_ids = lookups.machines
    text = lookups.shown
    loaded: dict[int, Run | None] = {}

    def run_named(key: str) -> Run | None:
        rid = ids.get(key)
        if rid is None:
            return None
        if rid not in loaded:
            loaded[rid] = session.get(Run, rid)
        return loaded[rid]

    # Every run the plan acts on (starts, stops, quota notes, fails), read at once with its workers (one query per
    # 500, not two per run: the apply holds the state lock). The queue's reasons and why-not lines that changed
    # since the snapshot are written apart, in bulk (lifecycle.set_queue_reasons): reading a long queue's runs for them took most
    # of the apply's time while every submit waited for the lock.
    seen_reasons, seen_why_not = lookups.queue_reasons, lookups.why_not
    wanted = {s.run for s in plan.starts} | {s.run for s in plan.stops} | {s.run for s in plan.reservation_stops}
    wanted |= {q.run for q in plan.quota_reached} | set(plan.fails)
    reasons = {n: text(r) for n, r in plan.reasons.items()}
    reasons = {n: r for n, r in reasons.items() if seen_reasons.get(n) != r}
    why_not = {w: [[m, text(r)] for m, r in lines] for w, lines in plan.why_not.items()}
    why_not = {w: lines for w, lines in why_not.items() if seen_why_not.get(w) != lines}
    lifecycle.set_queue_reasons(session, {ids[n]: r for n, r in reasons.items() if n not in wanted and n in ids},
                  {lookups.workers[w]: lines for w, lines in why_not.items()
                   if w.rpartition("-")[0] not in wanted and w in lookups.workers}, at)
    # the lookups now say what the rows say (a kept snapshot's next apply writes only what changes again)
    seen_reasons.update((n, r) for n, r in reasons.items() if n in ids)
    seen_why_not.update((w, lines) for w, lines in why_not.items() if w in lookups.workers)
    want_ids = sorted({ids[k] for k in wanted if k in ids})
    for k in range(0, len(want_ids), 500):
        chunk = want_ids[k:k + 500]
        for r in session.scalars(select(Run).where(Run.id.in_(chunk)).options(selectinload(Run.workers))):
            loaded[r.id] = r
        for rid in chunk:
            loaded.setdefault(rid, None)  # gone since the snapshot

    for start in plan.starts:
        run = run_named(start.run)
        if run is None or run.deleting or run.state in lifecycle.RUN_ENDED:
            skipped = True
            continue
        workers = {w.index: w for w in run.workers}
        steps = [(p, workers.get(p.worker_index), session.get(Machine, machine_ids.get(p.machine)))
                 for p in start.placements]
        if any(w is None or w.state != lifecycle.WorkerState.PENDING or m is None
               or m.state != lifecycle.MachineState.READY or (w.restart_at or 0) > at for _, w, m in steps):
            skipped = True  # changed since the snapshot: plan again
            continue
        for p, w, m in steps:
            lifecycle.place(session, run, w, m.id, list(p.gpu_indices), p.cpu_cores, p.memory_bytes, at, m.name)
            if p.gpu_milli:
                w.gpu_milli = p.gpu_milli  # issue 46: a GPU-memory ask's share is the placing machine's
            if p.mig_devices:
                w.mig_devices = [list(d) for d in p.mig_devices]  # issue 46: its MIG devices, each whole
            touched.add(m.id)
            STARTS.inc()
        set_rendezvous(session, run)
        touched.update(agents.keepers_of(session, [run]))  # their exports follow the run's workers
        lifecycle.refresh_run(session, run, at)
    for stop in plan.stops:
        run = run_named(stop.run)
        if run is None:
            continue
        ws = [w for w in run.workers if w.name in stop.workers and w.state in lifecycle.ACTIVE
              and w.desired != lifecycle.Desired.STOPPED]
        if not ws:
            skipped = True
            continue
        touched.update(w.machine_id for w in ws if w.machine_id)
        lifecycle.preempt(session, run, ws, text(stop.preempted_by), text(stop.reason), at)
        lifecycle.refresh_run(session, run, at)  # preemptions are counted per workspace by accounting (services/usage.py)
    for stop in plan.reservation_stops:  # others' work on a reservation's machines once its window opened
        run = run_named(stop.run)
        if run is None:
            continue
        gang = run.spec.get("start") != "Independent"
        ws = [w for w in run.workers if (gang or w.name in stop.workers) and w.state in lifecycle.ACTIVE
              and w.desired != lifecycle.Desired.STOPPED]  # a gang stops whole: it is queued again only once none still runs
        if not ws:
            continue
        touched.update(w.machine_id for w in ws if w.machine_id)
        lifecycle.stop_for_reservation(session, run, ws, stop.preempted_by, stop.reason, at)
        lifecycle.refresh_run(session, run, at)
    for name, reason in reasons.items():  # of the runs acted on (the others' were written in bulk above)
        run = run_named(name) if name in wanted else None
        if run is not None and not run.deleting:
            lifecycle.set_queue_reason(session, run, reason, at)
    for wname, new in why_not.items():
        rname, _, index = wname.rpartition("-")
        run = run_named(rname) if rname in wanted else None
        if run is None:
            continue
        for w in run.workers:
            if str(w.index) == index:
                lifecycle.set_why_not(w, new)
    for q in plan.quota_reached:
        run = run_named(q.run)
        if run is not None:
            lifecycle.note_quota(session, run, text(q.message), at)
    for name, reason in plan.fails.items():  # a dependency that can no longer be met
        run = run_named(name)
        if run is not None and not run.deleting and run.state == lifecycle.RunState.PENDING:
            lifecycle.dependency_never_met(session, run, text(reason), at)
    return touched, skipped


def enforce_time_limits(session: Session, at: float) -> set[int]:
    """Stop every worker past its deadline (placed or started + time_limit_seconds): it fails, not restarted."""
    touched = set()
    rows = session.scalars(_late(at).options(selectinload(Worker.run)))
    for w in rows:
        lifecycle.stop_at_time_limit(session, w.run, w, at)
        lifecycle.refresh_run(session, w.run, at)
        touched.add(w.machine_id)
    return touched


def _silent(at: float):
    """The Ready machines silent past their cluster's lost_after_seconds at `at` (a statement)."""
    return select(Machine, Cluster).join(Cluster).where(
        Machine.state == lifecycle.MachineState.READY.value, Machine.last_heartbeat + Cluster.lost_after_seconds < at)


def _late(at: float):
    """The workers past their deadline at `at` (a statement)."""
    return select(Worker).where(Worker.state.in_((lifecycle.WorkerState.STARTING.value, lifecycle.WorkerState.RUNNING.value)), Worker.deadline <= at)


def timers_due(session: Session, at: float) -> tuple[bool, bool, bool, bool]:
    """In one read: whether a machine is silent past its timeout or a worker past its deadline, whether a replica
    group exists (its duty keeps each group's count), whether a schedule's tick and whether a reservation's window
    is due. The timers' transactions (and the state lock they take) are opened only for what is due: looked at
    four times a second, nothing is due nearly always."""
    row = session.execute(select(_silent(at).exists() | _late(at).exists(),
                                 select(replica_group_duty.ReplicaGroup.id).exists(),
                                 schedule_ticks.due(at).exists(), reservation_duty.due(at).exists())).one()
    return tuple(bool(v) for v in row)


def next_due_at(session: Session, at: float) -> float | None:
    """In one read, the earliest time after `at` something is due (the loop makes a full cycle then), or None: a
    worker's crash-loop backoff ends, a schedule ticks, a replica group's wait ends, a
    reservation's window opens or closes."""
    parts = (_restart_after(at), schedule_ticks.tick_after(at), replica_group_duty.retry_after(at),
             *reservation_duty.changes_after(at))
    times = [t for t in session.execute(select(*(q.scalar_subquery() for q in parts))).one() if t is not None]
    return min(times) if times else None


def detect_lost_machines(session: Session, at: float) -> set[int]:
    """Lose each Ready machine whose last heartbeat is older than its cluster's lost_after_seconds. Only those are
    read (not the fleet, four times a second). Bare heartbeats are written without the state lock
    (server/heartbeats.py), so each machine found is read again with its row locked (PostgreSQL: FOR UPDATE) and
    lost only if still silent: a heartbeat that committed meanwhile is seen, and one arriving now waits for this
    transaction and then finds the machine Lost (it returns the usual way)."""
    touched = set()
    ready = lifecycle.MachineState.READY.value
    for m, c in session.execute(_silent(at)).all():
        session.refresh(m, with_for_update=True)
        if m.state == ready and at - m.last_heartbeat > c.lost_after_seconds:
            touched.add(m.id)
            workers = list(session.scalars(select(Worker).where(Worker.machine_id == m.id,
                                                                Worker.state.in_(lifecycle.ACTIVE))))
            lifecycle.machine_lost(session, m, workers, at)
    return touched


def _restart_after(at: float):
    """The earliest end of a worker's crash-loop backoff after `at` (a statement)."""
    return select(func.min(Worker.restart_at)).where(Worker.state == lifecycle.WorkerState.PENDING.value,
                                                     Worker.restart_at > at)


def stops_asked_since(session: Session, since: float) -> dict[tuple[int, float], int]:
    """(worker id, when its stop was asked) -> its machine, for each worker asked to stop since `since`."""
    rows = session.execute(select(Worker.id, Worker.stop_requested_at, Worker.machine_id).where(
        Worker.state == lifecycle.WorkerState.STOPPING.value, Worker.stop_requested_at >= since))
    return {(wid, t): mid for wid, t, mid in rows if mid is not None}


def duty(cp: ControlPlane, term: Term, at: float, act, what: str) -> set[int]:
    """One of the leader's duties, found due (timers_due): `act(session, at)` in a fenced transaction. NotLeader
    goes up (the pass ends); any other error is logged and nothing of it is applied."""
    try:
        with STATE_LOCK, cp.sessions() as session, session.begin():
            fence(session, term, cp.settings.leader_lease_seconds)
            return act(session, at)
    except NotLeader:
        raise
    except Exception:
        log.exception("%s: nothing applied this cycle", what)
        return set()


def _timers(cp: ControlPlane, term: Term, lease: float, at: float) -> set[int]:
    """The cycle's timed duties, before it plans, each only when one read (timers_due) finds it due. Returns the
    machines touched."""
    with cp.sessions() as session:
        late, groups, ticks, windows = timers_due(session, at)
    touched: set[int] = set()
    if late:  # each machine found is read again under the lock (detect_lost_machines), each worker's deadline too
        with STATE_LOCK, cp.sessions() as session, session.begin():
            fence(session, term, lease)
            touched = detect_lost_machines(session, at)
            touched |= enforce_time_limits(session, at)
    # Replica groups keep their count (server/replica_groups.py); reservations' windows open and close, their
    # events once each (server/reservations.py): each a fenced transaction, only when one is due. A bad group or
    # reservation never stops scheduling.
    if groups:
        touched |= duty(cp, term, at, replica_group_duty.keep_replicas, "replica groups")
    if ticks:
        try:  # schedules' ticks (server/schedules.py), each its own fenced transaction
            touched |= schedule_ticks.make_ticks(cp, term, lease, at)
        except NotLeader:
            raise
        except Exception:
            log.exception("schedules: a tick failed this cycle")
    if windows:
        touched |= duty(cp, term, at, reservation_duty.open_and_close, "reservations")
    return touched | watch_progress(cp, term, at)


def watch_progress(cp: ControlPlane, term: Term, at: float) -> set[int]:
    """Hung runs (server/progress.py): at most once a second, and only while a watched run has a running worker."""
    with cp.sessions() as session:
        watched = progress_watch.due(cp, session, at)
    return duty(cp, term, at, progress_watch.watch, "hung runs") if watched else set()


def cycle(cp: ControlPlane, at: float | None = None, term: Term | None = None, kept: dict[int, Kept] | None = None,
          submits_only: bool = False, timers: bool = True) -> set[int]:
    """One pass: timers, then a plan per cluster. Returns the machines to notify.

    Only the scheduling leader acts (astraeus.server.leader): `term` is its holding of the lease (None: this
    replica's current one, if it leads; a follower does nothing). Each transaction that writes is fenced: in that
    same transaction the lease is checked to be still this term's, else it writes nothing (NotLeader) and the pass
    ends. The snapshot is read and planned without the state lock, so API writes and agent reports are not held
    up by a large queue; only the timers and the apply take it (see apply_plan).

    `kept` (the loop's: cluster id -> Kept) is filled with each cluster's snapshot after a plan that changed nothing
    but the queue's words; with `submits_only` (woken only by plain runs submitted here) the cycle plans on it plus
    the new runs, and skips a cluster with none. Without `submits_only`, everything is read afresh. `timers=False`:
    no lost machines, time limits, replica groups, schedules' ticks or reservations' windows this pass (the loop
    looked at them less than a tick ago)."""
    at = time.time() if at is None else at
    if kept is not None and not submits_only:
        kept.clear()
    term = term or (cp.leader.current() if cp.leader is not None else None)
    if term is None:
        return set()
    lease = cp.settings.leader_lease_seconds
    t0 = time.perf_counter()
    touched: set[int] = set()
    try:
        if timers:
            touched = _timers(cp, term, lease, at)
        replan = False
        if kept is not None and touched:  # a timer changed something: read everything
            kept.clear()
        extended: dict[int, tuple | None] = {}
        with cp.sessions() as session:
            clusters = list(session.scalars(select(Cluster)))
            for cluster in clusters:  # the runs submitted since each kept snapshot, in the same read
                k = kept.get(cluster.id) if kept is not None else None
                if k is not None and k.fresh(at):
                    extended[cluster.id] = k.extend(session, cluster.id)
        for cluster in clusters:
            k = kept.pop(cluster.id, None) if kept is not None else None
            got = None
            if k is not None and cluster.id in extended:
                got = extended[cluster.id]
                if got is not None and got[0] is k.snap:
                    kept[cluster.id] = k  # nothing new: the plan would be the last one
                    continue
            if got is None:
                k = None
                with cp.sessions() as session:
                    got = build_snapshot(session, cluster, at)
            snap, lookups = got
            reserved = snap.running and any(r.start <= at for r in snap.reservations)  # others' work may stop
            if not snap.waiting and not any(u.stopping for u in snap.running) and not reserved:
                if kept is not None:
                    kept[cluster.id] = k.kept(snap, lookups) if k is not None else Kept(snap, lookups, at)
                continue
            p0 = time.perf_counter()
            plan = sched.plan(snap, at)
            PLAN_SECONDS.observe(time.perf_counter() - p0)
            with STATE_LOCK, cp.sessions() as session, session.begin():
                fence(session, term, lease)
                applied, skipped = apply_plan(session, plan, lookups, at)
            touched |= applied
            replan = replan or skipped
            if kept is not None and not (skipped or applied or plan.starts or plan.stops or plan.reservation_stops
                                         or plan.fails or plan.quota_reached):
                kept[cluster.id] = k.kept(snap, lookups) if k is not None else Kept(snap, lookups, at)
    except NotLeader as e:
        log.warning("applied nothing: %s", e)
        return touched
    if replan:
        cp.notifier.wake_scheduler()
    CYCLE_SECONDS.observe(time.perf_counter() - t0)
    return touched


# Woken back to back, the loop waits this share of its last cycle's time since that cycle ended. Not 1.0 (half the
# control plane's time at most): that slowed short runs down, each exit's GPU waiting for the pacing.
CYCLE_PACING = 0.5
TIMERS_EVERY = 0.25  # the loop's tick: how often it looks at lost machines and time limits when it is not woken
# Cycles woken only by submits come at most this often: a burst's group commits (one wake each) are planned together.
# A submit after a quiet spell is planned at once (the debounce only).
SUBMITS_EVERY = 0.1


class SchedulingLoop:
    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_cycle_seconds = 0.0
        self.last_cycle_end = 0.0  # time.perf_counter() when the last cycle ended
        self.next_restart: float | None = None  # when the earliest crash-loop backoff ends: a full cycle then
        self._stops_told: set[tuple[int, float]] = set()
        self.kept: dict[int, Kept] = {}  # each cluster's snapshot, for cycles woken only by submits (Kept)
        self._kept_term: Term | None = None
        self._timers_at = 0.0  # time.monotonic() when a cycle last looked at the timers
        # A woken cycle less than a tick after the last look left the timers and the reads of what is due next
        # (next_restart) to a later one: a full cycle is due once a tick has passed, woken or not.
        self._owed = False

    def start(self) -> None:
        """Start trying to lead (cp.leader), and the loop, which cycles only while this replica leads."""
        self._stop.clear()
        if self.cp.leader is not None:
            self.cp.leader.start()
        self._thread = threading.Thread(target=self._run, name="scheduling-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, then give the lease up so that another replica leads at once."""
        self._stop.set()
        self.cp.notifier.wake_scheduler(remote=True)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.cp.leader is not None:
            self.cp.leader.stop()

    def _run(self) -> None:
        n = self.cp.notifier
        s = self.cp.settings
        # The loop also checks lost machines and time limits: sleep no longer than a quarter second for those,
        # so a machine is lost within its timeout + 10 % even with a timeout of a few seconds.
        tick = min(s.schedule_interval, TIMERS_EVERY)
        last_full = 0.0
        while not self._stop.is_set():
            woke = n.wait_scheduler(tick)
            if self._stop.is_set():
                return
            if woke:
                # Batch a burst of changes into one cycle: wait the debounce, and until half as long as the last
                # cycle took has passed since it ended, so that scheduling never takes more than about two thirds
                # of the control plane's time (a change long after the last cycle, such as an exit freeing GPUs,
                # waits only the debounce). Bursts of submits are paced further (SUBMITS_EVERY).
                idle = time.perf_counter() - self.last_cycle_end
                time.sleep(max(s.schedule_debounce, CYCLE_PACING * self.last_cycle_seconds - idle))
            term = self.cp.leader.term() if self.cp.leader is not None else None
            if term is None:
                continue  # a follower: the leader plans; the lease thread wakes this loop when it leads
            try:
                c0 = time.perf_counter()
                now = time.time()
                due = now - last_full >= s.schedule_interval or (self.next_restart is not None
                                                                   and now >= self.next_restart) or (
                    self._owed and time.monotonic() - self._timers_at >= TIMERS_EVERY)
                full = woke or due
                # asked (and reset) just before the cycle reads: a wake after this is seen by the next cycle
                submits_only = n.woken_by_submits_only() and woke and not due if full else False
                if submits_only:  # a burst of submits is planned at most every SUBMITS_EVERY seconds
                    wait = SUBMITS_EVERY - (time.perf_counter() - self.last_cycle_end)
                    if wait > 0:
                        time.sleep(wait)
                        submits_only = n.woken_by_submits_only()  # anything else meanwhile: a full read
                touched = self.cycle_once(full=full, term=term, submits_only=submits_only, timers_due=due)
                self.last_cycle_end = time.perf_counter()
                self.last_cycle_seconds = min(self.last_cycle_end - c0, 1.0)
                if full:
                    last_full = time.time()
                if touched:
                    n.bump_machines(touched)
            except Exception as e:  # the loop must survive a bad cycle; the error is logged and retried
                full = self.cp.writes.failed(e) if self.cp.writes is not None else None
                if full:  # a full disk: said once per cycle tried, without the traceback
                    log.warning("scheduling cycle not applied (trying again): %s", full)
                else:
                    log.exception("scheduling cycle failed")
                time.sleep(0.5)

    def cycle_once(self, full: bool = True, term: Term | None = None, submits_only: bool = False,
                   timers_due: bool = True) -> set[int]:
        """`submits_only`: woken only by plain runs submitted here, which start no timer and stop nothing: the cycle
        plans on the kept snapshots (Kept), and the reads of what is due next are left to the next full cycle.
        Without `timers_due` (a cycle woken by a change, not by a timer or the interval), the timers and the reads of
        what is due next are looked at only when a tick has passed since the last look (they are about time, not
        about the change; woken back to back, each cycle spent a sixth of its time on them), and are owed to the
        next cycle otherwise (`_owed`: the loop makes one within a tick)."""
        term = term or (self.cp.leader.current() if self.cp.leader is not None else None)
        if term is None:
            return set()
        if full:
            if self.kept and self._kept_term != term:  # led again: another leader may have planned meanwhile
                self.kept.clear()
            self._kept_term = term
            # the timers at most once a tick while changes keep the loop busy (a due cycle always looks at them)
            timers = (timers_due and not submits_only) or time.monotonic() - self._timers_at >= TIMERS_EVERY
            if timers:
                self._timers_at = time.monotonic()
            touched = cycle(self.cp, term=term, kept=self.kept, submits_only=submits_only, timers=timers)
            if submits_only and not touched:
                return set()
            if touched:  # the machines that got or lost workers hear it now, not after the reads below
                self.cp.notifier.bump_machines(touched)
            now = time.time()
            with self.cp.sessions() as session:
                self._owed = not timers  # what is due next: read with the timers, within a tick
                if timers:  # a backoff's end, a schedule's tick, a group's wait, a reservation's window
                    self.next_restart = next_due_at(session, now)
                # A stop asked by an agent's report (a gang mate of a worker that failed, or that reached its time
                # limit) is on another machine than the report's: tell that machine now, not at its next poll.
                stops = stops_asked_since(session, now - 30)
            told = {m for k, m in stops.items() if k not in self._stops_told} - touched
            self._stops_told = set(stops)
            return told  # the machines still to notify (the cycle's were above)
        at = time.time()
        try:
            with STATE_LOCK, self.cp.sessions() as session, session.begin():
                fence(session, term, self.cp.settings.leader_lease_seconds)
                touched = detect_lost_machines(session, at) | enforce_time_limits(session, at)
            touched |= watch_progress(self.cp, term, at)  # its own fenced transaction, after the one above
        except NotLeader as e:
            log.warning("applied nothing: %s", e)
            return set()
        if touched:
            self.cp.notifier.wake_scheduler()
        return touched
