"""The console without a browser (httpx against a real local cluster): a Bearer header opens any page, a page
without a token sends to sign-in, and no page shows another workspace's runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from html import escape as html_escape

import httpx
import pytest
from sqlalchemy import select


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


@contextmanager
def signed_in(cluster, token: str) -> Iterator[httpx.Client]:
    """A client signed in to the console by its form: it holds the session cookie, and no Authorization header."""
    with httpx.Client(base_url=cluster.server, timeout=30) as h:
        r = h.post("/sign-in", data={"token": token, "next": "/"}, follow_redirects=False)
        assert r.status_code == 303, r.text[:500]
        yield h


def csrf_of(html: str) -> str:
    m = re.search(r'<input type="hidden" name="csrf" value="([^"]+)">', html)
    assert m, "the page's forms carry no CSRF token"
    return m.group(1)


def test_sign_in_sets_a_session_cookie_that_is_not_the_token(console_cluster):
    with httpx.Client(base_url=console_cluster.server, timeout=30) as h:
        r = h.post("/sign-in", data={"token": console_cluster.token, "next": "/o/acme/w/vision/events"},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/o/acme/w/vision/events"
        cookie = r.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=lax" in cookie.lower()
        assert "secure" not in cookie.lower()  # plain http://, no public https URL
        assert console_cluster.token not in cookie  # the session's own secret, never the API token
        assert h.cookies["astraeus_session"].startswith("ast_c_")
        assert h.get("/o/acme/w/vision/events").status_code == 200  # the cookie alone
        r = h.post("/sign-in", data={"token": "nope"})
        assert r.status_code == 401 and "the token is not valid" in r.text
    # the raw API token as a cookie (as the console used to set it) opens nothing
    with httpx.Client(base_url=console_cluster.server, timeout=30,
                      cookies={"astraeus_token": console_cluster.token,
                               "astraeus_session": console_cluster.token}) as h:
        r = h.get("/o/acme/w/vision/runs", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in")


def test_the_cookie_is_secure_behind_an_https_proxy(console_cluster):
    """The rule: `Secure` when ASTRAEUS_PUBLIC_URL is https:// (tests/console/test_http.py::
    test_the_cookie_is_secure_when_the_public_url_is_https) or the request came over HTTPS, as its scheme or a
    TLS-ending proxy's X-Forwarded-Proto: https says."""
    with httpx.Client(base_url=console_cluster.server, timeout=30) as h:
        r = h.post("/sign-in", data={"token": console_cluster.token}, headers={"X-Forwarded-Proto": "https"},
                   follow_redirects=False)
        assert r.status_code == 303
        assert "; secure" in r.headers["set-cookie"].lower()


def test_the_cookie_is_secure_when_the_public_url_is_https(tmp_path):
    from fastapi.testclient import TestClient

    from astraeus.app import create_app
    from astraeus.main import bootstrap
    from astraeus.server.core import ControlPlane
    from astraeus.settings import ServerSettings

    settings = ServerSettings(home=tmp_path / "home", database_url=None, public_url="https://console.example.com")
    cp = ControlPlane.open(settings)
    boot = bootstrap(cp, "acme", "vision", "main", [])
    with TestClient(create_app(settings, cp, run_loop=False)) as h:
        r = h.post("/sign-in", data={"token": boot["token"]}, follow_redirects=False)
        assert r.status_code == 303
        assert "; secure" in r.headers["set-cookie"].lower()
        # the public URL's origin is the console's own: a form sent from there is taken
        r = h.post("/sign-in", data={"token": boot["token"]}, headers={"Origin": "https://console.example.com"},
                   follow_redirects=False)
        assert r.status_code == 303
    cp.engine.dispose()


NEW_RUN = "/o/acme/w/vision/runs/new"


def run_form(name: str) -> dict:
    return {"mode": "form", "action": "start", "name": name, "image": "python:3.11", "command": "python",
            "args": "-c pass", "restart_policy": "Never"}


@pytest.mark.parametrize("csrf", [None, "", "wrong"], ids=["missing", "empty", "wrong"])
def test_a_form_without_its_csrf_token_is_refused(console_cluster, csrf):
    c = console_cluster
    name = f"csrf-{csrf or 'none'}"
    with signed_in(c, c.token) as h:
        form = run_form(name) if csrf is None else {**run_form(name), "csrf": csrf}
        r = h.post(NEW_RUN, data=form, follow_redirects=False)
        assert r.status_code == 403, r.text[:500]
        assert "CSRF token is missing or wrong" in r.text
        r = h.post("/o/acme/w/vision/drives/new", data={"name": "d", "path": "/data/astraeus/d", "csrf": "x"})
        assert r.status_code == 403
    with c.client() as api:
        assert api.get(f"/runs/{name}").status_code == 404  # nothing stored


def test_a_form_with_its_csrf_token_is_taken(console_cluster):
    c = console_cluster
    with signed_in(c, c.token) as h:
        token = csrf_of(h.get(NEW_RUN).text)
        r = h.post(NEW_RUN, data={**run_form("csrf-ok"), "csrf": token}, follow_redirects=False)
        assert r.status_code == 303, r.text[:500]
        # same-origin browsers send Origin; the console's own is taken
        r = h.post(NEW_RUN, data={**run_form("csrf-ok-origin"), "csrf": token}, follow_redirects=False,
                   headers={"Origin": c.server})
        assert r.status_code == 303, r.text[:500]
    with c.client() as api:
        assert api.get("/runs/csrf-ok").status_code == 200
        assert api.get("/runs/csrf-ok-origin").status_code == 200


@pytest.mark.parametrize("header", ["Origin", "Referer"])
def test_a_post_from_another_origin_is_refused_even_with_the_token(console_cluster, header):
    c = console_cluster
    name = f"cross-{header.lower()}"
    other = "http://127.0.0.1:1" if header == "Origin" else "http://evil.example/page.html"
    with signed_in(c, c.token) as h:
        token = csrf_of(h.get(NEW_RUN).text)
        r = h.post(NEW_RUN, data={**run_form(name), "csrf": token}, headers={header: other},
                   follow_redirects=False)
        assert r.status_code == 403
        assert "this form was sent from another site" in r.text
        # a bearer header does not make a cross-origin POST acceptable either
        r = h.post(NEW_RUN, data=run_form(name), headers={header: other, **bearer(c.token)})
        assert r.status_code == 403
        r = h.post("/sign-in", data={"token": c.token}, headers={header: other}, follow_redirects=False)
        assert r.status_code == 403  # no sign-in forced from another site
    with c.client() as api:
        assert api.get(f"/runs/{name}").status_code == 404


def test_sign_out_revokes_the_session(console_cluster):
    c = console_cluster
    with signed_in(c, c.token) as h:
        old = h.cookies["astraeus_session"]
        page = h.get("/o/acme/w/vision/runs")
        assert page.status_code == 200
        r = h.post("/sign-out", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/sign-in"
    with httpx.Client(base_url=c.server, cookies={"astraeus_session": old}, timeout=30) as again:
        r = again.get("/o/acme/w/vision/runs", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in")
        r = again.post(NEW_RUN, data=run_form("after-sign-out"), follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in")


def test_revoking_the_api_token_ends_its_console_sessions(console_cluster):
    c = console_cluster
    with c.admin() as a:
        r = a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "editor"})
        assert r.status_code == 201, r.text
        tid, secret = r.json()["id"], r.json()["token"]
    with signed_in(c, secret) as h:
        assert h.get("/o/acme/w/vision/runs").status_code == 200
        with c.admin() as a:
            assert a.delete(f"/tokens/{tid}").status_code in (200, 204)
        r = h.get("/o/acme/w/vision/runs", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in")


def test_a_session_expires(tmp_path):
    from fastapi.testclient import TestClient
    from sqlalchemy import update

    from astraeus.app import create_app
    from astraeus.main import bootstrap
    from astraeus.server.core import ControlPlane
    from astraeus.server.db import ConsoleSession
    from astraeus.settings import ServerSettings

    settings = ServerSettings(home=tmp_path / "home", database_url=None, console_session_hours=12)
    cp = ControlPlane.open(settings)
    boot = bootstrap(cp, "acme", "vision", "main", [])
    with TestClient(create_app(settings, cp, run_loop=False)) as h:
        r = h.post("/sign-in", data={"token": boot["token"]}, follow_redirects=False)
        assert "max-age=43200" in r.headers["set-cookie"].lower()  # 12 h
        assert h.get("/o/acme/w/vision/runs", follow_redirects=False).status_code == 200
        with cp.sessions() as s, s.begin():
            row = s.scalars(select(ConsoleSession)).one()
            assert 12 * 3600 - 60 < row.expires_at - row.created_at <= 12 * 3600
            s.execute(update(ConsoleSession).values(expires_at=row.created_at))
        r = h.get("/o/acme/w/vision/runs", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/sign-in")
    cp.engine.dispose()


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


def test_the_priority_hint_under_a_negative_maximum_says_minus_one(console_cluster):
    """Negative priorities are always allowed, so under a negative maximum the highest a run may ask for is -1:
    the hint says the highest priority the workspace may ask for, the panel repeats the maximum as set."""
    c = console_cluster
    with c.admin() as a:
        before = a.get("/workspaces/vision").json()["clusters"]["main"]["max_priority"]
        assert a.patch("/workspaces/vision", json={"clusters": {"main": {"max_priority": -5}}}).status_code == 200
    try:
        with httpx.Client(base_url=c.server, headers=bearer(c.token), timeout=30) as h:
            html = h.get("/o/acme/w/vision/runs/new").text
        assert "Higher runs first and may preempt lower. Up to -1 here." in more_options(html)
        assert '<dd id="max-priority">-5</dd>' in html
    finally:
        with c.admin() as a:
            r = a.patch("/workspaces/vision", json={"clusters": {"main": {"max_priority": before}}})
            assert r.status_code == 200


def test_the_drive_form_makes_a_drive_on_a_shared_filesystem(console_cluster):
    """Kind On a shared filesystem: the drive's source names the filesystem (no machine); without its name the
    form says what to give and nothing is stored; the drives page shows where it is."""
    c = console_cluster
    with c.admin() as a:
        paths = a.get("/workspaces/vision").json()["clusters"]["main"]["host_paths"]
        assert a.patch("/workspaces/vision", json={"clusters": {"main": {"host_paths": [*paths, "lab:/"]}}}
                       ).status_code == 200
    base = {"name": "lab-ckpt", "kind": "shared-filesystem", "machine": "gpu-01", "path": "/vision/ckpt",
            "mount_path": "/ckpt", "mode": "ReadWrite", "transport": "Auto"}
    try:
        with signed_in(c, c.token) as h:
            page = h.get("/o/acme/w/vision/drives/new").text
            assert "On a shared filesystem" in page and 'name="filesystem"' in page
            token = csrf_of(page)
            r = h.post("/o/acme/w/vision/drives/new", data={**base, "filesystem": "", "csrf": token})
            assert r.status_code == 422 and "Shared filesystem: give its name" in r.text
            with c.client() as api:
                assert api.get("/drives/lab-ckpt").status_code == 404  # nothing stored
            r = h.post("/o/acme/w/vision/drives/new", data={**base, "filesystem": "lab", "csrf": token},
                       follow_redirects=False)
            assert r.status_code == 303, r.text[:500]
            assert "shared filesystem lab" in h.get("/o/acme/w/vision/drives").text
        with c.client() as api:
            (src,) = api.get("/drives/lab-ckpt").json()["spec"]["sources"]
            assert src == {"filesystem": "lab", "path": "/vision/ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}
            assert api.delete("/drives/lab-ckpt").status_code in (200, 204)
    finally:
        with c.admin() as a:
            a.patch("/workspaces/vision", json={"clusters": {"main": {"host_paths": paths}}})
