"""Lists a page at a time (issue 19): `GET $API/events`, `$API/workers` and `$API/drives` take `limit` (default
100, at most 1000) and `cursor` (the previous page's `next_cursor`, null on the last page). The pages together
hold every item exactly once, in the order of the whole list, even when items come and go between pages; a
limit outside 1..1000 or a cursor that is not one is a 422 naming the parameter. SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json

import pytest
from sqlalchemy import select

from astraeus.server.db import Event, Workspace


def _run(app, name: str, machines: int = 1) -> None:
    tt = {"image": "python:3.11", "command": "sleep", "args": ["600"],
          "requested_resources": {"gpu_requests": {"count": 0}, "machines": machines}}
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": name}, "spec": {"task_template": tt}},
                        headers=app.h())
    assert r.status_code == 201, r.text


def _drive(app, name: str) -> None:
    src = {"path": f"/data/astraeus/{name}", "node": "gpu-01", "mount_path": "/d", "mode": "ReadWrite"}
    r = app.client.post(app.api + "/drives", headers=app.h(),
                        json={"metadata": {"name": name}, "spec": {"sources": [src]}})
    assert r.status_code == 201, r.text


def _get(app, what: str, **params) -> dict:
    r = app.client.get(f"{app.api}/{what}", params=params, headers=app.h())
    assert r.status_code == 200, r.text
    return r.json()


def _key(what: str, item: dict) -> tuple:
    return (item["time"], item["kind"], item["object"], item["message"]) if what == "events" else (item["name"],)


def _walk(app, what: str, limit: int, **params) -> tuple[list[dict], int]:
    items, pages, cursor = [], 0, None
    while True:
        page = _get(app, what, limit=limit, **params, **({"cursor": cursor} if cursor else {}))
        assert len(page["items"]) <= limit
        items += page["items"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            return items, pages
        assert page["items"], "a page with a next_cursor holds items"


@pytest.fixture
def filled(app):
    """3 runs of 3 workers each, 7 drives, and the events they made."""
    for i in range(3):
        _run(app, f"train-{i}", machines=3)
    for name in ("d-07", "d-03", "d-05", "d-01", "d-06", "d-02", "d-04"):
        _drive(app, name)
    return app


@pytest.mark.parametrize("what", ["events", "workers", "drives"])
def test_pages_hold_every_item_once_in_the_order_of_the_whole_list(filled, what):
    app = filled
    whole = _get(app, what)
    assert whole["next_cursor"] is None  # fewer than the default 100: one page, as before
    assert len(whole["items"]) >= 7
    for limit in (1, 2, 4):
        items, pages = _walk(app, what, limit)
        assert items == whole["items"]
        assert pages == -(-len(whole["items"]) // limit)
    if what == "drives":
        assert [d["metadata"]["name"] for d in whole["items"]] == [f"d-0{i}" for i in range(1, 8)]
    if what == "workers":
        assert [w["name"] for w in whole["items"]] == [f"train-{r}-{i}" for r in range(3) for i in range(3)]
        one, _ = _walk(app, what, 2, run="train-1")
        assert [w["name"] for w in one] == ["train-1-0", "train-1-1", "train-1-2"]


def test_items_added_or_deleted_between_pages_neither_repeat_nor_shift_the_rest(filled):
    app = filled
    first = _get(app, "drives", limit=3)
    assert [d["metadata"]["name"] for d in first["items"]] == ["d-01", "d-02", "d-03"]
    r = app.client.delete(f"{app.api}/drives/d-02", headers=app.h())  # one already shown goes
    assert r.status_code == 200, r.text
    _drive(app, "d-00")  # one before the cursor comes: the next pages do not show it again
    _drive(app, "d-045")  # one after it comes: the next pages show it
    rest = _get(app, "drives", cursor=first["next_cursor"])
    assert [d["metadata"]["name"] for d in rest["items"]] == ["d-04", "d-045", "d-05", "d-06", "d-07"]
    assert rest["next_cursor"] is None

    before = _get(app, "events", limit=1000)["items"]
    newest = _get(app, "events", limit=2)
    _run(app, "later")  # newer events: the pages after the first go on with the older ones
    older = _get(app, "events", limit=1000, cursor=newest["next_cursor"])
    assert newest["items"] + older["items"] == before


def test_default_limit_is_100_and_the_most_is_1000(app):
    with app.cp.sessions() as s:
        ws = s.scalar(select(Workspace).where(Workspace.name == app.boot["workspace"]))
        s.add_all(Event(workspace_id=ws.id, time=1.0e9 + i, kind="Note", object=f"n{i}", message=f"note {i}")
                  for i in range(1001))
        s.commit()
    first = _get(app, "events")
    assert len(first["items"]) == 100 and first["next_cursor"]
    assert first["items"][0]["object"] == "n1000"  # newest first, as before
    most = _get(app, "events", limit=1000)
    assert len(most["items"]) == 1000 and most["next_cursor"]
    last = _get(app, "events", limit=1000, cursor=most["next_cursor"])
    assert last["next_cursor"] is None
    assert {e["object"] for e in most["items"] + last["items"]} >= {f"n{i}" for i in range(1001)}


@pytest.mark.parametrize("what", ["events", "workers", "drives"])
@pytest.mark.parametrize("limit", ["0", "-1", "1001", "many"])
def test_a_limit_outside_1_to_1000_is_a_422_naming_limit(app, what, limit):
    r = app.client.get(f"{app.api}/{what}", params={"limit": limit}, headers=app.h())
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and "limit" in r.json()["message"]


def _cursor(key) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode()


@pytest.mark.parametrize("what", ["events", "workers", "drives"])
@pytest.mark.parametrize("cursor", ["not-a-cursor", "%%%", _cursor({"id": 3}), _cursor([]), _cursor([1, 2, 3, 4]),
                                    _cursor([True]), _cursor([2**40]), _cursor([None, None, None]), "x" * 600])
def test_a_cursor_that_is_not_a_next_cursor_is_a_422_naming_cursor(app, what, cursor):
    r = app.client.get(f"{app.api}/{what}", params={"cursor": cursor}, headers=app.h())
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and "cursor" in r.json()["message"]


def test_one_list_s_cursor_is_refused_by_another(filled):
    app = filled
    workers = _get(app, "workers", limit=1)["next_cursor"]
    drives = _get(app, "drives", limit=1)["next_cursor"]
    events = _get(app, "events", limit=1)["next_cursor"]
    for what, cursor in (("drives", workers), ("events", drives), ("workers", events), ("drives", events)):
        r = app.client.get(f"{app.api}/{what}", params={"cursor": cursor}, headers=app.h())
        assert r.status_code == 422 and "cursor" in r.json()["message"], (what, r.text)
