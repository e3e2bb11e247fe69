"""Single sign-on against a real OpenID Connect provider (npm's oidc-provider on 127.0.0.1): an admin's settings
(refused with what to change, the secret never shown back nor in the audit log), `astra login --sso` by the device
flow, and a person whose groups give no role refused with the reason."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading

import httpx

from tests.conftest import VENV_BIN
from tests.sso.conftest import admin, configure, org_api, org_ws, sign_in_at


def test_bad_settings_are_refused_with_what_to_change_and_nothing_stored(sso_cluster, provider):
    _org, ws = org_ws(sso_cluster)
    cases = [({"issuer": "not a url"}, "issuer: 'not a url' is not the provider's issuer URL"),
             ({"client_id": ""}, "client_id: give the client id the provider registered for the console"),
             ({"roles": {}}, "roles: map at least one of the provider's groups"),
             ({"roles": {"ml-editors": {"nowhere": "editor"}}}, "roles.ml-editors.nowhere: no workspace named"),
             ({"roles": {"ml-editors": {ws: "owner"}}}, f"roles.ml-editors.{ws}: unknown role 'owner'"),
             ({"match_by": "phone"}, "match_by: 'phone': give sub"),
             ({"groups_claim": "has space"}, "groups_claim: 'has space'")]
    for extra, said in cases:
        r = configure(sso_cluster, provider, **extra)
        assert r.status_code == 422, (extra, r.text)
        assert said in r.json()["message"], (extra, r.text)
    r = httpx.get(org_api(sso_cluster) + "/sso", headers=admin(sso_cluster), timeout=30)
    assert r.json() == {"configured": False}
    # Without a provider, astra says who sets one up; --sso and --token together are refused.
    done = subprocess.run([str(VENV_BIN / "astra"), "login", "--sso", "--api", sso_cluster.api], env=sso_cluster.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "has no single sign-on: an admin sets it up" in done.stderr, done.stderr
    done = subprocess.run([str(VENV_BIN / "astra"), "login", "--sso", "--token", "x", "--api", sso_cluster.api],
                          env=sso_cluster.env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "give --sso or --token, not both" in done.stderr, done.stderr
    # Only an organisation admin sets it.
    r = httpx.put(org_api(sso_cluster) + "/sso", json={"issuer": provider.issuer},
                  headers={"Authorization": f"Bearer {sso_cluster.token}"}, timeout=30)
    assert r.status_code == 403, r.text


def test_settings_never_show_the_secret(sso_cluster, provider):
    r = configure(sso_cluster, provider)
    assert r.status_code == 200, r.text
    got = httpx.get(org_api(sso_cluster) + "/sso", headers=admin(sso_cluster), timeout=30)
    assert got.json()["client_secret_set"] is True and got.json()["issuer"] == provider.issuer
    audit = httpx.get(org_api(sso_cluster) + "/audit", headers=admin(sso_cluster), timeout=30)
    assert audit.status_code == 200
    for text in (r.text, got.text, audit.text):
        assert "console-secret" not in text
    # A field left out keeps its value; the secret stays.
    r = httpx.put(org_api(sso_cluster) + "/sso", json={"groups_claim": "groups"}, headers=admin(sso_cluster),
                  timeout=30)
    assert r.status_code == 200 and r.json()["client_secret_set"] is True, r.text


def test_an_id_token_that_is_not_the_providers_is_refused(sso_cluster, provider):
    assert configure(sso_cluster, provider).status_code == 200
    url = org_api(sso_cluster) + "/sso/token"
    r = httpx.post(url, json={"id_token": "nonsense"}, timeout=30)
    assert r.status_code == 422 and "id_token: give the ID token" in r.json()["message"], r.text
    stranger = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.x"  # no iss: refused before asking the provider
    r = httpx.post(url, json={"id_token": stranger}, timeout=30)
    assert r.status_code == 401 and "not issued by this organisation's provider" in r.json()["message"], r.text

    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    forged = f"{b64({'alg': 'RS256', 'kid': 'x'})}.{b64({'iss': provider.issuer, 'sub': 'alice'})}.c2ln"
    r = httpx.post(url, json={"id_token": forged}, timeout=30)
    assert r.status_code == 401 and "ID token was not accepted" in r.json()["message"], r.text


def astra_login_sso(cluster, login: str) -> subprocess.CompletedProcess:
    """`astra login --sso`, with the test as the person: it opens the URL astra prints and signs in as `login`."""
    p = subprocess.Popen([str(VENV_BIN / "astra"), "login", "--sso", "--api", cluster.api], env=cluster.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    for line in p.stderr:
        said.append(line)
        m = re.search(r"\(or open (\S+)\)", line)
        if m:
            threading.Thread(target=sign_in_at, args=(m.group(1), login), daemon=True).start()
            break
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, "".join(said) + err)


def test_astra_login_sso_by_the_device_flow_then_runs_with_alices_token(sso_cluster, provider):
    assert configure(sso_cluster, provider).status_code == 200
    _org, ws = org_ws(sso_cluster)
    done = astra_login_sso(sso_cluster, "alice")
    assert done.returncode == 0, done.stderr
    assert re.search(r"Open http://127\.0\.0\.1:\d+/device and enter \S+", done.stderr), done.stderr
    assert f"Logged in as alice to workspace {ws} (editor)" in done.stdout, done.stdout
    env = {k: v for k, v in sso_cluster.env.items() if k not in ("ASTRAEUS_TOKEN", "ASTRAEUS_API")}
    runs = subprocess.run([str(VENV_BIN / "astra"), "astraeus", "runs"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert runs.returncode == 0, runs.stderr
    user = httpx.get(org_api(sso_cluster) + "/users/alice", headers=admin(sso_cluster), timeout=30).json()
    assert user["roles"] == {ws: "editor"} and user["email"] == "alice@example.org"


def test_a_person_without_a_mapped_group_is_refused_with_the_reason(sso_cluster, provider):
    assert configure(sso_cluster, provider).status_code == 200
    done = astra_login_sso(sso_cluster, "carol")
    assert done.returncode != 0
    assert ("Signed in as carol@example.org, but none of your groups (nobody, interns) is given a role here: ask an "
            "admin to map one") in done.stderr, done.stderr
    r = httpx.get(org_api(sso_cluster) + "/users/carol", headers=admin(sso_cluster), timeout=30)
    assert r.status_code == 404  # nothing stored
