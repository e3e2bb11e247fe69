"""Attacks on the API: hostile paths (lexical), isolation between workspaces, token lifetimes, secrets at rest.

Items 7, 10 and 11 of "Hostile input and faults". The existing tests in tests/api/test_api.py cover the drive
source path variants (test_drive_paths_are_checked_lexically), the basic cross-workspace 404s
(test_another_workspace_is_invisible) and revocation of a user token (test_revoked_token_is_refused); these
extend them to every name-taking endpoint, every path field, preemption across workspaces, expiry, machine
tokens and secrets in files."""

from __future__ import annotations

import copy
import time

import pytest

from .conftest import wait_for

BAD_PATHS = ["ckpt", "", "/ckpt/", "/ckpt/../etc", "/a/./b", "//ckpt", "/ckpt//x", "/ck\x00pt", "/ckpt/..",
             "../ckpt", "/ckpt/."]
BAD_SOURCES = ["/data/astraeus/../../etc", "/data/astraeus/..", "/data/astraeus/x/..", "/data/./astraeus/x",
               "//data/astraeus/x", "/data//astraeus/x", "/data/astraeus/x/", "/data/astraeus-evil",
               "/data/astraeus-evil/x", "/data/astraeus/x\x00", "data/astraeus", "./data/astraeus/x", "/data",
               "/", "/data/astraeus/../astraeus-evil/x", "/etc"]

DRIVE = {"metadata": {"name": "d1"}, "spec": {"sources": [
    {"node": "gpu-01", "path": "/data/astraeus/d1", "mount_path": "/ckpt", "mode": "ReadWrite"}],
    "transport": "Auto", "permissions": {"create": True}}}


def run_body(name: str, **tt) -> dict:
    t = {"image": "python:3.11", "command": "true"}
    t.update(tt)
    return {"metadata": {"name": name}, "spec": {"task_template": t}}


def _admin(app) -> dict:
    return {"Authorization": f"Bearer {app.boot['admin_token']}"}


def _no_5xx_and_4xx(r) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["message"]


# ---------------------------------------------------------------------------------------- item 7


@pytest.mark.parametrize("path", BAD_SOURCES)
def test_drive_source_paths_are_refused_lexically(app, path):
    bad = copy.deepcopy(DRIVE)
    bad["spec"]["sources"][0]["path"] = path
    _no_5xx_and_4xx(app.client.post(app.api + "/drives", json=bad, headers=app.h()))
    assert app.client.get(app.api + "/drives", headers=app.h()).json()["items"] == []


@pytest.mark.parametrize("path", BAD_PATHS)
def test_mount_paths_are_refused_lexically_everywhere(app, path):
    """The drive's mount_path, a run's datavolume_refs[].mount_path and configs[].mounts[]."""
    bad = copy.deepcopy(DRIVE)
    bad["spec"]["sources"][0]["mount_path"] = path
    _no_5xx_and_4xx(app.client.post(app.api + "/drives", json=bad, headers=app.h()))
    assert app.client.post(app.api + "/drives", json=DRIVE, headers=app.h()).status_code == 201
    r = app.client.post(app.api + "/runs", headers=app.h(), json=run_body(
        "r1", datavolume_refs=[{"name": "d1", "mount_path": path, "mode": "ReadOnly"}]))
    _no_5xx_and_4xx(r)
    r = app.client.post(app.api + "/runs", headers=app.h(), json=run_body(
        "r2", configs=[{"mounts": [path], "value": "x"}]))
    _no_5xx_and_4xx(r)
    assert app.client.get(app.api + "/runs", headers=app.h()).json()["items"] == []


@pytest.mark.parametrize("path", ["relative/x", "/data/astraeus/", "/data/../etc", "/data/x\x00", "//data", ""])
def test_granted_host_paths_are_checked_lexically(app, path):
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", headers=_admin(app),
                         json={"clusters": {"main": {"host_paths": [path]}}})
    _no_5xx_and_4xx(r)
    ws = app.client.get(app.api, headers=app.h()).json()
    assert ws["clusters"][0]["host_paths"] == ["/data/astraeus"]


# --------------------------------------------------------------------------------------- item 10


def _other_workspace(app, name: str = "nlp", **access) -> str:
    r = app.client.post("/api/v1/o/acme/workspaces", headers=_admin(app),
                        json={"name": name, "clusters": {"main": access}})
    assert r.status_code == 201, r.text
    r = app.client.post("/api/v1/o/acme/tokens", headers=_admin(app),
                        json={"kind": "user", "workspace": name, "role": "admin"})
    return r.json()["token"]


def test_every_named_endpoint_refuses_another_workspaces_token(app):
    other = _other_workspace(app)
    assert app.client.post(app.api + "/drives", json=DRIVE, headers=app.h()).status_code == 201
    assert app.client.post(app.api + "/runs", json=run_body("secret-run"), headers=app.h()).status_code == 201
    mine = "/api/v1/o/acme/w/nlp"
    calls = [("get", "", None), ("get", "/runs", None), ("get", "/runs?state=Pending", None),
             ("get", "/runs/secret-run", None), ("delete", "/runs/secret-run", None),
             ("post", "/runs", run_body("intruder")), ("get", "/workers", None),
             ("get", "/workers?run=secret-run", None), ("get", "/workers/secret-run-0", None),
             ("get", "/workers/secret-run-0/logs", None), ("get", "/workers/secret-run-0/logs?follow=true", None),
             ("get", "/drives", None), ("get", "/drives/d1", None), ("delete", "/drives/d1", None),
             ("post", "/drives", DRIVE), ("get", "/events", None), ("get", "/machines", None)]
    for method, path, body in calls:
        kw = {"json": body} if body is not None else {}
        r = app.client.request(method.upper(), app.api + path, headers=app.h(other), **kw)
        assert not 200 <= r.status_code < 300, (method, path, r.status_code)
        assert r.status_code < 500
        assert "secret-run" not in r.text and "d1" not in r.json().get("message", "")
        # the same names asked of its own workspace: not found, never someone else's
        r = app.client.request(method.upper(), mine + path, headers=app.h(other), **kw)
        assert r.status_code < 500
        if path.split("?")[0] not in ("", "/runs", "/workers", "/drives", "/events", "/machines") \
                and method != "post":
            assert r.status_code == 404, (path, r.status_code)
        if "secret-run" not in path:  # a name the caller asked for may be echoed; nothing else of vision's
            assert "secret-run" not in r.text
    # a user token of a workspace cannot use the organisation admin API
    for method, path in [("get", "/workspaces"), ("get", "/workspaces/vision"), ("patch", "/workspaces/vision"),
                         ("get", "/clusters"), ("patch", "/clusters/main"), ("get", "/clusters/main/machines"),
                         ("get", "/tokens"), ("post", "/tokens"), ("delete", "/tokens/1")]:
        r = app.client.request(method.upper(), "/api/v1/o/acme" + path, headers=app.h(other),
                               **({"json": {"kind": "org_admin"}} if method in ("post", "patch") else {}))
        assert r.status_code == 403, (path, r.status_code)
    # nothing of vision's changed
    assert app.client.get(app.api + "/runs/secret-run", headers=app.h()).status_code == 200
    assert app.client.get(app.api + "/drives/d1", headers=app.h()).status_code == 200
    assert [r["metadata"]["name"] for r in app.client.get(app.api + "/runs", headers=app.h()).json()["items"]] == [
        "secret-run"]


def _wait_worker(app, token, api, name, pred, what):
    return wait_for(lambda: (w := app.client.get(f"{api}/workers/{name}", headers=app.h(token)).json())
                    and pred(w) and w, timeout=20, what=what)


def test_preemption_across_workspaces_never_names_the_other_run(app):
    other = _other_workspace(app)
    mt = {"Authorization": f"Bearer {app.boot['machine_token']}"}
    r = app.client.post("/api/v1/agent/register", headers=mt, json={
        "name": "gpu-01", "gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 2})
    assert r.status_code == 200, r.text
    mt = {"Authorization": f"Bearer {r.json()['credential']}"}  # the machine's own credential, for reports
    body = run_body("secret-run", requested_resources={"gpu_requests": {"count": 8}})
    body["spec"]["priority"] = -10
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 201
    ident = f"{app.boot['ns']}.secret-run-0.{r.json()['metadata']['uid']}"  # its identity on the agent protocol
    w = _wait_worker(app, None, app.api, "secret-run-0", lambda w: w["state"] == "Starting", "placement")
    app.client.post("/api/v1/agent/report", headers=mt, json={"machine": "gpu-01", "workers": [
        {"worker": ident, "attempt": w["attempt"], "state": "Running", "pid": 4242}]})
    nlp = "/api/v1/o/acme/w/nlp"
    urgent = run_body("nlp-urgent", requested_resources={"gpu_requests": {"count": 8}})
    assert app.client.post(nlp + "/runs", json=urgent, headers=app.h(other)).status_code == 201
    _wait_worker(app, None, app.api, "secret-run-0", lambda w: w["state"] == "Stopping", "preemption")
    app.client.post("/api/v1/agent/report", headers=mt, json={"machine": "gpu-01", "workers": [
        {"worker": ident, "attempt": w["attempt"], "state": "Exited", "exit_code": 0}]})
    _wait_worker(app, None, app.api, "secret-run-0", lambda w: w["state"] == "Pending", "requeue")
    wait_for(lambda: app.client.get(nlp + "/workers/nlp-urgent-0", headers=app.h(other)).json()["state"]
             == "Starting", timeout=20, what="the urgent run placed")

    def texts(api, token, run):
        h = app.h(token)
        return [app.client.get(f"{api}/runs/{run}", headers=h).text, app.client.get(f"{api}/runs", headers=h).text,
                app.client.get(f"{api}/workers", headers=h).text, app.client.get(f"{api}/events", headers=h).text]

    victim = app.client.get(app.api + "/runs/secret-run", headers=app.h()).json()
    assert victim["status"]["preemptions"] == 1 and victim["status"]["restarts"] == 0
    assert "a job in another namespace" in victim["status"]["reason"]
    assert any("a job in another namespace" in h["reason"] for h in victim["status"]["history"])
    for t in texts(app.api, None, "secret-run"):
        assert "nlp-urgent" not in t
    for t in texts(nlp, other, "nlp-urgent"):
        assert "secret-run" not in t
    # what the machine's agent sees is the machine's business; the workspaces' views above are what matter
    assert app.client.get(app.api + "/runs/secret-run", headers=app.h(other)).status_code == 404


def test_revoked_or_expired_tokens_are_refused_within_a_second(app):
    adm = _admin(app)
    made = app.client.post("/api/v1/o/acme/tokens", headers=adm, json={
        "kind": "user", "workspace": "vision", "role": "editor", "expires_in_seconds": 1.5}).json()
    t0 = time.time()
    assert app.client.get(app.api + "/runs", headers=app.h(made["token"])).status_code == 200
    wait_for(lambda: app.client.get(app.api + "/runs", headers=app.h(made["token"])).status_code == 401,
             timeout=5, interval=0.05, what="expiry")
    assert time.time() - t0 <= 1.5 + 1.0
    r = app.client.get(app.api + "/runs", headers=app.h(made["token"]))
    assert r.status_code == 401 and "expired" in r.json()["message"]
    # revocation: the very next call is refused
    other = app.client.post("/api/v1/o/acme/tokens", headers=adm, json={
        "kind": "user", "workspace": "vision", "role": "editor"}).json()
    assert app.client.get(app.api + "/runs", headers=app.h(other["token"])).status_code == 200
    assert app.client.delete(f"/api/v1/o/acme/tokens/{other['id']}", headers=adm).status_code == 200
    assert app.client.get(app.api + "/runs", headers=app.h(other["token"])).status_code == 401
    # an admin token too
    a2 = app.client.post("/api/v1/o/acme/tokens", headers=adm, json={"kind": "org_admin"}).json()
    assert app.client.get("/api/v1/o/acme/tokens", headers=app.h(a2["token"])).status_code == 200
    app.client.delete(f"/api/v1/o/acme/tokens/{a2['id']}", headers=adm)
    assert app.client.get("/api/v1/o/acme/tokens", headers=app.h(a2["token"])).status_code == 401


def test_machine_and_user_tokens_stay_on_their_side(app):
    mt = app.boot["machine_token"]
    for method, path in [("get", app.api), ("get", app.api + "/runs"), ("post", app.api + "/runs"),
                         ("get", app.api + "/machines"), ("get", "/api/v1/o/acme/workspaces"),
                         ("get", "/api/v1/o/acme/tokens"), ("post", "/api/v1/o/acme/tokens")]:
        r = app.client.request(method.upper(), path, headers=app.h(mt),
                               **({"json": {"kind": "org_admin"}} if method == "post" else {}))
        assert r.status_code in (403, 404), (path, r.status_code)
    for tok in (app.boot["token"], app.boot["admin_token"]):
        for method, path, body in [("post", "/register", {"name": "gpu-09", "gpus": 8}),
                                   ("get", "/assignments?machine=gpu-01", None),
                                   ("post", "/report", {"machine": "gpu-01", "workers": []}),
                                   ("post", "/logs", {"machine": "gpu-01", "lines": []})]:
            r = app.client.request(method.upper(), "/api/v1/agent" + path, headers=app.h(tok),
                                   **({"json": body} if body is not None else {}))
            assert r.status_code == 403, (path, r.status_code)


# --------------------------------------------------------------------------------------- item 11


def test_replayed_or_expired_machine_credentials_are_refused(app):
    adm = _admin(app)
    reg = {"name": "gpu-07", "gpus": 2, "cpu_cores": 8, "memory_bytes": 1 << 34, "stop_grace_seconds": 2}
    exp = app.client.post("/api/v1/o/acme/tokens", headers=adm,
                          json={"kind": "machine", "cluster": "main", "expires_in_seconds": 1}).json()
    assert app.client.post("/api/v1/agent/register", headers=app.h(exp["token"]), json=reg).status_code == 200
    time.sleep(1.1)
    for path, body in [("/register", reg), ("/report", {"machine": "gpu-07", "workers": []}),
                       ("/logs", {"machine": "gpu-07", "lines": []})]:
        r = app.client.post("/api/v1/agent" + path, headers=app.h(exp["token"]), json=body)
        assert r.status_code == 401, (path, r.status_code)
    assert app.client.get("/api/v1/agent/assignments?machine=gpu-07",
                          headers=app.h(exp["token"])).status_code == 401
    # a machine's own credential (gpu-08's, from a join token), revoked: refused at once
    join = app.client.post("/api/v1/o/acme/tokens", headers=adm, json={"kind": "machine", "cluster": "main"}).json()
    r = app.client.post("/api/v1/agent/register", headers=app.h(join["token"]), json={**reg, "name": "gpu-08"})
    rev = {"token": r.json()["credential"]}
    rev["id"] = next(t["id"] for t in app.client.get("/api/v1/o/acme/tokens", headers=adm).json()["items"]
                     if t.get("machine") == "gpu-08")
    assert app.client.post("/api/v1/agent/report", headers=app.h(rev["token"]),
                           json={"machine": "gpu-08", "workers": []}).status_code == 200
    app.client.delete(f"/api/v1/o/acme/tokens/{rev['id']}", headers=adm)
    r = app.client.post("/api/v1/agent/report", headers=app.h(rev["token"]), json={"machine": "gpu-08", "workers": []})
    assert r.status_code == 401
    # the list of tokens never shows a secret
    listed = app.client.get("/api/v1/o/acme/tokens", headers=adm).text
    for secret in (exp["token"], rev["token"], join["token"], app.boot["token"], app.boot["admin_token"],
                   app.boot["machine_token"]):
        assert secret not in listed


@pytest.mark.faults
def test_no_secret_in_plaintext_in_the_database_or_the_logs(cluster):
    """A real `astraeus up`: tokens in use (user, admin, machine, one made through the API, one revoked) never
    appear in the SQLite file, up.log, the agents' logs or their state dirs."""
    with cluster.admin() as adm:
        made = adm.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "editor"}).json()
        gone = adm.post("/tokens", json={"kind": "machine", "cluster": "main"}).json()
        adm.delete(f"/tokens/{gone['id']}")
    secrets = [cluster.token, cluster.admin_token, cluster.vars["ASTRAEUS_MACHINE_TOKEN"], made["token"],
               gone["token"]]
    with cluster.client(made["token"]) as c:
        r = c.post("/runs", json=run_body("talk", command="python", args=["-c", "print('hello', flush=True)"]))
        assert r.status_code == 201, r.text
        wait_for(lambda: c.get("/workers/talk-0/logs").text.strip() == "hello", timeout=30, what="the log line")
        c.get("/runs", headers={"Authorization": "Bearer " + gone["token"]})  # a refused call is logged nowhere
    cluster.stop()
    files = [p for p in cluster.home.rglob("*") if p.is_file() and p.name != "env"]
    assert any(p.name == "astraeus.db" for p in files) and any(p.name == "up.log" for p in files)
    for p in files:
        data = p.read_bytes()
        for s in secrets:
            assert s.encode() not in data, f"a token in plaintext in {p}"
