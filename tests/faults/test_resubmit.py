"""Issue 42, item 9: a worker belongs to one run. The everyday fix-and-resubmit loop — delete a run and at once submit
another of the same name (as soon as the name is free: the old worker takes a second of its stop grace to exit,
and the agent still holds its ended attempt) — starts the new command from its first attempt: never the old
worker's end, never its lines, never its History.
On both runtimes, 20 times in a row; and a run submitted again right after one of its name Completed runs too."""

from __future__ import annotations

import pytest

from .conftest import cluster_on, wait_for

pytestmark = pytest.mark.faults

# The old worker stays a second in its stop grace (SIGTERM caught), so its end lands after the new run started.
SLOW_TO_STOP = ("import signal, sys, time\n"
                "def bye(*_):\n    time.sleep(1); print('{tag} stopped', flush=True); sys.exit(143)\n"
                "signal.signal(signal.SIGTERM, bye)\n"
                "print('{tag}', flush=True)\n"
                "while True:\n    time.sleep(0.2)\n")


def _live(tag: str, image: str, code: str = SLOW_TO_STOP) -> dict:
    return {"metadata": {"name": "live"}, "spec": {"task_template": {
        "image": image, "command": "python", "args": ["-c", code.format(tag=tag)], "restart_policy": "Never",
        "requested_resources": {"cpu_cores": 0.1, "memory_bytes": 1 << 27, "gpu_requests": {"count": 1}}}}}


@pytest.fixture
def cluster(runtime):
    with cluster_on(runtime, "astraeus-resubmit-", stop_grace=5) as c:
        yield c


def _resubmit(cl, body: dict):
    """Submit again as soon as the name is free: the deleted run holds it until its worker has ended (409 until
    then); the agent may still hold that ended attempt, and its worker's ended process, as the new one starts."""
    def taken():
        r = cl.post("/runs", json=body)
        assert r.status_code == 201 or (r.status_code == 409 and " is being deleted (its workers are stopping)"
                                        in r.json()["message"]), r.text
        return r.status_code == 201 and r
    return wait_for(taken, timeout=30, interval=0.01, what="the name free again")


def _started_fresh(cl, tag: str, uid: str) -> dict:
    """The run named live is the one of `uid`, its worker Running its own command from attempt 1."""
    run = cl.get("/runs/live").json()
    w = cl.get("/workers/live-0").json()
    logs = cl.get("/workers/live-0/logs").text
    if run["metadata"]["uid"] != uid or w["state"] != "Running" or tag not in logs:
        return {}
    return {"run": run, "worker": w, "logs": logs}


def test_delete_and_resubmit_at_once_runs_the_new_command_from_attempt_1(cluster, runtime):
    with cluster.client() as cl:
        r = cl.post("/runs", json=_live("first", runtime.image))
        assert r.status_code == 201, r.text
        wait_for(lambda: _started_fresh(cl, "first", r.json()["metadata"]["uid"]), timeout=60, what="first running")
        for i in range(20):
            tag = f"resubmitted-{i}"
            assert cl.delete("/runs/live").status_code in (200, 202, 204)
            r = _resubmit(cl, _live(tag, runtime.image))
            uid = r.json()["metadata"]["uid"]
            got = wait_for(lambda tag=tag, uid=uid: _started_fresh(cl, tag, uid), timeout=60,
                           what=f"{tag} running its own command")
            w, logs = got["worker"], got["logs"]
            assert w["attempt"] == 1 and w["restarts"] == 0, (i, w)
            assert "stopped" not in logs and logs.splitlines()[0] == tag, (i, logs)
            history = cl.get("/runs/live").json()["status"]["history"]
            assert history[0]["reason"] == "Submitted", (i, history)
            assert [h["time"] for h in history] == sorted(h["time"] for h in history), (i, history)
        # the last one stays its own: the older workers' ends (a second later each) never reach it
        last = wait_for(lambda: _started_fresh(cl, "resubmitted-19", uid), timeout=10, what="the last run")
        assert last["worker"]["attempt"] == 1
        assert cl.delete("/runs/live").status_code in (200, 202, 204)


def test_resubmit_right_after_a_completed_run_runs_again(cluster, runtime):
    done = "print('{tag}', flush=True)\n"
    with cluster.client() as cl:
        for i in range(3):
            tag = f"done-{i}"
            r = cl.post("/runs", json=_live(tag, runtime.image, done))
            assert r.status_code == 201, r.text
            uid = r.json()["metadata"]["uid"]

            def completed(uid=uid, tag=tag):
                run = cl.get("/runs/live").json()
                return (run["metadata"]["uid"] == uid and run["status"]["state"] == "Completed"
                        and cl.get("/workers/live-0/logs").text == f"{tag}\n" and run)
            wait_for(completed, timeout=60, what=f"{tag} completed with its own line")
            assert cl.delete("/runs/live").status_code in (200, 202, 204)
