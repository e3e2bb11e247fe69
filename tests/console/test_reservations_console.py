"""The console's pages for issue 18 against a real local cluster (two machines, 2 simulated GPUs each): Settings →
Reservations (an organisation admin makes one through the form, sees the API's refusal for bad input, deletes one),
a workspace's Reservations page (its own only), the Machines page's pools, New run's Pools field and What if?
button. Over HTTP with bearer tokens, and once in a real browser."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.conftest import start_cluster

WS = "/o/acme/w/vision"
SETTINGS = "/o/acme/settings/reservations"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    """gpu-01 and gpu-02 (2 GPUs each); pool a100 = gpu-01; workspace audio with an editor token."""
    cl = start_cluster(tmp_path_factory.mktemp("resv-console") / "home", gpus=2, machines=2, stop_grace=1.0)
    try:
        cl.wait_for(lambda: len(_machines(cl)) == 2, 60, what="two machines")
        with cl.admin() as a:
            r = a.post("/clusters/main/pools", json={"name": "a100", "machines": ["gpu-01"]})
            assert r.status_code == 201, r.text
            r = a.post("/workspaces", json={"name": "audio", "clusters": {"main": {}}})
            assert r.status_code == 201, r.text
            r = a.post("/tokens", json={"kind": "user", "workspace": "audio", "role": "editor"})
            assert r.status_code == 201, r.text
            cl.vars["AUDIO_TOKEN"] = r.json()["token"]
        yield cl
    finally:
        cl.stop()


def _machines(cl) -> list[dict]:
    with cl.client() as api:
        r = api.get("/machines")
        return [m for m in r.json()["items"] if m["state"] == "Ready"] if r.status_code == 200 else []


def _h(c, token: str) -> httpx.Client:
    return httpx.Client(base_url=c.server, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _row(page: str, attr: str, name: str) -> str | None:
    m = re.search(rf'<tr data-{attr}="{re.escape(name)}">(.*?)</tr>', page, re.S)
    return m and m.group(1)


def _error(page: str) -> str:
    m = re.search(r'<div class="alert error" role="alert" id="form-error">(.*?)</div>', page, re.S)
    assert m, "no error shown"
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m.group(1)))).strip()


def test_an_admin_reserves_through_the_form_and_sees_the_apis_refusals(c):
    start = datetime.now(UTC) + timedelta(days=2)
    good = {"name": "launch", "cluster": "main", "workspaces": "vision", "machines": "gpu-02", "pool": "",
            "count": "", "start": _iso(start), "end": _iso(start + timedelta(hours=4))}
    with _h(c, c.admin_token) as h:
        page = h.get(SETTINGS)
        assert page.status_code == 200 and 'id="new-reservation"' in page.text
        assert 'href="/o/acme/settings/reservations"' in h.get("/o/acme/settings").text
        # each refusal is the API's, with its status, and the form keeps what was typed
        bad = [({"end": _iso(start - timedelta(hours=1))}, 422, "end: must be after start"),
               ({"workspaces": "nope"}, 422, "workspaces: no workspace named nope"),
               ({"machines": "gpu-09"}, 422, "machines: no machine named gpu-09 in cluster main"),
               ({"machines": "", "pool": "a100", "count": "3"}, 422, "count: pool a100 has 1 machines, 3 asked"),
               ({"machines": ""}, 422, "machines: give machines, or pool and count"),
               ({"pool": "a100", "count": "1"}, 422, "machines: give machines, or pool and count"),
               ({"cluster": "nope"}, 404, "nope")]
        for change, status, message in bad:
            r = h.post(SETTINGS, data={**good, **change})
            assert r.status_code == status, (change, r.text[:3000])
            assert message in _error(r.text), (change, _error(r.text))
            assert 'value="launch"' in r.text
        assert _row(h.get(SETTINGS).text, "reservation", "launch") is None

        r = h.post(SETTINGS, data=good, follow_redirects=False)
        assert r.status_code == 303, r.text[:3000]
        assert r.headers["location"] == f"{SETTINGS}?saved=launch"
        page = h.get(r.headers["location"]).text
        assert "Reservation launch made." in page
        row = _row(page, "reservation", "launch")
        assert row and "gpu-02" in row and "vision" in row and "Scheduled" in row and _iso(start) in row

        # a pool and a count: the machines are chosen when it is made
        r = h.post(SETTINGS, data={**good, "name": "by-pool", "machines": "", "pool": "a100", "count": "1",
                                   "workspaces": "vision, audio"}, follow_redirects=False)
        assert r.status_code == 303, r.text[:3000]
        row = _row(h.get(SETTINGS).text, "reservation", "by-pool")
        assert "gpu-01" in row and "1 of pool a100" in row and "vision, audio" in row

        r = h.post(SETTINGS, data={**good, "name": "again"})  # the same machine in an overlapping window
        assert r.status_code == 409 and "machine gpu-02 is already reserved by launch" in _error(r.text)
    with c.admin() as a:
        assert a.get("/reservations/launch").json()["state"] == "Scheduled"
        assert a.get("/reservations/again").status_code == 404


def test_a_workspace_sees_only_its_own_reservations_read_only(c):
    start = datetime.now(UTC) + timedelta(days=5)
    with c.admin() as a:
        r = a.post("/reservations", json={"name": "vision-only", "cluster": "main", "workspaces": ["vision"],
                                          "machines": ["gpu-01"], "start": _iso(start)})
        assert r.status_code == 201, r.text
    with _h(c, c.token) as h:
        page = h.get(f"{WS}/reservations").text
        assert f'href="{WS}/reservations"' in page  # in the navigation
        row = _row(page, "reservation", "vision-only")
        assert row and "gpu-01" in row and "no end" in row and "Scheduled" in row
        assert "Delete" not in page and 'id="new-reservation"' not in page
        r = h.get(SETTINGS)
        assert r.status_code == 403 and "this needs an organisation admin token" in r.text
        r = h.post(f"{SETTINGS}/vision-only/delete")
        assert r.status_code == 403
    with _h(c, c.vars["AUDIO_TOKEN"]) as h:
        page = h.get("/o/acme/w/audio/reservations").text
        assert "vision-only" not in page and "launch" not in page
        assert h.get(f"{WS}/reservations").status_code == 404
    with _h(c, c.admin_token) as h:
        r = h.post(f"{SETTINGS}/vision-only/delete", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"{SETTINGS}?deleted=vision-only"
        page = h.get(r.headers["location"]).text
        assert "Reservation vision-only deleted" in page
        row = _row(page, "reservation", "vision-only")
        assert row is None or "Ended" in row
        assert h.post(f"{SETTINGS}/nope/delete").status_code == 404


def test_the_machines_page_shows_pools_and_free_gpus(c):
    with _h(c, c.token) as h:
        page = h.get(f"{WS}/machines").text
        assert '<span class="tag">a100</span>' in _row(page, "machine", "gpu-01")
        assert "a100" not in _row(page, "machine", "gpu-02")
        row = _row(page, "pool", "a100")
        assert row and "gpu-01" in row and "gpu-02" not in row
        assert re.findall(r'<td class="num">(\d+)</td>', row) == ["2", "2"]  # GPUs, free GPUs
        assert '<span class="tag">a100</span>' in h.get(f"{WS}/machines/live").text


def test_new_run_asks_for_pools_and_what_if_stores_nothing(c):
    form = {"mode": "form", "name": "in-pool", "image": "python:3.11", "command": "python", "args": "-c pass",
            "gpus": "1", "machines": "1", "cpus": "", "memory": "", "drives": "", "time_limit": "",
            "restart_policy": "Never", "priority": "0", "start": "Independent", "template": "", "pools": "a100"}
    with _h(c, c.token) as h:
        page = h.get(f"{WS}/runs/new").text
        assert 'name="pools"' in page and "Yours: a100." in page
        r = h.post(f"{WS}/runs/new", data={**form, "action": "whatif"})
        assert r.status_code == 200, r.text[:3000]
        msg = html.unescape(re.search(r'<span id="what-if-message">(.*?)</span>', r.text, re.S).group(1))
        assert msg == "Starts now on gpu-01 (GPUs 0)"
        r = h.post(f"{WS}/runs/new", data={**form, "action": "whatif", "pools": "nope"})
        assert r.status_code == 422
        assert ("spec.task_template.requested_resources.node_selection.pools: no pool named nope in cluster main"
                in _error(r.text))
        with c.client() as api:
            assert api.get("/runs/in-pool").status_code == 404  # the what-if stored nothing
        r = h.post(f"{WS}/runs/new", data={**form, "action": "json"})
        assert '"pools": [' in html.unescape(r.text)
        r = h.post(f"{WS}/runs/new", data={**form, "action": "start"}, follow_redirects=False)
        assert r.status_code == 303, r.text[:3000]
    run = c.run("in-pool")
    assert run["spec"]["task_template"]["requested_resources"]["node_selection"]["pools"] == ["a100"]
    c.wait_for(lambda: c.run("in-pool")["status"]["state"] == "Completed", 60, what="in-pool to complete")
    assert c.worker("in-pool-0")["machine"] == "gpu-01"


def test_settings_limit_a_workspace_to_pools(c):
    url = "/o/acme/settings/clusters/main/workspaces/audio"
    form = {"host_paths": "", "max_priority": "", "weight": "", "quota_gpus": "", "quota_cpu_cores": "",
            "quota_memory_gib": "", "quota_workers": ""}
    with _h(c, c.admin_token) as h:
        page = h.get("/o/acme/settings").text
        assert "<b>a100</b> (gpu-01;" in page
        assert "every machine" in _row(page, "access", "main/audio")
        assert "The cluster's pools: a100." in h.get(url).text
        r = h.post(url, data={**form, "pools": "a100, nope"})
        assert r.status_code == 422 and _error(r.text) == "clusters.main.pools: no pool named nope in cluster main"
        r = h.post(url, data={**form, "pools": "a100"}, follow_redirects=False)
        assert r.status_code == 303, r.text[:3000]
        assert '<span class="tag">a100</span>' in _row(h.get("/o/acme/settings").text, "access", "main/audio")
        with c.admin() as a:
            assert a.get("/workspaces/audio").json()["clusters"]["main"]["pools"] == ["a100"]
        assert 'value="a100"' in h.get(url).text
        r = h.post(url, data={**form, "pools": ""}, follow_redirects=False)  # empty: every machine again
        assert r.status_code == 303
    with c.admin() as a:
        assert a.get("/workspaces/audio").json()["clusters"]["main"]["pools"] is None


@pytest.mark.browser
def test_in_a_browser_an_admin_reserves_and_another_workspace_does_not_see_it(browser, c):
    from tests.console.conftest import shot
    from tests.console.test_browser import sign_in

    start = datetime.now(UTC) + timedelta(days=10)
    ctx, page = sign_in(browser, c, c.admin_token)
    try:
        page.click("nav >> text=Settings")
        page.click("#reservations-link")
        page.wait_for_url(re.compile(r"/settings/reservations$"))
        page.fill("input[name=name]", "browser-window")
        page.fill("input[name=workspaces]", "vision")
        page.fill("input[name=machines]", "gpu-02")
        page.fill("input[name=start]", _iso(start))
        page.fill("input[name=end]", _iso(start - timedelta(minutes=30)))
        page.click("button:has-text('Reserve')")
        assert "end: must be after start" in page.inner_text("#form-error")
        shot(page, "reservation-refused")
        page.fill("input[name=end]", _iso(start + timedelta(hours=1)))
        page.click("button:has-text('Reserve')")
        page.wait_for_url(re.compile(r"/settings/reservations\?saved=browser-window$"))
        row = page.locator("tr[data-reservation=browser-window]")
        assert "Scheduled" in row.inner_text() and "gpu-02" in row.inner_text()
        shot(page, "reservations")
        page.goto(c.server + f"{WS}/machines")
        assert "a100" in page.inner_text("tr[data-machine=gpu-01]")
        assert page.locator("tr[data-pool=a100]").count() == 1
        shot(page, "machines-pools")
    finally:
        ctx.close()
    ctx, page = sign_in(browser, c, c.vars["AUDIO_TOKEN"])
    try:
        page.click("nav >> text=Reservations")
        page.wait_for_url(re.compile(r"/o/acme/w/audio/reservations$"))
        assert page.locator("tr[data-reservation=browser-window]").count() == 0
        assert page.locator("nav >> text=Settings").count() == 0
        shot(page, "reservations-other-workspace")
    finally:
        ctx.close()
