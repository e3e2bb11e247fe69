"""Registry credentials per workspace (issue 14): `PUT/GET/DELETE $API/registries/<host[:port]>`. The password is
never shown back, logged or put in an event; the machine that runs one of the workspace's own runs gets it in
that worker's assignment (`registry_auth`), for the run's image's registry only, only while it should run; another
workspace never sees or gets it. A run's image is checked at submit. In-process control plane, SQLite and
PostgreSQL, with a machine registered through the agent protocol."""

from __future__ import annotations

import json

from tests.conftest import wait_for

PASSWORD = "pw-9f1c-registry-secret"
OTHER_PASSWORD = "pw-audio-77e2"
REG = {"gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _machine(app, name: str = "gpu-01") -> str:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json={"name": name, **REG})
    assert r.status_code == 200, r.text
    return r.json()["credential"]


def _assignments(app, cred: str, name: str = "gpu-01") -> list[dict]:
    r = app.client.get("/api/v1/agent/assignments", params={"machine": name}, headers=_h(cred))
    assert r.status_code == 200, r.text
    return r.json()["assignments"]


def _submit(app, run: str, image: str, token: str | None = None, api: str | None = None) -> None:
    body = {"metadata": {"name": run}, "spec": {"task_template": {
        "image": image, "command": "sleep", "args": ["600"], "requested_resources": {"gpu_requests": {"count": 1}}}}}
    r = app.client.post((api or app.api) + "/runs", json=body, headers=_h(token or app.boot["token"]))
    assert r.status_code == 201, r.text


def _other_workspace(app, name: str = "audio", role: str = "editor") -> tuple[str, str]:
    """A second workspace with access to the cluster, and a token of it: (its API path, token)."""
    org = f"/api/v1/o/{app.boot['org']}"
    adm = _h(app.boot["admin_token"])
    r = app.client.post(f"{org}/workspaces", json={"name": name, "clusters": {"main": {}}}, headers=adm)
    assert r.status_code == 201, r.text
    r = app.client.post(f"{org}/tokens", json={"kind": "user", "workspace": name, "role": role}, headers=adm)
    assert r.status_code == 201, r.text
    return f"{org}/w/{name}", r.json()["token"]


def _token(app, role: str) -> str:
    r = app.client.post(f"/api/v1/o/{app.boot['org']}/tokens",
                        json={"kind": "user", "workspace": app.boot["workspace"], "role": role},
                        headers=_h(app.boot["admin_token"]))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _refused(r, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    for w in words:
        assert w in body["message"], body
    return body


def test_set_list_show_replace_and_delete_a_credential_without_ever_showing_the_password(app):
    c, h = app.client, app.h()
    r = c.put(f"{app.api}/registries/127.0.0.1:5000", json={"username": "ci", "password": PASSWORD}, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["registry"] == "127.0.0.1:5000" and r.json()["username"] == "ci"
    assert PASSWORD not in r.text
    r = c.put(f"{app.api}/registries/nvcr.io", json={"username": "$oauthtoken", "password": PASSWORD + "-2"}, headers=h)
    assert r.status_code == 201, r.text

    listed = c.get(f"{app.api}/registries", headers=h)
    assert listed.status_code == 200
    items = listed.json()["items"]
    assert [(i["registry"], i["username"]) for i in items] == [("127.0.0.1:5000", "ci"), ("nvcr.io", "$oauthtoken")]
    assert all(i["updated_at"] for i in items)
    assert PASSWORD not in listed.text and "password" not in listed.text

    shown = c.get(f"{app.api}/registries/127.0.0.1:5000", headers=h)
    assert shown.status_code == 200 and shown.json()["username"] == "ci" and PASSWORD not in shown.text

    # Setting it again replaces it (200, not a second entry).
    r = c.put(f"{app.api}/registries/127.0.0.1:5000", json={"username": "ci2", "password": PASSWORD}, headers=h)
    assert r.status_code == 200, r.text
    assert [i["username"] for i in c.get(f"{app.api}/registries", headers=h).json()["items"]] == ["ci2",
                                                                                                 "$oauthtoken"]
    # Docker Hub's other names are docker.io, as image references name it.
    r = c.put(f"{app.api}/registries/index.docker.io", json={"username": "me", "password": PASSWORD}, headers=h)
    assert r.status_code == 201 and r.json()["registry"] == "docker.io"

    r = c.delete(f"{app.api}/registries/nvcr.io", headers=h)
    assert r.status_code == 200 and r.json() == {"registry": "nvcr.io", "deleted": True}
    assert [i["registry"] for i in c.get(f"{app.api}/registries", headers=h).json()["items"]] == [
        "127.0.0.1:5000", "docker.io"]
    _refused(c.get(f"{app.api}/registries/nvcr.io", headers=h), 404, "no credential for registry nvcr.io")

    # The workspace's events say what happened, never the password.
    events = c.get(f"{app.api}/events", headers=h)
    assert "RegistryCredentialSet" in events.text and "RegistryCredentialDeleted" in events.text
    assert PASSWORD not in events.text


def test_bad_input_is_refused_saying_what_to_change(app):
    c, h = app.client, app.h()
    good = {"username": "u", "password": "p"}
    for host, words in [("myregistry", ("no dot or port",)), ("http:", ("not a host[:port]",)),
                        ("bad_host.example.com", ("not a host[:port]",)), ("a.example.com:99999x", ("host[:port]",))]:
        _refused(c.put(f"{app.api}/registries/{host}", json=good, headers=h), 422, "registry", *words)
    _refused(c.put(f"{app.api}/registries/r.example.com", json={"username": "u", "password": ""}, headers=h), 422,
             "password", "empty")
    _refused(c.put(f"{app.api}/registries/r.example.com", json={"username": " ", "password": "p"}, headers=h), 422,
             "username", "empty")
    _refused(c.put(f"{app.api}/registries/r.example.com", json={"username": "u"}, headers=h), 422, "password")
    _refused(c.put(f"{app.api}/registries/r.example.com", json={"username": "u", "password": "p" * 5000}, headers=h),
             422, "password", "4096")
    _refused(c.put(f"{app.api}/registries/r.example.com", json={**good, "email": "x"}, headers=h), 422, "email",
             "unknown field")
    _refused(c.delete(f"{app.api}/registries/r.example.com", headers=h), 404, "no credential for registry "
             "r.example.com", "PUT $API/registries/r.example.com")
    assert c.get(f"{app.api}/registries", headers=h).json()["items"] == []


def test_viewers_list_without_the_username_and_cannot_set_or_delete(app):
    c = app.client
    assert c.put(f"{app.api}/registries/127.0.0.1:5000", json={"username": "ci", "password": PASSWORD},
                 headers=app.h()).status_code == 201
    viewer = _h(_token(app, "viewer"))
    items = c.get(f"{app.api}/registries", headers=viewer).json()["items"]
    assert [(i["registry"], i["username"]) for i in items] == [("127.0.0.1:5000", "******")]
    _refused(c.put(f"{app.api}/registries/127.0.0.1:5000", json={"username": "x", "password": "y"}, headers=viewer),
             403, "editor role")
    _refused(c.delete(f"{app.api}/registries/127.0.0.1:5000", headers=viewer), 403, "editor role")
    assert c.get(f"{app.api}/registries/127.0.0.1:5000", headers=app.h()).json()["username"] == "ci"


def test_a_bad_image_is_refused_at_submit_naming_the_field_and_nothing_is_stored(app):
    c, h = app.client, app.h()
    for image, words in [("Bad Image", ("spec.task_template.image", "no spaces")),
                         ("UPPER/case:1", ("spec.task_template.image", "lowercase")),
                         ("busybox@sha256:123", ("spec.task_template.image", "sha256")),
                         ("busybox:-x", ("spec.task_template.image", "tag"))]:
        body = {"metadata": {"name": "bad-image"}, "spec": {"task_template": {"image": image, "command": "true"}}}
        r = _refused(c.post(f"{app.api}/runs", json=body, headers=h), 422, *words)
        assert r["errors"][0]["field"] == "spec.task_template.image"
    assert c.get(f"{app.api}/runs/bad-image", headers=h).status_code == 404
    assert c.get(f"{app.api}/runs", headers=h).json()["items"] == []
    # What the pages, the examples and the tests name are all good references.
    for i, image in enumerate(["pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", "nvcr.io/nvidia/pytorch:24.08-py3",
                               "python:3.11", "img", "127.0.0.1:5000/team/eval:1", "busybox@sha256:" + "a" * 64]):
        body = {"metadata": {"name": f"good-{i}"}, "spec": {"task_template": {"image": image, "command": "true"}}}
        assert c.post(f"{app.api}/runs", json=body, headers=h).status_code == 201, image


def test_the_credential_reaches_the_machine_only_for_its_workspaces_runs_of_that_registry(app):
    c = app.client
    cred = _machine(app)
    assert c.put(f"{app.api}/registries/127.0.0.1:5000", json={"username": "ci", "password": PASSWORD},
                 headers=app.h()).status_code == 201
    audio_api, audio = _other_workspace(app)
    assert c.put(f"{audio_api}/registries/127.0.0.1:5000", json={"username": "au", "password": OTHER_PASSWORD},
                 headers=_h(audio)).status_code == 201
    # Each workspace sees its own credential only.
    assert [i["username"] for i in c.get(f"{audio_api}/registries", headers=_h(audio)).json()["items"]] == ["au"]
    assert [i["username"] for i in c.get(f"{app.api}/registries", headers=app.h()).json()["items"]] == ["ci"]
    assert PASSWORD not in c.get(f"{audio_api}/registries/127.0.0.1:5000", headers=_h(audio)).text

    _submit(app, "pulls", "127.0.0.1:5000/team/train:1")  # vision, from the registry it has a credential for
    _submit(app, "hub", "python:3.11")  # vision, from Docker Hub: no credential for it
    _submit(app, "theirs", "127.0.0.1:5000/team/train:1", token=audio, api=audio_api)  # audio, same registry
    _submit(app, "none-set", "127.0.0.1:5001/x:1", token=audio, api=audio_api)  # audio, another registry

    def placed():
        got = {a["run"]: a for a in _assignments(app, cred)}
        return got if len(got) == 4 else None

    got = wait_for(placed, timeout=20, what="four workers placed on gpu-01")
    assert got["pulls"]["registry_auth"] == {"registry": "127.0.0.1:5000", "username": "ci", "password": PASSWORD}
    assert got["theirs"]["registry_auth"] == {"registry": "127.0.0.1:5000", "username": "au",
                                              "password": OTHER_PASSWORD}
    assert got["hub"]["registry_auth"] is None
    assert got["none-set"]["registry_auth"] is None
    assert PASSWORD not in json.dumps([got["theirs"], got["hub"], got["none-set"]])
    assert OTHER_PASSWORD not in json.dumps([got["pulls"], got["hub"]])

    # A worker being stopped gets no credential: nothing is pulled for it.
    assert c.delete(f"{app.api}/runs/pulls", headers=app.h()).status_code == 200
    stopping = next(a for a in _assignments(app, cred) if a["run"] == "pulls")
    assert stopping["desired"] == "Stopped" and stopping["registry_auth"] is None
    assert stopping["stop_reason"] == "Stopping: the run was deleted"

    # A deleted credential is no longer given.
    assert c.delete(f"{audio_api}/registries/127.0.0.1:5000", headers=_h(audio)).status_code == 200
    theirs = next(a for a in _assignments(app, cred) if a["run"] == "theirs")
    assert theirs["registry_auth"] is None


def test_astra_sets_lists_and_deletes_credentials_reading_the_password_from_stdin(tmp_path):
    """`astra astraeus registries set|list|delete` against a real local cluster (`astraeus up --runtime process`);
    its machine shows the runtime it runs workers with."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import start_cluster

    astra = str(Path(sys.executable).parent / "astra")
    cluster = start_cluster(tmp_path / "home", extra_args=["--runtime", "process"])
    try:
        def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
            return subprocess.run([astra, "astraeus", *args], env=cluster.env, input=stdin, capture_output=True,
                                  text=True, timeout=60)

        r = run("registries", "set", "127.0.0.1:5000", "-u", "ci", "--password-stdin", stdin=PASSWORD + "\n")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "credential for 127.0.0.1:5000 set (user ci)\n"
        assert PASSWORD not in r.stdout + r.stderr
        # The trailing newline of `echo $TOKEN |` is not part of the password: what machines get is as typed.
        import sqlite3

        with sqlite3.connect(tmp_path / "home" / "astraeus.db") as db:
            assert db.execute("SELECT host, username, password FROM registry_credentials").fetchall() == [
                ("127.0.0.1:5000", "ci", PASSWORD)]

        r = run("registries", "list")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["REGISTRY", "USERNAME", "UPDATED"]
        assert lines[1].split()[:2] == ["127.0.0.1:5000", "ci"]
        assert PASSWORD not in r.stdout
        r = run("registries", "list", "-o", "json")
        assert json.loads(r.stdout)["items"][0]["registry"] == "127.0.0.1:5000" and PASSWORD not in r.stdout

        # No password: one line saying how to give one; a bad host: the API's words.
        r = run("registries", "set", "127.0.0.1:5000", "-u", "ci", stdin="")
        assert r.returncode == 1 and "--password-stdin" in r.stderr and r.stderr.count("\n") == 1
        r = run("registries", "set", "myregistry", "-u", "ci", "--password-stdin", stdin="x")
        assert r.returncode == 1 and "has no dot or port" in r.stderr and r.stderr.count("\n") == 1

        r = run("registries", "delete", "127.0.0.1:5000")
        assert r.returncode == 0 and r.stdout == "credential for 127.0.0.1:5000 deleted\n", r.stderr
        r = run("registries", "delete", "127.0.0.1:5000")
        assert r.returncode == 1 and "no credential for registry 127.0.0.1:5000" in r.stderr

        r = run("machines")
        assert r.returncode == 0, r.stderr
        header, row = r.stdout.splitlines()[:2]
        assert header.split()[-4:] == ["RUNTIME", "ADDRESS", "SHARED", "FS"], header
        assert row.split()[0] == "gpu-01" and row.split()[-2:] == ["process", "127.0.0.1"], row
        assert "(runtime: process)" in (tmp_path / "home" / "up.log").read_text()
    finally:
        cluster.stop()
