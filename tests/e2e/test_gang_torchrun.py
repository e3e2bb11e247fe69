"""A 2-machine gang that runs `torchrun allreduce.py` with no flags: two machines with their own addresses
(`astraeus up --machines 2 --netns`), the rendezvous environment each worker gets, and an all_reduce (gloo, CPU)
across the two machines, each worker in a network namespace of its own (its own address is its MASTER_ADDR)."""

import re
from pathlib import Path

import pytest

from tests.conftest import start_cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gang"
END_OF_ENV = "--- end of the environment"
SHELLS_OWN = {"PWD", "OLDPWD", "SHLVL", "_"}  # bash sets these itself


def documented_names() -> set[str]:
    """The variables docs/api.md lists under "What a worker finds in its environment"."""
    doc = (ROOT / "docs" / "api.md").read_text()
    section = doc.split("#### What a worker finds in its environment", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"`([A-Z][A-Z0-9_]*)`", section))


def netns_unavailable() -> str | None:
    from astraeus.fleet import netns

    return netns.unavailable()


@pytest.fixture
def fleet(tmp_path):
    """Two machines, gpu-01 and gpu-02, with 2 simulated GPUs each, each in its own network namespace."""
    why = netns_unavailable()
    if why:
        pytest.skip(f"--netns: {why}")
    c = start_cluster(tmp_path / "home", gpus=2, machines=2, extra_args=["--netns"])
    yield c
    c.stop()


def test_torchrun_with_no_flags_all_reduces_across_two_machines(fleet):
    with fleet.client() as c:
        machines = fleet.wait_for(lambda: (m := c.get("/machines").json()["items"]) and len(m) == 2
                                  and all(x["state"] == "Ready" for x in m) and m, 60, what="two Ready machines")
    addr = {m["name"]: m["address"] for m in machines}
    assert sorted(addr) == ["gpu-01", "gpu-02"]
    assert all(addr.values()) and addr["gpu-01"] != addr["gpu-02"], addr

    # Each worker asks for both GPUs of a machine (4 GPUs, 2 per machine): the two must go to different machines.
    # The command prints its whole environment, then execs torchrun with no flags.
    spec = {
        "metadata": {"name": "allreduce"},
        "spec": {
            "start": "Gang",
            "task_template": {
                "image": "python:3.11",
                "command": "bash",
                "args": ["-c", f"env | sort; echo '{END_OF_ENV}'; exec torchrun /app/allreduce.py"],
                "env": {"GREETING": "hello"},
                "restart_policy": "Never",
                "time_limit_seconds": 300,
                "requested_resources": {"gpu_requests": {"count": 4, "min_per_machine": 2}, "cpu_cores": 2},
                "configs": [{"mounts": ["/app/allreduce.py"], "value": (EXAMPLE / "allreduce.py").read_text()}],
            },
        },
    }
    with fleet.client() as c:
        r = c.post("/runs", json=spec)
        assert r.status_code in (200, 201), r.text
    run = fleet.wait_for(lambda: (x := fleet.run("allreduce"))["status"]["state"] in ("Completed", "Failed") and x,
                         120, interval=0.5, what="the gang to end")
    logs = {i: fleet.logs(f"allreduce-{i}") for i in (0, 1)}
    assert run["status"]["state"] == "Completed", (run["status"], logs)
    assert run["status"]["reason"] == "2 of 2 workers succeeded"

    workers = [fleet.worker(f"allreduce-{i}") for i in (0, 1)]
    assert {w["machine"] for w in workers} == {"gpu-01", "gpu-02"}
    assert all(w["state"] == "Succeeded" and w["exit_code"] == 0 and w["restarts"] == 0 for w in workers), workers

    envs = []
    own = {}  # each worker's own address (a network of its own: astraeus.agent.network)
    for i in (0, 1):
        own[i] = dict(line.split("=", 1) for line in logs[i].split(END_OF_ENV)[0].splitlines())["ASTRAEUS_WORKER_ADDR"]
    assert own[0] != own[1] and not set(own.values()) & set(addr.values()), (own, addr)
    for i in (0, 1):
        env = dict(line.split("=", 1) for line in logs[i].split(END_OF_ENV)[0].splitlines())
        envs.append(env)
        assert env["GREETING"] == "hello"  # the run's own
        # docs/api.md lists every other variable the worker starts with
        assert set(env) - {"GREETING"} - SHELLS_OWN <= documented_names(), set(env) - documented_names()
        rank = i  # rank = the worker's index
        assert env["ASTRAEUS_NODE_RANK"] == env["PET_NODE_RANK"] == env["NODE_RANK"] == env["SLURM_NODEID"] == str(rank)
        assert env["ASTRAEUS_NUM_NODES"] == env["PET_NNODES"] == env["SLURM_JOB_NUM_NODES"] == env["SLURM_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == env["SLURM_GPUS_ON_NODE"] == env["ASTRAEUS_GPU_COUNT"] == "2"
        assert env["WORLD_SIZE"] == "4"  # 2 machines x 2 GPUs
        # rank 0's own address, not its machine's (which GET /machines shows)
        assert env["ASTRAEUS_MASTER_ADDR"] == env["PET_MASTER_ADDR"] == env["MASTER_ADDR"] == own[0]
        assert env["ASTRAEUS_MASTER_PORT"] == env["PET_MASTER_PORT"] == env["MASTER_PORT"]
        assert 1 <= int(env["MASTER_PORT"]) <= 65535
        assert env["ASTRAEUS_NODE_ADDRS"] == f"{own[0]},{own[1]}"  # in rank order
        assert env["SLURM_JOB_NODELIST"] == ",".join(x["machine"] for x in workers)
        # the agent points gloo and NCCL at the worker's own interface (eth0 in its own network namespace)
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["SLURM_JOB_NAME"] == env["ASTRAEUS_RUN_NAME"] == "allreduce"
        assert env["ASTRAEUS_WORKER_NAME"] == f"allreduce-{i}" and env["ASTRAEUS_WORKER_INDEX"] == str(i)
        assert env["ASTRAEUS_NUM_WORKERS"] == "2"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]

    # Every rank (2 processes per machine, global ranks 0-3) sums 1 + 2 + 3 + 4 over both machines.
    seen = {}
    for i in (0, 1):
        for m in re.finditer(r"^rank (\d) of 4 on \S+?/(\S+): all_reduce sum = (\d+)$", logs[i], re.M):
            seen[int(m[1])] = (i, m[2], int(m[3]))
    assert sorted(seen) == [0, 1, 2, 3], logs
    assert all(s == 10 for _, _, s in seen.values()), seen
    # torchrun gives node rank 0 global ranks 0 and 1, node rank 1 ranks 2 and 3; each prints its worker's address
    assert {r: (i, a) for r, (i, a, _) in seen.items()} == {0: (0, own[0]), 1: (0, own[0]), 2: (1, own[1]),
                                                             3: (1, own[1])}


# Issue 42, item 2: another workspace's worker on each machine binds every rendezvous port (29500-30499) on all of
# its addresses and listens, before the gang starts. With a network of its own per worker, that takes nothing
# from the gang: its rank 0 binds its MASTER_PORT, rank 1 reaches rank 0 (never the squatter), and the squatter
# sees no connection.
SQUATTER = r'''
import os, select, socket
socks = []
for port in range(29500, 30500):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        s.listen()
        socks.append(s)
    except OSError:
        s.close()
print(f"bound {len(socks)} ports at {os.environ.get('ASTRAEUS_WORKER_ADDR', 'the machine')}", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        c, peer = s.accept()
        print(f"HIJACKED a connection from {peer[0]} on port {s.getsockname()[1]}", flush=True)
        c.close()
'''


def test_another_workspace_holding_every_rendezvous_port_takes_nothing_from_a_gang(fleet):
    with fleet.admin() as adm:
        r = adm.post("/workspaces", json={"name": "nlp", "clusters": {"main": {}}})
        assert r.status_code == 201, r.text
        nlp_token = adm.post("/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"}).json()["token"]
    nlp = fleet.client(nlp_token)
    nlp.base_url = fleet.api.replace("/w/vision", "/w/nlp")
    with nlp:
        for m in ("gpu-01", "gpu-02"):
            r = nlp.post("/runs", json={"metadata": {"name": f"squat-{m}"}, "spec": {"task_template": {
                "image": "python:3.11", "command": "python", "args": ["-c", SQUATTER], "restart_policy": "Never",
                "requested_resources": {"cpu_cores": 0.5, "node_selection": {"mode": "Names", "names": [m]}}}}})
            assert r.status_code == 201, r.text
        for m in ("gpu-01", "gpu-02"):
            fleet.wait_for(lambda m=m: "bound 1000 ports" in nlp.get(f"/workers/squat-{m}-0/logs").text, 60,
                           what=f"the squatter on {m} holding every rendezvous port")
        spec = {"metadata": {"name": "allreduce"}, "spec": {"start": "Gang", "task_template": {
            "image": "python:3.11", "command": "torchrun", "args": ["/app/allreduce.py"], "restart_policy": "Never",
            "time_limit_seconds": 300,
            "requested_resources": {"gpu_requests": {"count": 4, "min_per_machine": 2}, "cpu_cores": 1},
            "configs": [{"mounts": ["/app/allreduce.py"], "value": (EXAMPLE / "allreduce.py").read_text()}]}}}
        with fleet.client() as c:
            r = c.post("/runs", json=spec)
            assert r.status_code == 201, r.text
        run = fleet.wait_for(lambda: (x := fleet.run("allreduce"))["status"]["state"] in ("Completed", "Failed")
                             and x, 120, interval=0.5, what="the gang to end")
        logs = {i: fleet.logs(f"allreduce-{i}") for i in (0, 1)}
        assert run["status"]["state"] == "Completed", (run["status"], logs)
        assert sum(len(re.findall(r"all_reduce sum = 10$", logs[i], re.M)) for i in (0, 1)) == 4, logs
        for m in ("gpu-01", "gpu-02"):
            squat = nlp.get(f"/workers/squat-{m}-0/logs").text
            assert "HIJACKED" not in squat and nlp.get(f"/workers/squat-{m}-0").json()["state"] == "Running", squat
            assert nlp.delete(f"/runs/squat-{m}").status_code == 200
