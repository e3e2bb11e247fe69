"""Issue 47, machines, with real agents on both runtimes: an XID injected on a simulated GPU stops its worker (its stop
grace) and it runs again on another GPU with 0 restarts; the GPU takes nothing new until an admin clears it; a failing
site health-check command drains its machine with the command's output as the reason and passing again resumes it;
drain, cordon and resume through `astra` show their reasons in `machines`, `sinfo` and `describe`."""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import VENV_BIN, machines_run, sleeper_run, wait_for


def _astra(srv, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASTRAEUS_API": srv.api, "ASTRAEUS_TOKEN": srv.vars["ASTRAEUS_TOKEN"],
           "ASTRAEUS_ADMIN_TOKEN": srv.vars["ASTRAEUS_ADMIN_TOKEN"], "ASTRAEUS_CONFIG": str(srv.home / "cli.json")}
    out = subprocess.run([str(VENV_BIN / "astra"), *args], capture_output=True, text=True, env=env, timeout=60)
    if ok:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _machine(c, name: str = "gpu-01") -> dict:
    return next(m for m in c.get("/machines").json()["items"] if m["name"] == name)


def _running(c, worker: str) -> dict:
    return wait_for(lambda: (w := c.get(f"/workers/{worker}").json())["state"] == "Running" and w, timeout=90,
                    what=f"{worker} running")


@pytest.mark.faults
def test_an_injected_xid_moves_the_worker_to_another_gpu_with_no_restart_spent(fleet, runtime):
    srv = fleet.server()
    fleet.agent(srv, gpus=2, env=runtime.env)
    with srv.client() as c, srv.admin() as admin:
        machines_run(c, runtime.kind)
        assert c.post("/runs", json=sleeper_run("train", image=runtime.image)).status_code == 201
        gpu = _running(c, "train-0")["gpu_indices"][0]

        r = admin.post(f"/machines/gpu-01/gpus/{gpu}/fault", json={"xid": 79})
        assert r.status_code == 200, r.text
        said = f"GPU {gpu} of gpu-01 failed (XID 79): queued again elsewhere"
        w = wait_for(lambda: (w := c.get("/workers/train-0").json())["state"] == "Running"
                     and w["gpu_indices"] != [gpu] and w, timeout=90, what="train running on the other GPU")
        assert w["restarts"] == 0 and w["gpu_indices"] == [1 - gpu]
        assert said in c.get("/runs/train").text  # its History
        assert said in _astra(srv, "astraeus", "describe", "train").stdout
        m = _machine(c)
        assert m["quarantined_gpus"] == [gpu] and f"GPU {gpu} failed (XID 79): quarantined" in m["reason"]
        assert any(e["kind"] == "GpuFailed" for e in c.get("/events").json()["items"])
        assert 'xid="79"' in httpx_get(srv.url + "/metrics")

        # the quarantined GPU takes nothing new: the next 1-GPU run waits, until an admin clears it
        assert c.post("/runs", json=sleeper_run("next", image=runtime.image)).status_code == 201
        wait_for(lambda: c.get("/workers/next-0").json().get("why_not"), timeout=30, what="next waits")
        assert c.get("/workers/next-0").json()["state"] == "Pending"
        assert admin.delete(f"/machines/gpu-01/gpus/{gpu}/fault").status_code == 200
        assert _running(c, "next-0")["gpu_indices"] == [gpu]


@pytest.mark.faults
def test_a_failing_health_check_drains_its_machine_with_its_output_as_the_reason(fleet, runtime, tmp_path):
    ok = tmp_path / "healthy"
    check = f"test -e {ok} || {{ echo 'ib0: link down (port 1)'; exit 1; }}"
    srv = fleet.server()
    fleet.agent(srv, gpus=2, env={**runtime.env, "ASTRAEUS_HEALTH_CHECK_COMMAND": check,
                                  "ASTRAEUS_HEALTH_CHECK_INTERVAL": "1"})
    with srv.client() as c:
        machines_run(c, runtime.kind)
        m = wait_for(lambda: (m := _machine(c))["cordon"] and m, timeout=30, what="drained by the health check")
        assert (m["cordon"], m["reason"]) == ("drain", "drained by health-check: ib0: link down (port 1)")
        assert "drain" in _astra(srv, "slurm", "sinfo", "-N", "-o", "%N %t %R").stdout
        assert c.post("/runs", json=sleeper_run("waits", image=runtime.image)).status_code == 201
        wait_for(lambda: "ib0: link down" in str(c.get("/workers/waits-0").json().get("why_not")), timeout=30,
                 what="the why-not line naming the health check")
        ok.touch()
        wait_for(lambda: _machine(c)["cordon"] is None, timeout=30, what="resumed once the check passes")
        _running(c, "waits-0")


@pytest.mark.faults
def test_drain_cordon_resume_show_their_reasons_in_machines_sinfo_and_describe(fleet, runtime):
    srv = fleet.server()
    fleet.agent(srv, gpus=2, env=runtime.env)
    with srv.client() as c:
        machines_run(c, runtime.kind)
        assert c.post("/runs", json=sleeper_run("train", image=runtime.image)).status_code == 201
        _running(c, "train-0")

        _astra(srv, "astraeus", "machines", "cordon", "gpu-01", "--reason", "firmware update")
        assert "cordoned by admin: firmware update" in _astra(srv, "astraeus", "machines").stdout
        sinfo = _astra(srv, "slurm", "sinfo", "-N", "-o", "%N %t %R").stdout
        assert "gpu-01 drng cordoned by admin: firmware update" in sinfo, sinfo  # draining: work still runs
        assert c.get("/workers/train-0").json()["state"] == "Running"

        out = _astra(srv, "slurm", "scontrol", "update", "NodeName=gpu-01", "State=DOWN", ok=False)
        assert out.returncode != 0 and "Reason=" in out.stderr  # Slurm's rule: a reason is needed
        _astra(srv, "astraeus", "machines", "drain", "gpu-01", "--reason", "new cables")
        said = "Machine gpu-01 drained by admin: new cables: queued again"
        wait_for(lambda: c.get("/workers/train-0").json()["reason"] == said, timeout=60, what="train queued again")
        assert c.get("/workers/train-0").json()["restarts"] == 0
        assert said in _astra(srv, "astraeus", "describe", "train").stdout
        sinfo = wait_for(lambda: "gpu-01 drain " in (s := _astra(srv, "slurm", "sinfo", "-N", "-o", "%N %t %R").stdout)
                         and s, timeout=30, what="drained in sinfo")
        assert "drained by admin: new cables" in sinfo

        _astra(srv, "slurm", "scontrol", "update", "NodeName=gpu-01", "State=RESUME")
        _running(c, "train-0")
        assert "drained" not in _astra(srv, "astraeus", "machines").stdout
        out = _astra(srv, "astraeus", "machines", "drain", "gpu-99", "--reason", "x", ok=False)
        assert out.returncode != 0 and "machine gpu-99 not found" in out.stdout + out.stderr
        out = _astra(srv, "astraeus", "machines", "drain", "gpu-01", ok=False)
        assert out.returncode != 0 and "--reason" in out.stdout + out.stderr


def httpx_get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=30).text
