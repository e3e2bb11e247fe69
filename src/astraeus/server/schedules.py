"""A workspace's schedules (docs/api.md, "Schedules"): a cron line and a run to make at each tick, as Kubernetes'
CronJobs, but exactly once per tick.

The body is `{"metadata": {"name"}, "spec": {"schedule": "0 2 * * *", "timezone": "Europe/Berlin", "concurrency":
"Allow"|"Forbid"|"Replace", "starting_deadline_seconds": 600, "suspend": false, "run": {…a run's spec, which may
name a "template"…}}}`. The run part is checked when the schedule is made or changed exactly as a run submitted
then would be (its template merged in: unknown fields and bad values are a 422 naming `spec.run.…`, a template or
drive that does not exist a 4xx, a priority above the workspace's maximum 403 PRIORITY_NOT_ALLOWED), so that a
schedule does not find out at 2 a.m.

The ticks (astraeus.schedules says when they are, across time zones and DST) are made by the scheduling leader
(`make_ticks`, called from the loop's cycle): each tick is one transaction, fenced by the lease, that inserts the
tick's row (unique per schedule and tick) together with what the tick did (the run `<schedule>-<YYYYMMDDHHMM>`,
or why none was made), so a tick makes one run, never two and never none, across restarts and replicas.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from astraeus import schedules as P
from astraeus import spec as S
from astraeus.server import lifecycle, services, submits
from astraeus.server.db import Run, Schedule, ScheduleTick, Workspace
from astraeus.server.leader import fence
from astraeus.server.services import ApiError, Caller, InvalidBody, iso, require
from astraeus.server.state_lock import STATE_LOCK

log = logging.getLogger("astraeus.schedules")

NAME_MAX = 63 - 13  # the run is <schedule>-<YYYYMMDDHHMM>, a DNS label of at most 63
TICKS_SHOWN = 10


class ScheduleMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The schedule's name; its runs are named <name>-<YYYYMMDDHHMM>")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        S.check_dns_label(v, "schedule name")
        if len(v) > NAME_MAX:
            raise ValueError(f"schedule name {v!r} is {len(v)} characters: use at most {NAME_MAX}, so that its runs' "
                             "names (<name>-<YYYYMMDDHHMM>) stay within 63")
        return v


class ScheduleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schedule: str = Field(description="A cron line of five fields, on the time zone's wall clock: '0 2 * * *'")
    timezone: str = Field("UTC", description="An IANA time zone name: 'Europe/Berlin'")
    concurrency: Literal["Allow", "Forbid", "Replace"] = Field(
        "Allow", description="While the previous run has not ended: Allow another, Forbid (skip the tick) or "
                             "Replace (delete it)")
    starting_deadline_seconds: Annotated[int, Field(ge=1, le=31 * 86400)] = Field(
        600, description="A tick missed by more than this (the control plane was down) is skipped, with an event")
    suspend: bool = Field(False, description="While true, no tick makes a run (nor is caught up later)")
    run: dict[str, Any] = Field(description="A run's spec (as POST /runs' `spec`), which may name a `template`")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        return P.check_cron(v)

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        P.check_timezone(v)
        return v


class ScheduleBody(BaseModel):
    """POST $API/schedules and PUT $API/schedules/NAME."""

    model_config = ConfigDict(extra="forbid")

    metadata: ScheduleMetadata
    spec: ScheduleSpec


# --------------------------------------------------------------------------------------------- checks


def _run_errors(errors: list[dict]) -> list[dict]:
    """A run body's errors (locations from its top: ("spec", …)) as the schedule's: ("spec", "run", …)."""
    out = []
    for e in errors:
        loc = tuple(e.get("loc", ()))
        if loc[:1] == ("spec",):
            loc = loc[1:]
        out.append({**e, "loc": ("spec", "run", *loc)})
    return out


def check_run(session: Session, caller: Caller, name: str, run: dict[str, Any]) -> S.RunCreate:
    """The schedule's run as a tick would submit it now: its template merged in (submits.resolve_template), then
    what a submit checks (its fields, the priority cap, its drives). Raises InvalidBody / ApiError naming
    `spec.run.…`."""
    try:
        spec, _ = submits.resolve_template(session, caller, run)
    except InvalidBody as e:
        raise InvalidBody(_run_errors(e.errors)) from None
    except ApiError as e:
        if e.code == "TEMPLATE_NOT_FOUND":
            raise ApiError(e.status, e.code, e.message.replace("spec.template:", "spec.run.template:", 1)) from None
        raise
    try:
        parsed = S.RunCreate.model_validate({"metadata": {"name": f"{name}-000000000000"}, "spec": spec})
    except ValidationError as e:
        raise InvalidBody(_run_errors(e.errors())) from None
    _, access = services._cluster_for(session, caller, parsed.spec.cluster)
    submits.check_made(session, caller, access, parsed.spec.priority,
                       [ref.name for ref in parsed.spec.task_template.datavolume_refs],
                       "spec.run.task_template.datavolume_refs[{i}]")
    return parsed


def _next(spec: dict[str, Any], at: float) -> float | None:
    """The schedule's next tick after `at`, or None while it is suspended."""
    if spec.get("suspend"):
        return None
    return P.next_tick(spec["schedule"], spec.get("timezone") or "UTC", at).at


# ----------------------------------------------------------------------------------------------- CRUD


def _find(session: Session, caller: Caller, name: str) -> Schedule | None:
    return services.find_named(session, caller, Schedule, name)


def get(session: Session, caller: Caller, name: str) -> Schedule:
    return services.get_named(session, caller, Schedule, name, "schedule", "schedules")


def listed(session: Session, caller: Caller) -> list[Schedule]:
    return services.list_named(session, caller, Schedule)


def create(session: Session, caller: Caller, body: ScheduleBody, at: float) -> Schedule:
    require(caller, "editor")
    name = body.metadata.name
    check_run(session, caller, name, body.spec.run)
    if _find(session, caller, name) is not None:
        raise ApiError(409, "ALREADY_EXISTS",
                       f"a schedule named {name} already exists in workspace {caller.workspace.name}: choose another "
                       f"metadata.name, or change it with PUT $API/schedules/{name}")
    spec = body.spec.model_dump(mode="json")
    sc = Schedule(workspace_id=caller.workspace.id, name=name, spec=spec, created_at=at, updated_at=at,
                  created_by=caller.user, updated_by=caller.user,
                  last_tick=None, next_tick=_next(spec, at))
    session.add(sc)
    lifecycle.event(session, caller.workspace.id, "ScheduleCreated", name, f"schedule {name} created: "
                    f"{_describe(spec)}{_next_text(sc)}", at)
    session.flush()
    return sc


def replace(session: Session, caller: Caller, name: str, body: ScheduleBody, at: float) -> Schedule:
    """PUT: the schedule's spec becomes the body's. Its next tick is counted from now: ticks between its last one
    and now under the new line are not caught up."""
    require(caller, "editor")
    if body.metadata.name != name:
        raise InvalidBody([{"loc": ("metadata", "name"), "type": "value_error",
                            "msg": f"{body.metadata.name} is not the schedule in the path ({name}): a schedule keeps "
                                   "its name; to rename one, create the new one and delete the old"}])
    sc = get(session, caller, name)
    check_run(session, caller, name, body.spec.run)
    spec = body.spec.model_dump(mode="json")
    sc.spec, sc.updated_at, sc.next_tick = spec, at, _next(spec, at)
    sc.updated_by = caller.user
    lifecycle.event(session, caller.workspace.id, "ScheduleChanged", name,
                    f"schedule {name} changed: {_describe(spec)}{_next_text(sc)}", at)
    session.flush()
    return sc


def delete(session: Session, caller: Caller, name: str, at: float) -> None:
    """Delete the schedule and its ticks' records; the runs it made stay (delete them as any run)."""
    require(caller, "editor")
    sc = get(session, caller, name)
    for t in session.scalars(select(ScheduleTick).where(ScheduleTick.schedule_id == sc.id)):
        session.delete(t)
    session.delete(sc)
    lifecycle.event(session, caller.workspace.id, "ScheduleDeleted", name,
                    f"schedule {name} deleted; the runs it made stay", at)
    session.flush()


def _describe(spec: dict[str, Any]) -> str:
    s = f"'{spec['schedule']}' in {spec.get('timezone') or 'UTC'}, concurrency {spec.get('concurrency', 'Allow')}"
    return s + (" (suspended)" if spec.get("suspend") else "")


def _next_text(sc: Schedule) -> str:
    if sc.next_tick is None:
        return ""
    return f"; next tick {P.tick_name(sc.next_tick, P.check_timezone(sc.spec.get('timezone') or 'UTC'))}"


# ----------------------------------------------------------------------------------------------- view


def _shown_run(run: dict[str, Any], role: str | None) -> dict[str, Any]:
    tt = run.get("task_template")
    if not isinstance(tt, dict):
        return run
    shown = services.shown_template(tt, role)
    return {**run, "task_template": {**tt, **{k: shown[k] for k in ("env", "configs") if k in tt}}}


def tick_view(t: ScheduleTick) -> dict[str, Any]:
    return {"tick": t.tick, "at": iso(t.at), "outcome": t.outcome, "run": t.run_name, "message": t.message,
            "handled_at": iso(t.handled_at)}


def view(session: Session, sc: Schedule, caller: Caller, full: bool = True) -> dict[str, Any]:
    """The schedule as the API shows it: its spec (env values hidden as a run's are), its last and next ticks,
    and (`full`) its runs and latest ticks."""
    tz = P.check_timezone(sc.spec.get("timezone") or "UTC")
    last = session.scalar(select(ScheduleTick).where(ScheduleTick.schedule_id == sc.id)
                          .order_by(ScheduleTick.at.desc(), ScheduleTick.id.desc()).limit(1))
    status: dict[str, Any] = {
        "suspended": bool(sc.spec.get("suspend")),
        "last_tick": tick_view(last) if last else None,
        "next_tick": ({"tick": P.tick_name(sc.next_tick, tz), "at": iso(sc.next_tick)}
                      if sc.next_tick is not None else None),
    }
    runs = list(session.scalars(select(Run).where(Run.schedule_id == sc.id, Run.live_key == "")
                                .order_by(Run.created_at.desc(), Run.id.desc())))
    status["active"] = [r.name for r in runs if r.state not in lifecycle.RUN_ENDED]
    if full:
        status["runs"] = [{"name": r.name, "state": r.state, "created_at": iso(r.created_at),
                           "finished_at": iso(r.finished_at)} for r in runs]
        status["ticks"] = [tick_view(t) for t in session.scalars(
            select(ScheduleTick).where(ScheduleTick.schedule_id == sc.id)
            .order_by(ScheduleTick.at.desc(), ScheduleTick.id.desc()).limit(TICKS_SHOWN))]
    return {"metadata": {"name": sc.name, "workspace": caller.workspace.name, "namespace": caller.workspace.ns,
                         "created_at": iso(sc.created_at), "updated_at": iso(sc.updated_at),
                         **services.made_by(sc)},
            "spec": {**sc.spec, "run": _shown_run(sc.spec.get("run") or {}, caller.role)},
            "status": status}


# ------------------------------------------------------------------------------------ the leader's duty


def tick_after(after: float) -> Select:
    """The earliest next tick of any schedule after `after`, as a statement (read in the scheduling loop's one read
    of everything due next, loop.next_due_at)."""
    return select(func.min(Schedule.next_tick)).where(Schedule.next_tick > after)


def due(at: float) -> Select:
    """The schedules with a tick due at `at` (make_ticks handles them), as a statement."""
    return select(Schedule.id).where(Schedule.next_tick.is_not(None), Schedule.next_tick <= at)


def make_ticks(cp, term, lease: float | None, at: float) -> set[int]:
    """The scheduling leader's duty: handle every schedule's ticks up to `at` (see astraeus.schedules for which
    are due and which missed). Each tick is its own transaction, fenced by `term` (NotLeader ends the pass, and
    nothing of that tick is written). Returns the machines to notify (a Replace stops the previous run's
    workers)."""
    touched: set[int] = set()
    with cp.sessions() as session:
        due = [(sc.id, dict(sc.spec), sc.next_tick) for sc in session.scalars(
            select(Schedule).where(Schedule.next_tick.is_not(None), Schedule.next_tick <= at).order_by(Schedule.id))]
    made = False
    for sid, spec, first in due:
        try:
            plan = P.due(spec["schedule"], spec.get("timezone") or "UTC", first, at,
                         spec.get("starting_deadline_seconds") or 600)
        except ValueError as e:  # cannot happen for a checked spec; never stop the other schedules for it
            log.error("schedule %s: %s", sid, e)
            continue
        cursor = first
        if plan.missed is not None:
            following = plan.due[0].at if plan.due else plan.next.at
            if not _skip_missed(cp, term, lease, sid, cursor, plan.missed, following, spec, at):
                continue
            cursor = following
        for i, tick in enumerate(plan.due):
            following = plan.due[i + 1].at if i + 1 < len(plan.due) else plan.next.at
            done, machines, created = _tick(cp, term, lease, sid, cursor, tick, following, at)
            touched |= machines
            made = made or created
            if not done:
                break
            cursor = following
    if made:
        cp.notifier.wake_scheduler()  # the loop's cycle plans right after; called elsewhere, the runs are placed soon
    return touched


@contextmanager
def _begin(cp, term, lease):
    """A fenced state change: committed when the block ends normally, else nothing of it is written."""
    with STATE_LOCK, cp.sessions() as session, session.begin():
        fence(session, term, lease)
        yield session


def _current(session: Session, sid: int, cursor: float) -> Schedule | None:
    """The schedule, if it still waits for the tick at `cursor` (else it was changed, deleted, or handled)."""
    sc = session.get(Schedule, sid)
    if sc is None or sc.next_tick is None or sc.next_tick != cursor:
        return None
    return sc


def _skip_missed(cp, term, lease, sid: int, cursor: float, missed: P.Missed, following: float, spec: dict,
                 at: float) -> bool:
    deadline = spec.get("starting_deadline_seconds") or 600
    message = missed.describe(deadline)
    try:
        with _begin(cp, term, lease) as session:
            sc = _current(session, sid, cursor)
            if sc is None:
                return False
            if session.scalar(select(ScheduleTick.id).where(ScheduleTick.schedule_id == sid,
                                                            ScheduleTick.tick == missed.last.name)) is None:
                session.add(ScheduleTick(schedule_id=sid, tick=missed.last.name, at=missed.last.at,
                                         outcome="Skipped", run_name=None, message=message, handled_at=at))
            lifecycle.event(session, sc.workspace_id, "ScheduleTicksMissed", sc.name,
                            f"schedule {sc.name}: {message}", at)
            sc.last_tick, sc.next_tick = missed.last.at, following
    except IntegrityError:
        return False
    return True


def _active_runs(session: Session, sid: int) -> list[Run]:
    return list(session.scalars(select(Run).where(Run.schedule_id == sid, Run.live_key == "",
                                                  Run.state.not_in(lifecycle.RUN_ENDED)).order_by(Run.id)))


def _tick(cp, term, lease, sid: int, cursor: float, tick: P.Tick, following: float,
          at: float) -> tuple[bool, set[int], bool]:
    """Handle one tick in one fenced transaction: its row and its run (or why none) together. Returns whether
    it was handled (or had been already), the machines to notify, and whether a run was made."""
    touched: set[int] = set()
    refused: tuple[str, str] | None = None
    try:
        with _begin(cp, term, lease) as session:
            sc = _current(session, sid, cursor)
            if sc is None:
                return False, touched, False
            if session.scalar(select(ScheduleTick.id).where(ScheduleTick.schedule_id == sid,
                                                            ScheduleTick.tick == tick.name)) is not None:
                sc.next_tick = following  # handled already (by this replica before a restart, or another)
                return True, touched, False
            ws = session.get(Workspace, sc.workspace_id)
            caller = services.system_caller(session, ws)
            spec = sc.spec
            policy = spec.get("concurrency") or "Allow"
            name = f"{sc.name}-{tick.name}"
            active = _active_runs(session, sid)
            sc.last_tick, sc.next_tick = tick.at, following
            if policy == "Forbid" and active:
                msg = (f"tick {tick.name} skipped: {', '.join(r.name for r in active)} "
                       f"{'is' if len(active) == 1 else 'are'} still {active[0].state} (concurrency Forbid)")
                session.add(ScheduleTick(schedule_id=sid, tick=tick.name, at=tick.at, outcome="Skipped",
                                         run_name=None, message=msg, handled_at=at))
                lifecycle.event(session, sc.workspace_id, "ScheduleTickSkipped", sc.name,
                                f"schedule {sc.name}: {msg}", at)
                return True, touched, False
            if policy == "Replace":
                for r in active:
                    if r.deleting:
                        continue
                    was = r.state
                    _, machines = services.delete_run(session, caller, r.name, at)
                    touched |= {m for m in machines if m}
                    lifecycle.event(session, sc.workspace_id, "ScheduleRunReplaced", sc.name,
                                    f"schedule {sc.name}: tick {tick.name} deleted {r.name} (still {was}; "
                                    "concurrency Replace)", at)
            try:
                submits.submit_run_body(session, caller, {"metadata": {"name": name}, "spec": spec["run"]}, at,
                                         submits.RunOrigin(schedule_id=sid))
            except ApiError as e:
                refused = (e.code, e.message)
                raise
            except InvalidBody as e:
                first = e.errors[0] if e.errors else {}
                loc = ".".join(str(x) for x in first.get("loc", ()))
                refused = ("INVALID", f"{loc}: {first.get('msg', 'invalid')}")
                raise
            msg = f"tick {tick.name}: run {name} submitted"
            session.add(ScheduleTick(schedule_id=sid, tick=tick.name, at=tick.at, outcome="Created", run_name=name,
                                     message=msg, handled_at=at))
            lifecycle.event(session, sc.workspace_id, "ScheduleTick", sc.name, f"schedule {sc.name}: {msg}", at)
    except IntegrityError:
        return False, set(), False  # the tick's row exists: another replica handled it meanwhile
    except (ApiError, InvalidBody):
        pass
    else:
        return True, touched, True
    # The run was refused (nothing of that transaction was written): record the tick as Refused, with why.
    code, why = refused or ("", "")
    if code == "PRIORITY_NOT_ALLOWED":
        why = (f"{why} (the workspace's maximum was lowered after the schedule was made): the run was not "
               "submitted, and is never submitted at a lower priority; lower the schedule's priority, or ask an "
               "organisation admin to raise the maximum")
    try:
        with _begin(cp, term, lease) as session:
            sc = _current(session, sid, cursor)
            if sc is None:
                return False, set(), False
            msg = f"tick {tick.name} refused: {code} {why}".replace("  ", " ")
            session.add(ScheduleTick(schedule_id=sid, tick=tick.name, at=tick.at, outcome="Refused",
                                     run_name=None, message=msg, handled_at=at))
            lifecycle.event(session, sc.workspace_id, "ScheduleTickRefused", sc.name, f"schedule {sc.name}: {msg}",
                            at)
            sc.last_tick, sc.next_tick = tick.at, following
    except IntegrityError:
        return False, set(), False
    return True, set(), False
