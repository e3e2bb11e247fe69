"""`GET $API/runs` and `$API/machines` a page at a time (issue 19): `limit` (default 100, at most 1000) and
`cursor`; runs newest first (created_at, then id, descending) with the filters `state` and `label` (key=value,
repeated or comma-separated, all must match), machines by name. The pages together hold every item exactly once in
the order of the whole list; a bad limit, cursor or label is a 422 naming it; a page of 100 runs costs a constant
number of queries (workers in one query, not one per run). SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from html import unescape
from urllib.parse import parse_qs

import pytest
from sqlalchemy import event, select

from astraeus.server import lifecycle
from astraeus.server.db import Cluster, Machine, Workspace

TT = {"image": "python:3.11", "command": "sleep", "args": ["600"],
      "requested_resources": {"gpu_requests": {"count": 0}, "machines": 1}}


def _insert(app, n: int, *, at: float = 1.7e9, same_time: bool = False, workers: int = 1,
            labels=lambda i: {"team": "a" if i % 2 else "b", "n": str(i)}, state=lambda i: "Pending") -> None:
    """`n` runs r-0000.. straight into the workspace (created_at rising with i, or all at `at`)."""
    with app.cp.sessions() as s:
        ws = s.scalar(select(Workspace).where(Workspace.name == app.boot["workspace"]))
        cl = s.scalar(select(Cluster).order_by(Cluster.id))
        for i in range(n):
            run = lifecycle.new_run(uid=uuid.uuid4().hex, workspace_id=ws.id, cluster_id=cl.id, name=f"r-{i:04d}",
                                    labels=labels(i), spec={"task_template": {**TT}, "priority": 0},
                                    created_at=at if same_time else at + i)
            run.state = state(i)
            s.add(run)
            for k in range(workers):
                w = lifecycle.new_worker(name=f"r-{i:04d}-{k}", index=k)
                run.workers.append(w)
        s.commit()


def _get(app, what: str = "runs", **params):
    return app.client.get(f"{app.api}/{what}", params=params, headers=app.h())


def _ok(app, what: str = "runs", **params) -> dict:
    r = _get(app, what, **params)
    assert r.status_code == 200, r.text
    return r.json()


def _walk(app, limit: int, what: str = "runs", **params) -> list[dict]:
    items, cursor = [], None
    while True:
        page = _ok(app, what, limit=limit, **params, **({"cursor": cursor} if cursor else {}))
        assert len(page["items"]) <= limit
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert page["items"]


def _names(items: list[dict]) -> list[str]:
    return [r["metadata"]["name"] for r in items]


def test_pages_hold_every_run_once_newest_first(app):
    _insert(app, 23)
    whole = _ok(app, limit=1000)
    assert whole["next_cursor"] is None
    assert _names(whole["items"]) == [f"r-{i:04d}" for i in reversed(range(23))]
    for limit in (1, 5, 22, 23):  # names: the scheduler may change a reason meanwhile
        assert _names(_walk(app, limit)) == _names(whole["items"])


def test_runs_made_at_the_same_time_page_by_id(app):
    _insert(app, 12, same_time=True)
    whole = _ok(app)["items"]
    assert _names(whole) == [f"r-{i:04d}" for i in reversed(range(12))]  # id descending among equal times
    assert _names(_walk(app, 5)) == _names(whole)


def test_default_limit_is_100(app):
    _insert(app, 130)
    first = _ok(app)
    assert len(first["items"]) == 100 and first["next_cursor"]
    assert first["items"][0]["metadata"]["name"] == "r-0129"
    rest = _ok(app, cursor=first["next_cursor"])
    assert len(rest["items"]) == 30 and rest["next_cursor"] is None


def test_a_run_submitted_between_pages_is_not_shown_again_and_shifts_nothing(app):
    _insert(app, 6)
    first = _ok(app, limit=3)
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": "later"}, "spec": {"task_template": TT}},
                        headers=app.h())
    assert r.status_code == 201, r.text
    r = app.client.delete(f"{app.api}/runs/r-0004", headers=app.h())  # one already shown goes
    assert r.status_code == 200, r.text
    rest = _ok(app, cursor=first["next_cursor"])
    assert _names(first["items"]) == ["r-0005", "r-0004", "r-0003"]
    assert _names(rest["items"]) == ["r-0002", "r-0001", "r-0000"]


def test_state_and_label_filters_page_too(app):
    _insert(app, 40, state=lambda i: "Failed" if i % 3 == 0 else "Completed")  # the scheduler leaves them so
    running = _walk(app, 4, state="Failed")
    assert _names(running) == [f"r-{i:04d}" for i in reversed(range(40)) if i % 3 == 0]
    team_a = _walk(app, 3, label="team=a")
    assert _names(team_a) == [f"r-{i:04d}" for i in reversed(range(40)) if i % 2]
    both = _walk(app, 2, label="team=a", state="Failed")
    assert _names(both) == [f"r-{i:04d}" for i in reversed(range(40)) if i % 2 and i % 3 == 0]
    assert _names(_ok(app, label="team=a,n=7")["items"]) == ["r-0007"]
    assert _names(_ok(app, label=["team=a", "n=7"])["items"]) == ["r-0007"]
    assert _ok(app, label="team=b,n=7") == {"items": [], "next_cursor": None}
    assert _ok(app, label="nope=x") == {"items": [], "next_cursor": None}


def test_labels_with_prefixes_dots_and_empty_values_filter(app):
    odd = {"app.kubernetes.io/name": "web.v1", "flag": ""}
    _insert(app, 3, labels=lambda i: odd if i == 1 else {"app.kubernetes.io/name": "web"})
    assert _names(_ok(app, label="app.kubernetes.io/name=web.v1")["items"]) == ["r-0001"]
    assert _names(_ok(app, label="flag=")["items"]) == ["r-0001"]
    assert _names(_ok(app, label="app.kubernetes.io/name=web")["items"]) == ["r-0002", "r-0000"]


@pytest.mark.parametrize("label", ["team", "=a", "team=a,,", "team=a,team=b", 'say"hi=x', "team=a b",
                                   "x=" + "v" * 64, "a" * 64 + "=x", "Bad_Prefix/x=y"])
def test_a_bad_label_selector_is_a_422_naming_label(app, label):
    r = _get(app, label=label)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and r.json()["message"].startswith("label")


@pytest.mark.parametrize("what", ["runs", "machines"])
@pytest.mark.parametrize("limit", ["0", "-1", "1001", "many"])
def test_a_limit_outside_1_to_1000_is_a_422_naming_limit(app, what, limit):
    r = _get(app, what, limit=limit)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and "limit" in r.json()["message"]


def _cursor(key) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode()


@pytest.mark.parametrize("what", ["runs", "machines"])
@pytest.mark.parametrize("cursor", ["not-a-cursor", _cursor([]), _cursor([1]), _cursor(["a", "b"]),
                                    _cursor([1.5, "x"]), _cursor([True, 1]), _cursor([1.5, 2**40]), "x" * 600])
def test_a_cursor_that_is_not_a_next_cursor_is_a_422_naming_cursor(app, what, cursor):
    r = _get(app, what, cursor=cursor)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID" and "cursor" in r.json()["message"]


def test_another_list_s_cursor_is_refused(app):
    _insert(app, 3)
    for i in range(3):
        r = app.client.post(f"{app.api}/drives", headers=app.h(), json={"metadata": {"name": f"d-{i}"}, "spec": {
            "sources": [{"path": f"/data/astraeus/d{i}", "node": "gpu-01", "mount_path": "/d", "mode": "ReadWrite"}]}})
        assert r.status_code == 201, r.text
    drives = _ok(app, "drives", limit=1)["next_cursor"]
    runs = _ok(app, limit=1)["next_cursor"]
    assert _get(app, "runs", cursor=drives).status_code == 422
    assert _get(app, "machines", cursor=runs).status_code == 422


def test_a_page_of_100_runs_costs_a_constant_number_of_queries(app):
    _insert(app, 10, workers=3)
    _insert_more = 110

    def count(**params) -> int:
        """The queries of the request (those of the thread that read the runs: the scheduler runs meanwhile)."""
        seen: list[tuple[int, str]] = []

        def on(_conn, _cursor, statement, *_a):
            seen.append((threading.get_ident(), statement))

        event.listen(app.cp.engine, "before_cursor_execute", on)
        try:
            _ok(app, **params)
        finally:
            event.remove(app.cp.engine, "before_cursor_execute", on)
        mine = {t for t, st in seen if "ORDER BY runs.created_at DESC" in st}
        assert len(mine) == 1, seen
        return sum(t in mine for t, _ in seen)

    small = count(limit=10)
    with app.cp.sessions() as s:  # 110 more runs of 3 workers, 100 of them on the page
        ws = s.scalar(select(Workspace).where(Workspace.name == app.boot["workspace"]))
        cl = s.scalar(select(Cluster).order_by(Cluster.id))
        for i in range(_insert_more):
            run = lifecycle.new_run(uid=uuid.uuid4().hex, workspace_id=ws.id, cluster_id=cl.id, name=f"m-{i:04d}",
                                    labels={}, spec={"task_template": {**TT}, "priority": 0}, created_at=1.8e9 + i)
            s.add(run)
            for k in range(3):
                run.workers.append(lifecycle.new_worker(name=f"m-{i:04d}-{k}", index=k))
        s.commit()
    big = count(limit=100)
    assert big == small, (small, big)
    page = _ok(app, limit=100)["items"]
    assert len(page) == 100 and all(len(r["status"]["workers"]) == 3 for r in page)


def _machines(app, names: list[str]) -> None:
    with app.cp.sessions() as s:
        cl = s.scalar(select(Cluster).order_by(Cluster.id))
        s.add_all(Machine(cluster_id=cl.id, name=n, gpus=8, state="Ready") for n in names)
        s.commit()


def test_machines_page_by_name(app):
    before = [m["name"] for m in _ok(app, "machines", limit=1000)["items"]]
    _machines(app, ["m-07", "m-03", "m-05", "m-01", "m-06", "m-02", "m-04"])
    whole = _ok(app, "machines", limit=1000)
    assert whole["next_cursor"] is None
    names = [m["name"] for m in whole["items"]]
    assert names == sorted(before + [f"m-0{i}" for i in range(1, 8)])
    for limit in (1, 2, 5):
        assert [m["name"] for m in _walk(app, limit, "machines")] == names
    assert {"gpus_free", "pools", "cluster"} <= set(whole["items"][0])


# --- the console's runs page: the same pages, a Next link with the cursor, filters by state and label -----------


def _console(app, **params):
    org, ws = app.boot["org"], app.boot["workspace"]
    return app.client.get(f"/o/{org}/w/{ws}/runs", params=params, headers=app.h())


def _shown(html: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]+)"', html)


def _next(html: str) -> dict | None:
    m = re.search(r'<a href="[^"?]*/runs\?([^"]*)" rel="next">Next</a>', html)
    return {k: v[0] for k, v in parse_qs(unescape(m.group(1))).items()} if m else None


def test_console_runs_page_pages_with_next_and_filters(app):
    _insert(app, 230, state=lambda i: "Failed" if i % 3 == 0 else "Completed")
    r = _console(app)
    assert r.status_code == 200, r.text
    assert _shown(r.text) == [f"r-{i:04d}" for i in reversed(range(130, 230))]
    shown, params = _shown(r.text), _next(r.text)
    while params:
        r = _console(app, **params)
        assert r.status_code == 200, r.text
        assert 'rel="first">Newest</a>' in r.text
        shown += _shown(r.text)
        params = _next(r.text)
    assert shown == [f"r-{i:04d}" for i in reversed(range(230))]

    r = _console(app, state="Failed", label="team=a")
    want = [f"r-{i:04d}" for i in reversed(range(230)) if i % 3 == 0 and i % 2]
    assert _shown(r.text) == want and _next(r.text) is None
    assert 'value="team=a"' in r.text
    live = app.client.get(f"/o/{app.boot['org']}/w/{app.boot['workspace']}/runs/live",
                          params={"state": "Failed", "label": "team=a"}, headers=app.h())
    assert _shown(live.text) == want
    r = _console(app, label="n=5,team=a")
    assert _shown(r.text) == ["r-0005"]
    assert "No runs with labels nope=x" in _console(app, label="nope=x").text


@pytest.mark.parametrize("params, field", [({"label": "team"}, "label"), ({"cursor": "nope"}, "cursor")])
def test_console_runs_page_names_a_bad_label_or_cursor(app, params, field):
    r = _console(app, **params)
    assert r.status_code == 422 and field in r.text
