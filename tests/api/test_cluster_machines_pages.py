"""`GET $ORG_API/clusters/{cluster}/machines` a page at a time, as the workspace's lists (test_pagination.py):
`limit` (default 100, at most 1000) and `cursor` (the previous page's `next_cursor`, null on the last page), by
name; a bad limit or cursor is a 422 naming it. SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json

import pytest
from sqlalchemy import select

from astraeus.server.db import Cluster, Machine

PATH = "/api/v1/o/acme/clusters/main/machines"


def _machines(app, n: int, gpus: int = 8) -> None:
    with app.cp.sessions() as s:
        cid = s.scalar(select(Cluster.id).where(Cluster.name == "main"))
        s.add_all(Machine(cluster_id=cid, name=f"gpu-{i:04d}", gpus=gpus, state="Ready") for i in range(n))
        s.commit()


def _get(app, **params) -> dict:
    r = app.client.get(PATH, params=params, headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_pages_hold_every_machine_once_by_name(app):
    _machines(app, 7)
    names, cursor, pages = [], None, 0
    while True:
        page = _get(app, limit=3, **({"cursor": cursor} if cursor else {}))
        names += [m["name"] for m in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert names == [f"gpu-{i:04d}" for i in range(7)] and pages == 3
    assert page["items"][0]["gpus"] == 8 and page["items"][0]["cluster"] == "main"


def test_default_limit_is_100_and_the_most_is_1000(app):
    _machines(app, 1001, gpus=1)
    first = _get(app)
    assert len(first["items"]) == 100 and first["next_cursor"]
    most = _get(app, limit=1000)
    assert len(most["items"]) == 1000 and most["next_cursor"]
    last = _get(app, limit=1000, cursor=most["next_cursor"])
    assert [m["name"] for m in last["items"]] == ["gpu-1000"] and last["next_cursor"] is None


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "many"])
def test_a_limit_outside_1_to_1000_is_a_422_naming_limit(app, limit):
    r = app.client.get(PATH, params={"limit": limit}, headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and "limit" in r.json()["message"]


@pytest.mark.parametrize("cursor", ["not-a-cursor", base64.urlsafe_b64encode(json.dumps([3]).encode()).decode(),
                                    base64.urlsafe_b64encode(json.dumps(["gpu-1", "x"]).encode()).decode()])
def test_a_cursor_that_is_not_a_next_cursor_is_a_422_naming_cursor(app, cursor):
    r = app.client.get(PATH, params={"cursor": cursor}, headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and "cursor" in r.json()["message"]
