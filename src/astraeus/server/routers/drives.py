"""Drives: create, list, show, delete."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from astraeus import spec as S
from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.db import Drive
from astraeus.server.routers.deps import Sess, WsCaller, now, tx
from astraeus.server.routers.events import PAGE_DEFAULT, Cursor, Limit, decode_cursor, page
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.post("/drives", status_code=201, response_model=A.DriveOut, response_model_exclude_unset=True)
def create_drive(c: WsCaller, s: Sess, body: S.DriveCreate):
    with tx(s):
        d = services.create_drive(s, c, body, now())
        out = services.drive_out(s, c, d)
    return out


@router.get("/drives", response_model=A.DrivePage, response_model_exclude_unset=True)
def list_drives(c: WsCaller, s: Sess, limit: Limit = PAGE_DEFAULT, cursor: Cursor = None):
    """The workspace's drives, by name, a page at a time."""
    after = decode_cursor(cursor, (str,))
    q = select(Drive).where(Drive.workspace_id == c.workspace.id)
    if after is not None:
        q = q.where(Drive.name > after[0])
    rows = list(s.scalars(q.order_by(Drive.name).limit(limit + 1)))
    return page(rows, limit, lambda d: (d.name,), lambda d: services.drive_out(s, c, d))


@router.get("/drives/{name}", response_model=A.DriveOut, response_model_exclude_unset=True)
def get_drive(name: str, c: WsCaller, s: Sess):
    return services.drive_out(s, c, services.get_drive(s, c, name))


@router.delete("/drives/{name}", response_model=A.Deleted, response_model_exclude_unset=True)
def delete_drive(name: str, c: WsCaller, s: Sess):
    with tx(s):
        services.delete_drive(s, c, name, now())
    return {"name": name, "deleted": True}
