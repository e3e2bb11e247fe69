"""Schedules over the API (issue 17): create, list, show, replace, delete; bad input is a 4xx naming the field and
stores nothing; the run part is checked as a submit would be (a template that does not exist, the priority cap on
create and on update). In-process control plane, SQLite and PostgreSQL."""

from __future__ import annotations

import copy

import pytest

RUN = {"task_template": {"image": "python:3.11", "command": "true"}}
NIGHTLY = {"metadata": {"name": "nightly"},
           "spec": {"schedule": "0 2 * * *", "timezone": "Europe/Berlin", "concurrency": "Forbid",
                    "starting_deadline_seconds": 600, "suspend": False, "run": RUN}}


def body(**spec) -> dict:
    b = copy.deepcopy(NIGHTLY)
    b["spec"].update(spec)
    return b


def names(app) -> list[str]:
    r = app.client.get(app.api + "/schedules", headers=app.h())
    assert r.status_code == 200, r.text
    return [s["metadata"]["name"] for s in r.json()["items"]]


def refused(app, b: dict, status: int, code: str, *words: str, method: str = "post", path: str = "/schedules"):
    before = app.client.get(app.api + "/schedules", headers=app.h()).json()["items"]
    r = getattr(app.client, method)(app.api + path, json=b, headers=app.h())
    assert r.status_code == status, r.text
    assert r.json()["code"] == code, r.text
    for w in words:
        assert w in r.json()["message"], r.json()
    assert app.client.get(app.api + "/schedules", headers=app.h()).json()["items"] == before  # nothing stored
    return r.json()


def set_max_priority(app, value: int) -> None:
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": value}}},
                         headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    assert r.status_code == 200, r.text


def test_create_show_list_replace_delete(app):
    r = app.client.post(app.api + "/schedules", json=NIGHTLY, headers=app.h())
    assert r.status_code == 201, r.text
    sc = r.json()
    assert sc["metadata"]["name"] == "nightly"
    assert sc["spec"]["schedule"] == "0 2 * * *" and sc["spec"]["concurrency"] == "Forbid"
    assert sc["status"]["last_tick"] is None
    nxt = sc["status"]["next_tick"]
    assert nxt["tick"].endswith("0200") and nxt["at"].endswith(("01:00:00Z", "00:00:00Z"))  # 02:00 in Berlin
    assert sc["status"]["runs"] == [] and sc["status"]["ticks"] == []
    assert names(app) == ["nightly"]
    assert app.client.post(app.api + "/schedules", json=NIGHTLY, headers=app.h()).status_code == 409

    r = app.client.put(app.api + "/schedules/nightly", json=body(timezone="UTC", schedule="30 4 * * *"),
                       headers=app.h())
    assert r.status_code == 200, r.text
    assert r.json()["status"]["next_tick"]["at"].endswith("04:30:00Z")
    r = app.client.put(app.api + "/schedules/nightly", json=body(suspend=True), headers=app.h())
    assert r.json()["status"]["next_tick"] is None and r.json()["status"]["suspended"] is True
    events = app.client.get(app.api + "/events", headers=app.h()).json()["items"]
    assert any(e["kind"] == "ScheduleChanged" and "(suspended)" in e["message"] for e in events)

    assert app.client.delete(app.api + "/schedules/nightly", headers=app.h()).status_code == 200
    r = app.client.get(app.api + "/schedules/nightly", headers=app.h())
    assert r.status_code == 404 and "schedule nightly not found" in r.json()["message"]


@pytest.mark.parametrize("b,field,words", [
    (body(concurency="Forbid"), "spec.concurency", "unknown field"),
    ({**NIGHTLY, "kind": "CronJob"}, "kind", "unknown field"),
    (body(schedule="61 * * * *"), "spec.schedule", "is not a valid cron line"),
    (body(schedule="0 2 * *"), "spec.schedule", "has 4 fields: a cron line has five"),
    (body(schedule="0 0 31 2 *"), "spec.schedule", "never ticks"),
    (body(timezone="Europe/Berlim"), "spec.timezone", "unknown time zone 'Europe/Berlim'"),
    (body(concurrency="Sometimes"), "spec.concurrency", "Allow"),
    (body(starting_deadline_seconds=-5), "spec.starting_deadline_seconds", "greater than or equal to 1"),
    (body(run={"task_template": {"image": "python:3.11", "command": "true", "gpus": 1}}),
     "spec.run.task_template.gpus", "unknown field"),
    (body(run={"task_template": {"command": "true"}}), "spec.run.task_template.image", "field required"),
    ({"metadata": {"name": "n" * 51}, "spec": NIGHTLY["spec"]}, "metadata.name", "use at most 50"),
    ({"metadata": {"name": "Nightly"}, "spec": NIGHTLY["spec"]}, "metadata.name", "is not a DNS label"),
])
def test_bad_input_is_a_422_naming_the_field_and_stores_nothing(app, b, field, words):
    err = refused(app, b, 422, "INVALID", field, words)
    assert err["message"].startswith(field + ":"), err


def test_a_template_that_does_not_exist_is_refused_naming_it(app):
    refused(app, body(run={"template": "nope"}), 404, "TEMPLATE_NOT_FOUND",
            "spec.run.template: template nope does not exist in workspace vision")


def test_a_drive_that_does_not_exist_is_refused(app):
    run = {"task_template": {"image": "python:3.11", "command": "true",
                             "datavolume_refs": [{"name": "ckpt", "mount_path": "/ckpt"}]}}
    refused(app, body(run=run), 400, "DRIVE_NOT_FOUND", "drive ckpt does not exist")


def test_a_template_fills_the_run_and_its_fields_are_checked(app):
    t = {"metadata": {"name": "eval"}, "spec": {"task_template": {"image": "python:3.11", "command": "true"}}}
    assert app.client.post(app.api + "/templates", json=t, headers=app.h()).status_code == 201
    r = app.client.post(app.api + "/schedules", json=body(run={"template": "eval"}), headers=app.h())
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["run"] == {"template": "eval"}
    r = app.client.delete(app.api + "/templates/eval", headers=app.h())
    assert r.status_code == 409 and "schedule nightly" in r.json()["message"]


def test_the_priority_cap_on_create_and_on_update(app):
    set_max_priority(app, 10)
    high = {**RUN, "priority": 50}
    err = refused(app, body(run=high), 403, "PRIORITY_NOT_ALLOWED")
    assert err["message"] == f"priority 50 is above namespace {app.boot['ns']}'s maximum of 10"
    ok = body(run={**RUN, "priority": 10})
    assert app.client.post(app.api + "/schedules", json=ok, headers=app.h()).status_code == 201
    err = refused(app, body(run=high), 403, "PRIORITY_NOT_ALLOWED", method="put", path="/schedules/nightly")
    assert err["message"] == f"priority 50 is above namespace {app.boot['ns']}'s maximum of 10"
    shown = app.client.get(app.api + "/schedules/nightly", headers=app.h()).json()
    assert shown["spec"]["run"]["priority"] == 10  # unchanged
    # through a template too
    t = {"metadata": {"name": "low"}, "spec": {"priority": 5}}
    assert app.client.post(app.api + "/templates", json=t, headers=app.h()).status_code == 201
    refused(app, {"metadata": {"name": "other"}, "spec": {**NIGHTLY["spec"], "run": {**RUN, "template": "low",
                                                                                   "priority": 11}}},
            403, "PRIORITY_NOT_ALLOWED", "priority 11 is above")


def test_put_keeps_the_name(app):
    assert app.client.post(app.api + "/schedules", json=NIGHTLY, headers=app.h()).status_code == 201
    other = copy.deepcopy(NIGHTLY)
    other["metadata"]["name"] = "daily"
    refused(app, other, 422, "INVALID", "metadata.name", method="put", path="/schedules/nightly")
    r = app.client.put(app.api + "/schedules/nope", json={**NIGHTLY, "metadata": {"name": "nope"}}, headers=app.h())
    assert r.status_code == 404
