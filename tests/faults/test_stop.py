"""Item 6, stop timing, through a real `astraeus up` (stop grace 2 s): a preemption sends SIGTERM, then SIGKILL to
the whole tree at SIGTERM + grace (± 1 s), double-forked children included; a worker that exits on SIGTERM is
never SIGKILLed; each preemption adds exactly one to the run's preemption count and none to its restarts.
(tests/agent/test_runtime.py checks the same at the runtime level: test_stop_kills_whole_tree_including_double_forked,
test_early_exit_never_gets_sigkill.) Both run on both runtimes (`runtime`: ids process/container), and so does a
short check that a time limit fails the worker and OnFailure restarts it, on containers (tests/lifecycle has
those for the process runtime)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import start_cluster

from .conftest import machines_run, pid_alive, sleeper_run, wait_for

GRACE = 2.0

STUBBORN = r"""
import os, signal, sys, time
out = os.environ["OUT"]
def on_term(s, f):
    with open(os.path.join(out, "sigterm-%d" % os.getpid()), "w") as fh:
        fh.write(repr(time.time()))
signal.signal(signal.SIGTERM, on_term)   # noted, then ignored
if os.fork() == 0:
    os.setsid()                          # leaves the process group...
    if os.fork() == 0:                   # ...and is orphaned: a double fork
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(out, "grandchild"), "w").write(str(os.getpid()))
        while True:
            time.sleep(0.1)
    os._exit(0)
child = os.fork()
if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.1)
open(os.path.join(out, "child"), "w").write(str(child))
print("up", flush=True)
while True:
    time.sleep(0.1)
"""

POLITE = r"""
import os, signal, sys, time
def on_term(s, f):
    print("SIGTERM: saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def cluster(tmp_path, runtime):
    """A fresh `astraeus up` (one machine, 8 simulated GPUs, stop grace 2 s) whose machine uses the test's runtime."""
    c = start_cluster(tmp_path / "home", env=runtime.env)
    c.image = runtime.image
    with c.client() as cl:
        machines_run(cl, runtime.kind)
    yield c
    c.stop()


def _urgent(name: str, image: str) -> dict:
    return sleeper_run(name, gpus=8, restart="Never", image=image)


def host_pid(main: int, ns_pid: int) -> int:
    """The host's pid of the process that the worker's own PID namespace (the one `main` is in) calls `ns_pid`."""
    ns = os.readlink(f"/proc/{main}/ns/pid")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != ns:
                continue
            with open(f"/proc/{name}/status") as f:
                nspid = next(ln.split()[1:] for ln in f if ln.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if nspid[-1] == str(ns_pid):
            return int(name)
    raise AssertionError(f"no process of the worker's namespace is pid {ns_pid} there")


@pytest.mark.faults
def test_stop_timing_tree_kill_and_preemption_counts(cluster, tmp_path):
    # Workers see the host read-only: the stubborn one writes what the test reads to a ReadWrite drive, under the
    # host path `astraeus up` grants its workspace.
    out = Path("/data/astraeus") / f"test-stop-{uuid.uuid4().hex[:12]}"
    with cluster.client() as c:
        drive = {"metadata": {"name": "out"}, "spec": {"sources": [
            {"node": "gpu-01", "path": str(out), "mount_path": "/out", "mode": "ReadWrite"}],
            "permissions": {"create": True}}}
        assert c.post("/drives", json=drive).status_code == 201
        stubborn = sleeper_run("stubborn", gpus=4, priority=-10, code=STUBBORN, env={"OUT": "/out"},
                               image=cluster.image)
        stubborn["spec"]["task_template"]["datavolume_refs"] = [{"name": "out", "mount_path": "/out"}]
        assert c.post("/runs", json=stubborn).status_code == 201
        polite = sleeper_run("polite", gpus=4, priority=-10, code=POLITE, image=cluster.image)
        assert c.post("/runs", json=polite).status_code == 201
        for r in ("stubborn", "polite"):
            cluster.wait_for(lambda r=r: cluster.worker(r + "-0")["state"] == "Running", timeout=30, what=r)
        cluster.wait_for(lambda: (out / "grandchild").exists() and (out / "child").exists(), what="children")
        main = cluster.worker("stubborn-0")["pid"]
        # the worker wrote its children's pids as its own PID namespace numbers them
        gc, child = (host_pid(main, int((out / f).read_text())) for f in ("grandchild", "child"))
        polite_pid = cluster.worker("polite-0")["pid"]
        assert all(pid_alive(p) for p in (main, gc, child, polite_pid))

        # one urgent run needing all 8 GPUs preempts both
        assert c.post("/runs", json=_urgent("urgent-1", cluster.image)).status_code == 201
        deaths: dict[int, float] = {}
        end = time.time() + GRACE + 15
        while time.time() < end and len(deaths) < 4:
            for p in (main, gc, child, polite_pid):
                if p not in deaths and not pid_alive(p):
                    deaths[p] = time.time()
            time.sleep(0.01)
        assert len(deaths) == 4, "the whole tree is gone, double-forked grandchild included"
        term = float(wait_for(lambda: next((f.read_text() for f in out.glob("sigterm-*")), None), what="SIGTERM"))
        for p in (main, gc, child):
            assert abs(deaths[p] - (term + GRACE)) <= 1.0, (p, deaths[p] - term)
        assert deaths[polite_pid] - term < GRACE - 0.5  # it exited on SIGTERM, well before any SIGKILL

        for r in ("stubborn", "polite"):
            cluster.wait_for(lambda r=r: cluster.worker(r + "-0")["state"] == "Pending", timeout=20, what=r)
        s, p = cluster.worker("stubborn-0"), cluster.worker("polite-0")
        assert s["exit_code"] == 137  # SIGKILL at the grace
        assert p["exit_code"] == 0  # exited on its own: never SIGKILLed
        assert "SIGTERM: saved" in cluster.logs("polite-0")
        for r, w in (("stubborn", s), ("polite", p)):
            run = cluster.run(r)
            assert run["status"]["preemptions"] == 1 and run["status"]["restarts"] == 0, run["status"]
            assert w["preemptions"] == 1 and w["restarts"] == 0

        # twice more: each preemption adds exactly one, restarts stay 0
        for k in (2, 3):
            assert c.delete(f"/runs/urgent-{k - 1}").status_code == 200
            cluster.wait_for(lambda: cluster.worker("polite-0")["state"] == "Running", timeout=30, what="polite back")
            cluster.wait_for(lambda: cluster.worker("stubborn-0")["state"] == "Running", timeout=30, what="back")
            assert c.post("/runs", json=_urgent(f"urgent-{k}", cluster.image)).status_code == 201
            cluster.wait_for(lambda k=k: cluster.run("polite")["status"]["preemptions"] == k
                             and cluster.worker("polite-0")["state"] == "Pending", timeout=30, what=f"preemption {k}")
            run = cluster.run("polite")
            assert run["status"]["restarts"] == 0 and run["status"]["workers"][0]["preemptions"] == k
            assert cluster.worker("polite-0")["exit_code"] == 0
        cluster.wait_for(lambda: cluster.run("stubborn")["status"]["preemptions"] == 3
                         and cluster.worker("stubborn-0")["state"] == "Pending", timeout=30, what="stubborn x3")
        assert cluster.run("stubborn")["status"]["restarts"] == 0
    # nothing of the stubborn tree survived any of it
    assert not any(pid_alive(p) for p in (main, gc, child))
    shutil.rmtree(out, ignore_errors=True)


@pytest.mark.faults
def test_time_limit_fails_and_on_failure_restarts_a_container(tmp_path, containers):
    """On the container runtime, as tests/lifecycle/test_lifecycle.py checks on the process runtime: a worker
    past its time limit is stopped and Failed, not restarted; a worker that exits 3 under OnFailure is started
    again (from its image, a fresh attempt) until its restart budget is spent."""
    cl = start_cluster(tmp_path / "home", env={**containers.agent_env(), "ASTRAEUS_RESTART_BACKOFF_BASE": "1"})
    try:
        with cl.client() as c:
            machines_run(c, "container")
            too_long = sleeper_run("too-long", restart="OnFailure", image=containers.image,
                                   code="import time\nprint('start', flush=True)\ntime.sleep(600)\n")
            too_long["spec"]["task_template"]["time_limit_seconds"] = 2
            assert c.post("/runs", json=too_long).status_code == 201
            crashy = sleeper_run("crashy", restart="OnFailure", max_restarts=2, image=containers.image,
                                 code="import sys\nprint('try', flush=True)\nsys.exit(3)\n")
            assert c.post("/runs", json=crashy).status_code == 201
            for name in ("too-long", "crashy"):
                cl.wait_for(lambda name=name: cl.run(name)["status"]["state"] == "Failed", timeout=90,
                            what=f"{name} Failed")
        w = cl.run("too-long")["status"]["workers"][0]
        assert (w["state"], w["restarts"], w["reason"]) == ("Failed", 0, "Stopped at its time limit (2s); not restarted")
        assert cl.logs("too-long-0").count("start") == 1
        run = cl.run("crashy")
        w = run["status"]["workers"][0]
        assert (w["state"], w["restarts"], w["exit_code"]) == ("Failed", 2, 3)
        assert w["reason"] == "Failed (exit code 3); restart budget spent"
        assert cl.logs("crashy-0").count("try") == 3
        reasons = [h["reason"] for h in run["status"]["history"]]
        assert "Failed (exit code 3); restart 1 of 2 in 1s" in reasons
    finally:
        cl.stop()
