"""Issue 46, live: `astraeus up --gpus 2 --mig 0:1g.10gb*2` (real control plane, real agent declaring simulated MIG
devices, process runtime): two runs asking one 1g.10gb device each start on distinct devices and see them in their
environment (CUDA_VISIBLE_DEVICES the device's name, ASTRAEUS_MIG_DEVICE its profile); a third waits with its
reason and why-not line; a whole-GPU run never takes the MIG GPU; an urgent MIG run preempts a lower-priority
holder of the only device; bad --mig is refused with what to change."""

from __future__ import annotations

import re
import subprocess

from typer.testing import CliRunner

from astraeus.main import app as astraeus_app
from tests.conftest import start_cluster

SHOW = 'echo "gpus $CUDA_VISIBLE_DEVICES mig $ASTRAEUS_MIG_DEVICE"; sleep 60'


def asking(name: str, gpu: dict, image: str = "python:3.11") -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": image, "command": "sh", "args": ["-c", SHOW],
        "requested_resources": {"gpu_requests": gpu, "cpu_cores": 0.05, "memory_bytes": 64 << 20}}}}


def test_mig_runs_get_distinct_devices_and_a_third_waits(tmp_path, runtime):
    """On both runtimes: in a container the worker sees its MIG devices by the same UUIDs (NVIDIA's hook takes them)."""
    c = start_cluster(tmp_path / "home", gpus=2, extra_args=["--mig", "0:1g.10gb*2"], env=runtime.env)
    try:
        with c.client() as cl:
            for name in ("mig-a", "mig-b", "mig-c"):
                r = cl.post("/runs", json=asking(name, {"count": 1, "mig": "1g.10gb"}, runtime.image))
                assert r.status_code == 201, r.text
            r = cl.post("/runs", json=asking("whole", {"count": 1}, runtime.image))
            assert r.status_code == 201, r.text
        seen = set()
        for n in ("mig-a", "mig-b"):
            c.wait_for(lambda n=n: c.run(n)["status"]["state"] == "Running", 120, 0.5, f"{n} Running")
            assert c.worker(f"{n}-0")["gpu_indices"] == [0]
            line = c.wait_for(lambda n=n: re.search(r"gpus \S+ mig \S+", c.logs(f"{n}-0")), 60, 0.5, f"{n}'s line")
            seen.add(line.group(0))
        assert seen == {"gpus MIG-sim-0-0 mig 1g.10gb", "gpus MIG-sim-0-1 mig 1g.10gb"}
        c.wait_for(lambda: c.run("whole")["status"]["state"] == "Running", 120, 0.5, "whole Running")
        assert c.worker("whole-0")["gpu_indices"] == [1]  # GPU 0 is MIG: never given whole

        def lines():
            return {x["machine"]: x["reason"] for x in c.worker("mig-c-0").get("why_not") or []} or None

        got = c.wait_for(lines, 60, 0.5, "mig-c's why-not lines")
        assert got["gpu-01"] == "not enough free MIG 1g.10gb devices: 0 free, 1 asked"
        run = c.run("mig-c")
        assert run["status"]["state"] == "Pending" and run["status"]["reason"].startswith("Next to run (priority ")
    finally:
        c.stop()


def test_an_urgent_mig_run_preempts_the_holder_of_the_only_device(tmp_path):
    """Process runtime: a low-priority run holds the only 1g.10gb device; an urgent one asking for it preempts it
    (SIGTERM within the stop grace, its reason naming the urgent run) and runs on that device."""
    c = start_cluster(tmp_path / "home", gpus=1, extra_args=["--mig", "0:1g.10gb*1"])
    term = 'trap "echo got SIGTERM; exit 0" TERM; echo "gpus $CUDA_VISIBLE_DEVICES"; while :; do sleep 0.2; done'
    try:
        with c.client() as cl:
            low = asking("mig-low", {"count": 1, "mig": "1g.10gb"})
            low["spec"]["priority"] = -10
            low["spec"]["task_template"]["args"] = ["-c", term]
            assert cl.post("/runs", json=low).status_code == 201
            c.wait_for(lambda: "gpus MIG-sim-0-0" in c.logs("mig-low-0"), 120, 0.5, "mig-low on the device")
            urgent = asking("mig-urgent", {"count": 1, "mig": "1g.10gb"})  # priority 0 (the workspace's most)
            assert cl.post("/runs", json=urgent).status_code == 201
        c.wait_for(lambda: c.run("mig-urgent")["status"]["state"] == "Running", 120, 0.5, "mig-urgent Running")
        line = c.wait_for(lambda: re.search(r"gpus \S+ mig \S+", c.logs("mig-urgent-0")), 60, 0.5, "its line")
        assert line.group(0) == "gpus MIG-sim-0-0 mig 1g.10gb"
        assert c.worker("mig-urgent-0")["gpu_indices"] == [0]
        assert "got SIGTERM" in c.logs("mig-low-0")  # the stop grace: SIGTERM first
        run = c.run("mig-low")
        assert (run["status"]["state"], run["status"]["reason"]) == (
            "Pending", "Preempted by higher-priority work (mig-urgent); waiting to run again")
        assert "Preempted by higher-priority work (mig-urgent)" in [h["reason"] for h in run["status"]["history"]]
        assert c.worker("mig-low-0")["preemptions"] == 1
        with c.client() as cl:
            events = cl.get("/events").json()["items"]
        assert any(e["kind"] == "Preempted" and e["object"] == "mig-low" for e in events)
        # The views: the worker's device in describe, the machine's devices (none free) in `machines`
        out = subprocess.run(["astra", "astraeus", "describe", "mig-urgent"], env=c.env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "Resources:" in out.stdout and "1 × MIG 1g.10gb, 0.05 CPU cores" in out.stdout
        assert re.search(r"mig-urgent-0\s+Running\s+0\s+0\s+gpu-01\s+1 × MIG 1g.10gb on GPU 0", out.stdout), out.stdout
        out = subprocess.run(["astra", "astraeus", "machines"], env=c.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "GPU 0: 1g.10gb 0/1 free" in out.stdout, out.stdout
    finally:
        c.stop()


def test_up_and_agent_refuse_mig_that_is_not_the_machines():
    r = CliRunner().invoke(astraeus_app, ["up", "--home", "/nonexistent-astraeus-home", "--gpus", "2",
                                          "--mig", "2:1g.10gb*7"])
    assert r.exit_code == 2
    assert "--mig 2:1g.10gb*7: '2:1g.10gb*7' names GPU 2, and the machine has 2 GPUs (indices 0-1)" in r.output
    r = CliRunner().invoke(astraeus_app, ["agent", "--server", "http://127.0.0.1:9", "--token", "t",
                                          "--gpus", "1", "--mig", "0:1g.10gb*8"])
    assert r.exit_code == 2
    assert "--mig 0:1g.10gb*8: GPU 0 has 8 compute slices of MIG devices (1g.10gb): a GPU has 7" in r.output
    r = CliRunner().invoke(astraeus_app, ["agent", "--server", "http://127.0.0.1:9", "--token", "t",
                                          "--gpus", "1", "--mig", "0:1g"])
    assert r.exit_code == 2
    assert "--mig 0:1g: '1g' is not a MIG profile" in r.output
