"""Logs at scale (issue 19): a burst of lines keeps a worker's log within its limit, the top line saying exactly how
many were dropped, even with batches sent again; `logs -f` of a quiet worker sees its new lines while another
worker floods; bad input to the logs endpoints is a 4xx naming what to change, and stores nothing. A real `astraeus
server` (SQLite and PostgreSQL); the machine is played through the agent protocol."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import sqlalchemy as sa

from .conftest import drop_postgres, postgres_url, wait_for

pytestmark = pytest.mark.faults

MAX_LINES = 2000
BATCH = 600


class Machine:
    """gpu-01 as its agent speaks for it: registered, its workers reported Running, their lines sent."""

    def __init__(self, server):
        self.base = server.url + "/api/v1/agent"
        r = httpx.post(self.base + "/register", timeout=30, headers={"Authorization": f"Bearer {server.vars['ASTRAEUS_MACHINE_TOKEN']}"},
                       json={"name": "gpu-01", "gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40})
        assert r.status_code == 200, r.text
        self.h = {"Authorization": f"Bearer {r.json()['credential']}"}
        self.ids: dict[str, str] = {}

    def running(self, *names: str) -> None:
        def assigned():
            a = httpx.get(self.base + "/assignments", params={"machine": "gpu-01"}, headers=self.h, timeout=30).json()
            self.ids = {x["name"]: x["worker"] for x in a["assignments"]}
            return all(n in self.ids for n in names)

        wait_for(assigned, 30, what=f"{names} placed on gpu-01")
        r = httpx.post(self.base + "/report", headers=self.h, timeout=30, json={"machine": "gpu-01", "workers": [
            {"worker": self.ids[n], "attempt": 0, "state": "Running", "pid": 100 + i} for i, n in enumerate(names)]})
        assert r.status_code == 200, r.text

    def send(self, worker: str, first: int, n: int, text: str = "line {}") -> httpx.Response:
        lines = [{"worker": self.ids[worker], "attempt": 0, "seq": s, "time": time.time(), "text": text.format(s)}
                 for s in range(first, first + n)]
        return httpx.post(self.base + "/logs", headers=self.h, timeout=60, json={"machine": "gpu-01", "lines": lines})


def run(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"], "requested_resources": {"gpu_requests": {"count": 1}}}}}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def plane(request, fleet):
    url = postgres_url() if request.param == "postgresql" else None
    env = {"ASTRAEUS_LOG_MAX_LINES_PER_WORKER": str(MAX_LINES)}
    if url:
        env["ASTRAEUS_DATABASE_URL"] = url
    server = fleet.server(env=env)
    engine = sa.create_engine(url or f"sqlite:///{server.home / 'astraeus.db'}")
    try:
        with server.client() as c:
            for name in ("flood", "quiet"):
                assert c.post("/runs", json=run(name)).status_code == 201
            m = Machine(server)
            m.running("flood-0", "quiet-0")
            yield server, c, m, engine
    finally:
        engine.dispose()
        fleet.close()
        if url:
            drop_postgres(url)


def kept(engine, worker: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM log_lines JOIN workers ON workers.id = worker_id "
                                    "WHERE workers.name = :n AND log_lines.attempt >= 0"), {"n": worker}).scalar()


def test_a_burst_keeps_the_limit_and_the_dropped_line_counts_exactly(plane):
    server, c, m, engine = plane
    sent = 0
    for _ in range(10):
        r = m.send("flood-0", sent, BATCH)
        assert r.status_code == 200 and r.json()["stored"] == BATCH, r.text
        sent += BATCH
        assert kept(engine, "flood-0") <= MAX_LINES
    assert m.send("flood-0", sent - BATCH, BATCH).status_code == 200  # the last batch again: an agent's retry
    assert kept(engine, "flood-0") <= MAX_LINES

    first, *shown = c.get("/workers/flood-0/logs").text.splitlines()
    assert first.endswith(f" earlier lines dropped (log limit 8 MiB or {MAX_LINES} lines)"), first
    dropped = int(first.split()[1])
    assert dropped + len(shown) == sent  # every line sent is either shown or counted as dropped, once
    assert shown[0] == f"line {dropped}" and shown[-1] == f"line {sent - 1}"
    tail = c.get("/workers/flood-0/logs", params={"tail": 3}).text.splitlines()
    assert tail == [f"line {s}" for s in range(sent - 3, sent)]
    # the quiet worker's log is its own
    assert c.get("/workers/quiet-0/logs").text == ""


def test_a_follower_sees_new_lines_while_another_worker_floods(plane):
    server, c, m, engine = plane
    seen: list[str] = []
    stop = threading.Event()

    def follow():
        with server.client() as fc, fc.stream("GET", "/workers/quiet-0/logs", params={"follow": "true"},
                                              timeout=httpx.Timeout(10, read=120)) as r:
            for line in r.iter_lines():
                seen.append(line)
                if stop.is_set():
                    return

    def flood():
        s = 0
        while not stop.is_set():
            m.send("flood-0", s, BATCH)
            s += BATCH

    threads = [threading.Thread(target=follow, daemon=True), threading.Thread(target=flood, daemon=True)]
    for t in threads:
        t.start()
    try:
        for k in range(3):
            assert m.send("quiet-0", k, 1, text="ping {}").json()["stored"] == 1
            wait_for(lambda k=k: f"ping {k}" in seen, 30, what=f"the follower to see ping {k} during the flood")
        assert kept(engine, "flood-0") <= MAX_LINES
    finally:
        stop.set()
        m.send("quiet-0", 3, 1, text="bye {}")  # the follower reads one more line, then leaves
        for t in threads:
            t.join(30)
    assert seen[:3] == ["ping 0", "ping 1", "ping 2"]


@pytest.mark.parametrize("tail, before", [(0, []), (2, ["old 3", "old 4"])])
def test_a_follower_with_a_tail_sees_that_many_old_lines_then_only_new_ones(plane, tail, before):
    """`logs -f --tail 0` shows none of the lines already stored, then each new one; `--tail 2` the last two
    first (the follow used to start from the worker's first line when the tail showed none)."""
    server, c, m, engine = plane
    assert m.send("quiet-0", 0, 5, text="old {}").json()["stored"] == 5
    seen: list[str] = []
    done = threading.Event()

    def follow():
        with server.client() as fc, fc.stream("GET", "/workers/quiet-0/logs", params={"follow": "true", "tail": tail},
                                              timeout=httpx.Timeout(10, read=60)) as r:
            for line in r.iter_lines():
                seen.append(line)
                if line.startswith("new"):
                    done.set()
                    return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    wait_for(lambda: len(seen) >= len(before), 30, what="the follower's tail")
    time.sleep(0.5)  # a follow that has shown its tail and waits for new lines
    assert m.send("quiet-0", 5, 1, text="new {}").json()["stored"] == 1
    assert done.wait(30), seen
    t.join(30)
    assert seen == [*before, "new 5"]


def test_bad_input_to_the_logs_endpoints_is_a_4xx_and_stores_nothing(plane):
    server, c, m, engine = plane
    r = c.get("/workers/quiet-0/logs", params={"tail": -1})
    assert r.status_code == 422 and "tail" in r.json()["message"], r.text
    r = c.get("/workers/nobody-0/logs")
    assert r.status_code == 404 and "nobody-0" in r.json()["message"], r.text
    # a line with a negative seq: the whole batch is refused, naming the field
    r = httpx.post(m.base + "/logs", headers=m.h, timeout=30, json={"machine": "gpu-01", "lines": [
        {"worker": m.ids["quiet-0"], "seq": 0, "text": "fine"}, {"worker": m.ids["quiet-0"], "seq": -1, "text": "x"}]})
    assert r.status_code == 422 and "seq" in r.json()["message"], r.text
    r = httpx.post(m.base + "/logs", headers={**m.h, "content-type": "application/json"}, timeout=30,
                   content=b'{"machine": "gpu-01", "lines": [')
    assert r.status_code == 422, r.text
    assert kept(engine, "quiet-0") == 0
    assert c.get("/workers/quiet-0/logs").text == ""


def test_the_log_store_process_ends_with_the_server_and_a_new_server_stores_again(plane):
    """The server parses a big batch of log lines (and on PostgreSQL stores it) in a process of its own
    (server/logstore.py), started at the first big batch (SQLite's small ones are stored by the server itself); the
    server killed with SIGKILL (the process alone, as the kernel's out-of-memory killer does), that process ends
    too, and the server started again stores the next lines with a new one."""
    import os
    import signal

    import psutil

    server, c, m, engine = plane

    def stores() -> list[psutil.Process]:
        return [p for p in psutil.Process(server.proc.pid).children(recursive=True)
                if "spawn_main" in " ".join(p.cmdline())]

    small = "line {} small"
    assert m.send("quiet-0", 0, 2, small).status_code == 200
    if "postgresql" not in str(engine.url):
        assert stores() == []  # SQLite: a small batch is parsed and stored by the server itself
    big = "line {} " + "x" * 30_000  # a big batch (past 64 KiB), as a flood's
    assert m.send("quiet-0", 2, 3, big).status_code == 200
    first = stores()
    assert len(first) == 1, first
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()

    def ended() -> bool:
        try:
            return first[0].status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(ended, 15, what="the log store's process to end with the server")
    server.start()
    assert m.send("quiet-0", 5, 3, big).status_code == 200
    assert len(stores()) == 1 and stores()[0].pid != first[0].pid
    assert [ln.split()[:2] for ln in c.get("/workers/quiet-0/logs").text.splitlines()] == \
        [["line", str(i)] for i in range(8)]
