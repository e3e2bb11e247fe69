"""Run templates (issue 17): `POST/GET/PUT/DELETE $API/templates[/NAME]`, checked like a run's spec (unknown
fields, the drive must exist, the priority cap on create and on update); a run that names one gets its fields
under its own (env and labels by key, drives and configs by mount path) and records the template and its version.
In-process control plane, SQLite and PostgreSQL."""

from __future__ import annotations

import copy

from sqlalchemy import select

from astraeus.server.db import Run

from .test_api import DRIVE

FT = {"metadata": {"name": "ft", "labels": {"team": "vision", "tier": "batch"}},
      "spec": {"priority": -100, "task_template": {
          "image": "python:3.11", "command": "bash", "args": ["-c", "echo hi"],
          "env": {"A": "from-template", "B": "from-template"},
          "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"},
                              {"name": "ft-ckpt", "mount_path": "/data", "mode": "ReadOnly"}],
          "configs": [{"mounts": ["/etc/app.conf"], "value": "template=1"},
                      {"mounts": ["/etc/other.conf"], "value": "kept"}],
          "requested_resources": {"gpu_requests": {"count": 2}}}}}


def _admin(app) -> dict:
    return {"Authorization": f"Bearer {app.boot['admin_token']}"}


def _set_max_priority(app, value: int) -> None:
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": value}}},
                         headers=_admin(app))
    assert r.status_code == 200, r.text


def _drive(app) -> None:
    r = app.client.post(app.api + "/drives", json=DRIVE, headers=app.h())
    assert r.status_code == 201, r.text


def _create(app, body: dict) -> dict:
    r = app.client.post(app.api + "/templates", json=body, headers=app.h())
    assert r.status_code == 201, r.text
    return r.json()


def _refused(r, status: int, code: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    for w in words:
        assert w in body["message"], body
    return body


def _events(app) -> list[tuple[str, str, str]]:
    items = app.client.get(app.api + "/events", headers=app.h()).json()["items"]
    return [(e["kind"], e["object"], e["message"]) for e in items]


def _names(app) -> list[str]:
    r = app.client.get(app.api + "/templates", headers=app.h())
    assert r.status_code == 200, r.text
    return [t["metadata"]["name"] for t in r.json()["items"]]


def _recorded(app, run: str) -> tuple[str | None, int | None]:
    """The template and version the run shows (GET $API/runs/NAME), checked against what the database holds."""
    shown = app.client.get(f"{app.api}/runs/{run}", headers=app.h()).json()["metadata"]["template"]
    with app.cp.sessions() as s:
        row = s.scalar(select(Run).where(Run.name == run, Run.live_key == ""))
        assert (row.template, row.template_version) == ((shown["name"], shown["version"]) if shown else (None, None))
    return (shown["name"], shown["version"]) if shown else (None, None)


def test_create_list_show_replace_and_delete_a_template(app):
    _drive(app)
    out = _create(app, FT)
    assert out["metadata"]["name"] == "ft" and out["metadata"]["version"] == 1
    assert out["metadata"]["labels"] == {"team": "vision", "tier": "batch"}
    assert out["spec"]["priority"] == -100
    assert out["spec"]["task_template"]["env"] == {"A": "from-template", "B": "from-template"}
    assert "start" not in out["spec"]  # kept as given: what it leaves out, the run decides

    assert _names(app) == ["ft"]
    r = app.client.get(app.api + "/templates/ft", headers=app.h())
    assert r.status_code == 200 and r.json()["spec"] == out["spec"]

    changed = copy.deepcopy(FT)
    changed["spec"]["task_template"]["env"] = {"A": "v2"}
    r = app.client.put(app.api + "/templates/ft", json=changed, headers=app.h())
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["version"] == 2 and r.json()["spec"]["task_template"]["env"] == {"A": "v2"}
    r = app.client.put(app.api + "/templates/ft", json=changed, headers=app.h())
    assert r.json()["metadata"]["version"] == 3
    renamed = {**changed, "metadata": {"name": "ft2"}}
    _refused(app.client.put(app.api + "/templates/ft", json=renamed, headers=app.h()), 422, "INVALID",
             "metadata.name: ft2 is not the template in the path (ft)")
    _refused(app.client.put(app.api + "/templates/nope", json={**changed, "metadata": {"name": "nope"}},
                            headers=app.h()), 404, "NOT_FOUND", "template nope not found")
    assert _names(app) == ["ft"]

    r = app.client.delete(app.api + "/templates/ft", headers=app.h())
    assert r.status_code == 200 and r.json() == {"name": "ft", "deleted": True}
    assert _names(app) == []
    _refused(app.client.get(app.api + "/templates/ft", headers=app.h()), 404, "NOT_FOUND", "template ft not found")
    kinds = [(k, o) for k, o, _ in _events(app) if k.startswith("Template")]
    assert kinds == [("TemplateDeleted", "ft"), ("TemplateChanged", "ft"), ("TemplateChanged", "ft"),
                     ("TemplateCreated", "ft")]
    assert any(m == "template ft changed (version 3); runs made from now on use it" for _, _, m in _events(app))


def test_bad_templates_name_the_field_and_nothing_is_stored(app):
    _drive(app)
    cases = [
        ({**FT, "spec": {"task_template": {"imagee": "python:3.11"}}}, 422,
         "spec.task_template.imagee: unknown field"),
        ({**FT, "spec": {"priority": "high"}}, 422, "spec.priority"),
        ({**FT, "spec": {"start": "Sometimes"}}, 422, "spec.start"),
        ({**FT, "spec": {"task_template": {"image": "Bad Image"}}}, 422, "spec.task_template.image"),
        ({**FT, "spec": {"template": "other"}}, 422, "spec.template"),
        ({**FT, "status": {}}, 422, "status: unknown field"),
        ({"metadata": {"name": "Not_A_Name"}, "spec": {}}, 422, "metadata.name"),
        ({"metadata": {"name": "ft"}}, 422, "spec: field required"),
        ({"metadata": {"name": "ft"}, "spec": []}, 422, "spec"),
    ]
    for body, status, words in cases:
        r = app.client.post(app.api + "/templates", json=body, headers=app.h())
        _refused(r, status, "INVALID", words)
    assert _names(app) == []
    assert not [k for k, _, _ in _events(app) if k.startswith("Template")]


def test_a_template_s_drive_must_exist_on_create_and_on_update(app):
    r = app.client.post(app.api + "/templates", json=FT, headers=app.h())
    _refused(r, 400, "DRIVE_NOT_FOUND", "drive ft-ckpt does not exist in workspace vision", "POST $API/drives")
    assert _names(app) == []
    _drive(app)
    _create(app, FT)
    other = copy.deepcopy(FT)
    other["spec"]["task_template"]["datavolume_refs"] = [{"name": "scratch", "mount_path": "/scratch"}]
    r = app.client.put(app.api + "/templates/ft", json=other, headers=app.h())
    _refused(r, 400, "DRIVE_NOT_FOUND", "spec.task_template.datavolume_refs[0]: drive scratch does not exist")
    assert app.client.get(app.api + "/templates/ft", headers=app.h()).json()["metadata"]["version"] == 1


def test_the_priority_cap_applies_on_create_and_on_update(app):
    _set_max_priority(app, 50)
    ns = app.client.get(app.api, headers=app.h()).json()["id"]
    high = {"metadata": {"name": "urgent"}, "spec": {"priority": 60}}
    r = app.client.post(app.api + "/templates", json=high, headers=app.h())
    assert r.status_code == 403, r.text
    assert r.json() == {"code": "PRIORITY_NOT_ALLOWED", "message": f"priority 60 is above namespace {ns}'s maximum "
                                                                   "of 50"}
    assert _names(app) == []
    _create(app, {"metadata": {"name": "urgent"}, "spec": {"priority": 50}})
    r = app.client.put(app.api + "/templates/urgent", json=high, headers=app.h())
    assert r.status_code == 403 and r.json()["code"] == "PRIORITY_NOT_ALLOWED", r.text
    shown = app.client.get(app.api + "/templates/urgent", headers=app.h()).json()
    assert shown["spec"]["priority"] == 50 and shown["metadata"]["version"] == 1
    _create(app, {"metadata": {"name": "scavenger"}, "spec": {"priority": -1000}})  # negatives are always allowed


def test_a_run_from_a_template_merges_by_key_and_mount_path_and_records_the_version(app):
    _drive(app)
    _create(app, FT)
    body = {"metadata": {"name": "ft-1", "labels": {"tier": "urgent", "owner": "ana"}},
            "spec": {"template": "ft", "task_template": {
                "env": {"B": "from-run", "C": "from-run"},
                "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/data", "mode": "ReadWrite"}],
                "configs": [{"mounts": ["/etc/app.conf"], "value": "run=1"}],
                "requested_resources": {"gpu_requests": {"count": 1}}}}}
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 201, r.text
    run = app.client.get(app.api + "/runs/ft-1", headers=app.h()).json()
    tt = run["spec"]["task_template"]
    assert run["metadata"]["labels"] == {"team": "vision", "tier": "urgent", "owner": "ana"}
    assert tt["env"] == {"A": "from-template", "B": "from-run", "C": "from-run"}
    assert sorted((d["mount_path"], d["mode"]) for d in tt["datavolume_refs"]) == [("/ckpt", "ReadWrite"),
                                                                                   ("/data", "ReadWrite")]
    assert sorted((c["mounts"][0], c["value"]) for c in tt["configs"]) == [("/etc/app.conf", "run=1"),
                                                                           ("/etc/other.conf", "kept")]
    assert tt["image"] == "python:3.11" and tt["command"] == "bash" and tt["args"] == ["-c", "echo hi"]
    assert tt["requested_resources"]["gpu_requests"]["count"] == 1
    assert run["spec"]["priority"] == -100
    assert [w["name"] for w in run["status"]["workers"]] == ["ft-1-0"]
    assert _recorded(app, "ft-1") == ("ft", 1)

    changed = copy.deepcopy(FT)
    changed["spec"]["priority"] = -50
    assert app.client.put(app.api + "/templates/ft", json=changed, headers=app.h()).status_code == 200
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": "ft-2"}, "spec": {"template": "ft"}},
                        headers=app.h())
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["priority"] == -50
    assert _recorded(app, "ft-2") == ("ft", 2)
    assert _recorded(app, "ft-1") == ("ft", 1)
    r = app.client.post(app.api + "/runs", headers=app.h(), json={"metadata": {"name": "plain"}, "spec": {
        "task_template": {"image": "python:3.11", "command": "true"}}})
    assert r.status_code == 201 and r.json()["metadata"]["template"] is None
    assert _recorded(app, "plain") == (None, None)


def test_a_run_naming_a_template_that_does_not_exist_is_refused_and_nothing_is_stored(app):
    body = {"metadata": {"name": "r1"}, "spec": {"template": "nope", "task_template": {"image": "python:3.11",
                                                                                      "command": "true"}}}
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    _refused(r, 404, "TEMPLATE_NOT_FOUND", "template nope does not exist in workspace vision")
    assert app.client.get(app.api + "/runs", headers=app.h()).json()["items"] == []


def test_a_run_from_a_template_still_needs_what_neither_gives(app):
    _create(app, {"metadata": {"name": "bare"}, "spec": {"priority": -10}})
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": "r1"}, "spec": {"template": "bare"}},
                        headers=app.h())
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("spec.task_template: field required"), r.text
    assert app.client.get(app.api + "/runs", headers=app.h()).json()["items"] == []


def test_the_cap_lowered_after_a_template_was_made_refuses_its_runs(app):
    _set_max_priority(app, 50)
    _create(app, {"metadata": {"name": "hi"}, "spec": {"priority": 40, "task_template": {
        "image": "python:3.11", "command": "true"}}})
    _set_max_priority(app, 10)
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": "r1"}, "spec": {"template": "hi"}},
                        headers=app.h())
    _refused(r, 403, "PRIORITY_NOT_ALLOWED", "priority 40 is above namespace", "maximum of 10")


def test_a_template_named_by_a_schedule_or_a_replica_group_cannot_be_deleted(app):
    _create(app, {"metadata": {"name": "nightly-eval"}, "spec": {"priority": -10, "task_template": {
        "image": "python:3.11", "command": "true"}}})
    r = app.client.post(app.api + "/schedules", headers=app.h(), json={
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 2 * * *", "suspend": True, "run": {"template": "nightly-eval"}}})
    assert r.status_code == 201, r.text
    r = app.client.post(app.api + "/replica-groups", headers=app.h(), json={
        "metadata": {"name": "evals"}, "spec": {"replicas": 0, "run": {"template": "nightly-eval"}}})
    assert r.status_code == 201, r.text
    r = app.client.delete(app.api + "/templates/nightly-eval", headers=app.h())
    _refused(r, 409, "IN_USE", "template nightly-eval is still named by schedule nightly, replica group evals: "
                               "change or delete them first")
    assert _names(app) == ["nightly-eval"]
    assert app.client.delete(app.api + "/schedules/nightly", headers=app.h()).status_code == 200
    r = app.client.delete(app.api + "/templates/nightly-eval", headers=app.h())
    _refused(r, 409, "IN_USE", "still named by replica group evals: change or delete it first")
    assert app.client.delete(app.api + "/replica-groups/evals", headers=app.h()).status_code == 200
    assert app.client.delete(app.api + "/templates/nightly-eval", headers=app.h()).status_code == 200
    assert _names(app) == []


def test_only_editors_change_templates_and_another_workspace_never_sees_them(app):
    _create(app, {"metadata": {"name": "mine"}, "spec": {"priority": -10, "task_template": {
        "env": {"WANDB_API_KEY": "k-123", "SECRET": {"value": "s-456", "secret": True}}}}})
    r = app.client.post(f"/api/v1/o/{app.boot['org']}/tokens",
                        json={"kind": "user", "workspace": "vision", "role": "viewer"}, headers=_admin(app))
    viewer = {"Authorization": f"Bearer {r.json()['token']}"}
    r = app.client.get(app.api + "/templates", headers=viewer)
    assert r.status_code == 200 and "k-123" not in r.text and "s-456" not in r.text
    assert r.json()["items"][0]["spec"]["task_template"]["env"] == {
        "WANDB_API_KEY": "******", "SECRET": {"value": "******", "secret": True}}
    shown = app.client.get(app.api + "/templates/mine", headers=app.h()).json()["spec"]["task_template"]["env"]
    assert shown == {"WANDB_API_KEY": "k-123", "SECRET": {"value": "******", "secret": True}}  # an editor
    r = app.client.post(app.api + "/templates", json={"metadata": {"name": "x"}, "spec": {}}, headers=viewer)
    _refused(r, 403, "FORBIDDEN", "editor")
    _refused(app.client.delete(app.api + "/templates/mine", headers=viewer), 403, "FORBIDDEN")

    org = f"/api/v1/o/{app.boot['org']}"
    r = app.client.post(f"{org}/workspaces", json={"name": "audio", "clusters": {"main": {}}}, headers=_admin(app))
    assert r.status_code == 201, r.text
    r = app.client.post(f"{org}/tokens", json={"kind": "user", "workspace": "audio", "role": "editor"},
                        headers=_admin(app))
    other = {"Authorization": f"Bearer {r.json()['token']}"}
    assert app.client.get(f"{org}/w/audio/templates", headers=other).json()["items"] == []
    r = app.client.post(f"{org}/w/audio/runs", json={"metadata": {"name": "r"}, "spec": {"template": "mine"}},
                        headers=other)
    _refused(r, 404, "TEMPLATE_NOT_FOUND", "template mine does not exist in workspace audio")
