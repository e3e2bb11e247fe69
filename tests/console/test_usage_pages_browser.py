"""The Usage page in a real browser (Debian's chromium through Playwright) with real data: short runs of known GPUs
on a live local cluster leave their usage records, and the page shows their charts at desktop width and at phone
width (390 px) without a chart wider than the screen. Screenshots in test-artifacts/console/."""

from __future__ import annotations

import pytest

from tests.console.conftest import shot
from tests.console.test_browser import sign_in, submit_api

pytestmark = pytest.mark.browser

CHARTS = ("chart-workspaces", "chart-users", "chart-utilisation", "chart-queue-wait")


@pytest.fixture(scope="module")
def usage_data(console_cluster):
    """Three short runs (1, 2 and 4 GPUs) ended, and one of 2 GPUs still running: records and a live attempt."""
    c = console_cluster
    for name, gpus in (("short-1", 1), ("short-2", 2), ("short-4", 4)):
        submit_api(c, name, gpus=gpus, args=("-c", "import time; time.sleep(1)"))
    submit_api(c, "long-2", gpus=2)
    c.wait_for(lambda: all(c.run(n)["status"]["state"] == "Completed" for n in ("short-1", "short-2", "short-4"))
               and c.run("long-2")["status"]["state"] == "Running", timeout=90, what="the short runs completed")
    with c.client() as h:
        c.wait_for(lambda: h.get("/usage", params={"since": "1d"}).json()["total"]["attempts"] == 4, timeout=30,
                   what="four attempts in the usage")
    return c


def charts_fit(page, width: int) -> None:
    for cid in CHARTS:
        chart = page.locator(f"svg#{cid}")
        assert chart.is_visible(), cid
        box = chart.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (cid, box, width)
    assert page.locator("svg#chart-workspaces rect.chart-bar").count() >= 1
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_the_usage_page_at_desktop_and_phone_width(browser, usage_data):
    c = usage_data
    ctx, page = sign_in(browser, c, c.admin_token)
    page.click("nav.side a:has-text('Usage')")
    page.wait_for_url("**/usage")
    assert "Organisation" in page.inner_text("#usage-scope")
    charts_fit(page, 1360)
    # the table under the chart has the API's figures
    with c.admin() as a:
        api = a.get("/usage", params={"group_by": "workspace,day", "since": "7d"}).json()
    cells = page.locator("#workspaces-table td.gpu-hours").all_inner_texts()
    assert len(cells) == len(api["items"])  # long-2 still runs: it counts until each one's now
    assert all(abs(float(v) - x["gpu_hours"]) <= 0.01 for v, x in zip(cells, api["items"], strict=True))
    shot(page, "usage")
    page.locator(".charts").screenshot(path=str(shot_path("usage-charts")))
    ctx.close()

    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    p2 = phone.new_page()
    p2.set_default_timeout(20_000)
    p2.goto(c.server + "/sign-in")
    p2.fill("input[name=token]", c.token)  # the workspace's editor: its own workspace only
    p2.click("button:has-text('Sign in')")
    p2.wait_for_url("**/runs")
    p2.goto(p2.url.rsplit("/runs", 1)[0] + "/usage?since=30d")
    assert "Workspace vision" in p2.inner_text("#usage-scope")
    charts_fit(p2, 390)
    shot(p2, "usage-phone")
    phone.close()


def shot_path(name: str):
    from tests.console.conftest import ARTIFACTS

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / f"{name}.png"
