"""Each request's database session (routers/deps.py, opened and closed on the event loop, used in the route's
thread): whatever the request's end, its connection goes back to the pool."""

from __future__ import annotations


def body(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 1}}}}}


def test_requests_refused_after_reading_hand_their_connection_back(app):
    # More requests than the pool holds (20 + 40 overflow), each refused after a read (its transaction still open):
    # a connection kept by any of them would make a later one wait out the pool's timeout and fail.
    for i in range(80):
        r = app.client.get(f"{app.api}/runs/missing-{i}", headers=app.h())
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"
    for _ in range(5):  # refused before any read: a bad body, a bad token
        assert app.client.post(f"{app.api}/runs", json={"metadata": {}}, headers=app.h()).status_code == 422
        assert app.client.post(f"{app.api}/runs", json=body("x"),
                               headers={"Authorization": "Bearer nope"}).status_code == 401
    r = app.client.post(f"{app.api}/runs", json=body("after-refusals"), headers=app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "after-refusals"
    assert app.client.get(f"{app.api}/runs/after-refusals", headers=app.h()).json()["metadata"]["name"] == \
        "after-refusals"


def test_a_dry_run_and_a_template_submit_answer_as_before(app):
    t = {"metadata": {"name": "tpl"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 1}}}}}
    assert app.client.post(f"{app.api}/templates", json=t, headers=app.h()).status_code == 201
    r = app.client.post(f"{app.api}/runs?dry_run=true", json=body("maybe"), headers=app.h())
    assert r.status_code == 200
    assert app.client.get(f"{app.api}/runs/maybe", headers=app.h()).status_code == 404  # nothing stored
    r = app.client.post(f"{app.api}/runs", json={"metadata": {"name": "from-tpl"}, "spec": {"template": "tpl"}},
                        headers=app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "from-tpl"
