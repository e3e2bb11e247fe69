"""The agent against the real control plane (uvicorn in a thread, SQLite): start, logs, stop, adoption."""

from __future__ import annotations

import time

import httpx

from astraeus.agent.agent import Agent

from .conftest import pid_alive, wait_for


def _run_body(name: str, tmp_path) -> dict:
    script = (
        "import os, signal, sys, time\n"
        "def on_term(s, f):\n"
        "    open(os.environ['OUT'] + '/ckpt', 'w').write(os.environ['SLURM_JOB_NAME'])\n"
        "    print('SIGTERM: saved', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('worker', os.environ['ASTRAEUS_WORKER_NAME'], 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", "command": "python", "args": ["/app/w.py"],
        "env": {"OUT": "/out"}, "restart_policy": "Never",
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 30, "gpu_requests": {"count": 1}},
        "datavolume_refs": [{"name": "out", "mount_path": "/out"}],
        "configs": [{"mounts": ["/app/w.py"], "value": script}]}}}


def _out_drive(c: httpx.Client, tmp_path):
    """The worker writes its checkpoint to a ReadWrite drive (it sees the host read-only); its host folder."""
    drive = {"metadata": {"name": "out"}, "spec": {"sources": [
        {"node": "gpu-01", "path": str(tmp_path / "data" / "out"), "mount_path": "/out", "mode": "ReadWrite"}],
        "permissions": {"create": True}}}
    assert c.post("/drives", json=drive).status_code == 201
    return tmp_path / "data" / "out"


def _agent(server, tmp_path, **kw) -> Agent:
    return Agent(server["url"], server["machine_token"], "gpu-01", gpus=2, cpu_cores=8, memory_bytes=64 << 30,
                 state_dir=str(tmp_path / "agent"), stop_grace=2, poll_wait=5, **kw)


def test_agent_runs_reports_ships_logs_and_stops(server, tmp_path):
    agent = _agent(server, tmp_path)
    agent.start()
    try:
        h = {"Authorization": f"Bearer {server['token']}"}
        with httpx.Client(base_url=server["api"], headers=h, timeout=10) as c:
            wait_for(lambda: c.get("/machines").json()["items"], timeout=20, what="the machine to join")
            out = _out_drive(c, tmp_path)
            r = c.post("/runs", json=_run_body("agent-e2e", tmp_path))
            assert r.status_code == 201, r.text
            w = wait_for(lambda: (x := c.get("/workers/agent-e2e-0").json()).get("state") == "Running" and x,
                      timeout=20, what="the worker to run")
            assert w["pid"] and pid_alive(w["pid"])
            assert w.get("environment")
            wait_for(lambda: "worker agent-e2e-0 gpus" in c.get("/workers/agent-e2e-0/logs").text, timeout=20,
                     what="logs")
            pid = w["pid"]
            t0 = time.time()
            assert c.delete("/runs/agent-e2e").status_code == 200
            # its text, not only the file: the worker creates it, then writes (once read between the two: '')
            wait_for(lambda: (out / "ckpt").exists() and (out / "ckpt").read_text(), timeout=20,
                     what="the SIGTERM checkpoint")
            assert time.time() - t0 < 5
            assert (out / "ckpt").read_text() == "agent-e2e"
            wait_for(lambda: not pid_alive(pid), timeout=20, what="the worker to end")
    finally:
        agent.request_exit()
        agent.shutdown()


def test_agent_restart_adopts_and_stop_workers_on_exit(server, tmp_path):
    a1 = _agent(server, tmp_path)
    a1.start()
    h = {"Authorization": f"Bearer {server['token']}"}
    with httpx.Client(base_url=server["api"], headers=h, timeout=10) as c:
        out = _out_drive(c, tmp_path)
        assert c.post("/runs", json=_run_body("adopt-me", tmp_path)).status_code == 201
        w = wait_for(lambda: (x := c.get("/workers/adopt-me-0").json()).get("state") == "Running" and x, timeout=20)
        pid = w["pid"]
        a1.shutdown()  # the agent exits; the worker does not
        time.sleep(0.5)
        assert pid_alive(pid)
        a2 = _agent(server, tmp_path, stop_workers_on_exit=True)
        a2.start()
        time.sleep(1.5)
        assert pid_alive(pid)  # adopted, not restarted
        assert [st.pid for st in a2.runtime.list() if not st.final] == [pid]
        assert c.get("/workers/adopt-me-0").json()["pid"] == pid
        a2.shutdown()  # --stop-workers-on-exit: nothing is left running
        assert not pid_alive(pid)
        assert (out / "ckpt").read_text() == "adopt-me"


def test_a_quick_workers_lines_come_with_its_exit_report(server, tmp_path, monkeypatch):
    """A worker that prints and ends at once: its lines reach the control plane with the report of its end, not in a
    log batch of their own (the log thread is not woken by each start and exit: its own pace, LOG_EVERY, is made
    long here so that only a wake could send one), and `logs` shows them all."""
    from astraeus.agent import logs

    monkeypatch.setattr(logs, "LOG_EVERY", 60.0)
    agent = _agent(server, tmp_path)
    posted: list[str] = []
    post = agent.control_plane.post

    def counting(client, path, body, omit_none=()):
        posted.append(path)
        return post(client, path, body, omit_none)

    agent.control_plane.post = counting
    agent.start()
    try:
        h = {"Authorization": f"Bearer {server['token']}"}
        with httpx.Client(base_url=server["api"], headers=h, timeout=10) as c:
            wait_for(lambda: c.get("/machines").json()["items"], timeout=20, what="the machine to join")
            body = {"metadata": {"name": "quick"}, "spec": {"task_template": {
                "image": "python:3.11", "command": "sh", "args": ["-c", "for i in 1 2 3; do echo line $i; done"],
                "restart_policy": "Never", "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 30}}}}
            assert c.post("/runs", json=body).status_code == 201
            wait_for(lambda: c.get("/runs/quick").json()["status"]["state"] == "Completed", timeout=20,
                     what="the run to complete")
            assert c.get("/workers/quick-0/logs").text.split() == ["line", "1", "line", "2", "line", "3"]
            assert "/logs" not in posted and "/report" in posted
    finally:
        agent.request_exit()
        agent.shutdown()
