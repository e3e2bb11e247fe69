"""The console's replica group pages: the workspace's groups (list: replicas wanted, alive, running) and one group
(its runs linked to their pages, its spec, its latest events), read through astraeus.server.replica_groups as the
API reads them. Its routes join the console's router (astraeus.console.site gathers it)."""

from __future__ import annotations

from fastapi import Request
from sqlalchemy import select

from astraeus.console.base import cp_of, page, render, router, ws_page
from astraeus.server import replica_groups as groups
from astraeus.server import services
from astraeus.server.db import Cluster, Event, Run


@router.get("/o/{org}/w/{ws}/replica-groups")
@page
def replica_groups_list(request: Request, org: str, ws: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        items = [groups.group_view(s, g, p.caller.workspace, p.caller.role) for g in groups.list_groups(s, p.caller)]
        return render(request, "replica_groups.html", p, nav="replica-groups", groups=items)


@router.get("/o/{org}/w/{ws}/replica-groups/{name}")
@page
def replica_group_page(request: Request, org: str, ws: str, name: str):
    with cp_of(request).sessions() as s:
        p = ws_page(s, request, org, ws)
        g = groups.get_group(s, p.caller, name)
        v = groups.group_view(s, g, p.caller.workspace, p.caller.role)
        clusters = dict(s.execute(select(Run.name, Cluster.name).join(Cluster, Cluster.id == Run.cluster_id)
                                  .where(Run.group_id == g.id, Run.live_key == "")).all())
        links = {r: f"{p.base}/jobs/{cl}/{r}" for r, cl in clusters.items()}
        names = [g.name] + [r["name"] for r in v["status"]["runs"]]
        evs = [services.event_view(e) for e in s.scalars(
            select(Event).where(Event.workspace_id == p.caller.workspace.id, Event.object.in_(names),
                                Event.kind.like("Replica%")).order_by(Event.id.desc()).limit(20))]
        return render(request, "replica_group.html", p, nav="replica-groups", v=v, links=links, events=evs)
