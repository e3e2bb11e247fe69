"""Reservations of machines for workspaces: organisation admins make and end them (`$ORG_API/reservations`); a
workspace sees those for it (`GET $API/reservations`)."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import reservations
from astraeus.server.routers.deps import CP, AdminCaller, Sess, WsCaller, now, tx
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(responses=B.ERRORS)
ORG = "/api/v1/o/{org}/reservations"


@router.get(ORG, tags=["organisation"], response_model=A.ReservationList, response_model_exclude_unset=True)
def list_reservations(c: AdminCaller, s: Sess):
    return {"items": reservations.list_reservations(s, c)}


@router.post(ORG, status_code=201, tags=["organisation"], response_model=A.ReservationOut,
             response_model_exclude_unset=True)
def create_reservation(c: AdminCaller, s: Sess, cp: CP, body: B.ReservationCreate):
    with tx(s):
        out = reservations.create_reservation(s, c, body.model_dump(exclude_unset=True), now())
    cp.notifier.wake_scheduler()  # the loop opens it (and wakes at its start and end)
    return out


@router.get(ORG + "/{name}", tags=["organisation"], response_model=A.ReservationOut,
            response_model_exclude_unset=True)
def get_reservation(name: str, c: AdminCaller, s: Sess):
    return reservations.get_reservation(s, c, name)


@router.delete(ORG + "/{name}", tags=["organisation"], response_model=A.ReservationOut,
               response_model_exclude_unset=True)
def delete_reservation(name: str, c: AdminCaller, s: Sess, cp: CP):
    with tx(s):
        out = reservations.delete_reservation(s, c, name, now())
    cp.notifier.wake_scheduler()
    return out


@router.get(PREFIX + "/reservations", tags=["workspace"], response_model=A.ReservationList,
            response_model_exclude_unset=True)
def workspace_reservations(c: WsCaller, s: Sess):
    return {"items": reservations.workspace_reservations(s, c)}
