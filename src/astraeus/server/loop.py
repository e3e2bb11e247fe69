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
from dataclasses import replace
from types import SimpleNamespace

from prometheus_client import Counter, Histogram
from sqlalchemy import Text, bindparam, cast, func, or_, select
from sqlalchemy.orm import Session, selectinload

from astraeus import drives as drive_rules
from astraeus import rendezvous
from astraeus import scheduler as sched
from astraeus.server import agents, diskfull, lifecycle
from astraeus.server import pools as pool_rules
from astraeus.server import replica_groups as replica_group_duty
from astraeus.server import reservations as reservation_duty
from astraeus.server import schedules as schedule_ticks
from astraeus.server.core import STATE_LOCK, ControlPlane
from astraeus.server.db import Access, Cluster, Drive, Machine, Reservation, Run, Worker, Workspace
from astraeus.server.leader import NotLeader, Term, fence

log = logging.getLogger("astraeus.loop")

CYCLE_SECONDS = Histogram("astraeus_schedule_cycle_seconds", "Time of one scheduling cycle (load, plan, apply)")
PLAN_SECONDS = Histogram("astraeus_plan_seconds", "Time the pure scheduler takes for one cluster")
STARTS = Counter("astraeus_workers_placed_total", "Workers placed on machines")
PREEMPTIONS = Counter("astraeus_preemptions_total", "Units stopped to make room for higher-priority work")


def build_snapshot(session: Session, cluster: Cluster, at: float | None = None) -> tuple[sched.Snapshot, dict]:
    """The snapshot for one cluster, plus lookups the apply step needs (runs and machines by name).

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

    pressure = {m.id: diskfull.disk_pressure(m.disk_path, m.disk_free_bytes, m.disk_total_bytes,
                                             diskfull.PRESSURE_BELOW) for m in machines}
    snap_machines = tuple(
        sched.Machine(name=m.name, gpus=m.gpus, cpu_cores=m.cpu_cores, memory_bytes=m.memory_bytes,
                      labels=tuple(sorted((m.labels or {}).items())), stop_grace_seconds=m.stop_grace_seconds,
                      schedulable=m.state == lifecycle.MachineState.READY and pressure[m.id] is None,
                      unschedulable_reason=("lost" if m.state != lifecycle.MachineState.READY
                                            else pressure[m.id] or "lost"),
                      gpu_model=(m.gpu_models or [""])[0] or "")
        for m in sorted(machines, key=lambda m: m.name))
    snap_pools = tuple(sched.Pool(name=p.name, machines=tuple(pool_rules.pool_members(p, machines)))
                       for p in pool_rules.cluster_pools(session, cluster.id))
    snap_reservations = tuple(
        sched.Reservation(name=r.name, machines=tuple(r.machines or ()),
                          workspaces=tuple(wss[w].ns for w in r.workspaces or () if w in wss),
                          start=r.start_at, end=r.end_at)
        for r in session.scalars(_RESERVATIONS, of)
        if r.end_at is None or r.end_at > at)
    facts = {m.name: drive_rules.MachineFacts.of(m.name, m.state == lifecycle.MachineState.READY, m.address,
                                                  m.shared_filesystems, m.nfs) for m in machines}
    # Runs are named in the plan by name; two workspaces may use one name, so those get "name@ns" keys.
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1

    def key(r: Run) -> str:
        return r.name if seen[r.name] == 1 else f"{r.name}@{wss[r.workspace_id].ns}"

    deps = dependencies(session, [r for r in runs if r.spec.get("dependency") and not r.deleting
                                  and r.state == lifecycle.RunState.PENDING])
    running: list[sched.RunningUnit] = []
    waiting: list[sched.WaitingRun] = []
    selections: dict[sched.NodeSelection, sched.NodeSelection] = {}
    for run in runs:
        ns = wss[run.workspace_id].ns
        tt = run.spec["task_template"]
        limit = tt.get("time_limit_seconds")
        active = [w for w in run.workers if w.state in lifecycle.ACTIVE and w.machine_id in mby_id]
        independent = run.spec.get("start") == "Independent"
        groups = [[w] for w in active] if independent else ([active] if active else [])
        for g in groups:
            placed = tuple(sched.PlacedWorker(name=w.name, index=w.index, machine=mby_id[w.machine_id].name,
                                              gpu_indices=tuple(w.gpu_indices or ()), cpu_cores=w.cpu_cores,
                                              memory_bytes=w.memory_bytes) for w in g)
            stopping = any(w.state == "Stopping" for w in g)
            running.append(sched.RunningUnit(
                run=key(run), workspace=ns, priority=run.priority,
                started_at=min(w.placed_at or run.created_at for w in g), time_limit_seconds=limit,
                workers=placed, stopping=stopping,
                preempted_for=next((w.preempted_for for w in g if w.preempted_for), None) if stopping else None,
                array=run.array_job))
        if run.deleting:
            continue
        pending = [w for w in run.workers if w.state == lifecycle.WorkerState.PENDING]
        if not pending or (not independent and active):
            continue  # a gang is queued again only once none of its workers is still stopping
        if independent:
            pending = [w for w in pending if not (w.restart_at and w.restart_at > at)]
        elif (lifecycle.restart_due(pending) or 0) > at:
            pending = []
        if not pending:
            continue  # backing off after a failure: offered again when its restart_at comes
        excluded = []
        for ref in tt.get("datavolume_refs") or []:
            d = drives.get((run.workspace_id, ref["name"]))
            if d is None:
                excluded += [(m.name, f"drive {ref['name']} no longer exists") for m in machines]
                continue
            src = d.spec["sources"][0]
            keeper = facts.get(src.get("node"))
            for m in machines:
                why = drive_rules.unreachable(ref["name"], src, d.spec.get("transport", "Auto"), facts[m.name], keeper)
                if why:
                    excluded.append((m.name, why))
        waiting.append(waiting_run(run, key(run), ns, pending, excluded, deps.get(run.id), selections))
    workspaces = []
    for a in accesses:
        ws = wss[a.workspace_id]
        has_quota = any(v is not None for v in (a.quota_gpus, a.quota_cpu_cores, a.quota_memory_bytes,
                                                a.quota_workers))
        quota = sched.Quota(gpus=a.quota_gpus, cpu_cores=a.quota_cpu_cores, memory_bytes=a.quota_memory_bytes,
                            workers=a.quota_workers) if has_quota else None
        workspaces.append(sched.Workspace(id=ws.ns, name=ws.name, quota=quota, weight=a.weight or 1.0,
                                          pools=tuple(a.pools) if a.pools is not None else None))
    snap = sched.Snapshot(cluster=cluster.name, machines=snap_machines, running=tuple(running),
                          waiting=tuple(waiting), workspaces=tuple(workspaces), preemption=cluster.preemption,
                          pools=snap_pools, reservations=snap_reservations)
    # What the apply step needs to find the rows again (under the state lock, in its own session) and to write
    # only what changed: ids, and the reasons and per-machine lines the snapshot saw. "selections" and
    # "max_run_id": for Kept.extend.
    lookups = {"runs": {key(r): r.id for r in runs}, "machines": {m.name: m.id for m in machines},
               "selections": selections, "max_run_id": max((r.id for r in runs), default=0),
               "renames": {key(r): r.name for r in runs if key(r) != r.name},
               "queue_reasons": {key(r): r.queue_reason for r in runs},
               # waiting workers by the scheduler's name for them ("<run key>-<index>"): their lines and ids
               "why_not": {f"{key(r)}-{w.index}": w.why_not for r in runs for w in r.workers
                           if w.state == lifecycle.WorkerState.PENDING},
               "workers": {f"{key(r)}-{w.index}": w.id for r in runs for w in r.workers
                           if w.state == lifecycle.WorkerState.PENDING}}
    return snap, lookups


def waiting_run(run, key: str, ns: str, pending: list, excluded: list, dependency: sched.Dependency | None,
                selections: dict) -> sched.WaitingRun:
    """A waiting run of the snapshot (its `pending` workers), from its row (live_runs)."""
    tt = run.spec["task_template"]
    sel = tt.get("requested_resources", {}).get("node_selection") or {}
    # one object per distinct selection: the scheduler keeps a selection's answer (its machines, buckets,
    # never-fits) and settles the runs behind the head by the object, so equal selections share it
    selection = sched.NodeSelection(mode=sel.get("mode", "Any"), names=tuple(sel.get("names") or ()),
                                    labels=tuple(sorted((sel.get("labels") or {}).items())),
                                    pools=tuple(sel.get("pools") or ()),
                                    gpu_model=(tt.get("requested_resources", {}).get("gpu_requests")
                                               or {}).get("model"),
                                    reservation=sel.get("reservation"))
    selection = selections.setdefault(selection, selection)
    independent = run.spec.get("start") == "Independent"
    return sched.WaitingRun(
        name=key, workspace=ns, priority=run.priority, submitted_at=run.created_at,
        workers=tuple(sched.WorkerRequest(index=w.index, gpus=w.gpus, cpu_cores=w.cpu_cores,
                                          memory_bytes=w.memory_bytes) for w in pending),
        start="Independent" if independent else "Gang", time_limit_seconds=tt.get("time_limit_seconds"),
        node_selection=selection,
        excluded_machines=tuple(excluded), quota_noted=run.quota_noted,
        array=run.array_job, array_max_running=run.array_max_running, dependency=dependency)


class Kept:
    """A cluster's snapshot kept after a cycle whose plan changed nothing but the queue's words (no start, stop,
    failure or quota note), so that the next cycle woken only by plain submits made here (Notifier.
    woken_by_submits_only) plans on it plus the new runs (`extend`), instead of reading the whole queue again: with
    a long queue that read was most of a cycle's cost, and a burst of submits woke a cycle per group commit. Plans
    are the same as on a snapshot read afresh: nothing it holds has changed (anything else that changes state wakes
    the loop another way, and the next cycle reads everything), the new runs are read in full and added in id
    order as build_snapshot adds them, and a run the kept snapshot cannot take as is (a dependency, drives, a name
    already in the snapshot, not plainly waiting) means a full read. It is read afresh at least every MAX_AGE
    seconds and when a reservation's window opened or closed since it was read."""

    MAX_AGE = 5.0

    def __init__(self, snap: sched.Snapshot, lookups: dict, built_at: float):
        self.snap, self.lookups, self.built_at = snap, lookups, built_at
        self.names = {lookups["renames"].get(k, k) for k in lookups["runs"]}
        self.wss: dict[int, str] | None = None

    def fresh(self, at: float) -> bool:
        if at - self.built_at > self.MAX_AGE or at < self.built_at:
            return False
        return not any(self.built_at < t <= at for r in self.snap.reservations for t in (r.start, r.end)
                       if t is not None)

    def extend(self, session: Session, cluster_id: int) -> tuple[sched.Snapshot, dict] | None:
        """The kept snapshot plus the runs submitted since (those of ids above the last it holds), or None when one
        of them needs a full read. The same (snapshot, lookups) when there is none."""
        lookups = self.lookups
        new = live_runs(session, cluster_id, after_id=lookups["max_run_id"])
        if not new:
            return self.snap, lookups
        if self.wss is None:
            self.wss = {w.id: w.ns for w in self.snap_workspaces(session)}
        waiting = []
        names = set()
        for run in new:
            ns = self.wss.get(run.workspace_id)
            tt = run.spec["task_template"]
            if (ns is None or run.deleting or run.state != lifecycle.RunState.PENDING or run.spec.get("dependency")
                    or tt.get("datavolume_refs") or run.name in self.names or run.name in names or not run.workers
                    or any(w.state != lifecycle.WorkerState.PENDING or w.restart_at for w in run.workers)):
                return None
            names.add(run.name)
            waiting.append(waiting_run(run, run.name, ns, run.workers, [], None, lookups["selections"]))
        lookups = dict(lookups)
        lookups["runs"] = {**lookups["runs"], **{r.name: r.id for r in new}}
        lookups["queue_reasons"] = {**lookups["queue_reasons"], **{r.name: r.queue_reason for r in new}}
        lookups["why_not"] = {**lookups["why_not"], **{f"{r.name}-{w.index}": w.why_not for r in new
                                                       for w in r.workers}}
        lookups["workers"] = {**lookups["workers"], **{f"{r.name}-{w.index}": w.id for r in new for w in r.workers}}
        lookups["max_run_id"] = new[-1].id
        return replace(self.snap, waiting=self.snap.waiting + tuple(waiting)), lookups

    @staticmethod
    def snap_workspaces(session: Session):
        return session.execute(select(Workspace.id, Workspace.ns)).all()

    def kept(self, snap: sched.Snapshot, lookups: dict) -> Kept:
        """This kept snapshot moved on to `snap` (the same read, new runs added), its lookups as applied."""
        k = Kept.__new__(Kept)
        k.snap, k.lookups, k.built_at, k.wss = snap, lookups, self.built_at, self.wss
        k.names = self.names | {n for n in lookups["runs"] if n not in self.lookups["runs"]}
        return k


_RUN = (Run.id, Run.workspace_id, Run.name, Run.uid, Run.priority, Run.state, Run.created_at, Run.deleting,
        Run.queue_reason, Run.quota_noted, Run.array_job, Run.array_max_running)
# A worker's two JSON columns are read as their text and decoded here (_json): most are "[]" (a waiting worker has no
# GPUs, and only the first runs of the queue have why-not lines), decoded without json.loads' cost per row.
_WORKER = (Worker.id, Worker.run_id, Worker.name, Worker.index, Worker.state, Worker.machine_id,
           cast(Worker.gpu_indices, Text).label("gpu_indices"), Worker.gpus, Worker.cpu_cores, Worker.memory_bytes,
           Worker.placed_at, Worker.preempted_for, Worker.restart_at, cast(Worker.why_not, Text).label("why_not"))


# The full read's statements, built once (the cluster and the last run id bound at each read): building them (their
# columns' and clauses' coercions, their cache keys) cost ~0.27 ms of CPU per read, on a short queue's 3-5 ms cycle.
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


def live_runs(session: Session, cluster_id: int, after_id: int = 0) -> list[SimpleNamespace]:
    """The cluster's runs that have not ended, each with its `workers` by index, as plain rows (the columns the
    snapshot reads; `spec` decoded once per run, see _SPECS), in id order; with `after_id`, only those above it.
    Each run read is a Core row, not an ORM object: loading every live run and worker as ORM objects was most of a
    cycle's CPU with a long queue (every submit shares the cores with it). Runs first, then their workers: a run is
    written with its workers in one transaction, so each run read has its workers in the second read."""
    conn = session.connection()  # Core rows: no ORM loading
    cols = (*_RUN, Run.spec) if after_id else _RUN
    of = {"cluster_id": cluster_id, "after_id": after_id} if after_id else {"cluster_id": cluster_id}
    runs = conn.execute(_NEW_RUNS if after_id else _LIVE_RUNS, of).all()
    workers: dict[int, list] = {}
    names = [c.key for c in _WORKER]
    for row in conn.execute(_NEW_WORKERS if after_id else _LIVE_WORKERS, of):
        w = SimpleNamespace(**dict(zip(names, row, strict=True)))
        w.gpu_indices, w.why_not = _json(w.gpu_indices), _json(w.why_not)
        workers.setdefault(w.run_id, []).append(w)
    names = [c.key for c in cols]
    out = [SimpleNamespace(**dict(zip(names, r, strict=True)), workers=workers.get(r[0], [])) for r in runs]
    if not after_id:
        specs = _specs(conn, cluster_id, out)
        for r in out:
            r.spec = specs[r.uid]
    return out


def _specs(conn, cluster_id: int, runs: list[SimpleNamespace]) -> dict[str, dict]:
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


def apply_plan(session: Session, plan: sched.Plan, lookups: dict, at: float) -> tuple[set[int], bool]:
    """Write the plan: placements, stops, reasons. Runs under the state lock, in a session of its own, on rows
    read again: the plan was made on a snapshot read without the lock, so each step checks that what it acts on
    is still as the snapshot saw it (a run deleted meanwhile is not started, a victim that ended is not stopped).
    Room cannot have been taken meanwhile: only this loop places workers. Returns the machines whose desired
    workers changed, and whether a step was skipped (so the loop plans again at once)."""
    touched: set[int] = set()
    skipped = False
    ids = lookups["runs"]
    machine_ids = lookups["machines"]
    renames = lookups["renames"]
    loaded: dict[int, Run | None] = {}

    def run_named(key: str) -> Run | None:
        rid = ids.get(key)
        if rid is None:
            return None
        if rid not in loaded:
            loaded[rid] = session.get(Run, rid)
        return loaded[rid]

    def text(s: str) -> str:  # "name@ns" keys back to names (only ever shown inside their own workspace)
        for k, v in renames.items():
            s = s.replace(k, v)
        return s

    # Every run the plan acts on (starts, stops, quota notes, fails), read at once with its workers (one query per
    # 500, not two per run: the apply holds the state lock). The queue's reasons and why-not lines that changed
    # since the snapshot are written apart, in bulk (lifecycle.set_queue_reasons): reading a long queue's runs for them took most
    # of the apply's time while every submit waited for the lock.
    seen_reasons, seen_why_not = lookups["queue_reasons"], lookups["why_not"]
    wanted = {s.run for s in plan.starts} | {s.run for s in plan.stops} | {s.run for s in plan.reservation_stops}
    wanted |= {q.run for q in plan.quota_reached} | set(plan.fails)
    reasons = {n: text(r) for n, r in plan.reasons.items()}
    reasons = {n: r for n, r in reasons.items() if seen_reasons.get(n) != r}
    why_not = {w: [[m, text(r)] for m, r in lines] for w, lines in plan.why_not.items()}
    why_not = {w: lines for w, lines in why_not.items() if seen_why_not.get(w) != lines}
    lifecycle.set_queue_reasons(session, {ids[n]: r for n, r in reasons.items() if n not in wanted and n in ids},
                  {lookups["workers"][w]: lines for w, lines in why_not.items()
                   if w.rpartition("-")[0] not in wanted and w in lookups["workers"]}, at)
    # the lookups now say what the rows say (a kept snapshot's next apply writes only what changes again)
    seen_reasons.update((n, r) for n, r in reasons.items() if n in ids)
    seen_why_not.update((w, lines) for w, lines in why_not.items() if w in lookups["workers"])
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
              and w.desired != "Stopped"]
        if not ws:
            skipped = True
            continue
        touched.update(w.machine_id for w in ws if w.machine_id)
        lifecycle.preempt(session, run, ws, text(stop.preempted_by), text(stop.reason), at)
        lifecycle.refresh_run(session, run, at)
        PREEMPTIONS.inc()
    for stop in plan.reservation_stops:  # others' work on a reservation's machines once its window opened
        run = run_named(stop.run)
        if run is None:
            continue
        gang = run.spec.get("start") != "Independent"
        ws = [w for w in run.workers if (gang or w.name in stop.workers) and w.state in lifecycle.ACTIVE
              and w.desired != "Stopped"]  # a gang stops whole: it is queued again only once none still runs
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
        limit = w.run.spec["task_template"].get("time_limit_seconds") or 0
        reason = f"Stopping: time limit of {lifecycle.fmt_duration(limit)} reached"
        lifecycle.request_stop(session, w.run, w, "timelimit", reason, at)
        lifecycle.refresh_run(session, w.run, at)
        touched.add(w.machine_id)
    return touched


def _silent(at: float):
    """The Ready machines silent past their cluster's lost_after_seconds at `at` (a statement)."""
    return select(Machine, Cluster).join(Cluster).where(
        Machine.state == lifecycle.MachineState.READY.value, Machine.last_heartbeat + Cluster.lost_after_seconds < at)


def _late(at: float):
    """The workers past their deadline at `at` (a statement)."""
    return select(Worker).where(Worker.state.in_(("Starting", "Running")), Worker.deadline <= at)


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
            fence(session, term, cp.settings.lease_seconds)
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
    return touched


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
    lease = cp.settings.lease_seconds
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


# Woken back to back, the loop waits this share of its last cycle's time since that cycle ended (1.0, half the
# control plane's time at most, made 200 trivial runs on 8 GPUs ~11 % slower: each exit's GPU waited for the pacing).
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
                fence(session, term, self.cp.settings.lease_seconds)
                touched = detect_lost_machines(session, at) | enforce_time_limits(session, at)
        except NotLeader as e:
            log.warning("applied nothing: %s", e)
            return set()
        if touched:
            self.cp.notifier.wake_scheduler()
        return touched
