"""Schedules: create, list, show, replace, delete (astraeus.server.schedules)."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import schedules
from astraeus.server.routers.deps import CP, Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.post("/schedules", status_code=201, response_model=A.ScheduleOut, response_model_exclude_unset=True)
def create_schedule(c: WsCaller, s: Sess, cp: CP, body: schedules.ScheduleBody):
    with tx(s):
        sc = schedules.create(s, c, body, now())
        out = schedules.view(s, sc, c)
    cp.notifier.wake_scheduler()  # the loop learns the new next tick
    return out


@router.get("/schedules", response_model=A.ScheduleList, response_model_exclude_unset=True)
def list_schedules(c: WsCaller, s: Sess):
    return {"items": [schedules.view(s, sc, c, full=False) for sc in schedules.listed(s, c)]}


@router.get("/schedules/{name}", response_model=A.ScheduleOut, response_model_exclude_unset=True)
def get_schedule(name: str, c: WsCaller, s: Sess):
    return schedules.view(s, schedules.get(s, c, name), c)


@router.put("/schedules/{name}", response_model=A.ScheduleOut, response_model_exclude_unset=True)
def replace_schedule(name: str, c: WsCaller, s: Sess, cp: CP, body: schedules.ScheduleBody):
    with tx(s):
        sc = schedules.replace(s, c, name, body, now())
        out = schedules.view(s, sc, c)
    cp.notifier.wake_scheduler()
    return out


@router.delete("/schedules/{name}", response_model=A.Deleted, response_model_exclude_unset=True)
def delete_schedule(name: str, c: WsCaller, s: Sess):
    with tx(s):
        schedules.delete(s, c, name, now())
    return {"name": name, "deleted": True}
