"""The run page's Terminal panel comes in when a worker starts, without a reload (issue 44 follow-up): the panel is
on the page for editors from the start, hidden while no worker runs, and the page's live part (refreshed about once
a second) lists the running workers for terminal.js to show it. HTTP here; tests/console/
test_terminal_live_browser.py watches it happen in a browser."""

from __future__ import annotations

import re

import pytest

from tests.console.test_http import signed_in
from tests.faults.conftest import sleeper_run

pytestmark = pytest.mark.timeout(180)

PAGE = "/o/acme/w/vision/jobs/main/later"


def running_marker(html: str) -> str:
    m = re.search(r'data-running-workers="([^"]*)"', html)
    assert m, "the run's live part lists no running workers"
    return m.group(1)


def test_the_terminal_panel_is_hidden_until_a_worker_runs_and_the_live_part_says_when(console_cluster):
    c = console_cluster
    body = sleeper_run("later", gpus=0)
    body["spec"]["held"] = True  # Pending until released: no worker runs yet
    with c.client() as cl:
        assert cl.post("/runs", json=body).status_code == 201
    try:
        with signed_in(c, c.token) as h:
            page = h.get(PAGE).text
            assert '<section class="card" id="terminal-panel" hidden>' in page
            assert 'data-terminal="/api/v1/o/acme/w/vision/runs/later/exec"' in page
            assert running_marker(h.get(PAGE + "/live").text) == ""
            with c.client() as cl:
                assert cl.patch("/runs/later", json={"held": False}).status_code == 200
                c.wait_for(lambda: cl.get("/workers/later-0").json()["state"] == "Running", 60, what="later-0 running")
            assert running_marker(h.get(PAGE + "/live").text) == "0:later-0"
            page = h.get(PAGE).text  # loaded now, the panel is shown at once
            assert '<section class="card" id="terminal-panel">' in page and "Worker later-0" in page
    finally:
        with c.client() as cl:
            cl.delete("/runs/later")
