"""Abandoned log follows (issue 13, item 5): `logs?follow=true` on a quiet worker, left by 200 clients that
close their sockets abruptly, must not keep a thread or a database connection. Afterwards `/healthz` answers
within 1 s, every follow stream has ended, and the server's threads and connections in use are back to their
baseline. A real `astraeus server` and `astraeus agent` (SQLite and PostgreSQL)."""

from __future__ import annotations

import re
import socket
import struct
import time
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from .conftest import drop_postgres, postgres_url, sleeper_run, wait_for

pytestmark = pytest.mark.faults

QUIET = "import time\nprint('hello', flush=True)\ntime.sleep(600)\n"
FOLLOWS = 200


def metric(url: str, name: str) -> int:
    text = httpx.get(url + "/metrics", timeout=5).text
    return int(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)))


def pg_busy(db_url: str) -> int:
    """Connections of the server's database that are not idle (a session holding one sits 'idle in
    transaction')."""
    import psycopg

    name = db_url.rsplit("/", 1)[1]
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state <> 'idle'",
                            (name,)).fetchone()[0]


def abandoned_follow(base: str, path: str, token: str) -> socket.socket:
    """Open a follow, read its first bytes (the log so far), and return the socket, still open."""
    u = urlsplit(base)
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    got = b""
    while b"hello" not in got:
        chunk = s.recv(4096)
        assert chunk, f"the follow closed early: {got!r}"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    return s


def slam(s: socket.socket) -> None:
    """Close with a reset, as a killed client does (no orderly shutdown)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_200_abandoned_follows_leave_no_thread_or_connection(fleet, db):
    url = postgres_url() if db == "postgresql" else None
    try:
        server = fleet.server(env={"ASTRAEUS_DATABASE_URL": url} if url else None)
        fleet.agent(server)
        with server.client() as c:
            assert c.post("/runs", json=sleeper_run("quiet", gpus=0, code=QUIET)).status_code == 201
            wait_for(lambda: "hello" in c.get("/workers/quiet-0/logs").text, 60, what="the worker's first line")
        ps = psutil.Process(server.proc.pid)
        time.sleep(1)
        threads0 = ps.num_threads()
        conns0 = metric(server.url, "astraeus_db_connections_in_use")
        busy0 = pg_busy(url) if url else 0

        path = urlsplit(server.api).path + "/workers/quiet-0/logs?follow=true"
        socks = [abandoned_follow(server.url, path, server.vars["ASTRAEUS_TOKEN"]) for _ in range(FOLLOWS)]
        assert metric(server.url, "astraeus_log_follows_open") == FOLLOWS
        for s in socks:
            slam(s)

        r = httpx.get(server.url + "/healthz", timeout=1)  # the 1 s is the check: a frozen server times out
        assert r.status_code == 200
        wait_for(lambda: metric(server.url, "astraeus_log_follows_open") == 0, 10, what="every follow to end")

        def settled():
            httpx.get(server.url + "/healthz", timeout=1)  # idle pool threads are retired on the next call
            n = ps.num_threads()
            in_use = metric(server.url, "astraeus_db_connections_in_use")
            busy = pg_busy(url) if url else 0
            return n <= threads0 + 5 and in_use <= conns0 + 1 and busy <= busy0 + 1

        wait_for(settled, 40, interval=1, what=f"threads (baseline {threads0}) and connections in use "
                                                 f"(baseline {conns0}, postgres non-idle {busy0}) back to baseline")
        # and a follow still works, and ends when the worker does
        with httpx.stream("GET", server.api + "/workers/quiet-0/logs", params={"follow": "true"},
                          headers={"Authorization": f"Bearer {server.vars['ASTRAEUS_TOKEN']}"}, timeout=30) as r:
            assert r.status_code == 200
            with server.client() as c:
                assert c.delete("/runs/quiet").status_code == 200
            body = r.read().decode()  # returns: the stream ends with the worker
        assert body in ("hello\n", "")  # the run's lines go with it once deleted
    finally:
        fleet.close()
        if url:
            drop_postgres(url)
