"""Issue 42, item 1: a worker's network on a real `astraeus up` machine. By default it is a namespace of its own with
its own address (astraeus.agent.network); `network: host`, once an admin allowed it for the workspace on the
cluster, is the machine's own. When the agent stops (with its workers), no namespace and no nftables table of its
is left on the machine."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from tests.conftest import start_cluster

from .conftest import wait_for

pytestmark = pytest.mark.faults

WHERE = ("import os\n"
         "print('netns', os.stat('/proc/self/ns/net').st_ino, flush=True)\n"
         "print('addr', os.environ.get('ASTRAEUS_WORKER_ADDR', '-'), flush=True)\n")


def _run(name: str, network: str | None = None) -> dict:
    tt = {"image": "python:3.11", "command": "python", "args": ["-c", WHERE], "restart_policy": "Never",
          "requested_resources": {"cpu_cores": 0.5}}
    if network:
        tt["network"] = network
    return {"metadata": {"name": name}, "spec": {"task_template": tt}}


def _where(cl, name: str) -> dict[str, str]:
    wait_for(lambda: cl.get(f"/workers/{name}-0").json()["state"] == "Succeeded", timeout=60, what=f"{name} ended")
    return dict(ln.split(" ", 1) for ln in cl.get(f"/workers/{name}-0/logs").text.splitlines())


def _ours(owner_hint: str) -> tuple[list[str], list[str]]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return ([ln for ln in ns.splitlines() if owner_hint in ln], [ln for ln in tables.splitlines() if owner_hint in ln])


def test_a_worker_has_a_network_of_its_own_and_host_is_for_whom_an_admin_allowed_it(tmp_path):
    from astraeus.agent import network

    if network.unavailable():
        pytest.skip(f"per-worker networks: {network.unavailable()}")
    c = start_cluster(tmp_path / "home")
    try:
        machine = os.stat("/proc/self/ns/net").st_ino  # `up` without --netns: the machine is this host
        with c.client() as cl:
            assert cl.post("/runs", json=_run("own")).status_code == 201
            own = _where(cl, "own")
            assert int(own["netns"]) != machine and own["addr"].startswith("100.127."), own
            r = cl.post("/runs", json=_run("shared", "host"))
            assert r.status_code == 403 and r.json()["code"] == "HOST_NETWORK_NOT_ALLOWED", r.text
        with c.admin() as adm:
            r = adm.patch("/workspaces/vision", json={"clusters": {"main": {"host_network": True}}})
            assert r.status_code == 200, r.text
        with c.client() as cl:
            assert cl.post("/runs", json=_run("shared", "host")).status_code == 201
            shared = _where(cl, "shared")
            assert int(shared["netns"]) == machine and shared["addr"] == "-", shared
    finally:
        c.stop()
    # the agent's owner id (ProcessRuntime.owner: a hash of its state dir) names its namespaces and its table
    owner = hashlib.sha1(os.path.realpath(c.home / "agents" / "gpu-01").encode()).hexdigest()[:12]
    assert _ours(owner) == ([], [])
