"""The agent side of the API: machines join, heartbeat, receive the workers that should run, report back."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, selectinload

from astraeus import protocol as P
from astraeus.server import lifecycle
from astraeus.server.db import Access, Cluster, Drive, LogLine, Machine, Run, Token, Worker, Workspace
from astraeus.server.services import ApiError
from astraeus.spec import path_within


def machine_token(tok: Token) -> Token:
    if tok.kind != "machine":
        raise ApiError(403, "FORBIDDEN", "agent endpoints need a machine token")
    return tok


def register(session: Session, tok: Token, body: P.Register, at: float,
             heartbeat: float) -> tuple[Machine, Cluster, bool]:
    cluster = session.get(Cluster, tok.cluster_id)
    name = body.name
    from astraeus.spec import check_dns_label

    try:
        check_dns_label(name, "machine name")
    except ValueError as e:
        raise ApiError(422, "INVALID", str(e)) from None
    m = session.scalar(select(Machine).where(Machine.cluster_id == cluster.id, Machine.name == name))
    m, changed = lifecycle.machine_registered(session, m, cluster, name, at)
    m.gpus = body.gpus
    m.gpu_models = list(body.gpu_models)
    m.cpu_cores = body.cpu_cores
    m.memory_bytes = body.memory_bytes
    m.stop_grace_seconds = body.stop_grace_seconds  # 0 s is a real answer: stop at once
    m.labels = dict(body.labels)
    session.flush()
    return m, cluster, changed


def machine_for(session: Session, tok: Token, name: str) -> Machine:
    m = session.scalar(select(Machine).where(Machine.cluster_id == tok.cluster_id, Machine.name == name))
    if m is None:
        raise ApiError(404, "NOT_FOUND", f"machine {name} has not registered: POST /api/v1/agent/register first")
    return m


def assignments(session: Session, m: Machine) -> list[P.Assignment]:
    """The workers that should be on this machine now, each with all the agent needs to run or stop it."""
    if m.state != lifecycle.MachineState.READY:
        return []  # a lost machine's workers have been handled elsewhere: the agent stops what it still runs
    workers = list(session.scalars(select(Worker).where(Worker.machine_id == m.id, Worker.state.in_(lifecycle.ACTIVE))
                                   .options(selectinload(Worker.run).selectinload(Run.workers))))
    # Every long-poll answer reads these: load each kind once, not once per worker.
    ws_ids = {w.run.workspace_id for w in workers}
    spaces = {x.id: x for x in session.scalars(select(Workspace).where(Workspace.id.in_(ws_ids)))}
    grants = {a.workspace_id: a for a in session.scalars(select(Access).where(
        Access.workspace_id.in_(ws_ids), Access.cluster_id == m.cluster_id))}
    drives = {(d.workspace_id, d.name): d for d in session.scalars(select(Drive).where(Drive.workspace_id.in_(ws_ids)))}
    out = []
    for w in workers:
        run = w.run
        ws = spaces[run.workspace_id]
        tt = run.spec["task_template"]
        env = dict(tt.get("env") or {})
        env.update({
            "ASTRAEUS_JOB_NAME": f"{ws.ns}.{run.name}",
            "ASTRAEUS_RUN_NAME": run.name,
            "ASTRAEUS_WORKER_NAME": w.name,
            "ASTRAEUS_WORKER_INDEX": str(w.index),
            "ASTRAEUS_NUM_WORKERS": str(len(run.workers)),
            "ASTRAEUS_GPU_COUNT": str(len(w.gpu_indices or [])),
            "ASTRAEUS_ATTEMPT": str(w.attempt),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in (w.gpu_indices or [])),
            "SLURM_JOB_NAME": run.name,
        })
        access = grants.get(run.workspace_id)
        mounts = []
        for ref in tt.get("datavolume_refs") or []:
            d = drives.get((run.workspace_id, ref["name"]))
            if d is None or access is None:
                continue
            src = d.spec["sources"][0]
            granted = next((r for r in (access.host_paths or []) if path_within(src["path"], r)), None)
            mounts.append(P.Mount(drive=d.name, host_path=src["path"], mount_path=ref["mount_path"],
                                  read_only=ref.get("mode") == "ReadOnly" or src.get("mode") == "ReadOnly",
                                  create=bool((d.spec.get("permissions") or {}).get("create")),
                                  granted_root=granted))
        configs = [P.ConfigFile(mount_path=mp, value=c["value"]) for c in tt.get("configs") or [] for mp in c["mounts"]]
        out.append(P.Assignment(
            worker=w.name, attempt=w.attempt, run=run.name, workspace=ws.ns,
            desired=w.desired or "Running", stop_reason=w.stop_reason,
            image=tt["image"], command=tt["command"], args=list(tt.get("args") or []), env=env,
            gpu_indices=list(w.gpu_indices or []), cpu_cores=w.cpu_cores, memory_bytes=w.memory_bytes,
            mounts=mounts, configs=configs, time_limit_seconds=tt.get("time_limit_seconds"),
        ))
    return out


def report(session: Session, m: Machine, body: P.Report, at: float) -> bool:
    """Heartbeat and worker states. Returns True when room was freed or a machine returned: what the
    scheduler, the machines' assignments and log followers must see."""
    changed = lifecycle.machine_heartbeat(session, m, at)
    here = {w.name: w for w in session.scalars(select(Worker).where(Worker.machine_id == m.id)
                                               .options(selectinload(Worker.run).selectinload(Run.workers)))}
    for r in body.workers:
        w = here.get(r.worker)
        if w is None or w.attempt != r.attempt or w.state not in lifecycle.ACTIVE:
            continue  # a stale attempt: the agent stops it because it is no longer assigned
        state = r.state
        if state in ("Starting", "Running"):
            if state == "Running":
                # Starting → Running frees no room and changes no assignment: nothing to wake.
                lifecycle.running(session, w.run, w, r.pid, r.environment, at)
            else:
                lifecycle.process_seen(w, r.pid, r.environment)
        elif state == "Exited":
            if w.state == "Starting" and r.pid:  # it ran, and ended before a report said so
                lifecycle.running(session, w.run, w, r.pid, r.environment, r.started_at or at)
            lifecycle.ended(session, w.run, w, r.exit_code, r.signal, None, at, oom_limit_bytes=r.oom_limit_bytes)
            changed = True
        elif state == "StartFailed":
            lifecycle.start_failed(session, w.run, w, r.message or "unknown", at)
            changed = True
    return changed


def store_logs(session: Session, m: Machine, lines: list[P.WorkerLogLine]) -> int:
    if not lines:
        return 0
    names = {ln.worker for ln in lines}
    ids = dict(session.execute(select(Worker.name, Worker.id).join(Run).where(
        Worker.name.in_(names), Run.cluster_id == m.cluster_id, Run.live_key == "")).all())
    rows = [{"worker_id": ids[ln.worker], "attempt": ln.attempt, "seq": ln.seq, "time": ln.time,
             "stream": ln.stream, "text": ln.text.replace("\x00", "\ufffd")}  # PostgreSQL text holds no NUL
            for ln in lines if ln.worker in ids]
    if not rows:
        return 0
    dialect = session.get_bind().dialect.name
    ins = pg_insert(LogLine) if dialect == "postgresql" else sqlite_insert(LogLine)
    session.execute(ins.values(rows).on_conflict_do_nothing(index_elements=["worker_id", "attempt", "seq"]))
    return len(rows)
