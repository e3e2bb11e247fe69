"""A credential per machine (issue 13, item 2): an admin's machine token is a join token, exchanged at
/register for the machine's own credential; a credential acts for its own machine only; a name held by a live
machine is refused; credentials are listed and revoked. In-process control plane, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from astraeus.server import loop
from tests.conftest import drop_postgres, make_app, postgres_url, wait_for

REG = {"gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _adm(app) -> dict:
    return _h(app.boot["admin_token"])


def _register(app, name: str, token: str | None = None, status: int = 200, **decl):
    r = app.client.post("/api/v1/agent/register", headers=_h(token or app.boot["machine_token"]),
                        json={"name": name, **REG, **decl})
    assert r.status_code == status, r.text
    return r.json()


def _worker(app, name: str) -> dict:
    return app.client.get(f"{app.api}/workers/{name}", headers=app.h()).json()


def _placed(app, run: str, gpus: int = 1) -> dict:
    body = {"metadata": {"name": run}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"],
        "env": {"SECRET_OF_VISION": "s3cr3t"}, "requested_resources": {"gpu_requests": {"count": gpus}}}}}
    assert app.client.post(app.api + "/runs", json=body, headers=app.h()).status_code == 201
    return wait_for(lambda: (w := _worker(app, f"{run}-0"))["state"] == "Starting" and w, timeout=20,
                    what="the worker placed")



def _ident(app, run: str) -> str:
    """The identity of the run's first worker: `<ns>.<name>.<run uid>`."""
    uid = app.client.get(f"{app.api}/runs/{run}", headers=app.h()).json()["metadata"]["uid"]
    return f"{app.boot['ns']}.{run}-0.{uid}"

def test_join_token_is_exchanged_for_the_machines_own_credential(app):
    ans = _register(app, "gpu-01")
    cred = ans["credential"]
    assert cred and cred.startswith("ast_m_") and cred != app.boot["machine_token"]
    # the join token only registers: the rest is refused, saying what to do
    join = _h(app.boot["machine_token"])
    for method, path, body in [("get", "/assignments?machine=gpu-01", None),
                               ("post", "/report", {"machine": "gpu-01", "workers": []}),
                               ("post", "/logs", {"machine": "gpu-01", "lines": []})]:
        r = app.client.request(method.upper(), "/api/v1/agent" + path, headers=join,
                               **({"json": body} if body is not None else {}))
        assert r.status_code == 403, (path, r.text)
        assert r.json()["code"] == "REGISTER_FIRST"
        assert "POST /api/v1/agent/register" in r.json()["message"] and "credential" in r.json()["message"]
    # the credential does
    assert app.client.get("/api/v1/agent/assignments?machine=gpu-01", headers=_h(cred)).status_code == 200
    assert app.client.post("/api/v1/agent/report", headers=_h(cred),
                           json={"machine": "gpu-01", "workers": []}).status_code == 200
    # registering again with its own credential keeps it (no new one is handed out)
    again = _register(app, "gpu-01", cred)
    assert again["credential"] is None and again["machine"] == "gpu-01"
    # a credential is no user token either
    assert app.client.get(app.api + "/runs", headers=_h(cred)).status_code == 403


def test_a_machines_credential_is_refused_for_another_machines_assignments_reports_and_logs(app):
    c1 = _register(app, "gpu-01")["credential"]
    c2 = _register(app, "gpu-02", gpus=0)["credential"]  # no GPU: the run below goes to gpu-01
    w = _placed(app, "train")
    assert w["machine"] == "gpu-01"
    ident = _ident(app, "train")
    # gpu-02's credential naming gpu-01: 403, saying whose credential it is
    for method, path, body in [
            ("get", "/assignments?machine=gpu-01", None),
            ("post", "/report", {"machine": "gpu-01", "workers": [
                {"worker": ident, "attempt": w["attempt"], "state": "Exited", "exit_code": 1}]}),
            ("post", "/logs", {"machine": "gpu-01", "lines": [
                {"worker": ident, "attempt": w["attempt"], "seq": 0, "text": "forged"}]}),
            ("post", "/register", {"name": "gpu-01", **REG})]:
        r = app.client.request(method.upper(), "/api/v1/agent" + path, headers=_h(c2),
                               **({"json": body} if body is not None else {}))
        assert r.status_code == 403, (path, r.text)
        assert "belongs to machine gpu-02" in r.json()["message"], r.text
    # gpu-02 naming itself but gpu-01's worker: its assignments hold nothing of it, its report and lines for
    # that worker are ignored
    r = app.client.get("/api/v1/agent/assignments?machine=gpu-02", headers=_h(c2))
    assert r.status_code == 200 and r.json()["assignments"] == [] and "s3cr3t" not in r.text
    r = app.client.post("/api/v1/agent/report", headers=_h(c2), json={"machine": "gpu-02", "workers": [
        {"worker": ident, "attempt": w["attempt"], "state": "Exited", "exit_code": 1}]})
    assert r.status_code == 200
    r = app.client.post("/api/v1/agent/logs", headers=_h(c2), json={"machine": "gpu-02", "lines": [
        {"worker": ident, "attempt": w["attempt"], "seq": 0, "text": "forged"}]})
    assert r.status_code == 200 and r.json()["stored"] == 0
    assert _worker(app, "train-0")["state"] == "Starting"
    assert app.client.get(f"{app.api}/workers/train-0/logs", headers=app.h()).text == ""
    # gpu-01's own credential: its assignment (by identity), its report and its lines are taken
    r = app.client.get("/api/v1/agent/assignments?machine=gpu-01", headers=_h(c1))
    (a,) = r.json()["assignments"]
    assert a["worker"] == ident and a["name"] == "train-0" and a["env"]["SECRET_OF_VISION"] == "s3cr3t"
    assert app.client.post("/api/v1/agent/report", headers=_h(c1), json={"machine": "gpu-01", "workers": [
        {"worker": ident, "attempt": a["attempt"], "state": "Running", "pid": 4242}]}).status_code == 200
    r = app.client.post("/api/v1/agent/logs", headers=_h(c1), json={"machine": "gpu-01", "lines": [
        {"worker": ident, "attempt": a["attempt"], "seq": 0, "text": "mine"}]})
    assert r.json()["stored"] == 1
    assert _worker(app, "train-0")["state"] == "Running"
    assert app.client.get(f"{app.api}/workers/train-0/logs", headers=app.h()).text == "mine\n"
    # the bare name is not an identity: a report naming "train-0" reaches nothing
    app.client.post("/api/v1/agent/report", headers=_h(c1), json={"machine": "gpu-01", "workers": [
        {"worker": "train-0", "attempt": a["attempt"], "state": "Exited", "exit_code": 3}]})
    assert _worker(app, "train-0")["state"] == "Running"


def test_a_machines_lines_are_stored_once_whatever_their_text(app):
    """Lines with a NUL, quotes, backslashes and non-ASCII text are stored and shown; a batch sent again is stored
    once and counted once toward the worker's log limits; a time JSON cannot hold (NaN, Infinity)
    is refused with a 422 that names it, and nothing of that batch is stored."""
    from sqlalchemy import select

    from astraeus.server.db import LogUsage, Worker

    cred = _register(app, "gpu-01")["credential"]
    w = _placed(app, "talk")
    ident = _ident(app, "talk")

    def post(lines):  # as Python's json writes them (NaN, Infinity), which httpx's json= refuses
        return app.client.post("/api/v1/agent/logs", headers={**_h(cred), "Content-Type": "application/json"},
                               content=json.dumps({"machine": "gpu-01", "lines": lines}))

    for bad in (float("nan"), float("inf")):
        r = post([{"worker": ident, "attempt": w["attempt"], "seq": 0, "time": 1.0, "text": "first"},
                  {"worker": ident, "attempt": w["attempt"], "seq": 1, "time": bad, "text": "bad"}])
        assert r.status_code == 422, r.text
        assert "lines" in r.text and "time" in r.text and "finite" in r.text
    assert app.client.get(f"{app.api}/workers/talk-0/logs", headers=app.h()).text == ""
    texts = ["plain", "nul\x00here", 'ünïcödé 🚀 "quoted" \\ back\tslash', "late"]
    lines = [{"worker": ident, "attempt": w["attempt"], "seq": i, "time": 1.5 + i, "text": x,
              "stream": "stderr" if i == 3 else "stdout"} for i, x in enumerate(texts)]
    for _ in range(2):  # the second time: a retry of the same batch
        r = post(lines)
        assert r.status_code == 200, r.text
        assert r.json()["stored"] == 4
    shown = app.client.get(f"{app.api}/workers/talk-0/logs", headers=app.h()).text
    assert shown == "plain\nnul\ufffdhere\nünïcödé 🚀 \"quoted\" \\ back\tslash\nlate\n"
    with app.client.app.state.cp.sessions() as s:
        wid = s.scalar(select(Worker.id).where(Worker.name == "talk-0"))
        usage = s.scalar(select(LogUsage).where(LogUsage.worker_id == wid))
        # what it stored, once (both databases)
        assert (usage.lines, usage.bytes) == (4, sum(len(x.replace("\x00", "\ufffd").encode()) + 1 for x in texts))


def test_a_name_held_by_a_live_machine_is_refused(app):
    cred = _register(app, "gpu-01")["credential"]
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json={"name": "gpu-01"})
    assert r.status_code == 409, r.text
    msg = r.json()["message"]
    assert "gpu-01 is held by a live machine" in msg and "another name" in msg and "revoke" in msg
    # nothing changed: the machine keeps what it declared, its credential still works
    m = next(m for m in app.client.get("/api/v1/o/acme/clusters/main/machines", headers=_adm(app)).json()["items"]
             if m["name"] == "gpu-01")
    assert m["gpus"] == 8 and m["state"] == "Ready"
    assert app.client.post("/api/v1/agent/report", headers=_h(cred),
                           json={"machine": "gpu-01", "workers": []}).status_code == 200
    # once Lost (no heartbeat for the cluster's lost timeout), the name can be taken, and the old credential
    # stops working
    with app.cp.sessions() as s:
        loop.detect_lost_machines(s, time.time() + 3600)
        s.commit()
    new = _register(app, "gpu-01", gpus=4)["credential"]
    assert new and new != cred
    r = app.client.post("/api/v1/agent/report", headers=_h(cred), json={"machine": "gpu-01", "workers": []})
    assert r.status_code == 401 and r.json()["code"] == "CREDENTIAL_REVOKED"
    assert app.client.post("/api/v1/agent/report", headers=_h(new),
                           json={"machine": "gpu-01", "workers": []}).status_code == 200


def test_machine_credentials_are_listed_and_revoked(app):
    cred = _register(app, "gpu-01")["credential"]
    items = app.client.get("/api/v1/o/acme/tokens", headers=_adm(app)).json()["items"]
    machines = [t for t in items if t["kind"] == "machine"]
    join = [t for t in machines if t["machine"] is None]
    (own,) = [t for t in machines if t["machine"] == "gpu-01"]
    assert len(join) == 1 and own["cluster"] == "main" and not own["revoked"]
    assert cred not in str(items) and app.boot["machine_token"] not in str(items)
    assert app.client.delete(f"/api/v1/o/acme/tokens/{own['id']}", headers=_adm(app)).status_code == 200
    # the machine's very next calls are refused, saying it was revoked
    for method, path, body in [("get", "/assignments?machine=gpu-01", None),
                               ("post", "/report", {"machine": "gpu-01", "workers": []}),
                               ("post", "/logs", {"machine": "gpu-01", "lines": []}),
                               ("post", "/register", {"name": "gpu-01", **REG})]:
        r = app.client.request(method.upper(), "/api/v1/agent" + path, headers=_h(cred),
                               **({"json": body} if body is not None else {}))
        assert r.status_code == 401, (path, r.text)
        assert r.json()["code"] == "CREDENTIAL_REVOKED" and "revoked" in r.json()["message"]
    listed = app.client.get("/api/v1/o/acme/tokens", headers=_adm(app)).json()["items"]
    assert next(t for t in listed if t["id"] == own["id"])["revoked"] is True
    # without heartbeats it goes Lost after the lost timeout
    with app.cp.sessions() as s:
        loop.detect_lost_machines(s, time.time() + 61)
        s.commit()
    m = next(m for m in app.client.get("/api/v1/o/acme/clusters/main/machines", headers=_adm(app)).json()["items"]
             if m["name"] == "gpu-01")
    assert m["state"] == "Lost"
    # a revoked credential does not hold the name: the join token takes it again at once
    assert _register(app, "gpu-01")["credential"]


def test_revoking_the_join_token_stops_joins_not_joined_machines(app):
    cred = _register(app, "gpu-01")["credential"]
    join_id = next(t["id"] for t in app.client.get("/api/v1/o/acme/tokens", headers=_adm(app)).json()["items"]
                   if t["kind"] == "machine" and t["machine"] is None)
    assert app.client.delete(f"/api/v1/o/acme/tokens/{join_id}", headers=_adm(app)).status_code == 200
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json={"name": "gpu-02"})
    assert r.status_code == 401
    assert app.client.post("/api/v1/agent/report", headers=_h(cred),
                           json={"machine": "gpu-01", "workers": []}).status_code == 200


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def old_database(request, tmp_path):
    """A database the first release left (with its cluster-wide machine token), opened by this code."""
    import json

    from tests.migrations.test_migrations import FIXTURES, load_into_postgres

    release = "release_5a64dc1"
    facts = json.loads((FIXTURES / f"{release}.json").read_text())
    url = None
    if request.param == "sqlite":
        (tmp_path / "home").mkdir()
        shutil.copyfile(FIXTURES / f"{release}.db", tmp_path / "home" / "astraeus.db")
    else:
        url = postgres_url()
        load_into_postgres(release, url)
    client, _boot, cp, _ = make_app(tmp_path, url, run_loop=False)
    try:
        with client:
            yield client, facts["tokens"]
    finally:
        cp.engine.dispose()
        if url:
            drop_postgres(url)


def test_an_old_cluster_wide_machine_token_is_a_join_token(old_database):
    client, tokens = old_database
    old = _h(tokens["machine"])
    # its machines have no credential yet: the old token re-registers them and gets each its own
    r = client.post("/api/v1/agent/register", headers=old, json={"name": "gpu-01", **REG})
    assert r.status_code == 200, r.text
    cred = r.json()["credential"]
    assert cred
    r = client.get("/api/v1/agent/assignments?machine=gpu-01", headers=old)
    assert r.status_code == 403 and r.json()["code"] == "REGISTER_FIRST"
    assert client.get("/api/v1/agent/assignments?machine=gpu-01", headers=_h(cred)).status_code == 200
    assert client.get("/api/v1/agent/assignments?machine=gpu-02", headers=_h(cred)).status_code == 403
    # gpu-01 now has a live credential: the old token cannot take its name again
    assert client.post("/api/v1/agent/register", headers=old, json={"name": "gpu-01"}).status_code == 409


def _post_beside_a_state_change(app, post, count):
    """post() while a state change wants the state lock; returns its answer and what count() said in that state
    change. PostgreSQL: the state change holds the lock for as long as the post takes (at most 60 s) and counts at
    the end (the store takes no state lock). SQLite: it starts at the store's first INSERT of log lines, waits for
    the lock and counts as soon as it has it (the store steps aside for it)."""
    import threading

    from sqlalchemy import event

    from astraeus.server.state_lock import STATE_LOCK

    seen: list[int] = []
    if app.cp.postgres:
        held, posted = threading.Event(), threading.Event()

        def holding():
            with STATE_LOCK:
                held.set()
                posted.wait(60)
                seen.append(count())

        t = threading.Thread(target=holding)
        t.start()
        held.wait(10)
        r = post()
        posted.set()
        t.join(timeout=70)
        return r, seen
    started: list[threading.Thread] = []

    def state_change():
        with STATE_LOCK:
            seen.append(count())

    def on_insert(conn, cursor, statement, *args):
        if "INSERT INTO log_lines" in statement and not started:
            t = threading.Thread(target=state_change)
            started.append(t)
            t.start()  # it waits for the state lock
            wait_for(lambda: STATE_LOCK.waiting, timeout=10, what="the state change to wait")

    event.listen(app.cp.engine, "before_cursor_execute", on_insert)
    try:
        r = post()
    finally:
        event.remove(app.cp.engine, "before_cursor_execute", on_insert)
    started[0].join(timeout=10)
    return r, seen


def test_a_state_change_goes_between_the_chunks_of_a_big_batch_of_lines(app):
    """A submit, a report or the scheduling loop's apply that waits for the state lock while a batch of log lines is
    being stored does not wait for the whole batch: on SQLite (one writer: the store holds the state lock) it goes
    between the batch's chunks of agents.LOG_CHUNK lines; on PostgreSQL the store holds no state lock at all (it
    runs in the log store's process): the whole batch is stored while a state change holds the lock. The whole
    batch is stored all the same, in order."""

    from sqlalchemy import func, select

    from astraeus.server.agents import LOG_CHUNK
    from astraeus.server.db import LogLine

    cred = _register(app, "gpu-01")["credential"]
    w = _placed(app, "chatty")
    ident = _ident(app, "chatty")
    n = 4 * LOG_CHUNK
    lines = [{"worker": ident, "attempt": w["attempt"], "seq": i, "text": f"line {i:05d}"} for i in range(n)]

    def post():
        return app.client.post("/api/v1/agent/logs", headers=_h(cred), json={"machine": "gpu-01", "lines": lines})

    def count() -> int:
        with app.cp.sessions() as s:
            return s.scalar(select(func.count()).select_from(LogLine))

    r, seen = _post_beside_a_state_change(app, post, count)
    assert r.status_code == 200 and r.json()["stored"] == n, r.text
    if app.cp.postgres:
        assert seen == [n], f"the store waited for the state lock: {seen[0]} of {n} lines stored while it was held"
    else:
        assert seen and seen[0] < n, f"the state change waited for the whole batch: it saw {seen} of {n} lines"
    shown = app.client.get(f"{app.api}/workers/chatty-0/logs", headers=app.h()).text.splitlines()
    assert shown == [f"line {i:05d}" for i in range(n)]


def test_a_state_change_goes_before_a_trim_of_a_workers_lines(app):
    """A worker past its log limit is trimmed (its lines counted, the oldest deleted) as a step of its own: on SQLite
    a state change waiting for the state lock goes after the lines are in and before the trim, not after both; on
    PostgreSQL the store and its trim hold no state lock at all. Either way the worker ends within its limit."""
    from sqlalchemy import func, select

    from astraeus.server.db import LogLine

    app.cp.settings.log_max_lines_per_worker = 200
    cred = _register(app, "gpu-01")["credential"]
    w = _placed(app, "chatty")
    ident = _ident(app, "chatty")
    n = 400  # one chunk, past the limit: the store trims it
    lines = [{"worker": ident, "attempt": w["attempt"], "seq": i, "text": f"line {i:05d}"} for i in range(n)]

    def count() -> int:
        with app.cp.sessions() as s:
            return s.scalar(select(func.count()).select_from(LogLine).where(LogLine.attempt >= 0))

    def post():
        return app.client.post("/api/v1/agent/logs", headers=_h(cred), json={"machine": "gpu-01", "lines": lines})

    r, seen = _post_beside_a_state_change(app, post, count)
    assert r.status_code == 200, r.text
    if app.cp.postgres:
        assert seen and seen[0] <= 200, f"the store waited for the state lock: {seen}"
    else:
        assert seen == [n], f"the state change did not go between the lines and their trim: it saw {seen}"
    assert count() <= 200
    shown = app.client.get(f"{app.api}/workers/chatty-0/logs", headers=app.h()).text.splitlines()
    assert "earlier lines dropped" in shown[0] and shown[-1] == f"line {n - 1:05d}", shown[:2]


def test_a_run_deleted_while_its_lines_are_stored_keeps_none(app):
    """A run deleted while a big batch of its worker's lines is being stored keeps no line: on SQLite the delete
    goes between the batch's chunks and the chunks after it store nothing (each finds the machine's workers again);
    on PostgreSQL the delete waits for the store (the run's row is read FOR SHARE) and then drops what it stored.
    The agent is answered 200 either way, and the lines of another run on the machine are all stored."""
    import threading

    from sqlalchemy import event, func, select

    from astraeus.server.agents import LOG_CHUNK
    from astraeus.server.db import LogLine, Worker

    cred = _register(app, "gpu-01")["credential"]
    doomed, kept = _placed(app, "doomed"), _placed(app, "kept")
    n = 4 * LOG_CHUNK
    ids = {name: _ident(app, name) for name in ("doomed", "kept")}
    lines = [{"worker": ids[name], "attempt": w["attempt"], "seq": i, "text": f"line {i}"}
             for i in range(n) for name, w in (("doomed", doomed), ("kept", kept))]
    deleted: list[int] = []

    def delete():
        deleted.append(app.client.delete(f"{app.api}/runs/doomed", headers=app.h()).status_code)

    started: list[threading.Thread] = []

    def on_insert(conn, cursor, statement, *args):  # SQLite: the delete waits for the state lock mid-batch
        if "INSERT INTO log_lines" in statement and not started:
            t = threading.Thread(target=delete)
            started.append(t)
            t.start()
            wait_for(lambda: STATE_LOCK.waiting, timeout=10, what="the delete to wait")

    from astraeus.server.state_lock import STATE_LOCK

    if app.cp.postgres:  # the delete races the store in the log store's process
        started.append(threading.Thread(target=delete))
        started[0].start()
    else:
        event.listen(app.cp.engine, "before_cursor_execute", on_insert)
    try:
        r = app.client.post("/api/v1/agent/logs", headers=_h(cred), json={"machine": "gpu-01", "lines": lines})
    finally:
        if not app.cp.postgres:
            event.remove(app.cp.engine, "before_cursor_execute", on_insert)
    started[0].join(timeout=30)
    assert r.status_code == 200, r.text
    assert deleted == [200]
    if not app.cp.postgres:  # the delete went between chunks: the batch's lines of "doomed" after it were not taken
        assert r.json()["stored"] < 2 * n, r.text
    with app.cp.sessions() as s:
        per = dict(s.execute(select(Worker.name, func.count(LogLine.id)).join(LogLine, LogLine.worker_id == Worker.id)
                             .group_by(Worker.name)).all())
    assert per == {"kept-0": n}, per
    shown = app.client.get(f"{app.api}/workers/kept-0/logs", headers=app.h()).text.splitlines()
    assert shown == [f"line {i}" for i in range(n)]


def _log_stores() -> list:
    """This process's children that are log store processes (spawned: routers/agent.py, server/logstore.py)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True)
            if "spawn_main" in " ".join(p.cmdline()) and p.is_running()]


def test_a_big_batch_of_lines_is_parsed_by_a_process_of_its_own_and_a_dead_one_is_replaced(app):
    """A big batch of log lines is parsed in the log store's process, off the API's interpreter (on PostgreSQL also
    stored there; on SQLite written by the API's process, whose state lock it is): the API's process gets a child
    for it at the first big batch, and its errors are the route's. Killed (as the kernel's out-of-memory killer
    would), a new one takes the next batch: every line stored once, in order, none lost; a batch sent again is
    stored once. On SQLite a small batch (the quiet workers' lane) is parsed and stored by the API's process: no
    child for it."""
    import signal

    cred = _register(app, "gpu-01")["credential"]
    w = _placed(app, "talk")
    ident = _ident(app, "talk")

    def post(seqs):  # a big batch (past routers.agent.SMALL_BATCH_BYTES), as a flood's
        lines = [{"worker": ident, "attempt": w["attempt"], "seq": i, "text": f"line {i} " + "x" * 30_000} for i in seqs]
        r = app.client.post("/api/v1/agent/logs", headers=_h(cred), json={"machine": "gpu-01", "lines": lines})
        assert r.status_code == 200, r.text
        return r.json()["stored"]

    small = app.client.post("/api/v1/agent/logs", headers=_h(cred), json={"machine": "gpu-01", "lines": [
        {"worker": ident, "attempt": w["attempt"], "seq": 0, "text": "line 0 small"}]})
    assert small.status_code == 200 and small.json()["stored"] == 1, small.text
    if not app.cp.postgres:
        assert _log_stores() == []  # SQLite: a small batch is parsed and stored by the API's process
    # its errors are the route's: a time JSON cannot hold (422 naming it), another machine's name (403); nothing stored
    nan = [{"worker": ident, "attempt": w["attempt"], "seq": i, "time": float("nan") if i > 1 else 1.0,
            "text": "x" * 30_000} for i in range(1, 4)]
    r = app.client.post("/api/v1/agent/logs", headers={**_h(cred), "Content-Type": "application/json"},
                        content=json.dumps({"machine": "gpu-01", "lines": nan}))
    assert r.status_code == 422 and "time" in r.text and "finite" in r.text, r.text
    r = app.client.post("/api/v1/agent/logs", headers=_h(cred), json={"machine": "gpu-02", "lines": nan[:1] * 3})
    assert r.status_code == 403, r.text
    assert app.client.get(f"{app.api}/workers/talk-0/logs", headers=app.h()).text == "line 0 small\n"
    assert post(range(1, 3)) == 2
    stores = _log_stores()
    assert len(stores) == 1, stores
    stores[0].send_signal(signal.SIGKILL)
    stores[0].wait(timeout=20)
    assert post(range(3, 6)) == 3  # a new process took it
    again = _log_stores()
    assert len(again) == 1 and again[0].pid != stores[0].pid
    assert post(range(3, 6)) == 3  # sent again: stored once
    assert post(range(6, 8)) == 2
    shown = app.client.get(f"{app.api}/workers/talk-0/logs", headers=app.h()).text.splitlines()
    assert [ln.split()[:2] for ln in shown] == [["line", str(i)] for i in range(8)]
