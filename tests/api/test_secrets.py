"""Secrets (issue 13, item 10): env and config values are shown only to editors (and organisation admins); an
entry marked `"secret": true` is shown to nobody, by the API, the console or the CLI, yet the worker gets it;
the database, the env file and the agent's worker files are 0600 in 0700 folders.

A value the caller may not see reads "******" (docs/api.md, "Secrets"); names, mounts and the `secret` flags stay.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

HIDDEN = "******"
SECRET = "s3cr3t-token-value-8c1f"
SECRET_CONFIG = "password = hunter2-config-77aa"
PLAIN = "plain-value-4b2e"
PLAIN_CONFIG = "log_level = debug-5d3c"
ASTRA = str(Path(sys.executable).parent / "astra")

CHECK = ("import hashlib, os\n"
         "want = os.environ['WANT']\n"
         "got = hashlib.sha256(os.environ['API_KEY'].encode()).hexdigest()\n"
         "print('env', 'MATCH' if got == want else 'MISMATCH', len(os.environ['API_KEY']), flush=True)\n"
         "conf = hashlib.sha256(open('/etc/astraeus-secret-test/key').read().encode()).hexdigest()\n"
         "print('config', 'MATCH' if conf == os.environ['WANT_CONFIG'] else 'MISMATCH', flush=True)\n"
         "import time; time.sleep(600)\n")  # running on, so its folder can be looked at


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def body(name: str = "with-secrets", command: str = "true", args: list[str] | None = None,
         restart_policy: str = "OnFailure") -> dict:
    return {"metadata": {"name": name},
            "spec": {"task_template": {
                "image": "python:3.11", "command": command, "args": args or [], "restart_policy": restart_policy,
                "env": {"PLAIN": PLAIN, "API_KEY": {"value": SECRET, "secret": True},
                        "WANT": sha(SECRET), "WANT_CONFIG": sha(SECRET_CONFIG)},
                "configs": [{"mounts": ["/etc/astraeus-secret-test/app.conf"], "value": PLAIN_CONFIG},
                            {"mounts": ["/etc/astraeus-secret-test/key"], "value": SECRET_CONFIG, "secret": True}],
            }}}


def no_secret(text: str) -> None:
    for value in (SECRET, SECRET_CONFIG):
        assert value not in text, f"a secret value is shown: {text[:2000]}"


def as_editor(tt: dict) -> None:
    assert tt["env"]["PLAIN"] == PLAIN
    assert tt["env"]["API_KEY"] == {"value": HIDDEN, "secret": True}
    assert tt["configs"][0] == {"mounts": ["/etc/astraeus-secret-test/app.conf"], "value": PLAIN_CONFIG,
                                "secret": False}
    assert tt["configs"][1] == {"mounts": ["/etc/astraeus-secret-test/key"], "value": HIDDEN, "secret": True}


def as_viewer(tt: dict) -> None:
    assert set(tt["env"]) == {"PLAIN", "API_KEY", "WANT", "WANT_CONFIG"}  # the names, not the values
    assert tt["env"]["PLAIN"] == HIDDEN and tt["env"]["WANT"] == HIDDEN
    assert tt["env"]["API_KEY"] == {"value": HIDDEN, "secret": True}
    assert [c["value"] for c in tt["configs"]] == [HIDDEN, HIDDEN]
    assert [c["mounts"] for c in tt["configs"]] == [["/etc/astraeus-secret-test/app.conf"],
                                                    ["/etc/astraeus-secret-test/key"]]


def viewer_token(client, boot) -> str:
    org = f"/api/v1/o/{boot['org']}"
    r = client.post(f"{org}/tokens", json={"kind": "user", "workspace": boot["workspace"], "role": "viewer"},
                    headers={"Authorization": f"Bearer {boot['admin_token']}"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


# ------------------------------------------------------------------------- the API and console (in process)
def test_values_by_role_and_secrets_for_nobody(app):
    c, boot = app.client, app.boot
    r = c.post(f"{app.api}/runs", json=body(), headers=app.h())
    assert r.status_code == 201, r.text
    no_secret(r.text)
    as_editor(r.json()["spec"]["task_template"])

    r = c.get(f"{app.api}/runs/with-secrets", headers=app.h())
    assert r.status_code == 200
    no_secret(r.text)
    as_editor(r.json()["spec"]["task_template"])
    r = c.get(f"{app.api}/runs", headers=app.h())
    no_secret(r.text)
    as_editor(r.json()["items"][0]["spec"]["task_template"])

    admin = {"Authorization": f"Bearer {boot['admin_token']}"}  # an organisation admin acts as admin
    r = c.get(f"{app.api}/runs/with-secrets", headers=admin)
    no_secret(r.text)
    as_editor(r.json()["spec"]["task_template"])

    viewer = viewer_token(c, boot)
    for path in ("/runs/with-secrets", "/runs"):
        r = c.get(app.api + path, headers=app.h(viewer))
        assert r.status_code == 200
        no_secret(r.text)
        assert PLAIN not in r.text and PLAIN_CONFIG not in r.text
    as_viewer(c.get(f"{app.api}/runs/with-secrets", headers=app.h(viewer)).json()["spec"]["task_template"])

    # the console's run page: the editor sees the plain values, nobody the secret ones, a viewer no values
    page = f"/o/{boot['org']}/w/{boot['workspace']}/jobs/main/with-secrets"
    html = c.get(page, headers=app.h()).text
    assert "API_KEY" in html and PLAIN in html and PLAIN_CONFIG in html and HIDDEN in html
    no_secret(html)
    html = c.get(page, headers=app.h(viewer)).text
    assert "API_KEY" in html and "PLAIN" in html
    no_secret(html)
    assert PLAIN not in html and PLAIN_CONFIG not in html

    # the stored spec keeps the value: the worker gets it (the end-to-end test below)
    from astraeus.server.db import Run

    with app.cp.sessions() as s:
        run = s.query(Run).filter_by(name="with-secrets").one()
        assert run.spec["task_template"]["env"]["API_KEY"] == {"value": SECRET, "secret": True}


@pytest.mark.parametrize("env, message", [
    ({"K": {"value": 1, "secret": True}}, "env.K"),
    ({"K": {"secret": True}}, "env.K"),
    ({"K": {"value": "v", "secret": True, "hidden": True}}, "env.K"),
    ({"K": {"value": "v", "secret": "maybe"}}, "env.K"),
], ids=["value-not-a-string", "no-value", "unknown-field", "secret-not-a-bool"])
def test_a_bad_env_entry_is_refused_and_nothing_stored(app, env, message):
    b = body("bad-env")
    b["spec"]["task_template"]["env"] = env
    r = app.client.post(f"{app.api}/runs", json=b, headers=app.h())
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("spec.task_template." + message), r.json()
    assert app.client.get(f"{app.api}/runs/bad-env", headers=app.h()).status_code == 404


def test_a_secret_env_value_counts_against_the_env_limits(app):
    from astraeus import spec as S

    b = body("big-secret")
    b["spec"]["task_template"]["env"] = {"K": {"value": "x" * (S.MAX_ENV_VALUE_BYTES + 1), "secret": True}}
    r = app.client.post(f"{app.api}/runs", json=b, headers=app.h())
    assert r.status_code == 422 and "env K is larger than" in r.json()["message"]


# -------------------------------------------------------------------- end to end, through a real cluster
def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.faults
def test_the_worker_gets_the_secret_and_nobody_is_shown_it(cluster):
    c = cluster
    with c.client() as api:
        r = api.post("/runs", json=body("secret-e2e", "python", ["-c", CHECK], "Never"))
        assert r.status_code == 201, r.text
    logs = c.wait_for(lambda: "config " in (x := c.logs("secret-e2e-0")) and x, 60, what="the worker's checks")
    assert f"env MATCH {len(SECRET)}" in logs and "config MATCH" in logs, logs
    run = c.run("secret-e2e")
    assert run["status"]["state"] == "Running", run["status"]
    no_secret(logs)
    no_secret(json.dumps(run))
    as_editor(run["spec"]["task_template"])

    # the CLI shows what the API shows: the plain value to an editor, the secret to nobody
    def astra(*args: str, token: str | None = None) -> str:
        e = dict(c.env)
        if token:
            e["ASTRAEUS_TOKEN"] = token
        p = subprocess.run([ASTRA, "astraeus", *args], env=e, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout

    out = astra("describe", "secret-e2e")
    no_secret(out)
    assert f"PLAIN={PLAIN}" in out and f"API_KEY={HIDDEN} (secret)" in out
    assert "/etc/astraeus-secret-test/key (secret)" in out
    no_secret(astra("runs", "-o", "json"))
    with c.admin() as a:
        viewer = a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"}).json()["token"]
    out = astra("describe", "secret-e2e", token=viewer)
    no_secret(out)
    assert PLAIN not in out and f"PLAIN={HIDDEN}" in out
    html = httpx.get(f"{c.server}/o/acme/w/vision/jobs/main/secret-e2e",
                     headers={"Authorization": f"Bearer {c.token}"}, timeout=30).text
    no_secret(html)
    assert PLAIN in html

    # file modes: the home and the agents' state 0700; the database, the env file and a worker's files 0600
    home = c.home
    assert mode(home) == 0o700
    assert mode(home / "env") == 0o600
    for p in [home / "astraeus.db", home / "astraeus.db-wal", home / "astraeus.db-shm"]:
        if p.exists() or p.name == "astraeus.db":
            assert mode(p) == 0o600, p
    specs = glob.glob(str(home / "agents" / "*" / "workers" / "*" / "spec.json"))
    assert specs, list(home.rglob("*"))
    spec_path = Path(next(p for p in specs if "secret-e2e" in p))
    assert mode(spec_path) == 0o600
    assert mode(spec_path.parent) == 0o700  # the worker's folder
    assert mode(spec_path.parent.parent) == 0o700  # workers/
    assert mode(spec_path.parent.parent.parent) == 0o700  # the agent's state dir
    for name in ("log.jsonl", "shim.log", "started.json", "exit.json"):
        if (spec_path.parent / name).exists():
            assert mode(spec_path.parent / name) == 0o600, name
    assert SECRET in spec_path.read_text()  # (the worker's copy: readable by the agent's user only)
    with c.client() as api:
        assert api.delete("/runs/secret-e2e").status_code == 200
