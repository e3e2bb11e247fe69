"""The console's Templates page (list, show as JSON, delete) and New run → from a template (a select that fills the
form; Edit as JSON keeps the template's name), against a real local cluster, over HTTP with a bearer token."""

from __future__ import annotations

import html
import json
import re

import httpx
import pytest

WS = "/o/acme/w/vision"
DRIVE = {"metadata": {"name": "con-ckpt"},
         "spec": {"sources": [{"node": "gpu-01", "path": "/data/astraeus/con-ckpt", "mount_path": "/ckpt",
                               "mode": "ReadWrite"}], "permissions": {"create": True}}}
FT = {"metadata": {"name": "con-ft", "labels": {"kind": "fine-tune"}},
      "spec": {"priority": -100, "task_template": {
          "image": "python:3.11", "command": "bash", "args": ["-c", "echo $GREETING"],
          "env": {"GREETING": "hello"}, "restart_policy": "Never",
          "datavolume_refs": [{"name": "con-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}],
          "requested_resources": {"gpu_requests": {"count": 2}, "per_gpu": {"cpu_cores": 4,
                                                                            "memory_bytes": 16 << 30}}}}}


@pytest.fixture(scope="module")
def c(console_cluster):
    with console_cluster.client() as api:
        assert api.post("/drives", json=DRIVE).status_code == 201
        r = api.post("/templates", json=FT)
        assert r.status_code == 201, r.text
    return console_cluster


def _h(c) -> httpx.Client:
    return httpx.Client(base_url=c.server, headers={"Authorization": f"Bearer {c.token}"}, timeout=30)


def _value(page: str, name: str) -> str:
    m = re.search(rf'<input name="{name}" value="([^"]*)"', page)
    assert m, f"no {name} field"
    return html.unescape(m.group(1))


def test_the_templates_page_lists_shows_and_deletes(c):
    with c.client() as api:
        assert api.post("/templates", json={"metadata": {"name": "con-gone"}, "spec": {"priority": -5}}).status_code \
            == 201
    with _h(c) as h:
        page = h.get(f"{WS}/templates").text
        assert 'href="/o/acme/w/vision/templates"' in page  # in the navigation
        row = re.search(r'<tr data-template="con-ft">(.*?)</tr>', page, re.S).group(1)
        assert "<td>1</td>" in row and "<td>-100</td>" in row and "python:3.11" in row and "con-ckpt:/ckpt" in row
        assert f'href="{WS}/runs/new?template=con-ft"' in row

        shown = h.get(f"{WS}/templates/con-ft").text
        data = json.loads(html.unescape(re.search(r'<pre class="card mono" id="template-json">(.*?)</pre>', shown,
                                                  re.S).group(1)))
        assert data["metadata"]["version"] == 1 and data["spec"]["task_template"]["env"] == {"GREETING": "hello"}
        assert h.get(f"{WS}/templates/nope").status_code == 404

        r = h.post(f"{WS}/templates/con-gone/delete", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"{WS}/templates?deleted=con-gone"
        assert "Template con-gone deleted. Runs made from it stay." in h.get(r.headers["location"]).text
    with c.client() as api:
        assert api.get("/templates/con-gone").status_code == 404


def test_new_run_from_a_template_fills_the_form_and_the_run_names_it(c):
    with _h(c) as h:
        page = h.get(f"{WS}/runs/new").text
        assert '<option value="con-ft"' in page and "From a template" in page
        page = h.get(f"{WS}/runs/new", params={"template": "con-ft"}).text
        assert re.search(r'<option value="con-ft" selected>', page)
        assert "From template" in page and "(version 1)" in page
        assert _value(page, "image") == "python:3.11" and _value(page, "command") == "bash"
        assert _value(page, "args") == ""  # "echo $GREETING" has a space: the form leaves it to the template
        assert _value(page, "gpus") == "2" and _value(page, "cpus") == "4" and _value(page, "memory") == "16G"
        assert _value(page, "drives") == "con-ckpt:/ckpt" and _value(page, "priority") == "-100"
        assert '<input type="hidden" name="template" value="con-ft">' in page

        form = {"mode": "form", "name": "from-con-ft", "template": "con-ft",
                **{k: _value(page, k) for k in ("image", "command", "args", "gpus", "machines", "cpus", "memory",
                                                "drives", "time_limit", "priority")},
                "restart_policy": "Never", "start": "Independent"}
        # Edit as JSON: the same body, naming the template
        r = h.post(f"{WS}/runs/new", data={**form, "action": "json"})
        assert r.status_code == 200
        body = json.loads(html.unescape(re.search(r'<textarea name="spec_json"[^>]*>(.*?)</textarea>', r.text,
                                                  re.S).group(1)))
        assert body["spec"]["template"] == "con-ft" and "args" not in body["spec"]["task_template"]

        r = h.post(f"{WS}/runs/new", data={**form, "action": "start"}, follow_redirects=False)
        assert r.status_code == 303, r.text[:2000]
        assert r.headers["location"] == f"{WS}/jobs/main/from-con-ft"
        page = h.get(r.headers["location"]).text
        assert re.search(r'<dd id="run-template"><a href="/o/acme/w/vision/templates/con-ft">con-ft</a> \(version 1\)',
                         page)
    run = c.run("from-con-ft")
    tt = run["spec"]["task_template"]
    assert run["spec"]["template"] == "con-ft" and run["spec"]["priority"] == -100
    assert run["metadata"]["labels"] == {"kind": "fine-tune"}
    assert tt["args"] == ["-c", "echo $GREETING"] and tt["env"] == {"GREETING": "hello"}
    c.wait_for(lambda: "hello" in c.logs("from-con-ft-0"), 60, what="the template's command and env")
    with c.client() as api:
        api.delete("/runs/from-con-ft")


def test_new_run_from_a_template_that_does_not_exist_says_so(c):
    with _h(c) as h:
        r = h.get(f"{WS}/runs/new", params={"template": "nope"})
        assert r.status_code == 404
        assert "template nope not found in workspace vision" in r.text
        r = h.post(f"{WS}/runs/new", data={"mode": "json", "action": "start", "spec_json": json.dumps(
            {"metadata": {"name": "r-nope"}, "spec": {"template": "nope"}})})
        assert r.status_code == 404 and "template nope does not exist in workspace vision" in r.text
        r = h.post(f"{WS}/runs/new", data={"mode": "json", "action": "start", "spec_json": json.dumps(
            {"metadata": {"name": "r-bad"}, "spec": {"template": "con-ft", "task_template": {"imagee": "x"}}})})
        assert r.status_code == 422 and "spec.task_template.imagee: unknown field" in r.text
    with c.client() as api:
        assert api.get("/runs/r-nope").status_code == 404 and api.get("/runs/r-bad").status_code == 404


@pytest.mark.browser
def test_in_a_browser_choosing_a_template_fills_the_form_and_starts_the_run(browser, c):
    from tests.console.conftest import shot
    from tests.console.test_browser import sign_in

    ctx, page = sign_in(browser, c, c.token)
    try:
        page.click("nav >> text=Templates")
        page.wait_for_url(re.compile(r"/templates$"))
        assert page.locator("tr[data-template=con-ft]").count() == 1
        page.goto(c.server + f"{WS}/runs/new")
        page.select_option("select[name=template]", "con-ft")  # the select sends its form by itself
        page.wait_for_url(re.compile(r"/runs/new\?template=con-ft$"))
        assert page.input_value("input[name=image]") == "python:3.11"
        assert page.input_value("input[name=drives]") == "con-ckpt:/ckpt"
        assert page.input_value("input[name=priority]") == "-100"
        page.fill("input[name=name]", "browser-ft")
        shot(page, "new-run-from-template")
        page.click("button:has-text('Start run')")
        page.wait_for_url(re.compile(r"/jobs/main/browser-ft$"))
    finally:
        ctx.close()
    run = c.run("browser-ft")
    assert run["spec"]["template"] == "con-ft" and run["spec"]["task_template"]["env"] == {"GREETING": "hello"}
    with c.client() as api:
        api.delete("/runs/browser-ft")
