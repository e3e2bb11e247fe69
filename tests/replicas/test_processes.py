"""`astraeus server --processes N`: N replicas on one host and port (SO_REUSEPORT) sharing one PostgreSQL
database; every one serves the API and the agents, exactly one leads the scheduling. On SQLite: a clear error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
import psutil
import pytest

from tests.conftest import drop_postgres, postgres_url
from tests.faults.conftest import VENV_BIN, read_env, wait_for

pytestmark = pytest.mark.postgres


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_share_the_port_and_one_leads(tmp_path):
    url = postgres_url()
    port = _port()
    env = {**os.environ, "ASTRAEUS_DATABASE_URL": url, "ASTRAEUS_LEADER_LEASE_SECONDS": "2"}
    log = open(tmp_path / "server.log", "ab")
    proc = subprocess.Popen([str(VENV_BIN / "astraeus"), "server", "--home", str(tmp_path / "home"), "--port",
                             str(port), "--processes", "2"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def roles() -> set[str]:
            seen = set()
            for _ in range(40):  # a new connection each: the kernel spreads them over the processes
                try:
                    r = httpx.get(base + "/healthz", timeout=2, headers={"Connection": "close"})
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    seen.add(r.json()["role"])
            return seen

        # both processes answer on the one port: one says it leads, the other that it follows
        assert wait_for(lambda: roles() == {"leader", "follower"}, 60, 0.2, what="a leader and a follower"), \
            (tmp_path / "server.log").read_text()[-3000:]
        children = psutil.Process(proc.pid).children()
        assert len(children) == 1 and children[0].is_running()
        # and every one serves the API: the env file's token works on each answer
        token = read_env(tmp_path / "home" / "env")["ASTRAEUS_TOKEN"]
        api = read_env(tmp_path / "home" / "env")["API"]
        for _ in range(20):
            r = httpx.get(api + "/runs", headers={"Authorization": f"Bearer {token}", "Connection": "close"},
                          timeout=10)
            assert r.status_code == 200, r.text
        # exactly one leads: the lease names one of the two
        from sqlalchemy import create_engine, text
        engine = create_engine(url)
        with engine.connect() as conn:
            holders = conn.execute(text("SELECT holder FROM leases WHERE holder IS NOT NULL")).scalars().all()
        engine.dispose()
        assert len(holders) == 1 and (f":{port}/0#" in holders[0] or f":{port}/1#" in holders[0]), holders
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        wait_for(lambda: not children[0].is_running() or children[0].status() == psutil.STATUS_ZOMBIE, 10,
                 what="the other process to stop")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        drop_postgres(url)


def test_several_processes_need_postgresql(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ASTRAEUS_DATABASE_URL"}
    r = subprocess.run([str(VENV_BIN / "astraeus"), "server", "--home", str(tmp_path / "home"), "--port",
                        str(_port()), "--processes", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--processes needs PostgreSQL (ASTRAEUS_DATABASE_URL)" in r.stderr
