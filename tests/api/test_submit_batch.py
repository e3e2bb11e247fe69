"""Group commit of POST $API/runs (server/submits.py): concurrent submits written in one transaction keep every
refusal exact, each to its own request, and the runs they store are those of submits made one after the other."""

from __future__ import annotations

import threading
import time

import pytest

from astraeus import spec as S
from astraeus.server import submits


def body(name: str, priority: int = 0, gpus: int = 1) -> dict:
    return {"metadata": {"name": name}, "spec": {"priority": priority, "task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": gpus}}}}}


def item(app, name: str, priority: int = 0) -> submits.Submit:
    """A submit by an editor of the workspace (its caller known: the writer does not authenticate it)."""
    from astraeus.server import services
    from astraeus.server.db import Workspace

    with app.cp.sessions() as s:
        ws = s.query(Workspace).filter_by(name=app.boot["workspace"]).one()
        return submits.Submit(S.RunCreate.model_validate(body(name, priority)), time.time(),
                              caller=services.system_caller(s, ws))


def test_concurrent_submits_of_the_same_names_store_each_once_and_refuse_the_others_with_409(app):
    names = [f"dup-{i}" for i in range(12)]
    answers: dict[str, list[int]] = {n: [] for n in names}
    lock = threading.Lock()

    def client() -> None:
        for n in names:
            r = app.client.post(f"{app.api}/runs", json=body(n), headers=app.h())
            with lock:
                answers[n].append(r.status_code)
            if r.status_code == 201:
                assert r.json()["metadata"]["name"] == n
                assert [w["name"] for w in r.json()["status"]["workers"]] == [f"{n}-0"]
            else:
                assert r.json()["code"] == "ALREADY_EXISTS" and n in r.json()["message"]

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(sorted(a) == [201, 409, 409, 409] for a in answers.values()), answers
    listed = app.client.get(f"{app.api}/runs", params={"limit": 1000}, headers=app.h()).json()["items"]
    assert sorted(r["metadata"]["name"] for r in listed) == sorted(names)
    events = app.client.get(f"{app.api}/events", params={"limit": 1000}, headers=app.h()).json()["items"]
    assert sorted(e["object"] for e in events if e["kind"] == "RunSubmitted") == sorted(names)
    for n in names:
        run = app.client.get(f"{app.api}/runs/{n}", headers=app.h()).json()
        assert [h["reason"] for h in run["status"]["history"]][:1] == ["Submitted"]


def test_one_batch_refuses_each_submit_for_its_own_reason_and_writes_the_rest_in_one_transaction(app):
    app.client.post(f"{app.api}/runs", json=body("before"), headers=app.h())
    batch = [item(app, "a"), item(app, "before"), item(app, "b", priority=60), item(app, "a"), item(app, "c")]
    w = app.cp.submits
    n0 = w.batches
    w._write(batch)
    assert w.batches == n0 + 1  # one transaction for the three accepted
    got = [(it.run.name if it.run is not None else None, getattr(it.error, "code", None)) for it in batch]
    assert got == [("a", None), (None, "ALREADY_EXISTS"), (None, "PRIORITY_NOT_ALLOWED"), (None, "ALREADY_EXISTS"),
                   ("c", None)]
    assert "namespace" in batch[2].error.message and "maximum of 0" in batch[2].error.message
    # a name taken before the batch (found by the runs' INSERT) and one taken by a batch-mate: submit_run's words
    assert batch[1].error.status == batch[3].error.status == 409
    assert batch[1].error.message == ("a run named before already exists in workspace vision: choose another "
                                      "metadata.name, or delete it first")
    for n in ("a", "c"):
        run = app.client.get(f"{app.api}/runs/{n}", headers=app.h()).json()
        assert run["status"]["state"] == "Pending" or run["status"]["state"] == "Running"
        assert run["status"]["history"][0]["reason"] == "Submitted"
        assert [w["index"] for w in run["status"]["workers"]] == [0]
    assert app.client.get(f"{app.api}/runs/b", headers=app.h()).status_code == 404


def test_a_batch_whose_every_name_is_taken_writes_nothing(app):
    for n in ("x", "y"):
        assert app.client.post(f"{app.api}/runs", json=body(n), headers=app.h()).status_code == 201
    events = len(app.client.get(f"{app.api}/events", params={"limit": 1000}, headers=app.h()).json()["items"])
    w = app.cp.submits
    n0 = w.batches
    batch = [item(app, "x"), item(app, "y", priority=-5)]
    w._write(batch)
    assert w.batches == n0 and [it.run for it in batch] == [None, None]
    assert [it.error.code for it in batch] == ["ALREADY_EXISTS", "ALREADY_EXISTS"]
    assert len(app.client.get(f"{app.api}/events", params={"limit": 1000}, headers=app.h()).json()["items"]) == events
    assert app.client.get(f"{app.api}/runs/y", headers=app.h()).json()["spec"]["priority"] == 0  # the first one
    # once deleted, the name is free again, in a batch too
    assert app.client.delete(f"{app.api}/runs/x", headers=app.h()).status_code == 200
    again = [item(app, "x", priority=-5)]
    w._write(again)
    assert again[0].error is None and again[0].run.name == "x"
    assert app.client.get(f"{app.api}/runs/x", headers=app.h()).json()["spec"]["priority"] == -5


def test_too_much_memory_is_refused_after_a_taken_name_as_submit_run_does(app):
    huge = body("big")
    huge["spec"]["task_template"]["requested_resources"]["memory_bytes"] = 2**63
    assert not submits.batchable(S.RunCreate.model_validate(huge))  # the usual way: its checks in their order
    r = app.client.post(f"{app.api}/runs", json=huge, headers=app.h())
    assert r.status_code == 422 and "memory_bytes: too large" in r.json()["message"]
    assert app.client.post(f"{app.api}/runs", json=body("big"), headers=app.h()).status_code == 201
    r = app.client.post(f"{app.api}/runs", json=huge, headers=app.h())
    assert r.status_code == 409 and r.json()["code"] == "ALREADY_EXISTS"


def test_a_run_that_names_a_template_or_a_drive_goes_the_usual_way():
    assert submits.batchable(S.RunCreate.model_validate(body("x")))
    with_drive = body("y")
    with_drive["spec"]["task_template"]["datavolume_refs"] = [{"name": "d", "mount_path": "/d"}]
    assert not submits.batchable(S.RunCreate.model_validate(with_drive))
    pools = body("z")
    pools["spec"]["task_template"]["requested_resources"]["node_selection"] = {"pools": ["p"]}
    assert not submits.batchable(S.RunCreate.model_validate(pools))
    assert not submits.batchable(None)  # names a template: checked once merged


def test_a_bad_body_is_still_a_422_naming_the_field(app):
    bad = body("ok")
    bad["spec"]["task_template"]["requested_resources"]["gpu_requests"]["count"] = -1
    r = app.client.post(f"{app.api}/runs", json=bad, headers=app.h())
    assert r.status_code == 422 and "count" in str(r.json())


def test_the_writer_ends_when_idle_and_the_next_submit_starts_another(app, monkeypatch):
    monkeypatch.setattr(submits, "IDLE_SECONDS", 0.2)
    assert app.client.post(f"{app.api}/runs", json=body("first"), headers=app.h()).status_code == 201
    w = app.cp.submits
    deadline = time.time() + 20
    while w._thread is not None and time.time() < deadline:
        time.sleep(0.05)
    assert w._thread is None
    assert app.client.post(f"{app.api}/runs", json=body("second"), headers=app.h()).status_code == 201
    assert app.client.get(f"{app.api}/runs/second", headers=app.h()).status_code == 200


def test_submits_in_one_batch_are_each_authenticated_and_refused_as_the_request_alone_would_be(app):
    """The writer authenticates its batch (submits.Batcher._authenticate): each request gets its own answer."""
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    viewer = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                             headers=admin).json()["token"]
    callers = {"editor": (app.h(), app.api, 201, None),
               "admin": (admin, app.api, 201, None),
               "viewer": (app.h(viewer), app.api, 403, "FORBIDDEN"),
               "machine": (app.h(app.boot["machine_token"]), app.api, 403, "FORBIDDEN"),
               "bad": (app.h("ast_u_not-a-token"), app.api, 401, "UNAUTHENTICATED"),
               "none": ({}, app.api, 401, "UNAUTHENTICATED"),
               "elsewhere": (app.h(), "/api/v1/o/acme/w/nowhere", 404, "NOT_FOUND")}
    got: dict[str, list] = {k: [] for k in callers}

    def client(who: str) -> None:
        headers, api, _, _ = callers[who]
        for i in range(5):
            r = app.client.post(f"{api}/runs", json=body(f"{who}-{i}"), headers=headers)
            got[who].append((r.status_code, r.json().get("code") if r.status_code != 201 else None))

    threads = [threading.Thread(target=client, args=(w,)) for w in callers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for who, (_, _, status, code) in callers.items():
        assert got[who] == [(status, code)] * 5, (who, got[who])
    listed = app.client.get(f"{app.api}/runs", params={"limit": 1000}, headers=app.h()).json()["items"]
    assert sorted(r["metadata"]["name"] for r in listed) == sorted(f"{w}-{i}" for w in ("editor", "admin")
                                                                  for i in range(5))
    # a bad body from a bad token is refused as unauthenticated first, as before
    r = app.client.post(f"{app.api}/runs", json={"metadata": {}}, headers=app.h("ast_u_not-a-token"))
    assert r.status_code == 401


@pytest.mark.postgres
@pytest.mark.parametrize("app", ["postgresql"], indirect=True)
def test_a_batch_whose_write_fails_keeps_nothing_and_each_submit_is_written_on_its_own(app):
    """On PostgreSQL the batch's INSERTs go through psycopg (submits._Driver: the workers', history lines' and
    events' in one pipeline). Should one fail, the whole batch is rolled back and each submit is written the usual
    way, on its own: every run, worker, history line and event once."""
    import psycopg

    conn = psycopg.connect(app.url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
    try:
        # the first events INSERT fails (the batch's, in its pipeline); nextval is not rolled back with it
        conn.execute("CREATE SEQUENCE boom")
        conn.execute("CREATE FUNCTION boom() RETURNS trigger AS $$ BEGIN IF nextval('boom') = 1 THEN "
                     "RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql")
        conn.execute("CREATE TRIGGER boom BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION boom()")
        w = app.cp.submits
        n0 = w.batches
        batch = [item(app, "p"), item(app, "q")]
        w._write_or_fall_back(batch)
        assert w.batches == n0 and [it.fallback for it in batch] == [True, True]
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0  # nothing of the batch kept
        assert conn.execute("SELECT count(*) FROM workers").fetchone()[0] == 0
        # as a request whose batch fell back: it is submitted on its own
        for n in ("p", "q"):
            r = app.client.post(f"{app.api}/runs", json=body(n), headers=app.h())
            assert r.status_code == 201, r.text
        assert conn.execute("SELECT nextval('boom')").fetchone()[0] > 2  # the trigger ran again, and let them be
    finally:
        conn.close()
    for n in ("p", "q"):
        run = app.client.get(f"{app.api}/runs/{n}", headers=app.h()).json()
        assert [h["reason"] for h in run["status"]["history"]] == ["Submitted"]
        assert [x["name"] for x in run["status"]["workers"]] == [f"{n}-0"]
    events = app.client.get(f"{app.api}/events", params={"limit": 1000}, headers=app.h()).json()["items"]
    assert sorted(e["object"] for e in events if e["kind"] == "RunSubmitted") == ["p", "q"]


@pytest.mark.postgres
@pytest.mark.parametrize("app", ["postgresql"], indirect=True)
def test_the_writers_first_caller_read_also_takes_the_state_lock(app):
    """On PostgreSQL the batch's first caller is read by the statement that also takes the state lock (one round
    trip for both): once it has found the token, another connection sees the lock held until the transaction
    ends; a token not found takes no lock (the writer then takes it with state_lock.lock_state)."""
    import psycopg
    from sqlalchemy import text

    from astraeus.server import services
    from astraeus.server.state_lock import STATE_LOCK_KEY

    org, ws = app.api.split("/o/")[1].split("/w/")
    other = psycopg.connect(app.url.replace("postgresql+psycopg", "postgresql"), autocommit=True)

    def held(pid: int) -> bool:
        """By that backend (this control plane's loop takes it too); a 64-bit key's high half is classid."""
        return other.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                             "pid = %s AND classid::bigint = %s AND objid::bigint = %s",
                             (pid, STATE_LOCK_KEY >> 32, STATE_LOCK_KEY & 0xFFFFFFFF)).fetchone()[0] > 0

    try:
        with app.cp.sessions() as s:
            pid = s.execute(text("SELECT pg_backend_pid()")).scalar()
            with pytest.raises(services.ApiError) as e:
                services.user_caller(s, "Bearer ast_u_not-a-token", org, ws, lock=True)
            assert e.value.code == "UNAUTHENTICATED" and not held(pid)
            caller = services.user_caller(s, app.h()["Authorization"], org, ws, lock=True)
            assert caller.workspace.name == ws and caller.role == "editor"
            assert held(pid)
            s.rollback()
            assert not held(pid)
        # a batch whose first caller is refused is still written under the lock, its refused submit answered
        first = submits.Submit(S.RunCreate.model_validate(body("l0")), time.time(),
                               authorization="Bearer ast_u_not-a-token", org=org, ws=ws)
        second = submits.Submit(S.RunCreate.model_validate(body("l1")), time.time(),
                                authorization=app.h()["Authorization"], org=org, ws=ws)
        app.cp.submits._write([first, second])
        assert first.error.code == "UNAUTHENTICATED" and first.run is None
        assert second.error is None and second.run.name == "l1"
    finally:
        other.close()
    assert app.client.get(f"{app.api}/runs/l1", headers=app.h()).json()["status"]["state"] in ("Pending", "Running")
