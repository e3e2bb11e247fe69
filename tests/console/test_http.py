"""The console without a browser (httpx against a real local cluster): a Bearer header opens any page, a page
without a token sends to sign-in, and no page shows another workspace's runs."""

from __future__ import annotations

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
