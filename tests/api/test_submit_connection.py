"""The group-commit writer keeps its database connection from batch to batch (submits.Batcher._session): one that
breaks under it costs the batch of that moment nothing (each of its submits is written on its own), and the next
batch writes on a fresh connection."""

from __future__ import annotations

from astraeus.server import submits


def body(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 1}}}}}


def test_a_broken_writer_connection_loses_no_submit_and_the_next_batch_takes_another(app):
    w = app.cp.submits
    assert app.client.post(f"{app.api}/runs", json=body("first"), headers=app.h()).status_code == 201
    kept = w._conn
    assert kept is not None  # kept after its batch
    assert app.client.post(f"{app.api}/runs", json=body("second"), headers=app.h()).status_code == 201
    assert w._conn is kept  # the same connection for the next batch
    kept.connection.dbapi_connection.close()  # broken under the writer (a database restarted, say)
    written = w.submits
    r = app.client.post(f"{app.api}/runs", json=body("third"), headers=app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "third"  # written on its own
    assert w.submits == written
    assert app.client.post(f"{app.api}/runs", json=body("fourth"), headers=app.h()).status_code == 201
    assert w.submits == written + 1 and w._conn is not kept  # a batch again, on another connection
    names = {r["metadata"]["name"] for r in app.client.get(f"{app.api}/runs", headers=app.h()).json()["items"]}
    assert names == {"first", "second", "third", "fourth"}


def test_the_writer_hands_its_connection_back_when_idle(app, monkeypatch):
    import time

    monkeypatch.setattr(submits, "IDLE_SECONDS", 0.2)
    w = app.cp.submits
    assert app.client.post(f"{app.api}/runs", json=body("one"), headers=app.h()).status_code == 201
    deadline = time.time() + 20
    while w._thread is not None and time.time() < deadline:
        time.sleep(0.05)
    assert w._thread is None and w._conn is None
