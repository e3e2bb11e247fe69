"""Worker identity (issue 13, item 3): two workspaces' runs of one name on one machine are two workers to the
agent, its folders, its reports, its logs and its stops. A real `astraeus up` cluster with one machine."""

from __future__ import annotations

import os
import stat
import time

import httpx
import pytest

from astraeus.agent.agent import Agent
from tests.conftest import wait_for


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _train(line: str) -> dict:
    return {"metadata": {"name": "train"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "python",
        "args": ["-c", f"import time; print({line!r}, flush=True); time.sleep(600)"],
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 28}}}}


@pytest.mark.faults
def test_same_named_runs_of_two_workspaces_each_run_their_own_command(cluster):
    with cluster.admin() as adm:
        r = adm.post("/workspaces", json={"name": "nlp", "clusters": {"main": {}}})
        assert r.status_code == 201, r.text
        nlp_token = adm.post("/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"}).json()["token"]
        ns = {w["name"]: w["id"] for w in adm.get("/workspaces").json()["items"]}
    vision = cluster.client()
    nlp = httpx.Client(base_url=f"{cluster.server}/api/v1/o/acme/w/nlp",
                       headers={"Authorization": f"Bearer {nlp_token}"}, timeout=30)
    with vision, nlp:
        assert vision.post("/runs", json=_train("vision's train")).status_code == 201
        assert nlp.post("/runs", json=_train("nlp's train")).status_code == 201

        def running(c):
            w = c.get("/workers/train-0").json()
            return w["state"] == "Running" and w["pid"] and w

        wv = wait_for(lambda: running(vision), timeout=60, what="vision's train running")
        wn = wait_for(lambda: running(nlp), timeout=60, what="nlp's train running")
        assert wv["machine"] == wn["machine"] == "gpu-01"
        assert wv["pid"] != wn["pid"] and _pid_alive(wv["pid"]) and _pid_alive(wn["pid"])
        # each shows its own line, and only it
        wait_for(lambda: vision.get("/workers/train-0/logs").text == "vision's train\n", timeout=30,
                 what="vision's log line")
        wait_for(lambda: nlp.get("/workers/train-0/logs").text == "nlp's train\n", timeout=30,
                 what="nlp's log line")
        # the agent keeps them apart: one folder each, named by identity (ns, name, run uid)
        folders = sorted(os.listdir(cluster.home / "agents" / "gpu-01" / "workers"))
        uid = {"vision": vision.get("/runs/train").json()["metadata"]["uid"],
               "nlp": nlp.get("/runs/train").json()["metadata"]["uid"]}
        assert folders == sorted([f"{ns['vision']}.train-0.{uid['vision']}.{wv['attempt']}",
                                  f"{ns['nlp']}.train-0.{uid['nlp']}.{wn['attempt']}"])

        # deleting nlp's run stops nlp's process only
        assert nlp.delete("/runs/train").status_code == 200
        wait_for(lambda: not _pid_alive(wn["pid"]), timeout=30, what="nlp's process gone")
        wait_for(lambda: nlp.get("/runs/train").status_code == 404, timeout=30, what="nlp's run deleted")
        for _ in range(10):  # and stays so: vision's run is untouched
            w = vision.get("/workers/train-0").json()
            assert w["state"] == "Running" and w["pid"] == wv["pid"] and w["restarts"] == 0, w
            assert _pid_alive(wv["pid"])
            time.sleep(0.2)
        assert vision.get("/runs/train").json()["status"]["state"] == "Running"
        assert vision.get("/workers/train-0/logs").text == "vision's train\n"


def _machine_tokens(server) -> list[dict]:
    r = httpx.get(server["url"] + "/api/v1/o/acme/tokens", headers={"Authorization": f"Bearer {server['admin_token']}"})
    return [t for t in r.json()["items"] if t["kind"] == "machine"]


def test_agent_keeps_its_credential_and_registers_again_with_it(server, tmp_path):
    """The agent exchanges the join token once, keeps the credential (0600) in its state dir, comes back with it
    after a restart, stays out once it is revoked, and joins again when its file is deleted."""
    def agent() -> Agent:
        return Agent(server["url"], server["machine_token"], "gpu-01", gpus=1, cpu_cores=4, memory_bytes=8 << 30,
                     state_dir=str(tmp_path / "agent"), stop_grace=1, poll_wait=1)

    path = tmp_path / "agent" / "credential"
    a1 = agent()
    a1.start()
    try:
        wait_for(lambda: a1.registered.is_set(), timeout=20, what="registered")
    finally:
        a1.shutdown()
    cred = path.read_text().strip()
    assert cred.startswith("ast_m_") and cred != server["machine_token"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (own,) = [t for t in _machine_tokens(server) if t["machine"] == "gpu-01"]

    a2 = agent()  # a restart: the same credential, no new one
    a2.start()
    try:
        wait_for(lambda: a2.registered.is_set(), timeout=20, what="registered again")
        assert path.read_text().strip() == cred
        assert [t["id"] for t in _machine_tokens(server) if t["machine"] == "gpu-01"] == [own["id"]]
        # revoked: refused at the next call; the agent stays out rather than joining again
        r = httpx.delete(f"{server['url']}/api/v1/o/acme/tokens/{own['id']}",
                         headers={"Authorization": f"Bearer {server['admin_token']}"})
        assert r.status_code == 200
        wait_for(lambda: not a2.registered.is_set(), timeout=20, what="the agent out")
        time.sleep(2)
        assert not a2.registered.is_set() and path.read_text().strip() == cred
        # the operator deletes the revoked credential: the agent joins with the join token again
        path.unlink()
        wait_for(lambda: a2.registered.is_set(), timeout=30, what="joined again")
        assert path.read_text().strip() not in ("", cred)
    finally:
        a2.shutdown()


def test_a_worker_an_older_agent_started_is_adopted_under_its_identity(tmp_path):
    """An older agent named a worker's folder and marker by its name alone (`train-0.1`); after the upgrade the
    runtime finds it under its older identity (the ns from its ASTRAEUS_JOB_NAME), running, with its logs; the agent
    adopts it as the identity the control plane names it by now (with its run's uid), and stops it by that
    identity: an upgrade mid-run restarts nothing."""
    from astraeus.agent.runtime.process import ProcessRuntime

    state = str(tmp_path / "state")
    old = ProcessRuntime(state, stop_grace=1)
    a = {"worker": "train-0", "attempt": 1, "run": "train", "image": "python:3.11", "command": "python",
         "args": ["-c", "import time; print('old', flush=True); time.sleep(600)"],
         "env": {"ASTRAEUS_JOB_NAME": "ws-0123456789ab.train"}}
    st = old.start(a)
    assert os.path.isdir(os.path.join(state, "workers", "train-0.1"))
    try:
        new = ProcessRuntime(state, stop_grace=1)  # the upgraded agent
        adopted = {s.key: s for s in new.adopt()}
        ident = ("ws-0123456789ab.train-0", 1)
        assert set(adopted) == {ident} and adopted[ident].state == "Running" and adopted[ident].pid == st.pid
        wait_for(lambda: [ln.text for ln in new.logs(*ident)] == ["old"], timeout=10, what="its log line")
        assert new.marker(*ident).endswith(":train-0.1")  # the marker its processes carry
        # the control plane now names it with its run's uid: adopted under that identity, for good
        uid = "0123456789abcdef0123456789abcdef"
        assert new.adopt_as(*ident, f"ws-0123456789ab.train-0.{uid}")
        ident = (f"ws-0123456789ab.train-0.{uid}", 1)
        assert [s.key for s in ProcessRuntime(state, stop_grace=1).adopt()] == [ident]
        assert {s.key for s in new.list()} == {ident} and new.status(*ident).pid == st.pid
        assert new.marker(*ident).endswith(":train-0.1")
        ended = new.stop(*ident, grace=1)
        assert ended.final and ended.worker == ident[0] and not _pid_alive(st.pid)
    finally:
        old.stop("train-0", 1, grace=0)
