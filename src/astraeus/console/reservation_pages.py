"""The console's reservation pages. Settings → Reservations (organisation admins): every reservation of the
organisation, a New reservation form (the body of POST $ORG_API/reservations, validated and applied by
astraeus.server.reservations, so the form refuses what the API refuses, with the API's message) and Delete (ends it
now). Reservations (a workspace's page): that workspace's reservations only, read-only, as GET $API/reservations.
Its routes join the console's router (astraeus.console.site gathers it)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request
from fastapi.responses import RedirectResponse
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.console import forms
from astraeus.console.base import Page, admin_page, cp_of, page, read_form, render, router, ws_page
from astraeus.server import reservations
from astraeus.server.db import Cluster
from astraeus.server.routers.deps import now
from astraeus.server.routers.errors import validation_errors, validation_message
from astraeus.server.services import ApiError, InvalidBody, tx


def _items(x) -> list[dict]:
    return x["items"] if isinstance(x, dict) else list(x)


def admin_reservations_page(request: Request, s: Session, p: Page, *, values: dict | None = None,
                            error: str | None = None, errors: list | None = None, status: int = 200, **ctx):
    clusters = [cl.name for cl in s.scalars(select(Cluster).where(Cluster.org_id == p.org.id).order_by(Cluster.id))]
    vals = {"cluster": clusters[0] if clusters else "", **(values or {})}
    return render(request, "reservations.html", p, status=status, nav="settings", admin=True,
                  items=_items(reservations.list_reservations(s, p.caller)), clusters=clusters, values=vals,
                  error=error, errors=errors or [], **ctx)


@router.get("/o/{org}/settings/reservations")
@page
def reservations_admin(request: Request, org: str, saved: str = "", deleted: str = ""):
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        return admin_reservations_page(request, s, p, saved=saved, deleted=deleted)


@router.post("/o/{org}/settings/reservations")
@page
def reservation_create(request: Request, org: str):
    form = read_form(request)
    values = {k: form.get(k, "") for k in forms.RESERVATION_FIELDS}
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        try:
            body = forms.reservation_body(form)
            with tx(s):
                reservations.create_reservation(s, p.caller, body, now())
        except InvalidBody as e:
            msg, errs = validation_errors(e.errors)
            return admin_reservations_page(request, s, p, values=values, error=msg, errors=errs, status=422)
        except ValidationError as e:
            msg, errs = validation_message(e)
            return admin_reservations_page(request, s, p, values=values, error=msg, errors=errs, status=422)
        except ApiError as e:
            if e.status == 401:
                raise
            return admin_reservations_page(request, s, p, values=values, error=e.message, status=e.status)
    cp_of(request).notifier.wake_scheduler()
    return RedirectResponse(f"/o/{org}/settings/reservations?saved={quote(body['name'])}", status_code=303)


@router.post("/o/{org}/settings/reservations/{name}/delete")
@page
def reservation_delete(request: Request, org: str, name: str):
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        with tx(s):
            reservations.delete_reservation(s, p.caller, name, now())
    cp_of(request).notifier.wake_scheduler()
    return RedirectResponse(f"/o/{org}/settings/reservations?deleted={quote(name)}", status_code=303)


@router.get("/o/{org}/w/{ws}/reservations")
@page
def reservations_list(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        return render(request, "reservations.html", p, nav="reservations", admin=False,
                      items=_items(reservations.workspace_reservations(s, p.caller)))
