"""A fleet that heals (issue 47; docs/health.md): cordoned and drained machines, quarantined GPUs.

A cordoned machine takes no new work; a drained one also has what ran there stopped (its stop grace, then queued
again; no restart spent). A failed GPU (an XID, uncorrectable ECC, a pending row remap, a GPU that no longer
answers: from the agent's NVML watch, or injected by an admin on a simulated GPU) is quarantined until an admin
clears it: the scheduler's snapshot leaves it out of the machine's room, and the worker on it is stopped and queued
again elsewhere. A failing site health check drains its machine; passing again resumes only a drain it made.

`decide_report` is pure (what an agent's report means); the rest acts on the rows, through lifecycle for states,
reasons and events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import protocol as P
from astraeus.server import lifecycle
from astraeus.server.db import Access, Cluster, Machine, Run, Worker
from astraeus.server.services.auth import Caller
from astraeus.server.services.errors import ApiError
from astraeus.server.services.views import iso

GPU_FAULTS = Counter("astraeus_gpu_faults", "GPU faults that quarantined a GPU", ["machine", "gpu", "xid"])
QUARANTINED = Gauge("astraeus_gpus_quarantined", "GPUs quarantined (failed, not yet cleared by an admin)",
                    ["machine"])

CORDON, DRAIN = "cordon", "drain"
ADMIN, HEALTH_CHECK = "admin", "health-check"
REASON_MAX = 200


# ----------------------------------------------------------------------------------------------- views


def quarantined(m: Machine) -> tuple[int, ...]:
    """The machine's failed GPUs, by index: nothing new lands on them."""
    return tuple(sorted(int(i) for i, f in (m.gpu_faults or {}).items() if f.get("fatal", True)))


def unschedulable(m: Machine) -> str | None:
    """Why the machine takes no new work by its cordon (`drained by admin: new cables`); None: it is not cordoned."""
    if not m.cordon:
        return None
    return f"{'drained' if m.cordon == DRAIN else 'cordoned'} by {m.cordon_by or ADMIN}: {m.cordon_reason or ''}"


def gpus_reason(m: Machine) -> str | None:
    """What the machine's reason shows of its failed GPUs (`GPU 3 failed (XID 79), quarantined`)."""
    parts = [f"GPU {i} failed ({m.gpu_faults[str(i)]['what']})" for i in quarantined(m)]
    return f"{', '.join(parts)}: quarantined" if parts else None


def view(m: Machine) -> dict:
    """The health part of a machine's view (services/machines.py)."""
    faults = [{"index": int(i), **{k: f.get(k) for k in ("what", "xid", "fatal")}, "at": iso(f.get("at"))}
              for i, f in sorted((m.gpu_faults or {}).items(), key=lambda kv: int(kv[0]))]
    return {"cordon": m.cordon, "cordon_reason": m.cordon_reason, "cordon_by": m.cordon_by,
            "quarantined_gpus": list(quarantined(m)), "gpu_faults": faults}


def slurm_state(m: Machine, busy: bool) -> str | None:
    """Slurm's state word for a cordoned or drained machine (`drng` while work still runs there, then `drain`);
    None: not cordoned."""
    if not m.cordon:
        return None
    return "drng" if busy else "drain"


# ------------------------------------------------------------------------------------------- deciding


@dataclass
class Decision:
    """What an agent's report means for its machine."""

    failed: list[P.GpuFault] = field(default_factory=list)  # GPUs newly failed: quarantine them
    warnings: dict[str, dict] = field(default_factory=dict)  # the slowdowns now (replacing the last ones)
    drain: str | None = None  # the health check failed: drain with this reason
    resume: bool = False  # the health check passes again: end its drain

    def changes(self, m: Machine) -> bool:
        old = {i: f for i, f in (m.gpu_faults or {}).items() if not f.get("fatal", True)}
        return bool(self.failed or self.drain or self.resume) or {
            i: f.get("what") for i, f in old.items()} != {i: f["what"] for i, f in self.warnings.items()}


def decide_report(gpus: int, faults: dict | None, cordon: str | None, cordon_by: str | None, cordon_reason: str | None,
                  reported: list[P.GpuFault] | None, check: P.HealthCheck | None) -> Decision:
    """Pure: a machine with `gpus` GPUs, its stored `faults` and cordon, reports these faults and health check."""
    d = Decision()
    known = {i for i, f in (faults or {}).items() if f.get("fatal", True)}
    for f in reported or ():
        if f.index >= gpus:
            continue  # not a GPU of this machine
        if f.fatal and str(f.index) not in known and all(x.index != f.index for x in d.failed):
            d.failed.append(f)
        elif not f.fatal and str(f.index) not in known:
            d.warnings[str(f.index)] = {"what": f.what, "xid": f.xid, "fatal": False}
    if check is not None:
        why = (check.output.strip().splitlines() or [""])[0].strip()[:REASON_MAX] or "health check failed"
        if not check.ok and (cordon != DRAIN or (cordon_by == HEALTH_CHECK and cordon_reason != why)):
            d.drain = why
        elif check.ok and cordon_by == HEALTH_CHECK:
            d.resume = True
    return d


# --------------------------------------------------------------------------------------------- acting


def _workspaces(session: Session, m: Machine) -> list[int]:
    return sorted(session.scalars(select(Access.workspace_id).where(Access.cluster_id == m.cluster_id)))


def _active_on(session: Session, m: Machine, gpu: int | None = None) -> list[Worker]:
    ws = session.scalars(select(Worker).where(Worker.machine_id == m.id, Worker.state.in_(lifecycle.ACTIVE)))
    return [w for w in ws if gpu is None or gpu in (w.gpu_indices or [])]


def _stop(session: Session, workers: list[Worker], reason: str, at: float) -> int:
    """Stop these workers, and the rest of a gang with them (a gang is queued again together)."""
    runs: dict[int, tuple[Run, list[Worker]]] = {}
    for w in workers:
        runs.setdefault(w.run_id, (w.run, []))[1].append(w)
    for run, ws in runs.values():
        if run.spec.get("start", "Gang") != "Independent":
            ws = [w for w in run.workers if w.state in lifecycle.ACTIVE]
        lifecycle.stop_off_machine(session, run, ws, reason, at)
        lifecycle.refresh_run(session, run, at)
    return len(workers)


def set_cordon(session: Session, m: Machine, mode: str, reason: str, by: str, at: float) -> None:
    """Cordon (no new work) or drain (also stop what runs there) the machine."""
    m.cordon, m.cordon_reason, m.cordon_by, m.cordon_at = mode, reason, by, at
    word = "drained" if mode == DRAIN else "cordoned"
    lifecycle.machine_health_event(session, _workspaces(session, m), "MachineDrained" if mode == DRAIN
                                   else "MachineCordoned", m.name, f"machine {m.name} {word} by {by}: {reason}", at)
    if mode == DRAIN:
        _stop(session, _active_on(session, m), f"Machine {m.name} drained by {by}: {reason}: queued again", at)


def resume(session: Session, m: Machine, by: str, at: float, reason: str | None = None) -> None:
    """The machine takes work again."""
    was = unschedulable(m)
    m.cordon = m.cordon_reason = m.cordon_by = m.cordon_at = None
    lifecycle.machine_health_event(session, _workspaces(session, m), "MachineResumed", m.name,
                                   f"machine {m.name} resumed by {by}" + (f": {reason}" if reason else "")
                                   + (f" (was {was})" if was else ""), at)


def gpu_failed(session: Session, m: Machine, index: int, what: str, xid: int | None, at: float) -> None:
    """Quarantine GPU `index` of the machine; stop the work on it (queued again elsewhere)."""
    m.gpu_faults = {**(m.gpu_faults or {}), str(index): {"what": what, "xid": xid, "fatal": True, "at": at}}
    GPU_FAULTS.labels(machine=m.name, gpu=str(index), xid="" if xid is None else str(xid)).inc()
    QUARANTINED.labels(machine=m.name).set(len(quarantined(m)))
    lifecycle.machine_health_event(session, _workspaces(session, m), "GpuFailed", m.name,
                                   f"GPU {index} of {m.name} failed ({what}): quarantined until an admin clears it",
                                   at)
    _stop(session, _active_on(session, m, index), f"GPU {index} of {m.name} failed ({what}): queued again elsewhere",
          at)


def gpu_cleared(session: Session, m: Machine, index: int, by: str, at: float) -> None:
    faults = dict(m.gpu_faults or {})
    was = faults.pop(str(index), None)
    m.gpu_faults = faults or None
    QUARANTINED.labels(machine=m.name).set(len(quarantined(m)))
    lifecycle.machine_health_event(session, _workspaces(session, m), "GpuCleared", m.name,
                                   f"GPU {index} of {m.name} cleared by {by}"
                                   + (f" (was {was['what']})" if was else ""), at)


def apply_report(session: Session, m: Machine, reported: list[P.GpuFault] | None, check: P.HealthCheck | None,
                 at: float) -> bool:
    """An agent reports its GPUs' faults and its health check. Returns True when the scheduler must plan again."""
    d = decide_report(m.gpus, m.gpu_faults, m.cordon, m.cordon_by, m.cordon_reason, reported, check)
    if not d.changes(m):
        return False
    if reported is not None:
        fatal = {i: f for i, f in (m.gpu_faults or {}).items() if f.get("fatal", True)}
        m.gpu_faults = {**fatal, **d.warnings} or None
    for f in d.failed:
        gpu_failed(session, m, f.index, f.what, f.xid, at)
    if d.drain:
        set_cordon(session, m, DRAIN, d.drain, HEALTH_CHECK, at)
    elif d.resume:
        resume(session, m, HEALTH_CHECK, at, "the health check passes")
    return bool(d.failed or d.drain or d.resume)


def report_changes(m: Machine, reported: list[P.GpuFault] | None, check: P.HealthCheck | None) -> bool:
    """Whether a heartbeat's health would change the machine (else it may be written as a bare heartbeat)."""
    if reported is None and check is None:
        return False
    return decide_report(m.gpus, m.gpu_faults, m.cordon, m.cordon_by, m.cordon_reason, reported, check).changes(m)


# ------------------------------------------------------------------------------------ the admin's calls


def machine_named(session: Session, caller: Caller, name: str, cluster: str | None = None) -> Machine:
    """The organisation's machine `name` (on `cluster`, when two clusters have one of that name)."""
    q = select(Machine, Cluster.name).join(Cluster, Cluster.id == Machine.cluster_id).where(
        Cluster.org_id == caller.org.id, Machine.name == name)
    if cluster:
        q = q.where(Cluster.name == cluster)
    rows = session.execute(q).all()
    if not rows:
        where = f" on cluster {cluster}" if cluster else ""
        raise ApiError(404, "NOT_FOUND", f"machine {name} not found{where}: `astra astraeus machines` lists them")
    if len(rows) > 1:
        raise ApiError(409, "AMBIGUOUS", f"clusters {', '.join(sorted(c for _, c in rows))} each have a machine "
                                         f"named {name}: add ?cluster=NAME")
    return rows[0][0]


def check_reason(reason: str | None, required: bool) -> str | None:
    reason = (reason or "").strip()
    if required and not reason:
        raise ApiError(422, "INVALID", "a reason is needed: say why (--reason 'replacing a cable'), it is shown "
                                       "with the machine and on the runs it stops")
    if len(reason) > REASON_MAX or "\n" in reason:
        raise ApiError(422, "INVALID", f"the reason must be one line of at most {REASON_MAX} characters; "
                                       f"this one has {len(reason)}")
    return reason or None


def check_gpu(m: Machine, index: int) -> None:
    if not 0 <= index < m.gpus:
        have = f"GPUs 0-{m.gpus - 1}" if m.gpus else "no GPU"
        raise ApiError(404, "NOT_FOUND", f"machine {m.name} has no GPU {index}: it has {have}")


def admin_action(session: Session, caller: Caller, name: str, action: str, reason: str | None, at: float,
                 cluster: str | None = None) -> Machine:
    """cordon | drain | resume, asked by an admin."""
    m = machine_named(session, caller, name, cluster)
    why = check_reason(reason, required=action != "resume")
    by = ADMIN
    if action == "resume":
        if not m.cordon:
            raise ApiError(409, "CONFLICT", f"machine {name} is neither cordoned nor drained: nothing to resume")
        resume(session, m, by, at, why)
    else:
        set_cordon(session, m, DRAIN if action == "drain" else CORDON, why, by, at)
    return m


def inject_fault(session: Session, caller: Caller, name: str, index: int, xid: int, what: str | None, at: float,
                 cluster: str | None = None) -> Machine:
    """An admin injects a fault on a GPU (a simulated one, to try the quarantine end to end)."""
    m = machine_named(session, caller, name, cluster)
    check_gpu(m, index)
    if str(index) in (m.gpu_faults or {}) and m.gpu_faults[str(index)].get("fatal", True):
        raise ApiError(409, "CONFLICT", f"GPU {index} of {name} is already quarantined "
                                        f"({m.gpu_faults[str(index)]['what']}): clear it first")
    gpu_failed(session, m, index, what or f"XID {xid}", xid, at)
    return m


def clear_fault(session: Session, caller: Caller, name: str, index: int, at: float,
                cluster: str | None = None) -> Machine:
    m = machine_named(session, caller, name, cluster)
    check_gpu(m, index)
    if str(index) not in (m.gpu_faults or {}):
        raise ApiError(409, "CONFLICT", f"GPU {index} of {name} has no fault to clear")
    gpu_cleared(session, m, index, ADMIN, at)
    return m
