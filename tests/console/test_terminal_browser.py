"""The run page's Terminal panel in a real browser (Debian's chromium through Playwright) against a real local
cluster with a running worker: the shell opens on its own, what is typed reaches it, its output appears, and its
exit code is shown. Saved as test-artifacts/console/terminal.png."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.console.conftest import shot
from tests.console.test_browser import sign_in
from tests.faults.conftest import sleeper_run

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_a_shell_in_the_run_page(browser, console_cluster):
    c = console_cluster
    with c.client() as cl:
        assert cl.post("/runs", json=sleeper_run("shell-box", gpus=0)).status_code == 201
        c.wait_for(lambda: cl.get("/workers/shell-box-0").json()["state"] == "Running", 60, what="shell-box-0 running")
    ctx, page = sign_in(browser, c, c.token)
    try:
        page.goto(c.server + "/o/acme/w/vision/jobs/main/shell-box")
        status = page.locator("[data-terminal-status]")
        expect(status).to_have_text("not connected")  # no session until asked for
        page.click("button:has-text('Open a shell')")
        expect(status).to_have_text("connected")
        rows = page.locator("#terminal .xterm-rows")
        expect(rows).to_contain_text("$")  # the shell's prompt
        page.locator("#terminal").click()
        page.keyboard.type("echo $((6*7)); tty")
        page.keyboard.press("Enter")
        lines = page.locator("#terminal .xterm-rows > div")  # one per line of the terminal
        expect(lines.filter(has_text=re.compile(r"^\s*42\s*$"))).to_have_count(1)
        expect(lines.filter(has_text=re.compile(r"^\s*/dev/pts/\d+\s*$"))).to_have_count(1)
        shot(page, "terminal")
        page.keyboard.type("exit 3")
        page.keyboard.press("Enter")
        expect(status).to_have_text("exited with code 3")
        expect(rows).to_contain_text("[exited with code 3]")
        expect(page.locator("[data-terminal-open]")).to_have_text("Open a shell")
    finally:
        ctx.close()
