"""The typed agent protocol (astraeus.protocol): what the control plane refuses, what it records, and an
assignment's way from the server's model, over HTTP, into the agent's."""

from __future__ import annotations

import time

import httpx
import pytest

from astraeus.agent.agent import Agent
from astraeus.protocol import Assignment, ConfigFile, Mount

from .conftest import wait_for


def _mt(app) -> dict:
    return {"Authorization": f"Bearer {app.boot['machine_token']}"}


def _machine(client, admin_token: str, name: str) -> dict:
    r = client.get("/api/v1/o/acme/clusters/main/machines", headers={"Authorization": f"Bearer {admin_token}"})
    assert r.status_code == 200, r.text
    return next(m for m in r.json()["items"] if m["name"] == name)


@pytest.mark.parametrize("path, body, field", [
    ("/register", {"name": "gpu-02", "gpus": 1, "gpu_count": 4}, "gpu_count"),
    ("/report", {"machine": "gpu-02", "workers": [], "heartbeat": True}, "heartbeat"),
    ("/report", {"machine": "gpu-02", "workers": [{"worker": "w-0", "attempt": 1, "state": "Exited",
                                                   "exitcode": 3}]}, "workers[0].exitcode"),
    ("/logs", {"machine": "gpu-02", "lines": [{"worker": "w-0", "seq": 1, "txt": "hi"}]}, "lines[0].txt"),
])
def test_unknown_field_is_a_422_naming_it(app, path, body, field):
    assert app.client.post("/api/v1/agent/register", json={"name": "gpu-02"}, headers=_mt(app)).status_code == 200
    r = app.client.post("/api/v1/agent" + path, json=body, headers=_mt(app))
    assert r.status_code == 422, r.text
    assert r.json()["message"] == f"{field}: unknown field: remove it or check its spelling"
    assert r.json()["errors"][0]["field"] == field


@pytest.mark.parametrize("path, body, field", [
    ("/register", {"gpus": 8}, "name"),
    ("/report", {"workers": []}, "machine"),
    ("/report", {"machine": "gpu-02", "workers": [{"worker": "w-0", "attempt": 1}]}, "workers[0].state"),
    ("/logs", {"machine": "gpu-02", "lines": [{"worker": "w-0", "text": "hi"}]}, "lines[0].seq"),
    ("/report", {"machine": "gpu-02", "workers": [], "lines": [{"worker": "w-0", "text": "hi"}]}, "lines[0].seq"),
])
def test_missing_required_field_is_a_422_naming_it(app, path, body, field):
    r = app.client.post("/api/v1/agent" + path, json=body, headers=_mt(app))
    assert r.status_code == 422, r.text
    assert r.json()["message"] == f"{field}: field required"


def test_unknown_worker_state_is_refused(app):
    r = app.client.post("/api/v1/agent/report", headers=_mt(app), json={
        "machine": "gpu-02", "workers": [{"worker": "w-0", "attempt": 1, "state": "Done"}]})
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("workers[0].state: ")
    for state in ("Starting", "Running", "Exited", "StartFailed"):
        assert state in r.json()["message"]


def test_zero_stop_grace_is_recorded_as_zero(app):
    r = app.client.post("/api/v1/agent/register", headers=_mt(app),
                        json={"name": "gpu-03", "gpus": 1, "stop_grace_seconds": 0})
    assert r.status_code == 200, r.text
    assert _machine(app.client, app.boot["admin_token"], "gpu-03")["stop_grace_seconds"] == 0
    # Not declared at all: the protocol's default, 30 s.
    assert app.client.post("/api/v1/agent/register", headers=_mt(app), json={"name": "gpu-04"}).status_code == 200
    assert _machine(app.client, app.boot["admin_token"], "gpu-04")["stop_grace_seconds"] == 30


def test_assignment_round_trip_through_the_agent(server, tmp_path):
    """The server's Assignment, sent over HTTP, is the agent's Assignment field for field; the agent declares
    its 0 s stop grace and reports the worker back with the same models."""
    from sqlalchemy import select

    from astraeus.server import agents
    from astraeus.server.db import Machine

    h = {"Authorization": f"Bearer {server['token']}"}
    (tmp_path / "data").mkdir()
    drive = {"metadata": {"name": "ckpt"}, "spec": {"sources": [
        {"node": "gpu-01", "path": str(tmp_path / "data" / "ckpt"), "mount_path": "/ckpt", "mode": "ReadWrite"}],
        "permissions": {"create": True}}}
    assert httpx.post(server["api"] + "/drives", json=drive, headers=h).status_code == 201
    run = {"metadata": {"name": "rt"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "python", "args": ["-c", "print('hello', flush=True)"],
        "env": {"MODE": "test"}, "restart_policy": "Never", "time_limit_seconds": 600,
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 30, "gpu_requests": {"count": 1}},
        "datavolume_refs": [{"name": "ckpt", "mount_path": "/ckpt"}],
        "configs": [{"mounts": ["/app/conf.txt"], "value": "lr=0.1"}]}}}
    r = httpx.post(server["api"] + "/runs", json=run, headers=h)
    assert r.status_code == 201, r.text

    agent = Agent(server["url"], server["machine_token"], "gpu-01", gpus=2, cpu_cores=8, memory_bytes=64 << 30,
                  state_dir=str(tmp_path / "agent"), stop_grace=0, poll_wait=2, stop_workers_on_exit=True)
    agent.start()
    try:
        got = wait_for(lambda: next((a for a in (agent.assignments or {}).values() if a.name == "rt-0"), None),
                    timeout=20, what="the assignment at the agent")
        with server["cp"].sessions() as s:
            m = s.scalar(select(Machine).where(Machine.name == "gpu-01"))
            assert m.stop_grace_seconds == 0  # declared by the agent, recorded as is
            sent = next(a for a in agents.assignments(s, m) if a.name == "rt-0")
        assert isinstance(got, Assignment) and got == sent
        assert got.mounts == [Mount(drive="ckpt", host_path=str(tmp_path / "data" / "ckpt"), mount_path="/ckpt",
                                    read_only=False, create=True, granted_root=str(tmp_path / "data"))]
        assert got.configs == [ConfigFile(mount_path="/app/conf.txt", value="lr=0.1")]
        assert got.env["MODE"] == "test" and got.env["ASTRAEUS_WORKER_NAME"] == "rt-0"
        uid = httpx.get(server["api"] + "/runs/rt", headers=h).json()["metadata"]["uid"]
        assert got.worker == f"{server['ns']}.rt-0.{uid}"  # its identity: the workspace's ns, its name, its run
        assert got.time_limit_seconds == 600 and got.desired == "Running"
        # Back the other way: the agent's report and log lines are accepted and shown.
        w = wait_for(lambda: (x := httpx.get(server["api"] + "/workers/rt-0", headers=h).json())["state"]
                  in ("Succeeded", "Failed") and x, timeout=20, what="the worker's end")
        assert w["state"] == "Succeeded" and w["environment"] and w["started_at"], w
        logs = wait_for(lambda: httpx.get(server["api"] + "/workers/rt-0/logs", headers=h).text, timeout=20,
                        what="logs")
        assert logs == "hello\n"
    finally:
        agent.shutdown()


def test_an_ended_workers_last_lines_come_with_its_end(server, tmp_path):
    """An attempt's end and its last lines reach the control plane in one request (its report), not a POST /logs
    and then the report: as soon as the worker shows Succeeded, every line it printed is there. (Lines it printed
    while it ran may go ahead in a POST /logs; none goes once it has ended.)"""
    h = {"Authorization": f"Bearer {server['token']}"}
    run = {"metadata": {"name": "last"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sh", "args": ["-c", "echo one; echo two; echo three"],
        "restart_policy": "Never", "requested_resources": {"cpu_cores": 1, "gpu_requests": {"count": 1}}}}}
    r = httpx.post(server["api"] + "/runs", json=run, headers=h)
    assert r.status_code == 201, r.text
    posted: list[tuple[str, int, bool]] = []  # path, lines sent, whether the worker had ended then

    class Seen(Agent):
        def _post(self, client, path, body, **kw):
            ended = any(st.final for st in self.runtime.list())
            posted.append((path, len(getattr(body, "lines", None) or []), ended))
            return super()._post(client, path, body, **kw)

    agent = Seen(server["url"], server["machine_token"], "gpu-01", gpus=1, cpu_cores=8, memory_bytes=64 << 30,
                 state_dir=str(tmp_path / "agent"), stop_grace=0, poll_wait=2, stop_workers_on_exit=True)
    agent.start()
    try:
        w = wait_for(lambda: (x := httpx.get(server["api"] + "/workers/last-0", headers=h).json())["state"]
                     in ("Succeeded", "Failed") and x, timeout=20, what="the worker's end")
        logs = httpx.get(server["api"] + "/workers/last-0/logs", headers=h).text
        assert w["state"] == "Succeeded" and logs == "one\ntwo\nthree\n"
    finally:
        agent.shutdown()
    shipped = sum(n for path, n, _ in posted if path == "/logs")  # read while it ran (rarely: it prints at its end)
    assert ("/report", 3 - shipped, True) in posted, posted


def test_the_log_loop_leaves_an_ended_attempts_last_lines_to_its_report(tmp_path):
    """What the agent ships on its own (POST /logs) leaves out an attempt that ended and is not reported yet: its
    lines go with the report of its end. Once reported, nothing is held back."""
    from astraeus.agent.runtime.process import ProcessRuntime

    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    agent = Agent("http://127.0.0.1:9", "token", "gpu-01", runtime=rt, gpus=1, cpu_cores=1, memory_bytes=1 << 30,
                  state_dir=str(tmp_path / "state"), stop_grace=1)
    try:
        a = Assignment(worker="ws-0123456789ab.done-0", name="done-0", attempt=1, run="done",
                       workspace="ws-0123456789ab", workspace_number=5, image="python:3.11", command="sh",
                       args=["-c", "echo one; echo two"], env={"ASTRAEUS_JOB_NAME": "ws-0123456789ab.done"})
        rt.start(a)
        wait_for(lambda: rt.status(a.worker, 1).final, what="the worker's end")
        assert agent._collect_logs(None)[0] == []
        assert [ln.text for ln in agent._collect_logs({a.key})[0]] == ["one", "two"]
        agent.reported_final.add(a.key)
        assert [ln.text for ln in agent._collect_logs(None)[0]] == ["one", "two"]
    finally:
        rt.close()


def test_an_agent_that_shuts_down_stops_its_shim_launcher_and_its_workers_run_on(tmp_path):
    """The shim launcher is the agent's own idle interpreter: it ends with the agent's shutdown (not only when the
    agent's process exits), while a worker it started runs on (the agent, started again, adopts it)."""
    from astraeus.agent.runtime.process import ProcessRuntime

    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    agent = Agent("http://127.0.0.1:9", "token", "gpu-01", runtime=rt, gpus=1, cpu_cores=1, memory_bytes=1 << 30,
                  state_dir=str(tmp_path / "state"), stop_grace=1)
    a = Assignment(worker="ws-0123456789ab.long-0", name="long-0", attempt=1, run="long",
                   workspace="ws-0123456789ab", workspace_number=5, image="python:3.11", command="sleep",
                   args=["60"], env={"ASTRAEUS_JOB_NAME": "ws-0123456789ab.long"})
    try:
        rt.start(a)
        wait_for(lambda: rt.status(a.worker, 1).state == "Running", what="the worker running")
        launcher = rt.launcher.proc
        assert launcher is not None and launcher.poll() is None
        agent.shutdown()
        assert launcher.wait(timeout=5) is not None  # the launcher has exited
        assert rt.status(a.worker, 1).state == "Running"
    finally:
        rt.stop(a.worker, 1, grace=0)
        rt.close()


def test_an_exit_report_wakes_no_long_poll_of_its_own_machine(server, tmp_path):
    """A worker's end, reported by its agent, does not answer that machine's long-poll (the answer would only
    drop the worker the agent knows has ended): the next placement there does, else the next poll, after which
    the agent forgets the attempt."""
    from sqlalchemy import select

    from astraeus.server.db import Machine

    h = {"Authorization": f"Bearer {server['token']}"}
    run = {"metadata": {"name": "quiet"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sh", "args": ["-c", "sleep 1"], "restart_policy": "Never",
        "requested_resources": {"cpu_cores": 1, "gpu_requests": {"count": 1}}}}}
    assert httpx.post(server["api"] + "/runs", json=run, headers=h).status_code == 201
    agent = Agent(server["url"], server["machine_token"], "gpu-01", gpus=1, cpu_cores=8, memory_bytes=64 << 30,
                  state_dir=str(tmp_path / "agent"), stop_grace=0, poll_wait=3, stop_workers_on_exit=True)
    agent.start()
    try:
        wait_for(lambda: httpx.get(server["api"] + "/workers/quiet-0", headers=h).json()["state"] == "Running",
                 timeout=20, what="the worker running")
        with server["cp"].sessions() as s:
            mid = s.scalar(select(Machine.id).where(Machine.name == "gpu-01"))
        seen = server["cp"].notifier.machine_version(mid)
        wait_for(lambda: httpx.get(server["api"] + "/workers/quiet-0", headers=h).json()["state"] == "Succeeded",
                 timeout=20, what="the worker's end")
        time.sleep(0.3)
        assert server["cp"].notifier.machine_version(mid) == seen
        key = next(iter(agent.assignments or {}))
        # the long-poll's own timeout answers it: the ended attempt is no longer assigned, and is forgotten
        wait_for(lambda: agent.runtime.status(*key) is None, timeout=10, what="the ended attempt forgotten")
    finally:
        agent.shutdown()
