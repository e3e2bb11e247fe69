"""Numeric job ids, hold/release and what-if without an image (issue 44), through the API of an in-process control
plane (machines registered by the test, no agents), on SQLite and PostgreSQL.

- every run has `metadata.job_id` (SLURM_JOB_ID in its workers); GET $API/runs?job_id=N finds it in its own
  workspace only (another workspace's run is not found);
- PATCH $API/runs/{name} {"held": true} (scontrol hold): a Pending run stays Pending and is never placed, its
  reason says it is held; {"held": false} (release) lets it be placed; only a Pending run can be held;
- POST $API/runs?dry_run=true of a run that names no image answers with the workspace's default image, as a real
  submit would use it."""

from __future__ import annotations

import time

from tests.api.test_whatif import body, other_workspace, placed, register, submit


def run(app, name: str, ws: tuple[str, dict] | None = None) -> dict:
    api, headers = ws or (app.api, app.h())
    r = app.client.get(f"{api}/runs/{name}", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def patch(app, name: str, b: dict, status: int = 200) -> dict:
    r = app.client.patch(f"{app.api}/runs/{name}", json=b, headers=app.h())
    assert r.status_code == status, r.text
    return r.json()


def test_each_run_has_a_numeric_job_id_found_only_in_its_workspace(app):
    submit(app, body("first", gpus=64))
    submit(app, body("second", gpus=64))
    a, b = run(app, "first")["metadata"]["job_id"], run(app, "second")["metadata"]["job_id"]
    assert isinstance(a, int) and isinstance(b, int) and a != b
    got = app.client.get(app.api + "/runs", params={"job_id": b}, headers=app.h()).json()["items"]
    assert [r["metadata"]["name"] for r in got] == ["second"]
    assert got[0]["metadata"]["job_id"] == b
    # another workspace's run: not found there, never shown
    nlp = other_workspace(app)
    assert app.client.get(nlp[0] + "/runs", params={"job_id": b}, headers=nlp[1]).json()["items"] == []
    for bad in ("x", "0", "-3"):
        r = app.client.get(app.api + "/runs", params={"job_id": bad}, headers=app.h())
        assert r.status_code == 422 and "job_id" in r.text, (bad, r.text)


def test_a_held_run_stays_pending_and_is_placed_once_released(app):
    register(app, "gpu-01", gpus=4)
    submit(app, body("blocker", gpus=4))
    placed(app, "blocker-0")
    submit(app, body("later", gpus=2))  # no room while blocker holds every GPU
    held = patch(app, "later", {"held": True})
    assert held["status"]["held"] is True and held["status"]["state"] == "Pending"
    assert held["status"]["reason"] == "Held by user; waiting for astra slurm scontrol release later"
    # room comes (a second machine), but a held run is never placed
    register(app, "gpu-02", gpus=4)
    time.sleep(1.5)  # a few scheduling cycles with room free
    now = run(app, "later")
    assert now["status"]["state"] == "Pending" and now["status"]["held"] is True
    assert now["status"]["reason"].startswith("Held by user")
    assert all(w.get("machine") is None for w in now["status"]["workers"])
    events = app.client.get(app.api + "/events", headers=app.h()).json()["items"]
    assert any(e["kind"] == "RunUpdated" and e["message"] == "run later updated: held" for e in events)
    # released: placed
    assert patch(app, "later", {"held": False})["status"]["held"] is False
    placed(app, "later-0")
    assert not run(app, "later")["status"]["reason"].startswith("Held")


def test_only_a_pending_run_can_be_held_and_bad_input_is_refused(app):
    register(app, "gpu-01", gpus=4)
    submit(app, body("busy", gpus=1))
    placed(app, "busy-0")
    refused = patch(app, "busy", {"held": True}, 409)
    assert refused["code"] == "NOT_PENDING"
    assert "only a Pending run can be held" in refused["message"] and "scancel busy" in refused["message"]
    assert run(app, "busy")["status"]["held"] is False
    for bad in ({"held": None}, {"held": "maybe"}):
        r = app.client.patch(f"{app.api}/runs/busy", json=bad, headers=app.h())
        assert r.status_code == 422 and "held" in r.text, (bad, r.text)
    assert patch(app, "nope", {"held": True}, 404)["code"] == "NOT_FOUND"
    # a viewer may not hold
    r = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                        headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    viewer = {"Authorization": f"Bearer {r.json()['token']}"}
    assert app.client.patch(f"{app.api}/runs/busy", json={"held": True}, headers=viewer).status_code == 403


def test_what_if_of_a_run_naming_no_image_uses_the_workspace_default(app):
    register(app, "gpu-01", gpus=4)
    b = body("noimage", gpus=1)
    del b["spec"]["task_template"]["image"]
    r = app.client.post(app.api + "/runs", params={"dry_run": "true"}, json=b, headers=app.h())
    assert r.status_code == 422 and "no default image on cluster main" in r.text, r.text  # what a submit says
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"default_image": "busybox"}}},
                         headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    assert r.status_code == 200, r.text
    r = app.client.post(app.api + "/runs", params={"dry_run": "true"}, json=b, headers=app.h())
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "Starts" and r.json()["placements"][0]["machine"] == "gpu-01"
    assert app.client.get(app.api + "/runs/noimage", headers=app.h()).status_code == 404  # nothing stored
