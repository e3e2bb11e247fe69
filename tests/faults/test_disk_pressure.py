"""Issue 42, item 4: a machine whose disk is nearly full takes no new workers and says so. A real agent whose state
dir is on a small filesystem that a file fills: the machine shows `Disk pressure: N% free on <state dir>` (API,
`astra astraeus machines`), a new run waits with that reason in its why-not lines while the worker already running
goes on, and once the file is removed the run starts."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import VENV_BIN, AgentProc, machines_run, sleeper_run, wait_for
from .loopfs import fill, small_fs


def _machine(c) -> dict:
    return c.get("/machines").json()["items"][0]


@pytest.mark.faults
def test_a_machine_nearly_out_of_disk_takes_no_new_workers_and_says_why(fleet, tmp_path):
    with small_fs(tmp_path / "small", mib=64) as fs:
        srv = fleet.server()
        state = fs / "state"
        agent = AgentProc(srv.url, srv.vars["ASTRAEUS_MACHINE_TOKEN"], "gpu-01", state, tmp_path / "agent.log",
                          env={"ASTRAEUS_RUNTIME": "process"})
        fleet.agents.append(agent)
        agent.start()
        with srv.client() as c:
            machines_run(c, "process")
            m = wait_for(lambda: (m := _machine(c))["disk"] and m, timeout=30, what="the machine's disk reported")
            assert m["disk"]["path"] == str(state)
            assert m["reason"] is None and m["schedulable"] is True
            assert c.post("/runs", json=sleeper_run("keeper", gpus=1)).status_code == 201
            wait_for(lambda: c.get("/workers/keeper-0").json()["state"] == "Running", timeout=60, what="keeper")

            fill(fs / "filler", leave=1 << 20)  # about 1 MiB left of 60: under the default 5 %
            m = wait_for(lambda: (m := _machine(c))["reason"] and m, timeout=30, what="disk pressure shown")
            assert re.fullmatch(rf"Disk pressure: \d+(\.\d)?% free on {re.escape(str(state))}", m["reason"]), m
            assert m["schedulable"] is False and m["state"] == "Ready"
            out = subprocess.run([str(VENV_BIN / "astra"), "astraeus", "machines"], capture_output=True, text=True,
                                 env={**srv_env(srv), "ASTRAEUS_CONFIG": str(tmp_path / "cli.json")}, timeout=60)
            assert out.returncode == 0, out.stderr
            assert m["reason"] in out.stdout, out.stdout

            assert c.post("/runs", json=sleeper_run("late", gpus=1, code="print('late ran', flush=True)",
                                                    restart="Never")).status_code == 201
            why = f"machine is not schedulable ({m['reason']})"
            wait_for(lambda: why in c.get("/runs/late").text, timeout=30, what="the why-not line naming the disk")
            assert c.get("/workers/late-0").json()["state"] == "Pending"
            assert c.get("/workers/keeper-0").json()["state"] == "Running", "a running worker was stopped"

            (fs / "filler").unlink()
            wait_for(lambda: _machine(c)["reason"] is None, timeout=30, what="disk pressure gone")
            wait_for(lambda: c.get("/runs/late").json()["status"]["state"] == "Completed", timeout=60,
                     what="the waiting run ran once the disk had room")
            assert c.get("/workers/keeper-0").json()["restarts"] == 0


def srv_env(srv) -> dict:
    import os

    e = dict(os.environ)
    e.update({"ASTRAEUS_API": srv.api, "ASTRAEUS_TOKEN": srv.vars["ASTRAEUS_TOKEN"]})
    return e
