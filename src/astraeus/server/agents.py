"""The agent side of the API: machines join, heartbeat, receive the workers that should run, report back (what a
fleet of them costs, and why it is shaped so: docs/design-fleet-scale.md).

Tokens of kind "machine" are of two sorts. A join token (an admin's, `machine_id` NULL; every machine token made
before revision 0004 is one) can only register: the answer gives the machine its own credential (a new token
row, kind "machine", `machine_id` set), which is what assignments, reports and logs accept. A credential acts for
its own machine only. Workers are named by their identity (`astraeus.protocol.worker_identity`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session, joinedload

from astraeus import drives as drive_rules
from astraeus import protocol as P
from astraeus.imageref import registry_of
from astraeus.server import diskfull, health, heartbeats, lifecycle, progress, registries, services
from astraeus.server.db import Access, Cluster, Drive, Machine, Org, Run, Token, Worker, Workspace
from astraeus.server.services import ApiError
from astraeus.spec import array_env, env_values, granted_root

REGISTER_FIRST = ("this is a join token: it can only register a machine. POST /api/v1/agent/register with it; the "
                  "answer's `credential` is the machine's own token, for its assignments, reports and logs")


def machine_token(tok: Token) -> Token:
    if tok.kind != "machine":
        raise ApiError(403, "FORBIDDEN", "agent endpoints need a machine token")
    return tok


def authenticate(session: Session, authorization: str | None) -> Token:
    """The caller's machine token (a join token or a machine's credential). A revoked credential gets a 401
    that says so, which the agent tells apart from an unknown one (a new database: it joins again)."""
    try:
        tok = services.authenticate(session, authorization)
    except ApiError as e:
        if e.status == 401 and authorization and len(authorization.split(None, 1)) == 2:
            secret = authorization.split(None, 1)[1].strip()
            t = session.scalar(services.TOKEN_BY_DIGEST, {"digest": services.digest(secret)})
            if t is not None and t.kind == "machine" and t.machine_id is not None and t.revoked:
                raise ApiError(401, "CREDENTIAL_REVOKED",
                               "this machine's credential was revoked by an admin: the machine stays out of the "
                               "cluster. To join it again, delete the agent's credential file (<state dir>/"
                               "credential) and start the agent with a join token") from None
        raise
    return machine_token(tok)


def live_credential(session: Session, m: Machine, at: float) -> Token | None:
    """The machine's credential that keeps its name taken: the machine is Ready and the credential is neither
    revoked nor expired. None when the name can be taken (a Lost machine, or one whose credential is revoked)."""
    if m.state != lifecycle.MachineState.READY:
        return None
    for t in session.scalars(select(Token).where(Token.machine_id == m.id, Token.kind == "machine",
                                                 Token.revoked.is_(False)).order_by(Token.id)):
        if t.expires_at is None or t.expires_at > at:
            return t
    return None


def register(session: Session, tok: Token, body: P.Register, at: float,
             heartbeat: float) -> tuple[Machine, Cluster, bool, str | None]:
    """Join (a join token: returns the machine's new credential's secret) or come back (the machine's own
    credential: returns None for it)."""
    cluster = session.get(Cluster, tok.cluster_id)
    name = body.name
    from astraeus.spec import check_dns_label

    try:
        check_dns_label(name, "machine name")
    except ValueError as e:
        raise ApiError(422, "INVALID", str(e)) from None
    m = session.scalar(select(Machine).where(Machine.cluster_id == cluster.id, Machine.name == name))
    if tok.machine_id is not None:  # the machine's own credential
        if m is None or m.id != tok.machine_id:
            own = session.get(Machine, tok.machine_id)
            raise ApiError(403, "FORBIDDEN", f"this credential belongs to machine {own.name if own else '?'}: it "
                                             f"cannot register as {name}")
    elif m is not None:
        held = live_credential(session, m, at)
        if held is not None:
            raise ApiError(409, "NAME_TAKEN", (
                f"machine name {name} is held by a live machine of cluster {cluster.name} (Ready, with its own "
                f"credential, token {held.id}): give this machine another name (--name); if it is this machine and "
                f"its credential was lost, wait until it is Lost ({cluster.lost_after_seconds:.0f} s without a "
                f"heartbeat) or have an admin revoke token {held.id}"))
    m, changed = lifecycle.machine_registered(session, m, cluster, name, at)
    m.gpus = body.gpus
    m.gpu_models = list(body.gpu_models)
    m.gpu_memory = list(body.gpu_memory_bytes)
    m.gpu_mig = [dict(d) for d in body.gpu_mig]
    m.nvlink_islands = [list(island) for island in body.nvlink_islands] or None
    m.cpu_cores = body.cpu_cores
    m.memory_bytes = body.memory_bytes
    m.stop_grace_seconds = body.stop_grace_seconds  # 0 s is a real answer: stop at once
    m.labels = dict(body.labels)
    m.runtime = body.runtime
    m.address = body.address
    m.shared_filesystems = dict(body.shared_filesystems)
    m.nfs = body.nfs.model_dump() if body.nfs else None
    diskfull.record_disk(m, body.disk)
    session.flush()
    secret = None
    if tok.machine_id is None:
        # The name changes hands (or is taken for the first time): earlier credentials of it stop working.
        for old in session.scalars(select(Token).where(Token.machine_id == m.id, Token.revoked.is_(False))):
            old.revoked = True
        cred, secret = services.create_token(session, session.get(Org, tok.org_id), "machine", cluster=cluster)
        cred.machine_id = m.id
        session.flush()
    return m, cluster, changed, secret


def machine_for(session: Session, tok: Token, name: str) -> Machine:
    """The machine a credential acts for, which must be the one the request names."""
    if tok.machine_id is None:
        raise ApiError(403, "REGISTER_FIRST", REGISTER_FIRST)
    m = session.get(Machine, tok.machine_id)
    if m is None:
        raise ApiError(404, "NOT_FOUND", f"machine {name} has not registered: POST /api/v1/agent/register first")
    if m.name != name:
        raise ApiError(403, "FORBIDDEN", f"this credential belongs to machine {m.name}: it cannot act for machine "
                                         f"{name}")
    return m


def log_batch(session: Session, authorization: str | None, raw: bytes) -> tuple[Machine, P.Logs]:
    """A POST /agent/logs body parsed, and the machine it is for (its credential's, which must be the one it names):
    ApiError (401, 403, 404), or pydantic's ValidationError for a body that is not a batch of lines. Both the route
    (SQLite's small batches) and the log store's process (server/logstore.py) take a batch this way."""
    tok = authenticate(session, authorization)  # a bad token is told before a bad body
    body = P.Logs.model_validate_json(raw)
    return machine_for(session, tok, body.machine), body


def assignments(session: Session, m: Machine) -> list[P.Assignment]:
    """The workers that should be on this machine now, each with all the agent needs to run or stop it."""
    if m.state != lifecycle.MachineState.READY:
        return []  # a lost machine's workers have been handled elsewhere: the agent stops what it still runs
    # each worker's run in the same statement (one row each), the runs' workers in one more
    workers = list(session.scalars(select(Worker).where(Worker.machine_id == m.id, Worker.state.in_(lifecycle.ACTIVE))
                                   .options(joinedload(Worker.run).selectinload(Run.workers))))
    # Every long-poll answer reads these: load each kind once, not once per worker.
    ws_ids = {w.run.workspace_id for w in workers}
    spaces = {x.id: x for x in session.scalars(select(Workspace).where(Workspace.id.in_(ws_ids)))}
    grants = {a.workspace_id: a for a in session.scalars(select(Access).where(
        Access.workspace_id.in_(ws_ids), Access.cluster_id == m.cluster_id))}
    drives = {(d.workspace_id, d.name): d for d in session.scalars(select(Drive).where(Drive.workspace_id.in_(ws_ids)))}
    # Each running worker's workspace's credential for its image's registry, if it has one: never another's.
    pulls = {(w.run.workspace_id, registry_of(w.run.spec["task_template"]["image"])) for w in workers
             if (w.desired or lifecycle.Desired.RUNNING) == lifecycle.Desired.RUNNING}
    creds = registries.for_images(session, {p for p in pulls if p[1]})
    keepers = {k.name: k for k in session.scalars(select(Machine).where(
        Machine.cluster_id == m.cluster_id, Machine.name.in_({(d.spec["sources"][0].get("node") or "")
                                                              for d in drives.values()})))}
    # the machines of the gang mates of workers with networks of their own: the routes to them
    mates = {x.machine_id for w in workers if (w.rendezvous or {}).get("ASTRAEUS_WORKER_ADDR")
             for x in w.run.workers if x.id != w.id and x.machine_id is not None}
    addresses = dict(session.execute(select(Machine.id, Machine.address).where(Machine.id.in_(mates))).all()) if mates else {}
    out = []
    for w in workers:
        run = w.run
        ws = spaces[run.workspace_id]
        tt = run.spec["task_template"]
        env = env_values(tt.get("env"))  # a secret entry's value too: the worker gets it, no view shows it
        env.update({
            "ASTRAEUS_JOB_NAME": f"{ws.ns}.{run.name}",
            "ASTRAEUS_RUN_NAME": run.name,
            "ASTRAEUS_WORKER_NAME": w.name,
            "ASTRAEUS_WORKER_INDEX": str(w.index),
            "ASTRAEUS_NUM_WORKERS": str(len(run.workers)),
            "ASTRAEUS_GPU_COUNT": str(len(w.gpu_indices or [])),
            "ASTRAEUS_ATTEMPT": str(w.attempt),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in (w.gpu_indices or [])),
            "SLURM_JOB_NAME": slurm_job_name(run),
        })
        if w.mig_devices:  # issue 46: MIG devices, each whole (the agent sets CUDA_VISIBLE_DEVICES to them)
            env["ASTRAEUS_MIG_DEVICE"] = w.mig_devices[0][1]
        elif w.gpu_milli:  # issue 46: a share of one GPU (the agent adds the MPS variables of that GPU)
            env["ASTRAEUS_GPU_FRACTION"] = f"{w.gpu_milli / 1000:g}"
        # Slurm's job environment for scripts written for Slurm, where the spec's env gives none (sbatch sets the
        # task layout there); a gang's rendezvous below gives the values of several machines
        for k, v in slurm_env(run, w, m.name).items():
            env.setdefault(k, v)
        env.update(array_env(run.spec.get("array")))  # a job array's run: Slurm's SLURM_ARRAY_* and its index
        env.update(w.rendezvous or {})  # a multi-machine gang's ranks and master, for this attempt
        access = grants.get(run.workspace_id)
        mounts = []
        for ref in tt.get("datavolume_refs") or []:
            d = drives.get((run.workspace_id, ref["name"]))
            if d is None or access is None:
                continue
            mounts.append(_mount(d, ref, access, m, keepers, ws.ns))
        configs = [P.ConfigFile(mount_path=mp, value=c["value"]) for c in tt.get("configs") or [] for mp in c["mounts"]]
        desired = w.desired or lifecycle.Desired.RUNNING.value
        auth = None
        if desired == lifecycle.Desired.RUNNING:
            cred = creds.get((run.workspace_id, registry_of(tt["image"])))
            if cred is not None:
                auth = P.RegistryAuth(registry=cred.host, username=cred.username, password=cred.password)
        out.append(P.Assignment(
            worker=P.worker_identity(ws.ns, w.name, run.uid), name=w.name, attempt=w.attempt, run=run.name, workspace=ws.ns, workspace_number=ws.id,
            desired=desired, stop_reason=w.stop_reason,
            image=tt["image"], registry_auth=auth, command=tt["command"], args=list(tt.get("args") or []), env=env,
            gpu_indices=list(w.gpu_indices or []), cpu_cores=w.cpu_cores, memory_bytes=w.memory_bytes,
            gpu_fraction=w.gpu_milli / 1000 if w.gpu_milli and w.gpu_indices and not w.mig_devices else None,
            gpu_memory_bytes=((tt.get("requested_resources") or {}).get("gpu_requests") or {}).get("memory_bytes")
            if w.gpu_milli and not w.mig_devices else None, mig_devices=[tuple(d) for d in w.mig_devices or ()],
            mounts=mounts, configs=configs, time_limit_seconds=tt.get("time_limit_seconds"),
            signal=tt.get("signal"), ephemeral_storage_bytes=(tt.get("requested_resources") or {}).get("ephemeral_storage_bytes")
            or diskfull.EPHEMERAL_DEFAULT,
            network=tt.get("network") or "isolated", address=(w.rendezvous or {}).get("ASTRAEUS_WORKER_ADDR"),
            peers=_peers(w, addresses),
        ))
    return out


SLURM_JOB_NAME_LABEL = "slurm.astraeus.io/job-name"  # astra slurm sbatch: the script's job name (`llama_train`)


def slurm_job_name(run) -> str:
    """SLURM_JOB_NAME: the job name a script gave (kept as a label where the run's name had to differ), else a
    job array's name (Slurm gives every task of array `visu` the name `visu`), else the run's name."""
    return (run.labels or {}).get(SLURM_JOB_NAME_LABEL) or (run.spec.get("array") or {}).get("job") or run.name


def slurm_env(run, w: Worker, machine: str) -> dict[str, str]:
    """Slurm's job environment of one worker, each worker one task on its own node: SLURM_JOB_ID is the run's
    number, unique in the control plane, as Slurm's job ids are."""
    env = {
        "SLURM_JOB_ID": str(run.id), "SLURM_JOBID": str(run.id),
        "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": machine, "SLURM_JOB_NODELIST": machine,
        "SLURM_NODEID": "0", "SLURM_PROCID": str(w.index), "SLURM_LOCALID": "0",
        "SLURM_NTASKS": str(len(run.workers)), "SLURM_NPROCS": str(len(run.workers)),
        "SLURM_GPUS_ON_NODE": str(len(w.gpu_indices or [])), "SLURMD_NODENAME": machine,
    }
    if w.cpu_cores and w.cpu_cores >= 1:
        env["SLURM_CPUS_PER_TASK"] = env["SLURM_CPUS_ON_NODE"] = str(int(w.cpu_cores))
    return env


def _peers(w: Worker, addresses: dict[int, str | None]) -> list[P.Peer]:
    """A gang worker's mates with networks of their own: their addresses and their machines'."""
    if not (w.rendezvous or {}).get("ASTRAEUS_WORKER_ADDR"):
        return []
    return [P.Peer(address=x.rendezvous["ASTRAEUS_WORKER_ADDR"], machine_address=addresses.get(x.machine_id))
            for x in sorted(w.run.workers, key=lambda x: x.index)
            if x.id != w.id and x.machine_id is not None and (x.rendezvous or {}).get("ASTRAEUS_WORKER_ADDR")]


def _facts(m: Machine) -> drive_rules.MachineFacts:
    return drive_rules.MachineFacts.of(m.name, m.state == lifecycle.MachineState.READY, m.address,
                                       m.shared_filesystems, m.nfs)


def _mount(d: Drive, ref: dict, access: Access, m: Machine, keepers: dict[str, Machine], ns: str) -> P.Mount:
    """How a worker on machine `m` reaches drive `d`: its folder here (on this machine, or on a shared filesystem
    mounted here), or an NFS mount from the machine that keeps it."""
    src = d.spec["sources"][0]
    granted = granted_root(src, access.host_paths or [])
    ro = ref.get("mode") == "ReadOnly" or src.get("mode") == "ReadOnly"
    create = bool((d.spec.get("permissions") or {}).get("create"))
    fs = src.get("filesystem")
    if fs:
        # Placement put the worker on a machine that has the filesystem; should it no longer declare it, the path
        # names it, and opening the folder fails with that name.
        base = (m.shared_filesystems or {}).get(fs) or f"/nonexistent/shared-filesystem-{fs}"
        root = drive_rules.shared_path(base, granted.partition(":")[2]) if granted else None
        return P.Mount(drive=d.name, host_path=drive_rules.shared_path(base, src["path"]), mount_path=ref["mount_path"],
                       read_only=ro, create=create, granted_root=root, size_bytes=d.spec.get("size_bytes"))
    node = src.get("node")
    if node == m.name or node not in keepers:
        return P.Mount(drive=d.name, host_path=src["path"], mount_path=ref["mount_path"], read_only=ro, create=create,
                       granted_root=granted, size_bytes=d.spec.get("size_bytes"))
    keeper = keepers[node]
    proto, port = drive_rules.choose_transport(d.spec.get("transport", "Auto"), _facts(keeper).rdma, _facts(m).rdma)
    nfs = P.NfsSource(server=keeper.address or keeper.name, machine=keeper.name, export_path=drive_rules.export_path(f"{ns}.{d.name}"),
                      transport=proto, port=port)
    return P.Mount(drive=d.name, nfs=nfs, host_path="/", mount_path=ref["mount_path"], read_only=ro, create=create,
                   size_bytes=d.spec.get("size_bytes"))  # not measured through NFS (agent/disk.py)


def exports(session: Session, m: Machine) -> list[P.Export]:
    """The drives machine `m` keeps that workers on other machines use now: each exported to those machines'
    addresses only (and to nobody once the last of them ended). Every assignments answer to every machine asks,
    and most machines keep no drive: the drives kept here are looked up first (usually none, and the answer is
    made), then only the workers of their workspaces' runs are read."""
    if m.state != lifecycle.MachineState.READY:
        return []
    kept = [d for d in session.scalars(select(Drive).where(Drive.cluster_id == m.cluster_id).order_by(Drive.id))
            if d.spec["sources"][0].get("node") == m.name]
    if not kept:
        return []
    ws_ids = {d.workspace_id for d in kept}
    names = {(d.workspace_id, d.name) for d in kept}
    rows = session.execute(
        select(Run.workspace_id, Run.spec, Machine.address, Machine.name).join(Worker, Worker.run_id == Run.id)
        .join(Machine, Worker.machine_id == Machine.id)
        .where(Run.cluster_id == m.cluster_id, Run.workspace_id.in_(ws_ids), Worker.machine_id != m.id,
               Worker.state.in_(lifecycle.ACTIVE))).all()
    wanted: dict[tuple[int, str], set[str]] = {}
    for ws_id, spec, address, there in rows:
        for ref in spec["task_template"].get("datavolume_refs") or []:
            if (ws_id, ref["name"]) in names:
                wanted.setdefault((ws_id, ref["name"]), set()).add(address or there)
    if not wanted:
        return []
    ws_ids = {k[0] for k in wanted}
    spaces = {x.id: x for x in session.scalars(select(Workspace).where(Workspace.id.in_(ws_ids)))}
    grants = {a.workspace_id: a for a in session.scalars(select(Access).where(
        Access.workspace_id.in_(ws_ids), Access.cluster_id == m.cluster_id))}
    out = []
    for d in kept:
        clients = wanted.get((d.workspace_id, d.name))
        src = d.spec["sources"][0]
        if not clients or d.workspace_id not in grants:
            continue
        out.append(P.Export(drive=f"{spaces[d.workspace_id].ns}.{d.name}", workspace_number=d.workspace_id,
                            path=src["path"],
                            granted_root=granted_root(src, grants[d.workspace_id].host_paths or []),
                            clients=sorted(clients), read_only=src.get("mode") == "ReadOnly",
                            create=bool((d.spec.get("permissions") or {}).get("create"))))
    return out


def keepers_of(session: Session, runs) -> set[int]:
    """The machines that keep drives (on one machine) these runs use: their exports follow the runs' workers, so
    their agents must hear when a worker of one is placed or ends."""
    names = {(r.cluster_id, r.workspace_id, ref["name"]) for r in runs
             for ref in r.spec["task_template"].get("datavolume_refs") or []}
    if not names:
        return set()
    nodes = {(d.cluster_id, d.spec["sources"][0].get("node")) for d in session.scalars(select(Drive).where(
        Drive.workspace_id.in_({n[1] for n in names}))) if (d.cluster_id, d.workspace_id, d.name) in names}
    nodes = {n for n in nodes if n[1]}
    if not nodes:
        return set()
    return {mid for mid, cid, name in session.execute(select(Machine.id, Machine.cluster_id, Machine.name).where(
        Machine.name.in_({n[1] for n in nodes}))) if (cid, name) in nodes}


# built once (services._USER_CALLER says why)
_PLACED_HERE = (select(Worker, Workspace.ns).join(Run, Worker.run_id == Run.id)
                .join(Workspace, Run.workspace_id == Workspace.id)
                .where(Worker.machine_id == bindparam("machine"), Worker.state.in_(lifecycle.ACTIVE),
                       Worker.name.in_(bindparam("names", expanding=True)))
                # its run in the same statement (one row each), the run's workers in one more
                .options(joinedload(Worker.run).selectinload(Run.workers)))


def _placed_here(session: Session, m: Machine, identities: set[str]) -> dict[str, Worker]:
    """The active workers placed on machine `m` among `identities`, by identity. Only those a report names: every
    worker the machine ever ran (and its run's workers) read at each report made reports cost more as the machine
    aged (200 trivial runs: a tenth of the control plane's CPU)."""
    names = {P.identity_name(i) for i in identities}
    if not names:
        return {}
    rows = session.execute(_PLACED_HERE, {"machine": m.id, "names": list(names)}).all()
    return {k: w for w, ns in rows if (k := P.worker_identity(ns, w.name, w.run.uid)) in identities}


def caller_machine(session: Session, authorization: str | None, machine: str) -> Machine:
    """The machine a report's or a log batch's credential acts for (which must be the one it names)."""
    return machine_for(session, authenticate(session, authorization), machine)


def report(cp, authorization: str | None, body: P.Report) -> None:
    """POST /api/v1/agent/report, whichever way it came (routers/agent.py: the route and PlainReports): the
    machine's credential checked, its heartbeat, its workers' states (apply_report), the lines it sends and its
    disk pressure stored in one transaction, then the machines, the scheduler and the log followers that must hear
    it are told. A bare heartbeat is written without the state lock (server/heartbeats.py). Raises ApiError for a
    credential refused; a database error leaves nothing of it written."""
    import time

    with cp.sessions() as s:
        if not body.lines and heartbeats.heartbeat_only(s, caller_machine(s, authorization, body.machine), body,
                                                        time.time()):
            return
        with services.tx(s):  # waits for the state lock holding no pooled connection
            m = caller_machine(s, authorization, body.machine)
            # the last lines of the attempts it says ended, first: their end may release them from this machine
            stored = store_logs(s, m, body.lines, cp.settings.log_max_bytes_per_worker,
                                cp.settings.log_max_lines_per_worker) if body.lines else 0
            told: set[int] = set()  # the machines whose agents must hear now (apply_report)
            changed = apply_report(s, m, body, time.time(), told)
            changed = diskfull.record_disk(m, body.disk) or changed  # disk pressure began or ended: plan again
            if health.apply_report(s, m, body.gpu_faults, body.health_check, time.time()):  # a GPU failed, a drain
                told.add(m.id)
                changed = True
    if told:
        cp.notifier.bump_machines(told)
    if changed:
        cp.notifier.wake_scheduler()
    if changed or stored:
        cp.notifier.bump_logs()


def apply_report(session: Session, m: Machine, body: P.Report, at: float, also: set[int] | None = None) -> bool:
    """Heartbeat and worker states. Returns True when room was freed or a machine returned: what the
    scheduler and log followers must see. `also` gets the machines whose assignments or exports changed, whose
    agents must hear it now: the machines keeping drives an ended worker used (their exports), and this machine
    when it returned or when an ended worker's run still has a worker here (a gang mate, which the end may stop).
    This machine is not told that a worker it reported ended is no longer assigned: its agent knows the worker
    ended, the cycle that reuses the room tells it (its next assignment), and else its next long-poll does (the
    agent then forgets the ended attempt). One long-poll answer less per exit (200 trivial runs: 80 of 136
    answers carried nothing new). A worker is found by its identity among the workers placed on this machine
    only: a report never reaches another machine's worker."""
    changed = lifecycle.machine_heartbeat(session, m, at)
    also = set() if also is None else also  # filled with the machines to tell now
    if changed:
        also.add(m.id)
    ended: list[Run] = []
    here = _placed_here(session, m, {r.worker for r in body.workers})
    for r in body.workers:
        w = here.get(r.worker)
        if w is None or w.attempt != r.attempt or w.state not in lifecycle.ACTIVE:
            continue  # a stale attempt: the agent stops it because it is no longer assigned
        state = r.state
        if state in ("Starting", "Running"):
            if state == "Running":
                # Starting → Running frees no room and changes no assignment: nothing to wake.
                lifecycle.running(session, w.run, w, r.pid, r.environment, at)
                progress.note_report(w, r)
            else:
                lifecycle.process_seen(w, r.pid, r.environment)
                lifecycle.starting(session, w.run, w, r.message, at)
        elif state == "Exited":
            ended.append(w.run)
            if w.state == lifecycle.WorkerState.STARTING and r.pid:  # it ran, and ended before a report said so
                lifecycle.running(session, w.run, w, r.pid, r.environment, r.started_at or at)
            lifecycle.ended(session, w.run, w, r.exit_code, r.signal, None, at, oom_limit_bytes=r.oom_limit_bytes,
                            evicted=r.message if (r.message or "").startswith("Evicted: ") else None)
            changed = True
        elif state == "StartFailed":
            ended.append(w.run)
            lifecycle.start_failed(session, w.run, w, r.message or "unknown", at)
            changed = True
    if ended:
        also.update(keepers_of(session, ended))
        if any(w.machine_id == m.id and w.state in lifecycle.ACTIVE for run in ended for w in run.workers):
            also.add(m.id)
    return changed


# A batch of lines stored and counted in one statement on PostgreSQL (agents.store_logs): the rows come as one JSON
# array; a line already stored (a batch sent again) is skipped and not counted; the running counts of the workers
# that got lines (table log_usage) come back.
_PG_STORE_LINES = (
    "WITH batch AS (INSERT INTO log_lines (worker_id, attempt, seq, time, stream, text) "
    "SELECT worker_id, attempt, seq, time, stream, text FROM json_to_recordset(%s::json) AS x(worker_id integer, "
    "attempt integer, seq integer, time double precision, stream varchar(8), text text) "
    "ON CONFLICT (worker_id, attempt, seq) DO NOTHING RETURNING worker_id, octet_length(text) + 1 AS size) "
    "INSERT INTO log_usage (worker_id, lines, bytes) SELECT worker_id, count(*), sum(size) FROM batch "
    "GROUP BY worker_id ON CONFLICT (worker_id) DO UPDATE SET lines = log_usage.lines + excluded.lines, "
    "bytes = log_usage.bytes + excluded.bytes RETURNING worker_id, lines, bytes")


# The same on SQLite, a chunk of lines at a time (no INSERT inside a WITH there): each line a JSON array
# [worker_id, attempt, seq, time, stream, text], taken apart by SQLite (json_each) without the interpreter's lock;
# only the lines of the workers in the second parameter (a JSON array of ids: those still placed on the machine) go
# in. Then the running counts: the lines this store added (ids above the last one before it: one writer) counted
# per worker into log_usage (NOT INDEXED: by the ids' range, not a scan of the worker index), whose counts come
# back.
_SQLITE_STORE_LINES = (
    "INSERT INTO log_lines (worker_id, attempt, seq, time, stream, text) "
    "SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5 FROM json_each(?) "
    "WHERE (value ->> 0) IN (SELECT value FROM json_each(?)) ON CONFLICT (worker_id, attempt, seq) DO NOTHING")
_SQLITE_ADD_USAGE = (
    "INSERT INTO log_usage (worker_id, lines, bytes) SELECT worker_id, count(*), sum(length(CAST(text AS BLOB)) + 1) "
    "FROM log_lines NOT INDEXED WHERE id > ? GROUP BY worker_id ON CONFLICT (worker_id) DO UPDATE SET "
    "lines = log_usage.lines + excluded.lines, bytes = log_usage.bytes + excluded.bytes "
    "RETURNING worker_id, lines, bytes")

# Lines a store writes between two steps aside (store_log_chunks' `pause`): a few milliseconds of SQLite's insert.
LOG_CHUNK = 500


def store_logs(session: Session, m: Machine, lines: list[P.WorkerLogLine], max_bytes: int = 8 << 20,
               max_lines: int = 100_000, pause: Callable[[], None] | None = None) -> int:
    """Store the lines of workers placed on machine `m` (by identity); lines naming any other worker, or a
    deleted run's, are dropped, as are lines past services.LOG_LINES_PER_REQUEST; a worker whose running count
    (table log_usage) is then past its log limits is trimmed (services.trim_logs). A line sent again (a retry) is
    stored and counted once. Returns the lines taken (a line sent again counts). The agent ships an ended
    attempt's lines before it reports the end (which may release the worker from the machine). On SQLite the lines
    go in chunks of LOG_CHUNK, with `pause` (services.let_state_changes_in) between them (store_log_chunks)."""
    if not lines:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        rows = _log_rows(session, m, lines)[:services.LOG_LINES_PER_REQUEST]
        if not rows:
            return 0
        # the batch as one JSON parameter that PostgreSQL takes apart, the lines and the running counts in one
        # statement: the driver's executemany adapted every row's parameters in Python (two thirds of the server's
        # time for a flood of lines, holding the interpreter's lock that the scheduling loop and the API wait for)
        batch = json.dumps(rows)  # (P.WorkerLogLine's time is finite: JSON has no nan or inf)
        usage = {w: (n, b) for w, n, b in session.connection().exec_driver_sql(_PG_STORE_LINES, (batch,))}
        for wid in services.over_log_limits(usage, max_bytes, max_lines):
            services.trim_logs(session, wid, max_bytes, max_lines)
        return len(rows)
    return store_log_chunks(session, m.id, log_chunks(session, m, lines), max_bytes, max_lines, pause)


def log_chunks(session: Session, m: Machine, lines: list[P.WorkerLogLine]) -> list[tuple[str, dict[int, int]]]:
    """SQLite: the lines of workers placed on machine `m`, at most services.LOG_LINES_PER_REQUEST, in chunks of
    LOG_CHUNK for store_log_chunks: each the chunk's JSON text and its lines per worker id. Made where the batch is
    parsed (for a big batch, the log store's process: server/logstore.py), so that the API's process does no work
    per line."""
    ids = _log_ids(session, m, lines)
    rows = [[ids[ln.worker], ln.attempt, ln.seq, ln.time, ln.stream, ln.text.replace("\x00", "\ufffd")]
            for ln in lines if ln.worker in ids][:services.LOG_LINES_PER_REQUEST]
    chunks = []
    for i in range(0, len(rows), LOG_CHUNK):
        part = rows[i:i + LOG_CHUNK]
        per: dict[int, int] = {}
        for r in part:
            per[r[0]] = per.get(r[0], 0) + 1
        chunks.append((json.dumps(part, ensure_ascii=False), per))  # (a line's time is finite: JSON has no nan)
    return chunks


_LIVE_HERE = select(Worker.id).join(Run, Worker.run_id == Run.id).where(
    Worker.machine_id == bindparam("machine_id"), Run.live_key == "", Run.deleting.is_(False))


def store_log_chunks(session: Session, machine_id: int, chunks: list[tuple[str, dict[int, int]]],
                     max_bytes: int, max_lines: int, pause: Callable[[], None] | None = None) -> int:
    """SQLite, under the state lock (services.side_tx or tx): store log_chunks' chunks, each in one statement, with
    `pause` between them; each chunk finds the machine's workers again, so a run deleted or a worker moved meanwhile
    gets none of the rest. Returns the lines taken."""
    stored = 0
    for i, (batch, per) in enumerate(chunks):
        if i and pause:
            pause()
        here = [w for w in session.scalars(_LIVE_HERE, {"machine_id": machine_id}) if w in per]
        if not here:
            continue
        conn = session.connection()
        after = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM log_lines").scalar()
        conn.exec_driver_sql(_SQLITE_STORE_LINES, (batch, json.dumps(here)))
        usage = {w: (n, b) for w, n, b in conn.exec_driver_sql(_SQLITE_ADD_USAGE, (after,))}
        for wid in services.over_log_limits(usage, max_bytes, max_lines):
            if pause:  # a trim (a worker's lines counted, an eighth of them deleted) is a step of its own
                pause()
            services.trim_logs(session, wid, max_bytes, max_lines)
        stored += sum(per[w] for w in here)
    return stored


def _log_ids(session: Session, m: Machine, lines: list[P.WorkerLogLine]) -> dict[str, int]:
    """The ids of the workers the lines name (by identity) that are placed on machine `m` and whose runs are not
    being deleted."""
    names = {P.identity_name(ln.worker) for ln in lines}
    # PostgreSQL stores lines without the state lock: FOR SHARE of the runs, so that deleting one
    # (services.delete_run) waits for this store, or this store sees it deleted (SQLite: under the state lock)
    return {P.worker_identity(ns, n, uid): i for ns, n, uid, i in session.execute(
        select(Workspace.ns, Worker.name, Run.uid, Worker.id).join(Run, Worker.run_id == Run.id)
        .join(Workspace, Run.workspace_id == Workspace.id)
        .where(Worker.machine_id == m.id, Run.live_key == "", Run.deleting.is_(False), Worker.name.in_(names))
        .with_for_update(read=True, of=Run))}


def _log_rows(session: Session, m: Machine, lines: list[P.WorkerLogLine]) -> list[dict]:
    """PostgreSQL: the rows of the lines whose workers are placed on machine `m` and whose runs are not being
    deleted."""
    ids = _log_ids(session, m, lines)
    return [{"worker_id": ids[ln.worker], "attempt": ln.attempt, "seq": ln.seq, "time": ln.time,
             "stream": ln.stream, "text": ln.text.replace("\x00", "\ufffd")}  # PostgreSQL text holds no NUL
            for ln in lines if ln.worker in ids]
