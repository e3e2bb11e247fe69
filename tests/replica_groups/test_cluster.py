"""Replica groups on a real local cluster (process runtime): a killed replica restarts within its budget and is
replaced past it, a failing one is replaced once past its budget, a deleted one is replaced, a preempted one is
queued again (not replaced), and the count returns to the spec; scale-down removes waiting replicas first, then
the most recently started."""

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import start_cluster

PY = sys.executable
# A short backoff (workers and groups alike: 5 s, then 10 s …), and a full scheduling pass every second.
ENV = {"ASTRAEUS_RESTART_BACKOFF_BASE": "5", "ASTRAEUS_SCHEDULE_INTERVAL": "1"}


@pytest.fixture
def cluster(tmp_path):
    c = start_cluster(tmp_path / "home", env=ENV)
    yield c
    c.stop()


@pytest.fixture
def flags(cluster):
    """A folder the workers see at /flags: a ReadOnly drive of the workspace (under the host path `up` grants;
    a worker sees no host folder but its drives)."""
    base = Path("/data/astraeus")
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="astraeus-rg-", dir=base))
    d.chmod(0o755)
    with cluster.client() as h:
        r = h.post("/drives", json={"metadata": {"name": "flags"}, "spec": {"sources": [
            {"node": "gpu-01", "path": str(d), "mount_path": "/flags", "mode": "ReadOnly"}]}})
        assert r.status_code == 201, r.text
    yield d
    shutil.rmtree(d, ignore_errors=True)


def replica_code(flags: str = "/flags") -> str:
    # Runs until a file named after its worker appears in `flags`, then fails with exit code 3.
    return (f"import os,sys,time\nf=os.path.join({flags!r},os.environ['ASTRAEUS_WORKER_NAME'])\n"
            "print('up',flush=True)\nwhile not os.path.exists(f): time.sleep(0.2)\nsys.exit(3)")


def group_body(name, replicas, code, gpus=2, priority=-10, budget=1, drives=()):
    return {"metadata": {"name": name}, "spec": {"replicas": replicas, "run": {
        "priority": priority, "task_template": {
            "image": "python:3.11", "command": "python", "args": ["-c", code], "max_restarts": budget,
            "datavolume_refs": [{"name": n, "mount_path": f"/{n}", "mode": "ReadOnly"} for n in drives],
            "requested_resources": {"gpu_requests": {"count": gpus}}}}}}


def shown(c, name="evals") -> dict:
    with c.client() as h:
        return h.get(f"/replica-groups/{name}").json()


def alive(c, name="evals") -> dict[str, dict]:
    return {r["name"]: r for r in shown(c, name)["status"]["runs"] if r["state"] in ("Pending", "Starting", "Running",
                                                                                    "Stopping")}


def running(c, n, name="evals", timeout=60) -> dict[str, dict]:
    def ok():
        a = alive(c, name)
        return len(a) == n and all(r["state"] == "Running" for r in a.values()) and a
    return c.wait_for(ok, timeout, what=f"{n} replicas of {name} running")


def events(c, kind) -> list[str]:
    with c.client() as h:
        return [e["message"] for e in h.get("/events").json()["items"] if e["kind"] == kind]


def pid_of(c, worker):
    return c.wait_for(lambda: (w := c.worker(worker))["state"] == "Running" and w["pid"], 20,
                      what=f"{worker}'s pid")


@pytest.mark.faults
def test_kill_fail_delete_and_preempt_replicas_and_the_count_returns(cluster, flags):
    c = cluster
    with c.client() as h:
        r = h.post("/replica-groups", json=group_body("evals", 3, replica_code(), drives=["flags"]))
        assert r.status_code == 201, r.text
    assert set(running(c, 3)) == {"evals-1", "evals-2", "evals-3"}

    # Killed once: its worker restarts within the run's budget (1), the replica is not replaced.
    os.kill(pid_of(c, "evals-1-0"), signal.SIGKILL)
    c.wait_for(lambda: c.worker("evals-1-0")["restarts"] == 1 and c.worker("evals-1-0")["state"] == "Running", 30,
               what="evals-1 restarted")
    assert set(running(c, 3)) == {"evals-1", "evals-2", "evals-3"}
    # Killed again: past its budget the run fails, and a new replica takes its place.
    os.kill(pid_of(c, "evals-1-0"), signal.SIGKILL)
    c.wait_for(lambda: c.run("evals-1")["status"]["state"] == "Failed", 30, what="evals-1 to fail")
    assert set(running(c, 3)) == {"evals-2", "evals-3", "evals-4"}
    assert c.run("evals-1")["status"]["state"] == "Failed"
    assert any("evals-1 is gone (Failed: " in m and "created evals-4 in its place" in m
               for m in events(c, "ReplicaReplaced"))

    # Fails on its own (exit code 3) past its budget: replaced, after a short backoff (2 failures in a row).
    (flags / "evals-2-0").touch()
    c.wait_for(lambda: c.run("evals-2")["status"]["state"] == "Failed", 30, what="evals-2 to fail twice")
    assert set(running(c, 3)) == {"evals-3", "evals-4", "evals-5"}
    assert c.run("evals-2")["status"]["reason"].startswith("Failed (exit code 3); restart budget spent")
    assert any("2 replicas failed in a row" in m for m in events(c, "ReplicaBackoff"))

    # Deleted: replaced at once.
    with c.client() as h:
        assert h.delete("/runs/evals-3").status_code == 200
        c.wait_for(lambda: h.get("/runs/evals-3").status_code == 404, 30, what="evals-3 deleted")
    assert set(running(c, 3)) == {"evals-4", "evals-5", "evals-6"}
    assert any("evals-3 is gone (deleted); created evals-6 in its place" in m for m in events(c, "ReplicaReplaced"))

    # Preempted by higher-priority work: queued again like any run, not replaced.
    with c.client() as h:
        r = h.post("/runs", json={"metadata": {"name": "urgent"}, "spec": {"priority": 0, "task_template": {
            "image": "python:3.11", "command": "python", "args": ["-c", "import time; time.sleep(600)"],
            "requested_resources": {"gpu_requests": {"count": 4}}}}})
        assert r.status_code == 201, r.text

    def one_preempted():
        a = alive(c)
        waiting = [n for n, r in a.items() if r["state"] == "Pending"]
        return len(a) == 3 and len(waiting) == 1 and waiting[0]
    victim = c.wait_for(one_preempted, 60, what="a replica preempted")
    assert c.run(victim)["status"]["reason"] == "Preempted by higher-priority work (urgent); waiting to run again"
    time.sleep(2)  # several cycles of the duty: still the same three, nothing created
    assert set(alive(c)) == {"evals-4", "evals-5", "evals-6"}
    with c.client() as h:
        assert h.delete("/runs/urgent").status_code == 200
    assert set(running(c, 3)) == {"evals-4", "evals-5", "evals-6"}
    assert c.run(victim)["status"]["preemptions"] == 1
    g = shown(c)["status"]
    assert (g["replicas"], g["alive"], g["running"]) == (3, 3, 3)

    with c.client() as h:
        assert h.delete("/replica-groups/evals").status_code == 200
        c.wait_for(lambda: h.get("/runs").json()["items"] == [], 30, what="the group's runs deleted")
        assert h.get("/replica-groups/evals").status_code == 404


@pytest.mark.faults
def test_scale_down_removes_waiting_replicas_first_then_the_most_recently_started(cluster):
    c = cluster
    code = "import time\nprint('up',flush=True)\ntime.sleep(600)"
    with c.client() as h:
        # 8 GPUs, 2 per replica: four run, two wait.
        assert h.post("/replica-groups", json=group_body("svc", 2, code)).status_code == 201
        running(c, 2, "svc")
        time.sleep(1.1)  # so that the next ones start later than these
        assert h.patch("/replica-groups/svc", json={"spec": {"replicas": 4}}).status_code == 200
        running(c, 4, "svc")
        assert h.patch("/replica-groups/svc", json={"spec": {"replicas": 6}}).status_code == 200
        c.wait_for(lambda: len(alive(c, "svc")) == 6, 30, what="six replicas")
        a = alive(c, "svc")
        assert {n for n, r in a.items() if r["state"] == "Running"} == {"svc-1", "svc-2", "svc-3", "svc-4"}
        assert {n for n, r in a.items() if r["state"] == "Pending"} == {"svc-5", "svc-6"}

        assert h.patch("/replica-groups/svc", json={"spec": {"replicas": 3}}).status_code == 200
        left = c.wait_for(lambda: len(a := alive(c, "svc")) == 3 and a, 30, what="three replicas left")
        # The waiting two go first, then one of the two started last.
        assert {"svc-1", "svc-2"} < set(left) and len(set(left) & {"svc-3", "svc-4"}) == 1, left
        newest = ({"svc-3", "svc-4"} - set(left)).pop()
    removed = events(c, "ReplicaRemoved")
    assert any("removed svc-6 (it was Pending)" in m for m in removed)
    assert any("removed svc-5 (it was Pending)" in m for m in removed)
    assert any(f"removed {newest} (it was Running)" in m for m in removed)
