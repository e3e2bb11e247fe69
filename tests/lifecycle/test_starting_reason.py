"""While a worker starts, its reason is what its machine says it is doing (issue 14): an agent report with state
Starting and a message ("Pulling image 127.0.0.1:5000/x:1") makes that the worker's reason, and the run's reason
shows it; then Running, or a StartFailed's reason. Through the agent protocol (POST /report) of an in-process
control plane, read back with GET run as a user sees it.

And the other way: why a worker is stopped reaches its machine in the assignment (`stop_reason`), in the words
the pages use, which the agent writes to the worker's ASTRAEUS_STOP_REASON_FILE: another workspace's run is never
named."""

from __future__ import annotations

from tests.conftest import wait_for

REG = {"gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}
IMAGE = "127.0.0.1:5000/team/train:1"


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _register(app, machine: str) -> str:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": machine, **REG})
    assert r.status_code == 200, r.text
    return r.json()["credential"]


def _setup(app, run: str, workers: int = 1, restart_policy: str = "OnFailure") -> tuple[dict, list[dict]]:
    """One machine per worker (gpu-01, gpu-02, …), and the run placed: ({machine: credential}, its assignments)."""
    creds = {f"gpu-{i + 1:02d}": _register(app, f"gpu-{i + 1:02d}") for i in range(workers)}
    body = {"metadata": {"name": run}, "spec": {"task_template": {
        "image": IMAGE, "command": "python", "args": ["train.py"], "restart_policy": restart_policy,
        "requested_resources": {"gpu_requests": {"count": workers, "min_per_machine": 1}}}}}  # one per machine
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 201, r.text

    def placed():
        mine = []
        for machine, cred in creds.items():
            got = app.client.get("/api/v1/agent/assignments", params={"machine": machine}, headers=_h(cred)).json()
            mine += [dict(a, machine=machine) for a in got["assignments"] if a["run"] == run]
        return mine if len(mine) == workers else None

    return creds, wait_for(placed, timeout=20, what="the workers placed")


def _report(app, creds: dict, *workers: dict, machine: str = "gpu-01") -> None:
    r = app.client.post("/api/v1/agent/report", headers=_h(creds[machine]),
                        json={"machine": machine, "workers": list(workers)})
    assert r.status_code == 200, r.text


def _run(app, name: str) -> dict:
    return app.client.get(f"{app.api}/runs/{name}", headers=app.h()).json()


def test_the_reason_says_pulling_image_then_running(app):
    cred, (a,) = _setup(app, "pull")
    run = _run(app, "pull")
    assert run["status"]["state"] == "Starting"
    assert run["status"]["workers"][0]["reason"] == "Starting on gpu-01"

    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting",
                        "message": f"Pulling image {IMAGE}"})
    run = _run(app, "pull")
    assert run["status"]["state"] == "Starting"
    assert run["status"]["workers"][0]["state"] == "Starting"
    assert run["status"]["workers"][0]["reason"] == f"Pulling image {IMAGE}"
    assert f"Pulling image {IMAGE}" in run["status"]["reason"]
    w = app.client.get(f"{app.api}/workers/pull-0", headers=app.h()).json()
    assert w["reason"] == f"Pulling image {IMAGE}"

    # The same report again changes nothing; a new word replaces it.
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting",
                        "message": f"Pulling image {IMAGE}"})
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting",
                        "message": "Unpacking image layers"})
    assert _run(app, "pull")["status"]["workers"][0]["reason"] == "Unpacking image layers"
    # A Starting report without a message keeps the last word.
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting"})
    assert _run(app, "pull")["status"]["workers"][0]["reason"] == "Unpacking image layers"

    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Running", "pid": 4242})
    run = _run(app, "pull")
    assert run["status"]["state"] == "Running"
    assert run["status"]["workers"][0]["reason"] == "Running"
    assert run["status"]["reason"] == "1 of 1 workers running"
    assert "Pulling" not in run["status"]["reason"]

    # Once running, a late Starting report (a stale one) does not bring the word back.
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting",
                        "message": f"Pulling image {IMAGE}"})
    assert _run(app, "pull")["status"]["workers"][0]["reason"] == "Running"


def test_a_pull_that_fails_gives_the_start_failure_as_the_reason(app):
    cred, (a,) = _setup(app, "nopull", restart_policy="Never")
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting",
                        "message": f"Pulling image {IMAGE}"})
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "StartFailed",
                        "message": f"image {IMAGE} not found"})
    run = _run(app, "nopull")
    assert run["status"]["state"] == "Failed"
    assert run["status"]["workers"][0]["reason"] == f"Failed (failed to start: image {IMAGE} not found)"
    assert "Pulling" not in run["status"]["reason"]


def test_a_gang_run_shows_the_word_of_a_worker_still_starting(app):
    cred, assigned = _setup(app, "gang", workers=2)
    a, b = sorted(assigned, key=lambda x: x["worker"])
    for w in (a, b):
        _report(app, cred, {"worker": w["worker"], "attempt": w["attempt"], "state": "Starting",
                            "message": f"Pulling image {IMAGE}"}, machine=w["machine"])
    run = _run(app, "gang")
    assert run["status"]["state"] == "Starting"
    assert run["status"]["reason"] == f"Starting 2 of 2 workers: Pulling image {IMAGE}"
    assert [w["reason"] for w in run["status"]["workers"]] == [f"Pulling image {IMAGE}"] * 2
    # A message is one line, of bounded length, however the machine sent it.
    _report(app, cred, {"worker": a["worker"], "attempt": a["attempt"], "state": "Starting",
                        "message": "Pulling\nimage   " + "x" * 2000}, machine=a["machine"])
    reason = _run(app, "gang")["status"]["workers"][0]["reason"]
    assert reason.startswith("Pulling image xxx") and "\n" not in reason and len(reason) == 500


def _body(run: str, gpus: int, priority: int = 0, time_limit: int | None = None) -> dict:
    tt = {"image": IMAGE, "command": "sleep", "args": ["600"],
          "requested_resources": {"gpu_requests": {"count": gpus}}}
    if time_limit:
        tt["time_limit_seconds"] = time_limit
    return {"metadata": {"name": run}, "spec": {"priority": priority, "task_template": tt}}


def _assignment(app, cred: str, run: str) -> dict | None:
    got = app.client.get("/api/v1/agent/assignments", params={"machine": "gpu-01"}, headers=_h(cred)).json()
    return next((a for a in got["assignments"] if a["run"] == run), None)


def _end_all(app, cred: str) -> None:
    """The machine reports every worker it was given as ended by its SIGTERM."""
    got = app.client.get("/api/v1/agent/assignments", params={"machine": "gpu-01"}, headers=_h(cred)).json()
    _report(app, {"gpu-01": cred}, *({"worker": a["worker"], "attempt": a["attempt"], "state": "Exited",
                                      "signal": 15} for a in got["assignments"]))


def test_the_machine_is_told_why_each_worker_stops(app):
    import time

    from astraeus.server import loop

    cred = _register(app, "gpu-01")
    org = f"/api/v1/o/{app.boot['org']}"
    adm = _h(app.boot["admin_token"])
    assert app.client.post(f"{org}/workspaces", json={"name": "audio", "clusters": {"main": {"max_priority": 50}}},
                           headers=adm).status_code == 201
    audio = _h(app.client.post(f"{org}/tokens", json={"kind": "user", "workspace": "audio", "role": "editor"},
                               headers=adm).json()["token"])
    assert app.client.patch(f"{org}/workspaces/vision", json={"clusters": {"main": {"max_priority": 50}}},
                            headers=adm).status_code == 200

    def preempted(victim: str, by: dict, by_api: str, by_h: dict) -> str:
        assert app.client.post(app.api + "/runs", json=_body(victim, 8, priority=-100), headers=app.h()).status_code \
            == 201
        wait_for(lambda: _assignment(app, cred, victim), timeout=20, what=f"{victim} placed")
        assert app.client.post(by_api + "/runs", json=by, headers=by_h).status_code == 201
        a = wait_for(lambda: (x := _assignment(app, cred, victim)) and x["desired"] == "Stopped" and x, timeout=30,
                     what=f"{victim} told to stop")
        assert a["registry_auth"] is None
        return a["stop_reason"]

    # Preempted by a run of its own workspace: named; by another workspace's: not.
    assert preempted("low-a", _body("urgent", 8, priority=10), app.api, app.h()) == \
        "Preempted by higher-priority work (urgent)"
    assert app.client.delete(app.api + "/runs/urgent", headers=app.h()).status_code == 200
    assert app.client.delete(app.api + "/runs/low-a", headers=app.h()).status_code == 200
    _end_all(app, cred)
    wait_for(lambda: not _assignment(app, cred, "urgent") and not _assignment(app, cred, "low-a"), timeout=30,
             what="the machine empty")
    reason = preempted("low-b", _body("their-eval", 8, priority=10), f"{org}/w/audio", audio)
    assert reason == "Preempted by higher-priority work (a job in another namespace)"
    assert "their-eval" not in reason and "audio" not in reason
    assert app.client.delete(f"{org}/w/audio/runs/their-eval", headers=audio).status_code == 200
    assert app.client.delete(app.api + "/runs/low-b", headers=app.h()).status_code == 200
    _end_all(app, cred)
    wait_for(lambda: not _assignment(app, cred, "their-eval") and not _assignment(app, cred, "low-b"), timeout=30,
             what="the machine empty")

    # Past its time limit.
    assert app.client.post(app.api + "/runs", json=_body("limited", 1, time_limit=60), headers=app.h()) \
        .status_code == 201
    wait_for(lambda: _assignment(app, cred, "limited"), timeout=20, what="limited placed")
    with app.cp.sessions() as s:
        loop.enforce_time_limits(s, time.time() + 3600)
        s.commit()
    a = _assignment(app, cred, "limited")
    assert a["desired"] == "Stopped" and a["stop_reason"] == "Stopping: time limit of 1m reached"
