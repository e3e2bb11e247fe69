"""Prove on a real NVIDIA machine that shared GPUs are enforced (issue 46), with a real control plane and agent.

    python examples/gpu_sharing/prove_mps_limits.py      # needs nvidia-cuda-mps-control, torch with CUDA, 1 GPU

It starts `astraeus up` (process runtime, one GPU) in a fresh home, submits two runs of `fraction: 0.5` on GPU 0:
"steady" allocates 0.3 of the GPU's memory and keeps running; "greedy" asks 0.8, past its MPS limit of 0.5. It
passes when greedy fails inside its own process (exit code 3, its log says the allocation was refused) while
steady goes on running, and the agent log shows the MPS control daemon started. Exit status 0: proven."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ASTRAEUS = Path(sys.executable).with_name("astraeus")


def run(name: str, ask: float, seconds: int) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "host", "command": sys.executable, "args": [str(HERE / "tenant.py"), str(ask), str(seconds)],
        "requested_resources": {"gpu_requests": {"count": 1, "fraction": 0.5}, "cpu_cores": 1}}}}


def main() -> int:
    if shutil.which("nvidia-cuda-mps-control") is None:
        print("nvidia-cuda-mps-control not found: this proof needs an NVIDIA machine with CUDA MPS")
        return 2
    home = Path(tempfile.mkdtemp(prefix="astraeus-mps-"))
    up = subprocess.Popen([str(ASTRAEUS), "up", "--home", str(home), "--runtime", "process"],
                          stdout=open(home / "up.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(600):
            if (home / "env").exists() and "API=" in (home / "env").read_text():
                break
            time.sleep(0.1)
        env = dict(line.removeprefix("export ").split("=", 1) for line in (home / "env").read_text().splitlines()
                   if "=" in line)
        c = httpx.Client(base_url=env["API"], headers={"Authorization": f"Bearer {env['ASTRAEUS_TOKEN']}"}, timeout=30)
        for body in (run("steady", 0.3, 90), run("greedy", 0.8, 90)):
            r = c.post("/runs", json=body)
            assert r.status_code == 201, r.text
        deadline = time.time() + 180
        while time.time() < deadline:
            greedy, steady = c.get("/runs/greedy").json(), c.get("/runs/steady").json()
            if greedy["status"]["state"] in ("Failed", "Completed"):
                break
            time.sleep(1)
        g_log, s_log = c.get("/workers/greedy-0/logs").text, c.get("/workers/steady-0/logs").text
        time.sleep(5)
        steady = c.get("/runs/steady").json()
        agent_log = "".join(p.read_text() for p in home.glob("agent-*.log"))
        print(json.dumps({"greedy": greedy["status"], "steady": steady["status"]["state"]}, indent=2))
        print("greedy's log:\n" + g_log[-2000:])
        print("steady's log:\n" + s_log[-1000:])
        ok = (greedy["status"]["state"] == "Failed" and "allocation refused inside this process" in g_log
              and steady["status"]["state"] == "Running" and "tenant: alive" in s_log
              and "MPS control daemon started" in agent_log)
        print("PROVEN: the tenant past its limit failed in its own process; the other kept running" if ok
              else "NOT PROVEN: see the states and logs above")
        return 0 if ok else 1
    finally:
        up.terminate()
        up.wait(60)


if __name__ == "__main__":
    sys.exit(main())
