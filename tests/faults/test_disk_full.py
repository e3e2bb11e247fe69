"""Issue 42, item 4: the control plane survives a full disk. Its home (the SQLite database) on a small filesystem
that a file fills: a submit that cannot be written answers 503 with the reason, /healthz says why, and once the
file is removed the control plane writes and schedules again by itself (no restart), with every run it had
acknowledged still there. And the scheduling lease's renewals keep trying through a full disk and lead again."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from astraeus.server.diskfull import WriteHealth, cause
from astraeus.server.leader import Leader

from .conftest import sleeper_run, wait_for
from .loopfs import fill, small_fs

# a run whose spec is large (8 env values of 30 KB): a few of them need more room than SQLite's log had
PAD = 8


def _big(name: str) -> dict:
    return sleeper_run(name, gpus=0, code="print('done', flush=True)", restart="Never",
                       env={f"PAD{k}": os.urandom(15000).hex() for k in range(PAD)})


@pytest.mark.faults
def test_control_plane_on_a_full_disk_answers_503_and_recovers_by_itself(fleet, tmp_path):
    with small_fs(tmp_path / "small", mib=64) as fs:
        home = fs / "home"
        srv = fleet.server(home=home)
        fleet.agent(srv)
        acked: list[str] = []
        with srv.client() as c:
            for i in range(3):
                r = c.post("/runs", json=sleeper_run(f"before-{i}", gpus=0, code="print('hi', flush=True)",
                                                     restart="Never"))
                assert r.status_code == 201, r.text
                acked.append(f"before-{i}")
            wait_for(lambda: all(c.get(f"/runs/{n}").json()["status"]["state"] == "Completed" for n in acked),
                     timeout=60, what="the first runs completed")

            fill(fs / "filler")
            refused = None
            for i in range(200):  # until a write needs room the disk does not have
                r = c.post("/runs", json=_big(f"big-{i}"))
                if r.status_code == 201:
                    acked.append(f"big-{i}")
                    continue
                refused = r
                break
            assert refused is not None, "every submit was written on a full disk"
            assert refused.status_code == 503, refused.text
            body = refused.json()
            assert body["code"] == "DISK_FULL"
            assert body["message"] == (f"The control plane cannot write: no space left on the disk of {home} "
                                       "(database or disk is full); free space there"), body
            h = httpx.get(srv.url + "/healthz", timeout=10)
            assert h.status_code == 503, h.text
            assert h.json()["database"] == "cannot write"
            assert h.json()["reason"] == body["message"]
            time.sleep(2)  # a few lease renewals and scheduling cycles on the full disk
            assert srv.proc.poll() is None, "the control plane ended on a full disk"
            assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 503

            (fs / "filler").unlink()  # space returns: no restart from here on
            health = wait_for(lambda: (h := httpx.get(srv.url + "/healthz", timeout=10)).status_code == 200
                              and h.json(), timeout=30, what="/healthz ok again")
            assert health["database"] == "ok"
            wait_for(lambda: httpx.get(srv.url + "/healthz", timeout=10).json()["role"] == "leader", timeout=30,
                     what="the control plane leading the scheduling again")
            r = c.post("/runs", json=sleeper_run("after", gpus=0, code="print('after', flush=True)",
                                                 restart="Never"))
            assert r.status_code == 201, r.text
            wait_for(lambda: c.get("/runs/after").json()["status"]["state"] == "Completed", timeout=60,
                     what="a run submitted after the disk had room again completed")
            assert "after" in c.get("/workers/after-0/logs").text
            names = {r["metadata"]["name"] for r in c.get("/runs", params={"limit": 1000}).json()["items"]}
            assert set(acked) <= names, f"acknowledged runs lost: {sorted(set(acked) - names)}"
            assert srv.proc.poll() is None


class _Flaky:
    """A session factory whose transactions fail as SQLite's on a full disk while `full` is set."""

    def __init__(self, real):
        self.real, self.full = real, threading.Event()

    def __call__(self, *a, **kw):
        if self.full.is_set():
            raise OperationalError("UPDATE leases", {}, _SqliteFull("database or disk is full"))
        return self.real(*a, **kw)


class _SqliteFull(Exception):
    __module__ = "sqlite3"
    sqlite_errorcode = 13


def test_the_lease_keeps_trying_through_a_full_disk_and_leads_again(tmp_path):
    """No root needed: the lease's renewals fail as on a full disk, the replica stops leading and the reason is the
    disk's; once writes work again it leads again by itself, at a higher epoch."""
    from astraeus.server.core import ControlPlane
    from astraeus.settings import ServerSettings

    cp = ControlPlane.open(ServerSettings(home=tmp_path / "home", database_url=None))
    flaky = _Flaky(cp.sessions)
    health = WriteHealth(None)  # judged by the writes themselves (PostgreSQL's way): no filesystem to look at
    ld = Leader(flaky, "r1", 0.6, on_error=health.failed)
    ld.start()
    try:
        first = wait_for(ld.term, timeout=10, what="the replica leading")
        flaky.full.set()
        wait_for(lambda: ld.term() is None, timeout=10, what="the lease lost while the disk is full")
        assert health.reason == ("The control plane cannot write: no space left on the database server's disk "
                                 "(database or disk is full); free space there")
        flaky.full.clear()
        again = wait_for(ld.term, timeout=10, what="the replica leading again")
        assert again.epoch > first.epoch
    finally:
        ld.stop()
        cp.engine.dispose()


def test_disk_full_errors_are_recognised():
    import errno

    class Pg(Exception):
        sqlstate = "53100"

    assert cause(OSError(errno.ENOSPC, "No space left on device", "/x/env.tmp")) == (
        "No space left on device", "/x/env.tmp")
    assert cause(OperationalError("INSERT", {}, Pg('could not extend file "base/1/2": No space left on device')))
    assert cause(OperationalError("INSERT", {}, _SqliteFull("database or disk is full"))) == (
        "database or disk is full", None)
    assert cause(OperationalError("SELECT", {}, Exception("database is locked"))) is None
    assert cause(OSError(errno.EACCES, "Permission denied")) is None
    h = WriteHealth(None)
    assert h.failed(OSError(errno.ENOSPC, "No space left on device", "/srv/astraeus/env.tmp")) == (
        "The control plane cannot write: no space left on the disk of /srv/astraeus (No space left on device); "
        "free space there")
