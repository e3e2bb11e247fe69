"""The fleet, control-plane side (issue 15): machines register their address, shared filesystems and NFS abilities;
a multi-machine gang's workers get their rendezvous (ranks, master address and port) under Astraeus', torchrun's and
Slurm's names; a drive on a shared filesystem is placed only where the filesystem is; a drive kept on one machine is
exported to exactly the machines running its workers elsewhere; and every machine a drive cannot be reached from
says why. In-process control plane (no agents: the test registers machines and reports for them), SQLite and
PostgreSQL; the pure rules on their own."""

from __future__ import annotations

import ipaddress

import pytest

from astraeus import drives, rendezvous
from astraeus.spec import DriveSource, check_host_path, granted_root, parse_shared_filesystems
from tests.conftest import wait_for

REG = {"gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}
GANESHA = {"server": "ganesha", "client": False, "rdma": False}
CLIENT = {"server": None, "client": True, "rdma": False}


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _register(app, name: str, **decl) -> str:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": name, **REG, **decl})
    assert r.status_code == 200, r.text
    return r.json()["credential"]


def _grant(app, *paths: str) -> None:
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", headers=_h(app.boot["admin_token"]),
                         json={"clusters": {"main": {"host_paths": ["/data/astraeus", *paths]}}})
    assert r.status_code == 200, r.text


def _assignments(app, cred: str, machine: str) -> dict:
    r = app.client.get("/api/v1/agent/assignments", params={"machine": machine}, headers=_h(cred))
    assert r.status_code == 200, r.text
    return r.json()


def _worker(app, name: str) -> dict:
    return app.client.get(f"{app.api}/workers/{name}", headers=app.h()).json()


def _run(app, name: str, gpus: int = 8, machines: int | None = None, drive: str | None = None,
         network: str | None = None, **rr) -> None:
    req = {"gpu_requests": {"count": gpus}, **rr}
    if machines:
        req["machines"] = machines
    tt = {"image": "python:3.11", "command": "sleep", "args": ["600"], "requested_resources": req}
    if network:
        tt["network"] = network
    if drive:
        tt["datavolume_refs"] = [{"name": drive, "mount_path": "/ckpt", "mode": "ReadWrite"}]
    r = app.client.post(app.api + "/runs", json={"metadata": {"name": name}, "spec": {"task_template": tt}},
                        headers=app.h())
    assert r.status_code == 201, r.text


def _drive(app, name: str, status: int = 201, **source) -> dict:
    src = {"path": "/ft", "mount_path": "/ckpt", "mode": "ReadWrite", **source}
    r = app.client.post(app.api + "/drives", headers=app.h(),
                        json={"metadata": {"name": name}, "spec": {"sources": [src], "transport": "Auto",
                                                                   "permissions": {"create": True}}})
    assert r.status_code == status, r.text
    return r.json()


def _why_not(app, worker: str) -> dict[str, str]:
    return {x["machine"]: x["reason"] for x in _worker(app, worker).get("why_not") or []}


# ------------------------------------------------------------------------------------------- pure rules


def test_rendezvous_names_every_rank_under_each_convention():
    nodes = [rendezvous.Node("gpu-02", "10.77.0.3", 4), rendezvous.Node("gpu-01", "10.77.0.2", 4)]
    envs = rendezvous.environments("train", nodes, 29611)
    assert [e["ASTRAEUS_NODE_RANK"] for e in envs] == ["0", "1"] == [e["PET_NODE_RANK"] for e in envs]
    for e in envs:
        assert e["ASTRAEUS_MASTER_ADDR"] == e["PET_MASTER_ADDR"] == e["MASTER_ADDR"] == "10.77.0.3"
        assert e["ASTRAEUS_MASTER_PORT"] == e["PET_MASTER_PORT"] == e["MASTER_PORT"] == "29611"
        assert e["ASTRAEUS_NODE_ADDRS"] == "10.77.0.3,10.77.0.2"
        assert e["ASTRAEUS_NUM_NODES"] == e["PET_NNODES"] == e["SLURM_NNODES"] == e["SLURM_JOB_NUM_NODES"] == "2"
        assert e["PET_NPROC_PER_NODE"] == e["SLURM_GPUS_ON_NODE"] == "4" and e["WORLD_SIZE"] == "8"
        assert e["SLURM_JOB_NODELIST"] == "gpu-02,gpu-01"
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"] == [e["SLURM_NODEID"] for e in envs]
    # a CPU gang: one process per machine; a machine that gave no address is named
    cpu = rendezvous.environments("t", [rendezvous.Node("a", None, 0), rendezvous.Node("b", None, 0)], 29500)
    assert cpu[1]["PET_NPROC_PER_NODE"] == "1" and cpu[1]["WORLD_SIZE"] == "2" and cpu[1]["MASTER_ADDR"] == "a"


def test_a_rendezvous_port_is_never_one_a_live_gang_uses():
    used = set(range(29500, 30499))
    assert rendezvous.choose_port(used, "x") == 30499
    assert rendezvous.choose_port(set(), "run:1") == rendezvous.choose_port(set(), "run:1")  # same attempt, same
    with pytest.raises(ValueError, match="every rendezvous port 29500-30499 is in use"):
        rendezvous.choose_port(set(range(29500, 30500)), "x")
    assert rendezvous.is_gang("Gang", 2) and not rendezvous.is_gang("Gang", 1)
    assert not rendezvous.is_gang("Independent", 4)


def test_where_a_drive_can_be_reached_and_why_not():
    kept = {"node": "gpu-01", "path": "/data/astraeus/ft"}
    shared = {"filesystem": "lab", "path": "/ft"}
    keeper = drives.MachineFacts("gpu-01", nfs_server="ganesha")
    client = drives.MachineFacts("gpu-02", nfs_client=True, shared_filesystems={"lab": "/mnt/lab"})
    plain = drives.MachineFacts("gpu-03")
    assert drives.unreachable("ft", kept, "Auto", keeper, keeper) is None
    assert drives.unreachable("ft", kept, "Auto", client, keeper) is None
    assert drives.unreachable("ft", kept, "Auto", plain, keeper) == (
        "drive ft is kept on gpu-01; gpu-03 cannot mount NFS (its kernel has no NFS client)")
    assert drives.unreachable("ft", kept, "Auto", client, drives.MachineFacts("gpu-01")) == (
        "drive ft is kept on gpu-01, which cannot export it over NFS (install nfs-ganesha there); a worker "
        "elsewhere cannot mount it")
    assert "which is not Ready" in drives.unreachable("ft", kept, "Auto", client,
                                                      drives.MachineFacts("gpu-01", ready=False, nfs_server="ganesha"))
    assert drives.unreachable("ft", kept, "Auto", client, None) == (
        "drive ft is kept on gpu-01, which is not a machine of this cluster")
    assert drives.unreachable("ft", kept, "RDMA", client, keeper) == (
        "drive ft asks for transport RDMA; gpu-01 and gpu-02 has no RDMA device")
    assert drives.unreachable("ft", shared, "Auto", client, None) is None
    assert drives.unreachable("ft", shared, "Auto", plain, None) == (
        "drive ft is on shared filesystem lab, which gpu-03 does not have (an agent declares it with "
        "--shared-fs lab=/mount/path)")
    assert drives.choose_transport("Auto", True, True) == ("rdma", 20049)
    assert drives.choose_transport("Auto", True, False) == ("tcp", 2049)
    assert drives.choose_transport("TCP", True, True) == ("tcp", 2049)
    assert drives.choose_transport("RDMA", False, False) == ("rdma", 20049)
    assert drives.shared_path("/mnt/lab", "/ft") == "/mnt/lab/ft" and drives.shared_path("/mnt/lab", "/") == "/mnt/lab"


def test_grants_and_shared_filesystems_are_checked():
    assert granted_root({"filesystem": "lab", "path": "/vision/ft"}, ["/data/astraeus", "lab:/vision"]) == "lab:/vision"
    assert granted_root({"filesystem": "lab", "path": "/nlp/ft"}, ["/data/astraeus", "lab:/vision"]) is None
    assert granted_root({"filesystem": "lab", "path": "/vision"}, ["/vision"]) is None  # a machine path grant
    assert granted_root({"node": "gpu-01", "path": "/vision/x"}, ["lab:/vision"]) is None  # a filesystem grant
    assert check_host_path("lab:/") == "lab:/"
    for bad, says in [("lab:rel", "must be an absolute path"), ("Lab:/x", "is not a DNS label"),
                      ("rel", "must be an absolute path")]:
        with pytest.raises(ValueError, match=says):
            check_host_path(bad)
    assert parse_shared_filesystems(["lab=/mnt/lab/", "scratch=/lustre"]) == {"lab": "/mnt/lab",
                                                                              "scratch": "/lustre"}
    for bad, says in [(["lab"], "write NAME=/mnt/path"), (["lab=mnt"], "must be an absolute path"),
                      (["lab=/a", "lab=/b"], "given twice")]:
        with pytest.raises(ValueError, match=says):
            parse_shared_filesystems(bad)
    with pytest.raises(ValueError, match="give either node .* or filesystem .*, not both"):
        DriveSource(node="gpu-01", filesystem="lab", path="/x", mount_path="/ckpt")
    with pytest.raises(ValueError, match="not neither"):
        DriveSource(path="/x", mount_path="/ckpt")


# ------------------------------------------------------------------------------ through the control plane


def test_machines_show_their_address_shared_filesystems_and_nfs(app):
    _register(app, "gpu-01", address="10.77.0.2", shared_filesystems={"lab": "/mnt/lab"}, nfs=GANESHA)
    _register(app, "gpu-02")  # an agent that says nothing of these
    ms = {m["name"]: m for m in app.client.get(app.api + "/machines", headers=app.h()).json()["items"]}
    assert (ms["gpu-01"]["address"], ms["gpu-01"]["shared_filesystems"], ms["gpu-01"]["nfs"]) == (
        "10.77.0.2", {"lab": "/mnt/lab"}, GANESHA)
    assert (ms["gpu-02"]["address"], ms["gpu-02"]["shared_filesystems"], ms["gpu-02"]["nfs"]["client"]) == (
        None, {}, False)
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": "gpu-03", **REG, "address": "x" * 65})
    assert r.status_code == 422 and "address" in r.text


def _report(app, cred: str, machine: str, state: str, **extra) -> None:
    """Report every worker assigned to `machine` in `state` (Running, or Exited with exit_code 0)."""
    items = _assignments(app, cred, machine)["assignments"]
    workers = [{"worker": a["worker"], "attempt": a["attempt"], "state": state, "pid": 4242, **extra} for a in items]
    r = app.client.post("/api/v1/agent/report", headers=_h(cred), json={"machine": machine, "workers": workers})
    assert r.status_code == 200, r.text


def _envs(app, creds: dict[str, str]) -> dict[str, tuple[str, dict]]:
    return {a["name"]: (m, a["env"]) for m, cred in creds.items() for a in _assignments(app, cred, m)["assignments"]
            if a["desired"] == "Running"}


def _given(app, creds: dict[str, str]) -> dict[str, dict]:
    return {a["name"]: a for m, cred in creds.items() for a in _assignments(app, cred, m)["assignments"]
            if a["desired"] == "Running"}


def test_a_two_machine_gang_gets_its_rendezvous_and_new_values_for_its_next_attempt(app):
    creds = {"gpu-01": _register(app, "gpu-01", address="10.77.0.2"),
             "gpu-02": _register(app, "gpu-02", address="10.77.0.3")}
    addr = {"gpu-01": "10.77.0.2", "gpu-02": "10.77.0.3"}
    _run(app, "train", gpus=16, machines=2)
    wait_for(lambda: all(_worker(app, f"train-{i}")["state"] == "Starting" for i in (0, 1)), what="gang placed")
    envs = _envs(app, creds)
    (m0, e0), (m1, e1) = envs["train-0"], envs["train-1"]
    assert (e0["ASTRAEUS_NODE_RANK"], e1["ASTRAEUS_NODE_RANK"]) == ("0", "1") and m0 != m1
    # each worker has an address of its own (a network of its own), which is its gang's MASTER_ADDR / NODE_ADDRS
    w0, w1 = e0["ASTRAEUS_WORKER_ADDR"], e1["ASTRAEUS_WORKER_ADDR"]
    assert w0 != w1 and all(ipaddress.ip_address(w) in rendezvous.ADDRESSES for w in (w0, w1))
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"] == e1["ASTRAEUS_MASTER_ADDR"] == w0
    assert e0["ASTRAEUS_NODE_ADDRS"] == e1["ASTRAEUS_NODE_ADDRS"] == f"{w0},{w1}"
    given = _given(app, creds)  # the agent's word: its address, and the route to each peer through its machine
    assert given["train-0"]["network"] == "isolated" and given["train-0"]["address"] == w0
    assert given["train-0"]["peers"] == [{"address": w1, "machine_address": addr[m1]}]
    assert given["train-1"]["peers"] == [{"address": w0, "machine_address": addr[m0]}]
    assert e0["MASTER_PORT"] == e1["PET_MASTER_PORT"] and 29500 <= int(e0["MASTER_PORT"]) < 30500
    assert e0["WORLD_SIZE"] == "16" and e0["PET_NPROC_PER_NODE"] == "8" and e0["SLURM_JOB_NODELIST"] == f"{m0},{m1}"
    assert e0["SLURM_JOB_NAME"] == "train" and e1["SLURM_NODEID"] == "1"

    # a second gang, placed while the first lives, never shares its port; a one-worker run gets no rendezvous
    creds["gpu-03"] = _register(app, "gpu-03", address="10.77.0.4")
    creds["gpu-04"] = _register(app, "gpu-04", address="10.77.0.5")
    _run(app, "other", gpus=16, machines=2)
    wait_for(lambda: _worker(app, "other-0")["state"] == "Starting", what="second gang placed")
    envs = _envs(app, creds)
    assert envs["other-0"][1]["MASTER_PORT"] != e0["MASTER_PORT"]
    assert envs["other-0"][1]["MASTER_ADDR"] not in (w0, w1)  # nor its workers' addresses
    app.client.delete(f"{app.api}/runs/other", headers=app.h())
    for m in ("gpu-03", "gpu-04"):
        _report(app, creds[m], m, "Exited", exit_code=143)
    _run(app, "single", gpus=1)
    wait_for(lambda: _worker(app, "single-0")["state"] == "Starting", what="single placed")
    single = _envs(app, creds)["single-0"][1]
    assert "MASTER_ADDR" not in single and "ASTRAEUS_NODE_RANK" not in single

    # the gang ends its attempt (its machines lost it: both reported exited by a signal, restarted by policy? no:
    # deleted and made again): a new attempt is a new rendezvous, ranks 0 and 1 again
    for m in ("gpu-01", "gpu-02"):
        _report(app, creds[m], m, "Running")
    app.client.delete(f"{app.api}/runs/train", headers=app.h())
    for m in ("gpu-01", "gpu-02"):
        _report(app, creds[m], m, "Exited", exit_code=143)
    wait_for(lambda: app.client.get(f"{app.api}/runs/train", headers=app.h()).status_code == 404, what="deleted")
    _run(app, "train", gpus=16, machines=2)
    wait_for(lambda: all(_worker(app, f"train-{i}")["state"] == "Starting" for i in (0, 1)), what="placed again")
    envs = _envs(app, creds)
    assert {envs["train-0"][1]["ASTRAEUS_NODE_RANK"], envs["train-1"][1]["ASTRAEUS_NODE_RANK"]} == {"0", "1"}
    assert envs["train-0"][1]["MASTER_PORT"] == envs["train-1"][1]["MASTER_PORT"]


def test_a_drive_on_a_shared_filesystem_goes_only_where_the_filesystem_is(app):
    _grant(app, "lab:/vision")
    creds = {"gpu-01": _register(app, "gpu-01", address="10.77.0.2"),
             "gpu-02": _register(app, "gpu-02", address="10.77.0.3", shared_filesystems={"lab": "/mnt/lab"})}
    # refused: outside the grant, or both a machine and a filesystem, and nothing stored
    msg = _drive(app, "ft", 403, filesystem="lab", path="/nlp/ft")["message"]
    assert "in shared filesystem lab is outside the host paths granted" in msg and "lab:/path" in msg
    msg = _drive(app, "ft", 422, filesystem="lab", node="gpu-01", path="/vision/ft")["message"]
    assert "give either node" in msg
    assert app.client.get(app.api + "/drives", headers=app.h()).json()["items"] == []
    d = _drive(app, "ft", filesystem="lab", path="/vision/ft")
    assert d["spec"]["sources"][0] == {"filesystem": "lab", "path": "/vision/ft", "mount_path": "/ckpt",
                                       "mode": "ReadWrite"}
    # two one-machine runs: the one needing the drive lands on gpu-02 although gpu-01 comes first
    _run(app, "ft-run", gpus=1, drive="ft")
    wait_for(lambda: _worker(app, "ft-run-0")["state"] == "Starting", what="placed")
    assert _worker(app, "ft-run-0")["machine"] == "gpu-02"
    (mount,) = next(a for a in _assignments(app, creds["gpu-02"], "gpu-02")["assignments"])["mounts"]
    assert (mount["host_path"], mount["granted_root"], mount["mount_path"], mount["nfs"]) == (
        "/mnt/lab/vision/ft", "/mnt/lab/vision", "/ckpt", None)
    # with gpu-02 full, the next one waits, and gpu-01 says why
    _run(app, "ft-more", gpus=8, drive="ft")
    wait_for(lambda: "gpu-01" in _why_not(app, "ft-more-0"), what="a reason per machine")
    assert _why_not(app, "ft-more-0")["gpu-01"] == (
        "drive ft is on shared filesystem lab, which gpu-01 does not have (an agent declares it with "
        "--shared-fs lab=/mount/path)")
    assert _worker(app, "ft-more-0")["state"] == "Pending"


def test_a_drive_kept_on_one_machine_is_exported_to_the_machines_that_use_it_and_no_other(app):
    creds = {"gpu-01": _register(app, "gpu-01", address="10.77.0.2", nfs=GANESHA),
             "gpu-02": _register(app, "gpu-02", address="10.77.0.3", nfs=CLIENT),
             "gpu-03": _register(app, "gpu-03", address="10.77.0.4")}
    _drive(app, "ft", node="gpu-01", path="/data/astraeus/ft")
    # gpu-01 is taken, so the worker goes elsewhere: gpu-02 can mount NFS, gpu-03 cannot and says so
    _run(app, "hog", gpus=8)
    wait_for(lambda: _worker(app, "hog-0")["state"] == "Starting", what="hog placed")
    assert _worker(app, "hog-0")["machine"] == "gpu-01"
    _run(app, "ft-run", gpus=8, drive="ft")
    wait_for(lambda: _worker(app, "ft-run-0")["state"] == "Starting", what="placed")
    assert _worker(app, "ft-run-0")["machine"] == "gpu-02"
    (a,) = _assignments(app, creds["gpu-02"], "gpu-02")["assignments"]
    (mount,) = a["mounts"]
    ns = a["workspace"]
    assert mount["nfs"] == {"server": "10.77.0.2", "machine": "gpu-01", "export_path": f"/astraeus/{ns}.ft",
                            "transport": "tcp", "port": 2049}
    (export,) = _assignments(app, creds["gpu-01"], "gpu-01")["exports"]
    assert (export["drive"], export["path"], export["clients"], export["read_only"]) == (
        f"{ns}.ft", "/data/astraeus/ft", ["10.77.0.3"], False)
    assert export["workspace_number"] == a["workspace_number"] and export["granted_root"] == "/data/astraeus"
    assert _assignments(app, creds["gpu-02"], "gpu-02")["exports"] == []
    _run(app, "ft-more", gpus=8, drive="ft")
    wait_for(lambda: "gpu-03" in _why_not(app, "ft-more-0"), what="a reason per machine")
    assert _why_not(app, "ft-more-0")["gpu-03"] == (
        "drive ft is kept on gpu-01; gpu-03 cannot mount NFS (its kernel has no NFS client)")
    app.client.delete(f"{app.api}/runs/ft-more", headers=app.h())
    # the last worker using it elsewhere ends: gpu-01 exports nothing
    _report(app, creds["gpu-02"], "gpu-02", "Running")
    _report(app, creds["gpu-02"], "gpu-02", "Exited", exit_code=0)
    wait_for(lambda: _worker(app, "ft-run-0")["state"] == "Succeeded", what="ended")
    assert _assignments(app, creds["gpu-01"], "gpu-01")["exports"] == []


def test_the_host_network_is_for_workspaces_an_admin_allowed_it(app):
    creds = {"gpu-01": _register(app, "gpu-01", address="10.77.0.2"),
             "gpu-02": _register(app, "gpu-02", address="10.77.0.3")}
    body = {"metadata": {"name": "nccl"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"], "network": "host",
        "requested_resources": {"gpu_requests": {"count": 16}, "machines": 2}}}}
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 403 and r.json()["code"] == "HOST_NETWORK_NOT_ALLOWED", r.text
    assert r.json()["message"] == (
        "spec.task_template.network: host is not allowed for workspace vision on cluster main: remove it (each worker "
        "gets a network of its own), or ask an admin to allow it (clusters.main.host_network: true)")
    assert app.client.get(app.api + "/runs/nccl", headers=app.h()).status_code == 404  # nothing stored
    bad = {**body, "spec": {"task_template": {**body["spec"]["task_template"], "network": "bridge"}}}
    r = app.client.post(app.api + "/runs", json=bad, headers=app.h())
    assert r.status_code == 422 and "network" in r.text, r.text

    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"host_network": True}}},
                         headers=admin)
    assert r.status_code == 200, r.text
    assert app.client.get(app.api, headers=app.h()).json()["clusters"][0]["host_network"] is True
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 201, r.text
    wait_for(lambda: all(_worker(app, f"nccl-{i}")["state"] == "Starting" for i in (0, 1)), what="gang placed")
    given = _given(app, creds)
    e0, e1 = given["nccl-0"]["env"], given["nccl-1"]["env"]
    assert given["nccl-0"]["network"] == "host" and given["nccl-0"]["address"] is None
    assert given["nccl-0"]["peers"] == [] and "ASTRAEUS_WORKER_ADDR" not in e0
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"] == {"gpu-01": "10.77.0.2", "gpu-02": "10.77.0.3"}[
        next(m for m, c in creds.items() if any(a["name"] == "nccl-0" for a in _assignments(app, c, m)["assignments"]))]


def test_a_name_being_deleted_says_so_until_its_workers_have_ended(app):
    """A deleted run keeps its name while its workers stop (SQLite and PostgreSQL): a submit of that name meanwhile
    is refused saying so (not "delete it first"), by the group-commit path and the plain one alike; once its
    worker has ended the name is free."""
    cred = _register(app, "gpu-01")
    _run(app, "live", gpus=1)
    wait_for(lambda: _worker(app, "live-0")["state"] == "Starting", what="placed")
    _report(app, cred, "gpu-01", "Running")
    assert app.client.delete(f"{app.api}/runs/live", headers=app.h()).status_code == 200
    body = {"metadata": {"name": "live"}, "spec": {"task_template": {"image": "python:3.11", "command": "true"}}}
    said = ("a run named live in workspace vision is being deleted (its workers are stopping): submit again once it "
            "is gone, within its stop grace, or choose another metadata.name")
    _drive(app, "d", node="gpu-01", path="/data/astraeus/d")
    with_drive = {"metadata": {"name": "live"}, "spec": {"task_template": {  # not batched: submits.submit_run
        **body["spec"]["task_template"], "datavolume_refs": [{"name": "d", "mount_path": "/d"}]}}}
    for b in (body, with_drive):
        r = app.client.post(f"{app.api}/runs", json=b, headers=app.h())
        assert r.status_code == 409 and r.json() == {"code": "ALREADY_EXISTS", "message": said}, r.text
    _report(app, cred, "gpu-01", "Exited", exit_code=143)
    wait_for(lambda: app.client.post(f"{app.api}/runs", json=body, headers=app.h()).status_code == 201,
             what="the name free again")
