"""Reservations: machines of one cluster kept for some workspaces from a start to an end (or no end).

An organisation admin reserves machines by name, or `count` machines of a pool (chosen when it is made, in name
order, among those no other reservation holds in that window). The scheduler keeps others' runs off them in the
window and stops others' work still there when it opens (scheduler rules; the loop gives it the reservations not
yet ended). The leader writes each window's ReservationStarted / ReservationEnded events once (`open_and_close`)
and wakes at the next start or end (`changes_after`, read by the scheduling loop). routers/reservations.py and the console only call these.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from astraeus.server import bodies as B
from astraeus.server import lifecycle
from astraeus.server import pools as pool_rules
from astraeus.server.db import Access, Cluster, Machine, Pool, Reservation, Workspace
from astraeus.server.services.auth import Caller
from astraeus.server.services.errors import ApiError
from astraeus.server.services.views import iso

SCHEDULED, ACTIVE, ENDED = "Scheduled", "Active", "Ended"


def parse_time(value: str | None, field: str, default: float) -> float:
    """An ISO 8601 time ("2026-12-01T10:00:00Z"; without a zone it is UTC) as epoch seconds; None: `default`."""
    if value is None:
        return default
    try:
        t = datetime.fromisoformat(value.strip().replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise ApiError(422, "INVALID", f"{field}: {value[:64]!r} is not an ISO 8601 time: write it as "
                                       "2026-12-01T10:00:00Z") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def state(r: Reservation, at: float) -> str:
    if r.end_at is not None and r.end_at <= at:
        return ENDED
    return ACTIVE if r.start_at <= at else SCHEDULED


def ended(r: Reservation, at: float) -> bool:
    return r.end_at is not None and r.end_at <= at


def reservation_view(s: Session, r: Reservation, at: float | None = None) -> dict:
    import time

    at = time.time() if at is None else at
    names = dict(s.execute(select(Workspace.id, Workspace.name).where(Workspace.id.in_(r.workspaces or []))).all())
    return {"name": r.name, "cluster": s.get(Cluster, r.cluster_id).name,
            "workspaces": [names[w] for w in r.workspaces or [] if w in names],
            "machines": list(r.machines or []), "pool": r.pool, "count": r.count,
            "start": iso(r.start_at), "end": iso(r.end_at), "state": state(r, at),
            "created_at": iso(r.created_at), "created_by": r.created_by, "updated_by": r.updated_by}


def _named(s: Session, c: Caller, name: str) -> Reservation:
    r = s.scalar(select(Reservation).where(Reservation.org_id == c.org.id, Reservation.name == name))
    if r is None:
        raise ApiError(404, "NOT_FOUND", f"reservation {name} not found: see the organisation's reservations "
                                         "with GET $ORG_API/reservations")
    return r


def list_reservations(s: Session, c: Caller) -> list[dict]:
    rows = s.scalars(select(Reservation).where(Reservation.org_id == c.org.id)
                     .order_by(Reservation.start_at, Reservation.name))
    return [reservation_view(s, r) for r in rows]


def get_reservation(s: Session, c: Caller, name: str) -> dict:
    return reservation_view(s, _named(s, c, name))


def workspace_reservations(s: Session, c: Caller) -> list[dict]:
    """GET $API/reservations: the reservations for the caller's workspace only."""
    rows = s.scalars(select(Reservation).where(Reservation.org_id == c.org.id)
                     .order_by(Reservation.start_at, Reservation.name))
    return [reservation_view(s, r) for r in rows if c.workspace.id in (r.workspaces or [])]


def _overlaps(r: Reservation, start: float, end: float | None) -> bool:
    return r.start_at < (end if end is not None else float("inf")) and start < (
        r.end_at if r.end_at is not None else float("inf"))


def _held(r: Reservation) -> str:
    return f"{r.name} from {iso(r.start_at)} to {iso(r.end_at) or 'no end'}"


def create_reservation(s: Session, c: Caller, body, at: float) -> dict:
    body = pool_rules._parsed(B.ReservationCreate, body)
    name = body["name"]
    cl = s.scalar(select(Cluster).where(Cluster.org_id == c.org.id, Cluster.name == body["cluster"]))
    if cl is None:
        raise ApiError(404, "CLUSTER_NOT_FOUND", f"cluster {body['cluster']} not found")
    old = s.scalar(select(Reservation).where(Reservation.org_id == c.org.id, Reservation.name == name))
    if old is not None and not ended(old, at):
        raise ApiError(409, "ALREADY_EXISTS", f"a reservation named {name} already exists: choose another name, "
                                              "or delete it first")
    ws_ids = []
    for wname in dict.fromkeys(body["workspaces"]):
        ws = s.scalar(select(Workspace).where(Workspace.org_id == c.org.id, Workspace.name == wname))
        if ws is None:
            raise ApiError(422, "INVALID", f"workspaces: no workspace named {wname}")
        if s.scalar(select(Access.id).where(Access.workspace_id == ws.id, Access.cluster_id == cl.id)) is None:
            raise ApiError(422, "INVALID", f"workspaces: workspace {wname} has no access to cluster {cl.name}")
        ws_ids.append(ws.id)
    machines, pool, count = body.get("machines"), body.get("pool"), body.get("count")
    if bool(machines) == bool(pool) or (machines and count is not None):
        raise ApiError(422, "INVALID", "machines: give machines, or pool and count")
    if pool and count is None:
        raise ApiError(422, "INVALID", f"count: give how many machines of pool {pool} to reserve")
    start = parse_time(body.get("start"), "start", at)
    end = parse_time(body.get("end"), "end", at) if body.get("end") is not None else None
    if end is not None and end <= at:
        raise ApiError(422, "INVALID", f"end: {iso(end)} is in the past")
    if end is not None and end <= start:
        raise ApiError(422, "INVALID", f"end: must be after start ({iso(start)})")
    others = [r for r in s.scalars(select(Reservation).where(Reservation.cluster_id == cl.id))
              if not ended(r, at) and r.name != name and _overlaps(r, start, end)]

    def holder(machine: str) -> Reservation | None:
        return next((r for r in sorted(others, key=lambda r: r.start_at) if machine in (r.machines or [])), None)

    known = {m.name for m in pool_rules.cluster_machines(s, cl.id)}
    if machines:
        machines = list(dict.fromkeys(machines))
        for m in machines:
            if m not in known:
                raise ApiError(422, "INVALID", f"machines: no machine named {m} in cluster {cl.name}")
        for m in machines:
            h = holder(m)
            if h is not None:
                raise ApiError(409, "RESERVATION_CONFLICT", f"machine {m} is already reserved by {_held(h)}")
    else:
        p = s.scalar(select(Pool).where(Pool.cluster_id == cl.id, Pool.name == pool))
        if p is None:
            raise ApiError(422, "INVALID", f"pool: no pool named {pool} in cluster {cl.name}")
        members = pool_rules.pool_members(p, pool_rules.cluster_machines(s, cl.id))
        if count > len(members):
            raise ApiError(422, "INVALID", f"count: pool {pool} has {len(members)} machines, {count} asked")
        free = [m for m in members if holder(m) is None]
        if len(free) < count:
            taken = next(m for m in members if holder(m) is not None)
            raise ApiError(409, "RESERVATION_CONFLICT",
                           f"pool {pool} has {len(free)} machines free in that window, {count} asked: machine "
                           f"{taken} is already reserved by {_held(holder(taken))}")
        machines = free[:count]
    if old is not None:
        s.delete(old)  # an ended reservation's name may be used again
        s.flush()
    r = Reservation(org_id=c.org.id, cluster_id=cl.id, name=name, workspaces=ws_ids, machines=machines,
                    pool=pool, count=count, start_at=start, end_at=end, opened=False, closed=False, created_at=at,
                    created_by=c.user, updated_by=c.user)
    s.add(r)
    s.flush()
    return reservation_view(s, r, at)


def _ended_event(s: Session, r: Reservation, at: float) -> None:
    for wid in r.workspaces or []:
        lifecycle.event(s, wid, "ReservationEnded", r.name,
                        f"Reservation {r.name} ended: {', '.join(r.machines or [])} no longer reserved for this "
                        "workspace", at)


def delete_reservation(s: Session, c: Caller, name: str, at: float) -> dict:
    """End it now (a reservation not yet started ends before it starts): ReservationEnded if it had opened."""
    r = _named(s, c, name)
    if not ended(r, at):
        r.end_at = at
        if r.opened and not r.closed:
            _ended_event(s, r, at)
        r.opened = r.closed = True
        s.flush()
    return reservation_view(s, r, at)


def open_and_close(session: Session, at: float) -> set[int]:
    """Leader duty: each reservation whose window opened writes ReservationStarted, and each whose window closed
    ReservationEnded, once, to each reserved workspace. Returns the ids of those reservations' machines."""
    touched: set[int] = set()
    rows = session.scalars(select(Reservation).where(Reservation.closed.is_(False), or_(
        Reservation.opened.is_(False) & (Reservation.start_at <= at),
        Reservation.end_at <= at)))
    for r in rows:
        changed = False
        if not r.opened and r.start_at <= at and not ended(r, at):
            until = iso(r.end_at) or "no end"
            for wid in r.workspaces or []:
                lifecycle.event(session, wid, "ReservationStarted", r.name,
                                f"Reservation {r.name} started: {', '.join(r.machines or [])} reserved for this "
                                f"workspace until {until}", at)
            r.opened = changed = True
        if ended(r, at):
            if r.opened:
                _ended_event(session, r, at)
            r.opened = r.closed = changed = True
        if changed:
            touched.update(session.scalars(select(Machine.id).where(Machine.cluster_id == r.cluster_id,
                                                                    Machine.name.in_(r.machines or []))))
    session.flush()
    return touched


def changes_after(at: float) -> tuple[Select, Select]:
    """The earliest window's opening and the earliest closing after `at`, as two statements (read in the scheduling
    loop's one read of everything due next, loop.next_due_at)."""
    return (select(func.min(Reservation.start_at)).where(
        Reservation.opened.is_(False), Reservation.closed.is_(False), Reservation.start_at > at),
        select(func.min(Reservation.end_at)).where(Reservation.closed.is_(False), Reservation.end_at > at))


def due(at: float) -> Select:
    """The reservations open_and_close has something to write for (a statement: loop.timers_due asks whether any)."""
    return select(Reservation.id).where(Reservation.closed.is_(False), or_(
        Reservation.opened.is_(False) & (Reservation.start_at <= at), Reservation.end_at <= at))




def check_run(s: Session, caller: Caller, cluster: Cluster, name: str, at: float) -> None:
    """A run's node_selection.reservation: a reservation for the caller's workspace on the cluster, not ended."""
    field = "spec.task_template.requested_resources.node_selection.reservation"
    r = s.scalar(select(Reservation).where(Reservation.org_id == caller.org.id, Reservation.name == name,
                                           Reservation.cluster_id == cluster.id))
    if r is None or caller.workspace.id not in (r.workspaces or []):
        raise ApiError(422, "INVALID", f"{field}: no reservation named {name} for workspace {caller.workspace.name} "
                                       f"on cluster {cluster.name}")
    if ended(r, at):
        raise ApiError(422, "INVALID", f"{field}: reservation {name} ended at {iso(r.end_at)}")
