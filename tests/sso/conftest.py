"""Fixtures for single sign-on: a real OpenID Connect provider (npm's oidc-provider, tests/sso/provider/) on
127.0.0.1 beside a real local cluster, and the provider's own pages driven as a person would (`sign_in_at`)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from tests.conftest import free_port, start_cluster

PROVIDER = Path(__file__).parent / "provider"


def npm_ci() -> None:
    """The provider's packages, as package-lock.json pins them (once per clean clone)."""
    if (PROVIDER / "node_modules" / "oidc-provider").exists():
        return
    if not shutil.which("npm"):
        pytest.fail("npm is not installed: `make test` installs nodejs and npm (apt-get install nodejs npm)")
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PROVIDER, check=True, timeout=600)


@dataclass
class Provider:
    issuer: str
    proc: subprocess.Popen


@pytest.fixture(scope="module")
def sso_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("sso") / "home")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def provider(sso_cluster, tmp_path_factory):
    npm_ci()
    port = free_port()
    log = open(tmp_path_factory.mktemp("provider") / "provider.log", "wb")
    proc = subprocess.Popen(["node", "provider.js"], cwd=PROVIDER, stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": "/usr/bin:/bin", "PORT": str(port),
                                 "CONSOLE_REDIRECT_URI": sso_cluster.server + "/sso/callback"})
    issuer = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            if httpx.get(issuer + "/.well-known/openid-configuration", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.time() < deadline, Path(log.name).read_text()
        time.sleep(0.2)
    yield Provider(issuer, proc)
    proc.terminate()
    proc.wait(10)


def org_ws(cluster) -> tuple[str, str]:
    parts = cluster.api.split("/o/")[1].split("/")
    return parts[0], parts[2]


def org_api(cluster) -> str:
    return cluster.api.rsplit("/w/", 1)[0]


def admin(cluster) -> dict:
    return {"Authorization": f"Bearer {cluster.admin_token}"}


def configure(cluster, provider: Provider, **extra) -> httpx.Response:
    _org, ws = org_ws(cluster)
    body = {"name": "Test IdP", "issuer": provider.issuer, "client_id": "astraeus-console",
            "client_secret": "console-secret", "cli_client_id": "astraeus-cli",
            "roles": {"ml-editors": {ws: "editor"}}, **extra}
    return httpx.put(org_api(cluster) + "/sso", json=body, headers=admin(cluster), timeout=30)


def _forms(page: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """Each form of an HTML page: its action, its named inputs' values, and its submit buttons' texts."""
    out = []
    for m in re.finditer(r"<form([^>]*)>(.*?)</form>", page, re.S | re.I):
        action = re.search(r'action="([^"]*)"', m.group(1))
        fields = {}
        for tag in re.findall(r"<input[^>]*>", m.group(2)):
            name, value = re.search(r'name="([^"]+)"', tag), re.search(r'value="([^"]*)"', tag)
            if name:
                fields[html.unescape(name.group(1))] = html.unescape(value.group(1)) if value else ""
        buttons = re.findall(r"<button[^>]*>(.*?)</button>", m.group(2), re.S)
        out.append((html.unescape(action.group(1)) if action else "", fields, buttons))
    return out


def sign_in_at(url: str, login: str) -> str:
    """Plays the person at the provider's pages (httpx, no browser): opens `url` (a device verification URL),
    submits each form (the code's confirmation, the login as `login`, the consent) until none is left; the last
    page's text."""
    with httpx.Client(follow_redirects=True, timeout=30) as http:
        r = http.get(url)
        for _ in range(8):
            forms = [f for f in _forms(r.text) if f[0] or f[1]]
            if not forms:
                return r.text
            action, fields, _buttons = forms[0]
            if "login" in fields or "password" in fields:
                fields.update(login=login, password="any")
            r = http.post(urljoin(str(r.url), action or str(r.url)), data=fields)
        return r.text
