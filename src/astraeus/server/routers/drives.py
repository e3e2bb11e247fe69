"""Drives: create, list, show, delete."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus import spec as S
from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.routers.deps import Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.post("/drives", status_code=201)
def create_drive(c: WsCaller, s: Sess, body: S.DriveCreate):
    with tx(s):
        d = services.create_drive(s, c, body, now())
        out = services.drive_out(s, c, d)
    return out


@router.get("/drives")
def list_drives(c: WsCaller, s: Sess):
    return {"items": [services.drive_out(s, c, d) for d in services.list_drives(s, c)]}


@router.get("/drives/{name}")
def get_drive(name: str, c: WsCaller, s: Sess):
    return services.drive_out(s, c, services.get_drive(s, c, name))


@router.delete("/drives/{name}")
def delete_drive(name: str, c: WsCaller, s: Sess):
    with tx(s):
        services.delete_drive(s, c, name, now())
    return {"name": name, "deleted": True}
