"""Reading and deleting runs and their workers; the cluster a workspace submits to; a name already taken."""

from __future__ import annotations

from sqlalchemy import bindparam, or_, select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus.server import lifecycle
from astraeus.server.db import (
    Access,
    Cluster,
    History,
    Run,
    Worker,
)
from astraeus.server.services.auth import Caller, require
from astraeus.server.services.errors import ApiError
from astraeus.server.services.logs import delete_logs


def _cluster_for(session: Session, caller: Caller, name: str | None) -> tuple[Cluster, Access]:
    return cluster_for(session, caller.workspace.id, caller.workspace.name, name)


def name_taken(name: str, ws_name: str, deleting: bool = False) -> ApiError:
    """The refusal of a run whose name a live run of the workspace has (submit_run, the group-commit writer); one
    being deleted keeps its name until its workers have ended."""
    if deleting:
        return ApiError(409, "ALREADY_EXISTS", f"a run named {name} in workspace {ws_name} is being deleted (its "
                                               f"workers are stopping): submit again once it is gone, within its "
                                               f"stop grace, or choose another metadata.name")
    return ApiError(409, "ALREADY_EXISTS", f"a run named {name} already exists in workspace {ws_name}: "
                                           f"choose another metadata.name, or delete it first")


def name_holder_deleting(session: Session, ws_id: int, name: str) -> bool | None:
    """Whether the live run of that name in the workspace is being deleted; None when there is none."""
    return session.scalar(select(Run.deleting).where(Run.workspace_id == ws_id, Run.name == name,
                                                     Run.live_key == ""))


_CLUSTERS = select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id).where(
    Access.workspace_id == bindparam("ws_id"))


_CLUSTER_NAMED = _CLUSTERS.where(Cluster.name == bindparam("name"))


_FIRST_CLUSTER = _CLUSTERS.order_by(Cluster.id).limit(1)


def cluster_for(session: Session, ws_id: int, ws_name: str, name: str | None) -> tuple[Cluster, Access]:
    """The cluster a run goes to (the one named, else the workspace's first) and the workspace's access to it."""
    if name:
        row = session.execute(_CLUSTER_NAMED, {"ws_id": ws_id, "name": name}).first()
        if row is None:
            raise ApiError(404, "CLUSTER_NOT_FOUND", f"cluster {name} not found or not granted to workspace {ws_name}")
        return row[0], row[1]
    row = session.execute(_FIRST_CLUSTER, {"ws_id": ws_id}).first()
    if row is None:
        raise ApiError(409, "NO_CLUSTER", f"workspace {ws_name} has access to no cluster: "
                                          "ask an organisation admin to grant one")
    return row[0], row[1]


def get_run(session: Session, caller: Caller, name: str) -> Run:
    run = session.scalar(select(Run).where(Run.workspace_id == caller.workspace.id, Run.name == name,
                                           Run.live_key == ""))
    if run is None:
        raise ApiError(404, "NOT_FOUND", f"run {name} not found in workspace {caller.workspace.name}")
    return run


def parse_label_selector(values: list[str] | None, field: str = "label") -> dict[str, str]:
    """`key=value` selectors (each value may hold several, comma-separated) as one dict, all of which a run must
    carry (`key=`: the label with an empty value); anything else, or a key or value no label can have, is a 422
    naming `field`."""
    out: dict[str, str] = {}
    for value in values or []:
        for part in value.split(","):
            key, eq, val = part.strip().partition("=")
            key, val = key.strip(), val.strip()
            if not eq or not key:
                raise ApiError(422, "INVALID", f"{field}: {part.strip()[:80]!r} is not a label selector: give "
                                               "key=value (several: repeat it, or separate them with commas)")
            try:
                S.check_labels({key: val}, "label")
            except ValueError as e:
                raise ApiError(422, "INVALID", f"{field}: {e}") from None
            if key in out and out[key] != val:
                raise ApiError(422, "INVALID", f"{field}: label {key} asked for twice with different values "
                                               f"({out[key]} and {val}): no run can match")
            out[key] = val
    return out


def list_runs(session: Session, caller: Caller, state: str | None = None, labels: dict[str, str] | None = None,
              after: tuple[float, int] | None = None, limit: int | None = None,
              job_id: int | None = None) -> list[Run]:
    """The workspace's runs, newest first (created_at, then id, descending), with their workers loaded in one
    query more: those in `state`, carrying every label of `labels`, after the sort key `after` (a page's last
    run), at most `limit` (None: all of them); `job_id`: only the run of that numeric job id (none where it is another
    workspace's). The indexes of revision 0010 make this an index scan."""
    from sqlalchemy.orm import selectinload

    q = select(Run).where(Run.workspace_id == caller.workspace.id, Run.live_key == "")
    if state:
        q = q.where(Run.state == state)
    if job_id is not None:
        q = q.where(Run.id == job_id)
    for key, value in (labels or {}).items():
        q = q.where(Run.labels[key].as_string() == value)
    if after is not None:
        q = q.where(Run.created_at <= after[0], or_(Run.created_at < after[0], Run.id < after[1]))
    q = q.order_by(Run.created_at.desc(), Run.id.desc()).options(selectinload(Run.workers))
    if limit is not None:
        q = q.limit(limit)
    return list(session.scalars(q))


def run_history(session: Session, run: Run) -> list[History]:
    return list(session.scalars(select(History).where(History.run_id == run.id).order_by(History.id)))


def delete_run(session: Session, caller: Caller, name: str, at: float) -> tuple[Run, list[int]]:
    require(caller, "editor")
    run = get_run(session, caller, name)
    machines = [w.machine_id for w in run.workers if w.state in lifecycle.ACTIVE]
    lifecycle.delete(session, run, at, caller.user)
    delete_logs(session, run)  # and the agent's later lines for it are not stored (agents.store_logs)
    if caller.user:
        lifecycle.record(session, lifecycle.RUN_DELETED_BY, at, run=run, by=caller.user)
    else:
        lifecycle.record(session, lifecycle.RUN_DELETED, at, run=run, name=name)
    return run, machines


def update_run(session: Session, caller: Caller, name: str, changes: dict, at: float) -> Run:
    """PATCH $API/runs/{name} (`scontrol update`): a live run's `priority` and/or `time_limit_seconds` (None: no
    limit). Priority: within the workspace's maximum on the run's cluster, as at submit; the scheduler reads the
    column at its next full read. Time limit: the spec, and the deadline of each worker placed or running (counted
    from its start, or from its placement before it started), as lifecycle.placed/running set it."""
    if changes.get("priority", 0) is None:
        raise ApiError(422, "INVALID", "priority: give a whole number (null is not a priority)")
    if "held" in changes and changes["held"] is None:
        raise ApiError(422, "INVALID", "held: give true (scontrol hold) or false (scontrol release)")
    if not changes:
        raise ApiError(422, "INVALID", "give priority, time_limit_seconds (null: no time limit) and/or held")
    require(caller, "editor")
    run = get_run(session, caller, name)
    if changes.get("held") and not run.held and (run.state != lifecycle.RunState.PENDING or run.deleting):
        # once placed it would have to be stopped: that is cancelling it
        raise ApiError(409, "NOT_PENDING", f"run {name} is {'being deleted' if run.deleting else run.state}: only "
                                           f"a Pending run can be held; cancel it (astra slurm scancel {name}) to "
                                           "stop it")
    if run.state in lifecycle.RUN_ENDED or run.deleting:
        raise ApiError(409, "RUN_ENDED", f"run {name} has ended ({run.state}) or is being deleted: its priority and "
                                         "time limit can no longer change")
    spec = dict(run.spec)
    said = []
    if "priority" in changes:
        p = changes["priority"]
        access = session.scalar(select(Access).where(Access.workspace_id == caller.workspace.id,
                                                     Access.cluster_id == run.cluster_id))
        maximum = access.max_priority if access is not None else 0
        if not S.priority_allowed(p, maximum):
            raise ApiError(403, "PRIORITY_NOT_ALLOWED",
                           f"priority {p} is above namespace {caller.workspace.ns}'s maximum of {maximum}: give "
                           f"{maximum} or less (an organisation admin can raise the maximum)")
        run.priority = p
        spec["priority"] = p
        said.append(f"priority {p}")
    if "time_limit_seconds" in changes:
        limit = changes["time_limit_seconds"]
        spec["task_template"] = {**spec["task_template"], "time_limit_seconds": limit}
        for w in run.workers:
            if w.state in lifecycle.ACTIVE:
                since = w.started_at if w.started_at is not None else w.placed_at
                w.deadline = since + limit if limit and since is not None else None
        said.append(f"time limit {limit} s" if limit else "no time limit")
    if "held" in changes and bool(changes["held"]) != bool(run.held):
        said.append(lifecycle.hold(session, run, bool(changes["held"]), at))
    run.spec = spec
    run.updated_by = caller.user or run.updated_by
    if said:
        lifecycle.event(session, run.workspace_id, "RunUpdated", name, f"run {name} updated: {', '.join(said)}", at)
    return run


def get_worker(session: Session, caller: Caller, name: str) -> Worker:
    w = session.scalar(select(Worker).join(Run).where(Run.workspace_id == caller.workspace.id, Worker.name == name,
                                                      Run.live_key == ""))
    if w is None:
        raise ApiError(404, "NOT_FOUND", f"worker {name} not found in workspace {caller.workspace.name}")
    return w


def list_workers(session: Session, caller: Caller, run: str | None = None) -> list[Worker]:
    q = select(Worker).join(Run).where(Run.workspace_id == caller.workspace.id, Run.live_key == "")
    if run:
        q = q.where(Run.name == run)
    return list(session.scalars(q.order_by(Run.id, Worker.index)))
