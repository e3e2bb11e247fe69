"""What the API does, as plain functions over a session. Routers are thin and call these."""

from __future__ import annotations

import hashlib
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import LargeBinary, and_, bindparam, cast, delete, event, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from astraeus import drives as drive_rules
from astraeus import spec as S
from astraeus import templates
from astraeus.server import lifecycle
from astraeus.server.db import (
    Access,
    Cluster,
    Drive,
    Event,
    History,
    LogLine,
    LogUsage,
    Machine,
    Org,
    Pool,
    Run,
    Template,
    Token,
    Worker,
    Workspace,
)
from astraeus.server.state_lock import STATE_LOCK, STATE_LOCK_COLUMNS, STATE_LOCK_PARAMS, lock_state

ROLES = ("viewer", "editor", "admin")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@contextmanager
def tx(s: Session, keep=()):
    """Commit what the block did, or nothing at all; one state change at a time, in this process (state_lock.STATE_LOCK)
    and across replicas on PostgreSQL (state_lock.lock_state: an advisory lock, then the block reads fresh rows; `keep`:
    rows not read again, such as the caller's organisation and workspace, whose ids and names the block uses)."""
    if not STATE_LOCK.acquire(blocking=False):
        hand_back_connection(s)  # another state change runs: wait for it holding no pooled connection
        STATE_LOCK.acquire()
    try:
        lock_state(s, keep)
        yield
        s.commit()
    except BaseException:
        s.rollback()
        raise
    finally:
        STATE_LOCK.release()


@contextmanager
def side_tx(s: Session):
    """Commit what the block did, or nothing, for a write that changes no state (a heartbeat's time, log lines):
    on PostgreSQL without the state lock or the advisory lock, so that submits, reports and the scheduling loop
    never wait for it; on SQLite (one writer) under the process's state lock, held for the block only and waited
    for holding no pooled connection, rather than racing state changes for the database's write lock."""
    sqlite = s.get_bind().dialect.name == "sqlite"
    if sqlite and not STATE_LOCK.acquire(blocking=False):
        hand_back_connection(s)
        STATE_LOCK.acquire()
    try:
        yield
        s.commit()
    except BaseException:
        s.rollback()
        raise
    finally:
        if sqlite:
            STATE_LOCK.release()


# How long a side write steps aside at most (let_state_changes_in) while state changes keep queueing for the lock.
STEP_ASIDE_MAX = 0.2


def let_state_changes_in(s: Session) -> None:
    """Within side_tx on SQLite, between the chunks of a long write: commit what is written so far and, when state
    changes (a submit, a report, the scheduling loop's apply) wait for the state lock, let them go first, then take
    the lock again (for at most STEP_ASIDE_MAX while more keep coming). A submit then waits for one chunk of a
    flood's log lines, not for the whole batch (and a chunk that no one waits for is not committed on its own).
    PostgreSQL: nothing to do (side_tx holds no lock there)."""
    if s.get_bind().dialect.name != "sqlite" or not STATE_LOCK.waiting:
        return
    s.commit()
    STATE_LOCK.step_aside(STEP_ASIDE_MAX)


@event.listens_for(Session, "after_flush")
def _wrote(session: Session, _context) -> None:
    session.info["wrote"] = True


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_rollback")
def _ended(session: Session) -> None:
    session.info.pop("wrote", None)


def hand_back_connection(s: Session) -> None:
    """End the session's transaction if it has only read (authentication, a lookup), so that its connection goes
    back to the pool while the request waits for the state lock. Without this, requests waiting for the lock each
    held a connection, and with the pool empty the lock's holder could not get the one it needed: every request
    then waited out the pool's timeout (found with 200 agents' heartbeats, benchmarks/bench_agents.py). What it
    loaded stays usable (sessions do not expire on commit); a session that wrote keeps its transaction."""
    if s.in_transaction() and not (s.new or s.dirty or s.deleted or s.info.get("wrote")):
        s.commit()


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_ns() -> str:
    return "ws-" + secrets.token_hex(6)


# ------------------------------------------------------------------------------------------------ auth


@dataclass
class Caller:
    token: Token | None  # None: the control plane acting for the workspace (system_caller)
    org: Org
    workspace: Workspace | None = None
    role: str | None = None  # viewer | editor | admin (org admins act as admin)

    @property
    def org_admin(self) -> bool:
        return self.token is not None and self.token.kind == "org_admin"


def _bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise ApiError(401, "UNAUTHENTICATED", "missing bearer token: send 'Authorization: Bearer $ASTRAEUS_TOKEN'")
    return authorization.split(None, 1)[1].strip()


def _valid(tok: Token | None) -> Token:
    if tok is None or tok.revoked:
        raise ApiError(401, "UNAUTHENTICATED", "the token is not valid (unknown or revoked): ask for a new one")
    if tok.expires_at is not None and tok.expires_at <= time.time():
        raise ApiError(401, "UNAUTHENTICATED", "the token has expired: ask for a new one")
    return tok


TOKEN_BY_DIGEST = select(Token).where(Token.digest == bindparam("digest"))  # built once (see _USER_CALLER)


def authenticate(session: Session, authorization: str | None) -> Token:
    secret = _bearer(authorization)
    return _valid(session.scalar(TOKEN_BY_DIGEST, {"digest": digest(secret)}))


def _in_workspace(tok: Token, org: Org | None, ws: Workspace | None, org_name: str, ws_name: str) -> Caller:
    """The caller `tok` is in workspace `ws` of `org` (as found by their names; None: no such one)."""
    if tok.kind == "machine" or ws is None or org is None or tok.org_id != org.id or (
            tok.kind != "org_admin" and tok.workspace_id != ws.id):
        raise ApiError(404, "NOT_FOUND", f"workspace {org_name}/{ws_name} not found (or this token has no access)")
    return Caller(tok, org, ws, "admin" if tok.kind == "org_admin" else tok.role)


def workspace_caller(session: Session, tok: Token, org_name: str, ws_name: str) -> Caller:
    row = session.execute(select(Org, Workspace).join(Workspace, Workspace.org_id == Org.id).where(
        Org.name == org_name, Workspace.name == ws_name)).first()  # one statement for both
    return _in_workspace(tok, *(row or (None, None)), org_name, ws_name)


# The statements each API call (and each agent's report) runs, built once, each call binding its values: building
# a statement anew per call (its clauses, their coercions) cost as much CPU as running it.
_USER_CALLER = (select(Token, Org, Workspace).select_from(Token)
                .outerjoin(Org, Org.name == bindparam("org"))
                .outerjoin(Workspace, and_(Workspace.org_id == Org.id, Workspace.name == bindparam("ws")))
                .where(Token.digest == bindparam("digest")))


_USER_CALLER_LOCKING = _USER_CALLER.add_columns(*STATE_LOCK_COLUMNS)


def user_caller(session: Session, authorization: str | None, org_name: str, ws_name: str,
                lock: bool = False) -> Caller:
    """The caller of a workspace's user endpoint from its Authorization header (routers/deps.ws_caller, and the
    group-commit writer for a batch's submits): a machine token is refused. The token, the organisation and the
    workspace are read in one statement (each API call's first round trip, and on PostgreSQL its only one for
    this), with the same refusals in the same order as authenticate() then workspace_caller().

    `lock` (PostgreSQL): the same statement also takes the state lock (state_lock.lock_state's) when it finds the token,
    whether or not the caller is then refused; not found, no lock is taken."""
    secret = _bearer(authorization)
    params = {"org": org_name, "ws": ws_name, "digest": digest(secret)}
    if lock:
        params.update(STATE_LOCK_PARAMS)
    row = session.execute(_USER_CALLER_LOCKING if lock else _USER_CALLER, params).first()
    tok = _valid(row[0] if row is not None else None)
    if tok.kind == "machine":
        raise ApiError(403, "FORBIDDEN", "a machine token cannot call user endpoints")
    return _in_workspace(tok, row[1], row[2], org_name, ws_name)


def org_admin_caller(session: Session, tok: Token, org_name: str) -> Caller:
    org = session.scalar(select(Org).where(Org.name == org_name))
    if org is None or tok.org_id != org.id:
        raise ApiError(404, "NOT_FOUND", f"organisation {org_name} not found (or this token has no access)")
    if tok.kind != "org_admin":
        raise ApiError(403, "FORBIDDEN", "this needs an organisation admin token")
    return Caller(tok, org, None, "admin")


def require(caller: Caller, role: str) -> None:
    if ROLES.index(caller.role or "viewer") < ROLES.index(role):
        raise ApiError(403, "FORBIDDEN", f"this needs the {role} role in workspace {caller.workspace.name}; "
                                         f"this token has the {caller.role} role")


def create_token(session: Session, org: Org, kind: str, workspace: Workspace | None = None, role: str | None = None,
                 cluster: Cluster | None = None, expires_in: float | None = None) -> tuple[Token, str]:
    prefix = {"user": "ast_u_", "org_admin": "ast_o_", "machine": "ast_m_"}[kind]
    secret = prefix + secrets.token_urlsafe(32)
    tok = Token(digest=digest(secret), kind=kind, org_id=org.id, workspace_id=workspace.id if workspace else None,
                role=role, cluster_id=cluster.id if cluster else None,
                expires_at=time.time() + expires_in if expires_in else None)
    session.add(tok)
    session.flush()
    return tok, secret


# ------------------------------------------------------------------------------------------ bootstrap


def ensure_org(session: Session, name: str) -> Org:
    org = session.scalar(select(Org).where(Org.name == name))
    if org is None:
        org = Org(name=name)
        session.add(org)
        session.flush()
    return org


def ensure_cluster(session: Session, org: Org, name: str, preemption: bool = True,
                   lost_after: float | None = None) -> Cluster:
    c = session.scalar(select(Cluster).where(Cluster.org_id == org.id, Cluster.name == name))
    if c is None:
        c = Cluster(org_id=org.id, name=name, preemption=preemption)
        session.add(c)
    if lost_after is not None:
        c.lost_after_seconds = lost_after
    session.flush()
    return c


def ensure_workspace(session: Session, org: Org, name: str) -> Workspace:
    S.check_dns_label(name, "workspace name")
    ws = session.scalar(select(Workspace).where(Workspace.org_id == org.id, Workspace.name == name))
    if ws is None:
        ws = Workspace(org_id=org.id, name=name, ns=new_ns())
        session.add(ws)
        session.flush()
    return ws


def set_access(session: Session, ws: Workspace, cluster: Cluster, **fields) -> Access:
    acc = session.scalar(select(Access).where(Access.workspace_id == ws.id, Access.cluster_id == cluster.id))
    if acc is None:
        acc = Access(workspace_id=ws.id, cluster_id=cluster.id, host_paths=[])
        session.add(acc)
    quota = fields.pop("quota", None)
    if quota is not None:
        for k in ("gpus", "cpu_cores", "memory_bytes", "workers"):
            if k in quota:
                setattr(acc, f"quota_{k}", quota[k])
    for k, v in fields.items():
        if v is not None:
            if k == "host_paths":
                for p in v:
                    S.check_host_path(p)
                v = list(v)
                check_grants(session, ws, cluster, [p for p in v if p not in (acc.host_paths or [])])
            setattr(acc, k, v)
    session.flush()
    return acc


# ----------------------------------------------------------------------------------------------- views


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


PAUSED = "Paused to make room for higher-priority work"


def console_url(base: str, org: str, ws: str, cluster: str, run: str) -> str:
    return f"{base}/o/{org}/w/{ws}/jobs/{cluster}/{run}"


def worker_view(w: Worker, machine_names: dict[int, str] | None = None) -> dict:
    tt = w.run.spec["task_template"]
    mname = None
    if w.machine_id is not None:
        mname = (machine_names or {}).get(w.machine_id) or (w.machine.name if w.machine else None)
    return {
        "name": w.name, "run": w.run.name, "index": w.index, "state": w.state,
        "reason": lifecycle.worker_reason(w, time.time()),
        "restarts": w.restarts, "preemptions": w.preemptions, "exit_code": w.exit_code, "machine": mname,
        "gpu_indices": list(w.gpu_indices or []), "cpu_cores": w.cpu_cores, "memory_bytes": w.memory_bytes,
        "attempt": w.attempt, "pid": w.pid, "image": tt["image"], "environment": w.environment,
        "placed_at": iso(w.placed_at), "started_at": iso(w.started_at), "finished_at": iso(w.finished_at),
        "why_not": [{"machine": m, "reason": r} for m, r in (w.why_not or [])],
    }


HIDDEN = "******"  # what a value the caller may not see reads as (docs/api.md, "Secrets")


def shown_template(tt: dict, role: str | None) -> dict:
    """A task template as `role` may see it: env and config values only for editors and admins, and a value
    marked secret for nobody; the names, mounts and the secret flags stay."""
    reveal = role in ("editor", "admin")
    env = {}
    for k, v in (tt.get("env") or {}).items():
        if isinstance(v, dict):
            env[k] = {**v, "value": HIDDEN if v.get("secret") or not reveal else v.get("value")}
        else:
            env[k] = v if reveal else HIDDEN
    configs = [{**c, "value": HIDDEN if c.get("secret") or not reveal else c.get("value")}
               for c in tt.get("configs") or []]
    return {**tt, "env": env, "configs": configs}


def run_view(run: Run, org: Org, ws: Workspace, cluster: Cluster, base: str, history: list[History] | None = None,
             machine_names: dict[int, str] | None = None, role: str | None = None) -> dict:
    """A run as the API shows it to a caller with `role` (None: as to a viewer; see shown_template)."""
    status = {
        "state": run.state, "reason": lifecycle.run_reason(run, time.time()), "queue_reason": run.queue_reason,
        "workers": [worker_view(w, machine_names) for w in run.workers],
        "preemptions": run.preemptions,
        "restarts": sum(w.restarts for w in run.workers),
        "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
        "console_url": console_url(base, org.name, ws.name, cluster.name, run.name),
    }
    if run.preempted_by and run.state == "Pending":
        status["console_reason"] = PAUSED
    if history is not None:
        status["history"] = [{"time": iso(h.time), "state": h.state, "reason": h.reason} for h in history]
    spec = dict(run.spec)
    spec["cluster"] = cluster.name
    spec["task_template"] = shown_template(spec["task_template"], role)
    return {
        "metadata": {"name": run.name, "labels": run.labels or {}, "uid": run.uid, "workspace": ws.name,
                     "namespace": ws.ns, "cluster": cluster.name, "created_at": iso(run.created_at),
                     # the run template it was made from, and that template's version then (docs/api.md)
                     "template": {"name": run.template, "version": run.template_version} if run.template else None},
        "spec": spec,
        "status": status,
    }


def drive_view(d: Drive, ws: Workspace, cluster: Cluster) -> dict:
    return {"metadata": {"name": d.name, "workspace": ws.name, "namespace": ws.ns, "cluster": cluster.name,
                         "created_at": iso(d.created_at)},
            "spec": d.spec, "status": {"state": "Ready"}}


# ------------------------------------------------------------------------------------------------ runs


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


class InvalidBody(Exception):
    """A body that fails the API's validation, raised below the routers (a template's fields merged into a run's):
    `errors` are pydantic's, `prefix` where the checked part sits in the body. Routers answer it as FastAPI's own
    validation errors are: a 422 naming the first field."""

    def __init__(self, errors: list[dict], prefix: tuple = ()):
        super().__init__(f"invalid body: {errors[:1]}")
        self.errors = [{**e, "loc": (*prefix, *e.get("loc", ()))} for e in errors]


@dataclass
class RunOrigin:
    """What made a run, when it is not a person's POST: a schedule's tick, a replica group, a job array."""

    schedule_id: int | None = None
    group_id: int | None = None
    array_job: str | None = None
    array_index: int | None = None
    array_max_running: int | None = None


def system_caller(session: Session, workspace: Workspace) -> Caller:
    """An editor of `workspace`, for what the control plane does on its behalf (a schedule's tick, a group's
    replacement): every rule a person's submit meets (the priority cap, drives, names) is met the same way."""
    return Caller(token=None, org=session.get(Org, workspace.org_id), workspace=workspace, role="editor")


def find_named(session: Session, caller: Caller, model, name: str):
    """The caller's workspace's object of `model` (a table with workspace_id and name) named `name`, or None."""
    return session.scalar(select(model).where(model.workspace_id == caller.workspace.id, model.name == name))


def get_named(session: Session, caller: Caller, model, name: str, what: str, path: str):
    """As find_named, or 404 NOT_FOUND saying where to list them (`what`: "schedule"; `path`: "schedules")."""
    found = find_named(session, caller, model, name)
    if found is None:
        raise ApiError(404, "NOT_FOUND", f"{what} {name} not found in workspace {caller.workspace.name}: see the "
                                         f"workspace's {what}s with GET $API/{path}")
    return found


def list_named(session: Session, caller: Caller, model) -> list:
    """The caller's workspace's objects of `model`, by name."""
    return list(session.scalars(select(model).where(model.workspace_id == caller.workspace.id).order_by(model.name)))


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


def parse_run_body(body) -> S.RunCreate | None:
    """A run body checked as POST /runs checks it (InvalidBody naming the field), before any lock or statement;
    None when its spec names a template (checked only once the template's fields are merged in, in
    submit_run_body)."""
    from pydantic import ValidationError

    if not isinstance(body, dict):
        raise InvalidBody([{"loc": (), "msg": "the body must be a JSON object", "type": "value_error"}])
    spec = body.get("spec")
    if isinstance(spec, dict) and spec.get("template"):
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
    from astraeus.server import submits

    it = submits.Submit(body, at, caller=caller, columns=columns)
    submits.submit(session, [it])
    if it.error is not None:
        raise it.error
    it.run.cluster_row = it.cluster
    return it.run


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
              after: tuple[float, int] | None = None, limit: int | None = None) -> list[Run]:
    """The workspace's runs, newest first (created_at, then id, descending), with their workers loaded in one
    query more: those in `state`, carrying every label of `labels`, after the sort key `after` (a page's last
    run), at most `limit` (None: all of them). The indexes of revision 0010 make this an index scan."""
    from sqlalchemy.orm import selectinload

    q = select(Run).where(Run.workspace_id == caller.workspace.id, Run.live_key == "")
    if state:
        q = q.where(Run.state == state)
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
    lifecycle.delete(session, run, at)
    delete_logs(session, run)  # and the agent's later lines for it are not stored (agents.store_logs)
    lifecycle.event(session, caller.workspace.id, "RunDeleted", name, f"{name} deleted", at)
    return run, machines


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


# ------------------------------------------------------------------------------------------------ logs
#
# A worker keeps at most `max_bytes` of log text and `max_lines` lines, all its attempts together (the
# server's ASTRAEUS_LOG_MAX_BYTES_PER_WORKER / _LINES_): past either, its oldest lines are deleted, down to 7/8
# of the limits so that a flood trims once in a while rather than on every batch. How many were dropped is
# kept in one row of its own (attempt -1, seq = the count), which goes with the worker's lines.
#
# Whether a worker is past a limit is told by its running count (table log_usage: the lines and bytes stored
# for it, added to by each batch), not by counting its rows: a flood of batches costs one small upsert each.
# The count is a hint: a trim counts the rows exactly (once per 1/8 of the limit) and sets it right.

LOG_LINES_PER_REQUEST = 10_000  # the most lines one POST /agent/logs stores (the agent sends ≤ 1 MiB batches)
DROPPED = -1  # the attempt of a worker's dropped-lines row
INT32 = 2**31 - 1


def _log_bytes(session: Session):
    """SQL for a line's size in bytes (as shown: with its newline; as the stores count it, agents._PG_STORE_LINES
    and agents._SQLITE_ADD_USAGE)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.octet_length(LogLine.text) + 1
    return func.length(cast(LogLine.text, LargeBinary)) + 1


def over_log_limits(usage: dict[int, tuple[int, int]], max_bytes: int, max_lines: int) -> list[int]:
    """The workers whose running count (lines, bytes) is past a limit, by id."""
    return sorted(w for w, (n, b) in usage.items() if n > max_lines or b > max_bytes)


def dialect_insert(session: Session, table):
    """An INSERT of `table` in the session's database's own dialect (for its ON CONFLICT clauses)."""
    return (pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert)(table)


def trim_logs(session: Session, worker_id: int, max_bytes: int, max_lines: int) -> int:
    """Drop a worker's oldest lines while it is over a limit (counted exactly, and its running count set to
    what it keeps); returns how many were dropped."""
    size = _log_bytes(session)
    mine = (LogLine.worker_id == worker_id, LogLine.attempt != DROPPED)
    n, total = session.execute(select(func.count(), func.coalesce(func.sum(size), 0)).where(*mine)).one()
    cut, dropped = None, 0
    if n > max_lines or total > max_bytes:
        keep_lines, keep_bytes = max_lines * 7 // 8, max_bytes * 7 // 8
        for lid, b in session.execute(select(LogLine.id, size).where(*mine).order_by(LogLine.id)
                                      .execution_options(yield_per=5000)):
            if n <= keep_lines and total <= keep_bytes:
                break
            cut, dropped, n, total = lid, dropped + 1, n - 1, total - b
    if cut is not None:
        session.execute(delete(LogLine).where(*mine, LogLine.id <= cut))
        marker = session.scalar(select(LogLine).where(LogLine.worker_id == worker_id, LogLine.attempt == DROPPED))
        if marker is None:
            session.add(LogLine(worker_id=worker_id, attempt=DROPPED, seq=min(dropped, INT32), time=time.time(),
                                stream="stdout", text=""))
        else:
            marker.seq = min(marker.seq + dropped, INT32)
    usage = session.scalar(select(LogUsage).where(LogUsage.worker_id == worker_id))
    if usage is None:
        session.add(LogUsage(worker_id=worker_id, lines=n, bytes=total))
    else:
        usage.lines, usage.bytes = n, total
    session.flush()
    return dropped


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


def logs_dropped_line(session: Session, worker: Worker, max_bytes: int, max_lines: int) -> str | None:
    """`… N earlier lines dropped (log limit 8 MiB)`, shown first when a worker's log was trimmed; else None."""
    n = session.scalar(select(LogLine.seq).where(LogLine.worker_id == worker.id, LogLine.attempt == DROPPED))
    if not n:
        return None
    return f"… {n} earlier lines dropped (log limit {mib(max_bytes)} or {max_lines} lines)"


def read_logs(session: Session, worker: Worker, after_id: int = 0, tail: int | None = None) -> list:
    """The worker's lines after `after_id` (the last `tail` of them), oldest first: rows with .id, .time and
    .text (not ORM objects: a full log is 100,000 of them)."""
    q = select(LogLine.id, LogLine.time, LogLine.text).where(LogLine.worker_id == worker.id,
                                                            LogLine.attempt != DROPPED, LogLine.id > after_id)
    if tail is not None:
        rows = list(session.execute(q.order_by(LogLine.id.desc()).limit(tail)))
        return rows[::-1]
    return list(session.execute(q.order_by(LogLine.id)))


def last_log_id(session: Session, worker: Worker) -> int:
    """The id of the worker's last stored line (0 when it has none): a follower that shows none of them yet
    (`--tail 0`) follows from there."""
    return session.scalar(select(func.max(LogLine.id)).where(LogLine.worker_id == worker.id)) or 0


def delete_logs(session: Session, run: Run) -> int:
    """Remove every log line of a run's workers (the run is being deleted)."""
    ids = [w.id for w in run.workers]
    if not ids:
        return 0
    session.execute(delete(LogUsage).where(LogUsage.worker_id.in_(ids)))
    return session.execute(delete(LogLine).where(LogLine.worker_id.in_(ids))).rowcount or 0


# ---------------------------------------------------------------------------------------------- drives


def create_drive(session: Session, caller: Caller, body: S.DriveCreate, at: float) -> Drive:
    require(caller, "editor")
    cluster, access = _cluster_for(session, caller, None)
    src = body.spec.sources[0]
    granted = access.host_paths or []
    if S.granted_root(src.model_dump(), granted) is None:
        allowed = ", ".join(granted) or "none"
        where = f"in shared filesystem {src.filesystem} " if src.filesystem else ""
        grant = f"; a grant in it is written {src.filesystem}:/path" if src.filesystem else ""
        raise ApiError(403, "HOST_PATH_NOT_GRANTED",
                       f"spec.sources[0].path {src.path} {where}is outside the host paths granted to workspace "
                       f"{caller.workspace.name} on cluster {cluster.name} ({allowed}): use a path under one of them, "
                       f"or ask an organisation admin to grant it (Settings → Clusters → Change → Host paths{grant})")
    name = body.metadata.name
    if session.scalar(select(Drive.id).where(Drive.workspace_id == caller.workspace.id, Drive.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a drive named {name} already exists: choose another metadata.name")
    check_drive_place(session, caller.workspace.id, cluster.id, src.model_dump())
    d = Drive(workspace_id=caller.workspace.id, cluster_id=cluster.id, name=name,
              spec=body.spec.model_dump(mode="json", exclude_none=True), created_at=at)
    session.add(d)
    lifecycle.event(session, caller.workspace.id, "DriveCreated", name,
                    f"drive {name} on {src.where()}", at)
    session.flush()
    return d


def _machine_facts(session: Session, cluster_id: int) -> list[drive_rules.MachineFacts]:
    """The cluster's machines as far as drives' places go: their names and shared filesystems."""
    return [drive_rules.MachineFacts(name=n, shared_filesystems=dict(fs or {})) for n, fs in session.execute(
        select(Machine.name, Machine.shared_filesystems).where(Machine.cluster_id == cluster_id))]


def check_drive_place(session: Session, ws_id: int, cluster_id: int, src: dict) -> None:
    """Refuse a drive folder (a source) of workspace `ws_id` that is inside, equal to or above a drive folder of
    another workspace on the cluster, or that holds a folder granted to another workspace (drives.py says why).
    The message names neither the other workspace nor its drive. Called in the state transaction (tx), so two
    creates racing are checked one after the other."""
    machines = _machine_facts(session, cluster_id)
    mine = drive_rules.source_places(src, machines)
    others = select(Drive.spec).where(Drive.cluster_id == cluster_id, Drive.workspace_id != ws_id)
    grants = select(Access.host_paths).where(Access.cluster_id == cluster_id, Access.workspace_id != ws_id)
    if (any(drive_rules.overlap(mine, drive_rules.source_places(spec["sources"][0], machines))
            for spec in session.scalars(others))
            or any(drive_rules.holds(mine, drive_rules.grant_places(g, machines))
                   for paths in session.scalars(grants) for g in paths or [])):
        where = f" in shared filesystem {src['filesystem']}" if src.get("filesystem") else ""
        raise ApiError(409, "PATH_IN_USE", f"spec.sources[0].path {src['path']}{where} overlaps a folder another "
                                           f"workspace uses; choose a path outside it")


def check_grants(session: Session, ws: Workspace, cluster: Cluster, added: list[str]) -> None:
    """Refuse host paths newly granted to `ws` on `cluster` that lie inside (or are) a drive folder of another
    workspace there. Grants may be shared or nested (drives.py): the drives made in them are what may not overlap.
    An organisation admin asks, so the message names the drive and its workspace."""
    if not added:
        return
    machines = _machine_facts(session, cluster.id)
    rows = session.execute(select(Drive.name, Drive.spec, Workspace.name).join(Workspace, Drive.workspace_id == Workspace.id)
                           .where(Drive.cluster_id == cluster.id, Drive.workspace_id != ws.id).order_by(Drive.id))
    drives = [(name, spec["sources"][0], owner) for name, spec, owner in rows]
    for p in added:
        mine = drive_rules.grant_places(p, machines)
        for name, src, owner in drives:
            if drive_rules.holds(drive_rules.source_places(src, machines), mine):
                raise ApiError(409, "PATH_IN_USE",
                               f"clusters.{cluster.name}.host_paths: {p} overlaps drive {name} of workspace {owner} "
                               f"({S.DriveSource(**src).where()}): grant a folder outside it")


def list_drives(session: Session, caller: Caller) -> list[Drive]:
    return list(session.scalars(select(Drive).where(Drive.workspace_id == caller.workspace.id).order_by(Drive.name)))


def drive_out(session: Session, caller: Caller, d: Drive) -> dict:
    """drive_view for a drive of the caller's workspace."""
    return drive_view(d, caller.workspace, session.get(Cluster, d.cluster_id))


def get_drive(session: Session, caller: Caller, name: str) -> Drive:
    d = session.scalar(select(Drive).where(Drive.workspace_id == caller.workspace.id, Drive.name == name))
    if d is None:
        raise ApiError(404, "NOT_FOUND", f"drive {name} not found in workspace {caller.workspace.name}")
    return d


def delete_drive(session: Session, caller: Caller, name: str, at: float) -> None:
    require(caller, "editor")
    d = get_drive(session, caller, name)
    session.delete(d)
    lifecycle.event(session, caller.workspace.id, "DriveDeleted", name,
                    f"drive {name} deleted; its files stay on {S.DriveSource(**d.spec['sources'][0]).where()}", at)


# -------------------------------------------------------------------------------------------- the rest


def list_events(session: Session, caller: Caller, limit: int = 200) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.workspace_id == caller.workspace.id)
                                .order_by(Event.id.desc()).limit(limit)))


def event_view(e: Event) -> dict:
    return {"time": iso(e.time), "kind": e.kind, "object": e.object, "message": e.message}


def granted_cluster_ids(session: Session, caller: Caller) -> list[int]:
    """The clusters the caller's workspace has access to."""
    return list(session.scalars(select(Access.cluster_id).where(Access.workspace_id == caller.workspace.id)))


def list_machines(session: Session, cluster_ids: list[int], after: tuple[str, int] | None = None,
                  limit: int | None = None) -> list[Machine]:
    """The machines of `cluster_ids` by name (then id: two clusters may share a name), after the sort key `after`
    (a page's last machine), at most `limit` (None: all of them)."""
    q = select(Machine).where(Machine.cluster_id.in_(cluster_ids))
    if after is not None:
        q = q.where(Machine.name >= after[0], or_(Machine.name > after[0], Machine.id > after[1]))
    q = q.order_by(Machine.name, Machine.id)
    if limit is not None:
        q = q.limit(limit)
    return list(session.scalars(q))


def machines_view(session: Session, cluster_ids: list[int], machines: list[Machine] | None = None) -> list[dict]:
    """The views of `machines` (of `cluster_ids`; None: every machine of them, by name)."""
    if machines is None:
        machines = list_machines(session, cluster_ids)
    counts: dict[int, int] = {}
    q = select(Worker.machine_id, Worker.gpu_indices).where(Worker.state.in_(lifecycle.ACTIVE))
    if len(machines) <= 1000:
        q = q.where(Worker.machine_id.in_([m.id for m in machines]))
    for mid, idx in session.execute(q):
        counts[mid] = counts.get(mid, 0) + len(idx or [])
    out = []
    names = dict(session.execute(select(Cluster.id, Cluster.name)).all())
    in_pools: dict[tuple[int, str], list[str]] = {}  # (cluster id, machine) -> the pools it is in
    from astraeus.server.pools import pool_members

    for p in session.scalars(select(Pool).where(Pool.cluster_id.in_(cluster_ids)).order_by(Pool.name)):
        for n in pool_members(p, [m for m in machines if m.cluster_id == p.cluster_id]):
            in_pools.setdefault((p.cluster_id, n), []).append(p.name)
    for m in machines:
        u = counts.get(m.id, 0)
        out.append({"name": m.name, "cluster": names.get(m.cluster_id), "state": m.state, "gpus": m.gpus,
                    "pools": in_pools.get((m.cluster_id, m.name), []),
                    "gpus_used": u, "gpus_free": max(0, m.gpus - u) if m.state == "Ready" else 0,
                    "gpu_models": m.gpu_models, "cpu_cores": m.cpu_cores, "memory_bytes": m.memory_bytes,
                    "stop_grace_seconds": m.stop_grace_seconds, "labels": m.labels, "runtime": m.runtime,
                    "address": m.address, "shared_filesystems": m.shared_filesystems or {},
                    "nfs": m.nfs or {"server": None, "client": False, "rdma": False},
                    **_disk_view(m), "last_heartbeat": iso(m.last_heartbeat)})
    return out


def _disk_view(m: Machine) -> dict:
    """A machine's disk (its agent's state dir's filesystem; None from an older agent) and why it takes no new
    workers (None: it does, or it is Lost, which its state says)."""
    from astraeus.server.diskfull import PRESSURE_BELOW, disk_pressure

    disk = None if m.disk_total_bytes is None else {
        "path": m.disk_path, "free_bytes": m.disk_free_bytes, "total_bytes": m.disk_total_bytes,
        "free_percent": round(100 * (m.disk_free_bytes or 0) / m.disk_total_bytes, 1) if m.disk_total_bytes else None}
    reason = disk_pressure(m.disk_path, m.disk_free_bytes, m.disk_total_bytes, PRESSURE_BELOW) \
        if m.state == "Ready" else None
    return {"schedulable": m.state == "Ready" and reason is None, "reason": reason, "disk": disk}


def workspace_view(session: Session, caller: Caller, base: str) -> dict:
    rows = session.execute(select(Cluster, Access).join(Access, Access.cluster_id == Cluster.id)
                           .where(Access.workspace_id == caller.workspace.id).order_by(Cluster.id)).all()
    return {
        "name": caller.workspace.name, "id": caller.workspace.ns, "org": caller.org.name, "role": caller.role,
        "console_url": f"{base}/o/{caller.org.name}/w/{caller.workspace.name}",
        "clusters": [access_view(c, a) for c, a in rows],
    }


def access_view(c: Cluster, a: Access) -> dict:
    return {"name": c.name, "max_priority": a.max_priority, "weight": a.weight, "host_paths": a.host_paths or [],
            "host_network": bool(a.host_network), "preemption": c.preemption, "pools": list(a.pools) if a.pools is not None else None,
            "quota": {"gpus": a.quota_gpus, "cpu_cores": a.quota_cpu_cores, "memory_bytes": a.quota_memory_bytes,
                      "workers": a.quota_workers}}
