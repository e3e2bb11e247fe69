"""Worker and run lifecycle on a real local cluster: restarts, crash-loop backoff, time limits, gangs, preemption,
env, restarts of the control plane, lost machines."""

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest

from tests.conftest import start_cluster

PY = sys.executable
# The tests that count restarts wait 1 s, 2 s, … between them instead of 10 s, 20 s, …; the crash-loop test
# below runs on a cluster with the real backoff.
SHORT_BACKOFF = {"ASTRAEUS_RESTART_BACKOFF_BASE": "1"}


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One local cluster shared by this module's tests (each uses its own run names), with a short backoff."""
    c = start_cluster(tmp_path_factory.mktemp("shared") / "home", env=SHORT_BACKOFF)
    yield c
    c.stop()


def submit(cluster, name, code, *, gpus=1, priority=0, policy="OnFailure", budget=None, limit=None, machines=None,
           start=None, env=None):
    tt = {"image": "python:3.11", "command": "python", "args": ["-c", code], "restart_policy": policy,
          "requested_resources": {"gpu_requests": {"count": gpus}}}
    if budget is not None:
        tt["max_restarts"] = budget
    if limit is not None:
        tt["time_limit_seconds"] = limit
    if machines:
        tt["requested_resources"]["machines"] = machines
    if env:
        tt["env"] = env
    spec = {"priority": priority, "task_template": tt}
    if start:
        spec["start"] = start
    with cluster.client() as c:
        r = c.post("/runs", json={"metadata": {"name": name}, "spec": spec})
    assert r.status_code == 201, r.text
    return r.json()


def state(cluster, name):
    return cluster.run(name)["status"]["state"]


def wait_state(cluster, name, want, timeout=60):
    return cluster.wait_for(lambda: (r := cluster.run(name))["status"]["state"] in want and r, timeout,
                            what=f"{name} in {want}")


def test_a_run_completes_with_its_env_and_history(shared_cluster):
    c = shared_cluster
    code = ("import os;print(os.environ['ASTRAEUS_JOB_NAME'], os.environ['ASTRAEUS_GPU_COUNT'],"
            "os.environ['ASTRAEUS_WORKER_NAME'], os.environ['CUDA_VISIBLE_DEVICES'], os.environ['SLURM_JOB_NAME'],"
            "os.environ['GREETING'])")
    submit(c, "env-run", code, gpus=2, env={"GREETING": "hello"})
    run = wait_state(c, "env-run", ("Completed", "Failed"))
    assert run["status"]["state"] == "Completed"
    assert run["status"]["reason"] == "1 of 1 workers succeeded"
    job, gpus, worker, cuda, slurm, greeting = c.logs("env-run-0").split()
    assert job.endswith(".env-run") and job.startswith("ws-")
    assert (gpus, worker, slurm, greeting) == ("2", "env-run-0", "env-run", "hello")
    assert len(cuda.split(",")) == 2
    states = [h["state"] for h in run["status"]["history"]]
    assert states[0] == "Pending" and "Running" in states and states[-1] == "Completed"
    w = run["status"]["workers"][0]
    assert (w["state"], w["exit_code"], w["machine"], w["restarts"]) == ("Succeeded", 0, "gpu-01", 0)


def test_on_failure_restarts_up_to_the_budget(shared_cluster):
    c = shared_cluster
    submit(c, "crashy", "import sys;print('try');sys.exit(3)", budget=2)
    run = wait_state(c, "crashy", ("Failed",), timeout=90)
    w = run["status"]["workers"][0]
    assert w["restarts"] == 2 and w["state"] == "Failed" and w["exit_code"] == 3
    assert w["reason"] == "Failed (exit code 3); restart budget spent"
    assert c.logs("crashy-0").count("try") == 3
    reasons = [h["reason"] for h in run["status"]["history"]]
    assert "Failed (exit code 3); restart 1 of 2 in 1s" in reasons
    assert "Failed (exit code 3); restart 2 of 2 in 2s" in reasons


@pytest.mark.faults
def test_a_crash_looping_worker_backs_off_and_says_when_it_restarts(cluster):
    """`exit 3` at once, OnFailure: restarts come 10 s, 20 s, 40 s apart, so after 60 s at most 4 have been
    spent; the worker's reason says when the next one comes, and the run's says the same."""
    body = {"metadata": {"name": "crashloop"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sh", "args": ["-c", "exit 3"], "restart_policy": "OnFailure",
        "requested_resources": {"gpu_requests": {"count": 1}}}}}
    with cluster.client() as h:
        assert h.post("/runs", json=body).status_code == 201
    countdown = re.compile(r"Restarting in (\d+)s \(exit code 3; restart (\d+) of 10\)")
    start = time.time()
    shown: dict[int, list[int]] = {}  # restart N -> the seconds left, as they were shown
    while time.time() - start < 60:
        w = cluster.worker("crashloop-0")
        assert w["restarts"] <= 4, w
        if w["state"] == "Pending" and (m := countdown.fullmatch(w["reason"])):
            assert int(m[2]) == w["restarts"], w
            shown.setdefault(int(m[2]), []).append(int(m[1]))
        time.sleep(0.5)
    w = cluster.wait_for(lambda: (x := cluster.worker("crashloop-0"))["state"] == "Pending" and x, 10,
                         what="the worker to wait out its backoff")
    assert 2 <= w["restarts"] <= 4 and w["exit_code"] == 3, w
    assert countdown.fullmatch(w["reason"]) and countdown.fullmatch(w["reason"])[2] == str(w["restarts"]), w
    run = cluster.run("crashloop")
    assert run["status"]["state"] == "Pending"
    assert countdown.fullmatch(run["status"]["reason"]), run["status"]["reason"]
    # The reason counts down: restart 2 waits 20 s, and was shown with less and less time left.
    assert max(shown[2]) <= 20 and shown[2] == sorted(shown[2], reverse=True) and len(set(shown[2])) > 5, shown
    # In History: each failure with its delay, and the next start no sooner than that delay (and not at the loop's
    # next 15 s pass: the loop wakes when the backoff ends).
    # (On a loaded machine the 60 s may end while restart 2 still waits out its 20 s: then it has no start yet.)
    hist = run["status"]["history"]
    restarts = run["status"]["workers"][0]["restarts"]
    at = [datetime.fromisoformat(h["time"].replace("Z", "+00:00")).timestamp() for h in hist]
    lines = [h["reason"] for h in hist]
    for n, delay in ((1, 10), (2, 20)):
        line = f"Failed (exit code 3); restart {n} of 10 in {delay}s"
        assert line in lines, (line, hist)
        i = lines.index(line)
        j = next((j for j in range(i, len(hist)) if hist[j]["state"] == "Starting"), None)
        if j is None:
            assert n == restarts, (n, hist)  # only the last failure may still be waiting
            continue
        assert delay <= at[j] - at[i] <= delay + 6, (n, hist)


def test_never_does_not_restart(shared_cluster):
    c = shared_cluster
    submit(c, "once", "import sys;sys.exit(1)", policy="Never")
    run = wait_state(c, "once", ("Failed",))
    w = run["status"]["workers"][0]
    assert (w["restarts"], w["exit_code"], w["reason"]) == (0, 1, "Failed (exit code 1)")


def test_time_limit_fails_and_is_not_restarted(shared_cluster):
    c = shared_cluster
    submit(c, "too-long", "import time;print('start',flush=True);time.sleep(600)", limit=2)
    run = wait_state(c, "too-long", ("Failed",), timeout=60)
    w = run["status"]["workers"][0]
    assert w["restarts"] == 0 and w["state"] == "Failed"
    assert w["reason"] == "Stopped at its time limit (2s); not restarted"
    assert c.logs("too-long-0").count("start") == 1


def test_a_failed_worker_of_a_gang_restarts_the_gang(tmp_path):
    c = start_cluster(tmp_path / "home", machines=2, gpus=2, env=SHORT_BACKOFF)
    try:
        code = ("import os,sys,time;print('up',os.environ['ASTRAEUS_WORKER_NAME'],os.environ['ASTRAEUS_ATTEMPT'],"
                "flush=True);\nif os.environ['ASTRAEUS_WORKER_INDEX']=='1' and os.environ['ASTRAEUS_ATTEMPT']=='1':"
                " time.sleep(1); sys.exit(2)\ntime.sleep(600)")
        submit(c, "gang", code, gpus=2, machines=2, budget=3)
        c.wait_for(lambda: c.logs("gang-0").count("up") >= 2 and c.logs("gang-1").count("up") >= 2, 90,
                   what="the gang to restart")
        run = wait_state(c, "gang", ("Running",))
        ws = {w["name"]: w for w in run["status"]["workers"]}
        assert ws["gang-1"]["restarts"] == 1 and ws["gang-0"]["restarts"] == 0
        assert {w["machine"] for w in ws.values()} == {"gpu-01", "gpu-02"}
        assert c.logs("gang-0").splitlines()[-1] == "up gang-0 2"
    finally:
        c.stop()


def test_preemption_keeps_restarts_and_names_the_run(shared_cluster):
    c = shared_cluster
    submit(c, "scavenger", "import time\nwhile True: time.sleep(1)", priority=-100)
    wait_state(c, "scavenger", ("Running",))
    submit(c, "big", "import time;time.sleep(3)", gpus=8, start="Independent")
    cluster_run = wait_state(c, "scavenger", ("Pending",), timeout=30)
    assert cluster_run["status"]["reason"] == "Preempted by higher-priority work (big); waiting to run again"
    w = cluster_run["status"]["workers"][0]
    assert w["reason"] == "Preempted by big; queued again" and w["restarts"] == 0 and w["preemptions"] == 1
    wait_state(c, "big", ("Completed",), timeout=60)
    run = wait_state(c, "scavenger", ("Running",), timeout=60)
    assert run["status"]["workers"][0]["restarts"] == 0 and run["status"]["preemptions"] == 1
    with c.client() as h:
        assert h.delete("/runs/scavenger").json()["deleted"] is True


def test_delete_stops_the_worker(shared_cluster):
    c = shared_cluster
    submit(c, "doomed", "import time\nwhile True: print('tick',flush=True); time.sleep(0.2)")
    run = wait_state(c, "doomed", ("Running",))
    pid = c.wait_for(lambda: c.worker("doomed-0")["pid"], 10, what="pid")
    with c.client() as h:
        assert h.delete("/runs/doomed").status_code == 200
        c.wait_for(lambda: h.get("/runs/doomed").status_code == 404, 20, what="the run to go")
    c.wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
               10, what="the process to end")
    assert run["status"]["state"] == "Running"


def test_control_plane_restart_mid_run_loses_nothing(tmp_path):
    """The control plane is killed with SIGKILL while a worker runs; the worker keeps running, the agent
    re-syncs with the restarted control plane, and nothing is restarted or lost."""
    import httpx
    import psutil

    from tests.conftest import read_env

    home = tmp_path / "home"
    c = start_cluster(home)
    agents = [p for p in psutil.Process(c.proc.pid).children() if "agent" in " ".join(p.cmdline())]
    server = None
    try:
        submit(c, "steady", "import time\ni=0\nwhile True: print(i,flush=True); i+=1; time.sleep(0.2)")
        wait_state(c, "steady", ("Running",))
        pid = c.wait_for(lambda: c.worker("steady-0")["pid"], 10, what="pid")
        before = len(c.logs("steady-0").splitlines())
        os.kill(c.proc.pid, signal.SIGKILL)  # the control plane; its agents and workers live on
        c.proc.wait()
        time.sleep(2)
        assert psutil.pid_exists(pid)
        (home / "env").unlink(missing_ok=True)
        server = subprocess.Popen([os.path.join(os.path.dirname(PY), "astraeus"), "server", "--home", str(home),
                                   "--port", str(c.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c.wait_for(lambda: (home / "env").exists(), 30, what="the restarted control plane")
        c.vars = read_env(home / "env")
        c.wait_for(lambda: _healthy(httpx, c), 30, what="healthz")
        c.wait_for(lambda: len(c.logs("steady-0").splitlines()) > before + 5, 30, what="logs to continue")
        w = c.worker("steady-0")
        assert (w["state"], w["pid"], w["restarts"], w["attempt"]) == ("Running", pid, 0, 1)
        lines = [int(x) for x in c.logs("steady-0").split()]
        assert lines == list(range(len(lines)))  # no gap, no repeated line
    finally:
        for a in agents:
            a.terminate()
        psutil.wait_procs(agents, timeout=30)
        if server:
            server.terminate()
            server.wait(timeout=30)


def _healthy(httpx, c) -> bool:
    try:
        return httpx.get(c.server + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
