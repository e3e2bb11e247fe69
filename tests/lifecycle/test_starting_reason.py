"""While a worker starts, its reason is what its machine says it is doing (issue 14): an agent report with state
Starting and a message ("Pulling image 127.0.0.1:5000/x:1") makes that the worker's reason, and the run's reason
shows it; then Running, or a StartFailed's reason. Through the agent protocol (POST /report) of an in-process
control plane, read back with GET run as a user sees it."""

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
