"""Issue 42, item 5: a drive's folder belongs to one workspace. Another workspace's drive inside it, equal to it or
above it is refused (409 PATH_IN_USE, with a message that names neither the other workspace nor its drive, and
nothing stored), as is a drive holding a folder granted to another workspace; a workspace's own drives may nest as
before. An organisation admin granting a folder inside another workspace's drive is refused, naming it. Two creates
racing (threads in one control plane; on PostgreSQL also two control planes on one database) never both win.
In-process control plane, SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

ORG = "/api/v1/o/acme"
NLP_API = "/api/v1/o/acme/w/nlp"
ADRIVE = "/data/astraeus/team-a/adrive"  # vision's drive `weights` is kept here


def _admin(app) -> dict:
    return {"Authorization": f"Bearer {app.boot['admin_token']}"}


def _body(name: str, path: str, create: bool = True, **where) -> dict:
    src = {"node": "gpu-01", "path": path, "mount_path": "/ckpt", "mode": "ReadWrite", **where}
    if "filesystem" in where:
        src.pop("node")
    return {"metadata": {"name": name}, "spec": {"sources": [src], "transport": "Auto",
                                                 "permissions": {"create": create}}}


def _nlp(app, host_paths: list[str] | None = None) -> str:
    """Workspace nlp on cluster main, granted `host_paths` (the shared /data/astraeus by default): an editor token."""
    r = app.client.post(ORG + "/workspaces", headers=_admin(app),
                        json={"name": "nlp", "clusters": {"main": {"host_paths": host_paths or ["/data/astraeus"]}}})
    assert r.status_code == 201, r.text
    r = app.client.post(ORG + "/tokens", headers=_admin(app), json={"kind": "user", "workspace": "nlp", "role": "editor"})
    return r.json()["token"]


def _create(app, api: str, token: str | None, body: dict):
    return app.client.post(api + "/drives", json=body, headers=app.h(token))


def _names(app, api: str, token: str | None = None) -> list[str]:
    return [d["metadata"]["name"] for d in app.client.get(api + "/drives", headers=app.h(token)).json()["items"]]


def _events(app, api: str, token: str | None = None) -> list[str]:
    return [e["kind"] for e in app.client.get(api + "/events", headers=app.h(token)).json()["items"]]


def test_a_drive_inside_equal_to_or_above_another_workspaces_drive_is_refused(app):
    assert _create(app, app.api, None, _body("weights", ADRIVE)).status_code == 201
    nlp = _nlp(app)
    for path in (ADRIVE + "/ckpt", ADRIVE, "/data/astraeus/team-a", "/data/astraeus"):
        for create in (True, False):
            r = _create(app, NLP_API, nlp, _body("mine", path, create))
            assert r.status_code == 409, (path, r.text)
            body = r.json()
            assert body["code"] == "PATH_IN_USE"
            assert body["message"] == (f"spec.sources[0].path {path} overlaps a folder another workspace uses; "
                                       "choose a path outside it")
            assert "vision" not in r.text and "weights" not in r.text
    # nothing stored
    assert _names(app, NLP_API, nlp) == [] and "DriveCreated" not in _events(app, NLP_API, nlp)
    assert _names(app, app.api) == ["weights"]
    # beside it, and a name that only starts like it, are fine
    assert _create(app, NLP_API, nlp, _body("beside", "/data/astraeus/team-a/bdrive")).status_code == 201
    assert _create(app, NLP_API, nlp, _body("prefix", ADRIVE + "-2")).status_code == 201
    # the same folder on another machine is another folder
    assert _create(app, NLP_API, nlp, _body("elsewhere", ADRIVE, node="gpu-02")).status_code == 201
    assert _names(app, NLP_API, nlp) == ["beside", "elsewhere", "prefix"]


def test_a_workspaces_own_drives_may_nest_as_before(app):
    for name, path in (("outer", ADRIVE), ("inner", ADRIVE + "/ckpt"), ("same", ADRIVE), ("top", "/data/astraeus")):
        r = _create(app, app.api, None, _body(name, path))
        assert r.status_code == 201, (path, r.text)
    assert _names(app, app.api) == ["inner", "outer", "same", "top"]


def test_a_drive_holding_a_folder_granted_to_another_workspace_is_refused(app):
    _nlp(app, ["/data/astraeus/nlp-area"])
    for path in ("/data/astraeus", "/data/astraeus/nlp-area"):
        r = _create(app, app.api, None, _body("big", path))
        assert r.status_code == 409 and r.json()["code"] == "PATH_IN_USE", r.text
        assert "nlp" not in r.json()["message"].replace(path, ""), r.text
    assert _names(app, app.api) == []
    # a shared grant (both workspaces have /data/astraeus) is where both make drives, apart
    r = app.client.patch(ORG + "/workspaces/nlp", headers=_admin(app),
                         json={"clusters": {"main": {"host_paths": ["/data/astraeus/nlp-area", "/data/astraeus"]}}})
    assert r.status_code == 200, r.text
    assert _create(app, app.api, None, _body("mine", "/data/astraeus/vision-area/x")).status_code == 201


def test_drives_on_a_shared_filesystem_overlap_by_their_folders_there_and_on_each_machine(app):
    r = app.client.post("/api/v1/agent/register", headers=app.h(app.boot["machine_token"]),
                        json={"name": "gpu-02", "gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40,
                              "stop_grace_seconds": 1, "shared_filesystems": {"lab": "/mnt/lab"}})
    assert r.status_code == 200, r.text
    r = app.client.patch(ORG + "/workspaces/vision", headers=_admin(app),
                         json={"clusters": {"main": {"host_paths": ["/data/astraeus", "lab:/vision"]}}})
    assert r.status_code == 200, r.text
    assert _create(app, app.api, None, _body("ft", "/vision/ft", filesystem="lab")).status_code == 201
    nlp = _nlp(app, ["lab:/", "/mnt/lab"])
    r = _create(app, NLP_API, nlp, _body("in", "/vision/ft/x", filesystem="lab"))
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("spec.sources[0].path /vision/ft/x in shared filesystem lab overlaps a folder "
                                   "another workspace uses; choose a path outside it")
    # the same folder through the machine that mounts the filesystem
    r = _create(app, NLP_API, nlp, _body("via-machine", "/mnt/lab/vision", node="gpu-02"))
    assert r.status_code == 409 and r.json()["code"] == "PATH_IN_USE", r.text
    assert _names(app, NLP_API, nlp) == []
    assert _create(app, NLP_API, nlp, _body("own", "/nlp/ft", filesystem="lab")).status_code == 201


def test_an_admin_granting_a_folder_inside_another_workspaces_drive_is_refused(app):
    assert _create(app, app.api, None, _body("weights", ADRIVE)).status_code == 201
    # a new workspace: refused, and not made
    r = app.client.post(ORG + "/workspaces", headers=_admin(app),
                        json={"name": "nlp", "clusters": {"main": {"host_paths": [ADRIVE + "/ckpt"]}}})
    assert r.status_code == 409, r.text
    assert r.json() == {"code": "PATH_IN_USE", "message": (
        f"clusters.main.host_paths: {ADRIVE}/ckpt overlaps drive weights of workspace vision (gpu-01 at {ADRIVE}): "
        "grant a folder outside it")}
    assert app.client.get(ORG + "/workspaces/nlp", headers=_admin(app)).status_code == 404
    # an existing one: refused, its grants unchanged
    _nlp(app)
    for path in (ADRIVE, ADRIVE + "/ckpt"):
        r = app.client.patch(ORG + "/workspaces/nlp", headers=_admin(app),
                             json={"clusters": {"main": {"host_paths": ["/data/astraeus", path], "weight": 5}}})
        assert r.status_code == 409 and r.json()["code"] == "PATH_IN_USE", r.text
        assert "drive weights of workspace vision" in r.json()["message"]
    acc = app.client.get(ORG + "/workspaces/nlp", headers=_admin(app)).json()["clusters"]["main"]
    assert acc["host_paths"] == ["/data/astraeus"] and acc["weight"] == 1
    # a folder that holds it (a shared root) is a grant like /data/astraeus: drives made in it stay apart
    r = app.client.patch(ORG + "/workspaces/nlp", headers=_admin(app),
                         json={"clusters": {"main": {"host_paths": ["/data/astraeus", "/data/astraeus/team-a"]}}})
    assert r.status_code == 200, r.text
    # vision's own grant may be anything
    r = app.client.patch(ORG + "/workspaces/vision", headers=_admin(app),
                         json={"clusters": {"main": {"host_paths": ["/data/astraeus", ADRIVE + "/ckpt"]}}})
    assert r.status_code == 200, r.text


def _post(go: threading.Barrier, got: dict, who: str, fn, body: dict) -> None:
    go.wait()
    got[who] = fn(body).status_code


def _race(app, rounds: int, vision_post, nlp_post) -> None:
    """Each round, vision and nlp create overlapping drives at the same moment: exactly one wins."""
    for i in range(rounds):
        bodies = {"vision": _body(f"r{i}", f"/data/astraeus/race/{i}/deep"),
                  "nlp": _body(f"r{i}", f"/data/astraeus/race/{i}")}
        got: dict[str, int] = {}
        go = threading.Barrier(2)
        threads = [threading.Thread(target=_post, args=(go, got, who, fn, bodies[who]))
                   for who, fn in (("vision", vision_post), ("nlp", nlp_post))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got.values()) == [201, 409], (i, got)


def _check_race_stored(app, nlp: str, rounds: int) -> None:
    v, n = set(_names(app, app.api)), set(_names(app, NLP_API, nlp))
    assert not v & n and len(v | n) == rounds  # one drive per round, in one workspace


def test_two_creates_racing_never_both_win(app):
    nlp = _nlp(app)
    _race(app, 12, lambda b: _create(app, app.api, None, b), lambda b: _create(app, NLP_API, nlp, b))
    _check_race_stored(app, nlp, 12)


@pytest.mark.postgres
def test_two_control_planes_racing_never_both_win(app, tmp_path):
    if not app.url.startswith("postgresql"):
        pytest.skip("two control planes share a database on PostgreSQL only")
    from tests.conftest import make_app

    nlp = _nlp(app)
    other, _boot, cp, _ = make_app(tmp_path / "replica", app.url, run_loop=False)
    try:
        with other:
            _race(app, 12, lambda b: _create(app, app.api, None, b),
                  lambda b: other.post(NLP_API + "/drives", json=b, headers=app.h(nlp)))
    finally:
        cp.engine.dispose()
    _check_race_stored(app, nlp, 12)
