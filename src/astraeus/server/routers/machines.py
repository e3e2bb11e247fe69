"""The machines of the clusters the workspace may use, by name, a page at a time (see routers/events.py)."""

from __future__ import annotations

from fastapi import APIRouter

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.routers.deps import Sess, WsCaller
from astraeus.server.routers.events import PAGE_DEFAULT, Cursor, Limit, decode_cursor, page
from astraeus.server.routers.workspace import PREFIX

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)


@router.get("/machines", response_model=A.MachinePage, response_model_exclude_unset=True)
def list_machines(c: WsCaller, s: Sess, limit: Limit = PAGE_DEFAULT, cursor: Cursor = None):
    after = decode_cursor(cursor, (str, int))
    cluster_ids = services.granted_cluster_ids(s, c)
    rows = services.list_machines(s, cluster_ids, after, limit + 1)
    views = {id(m): v for m, v in zip(rows[:limit], services.machines_view(s, cluster_ids, rows[:limit]),
                                       strict=True)}
    return page(rows, limit, lambda m: (m.name, m.id), lambda m: views[id(m)])
