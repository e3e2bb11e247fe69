"""Issue 47, machines: drain, cordon and resume with their reasons; a GPU fault quarantines its GPU and moves its worker
elsewhere with no restart spent; a failing site health check drains its machine. In-process control plane (the
test registers the machine and reports for it, as its agent would), SQLite and PostgreSQL; the pure rule on its own.
Live agents on both runtimes: tests/faults/test_machine_health.py."""

from __future__ import annotations

import pytest

from astraeus import protocol as P
from astraeus.server.health import decide_report
from tests.conftest import wait_for

ORG = "/api/v1/o/acme"
REG = {"gpus": 4, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _admin(app) -> dict:
    return _h(app.boot["admin_token"])


def _register(app, name: str = "gpu-07") -> str:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json={"name": name, **REG})
    assert r.status_code == 200, r.text
    return r.json()["credential"]


def _report(app, cred: str, machine: str = "gpu-07", workers: list | None = None, **health) -> None:
    r = app.client.post("/api/v1/agent/report", headers=_h(cred),
                        json={"machine": machine, "workers": workers or [], **health})
    assert r.status_code == 200, r.text


def _assignment(app, cred: str, name: str, machine: str = "gpu-07") -> dict | None:
    r = app.client.get("/api/v1/agent/assignments", params={"machine": machine}, headers=_h(cred))
    assert r.status_code == 200, r.text
    return next((a for a in r.json()["assignments"] if a["name"] == f"{name}-0"), None)


def _run(app, name: str, gpus: int = 1) -> None:
    tt = {"image": "python:3.11", "command": "sleep", "args": ["600"],
          "requested_resources": {"gpu_requests": {"count": gpus}}}
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": name}, "spec": {"task_template": tt}},
                        headers=app.h())
    assert r.status_code == 201, r.text


def _worker(app, run: str) -> dict:
    return app.client.get(f"{app.api}/workers/{run}-0", headers=app.h()).json()


def _machine(app, name: str = "gpu-07") -> dict:
    return next(m for m in app.client.get(app.api + "/machines", headers=app.h()).json()["items"]
                if m["name"] == name)


def _placed(app, cred: str, name: str) -> dict:
    """Wait until the worker is placed, report it Running; its assignment."""
    a = wait_for(lambda: _assignment(app, cred, name), timeout=30, what=f"{name} placed")
    _report(app, cred, workers=[{"worker": a["worker"], "attempt": a["attempt"], "state": "Running", "pid": 4242}])
    wait_for(lambda: _worker(app, name)["state"] == "Running", timeout=30, what=f"{name} running")
    return a


def _exited(app, cred: str, a: dict) -> None:
    _report(app, cred, workers=[{"worker": a["worker"], "attempt": a["attempt"], "state": "Exited", "signal": 15}])


# ------------------------------------------------------------------------------------------- pure rule


def test_the_report_rule_quarantines_new_fatal_faults_and_drains_on_a_failed_check():
    xid = P.GpuFault(index=3, what="XID 79", xid=79)
    d = decide_report(8, None, None, None, None, [xid, P.GpuFault(index=9, what="XID 79")], None)
    assert [f.index for f in d.failed] == [3]  # GPU 9 is not one of its 8
    assert not decide_report(8, {"3": {"what": "XID 79"}}, None, None, None, [xid], None).failed  # known already
    slow = decide_report(8, None, None, None, None, [P.GpuFault(index=1, what="HW thermal slowdown", fatal=False)],
                         None)
    assert not slow.failed and slow.warnings == {"1": {"what": "HW thermal slowdown", "xid": None, "fatal": False}}
    bad = P.HealthCheck(ok=False, output="\n  ib0 link down  \nmore")
    assert decide_report(8, None, None, None, None, None, bad).drain == "ib0 link down"
    assert decide_report(8, None, "drain", "admin", "x", None, bad).drain is None  # an admin's drain stays
    ok = P.HealthCheck(ok=True)
    assert decide_report(8, None, "drain", "health-check", "ib0 link down", None, ok).resume
    assert not decide_report(8, None, "drain", "admin", "cables", None, ok).resume  # never an admin's


# ------------------------------------------------------------------------------------------- live API


def _metric(text: str, series: str) -> float:
    """The value of one series in Prometheus' text format (0 when it is not there yet)."""
    return next((float(line[len(series):]) for line in text.splitlines() if line.startswith(series)), 0.0)


def test_an_injected_xid_moves_the_worker_to_another_gpu_with_no_restart_spent(app):
    cred = _register(app)
    _run(app, "train")
    a = _placed(app, cred, "train")
    gpu = _worker(app, "train")["gpu_indices"][0]
    series = f'astraeus_gpu_faults_total{{gpu="{gpu}",machine="gpu-07",xid="79"}} '
    faults_before = _metric(app.client.get("/metrics").text, series)  # the counter is the process's: other tests add

    r = app.client.post(f"{ORG}/machines/gpu-07/gpus/{gpu}/fault", json={"xid": 79}, headers=_admin(app))
    assert r.status_code == 200, r.text
    assert r.json()["quarantined_gpus"] == [gpu]
    said = f"GPU {gpu} of gpu-07 failed (XID 79): queued again elsewhere"
    w = _worker(app, "train")
    assert (w["state"], w["reason"]) == ("Stopping", said)
    assert _assignment(app, cred, "train")["desired"] == "Stopped"
    _exited(app, cred, a)
    b = _placed(app, cred, "train")
    w = _worker(app, "train")
    assert w["restarts"] == 0 and gpu not in w["gpu_indices"] and b["attempt"] > a["attempt"]
    history = app.client.get(f"{app.api}/runs/train", headers=app.h()).text
    assert said in history

    m = _machine(app)
    assert m["quarantined_gpus"] == [gpu] and m["gpus_free"] == REG["gpus"] - 2
    assert f"GPU {gpu} failed (XID 79): quarantined" in m["reason"] and m["schedulable"] is True
    events = app.client.get(app.api + "/events", headers=app.h()).json()["items"]
    assert any(e["kind"] == "GpuFailed" and "XID 79" in e["message"] for e in events), events
    metrics = app.client.get("/metrics").text
    assert _metric(metrics, series) == faults_before + 1
    assert 'astraeus_gpus_quarantined{machine="gpu-07"} 1.0' in metrics

    # nothing new lands on it: three more 1-GPU runs fill the other GPUs, a fourth waits
    for n in ("a", "b", "c"):
        _run(app, n)
    for n in ("a", "b"):
        wait_for(lambda n=n: _assignment(app, cred, n), timeout=30, what=f"{n} placed")
    wait_for(lambda: "gpu-07" in str(_worker(app, "c").get("why_not")), timeout=30, what="c waits")
    assert all(gpu not in _worker(app, n)["gpu_indices"] for n in ("a", "b"))

    r = app.client.delete(f"{ORG}/machines/gpu-07/gpus/{gpu}/fault", headers=_admin(app))
    assert r.status_code == 200 and r.json()["quarantined_gpus"] == [], r.text
    wait_for(lambda: _worker(app, "c")["gpu_indices"] == [gpu], timeout=30, what="c on the cleared GPU")
    events = app.client.get(app.api + "/events", headers=app.h()).json()["items"]
    assert any(e["kind"] == "GpuCleared" for e in events)


def test_drain_stops_what_runs_there_and_cordon_takes_no_new_work_until_resumed(app):
    cred = _register(app)
    _run(app, "train")
    a = _placed(app, cred, "train")

    r = app.client.post(f"{ORG}/machines/gpu-07/cordon", json={"reason": "firmware update"}, headers=_admin(app))
    assert r.status_code == 200, r.text
    m = _machine(app)
    assert (m["cordon"], m["reason"], m["schedulable"]) == ("cordon", "cordoned by admin: firmware update", False)
    assert _worker(app, "train")["state"] == "Running"  # a cordon leaves running work alone
    _run(app, "late")
    wait_for(lambda: "cordoned by admin: firmware update" in str(_worker(app, "late").get("why_not")), timeout=30,
             what="the why-not line naming the cordon")

    r = app.client.post(f"{ORG}/machines/gpu-07/drain", json={"reason": "new cables"}, headers=_admin(app))
    assert r.status_code == 200, r.text
    said = "Machine gpu-07 drained by admin: new cables: queued again"
    assert (_worker(app, "train")["state"], _worker(app, "train")["reason"]) == ("Stopping", said)
    _exited(app, cred, a)
    w = wait_for(lambda: (w := _worker(app, "train"))["state"] == "Pending" and w, timeout=30, what="queued again")
    assert w["reason"] == said and w["restarts"] == 0
    assert _machine(app)["reason"] == "drained by admin: new cables"
    page = app.client.get("/o/acme/w/vision/machines", headers=app.h())  # the console's machines page
    assert page.status_code == 200 and 'machine-cordon">drained<' in page.text
    assert "drained by admin: new cables" in page.text
    kinds = [e["kind"] for e in app.client.get(app.api + "/events", headers=app.h()).json()["items"]]
    assert "MachineCordoned" in kinds and "MachineDrained" in kinds

    r = app.client.post(f"{ORG}/machines/gpu-07/resume", headers=_admin(app))
    assert r.status_code == 200 and r.json()["cordon"] is None and r.json()["reason"] is None, r.text
    wait_for(lambda: _assignment(app, cred, "train"), timeout=30, what="placed again after resume")


def test_a_failing_health_check_drains_and_passing_again_resumes_its_own_drain_only(app):
    cred = _register(app)
    _report(app, cred, health_check={"ok": False, "output": "ib0: link down\nsecond line"})
    m = _machine(app)
    assert (m["cordon"], m["cordon_by"], m["reason"]) == ("drain", "health-check", "drained by health-check: ib0: "
                                                                                  "link down")
    _report(app, cred, health_check={"ok": True, "output": ""})
    assert _machine(app)["cordon"] is None
    assert app.client.post(f"{ORG}/machines/gpu-07/drain", json={"reason": "RMA"},
                           headers=_admin(app)).status_code == 200
    _report(app, cred, health_check={"ok": True, "output": ""})
    assert (_machine(app)["cordon"], _machine(app)["reason"]) == ("drain", "drained by admin: RMA")


def test_an_agent_reported_fault_quarantines_its_gpu(app):
    cred = _register(app)
    _report(app, cred, gpu_faults=[{"index": 2, "what": "uncorrectable ECC errors (3)"},
                                   {"index": 1, "what": "HW thermal slowdown", "fatal": False}])
    m = _machine(app)
    assert m["quarantined_gpus"] == [2] and "GPU 2 failed (uncorrectable ECC errors (3))" in m["reason"]
    assert {f["index"]: f["fatal"] for f in m["gpu_faults"]} == {1: False, 2: True}


@pytest.mark.parametrize(("method", "path", "body", "status", "says"), [
    ("post", "machines/gpu-99/drain", {"reason": "x"}, 404, "machine gpu-99 not found"),
    ("post", "machines/gpu-07/drain", {}, 422, "a reason is needed"),
    ("post", "machines/gpu-07/cordon", {"reason": "   "}, 422, "a reason is needed"),
    ("post", "machines/gpu-07/drain", {"reason": "x" * 201}, 422, "reason"),
    ("post", "machines/gpu-07/reboot", {"reason": "x"}, 422, "action"),
    ("post", "machines/gpu-07/resume", {}, 409, "neither cordoned nor drained"),
    ("post", "machines/gpu-07/gpus/4/fault", {"xid": 79}, 404, "has no GPU 4: it has GPUs 0-3"),
    ("post", "machines/gpu-07/gpus/-1/fault", {"xid": 79}, 422, "index"),
    ("post", "machines/gpu-07/gpus/0/fault", {}, 422, "xid"),
    ("post", "machines/gpu-07/gpus/0/fault", {"xid": "seventy-nine"}, 422, "xid"),
    ("delete", "machines/gpu-07/gpus/0/fault", None, 409, "no fault to clear"),
])
def test_bad_input_is_a_clear_4xx_and_changes_nothing(app, method, path, body, status, says):
    _register(app)
    kw = {"json": body} if body is not None else {}
    r = app.client.request(method.upper(), f"{ORG}/{path}", headers=_admin(app), **kw)
    assert r.status_code == status, r.text
    assert says in r.text, r.text
    m = _machine(app)
    assert m["cordon"] is None and m["quarantined_gpus"] == []


def test_only_an_organisation_admin_drains_or_injects(app):
    _register(app)
    for path, body in (("machines/gpu-07/drain", {"reason": "x"}), ("machines/gpu-07/gpus/0/fault", {"xid": 79})):
        r = app.client.post(f"{ORG}/{path}", json=body, headers=app.h())
        assert r.status_code == 403 and "organisation admin" in r.text, r.text
    assert _machine(app)["cordon"] is None and _machine(app)["quarantined_gpus"] == []
