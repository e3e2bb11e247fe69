"""The console without a browser (httpx against a real local cluster): a Bearer header opens any page, a page
without a token sends to sign-in, and no page shows another workspace's runs."""

from __future__ import annotations

import re
from html import escape as html_escape

import httpx
import pytest


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def submit(api: str, token: str, name: str) -> None:
    body = {"metadata": {"name": name},
            "spec": {"task_template": {"image": "python:3.11", "command": "python", "args": ["-c", "pass"],
                                       "restart_policy": "Never"}}}
    r = httpx.post(f"{api}/runs", json=body, headers=bearer(token), timeout=30)
    assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def two_workspaces(console_cluster):
    """vision (the cluster's own) and audio, each with a run; a token for each."""
    c = console_cluster
    with c.admin() as a:
        r = a.post("/workspaces", json={"name": "audio", "clusters": {"main": {"max_priority": 0}}})
        assert r.status_code == 201, r.text
        r = a.post("/tokens", json={"kind": "user", "workspace": "audio", "role": "editor"})
        assert r.status_code == 201, r.text
        audio_token = r.json()["token"]
    audio_api = c.api.replace("/w/vision", "/w/audio")
    submit(c.api, c.token, "vision-run")
    submit(audio_api, audio_token, "audio-run")
    return audio_token


PAGES = ["/runs", "/runs/new", "/drives", "/drives/new", "/events", "/machines", "/runs/live", "/events/live",
         "/machines/live", "/jobs/main/vision-run", "/jobs/main/vision-run/live"]


def test_a_bearer_header_opens_every_page(console_cluster, two_workspaces):
    c = console_cluster
    with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
        for path in PAGES:
            r = h.get("/o/acme/w/vision" + path)
            assert r.status_code == 200, (path, r.text[:500])
            assert r.headers["content-type"].startswith("text/html")
        assert "vision-run" in h.get("/o/acme/w/vision/runs").text
        r = h.get("/", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/o/acme/w/vision/runs"
        r = h.get("/console/static/console.js")
        assert r.status_code == 200 and "data-live" in r.text
    with httpx.Client(base_url=c.server, headers=bearer(c.admin_token), timeout=30) as h:
        assert h.get("/o/acme/settings").status_code == 200
    with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
        r = h.get("/o/acme/settings")
        assert r.status_code == 403 and "this needs an organisation admin token" in r.text


def test_without_a_token_pages_send_to_sign_in(console_cluster):
    with httpx.Client(base_url=console_cluster.server, timeout=30) as h:
        r = h.get("/o/acme/w/vision/runs", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in?next=")
        assert h.get("/", follow_redirects=False).headers["location"] == "/sign-in"
        r = h.get("/o/acme/w/vision/runs", headers=bearer("ast_u_nope"))
        assert r.status_code == 401 and "the token is not valid" in r.text


def test_sign_in_sets_a_cookie(console_cluster):
    with httpx.Client(base_url=console_cluster.server, timeout=30) as h:
        r = h.post("/sign-in", data={"token": console_cluster.token, "next": "/o/acme/w/vision/events"},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/o/acme/w/vision/events"
        assert "httponly" in r.headers["set-cookie"].lower()
        assert h.get("/o/acme/w/vision/events").status_code == 200  # the cookie alone
        r = h.post("/sign-in", data={"token": "nope"})
        assert r.status_code == 401 and "the token is not valid" in r.text


def test_another_workspaces_run_is_not_found(console_cluster, two_workspaces):
    c = console_cluster
    audio_token = two_workspaces
    with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
        # audio-run lives in workspace audio: vision's pages do not have it ...
        assert h.get("/o/acme/w/vision/jobs/main/audio-run").status_code == 404
        assert h.get("/o/acme/w/vision/jobs/main/audio-run/live").status_code == 404
        assert "audio-run" not in h.get("/o/acme/w/vision/runs").text
        # ... and a vision token cannot open audio's pages at all.
        r = h.get("/o/acme/w/audio/jobs/main/audio-run")
        assert r.status_code == 404 and "audio-run" not in r.text
        assert h.get("/o/acme/w/audio/runs").status_code == 404
        assert h.post("/o/acme/w/audio/jobs/main/audio-run/delete").status_code == 404
    with httpx.Client(base_url=c.server, headers=bearer(audio_token), timeout=30) as h:
        assert h.get("/o/acme/w/audio/jobs/main/audio-run").status_code == 200
        assert h.get("/o/acme/w/audio/jobs/main/vision-run").status_code == 404


def test_a_viewer_cannot_submit_or_delete(console_cluster, two_workspaces):
    c = console_cluster
    with c.admin() as a:
        viewer = a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"}).json()["token"]
    form = {"mode": "form", "action": "start", "name": "by-viewer", "image": "python:3.11", "command": "python"}
    with httpx.Client(base_url=c.server, headers=bearer(viewer), timeout=30) as h:
        r = h.post("/o/acme/w/vision/runs/new", data=form)
        assert r.status_code == 403
        assert "this needs the editor role in workspace vision; this token has the viewer role" in r.text
        r = h.post("/o/acme/w/vision/jobs/main/vision-run/delete")
        assert r.status_code == 403
    with c.client() as api:
        assert api.get("/runs/by-viewer").status_code == 404
        assert api.get("/runs/vision-run").status_code == 200


def test_the_run_page_shows_the_environment_its_image_maps_to(console_cluster, two_workspaces):
    c = console_cluster
    env = c.wait_for(lambda: c.worker("vision-run-0")["environment"], 60, what="the worker's environment")
    with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
        page = h.get("/o/acme/w/vision/jobs/main/vision-run").text
    assert "python:3.11" in page and f"runs in <code>{env}</code>" in page


def more_options(html: str) -> str:
    """The New run form's More options panel: the <details> whose summary says so."""
    m = re.search(r'<details class="more"[^>]*>\s*<summary>More options</summary>(.*?)</details>', html, re.S)
    assert m, "the New run form has no More options panel"
    return m.group(1)


def test_new_run_form_puts_time_limit_under_more_options_with_priority(console_cluster):
    """The pages: "More options: Priority -100, Time limit 48h." and "New run → More options → Priority. The hint
    says the maximum: Higher runs first and may preempt lower. Up to 0 here." """
    c = console_cluster
    with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
        html = h.get("/o/acme/w/vision/runs/new").text
    more = more_options(html)
    assert re.search(r"<label>Priority <input name=\"priority\"", more)
    assert re.search(r"<label>Time limit <input name=\"time_limit\"", more)
    assert "Higher runs first and may preempt lower. Up to" in more
    main_form = html.split('<details class="more"')[0]
    assert 'name="time_limit"' not in main_form and 'name="priority"' not in main_form
    for label in ("Name", "Image", "Command", "Arguments", "GPUs", "Drives"):
        assert f"<label>{label} <input" in main_form
    assert ">Start run</button>" in html and ">Edit as JSON</button>" in html


def test_more_options_priority_and_time_limit_reach_the_run(console_cluster):
    c = console_cluster
    form = {"mode": "form", "action": "start", "name": "ft-lowprio", "image": "python:3.11", "command": "python",
            "args": "-c pass", "restart_policy": "Never", "priority": "-100", "time_limit": "48h"}
    with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
        r = h.post("/o/acme/w/vision/runs/new", data=form, follow_redirects=False)
        assert r.status_code == 303, r.text[:2000]
        assert r.headers["location"] == "/o/acme/w/vision/jobs/main/ft-lowprio"
        # A form sent back with a time limit opens More options, so what was typed is in sight.
        r = h.post("/o/acme/w/vision/runs/new", data={**form, "priority": "0", "name": "Bad Name"})
        assert r.status_code == 422
        assert re.search(r'<details class="more"[^>]*\bopen\b', r.text)
    spec = c.run("ft-lowprio")["spec"]
    assert spec["priority"] == -100 and spec["task_template"]["time_limit_seconds"] == 172800


ACCESS = "/o/acme/settings/clusters/main/workspaces/vision"


@pytest.mark.parametrize("field, typed, api_body", [
    ("quota_gpus", "-1", {"quota": {"gpus": -1}}),
    ("quota_gpus", str(2**31), {"quota": {"gpus": 2**31}}),
    ("quota_cpu_cores", "-4", {"quota": {"cpu_cores": -4}}),
    ("quota_memory_gib", "-1", {"quota": {"memory_bytes": -(1024**3)}}),
    ("quota_workers", "many", {"quota": {"workers": "many"}}),
    ("max_priority", "5000", {"max_priority": 5000}),
    ("weight", "0", {"weight": 0}),
], ids=["negative-gpus", "gpus-out-of-range", "negative-cpus", "negative-memory", "workers-not-a-number",
        "max-priority-out-of-range", "zero-weight"])
def test_the_access_form_refuses_what_the_api_refuses(console_cluster, field, typed, api_body):
    c = console_cluster
    with c.admin() as a:
        before = a.get("/workspaces/vision").json()
        r = a.patch("/workspaces/vision", json={"clusters": {"main": api_body}})
        assert r.status_code == 422, r.text
        api_message = r.json()["message"]
    with httpx.Client(base_url=c.server, headers=bearer(c.admin_token), timeout=30) as h:
        form = {k: "" for k in ("host_paths", "max_priority", "weight", "quota_gpus", "quota_cpu_cores",
                                "quota_memory_gib", "quota_workers")}
        r = h.post(ACCESS, data={**form, "host_paths": "/data/astraeus", field: typed}, follow_redirects=False)
    assert r.status_code == 422
    assert f'id="form-error">{html_escape(api_message)}' in r.text
    assert f'name="{field}" value="{html_escape(typed)}"' in r.text  # what was typed is kept
    with c.admin() as a:
        assert a.get("/workspaces/vision").json() == before  # nothing stored


def test_the_access_form_saves_through_the_api_service(console_cluster):
    c = console_cluster
    with c.admin() as a:
        before = a.get("/workspaces/vision").json()["clusters"]["main"]
    form = {"host_paths": "\n".join(before["host_paths"]), "max_priority": str(before["max_priority"]),
            "weight": "2", "quota_gpus": "6", "quota_cpu_cores": "", "quota_memory_gib": "1.5", "quota_workers": ""}
    with httpx.Client(base_url=c.server, headers=bearer(c.admin_token), timeout=30) as h:
        r = h.post(ACCESS, data=form, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/o/acme/settings?saved=vision"
    with c.admin() as a:
        after = a.get("/workspaces/vision").json()["clusters"]["main"]
        assert after["weight"] == 2 and after["host_paths"] == before["host_paths"]
        assert after["quota"] == {"gpus": 6, "cpu_cores": None, "memory_bytes": 1536 * 1024**2, "workers": None}
        r = a.patch("/workspaces/vision", json={"clusters": {"main": {"weight": before["weight"],
                                                                      "quota": before["quota"]}}})
        assert r.status_code == 200, r.text
