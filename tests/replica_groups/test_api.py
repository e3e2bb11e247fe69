"""Replica groups through the API (in-process control plane, no machines): bad input, the priority cap, the
count kept, scale-down of waiting replicas, delete. Runs with machines are in test_cluster.py."""

import pytest

from tests.conftest import wait_for

RUN = {"task_template": {"image": "python:3.11", "command": "sleep 60"}}


def group(name="web", replicas=2, **run):
    return {"metadata": {"name": name}, "spec": {"replicas": replicas, "run": {**RUN, **run}}}


def groups(app) -> list:
    r = app.client.get(app.api + "/replica-groups", headers=app.h())
    assert r.status_code == 200, r.text
    return r.json()["items"]


def runs(app) -> list[dict]:
    return app.client.get(app.api + "/runs", headers=app.h()).json()["items"]


def events(app, kind) -> list[str]:
    items = app.client.get(app.api + "/events", headers=app.h()).json()["items"]
    return [e["message"] for e in items if e["kind"] == kind]


def set_max_priority(app, value: int) -> None:
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": value}}},
                         headers=admin)
    assert r.status_code == 200, r.text


def ns(app) -> str:
    return app.client.get(app.api, headers=app.h()).json()["id"]


@pytest.mark.parametrize("body, status, field", [
    pytest.param({**group(), "spec": {**group()["spec"], "replicas": -1}}, 422, "spec.replicas", id="negative"),
    pytest.param({**group(), "spec": {**group()["spec"], "replica": 2}}, 422, "spec.replica", id="unknown-field"),
    pytest.param({"metadata": {"name": "web"}, "spec": {"run": RUN}}, 422, "spec.replicas", id="no-replicas"),
    pytest.param(group(task_template={"image": "python:3.11", "command": "x", "imag": "y"}), 422,
                 "spec.run.task_template.imag", id="unknown-run-field"),
    pytest.param(group(task_template={"image": "python:3.11"}), 422, "spec.run.task_template.command",
                 id="run-without-command"),
    pytest.param(group(priority="high"), 422, "spec.run.priority", id="bad-priority"),
    pytest.param(group(template="nope"), 404, "spec.run.template", id="no-such-template"),
    pytest.param(group(name="Web"), 422, "metadata.name", id="bad-name"),
    pytest.param(group(name="w" * 60), 422, "metadata.name", id="name-too-long-for-its-runs"),
    pytest.param(group(task_template={**RUN["task_template"], "datavolume_refs": [
        {"name": "gone", "mount_path": "/ckpt"}]}), 400, "spec.run.task_template.datavolume_refs", id="no-drive"),
])
def test_bad_input_names_the_field_and_stores_nothing(app, body, status, field):
    r = app.client.post(app.api + "/replica-groups", json=body, headers=app.h())
    assert r.status_code == status, r.text
    assert r.json()["message"].startswith(field), r.json()
    assert groups(app) == []
    assert runs(app) == []


def test_a_group_keeps_its_count_scales_down_waiting_replicas_and_is_deleted_with_its_runs(app):
    r = app.client.post(app.api + "/replica-groups", json=group(replicas=3), headers=app.h())
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["replicas"] == 3
    wait_for(lambda: len(runs(app)) == 3, what="three replicas")
    assert sorted(x["metadata"]["name"] for x in runs(app)) == ["web-1", "web-2", "web-3"]
    shown = app.client.get(app.api + "/replica-groups/web", headers=app.h()).json()
    assert (shown["status"]["replicas"], shown["status"]["alive"]) == (3, 3)
    assert [x["name"] for x in shown["status"]["runs"]] == ["web-1", "web-2", "web-3"]

    # A deleted replica is replaced by a new one, with an event that says which.
    assert app.client.delete(app.api + "/runs/web-2", headers=app.h()).status_code == 200
    wait_for(lambda: "web-4" in {x["metadata"]["name"] for x in runs(app)}, what="web-2's replacement")
    assert any("web-2 is gone (deleted); created web-4 in its place" in m for m in events(app, "ReplicaReplaced"))

    # Scale down: waiting replicas go first, the newest first (nothing runs here: all wait).
    r = app.client.patch(app.api + "/replica-groups/web", json={"spec": {"replicas": 1}}, headers=app.h())
    assert r.status_code == 200, r.text
    wait_for(lambda: [x["metadata"]["name"] for x in runs(app)] == ["web-1"], what="scale-down to web-1")
    removed = events(app, "ReplicaRemoved")
    assert any("removed web-4" in m for m in removed) and any("removed web-3" in m for m in removed)

    r = app.client.delete(app.api + "/replica-groups/web", headers=app.h())
    assert r.status_code == 200, r.text
    assert runs(app) == [] and groups(app) == []
    assert app.client.get(app.api + "/replica-groups/web", headers=app.h()).status_code == 404


def test_patch_bad_input(app):
    assert app.client.post(app.api + "/replica-groups", json=group(replicas=0), headers=app.h()).status_code == 201
    for body, field in [({"spec": {"replicas": -2}}, "spec.replicas"), ({"spec": {"replicas": 1, "x": 1}}, "spec.x"),
                        ({"spec": {"run": {"task_template": {"image": "i"}}}}, "spec.run.task_template.command")]:
        r = app.client.patch(app.api + "/replica-groups/web", json=body, headers=app.h())
        assert r.status_code == 422, r.text
        assert r.json()["message"].startswith(field)
    assert app.client.get(app.api + "/replica-groups/web", headers=app.h()).json()["spec"]["replicas"] == 0
    assert app.client.patch(app.api + "/replica-groups/nope", json={"spec": {"replicas": 1}},
                            headers=app.h()).status_code == 404


def test_the_priority_cap_on_create_and_update_and_the_refusal_after_a_lowered_maximum(app):
    set_max_priority(app, 10)
    r = app.client.post(app.api + "/replica-groups", json=group(priority=50), headers=app.h())
    assert r.status_code == 403, r.text
    assert r.json() == {"code": "PRIORITY_NOT_ALLOWED",
                        "message": f"priority 50 is above namespace {ns(app)}'s maximum of 10"}
    assert groups(app) == []

    assert app.client.post(app.api + "/replica-groups", json=group(replicas=1, priority=5),
                           headers=app.h()).status_code == 201
    wait_for(lambda: len(runs(app)) == 1, what="the replica")
    r = app.client.patch(app.api + "/replica-groups/web", json={"spec": {"run": {**RUN, "priority": 20}}},
                         headers=app.h())
    assert r.status_code == 403 and r.json()["code"] == "PRIORITY_NOT_ALLOWED", r.text

    set_max_priority(app, 0)
    r = app.client.patch(app.api + "/replica-groups/web", json={"spec": {"replicas": 2}}, headers=app.h())
    assert r.status_code == 403, r.text
    assert r.json()["message"] == f"priority 5 is above namespace {ns(app)}'s maximum of 0"

    # The replica that is gone is not replaced at a lower priority: refused, with an event that says why.
    assert app.client.delete(app.api + "/runs/web-1", headers=app.h()).status_code == 200
    msg = wait_for(lambda: events(app, "ReplicaRefused"), what="the refusal event")[0]
    assert f"priority 5 is above namespace {ns(app)}'s maximum of 0" in msg
    assert "lower the group's priority" in msg
    assert runs(app) == []
    shown = app.client.get(app.api + "/replica-groups/web", headers=app.h()).json()
    assert (shown["status"]["replicas"], shown["status"]["alive"]) == (1, 0)


def test_a_group_from_a_template_and_the_template_kept_while_the_group_names_it(app):
    tpl = {"metadata": {"name": "eval"}, "spec": {"priority": -5, "task_template": {
        "image": "python:3.11", "command": "sleep 60", "env": {"SPLIT": "val"}}}}
    assert app.client.post(app.api + "/templates", json=tpl, headers=app.h()).status_code == 201
    body = {"metadata": {"name": "evals"}, "spec": {"replicas": 1, "run": {
        "template": "eval", "task_template": {"args": ["--shard", "1"]}}}}
    r = app.client.post(app.api + "/replica-groups", json=body, headers=app.h())
    assert r.status_code == 201, r.text
    run = wait_for(lambda: (rs := runs(app)) and rs[0], what="the replica")
    assert run["metadata"]["name"] == "evals-1"
    assert run["spec"]["priority"] == -5 and run["spec"]["template"] == "eval"
    assert run["spec"]["task_template"]["args"] == ["--shard", "1"]
    assert run["spec"]["task_template"]["env"] == {"SPLIT": "val"}
    r = app.client.delete(app.api + "/templates/eval", headers=app.h())
    assert r.status_code == 409 and "replica group evals" in r.json()["message"], r.text
