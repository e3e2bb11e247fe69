"""Fixtures for the console's tests: one real local cluster per module, and Debian's chromium via Playwright."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, start_cluster

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts" / "console"


@pytest.fixture(scope="module")
def console_cluster(tmp_path_factory):
    """A local cluster (gpu-01, 8 simulated GPUs, 2 s stop grace) shared by a module's tests."""
    c = start_cluster(tmp_path_factory.mktemp("console") / "home")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is not installed: `make test` installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def shot(page, name: str) -> None:
    """Save a screenshot of the page as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
