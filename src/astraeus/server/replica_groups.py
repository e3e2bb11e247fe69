"""Replica groups: the API's side (create, list, show, scale, delete) and the scheduling leader's duty that keeps
each group's `spec.replicas` runs alive (the decisions are astraeus.replica_groups, pure; this module reads the
rows and acts).

A group's body is `{"metadata": {"name", "labels"}, "spec": {"replicas": 3, "run": {…a run's spec, may name
"template"…}}}`. Its run part is checked as POST /runs checks a run (the template merged in first:
submits.resolve_template), with every field named under `spec.run`; the workspace's priority cap applies when the
group is created and whenever it is changed. Its replicas are runs named `<group>-<serial>`, submitted through
submits.submit_run_body by services.system_caller (an editor of the workspace), with `group_id` set. When a
replica cannot be submitted (the workspace's maximum priority was lowered, a template or drive was deleted), the
group says why in an event and tries again a little later — never at another priority.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator
from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from astraeus import replica_groups as RG
from astraeus import spec as S
from astraeus.server import lifecycle, services, submits
from astraeus.server.db import History, ReplicaGroup, Run, Workspace
from astraeus.server.services import ApiError, Caller, InvalidBody, require

log = logging.getLogger("astraeus.replica_groups")

REFUSED_RETRY = 30.0  # seconds before a group tries again after a replica was refused
GONE_WINDOW = 3600.0  # deleted replicas are looked at this long after they ended (to say what was replaced)
REPLACED = "Replaced by "
REMOVED = "Removed: replica group "


# ---------------------------------------------------------------------------------------------- bodies


class GroupMetadata(S.Metadata):
    @field_validator("name")
    @classmethod
    def _short(cls, v: str) -> str:
        if len(v) > RG.MAX_GROUP_NAME:
            raise ValueError(f"a replica group's name has at most {RG.MAX_GROUP_NAME} characters (its runs are "
                             f"named <name>-<number>): use a shorter one")
        return v


class GroupSpec(S.Strict):
    replicas: Annotated[int, Field(ge=0, le=RG.MAX_REPLICAS)]
    run: dict[str, Any] = Field(description="a run's spec (priority, start, cluster, task_template), or part of "
                                            "one that names a template")


class GroupCreate(S.Strict):
    metadata: GroupMetadata
    spec: GroupSpec


class GroupSpecPatch(S.Strict):
    replicas: Annotated[int, Field(ge=0, le=RG.MAX_REPLICAS)] | None = None
    run: dict[str, Any] | None = None


class GroupPatch(S.Strict):
    spec: GroupSpecPatch


# -------------------------------------------------------------------------------------------- checking


def _rename(message: str) -> str:
    return message.replace("spec.template", "spec.run.template").replace(
        "spec.task_template", "spec.run.task_template")


def run_body(group: str, labels: dict, run_spec: dict, serial: int) -> dict:
    return {"metadata": {"name": RG.replica_name(group, serial), "labels": dict(labels or {})}, "spec": run_spec}


def check_run(session: Session, caller: Caller, group: str, labels: dict, run_spec: dict) -> S.RunCreate:
    """The group's run part checked as POST /runs checks a run, before any run is made: InvalidBody naming the
    field under spec.run (422), 404 TEMPLATE_NOT_FOUND, 403 PRIORITY_NOT_ALLOWED, 404 CLUSTER_NOT_FOUND, 400
    DRIVE_NOT_FOUND."""
    if not isinstance(run_spec, dict):
        raise InvalidBody([{"loc": ("spec", "run"), "msg": "must be an object: a run's spec",
                            "type": "value_error"}])
    if "array" in run_spec:
        raise InvalidBody([{"loc": ("spec", "run", "array"), "msg": "a replica group's runs are not a job array: "
                            "remove it", "type": "value_error"}])
    try:
        spec, t = submits.resolve_template(session, caller, run_spec)
    except ApiError as e:
        raise ApiError(e.status, e.code, _rename(e.message)) from None
    except InvalidBody as e:
        raise InvalidBody([{**x, "loc": ("spec", "run", *x["loc"][1:])} for x in e.errors]) from None
    try:
        body = S.RunCreate.model_validate(run_body(group, labels, spec, 1))
    except ValidationError as e:
        errors = []
        for x in e.errors():
            loc = tuple(x.get("loc", ()))
            errors.append({**x, "loc": ("spec", "run", *loc[1:]) if loc[:1] == ("spec",) else ("metadata", *loc)})
        raise InvalidBody(errors) from None
    cluster, access = services._cluster_for(session, caller, body.spec.cluster)
    submits.check_made(session, caller, access, body.spec.priority,
                       [ref.name for ref in body.spec.task_template.datavolume_refs],
                       "spec.run.task_template.datavolume_refs")
    if S.worker_resources(body.spec.task_template)[2] > 2**63 - 1:
        raise submits.memory_too_large("spec.run.task_template")
    return body


# ------------------------------------------------------------------------------------------------- API


def get_group(session: Session, caller: Caller, name: str) -> ReplicaGroup:
    return services.get_named(session, caller, ReplicaGroup, name, "replica group", "replica-groups")


def list_groups(session: Session, caller: Caller) -> list[ReplicaGroup]:
    return services.list_named(session, caller, ReplicaGroup)


def create_group(session: Session, caller: Caller, body: GroupCreate, at: float) -> ReplicaGroup:
    require(caller, "editor")
    name = body.metadata.name
    if session.scalar(select(ReplicaGroup.id).where(ReplicaGroup.workspace_id == caller.workspace.id,
                                                    ReplicaGroup.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a replica group named {name} already exists in workspace "
                                              f"{caller.workspace.name}: choose another metadata.name")
    check_run(session, caller, name, body.metadata.labels, body.spec.run)
    g = ReplicaGroup(workspace_id=caller.workspace.id, name=name,
                     spec={"labels": body.metadata.labels, "replicas": body.spec.replicas, "run": body.spec.run},
                     created_at=at, updated_at=at, failures=0, retry_at=None, serial=0,
                     created_by=caller.user, updated_by=caller.user)
    session.add(g)
    lifecycle.event(session, caller.workspace.id, "ReplicaGroupCreated", name,
                    f"replica group {name} created: {body.spec.replicas} replica(s)", at)
    session.flush()
    return g


def patch_group(session: Session, caller: Caller, name: str, body: GroupPatch, at: float) -> ReplicaGroup:
    """Scale (`spec.replicas`) and/or change the run (`spec.run`, for the replicas made from now on). The run is
    checked again either way: a group whose priority is now above the workspace's maximum is refused (403)."""
    require(caller, "editor")
    g = get_group(session, caller, name)
    spec = dict(g.spec)
    run_spec = body.spec.run if body.spec.run is not None else spec["run"]
    check_run(session, caller, g.name, spec.get("labels") or {}, run_spec)
    before = spec["replicas"]
    if body.spec.replicas is not None:
        spec["replicas"] = body.spec.replicas
    spec["run"] = run_spec
    g.spec = spec
    g.updated_at = at
    g.updated_by = caller.user
    if body.spec.run is not None:
        g.retry_at = None  # a refused replica may be made at once with the new run
        lifecycle.event(session, caller.workspace.id, "ReplicaGroupChanged", name,
                        f"replica group {name}: its run spec changed (new replicas use it)", at)
    if spec["replicas"] != before:
        lifecycle.event(session, caller.workspace.id, "ReplicaGroupScaled", name,
                        f"replica group {name} scaled from {before} to {spec['replicas']} replica(s)", at)
    session.flush()
    return g


def group_runs(session: Session, group: ReplicaGroup) -> list[Run]:
    """The group's runs that still exist (not deleted), oldest first."""
    return list(session.scalars(select(Run).where(Run.group_id == group.id, Run.live_key == "")
                                .order_by(Run.created_at, Run.id)))


def delete_group(session: Session, caller: Caller, name: str, at: float) -> list[int]:
    """Delete the group and its runs (stopped as a deleted run is); returns the machines to tell."""
    require(caller, "editor")
    g = get_group(session, caller, name)
    machines: list[int] = []
    for run in group_runs(session, g):
        if not run.deleting:
            _, m = services.delete_run(session, caller, run.name, at)
            machines += m
    session.delete(g)
    lifecycle.event(session, caller.workspace.id, "ReplicaGroupDeleted", name,
                    f"replica group {name} deleted, and its runs", at)
    session.flush()
    return machines


def shown_run(run: dict, role: str | None) -> dict:
    """The group's run spec as `role` may see it (services.shown_template: env and config values only for editors
    and admins, a secret one for nobody)."""
    tt = run.get("task_template") if isinstance(run, dict) else None
    if not isinstance(tt, dict):
        return run
    shown = services.shown_template(tt, role)
    return {**run, "task_template": {**tt, **{k: shown[k] for k in ("env", "configs") if k in tt}}}


def group_view(session: Session, g: ReplicaGroup, ws: Workspace, role: str | None = None,
               now: float | None = None) -> dict:
    """A replica group as the API shows it to a caller with `role` (None: as to a viewer)."""
    now = time.time() if now is None else now
    runs = group_runs(session, g)
    alive = [r for r in runs if r.state in RG.LIVE and not r.deleting]
    status: dict[str, Any] = {
        "replicas": g.spec["replicas"], "alive": len(alive),
        "running": sum(1 for r in alive if r.state == "Running"),
        "failures": g.failures or 0, "retry_at": services.iso(g.retry_at) if g.retry_at and g.retry_at > now else None,
        "runs": [{"name": r.name, "state": r.state, "reason": lifecycle.run_reason(r, now),
                  "created_at": services.iso(r.created_at), "started_at": services.iso(r.started_at),
                  "finished_at": services.iso(r.finished_at)} for r in runs],
    }
    return {"metadata": {"name": g.name, "labels": g.spec.get("labels") or {}, "workspace": ws.name,
                         "namespace": ws.ns, "created_at": services.iso(g.created_at),
                         "updated_at": services.iso(g.updated_at), **services.made_by(g)},
            "spec": {"replicas": g.spec["replicas"], "run": shown_run(g.spec["run"], role)},
            "status": status}


# --------------------------------------------------------------------------------- the leader's duty


def _handled(session: Session, run_ids: list[int]) -> set[int]:
    """The gone replicas already replaced, or removed on purpose (their History says so)."""
    if not run_ids:
        return set()
    return set(session.scalars(select(History.run_id).where(
        History.run_id.in_(run_ids), or_(History.reason.like(REPLACED + "%"), History.reason.like(REMOVED + "%")))))


def _why(run: Run) -> str:
    if run.deleting or run.live_key:
        return "deleted"
    return f"{run.state}: {run.reason}" if run.reason else run.state


def retry_after(at: float) -> Select:
    """The earliest end of a replica group's wait (backoff, or after a refusal) after `at`, as a statement (read in
    the scheduling loop's one read of everything due next, loop.next_due_at: it makes a full pass then)."""
    return select(func.min(ReplicaGroup.retry_at)).where(ReplicaGroup.retry_at > at)


def keep_replicas(session: Session, at: float, base: float | None = None) -> set[int]:
    """The scheduling leader's duty, inside its fenced transaction: bring every group to its count (create,
    replace with backoff, scale down), with an event for each replacement, removal, wait and refusal. Returns the
    machines whose workers were asked to stop."""
    base = lifecycle.backoff_base() if base is None else base
    touched: set[int] = set()
    for g in list(session.scalars(select(ReplicaGroup).order_by(ReplicaGroup.id))):
        touched |= _keep(session, g, at, base)
    return touched


def _keep(session: Session, g: ReplicaGroup, at: float, base: float) -> set[int]:
    rows = list(session.scalars(select(Run).where(
        Run.group_id == g.id, or_(Run.live_key == "", Run.finished_at >= at - GONE_WINDOW))))
    by_name = {r.name: r for r in rows if not r.live_key}
    gone_ids = [r.id for r in rows if r.deleting or r.live_key or r.state in RG.ENDED]
    handled = _handled(session, gone_ids)
    reps = [RG.Replica(name=r.name if not r.live_key else f"{r.name}@{r.id}", state=r.state, created_at=r.created_at,
                       started_at=r.started_at, finished_at=r.finished_at, deleting=bool(r.deleting or r.live_key),
                       handled=r.id in handled) for r in rows]
    rows_by_key = {rep.name: row for rep, row in zip(reps, rows, strict=True)}
    wanted = int(g.spec.get("replicas", 0))
    d = RG.reconcile(wanted, reps, at, base, g.retry_at)
    ws = session.get(Workspace, g.workspace_id)
    caller = services.system_caller(session, ws)
    touched: set[int] = set()

    for name in d.scale_down:
        run = by_name[name]
        was = run.state
        lifecycle.history(session, run, was, f"{REMOVED}{g.name} scaled down to {wanted}", at)
        _, machines = services.delete_run(session, caller, name, at)
        touched.update(m for m in machines if m)
        lifecycle.event(session, ws.id, "ReplicaRemoved", name,
                        f"replica group {g.name} scaled down to {wanted}: removed {name} (it was {was})", at)
    for name in d.forget:
        _, machines = services.delete_run(session, caller, name, at)
        touched.update(m for m in machines if m)

    if d.backing_off:
        if d.retry_at != g.retry_at or d.failures != g.failures:
            secs = max(1, round(d.retry_at - at))
            why = f"{d.failures} replicas failed in a row" if d.failures > 1 else "the last replica was refused"
            lifecycle.event(session, ws.id, "ReplicaBackoff", g.name,
                            f"replica group {g.name}: {why}; {d.missing} replacement(s) wait {secs}s "
                            f"(until {services.iso(d.retry_at)})", at)
        g.failures, g.retry_at = d.failures, d.retry_at
        return touched
    g.failures = d.failures
    if d.create == 0:
        if g.retry_at is not None and g.retry_at <= at:
            g.retry_at = None
        return touched

    try:
        check_run(session, caller, g.name, g.spec.get("labels") or {}, g.spec["run"])
    except (ApiError, InvalidBody) as e:
        why = e.message if isinstance(e, ApiError) else _invalid_message(e)
        hint = (": lower the group's priority (PATCH spec.run) or ask an organisation admin to raise the "
                "workspace's maximum" if isinstance(e, ApiError) and e.code == "PRIORITY_NOT_ALLOWED" else "")
        lifecycle.event(session, ws.id, "ReplicaRefused", g.name,
                        f"replica group {g.name}: {d.missing} replica(s) missing, none created: {why}{hint}; "
                        f"tried again in {REFUSED_RETRY:g}s", at)
        g.retry_at = at + REFUSED_RETRY
        return touched
    g.retry_at = None
    for i in range(d.create):
        serial = _next_serial(session, g)
        run = submits.submit_run_body(session, caller, run_body(g.name, g.spec.get("labels") or {}, g.spec["run"],
                                                                 serial), at, submits.RunOrigin(group_id=g.id))
        if i < len(d.replaces):
            old = rows_by_key[d.replaces[i]]
            lifecycle.history(session, old, old.state, f"{REPLACED}{run.name} (replica group {g.name})", at)
            lifecycle.event(session, ws.id, "ReplicaReplaced", run.name,
                            f"replica group {g.name}: {old.name} is gone ({_why(old)}); created {run.name} in its "
                            f"place", at)
        else:
            lifecycle.event(session, ws.id, "ReplicaCreated", run.name,
                            f"replica group {g.name}: created {run.name} ({d.alive + i + 1} of {wanted})", at)
    return touched


def _invalid_message(e: InvalidBody) -> str:
    from astraeus.server.routers.errors import validation_errors

    return validation_errors(e.errors)[0]


def _next_serial(session: Session, g: ReplicaGroup) -> int:
    """The next replica number whose run name is free in the workspace."""
    serial = (g.serial or 0) + 1
    while session.scalar(select(Run.id).where(Run.workspace_id == g.workspace_id, Run.live_key == "",
                                              Run.name == RG.replica_name(g.name, serial))):
        serial += 1
    g.serial = serial
    return serial
