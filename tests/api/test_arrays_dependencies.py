"""Job arrays and dependencies through the API (issue 17): `spec.array` and `spec.dependency` on POST /runs —
what is stored, bad input named by field with nothing stored, and a dependency's reasons as the scheduling loop
gives them (no machine needed: a run held by its dependency waits for it, not for room). In-process control plane,
SQLite and PostgreSQL."""

from __future__ import annotations

import time

from sqlalchemy import select

from astraeus.server.db import Run


def body(name: str, **spec) -> dict:
    return {"metadata": {"name": name},
            "spec": {**spec, "task_template": {"image": "busybox", "command": "true"}}}


def rows(app, name: str) -> list[Run]:
    with app.cp.sessions() as s:
        return list(s.scalars(select(Run).where(Run.name == name)))


def wait_reason(app, name: str, reason: str, timeout: float = 20) -> dict:
    deadline = time.time() + timeout
    while True:
        run = app.client.get(f"{app.api}/runs/{name}", headers=app.h()).json()
        if run["status"]["reason"] == reason or time.time() > deadline:
            assert run["status"]["reason"] == reason, run["status"]
            return run
        time.sleep(0.1)


def test_an_array_run_is_stored_with_its_array(app):
    array = {"job": "train", "index": 3, "count": 20, "max_running": 4}
    r = app.client.post(f"{app.api}/runs", json=body("train_3", array=array), headers=app.h())
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["array"] == {**array, "min_index": None, "max_index": None}
    (row,) = rows(app, "train_3")
    assert (row.array_job, row.array_index, row.array_max_running) == ("train", 3, 4)


def test_bad_arrays_are_refused_naming_the_field_and_nothing_is_stored(app):
    cases = [
        (body("train_3", array={"job": "train", "index": 3, "count": 2}), "index 3 is outside the array's indices 0-1"),
        (body("train_4", array={"job": "train", "index": 3, "count": 20}), "name 'train_4' is not a DNS label"),
        (body("train_3"), "name 'train_3' is not a DNS label"),
        (body("train_3", array={"job": "train", "index": 3, "count": 20, "max_running": 0}),
         "spec.array.max_running"),
        (body("train_3", array={"job": "Train", "index": 3, "count": 20}), "array job 'Train' is not a DNS label"),
        (body("train_3", array={"job": "train", "index": 3, "count": 20, "maxrun": 2}), "spec.array.maxrun"),
    ]
    for b, says in cases:
        r = app.client.post(f"{app.api}/runs", json=b, headers=app.h())
        assert r.status_code == 422 and says in r.text, (b, r.text)
        assert rows(app, b["metadata"]["name"]) == []


def test_a_dependency_on_a_run_that_does_not_exist_is_refused(app):
    r = app.client.post(f"{app.api}/runs", json=body("after", dependency={"type": "afterok", "runs": ["nosuch"]}),
                        headers=app.h())
    assert r.status_code == 400 and r.json()["code"] == "DEPENDENCY_NOT_FOUND", r.text
    assert "spec.dependency.runs: no run or job array named nosuch" in r.json()["message"]
    for dep, says in [({"type": "afterwards", "runs": ["a"]}, "spec.dependency.type"),
                      ({"type": "afterok"}, "afterok needs the runs it waits for"),
                      ({"type": "singleton", "runs": ["a"]}, "singleton names no runs")]:
        r = app.client.post(f"{app.api}/runs", json=body("after", dependency=dep), headers=app.h())
        assert r.status_code == 422 and says in r.text, r.text
    assert rows(app, "after") == []


def test_a_dependency_holds_the_run_and_fails_it_when_it_can_no_longer_be_met(app):
    h = app.h()
    assert app.client.post(f"{app.api}/runs", json=body("prep"), headers=h).status_code == 201
    for i in range(2):
        b = body(f"arr_{i}", array={"job": "arr", "index": i, "count": 2})
        assert app.client.post(f"{app.api}/runs", json=b, headers=h).status_code == 201
    for name, dep in [("after", {"type": "afterok", "runs": ["prep"]}),
                      ("either", {"type": "afterany", "runs": ["prep", "arr"]}),
                      ("onfail", {"type": "afternotok", "runs": ["arr"]})]:
        r = app.client.post(f"{app.api}/runs", json=body(name, dependency=dep), headers=h)
        assert r.status_code == 201, r.text
    wait_reason(app, "after", "Waiting for prep to complete (afterok)")
    wait_reason(app, "either", "Waiting for arr, prep to end (afterany)")
    wait_reason(app, "onfail", "Waiting for arr to fail (afternotok)")

    assert app.client.delete(f"{app.api}/runs/prep", headers=h).status_code == 200
    run = wait_reason(app, "after", "prep was cancelled: afterok can no longer be met")
    assert run["status"]["state"] == "Failed"
    assert run["status"]["workers"][0]["state"] == "Failed"
    events = app.client.get(f"{app.api}/events", headers=h).json()["items"]
    assert any(e["kind"] == "RunFailed" and e["object"] == "after"
               and e["message"] == "prep was cancelled: afterok can no longer be met" for e in events)
    wait_reason(app, "either", "Waiting for arr to end (afterany)")


def test_singleton_waits_for_the_earlier_live_runs_of_its_job(app):
    h = app.h()
    for i in range(3):
        b = body(f"one_{i}", array={"job": "one", "index": i, "count": 3}, dependency={"type": "singleton"})
        assert app.client.post(f"{app.api}/runs", json=b, headers=h).status_code == 201
    wait_reason(app, "one_1", "Waiting for one_0 to end (singleton)")
    wait_reason(app, "one_2", "Waiting for one_0, one_1 to end (singleton)")
    first = app.client.get(f"{app.api}/runs/one_0", headers=h).json()
    assert "singleton" not in first["status"]["reason"]  # nothing earlier: it waits only for room
    assert app.client.delete(f"{app.api}/runs/one_0", headers=h).status_code == 200
    wait_reason(app, "one_2", "Waiting for one_1 to end (singleton)")
