"""The console's schedule pages: the workspace's schedules (list) and one schedule (its spec, last and next ticks,
its runs and latest ticks), read through astraeus.server.schedules as the API reads them. Its routes join the
console's router (astraeus.console.site gathers it)."""

from __future__ import annotations

from fastapi import Request
from sqlalchemy import select

from astraeus.console.base import cp_of, page, render, router, ws_page
from astraeus.server import schedules
from astraeus.server.db import Cluster, Run


@router.get("/o/{org}/w/{ws}/schedules")
@page
def schedules_list(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        items = [schedules.view(s, sc, p.caller, full=False) for sc in schedules.listed(s, p.caller)]
        return render(request, "schedules.html", p, nav="schedules", schedules=items)


@router.get("/o/{org}/w/{ws}/schedules/{name}")
@page
def schedule_page(request: Request, org: str, ws: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        sc = schedules.get(s, p.caller, name)
        v = schedules.view(s, sc, p.caller)
        clusters = dict(s.execute(select(Run.name, Cluster.name).join(Cluster, Cluster.id == Run.cluster_id)
                                  .where(Run.schedule_id == sc.id, Run.live_key == "")).all())
        links = {r: f"{p.base}/jobs/{cl}/{r}" for r, cl in clusters.items()}
        return render(request, "schedule.html", p, nav="schedules", v=v, links=links)
