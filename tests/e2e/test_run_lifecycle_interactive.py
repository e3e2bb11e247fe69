"""The run-lifecycle parts of batch and interactive work, on a real `astraeus up` (process runtime): Slurm's
`--signal=[B:]SIG@SECS` before the time limit, `--no-requeue` after a preemption, an interactive run's idle
timeout, and a shell that says why when its worker is preempted (that one on both runtimes, tests/runtimes.py)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import VENV_BIN, start_cluster, wait_for
from tests.faults.conftest import sleeper_run
from tests.runtimes import KINDS, container_skip_reason, runtime_env

pytestmark = pytest.mark.timeout(240)

ASTRA = str(VENV_BIN / "astra")


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("lifecycle") / "home", stop_grace=1.0)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def container_c(tmp_path_factory, request):
    """A container-runtime cluster for the container variant, and the image its runs name."""
    if (why := container_skip_reason()) is not None:
        pytest.skip(why)
    containers = request.getfixturevalue("containers")
    cluster = start_cluster(tmp_path_factory.mktemp("lifecycle-container") / "home", stop_grace=1.0,
                            env=runtime_env("container", containers))
    try:
        yield cluster, containers.image
    finally:
        cluster.stop()


@pytest.fixture(params=KINDS)
def ci(request):
    """Each runtime's cluster in turn, with the image its runs name."""
    if request.param == "process":
        return request.getfixturevalue("c"), "python:3.11"
    return request.getfixturevalue("container_c")


def astra(c, *args, timeout=60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([ASTRA, *args], env=c.env, capture_output=True, text=True, timeout=timeout, **kw)


def run_of(c, name: str) -> dict:
    with c.client() as h:
        return h.get(f"/runs/{name}").json()


def ended(c, name: str, timeout: float = 60) -> dict:
    wait_for(lambda: run_of(c, name)["status"]["state"] in ("Completed", "Failed", "Cancelled"), timeout,
             interval=0.2, what=f"{name} ended")
    return run_of(c, name)["status"]


def running(c, name: str) -> None:
    wait_for(lambda: run_of(c, name)["status"]["state"] == "Running", 60, interval=0.2, what=f"{name} running")


def delete(c, *names: str) -> None:
    with c.client() as h:
        for n in names:
            h.delete(f"/runs/{n}")


TRAP = """#!/bin/bash
#SBATCH --job-name=trapper
#SBATCH --container-image=busybox
#SBATCH --time=0:06
#SBATCH --signal=B:USR1@4
trap 'echo "got USR1: saving a checkpoint"' USR1
echo started
for i in $(seq 200); do sleep 0.1; done
echo "not reached: the time limit stops it first"
"""


def test_sbatch_signal_comes_before_the_time_limit_then_the_limit_ends_the_run(c, tmp_path):
    (tmp_path / "trap.sbatch").write_text(TRAP)
    r = astra(c, "slurm", "sbatch", "trap.sbatch", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "Submitted batch job trapper\n", r
    assert "--signal" not in r.stderr  # enforced, so nothing to note
    try:
        status = ended(c, "trapper")
        assert status["state"] == "Failed" and status["reason"] == "Stopped at its time limit (6s); not restarted"
        logs = astra(c, "astraeus", "logs", "trapper-0").stdout.splitlines()
        assert logs.count("got USR1: saving a checkpoint") == 1 and logs.index("started") < logs.index(
            "got USR1: saving a checkpoint")
        assert "not reached: the time limit stops it first" not in logs
    finally:
        delete(c, "trapper")


def test_a_signal_without_a_time_limit_is_refused_with_what_to_add(c):
    body = sleeper_run("nolimit")
    body["spec"]["task_template"]["signal"] = {"name": "USR1", "seconds_before_limit": 30}
    with c.client() as h:
        r = h.post("/runs", json=body)
        assert r.status_code == 422 and "give time_limit_seconds too" in r.text, r.text
        body["spec"]["task_template"].update(time_limit_seconds=60, signal={"name": "KILL"})
        r = h.post("/runs", json=body)
        assert r.status_code == 422 and "give one of HUP, INT" in r.text, r.text
        assert h.get("/runs/nolimit").status_code == 404  # nothing stored


def test_no_requeue_a_preempted_run_ends_and_says_why(c):
    low = sleeper_run("scavenger", gpus=8, priority=-100)
    low["spec"]["requeue"] = False
    with c.client() as h:
        assert h.post("/runs", json=low).status_code == 201
    try:
        running(c, "scavenger")
        with c.client() as h:
            assert h.post("/runs", json=sleeper_run("urgent-x", gpus=8)).status_code == 201
        status = ended(c, "scavenger")
        assert status["state"] == "Cancelled", status
        assert status["reason"].startswith("Preempted by urgent-x") and status["reason"].endswith(
            "; not queued again (--no-requeue)"), status
        running(c, "urgent-x")
        time.sleep(1)
        assert run_of(c, "scavenger")["status"]["state"] == "Cancelled"  # not queued again
    finally:
        delete(c, "scavenger", "urgent-x")
        wait_for(lambda: all(run_of(c, n).get("status", {}).get("state") in (None, "Cancelled")
                             for n in ("scavenger", "urgent-x")), 30, what="deleted")


def test_an_interactive_run_with_no_session_attached_ends_at_its_idle_timeout(c):
    body = sleeper_run("idler")
    body["spec"]["interactive"] = {"idle_timeout_seconds": 3}
    with c.client() as h:
        assert h.post("/runs", json=body).status_code == 201
    try:
        running(c, "idler")
        # a session attached for longer than the timeout holds the run
        r = astra(c, "astraeus", "exec", "idler", "--", "sh", "-c", "sleep 5; echo still here")
        assert r.returncode == 0 and r.stdout == "still here\n", r
        status = ended(c, "idler")
        assert status == {**status, "state": "Cancelled", "reason": "No session attached for 3s: ended (idle timeout)"}
    finally:
        delete(c, "idler")


def test_srun_idle_timeout_needs_pty_and_a_time(c):
    r = astra(c, "slurm", "srun", "--idle-timeout=5", "--container-image=busybox", "true")
    assert r.returncode != 0 and "add --pty" in r.stderr, r
    r = astra(c, "slurm", "salloc", "--idle-timeout=soon", "--container-image=busybox", "true")
    assert r.returncode != 0 and "invalid --idle-timeout='soon'" in r.stderr and "--idle-timeout=30" in r.stderr, r


def test_a_preempted_shell_says_why_before_it_closes(ci):
    pexpect = pytest.importorskip("pexpect")
    c, image = ci
    with c.client() as h:
        assert h.post("/runs", json=sleeper_run("notebook", gpus=8, priority=-100, image=image)).status_code == 201
    try:
        running(c, "notebook")
        child = pexpect.spawn(ASTRA, ["astraeus", "shell", "notebook"], env=c.env, timeout=60, encoding="utf-8")
        child.expect(r"[$#] ")  # the prompt (a container's shell runs as its image's user, root)
        with c.client() as h:
            assert h.post("/runs", json=sleeper_run("urgent-y", gpus=8, image=image)).status_code == 201
        child.expect(r"Preempted by[^\r\n]*urgent-y[^\r\n]*: the worker is stopping, so this session ends")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus not in (0, None)
    finally:
        delete(c, "notebook", "urgent-y")
