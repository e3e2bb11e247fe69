"""The organisation's audit log, oldest first, a page at a time (server/audit.py). Read-only: no route changes or
removes an entry. Organisation admins only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import Field

from astraeus.server import answers as A
from astraeus.server import audit
from astraeus.server import bodies as B
from astraeus.server.routers.deps import AdminCaller, Sess
from astraeus.server.routers.events import PAGE_DEFAULT, Cursor, Limit, decode_cursor, page
from astraeus.server.services import ApiError

router = APIRouter(prefix="/api/v1/o/{org}", tags=["organisation"], responses=B.ERRORS)


class AuditOut(A.Out):
    id: int
    time: A.Time
    user: str | None = Field(description="who: a user, service:NAME, token:ID (no owner), null (no valid token)")
    workspace: str | None
    action: str = Field(description="create | update | delete | an action on an object (cancel, hold…)")
    method: str
    path: str
    object: str
    address: str | None
    status: int
    allowed: bool


class AuditPage(A.Out):
    items: list[AuditOut]
    next_cursor: str | None


def _since(value: str | None) -> float | None:
    """`since`: epoch seconds, an ISO time (2030-01-01T00:00:00Z) or an age (30m, 12h, 7d)."""
    if value is None or value == "":
        return None
    import time
    from datetime import datetime

    try:
        if value[-1] in "smhd" and value[:-1].replace(".", "", 1).isdigit():
            return time.time() - float(value[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[value[-1]]
        if value.replace(".", "", 1).isdigit():
            return float(value)
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ApiError(422, "INVALID", f"since: {value!r} is not a time: give 7d, 12h, 30m, epoch seconds or "
                                       "2030-01-01T00:00:00Z") from None


@router.get("/audit", response_model=AuditPage, response_model_exclude_unset=True)
def list_audit(c: AdminCaller, s: Sess, since: Annotated[str | None, Query(max_length=64)] = None,
               user: Annotated[str | None, Query(max_length=80)] = None,
               workspace: Annotated[str | None, Query(max_length=63)] = None,
               limit: Limit = PAGE_DEFAULT, cursor: Cursor = None):
    """Who changed what, when, from where, allowed or refused; oldest first from `since`."""
    after = decode_cursor(cursor, (int,))
    rows = audit.page(s, c, _since(since), user, workspace, after[0] if after else None, limit + 1)
    return page(rows, limit, lambda e: (e.id,), audit.entry_view)
