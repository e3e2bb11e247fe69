"""The console's Usage page, the machines' sparklines and Settings → Audit over HTTP, on SQLite and PostgreSQL: usage
records of known GPUs and times give the charts' bars and series, the tables under them show GET $API/usage's
figures, a workspace's viewer sees only that workspace, and the audit page is for organisation admins. Also the
pure chart module (console/charts.py): ticks, stacking, step series, the empty chart."""

from __future__ import annotations

import math
import re
import time
import xml.etree.ElementTree as ET
from html import unescape

import pytest

from astraeus.console import charts

SVG = "{http://www.w3.org/2000/svg}"
DAY = 86400


# --------------------------------------------------------------------------------------------- helpers


def token(app, role: str, workspace: str = "vision") -> str:
    r = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": workspace, "role": role},
                        headers=app.h(app.boot["admin_token"]))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def other_workspace(app, name: str = "nlp") -> None:
    r = app.client.post("/api/v1/o/acme/workspaces", headers=app.h(app.boot["admin_token"]),
                        json={"name": name, "clusters": {"main": {}}})
    assert r.status_code == 201, r.text


def add_records(app, rows: list[dict]) -> None:
    """Usage records as lifecycle.ended writes them, with known GPUs, times and waits; and the machine gpu-01."""
    from sqlalchemy import select

    from astraeus.server.db import Cluster, Machine, Org, UsageRecord, Workspace

    with app.cp.sessions() as s, s.begin():
        org = s.scalar(select(Org).where(Org.name == "acme"))
        cl = s.scalar(select(Cluster).where(Cluster.org_id == org.id, Cluster.name == "main"))
        if s.scalar(select(Machine).where(Machine.name == "gpu-01")) is None:
            s.add(Machine(cluster_id=cl.id, name="gpu-01", gpus=8, gpu_models=["H100"] * 8, state="Ready"))
        for i, r in enumerate(rows):
            ws = s.scalar(select(Workspace).where(Workspace.org_id == org.id, Workspace.name == r["workspace"]))
            s.add(UsageRecord(org_id=org.id, workspace_id=ws.id, workspace=ws.name, cluster="main", run_id=1000 + i,
                              run_uid=f"uid{i}", run=r["run"], worker=f"{r['run']}-0", attempt=1, user=r["user"],
                              pool=None, machine="gpu-01", gpu_model="H100", gpus=r["gpus"], cpu_cores=1.0,
                              memory_bytes=1 << 30, started_at=r["start"], ended_at=r["end"], wait_seconds=r["wait"],
                              state=r.get("state", "Succeeded"), reason="", preempted_by=None))


def known(app) -> float:
    """Three attempts on whole past days (none crosses a midnight): vision's alice 2 GPUs × 1 h yesterday, vision's
    bob 4 GPUs × 30 min the day before (preempted), nlp's carol 1 GPU × 3 h yesterday."""
    other_workspace(app)
    midnight = math.floor(time.time() / DAY) * DAY
    add_records(app, [
        {"workspace": "vision", "user": "alice", "run": "a", "gpus": 2, "start": midnight - DAY + 3600,
         "end": midnight - DAY + 7200, "wait": 30},
        {"workspace": "vision", "user": "bob", "run": "b", "gpus": 4, "start": midnight - 2 * DAY + 3600,
         "end": midnight - 2 * DAY + 5400, "wait": 600, "state": "Preempted"},
        {"workspace": "nlp", "user": "carol", "run": "c", "gpus": 1, "start": midnight - DAY + 7200,
         "end": midnight - DAY + 18000, "wait": 5000},
    ])
    return midnight


def svg(html: str, cid: str) -> ET.Element:
    m = re.search(rf'<svg class="chart" id="{cid}".*?</svg>', html, re.S)
    assert m, f"no chart {cid} in the page"
    return ET.fromstring(m.group(0))


def bars_of(el: ET.Element) -> list[tuple[str, str]]:
    return [(r.get("data-series"), r.get("data-category")) for r in el.iter(f"{SVG}rect") if r.get("class") == "chart-bar"]


def table_rows(html: str, tid: str) -> list[dict]:
    """The rows of a figures table: their data- attributes, GPU-hours and attempts cells."""
    body = re.search(rf'<table[^>]*id="{tid}".*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    out = []
    for tr in re.findall(r"<tr( [^>]*)>(.*?)</tr>", body, re.S):
        attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', tr[0]))
        cells = dict(re.findall(r'class="num (gpu-hours|attempts)">([^<]*)<', tr[1]))
        out.append({**attrs, **cells})
    return out


def page(app, path: str, tok: str | None = None, **params):
    return app.client.get(path, params=params, headers=app.h(tok or app.boot["token"]), follow_redirects=False)


# ------------------------------------------------------------------------------------------- the pages


def test_an_organisation_admin_sees_every_workspace_with_the_apis_figures(app):
    midnight = known(app)
    r = page(app, "/o/acme/w/vision/usage", app.boot["admin_token"], since="7d")
    assert r.status_code == 200, r.text
    html = r.text
    assert "Organisation acme" in html
    d1, d2 = time.strftime("%Y-%m-%d", time.gmtime(midnight - DAY)), time.strftime("%Y-%m-%d",
                                                                                    time.gmtime(midnight - 2 * DAY))
    ws = svg(html, "chart-workspaces")
    assert ws.find(f"{SVG}title").text == "GPU-hours per workspace per day"
    assert sorted(bars_of(ws)) == sorted([("vision", d1), ("vision", d2), ("nlp", d1)])
    assert sorted(bars_of(svg(html, "chart-users"))) == sorted([("alice", d1), ("bob", d2), ("carol", d1)])
    util = svg(html, "chart-utilisation")
    assert {p.get("data-series") for p in util.iter() if "series" in (p.get("class") or "")} == {"in use", "present"}
    waits = bars_of(svg(html, "chart-queue-wait"))
    assert sorted(c for _, c in waits) == sorted(["15 s–1 min", "5–15 min", "1–4 h"])

    api = app.client.get("/api/v1/o/acme/usage", params={"group_by": "workspace,day", "since": "7d"},
                         headers=app.h(app.boot["admin_token"])).json()
    assert [{"workspace": x["workspace"], "day": x["day"], "gpu-hours": charts.figure(x["gpu_hours"]),
             "attempts": str(x["attempts"])} for x in api["items"]] == table_rows(html, "workspaces-table")
    by_user = app.client.get("/api/v1/o/acme/usage", params={"group_by": "user,day", "since": "7d"},
                             headers=app.h(app.boot["admin_token"])).json()
    assert [(x["user"], x["day"], charts.figure(x["gpu_hours"])) for x in by_user["items"]] == [
        (x["user"], x["day"], x["gpu-hours"]) for x in table_rows(html, "users-table")]
    assert f'id="usage-total">{charts.figure(api["total"]["gpu_hours"])}<' in html  # 7 GPU-hours in all
    util_rows = {x["day"]: x["gpu-hours"] for x in table_rows(html, "utilisation-table")}
    assert util_rows[d1] == "5.00" and util_rows[d2] == "2.00"
    assert [int(n) for n in re.findall(r'class="num attempts">(\d+)<',
                                       html.split('id="queue-wait-table"')[1])] == [0, 0, 0, 1, 0, 1, 0, 1, 0, 0]


def test_a_workspace_viewer_sees_only_their_workspace(app):
    midnight = known(app)
    viewer = token(app, "viewer")
    r = page(app, "/o/acme/w/vision/usage", viewer)
    assert r.status_code == 200, r.text
    html = r.text
    assert "Workspace vision" in html
    assert "nlp" not in html and "carol" not in html
    d1, d2 = (time.strftime("%Y-%m-%d", time.gmtime(midnight - k * DAY)) for k in (1, 2))
    assert sorted(bars_of(svg(html, "chart-workspaces"))) == sorted([("vision", d1), ("vision", d2)])
    assert sorted(bars_of(svg(html, "chart-users"))) == sorted([("alice", d1), ("bob", d2)])
    api = app.client.get(f"{app.api}/usage", params={"group_by": "workspace,day", "since": "7d"},
                         headers=app.h(viewer)).json()
    assert [{"workspace": x["workspace"], "day": x["day"], "gpu-hours": charts.figure(x["gpu_hours"]),
             "attempts": str(x["attempts"])} for x in api["items"]] == table_rows(html, "workspaces-table")
    # another workspace's page is refused, as the API refuses it
    r = page(app, "/o/acme/w/nlp/usage", viewer)
    assert r.status_code == app.client.get("/api/v1/o/acme/w/nlp/usage", headers=app.h(viewer)).status_code == 404
    assert "carol" not in r.text


def test_thirty_days_and_no_usage_yet(app):
    r = page(app, "/o/acme/w/vision/usage", since="30d")
    assert r.status_code == 200, r.text
    assert r.text.count(charts.EMPTY) >= 4  # every chart says so
    assert 'aria-current="page">Last 30 days' in r.text


@pytest.mark.parametrize("since, says", [
    ("yesterdayish", "since='yesterdayish' is not a time: give a duration back from now (7d, 12h, 30m)"),
    ("2999-01-01", "is not before until=now: give a since earlier than until"),
])
def test_a_bad_since_is_refused_saying_what_to_change(app, since, says):
    r = page(app, "/o/acme/w/vision/usage", since=since)
    assert r.status_code == 422
    assert says in unescape(r.text)


def test_each_machine_has_a_sparkline_of_its_last_24_hours(app):
    now = time.time()
    add_records(app, [{"workspace": "vision", "user": "alice", "run": "a", "gpus": 3, "start": now - 3600,
                       "end": now - 1800, "wait": 1}])
    r = page(app, "/o/acme/w/vision/machines")
    assert r.status_code == 200, r.text
    spark = re.search(r'<svg class="spark" id="spark-main-gpu-01".*?</svg>', r.text, re.S)
    assert spark, "no sparkline for gpu-01"
    el = ET.fromstring(spark.group(0))
    assert el.find(f"{SVG}title").text == "gpu-01: GPUs in use over the last 24 h (at most 3 of 8; now 0)"
    live = page(app, "/o/acme/w/vision/machines/live")  # the rows the page refreshes keep it
    assert 'id="spark-main-gpu-01"' in live.text


# ------------------------------------------------------------------------------------------- audit


def test_the_audit_page_lists_changes_filtered_and_paged(app):
    other_workspace(app)
    for ws in ("vision", "nlp", "vision"):
        token(app, "viewer", ws)
    r = page(app, "/o/acme/settings/audit", app.boot["admin_token"])
    assert r.status_code == 200, r.text
    assert r.text.count("data-entry=") >= 4  # the workspace and the three tokens
    r = page(app, "/o/acme/settings/audit", app.boot["admin_token"], user="nobody-here")
    assert "No changes by nobody-here since 7d." in r.text
    r = page(app, "/o/acme/settings/audit", app.boot["admin_token"], after="abc")
    assert r.status_code == 422 and "after='abc' is not an entry id" in unescape(r.text)
    r = page(app, "/o/acme/settings/audit", app.boot["admin_token"], since="soonish")
    assert r.status_code == 422 and "since='soonish' is not a time" in unescape(r.text)


def test_the_audit_page_is_refused_to_a_workspace_admin(app):
    r = page(app, "/o/acme/settings/audit", token(app, "admin"))
    assert r.status_code == 403
    assert "organisation admin" in r.text.lower()


# ------------------------------------------------------------------------------------------ charts.py


def test_ticks_are_round_and_reach_the_top():
    assert charts.ticks(7) == [0, 2, 4, 6, 8]
    assert charts.ticks(10) == [0, 2, 4, 6, 8, 10]
    assert charts.ticks(0.33) == [0, 0.1, 0.2, 0.3, 0.4]
    assert charts.ticks(230) == [0, 50, 100, 150, 200, 250]
    assert charts.ticks(0) == [0, 1]
    assert [charts.label(t) for t in charts.ticks(1.2)] == ["0", "0.25", "0.5", "0.75", "1", "1.25"]


def test_stacked_bars_stack_each_categorys_sum():
    svg_text = charts.stacked_bars("c", "T", "D", ["d1", "d2"], [charts.Series("a", [1, 0]),
                                                                  charts.Series("b", [3, 2])], "GPU-hours")
    el = ET.fromstring(svg_text)
    assert el.get("role") == "img" and el.find(f"{SVG}title").text == "T" and el.find(f"{SVG}desc").text == "D"
    rects = [r for r in el.iter(f"{SVG}rect") if r.get("class") == "chart-bar"]
    assert [(r.get("data-series"), r.get("data-category")) for r in rects] == [("a", "d1"), ("b", "d1"), ("b", "d2")]
    # d1's two segments touch and together are as tall as 4 on the axis; d2's is as tall as 2
    a, b, c = (float(r.get("height")) for r in rects)
    assert float(rects[1].get("y")) + b == pytest.approx(float(rects[0].get("y")))
    assert (a + b) / c == pytest.approx(2.0)
    assert el.get("viewBox") == "0 0 640 260"


def test_empty_data_shows_no_usage_yet():
    for text in (charts.stacked_bars("c", "T", "D", ["d1"], [charts.Series("a", [0])]),
                 charts.stacked_bars("c", "T", "D", [], []),
                 charts.histogram("h", "T", "D", ["< 1 s"], [0]),
                 charts.area("u", "T", "D", [(0.0, 0.0)], 0, 10, 8)):
        el = ET.fromstring(text)
        assert [t.text for t in el.iter(f"{SVG}text")] == [charts.EMPTY]


def test_step_series_adds_overlaps_and_clips_to_the_window():
    steps = charts.step_series([(0, 10, 2), (5, 20, 4), (30, 40, 1), (-5, 2, 1)], 0, 35)
    assert steps == [(0, 3.0), (2, 2.0), (5, 6.0), (10, 4.0), (20, 0.0), (30, 1.0)]
    assert charts.step_series([], 0, 10) == [(0, 0.0)]
    per_day = charts.daily(charts.step_series([(3600, 7200, 2), (DAY - 1800, DAY + 1800, 4)], 0, 2 * DAY), 0, 2 * DAY)
    assert [(d["day"], d["amount_seconds"] / 3600, d["peak"]) for d in per_day] == [
        ("1970-01-01", 2 + 2, 4), ("1970-01-02", 2, 4)]
