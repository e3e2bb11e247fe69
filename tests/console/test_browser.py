"""The console in a real browser (Debian's chromium through Playwright) against a real local cluster: sign in,
submit from the form and from Edit as JSON, watch runs change state without a reload, a preemption's reasons and
History, drives, a refused priority, a viewer. Each page is saved as a screenshot in test-artifacts/console/."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.console.conftest import shot

pytestmark = pytest.mark.browser

SLEEP = "import time; time.sleep(600)"


def org_ws(cluster) -> tuple[str, str]:
    parts = cluster.api.split("/o/")[1].split("/")
    return parts[0], parts[2]


def sign_in(browser, cluster, token: str):
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    page.goto(cluster.server + "/")
    assert "/sign-in" in page.url
    page.fill("input[name=token]", token)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/o/[^/]+/w/[^/]+/runs$"))
    return ctx, page


def workspace(cluster) -> dict:
    r = httpx.get(cluster.api, headers={"Authorization": f"Bearer {cluster.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def mark(page) -> None:
    page.evaluate("window.__noReload = 'still here'")


def not_reloaded(page) -> bool:
    return page.evaluate("window.__noReload") == "still here"


def submit_api(cluster, name: str, *, priority: int = 0, gpus: int = 0, args=("-c", SLEEP)) -> None:
    body = {"metadata": {"name": name},
            "spec": {"priority": priority, "start": "Independent",
                     "task_template": {"image": "python:3.11", "command": "python", "args": list(args),
                                       "restart_policy": "Never",
                                       "requested_resources": {"gpu_requests": {"count": gpus}}}}}
    with cluster.client() as c:
        r = c.post("/runs", json=body)
        assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def editor(browser, console_cluster):
    ctx, page = sign_in(browser, console_cluster, console_cluster.token)
    shot(page, "runs-empty")
    yield page
    ctx.close()


def test_sign_in_page(browser, console_cluster):
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(console_cluster.server + "/sign-in")
    page.fill("input[name=token]", "not-a-token")
    page.click("button:has-text('Sign in')")
    assert "the token is not valid" in page.inner_text("[role=alert]")
    shot(page, "sign-in")
    ctx.close()


def test_submit_from_the_form_and_watch_it_finish(editor, console_cluster):
    page = editor
    page.click("a:has-text('New run')")
    assert "split on spaces" in page.inner_text("#args-hint").lower()
    assert "Edit as JSON" in page.inner_text("#args-hint")
    page.fill("input[name=name]", "form-run")
    page.fill("input[name=image]", "python:3.11")
    page.fill("input[name=command]", "python")
    page.fill("input[name=args]", "-u -c print('hello-from-form')")
    page.select_option("select[name=restart_policy]", "Never")
    shot(page, "new-run")
    page.click("button:has-text('Start run')")
    page.wait_for_url(re.compile(r"/jobs/main/form-run$"))
    mark(page)
    page.wait_for_function("document.querySelector('#run-state').textContent.trim() === 'Completed'")
    page.wait_for_function("document.querySelector('#logs').textContent.includes('hello-from-form')")
    assert not_reloaded(page)
    assert "1 of 1 workers succeeded" in page.inner_text("#run-reason")
    assert "gpu-01" in page.inner_text("#workers")
    shot(page, "run-completed")


def test_runs_list_updates_live(editor, console_cluster):
    page = editor
    page.click("nav.side a:has-text('Runs')")
    mark(page)
    submit_api(console_cluster, "live-run", args=("-c", "import time; time.sleep(2)"))
    row = page.locator("tr[data-run='live-run']")
    row.wait_for()
    page.wait_for_function(
        "(() => { const r = document.querySelector(\"tr[data-run='live-run']\");"
        " return r && r.innerText.includes('Running'); })()")
    page.wait_for_function(
        "(() => { const r = document.querySelector(\"tr[data-run='live-run']\");"
        " return r && r.innerText.includes('Completed'); })()")
    assert not_reloaded(page)
    shot(page, "runs")
    for state, rows in (("Completed", 1), ("Pending", 0)):  # each filter a new page: counted once it has loaded
        page.click(f".filters a:has-text('{state}')")
        page.wait_for_url(re.compile(rf"state={state}"))
        page.wait_for_load_state("domcontentloaded")
        expect(page.locator("tr[data-run='live-run']")).to_have_count(rows)


def test_priority_above_the_maximum_is_refused(editor, console_cluster):
    page = editor
    ns = workspace(console_cluster)["id"]
    page.goto(console_cluster.server + "/o/acme/w/vision/runs/new")
    page.click("summary:has-text('More options')")
    assert page.inner_text("#priority-hint") == "Higher runs first and may preempt lower. Up to 0 here."
    assert page.inner_text("#max-priority") == "0"
    page.fill("input[name=name]", "too-high")
    page.fill("input[name=image]", "python:3.11")
    page.fill("input[name=command]", "python")
    page.fill("input[name=priority]", "60")
    page.click("button:has-text('Start run')")
    assert page.inner_text("#form-error").strip() == f"priority 60 is above namespace {ns}'s maximum of 0"
    assert page.input_value("input[name=name]") == "too-high"  # what was typed is kept
    shot(page, "new-run-refused")


def test_preemption_from_edit_as_json(editor, console_cluster):
    page = editor
    submit_api(console_cluster, "scavenger", priority=-100, gpus=1)
    console_cluster.wait_for(lambda: console_cluster.run("scavenger")["status"]["state"] == "Running", 30,
                             what="scavenger running")
    page.goto(console_cluster.server + "/o/acme/w/vision/runs/new")
    page.fill("input[name=name]", "urgent-eval")
    page.click("button:has-text('Edit as JSON')")
    spec = json.loads(page.input_value("#spec-json"))
    assert spec["metadata"]["name"] == "urgent-eval"
    spec["spec"]["task_template"].update({"image": "python:3.11", "command": "python", "args": ["-c", SLEEP],
                                          "restart_policy": "Never"})
    spec["spec"]["task_template"]["requested_resources"] = {"gpu_requests": {"count": 8}, "machines": 1}
    page.fill("#spec-json", json.dumps(spec, indent=2))
    shot(page, "new-run-json")
    page.click("button:has-text('Start run')")
    page.wait_for_url(re.compile(r"/jobs/main/urgent-eval$"))

    page.goto(console_cluster.server + "/o/acme/w/vision/jobs/main/scavenger")
    mark(page)
    page.wait_for_function("(document.querySelector('#console-reason') || {}).textContent"
                           " === 'Paused to make room for higher-priority work'", timeout=30_000)
    reason = page.inner_text("#run-reason")
    assert reason == "Preempted by higher-priority work (urgent-eval); waiting to run again"
    assert "Preempted by urgent-eval" in page.inner_text("#history")
    assert not_reloaded(page)
    page.wait_for_selector("text=Why it is not running yet", timeout=20_000)
    assert "gpu-01" in page.inner_text(".why-not")
    shot(page, "run-preempted")

    page.goto(console_cluster.server + "/o/acme/w/vision/runs")
    page.wait_for_function("document.querySelector(\"tr[data-run='scavenger']\").innerText"
                           ".includes('Preempted by higher-priority work (urgent-eval)')")
    page.goto(console_cluster.server + "/o/acme/w/vision/events")
    assert "Preempted" in page.inner_text("#events")
    shot(page, "events")

    # Delete the urgent run from its page: the scavenger gets its GPU back.
    page.goto(console_cluster.server + "/o/acme/w/vision/jobs/main/urgent-eval")
    page.click("summary:has-text('Delete')")
    page.click("button:has-text('Delete run')")
    page.wait_for_url(re.compile(r"/runs\?deleted=urgent-eval$"))
    console_cluster.wait_for(lambda: console_cluster.run("scavenger")["status"]["state"] == "Running", 30,
                             what="scavenger running again")


def test_machines_page(editor, console_cluster):
    page = editor
    page.click("nav.side a:has-text('Machines')")
    row = page.inner_text("tr[data-machine='gpu-01']")
    assert "Ready" in row
    assert "process" in row  # how its workers run (this test cluster's agents: the process runtime)
    shot(page, "machines")


def test_create_and_delete_a_drive(editor, console_cluster):
    page = editor
    page.click("nav.side a:has-text('Drives')")
    page.click("a:has-text('New drive')")
    page.fill("input[name=name]", "ft-ckpt")
    assert page.input_value("select[name=kind]") == "one-machine"
    page.select_option("select[name=machine]", "gpu-01")
    page.fill("input[name=path]", "/data/astraeus/ft-ckpt")
    page.fill("input[name=mount_path]", "/ckpt")
    page.select_option("select[name=mode]", label="Read-write")
    page.select_option("select[name=transport]", label="RDMA when both have it, else TCP")
    shot(page, "new-drive")
    page.click("button:has-text('Create drive')")
    page.wait_for_url(re.compile(r"/drives$"))
    row = page.inner_text("tr[data-drive='ft-ckpt']")
    assert "/data/astraeus/ft-ckpt" in row and "/ckpt" in row and "Read-write" in row
    shot(page, "drives")
    with console_cluster.client() as c:
        assert c.get("/drives/ft-ckpt").status_code == 200
    page.click("tr[data-drive='ft-ckpt'] summary:has-text('Delete')")
    assert "files stay" in page.inner_text("tr[data-drive='ft-ckpt'] .popover")
    page.click("tr[data-drive='ft-ckpt'] button:has-text('Delete drive')")
    page.wait_for_selector("#drive-deleted")
    assert "files stay" in page.inner_text("#drive-deleted")
    assert page.locator("tr[data-drive='ft-ckpt']").count() == 0
    with console_cluster.client() as c:
        assert c.get("/drives/ft-ckpt").status_code == 404


def test_a_viewer_sees_but_cannot_submit(browser, console_cluster):
    with console_cluster.admin() as a:
        r = a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"})
        assert r.status_code == 201, r.text
        viewer = r.json()["token"]
    ctx, page = sign_in(browser, console_cluster, viewer)
    assert page.locator("tr[data-run='form-run']").count() == 1  # sees the workspace's runs
    assert page.locator("a:has-text('New run')").count() == 0
    page.goto(console_cluster.server + "/o/acme/w/vision/runs/new")
    assert "this needs the editor role in workspace vision; this token has the viewer role" in page.inner_text(
        "#cannot-submit")
    assert page.locator("button:has-text('Start run')").is_disabled()
    shot(page, "new-run-viewer")
    page.goto(console_cluster.server + "/o/acme/w/vision/jobs/main/form-run")
    assert page.locator("summary:has-text('Delete')").count() == 0
    ctx.close()


def test_settings_for_organisation_admins(browser, console_cluster):
    ctx, page = sign_in(browser, console_cluster, console_cluster.admin_token)
    page.click("nav.side a:has-text('Settings')")
    assert "/data/astraeus" in page.inner_text("#clusters")
    shot(page, "settings")
    page.click("tr[data-access='main/vision'] a:has-text('Change')")
    page.fill("textarea[name=host_paths]", "/data/astraeus\n/scratch/vision")
    page.fill("input[name=max_priority]", "50")
    shot(page, "settings-change")
    page.click("button:has-text('Save')")
    page.wait_for_selector("#saved")
    assert "/scratch/vision" in page.inner_text("#clusters")
    assert "50" in page.inner_text("tr[data-ws='vision/main']")
    acc = workspace(console_cluster)["clusters"][0]
    assert acc["max_priority"] == 50 and "/scratch/vision" in acc["host_paths"]
    page.goto(console_cluster.server + "/o/acme/w/vision/runs/new")
    assert page.text_content("#priority-hint") == "Higher runs first and may preempt lower. Up to 50 here."
    assert page.text_content("#max-priority") == "50"
    ctx.close()


def test_the_access_form_refuses_a_quota_the_api_refuses(browser, console_cluster):
    """Settings → Clusters → Change: a negative quota and an out-of-range one are refused with the API's own
    message, what was typed stays in the form, and nothing is stored."""
    c = console_cluster
    with c.admin() as a:
        before = a.get("/workspaces/vision").json()
    ctx, page = sign_in(browser, c, c.admin_token)
    for field, typed, api_quota in (("quota_gpus", "-2", {"gpus": -2}),
                                    ("quota_workers", "99999999999", {"workers": 99999999999})):
        with c.admin() as a:
            r = a.patch("/workspaces/vision", json={"clusters": {"main": {"quota": api_quota}}})
            assert r.status_code == 422, r.text
            api_message = r.json()["message"]
        page.goto(c.server + "/o/acme/settings")
        page.click("tr[data-access='main/vision'] a:has-text('Change')")
        page.fill(f"input[name={field}]", typed)
        page.click("button:has-text('Save')")
        page.wait_for_selector("#form-error")
        assert page.inner_text("#form-error").strip() == api_message
        assert page.input_value(f"input[name={field}]") == typed
        shot(page, f"settings-change-refused-{field}")
    assert api_message == "clusters.main.quota.workers: Input should be less than or equal to 2147483647"
    page.goto(c.server + "/o/acme/settings")
    cells = page.locator("tr[data-ws='vision/main'] td").all_inner_texts()
    assert "-2" not in cells[2:]  # the quotas (the first cell holds the namespace, ws-<hex>, which may read -2…)
    with c.admin() as a:
        assert a.get("/workspaces/vision").json() == before
    ctx.close()


def test_time_limit_is_under_more_options_with_priority(editor, console_cluster):
    page = editor
    page.goto(console_cluster.server + "/o/acme/w/vision/runs/new")
    assert not page.is_visible("input[name=time_limit]") and not page.is_visible("input[name=priority]")
    page.click("summary:has-text('More options')")
    more = page.inner_text("#more-options")
    assert "Priority" in more and "Time limit" in more
    assert page.is_visible("input[name=time_limit]") and page.is_visible("input[name=priority]")
    shot(page, "new-run-more-options")


class OtherSite:
    """A page on another origin (its own port on 127.0.0.1): a form that posts itself to `action` on load."""

    def __init__(self, action: str, fields: dict[str, str]):
        import html
        import http.server
        import threading

        inputs = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                         for k, v in fields.items())
        body = (f'<!doctype html><html><body><h1>Win a GPU</h1><form method="post" action="{html.escape(action)}">'
                f'{inputs}</form><script>document.forms[0].submit()</script></body></html>').encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_cross_origin_form_post_is_refused(browser, console_cluster):
    """Issue 13: a page on another origin that auto-submits a New run form with the signed-in user's cookie
    (127.0.0.1 on another port is the same *site*, so SameSite=Lax still sends it) gets the 403 page, and no
    run is made."""
    c = console_cluster
    ctx, page = sign_in(browser, c, c.token)
    action = c.server + "/o/acme/w/vision/runs/new"
    site = OtherSite(action, {"mode": "form", "action": "start", "name": "csrf-attack", "image": "python:3.11",
                              "command": "python", "args": "-c pass", "restart_policy": "Never"})
    try:
        page.goto(site.url)
        page.wait_for_url(action)
        page.wait_for_selector("[role=alert]")
        assert "403" in page.inner_text("h1")
        assert "this form was sent from another site" in page.inner_text("[role=alert]")
        shot(page, "cross-origin-post-refused")
    finally:
        site.close()
    with c.client() as api:
        assert api.get("/runs/csrf-attack").status_code == 404
    page.goto(c.server + "/o/acme/w/vision/runs")  # still signed in: the console itself works on
    assert page.locator("tr[data-run='csrf-attack']").count() == 0
    ctx.close()


def test_sign_out_ends_the_session_for_the_old_cookie(browser, console_cluster):
    c = console_cluster
    ctx, page = sign_in(browser, c, c.token)
    old = [k for k in ctx.cookies() if k["name"] == "astraeus_session"]
    assert old and old[0]["httpOnly"] and old[0]["value"] != c.token
    page.click("button:has-text('Sign out')")
    page.wait_for_url(re.compile(r"/sign-in"))
    ctx.add_cookies(old)  # the cookie as it was before signing out
    page.goto(c.server + "/o/acme/w/vision/runs")
    assert "/sign-in" in page.url
    assert page.locator("input[name=token]").count() == 1
    shot(page, "after-sign-out")
    ctx.close()
