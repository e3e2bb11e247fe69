"""The console's single sign-on in a real browser (Debian's chromium) against a real OpenID Connect provider: "Sign in
with Test IdP", the provider's login form as alice, back on the console signed in as an editor of the mapped
workspace; sign-out ends the session; carol, whose groups are not mapped, is refused with the reason."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.console.conftest import browser, shot  # noqa: F401  (browser: the fixture)
from tests.sso.conftest import admin, configure, org_api, org_ws

pytestmark = pytest.mark.browser


def sign_in_with_provider(browser, cluster, login: str):  # noqa: F811
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    page.goto(cluster.server + "/")
    assert "/sign-in" in page.url
    page.click("text=Sign in with Test IdP")
    page.wait_for_selector("input[name=login]")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any")
    page.click("button[type=submit]")
    page.wait_for_selector("button:has-text('Continue')")  # the provider's consent
    page.click("button:has-text('Continue')")
    return ctx, page


def test_console_sign_in_by_the_provider_maps_a_group_to_editor(browser, sso_cluster, provider):  # noqa: F811
    assert configure(sso_cluster, provider).status_code == 200
    org, ws = org_ws(sso_cluster)
    ctx, page = sign_in_with_provider(browser, sso_cluster, "alice")
    page.wait_for_url(re.compile(rf"/o/{org}/w/{ws}/runs$"))
    shot(page, "sso-signed-in")
    user = httpx.get(org_api(sso_cluster) + "/users/alice", headers=admin(sso_cluster), timeout=30).json()
    assert user["roles"] == {ws: "editor"}
    page.goto(f"{sso_cluster.server}/o/{org}/w/{ws}/runs/new")  # an editor's page: no refusal
    assert "needs the editor role" not in page.content()
    page.goto(f"{sso_cluster.server}/o/{org}/w/{ws}/runs")
    page.click("button:has-text('Sign out')")  # the console session ends, then the provider's (its own page)
    page.wait_for_url(re.compile(r"/session/end"))
    page.click("button:has-text('Yes, sign me out')")
    page.wait_for_url(re.compile(r"/sign-in"))
    page.goto(f"{sso_cluster.server}/o/{org}/w/{ws}/runs")
    assert "/sign-in" in page.url  # the session is over
    ctx.close()


def test_console_refuses_a_person_whose_groups_have_no_role(browser, sso_cluster, provider):  # noqa: F811
    assert configure(sso_cluster, provider).status_code == 200
    ctx, page = sign_in_with_provider(browser, sso_cluster, "carol")
    page.wait_for_selector("[role=alert]")
    shot(page, "sso-refused")
    assert ("Signed in as carol@example.org, but none of your groups (nobody, interns) is given a role here: ask an "
            "admin to map one") in page.inner_text("[role=alert]")
    assert "/o/" not in page.url
    ctx.close()
