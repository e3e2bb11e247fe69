"""Item 4: the control plane killed with SIGKILL in the middle of a burst of submits, on SQLite and PostgreSQL:
every run acknowledged with a 2xx exists exactly once afterwards, and running workers are neither restarted nor
changed. With its database unreachable the control plane refuses to start and changes nothing."""

from __future__ import annotations

import subprocess
import threading
import time

import httpx
import pytest

from .conftest import VENV_BIN, drop_postgres, pid_alive, postgres_url, sleeper_run, wait_for

FIELDS = ("pid", "attempt", "restarts", "preemptions", "machine", "gpu_indices", "started_at", "placed_at", "state")


def _keeper(c: httpx.Client) -> dict:
    w = c.get("/workers/keeper-0").json()
    return {k: w[k] for k in FIELDS}


def _burst(srv, acked: list[str], tid: int, stop: threading.Event) -> None:
    with srv.client() as c:
        i = 0
        while not stop.is_set():
            name = f"b{tid}-{i}"
            i += 1
            try:
                r = c.post("/runs", json=sleeper_run(name, gpus=0, names=["nowhere"]))
            except httpx.HTTPError:
                return  # the control plane is gone: what was not acknowledged may or may not exist
            if 200 <= r.status_code < 300:
                acked.append(name)


@pytest.mark.faults
@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_control_plane_kill9_during_a_burst_of_submits(fleet, db):
    url = postgres_url() if db == "postgresql" else None
    try:
        srv = fleet.server(env={"ASTRAEUS_DATABASE_URL": url} if url else None)
        agent = fleet.agent(srv, gpus=8)
        with srv.client() as c:
            assert c.post("/runs", json=sleeper_run("keeper")).status_code == 201
            wait_for(lambda: c.get("/workers/keeper-0").json()["state"] == "Running", timeout=60, what="keeper")
            before = _keeper(c)
        acked: list[str] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_burst, args=(srv, acked, t, stop)) for t in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 20, timeout=30, interval=0.01, what="submits acknowledged")
        srv.kill9()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert pid_alive(before["pid"]), "a running worker died with the control plane"
        n_acked = len(acked)
        time.sleep(1)
        srv.start()
        with srv.client() as c:
            names = [r["metadata"]["name"] for r in c.get("/runs").json()["items"]]
            assert len(names) == len(set(names)), "a run exists twice"
            missing = set(acked) - set(names)
            assert not missing, f"{len(missing)} acknowledged run(s) lost: {sorted(missing)[:5]}"
            assert len(acked) == n_acked
            for name in acked[:: max(1, len(acked) // 20)]:
                assert c.get(f"/runs/{name}").status_code == 200
            time.sleep(3)  # heartbeats and a few scheduling cycles after the restart
            assert _keeper(c) == before, "a running worker was restarted or changed"
            assert pid_alive(before["pid"])
        if url:
            # the database unreachable: refuse to start, with a clear message; nothing is cancelled
            srv.kill9()
            bad = dict(srv.env, ASTRAEUS_DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:1/astraeus")
            p = subprocess.run([str(VENV_BIN / "astraeus"), "server", "--home", str(srv.home / "bad"), "--port",
                                str(srv.port)], env=bad, capture_output=True, text=True, timeout=60)
            assert p.returncode != 0
            assert "cannot open the database" in p.stderr, p.stderr
            assert "Traceback" not in p.stderr
            assert pid_alive(before["pid"])
            srv.start()
            with srv.client() as c:
                time.sleep(2)
                assert _keeper(c) == before
                assert set(acked) <= {r["metadata"]["name"] for r in c.get("/runs").json()["items"]}
        agent.kill9()
    finally:
        fleet.close()
        if url:
            drop_postgres(url)
