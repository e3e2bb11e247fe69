"""POST /runs answered by routers/runs.PlainSubmits, ahead of FastAPI's routing and dependencies, answers exactly as
create_run does: the same status and body for an accepted run and for every refusal; what it passes on (a query,
another content type, a body it does not take) goes to create_run; a batch that fails is submitted on its own."""

from __future__ import annotations

from astraeus.server import submits


def body(name: str, priority: int = 0, gpus: int = 1) -> dict:
    return {"metadata": {"name": name}, "spec": {"priority": priority, "task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": gpus}}}}}


FASTAPI = "application/json; charset=utf-8"  # not PlainSubmits' content type: create_run answers it


def post(app, api: str, b, headers: dict, content_type: str = "application/json"):
    import json

    return app.client.post(f"{api}/runs", content=json.dumps(b), headers={**headers, "Content-Type": content_type})


def same_run(a: dict, b: dict, a_name: str, b_name: str) -> None:
    """Two answers for two runs submitted alike: the same but for the run's name, uid, job id and time."""
    import json

    def strip(r: dict, name: str) -> str:
        meta = {k: v for k, v in r["metadata"].items() if k not in ("uid", "job_id", "created_at")}
        return json.dumps({**r, "metadata": meta}, sort_keys=True).replace(f'"{name}', '"NAME').replace(
            f"/{name}", "/NAME")
    assert strip(a, a_name) == strip(b, b_name)


def test_an_accepted_run_is_answered_as_create_run_answers_it(app):
    fast = post(app, app.api, body("fast", gpus=2), app.h())
    slow = post(app, app.api, body("slow", gpus=2), app.h(), FASTAPI)
    assert fast.status_code == slow.status_code == 201
    assert fast.headers["content-type"] == slow.headers["content-type"]
    same_run(fast.json(), slow.json(), "fast", "slow")
    assert fast.json()["metadata"]["name"] == "fast"
    assert [w["name"] for w in fast.json()["status"]["workers"]] == ["fast-0"]
    assert app.client.get(f"{app.api}/runs/fast", headers=app.h()).json()["metadata"]["uid"] == \
        fast.json()["metadata"]["uid"]


def test_every_refusal_is_answered_as_create_run_answers_it(app):
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    viewer = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                             headers=admin).json()["token"]
    assert post(app, app.api, body("taken"), app.h()).status_code == 201
    bad_gpus = body("bad")
    bad_gpus["spec"]["task_template"]["requested_resources"]["gpu_requests"]["count"] = -1
    cases = {"taken": (app.api, body("taken"), app.h(), 409),
             "priority": (app.api, body("high", priority=60), app.h(), 403),
             "viewer": (app.api, body("v"), app.h(viewer), 403),
             "machine": (app.api, body("m"), app.h(app.boot["machine_token"]), 403),
             "bad token": (app.api, body("t"), app.h("ast_u_not-a-token"), 401),
             "no token": (app.api, body("n"), {}, 401),
             "elsewhere": ("/api/v1/o/acme/w/nowhere", body("e"), app.h(), 404),
             "bad body": (app.api, bad_gpus, app.h(), 422),
             "not an object": (app.api, [1, 2], app.h(), 422),
             "bad body, bad token": (app.api, {"metadata": {}}, app.h("ast_u_not-a-token"), 401)}
    for what, (api, b, headers, status) in cases.items():
        fast = post(app, api, b, headers)
        slow = post(app, api, b, headers, FASTAPI)
        assert (fast.status_code, fast.json()) == (slow.status_code, slow.json()), what
        assert fast.status_code == status, (what, fast.json())
    r = app.client.post(f"{app.api}/runs", content=b"{not json", headers={**app.h(), "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "INVALID"


def test_what_it_passes_on_is_create_runs(app):
    r = app.client.post(f"{app.api}/runs", params={"dry_run": "true"}, json=body("what-if"), headers=app.h())
    assert r.status_code == 200
    assert app.client.get(f"{app.api}/runs/what-if", headers=app.h()).status_code == 404
    r = app.client.post(f"{app.api}/runs", params={"dry_run": "false"}, json=body("explicit"), headers=app.h())
    assert r.status_code == 201
    r = app.client.post(f"{app.api}/runs", content=b"", headers={**app.h(), "Content-Type": "application/json"})
    assert r.status_code == 422


def test_a_batch_that_cannot_be_written_is_submitted_on_its_own(app, monkeypatch):
    def fail(self, batch):
        raise RuntimeError("the database refused the batch")

    monkeypatch.setattr(submits.Batcher, "_write", fail)
    r = post(app, app.api, body("alone"), app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "alone"
    assert post(app, app.api, body("alone"), app.h()).status_code == 409
    monkeypatch.undo()
    assert app.client.get(f"{app.api}/runs/alone", headers=app.h()).status_code == 200
