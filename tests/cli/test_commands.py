"""`astra` as a subprocess against a real local cluster (`astraeus up`: one machine gpu-01 with 8 GPUs).

Every command of the pages and the issue, with the lines they print."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ASTRA = str(Path(sys.executable).parent / "astra")
TORCH = "import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep(300)"
IMAGE = "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime"


def astra(cluster, *args: str, env: dict | None = None, timeout: float = 60, cwd=None) -> subprocess.CompletedProcess:
    e = dict(cluster.env)
    e.update(env or {})
    return subprocess.run([ASTRA, *args], env=e, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"rc={r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, f"rc={r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


def state(cluster, run: str) -> str:
    return cluster.run(run).get("status", {}).get("state")


def cleanup(cluster, *runs: str) -> None:
    with cluster.client() as c:
        for name in runs:
            c.delete(f"/runs/{name}")
    cluster.wait_for(lambda: all(_gone(cluster, n) for n in runs), timeout=30, what="runs deleted")


def _gone(cluster, name: str) -> bool:
    with cluster.client() as c:
        return c.get(f"/runs/{name}").status_code == 404


@pytest.fixture
def c(shared_cluster):
    return shared_cluster


def test_run_the_page_command(c):
    r = astra(c, "astraeus", "run", "--name", "urgent-eval", "--image", IMAGE, "--gpus", "8", "--machines", "1",
              "--cpus", "4", "--mem", "16G", "--time", "20m", "--", "python", "-c", TORCH)
    run = c.run("urgent-eval")
    try:
        url = run["status"]["console_url"]
        assert url.endswith("/o/acme/w/vision/jobs/main/urgent-eval")
        assert ok(r) == f"urgent-eval submitted to main: {url}\n"
        tt = run["spec"]["task_template"]
        assert run["spec"]["start"] == "Independent"
        assert (tt["command"], tt["args"]) == ("python", ["-c", TORCH])
        assert tt["restart_policy"] == "Never" and tt["time_limit_seconds"] == 1200
        rr = tt["requested_resources"]
        assert (rr["cpu_cores"], rr["memory_bytes"], rr["gpu_requests"]["count"], rr["machines"]) == (
            32, 137438953472, 8, 1)

        c.wait_for(lambda: state(c, "urgent-eval") == "Running", what="urgent-eval running")
        assert ok(astra(c, "astraeus", "runs")) == (
            "NAME                          CLUSTER       STATE       REASON\n"
            "urgent-eval                   main          Running     1 of 1 workers running\n")
        # torch here sees no CUDA device; what matters is that the one-liner ran as written.
        c.wait_for(lambda: re.fullmatch(r"\d+ GPUs\n", ok(astra(c, "astraeus", "logs", "urgent-eval-0"))),
                   timeout=90, interval=0.5, what="the torch one-liner's line")

        out = ok(astra(c, "astraeus", "describe", "urgent-eval"))
        assert f"Image:          {IMAGE}\n" in out
        assert "Environment:    " in out
        assert "Resources:      8 GPUs, 32 CPU cores, 128 GiB memory, 1 machine\n" in out
        assert "Time limit:     20m\n" in out
        assert re.search(r"urgent-eval-0\s+Running\s+0\s+0\s+gpu-01\s+0-7\s", out)
        assert "History:" in out and "Submitted" in out

        events = ok(astra(c, "astraeus", "events"))
        assert events.startswith("TIME") and re.search(r"RunSubmitted\s+urgent-eval\s", events)
        machines = ok(astra(c, "astraeus", "machines")).splitlines()
        assert machines[0].split() == ["NAME", "CLUSTER", "STATE", "POOLS", "GPUS", "GPUS", "USED", "GPUS", "FREE",
                                       "CPUS", "MEMORY", "RUNTIME", "ADDRESS", "SHARED", "FS"]
        assert machines[1].split()[:7] == ["gpu-01", "main", "Ready", "-", "8", "8", "0"]
        # the agent's address: the source of its route to the control plane (here, loopback)
        assert re.search(r"\s(process|container \(runc [0-9.]+\))\s+127\.0\.0\.1$", machines[1]), machines[1]

        data = json.loads(ok(astra(c, "astraeus", "runs", "-o", "json")))
        assert [x["metadata"]["name"] for x in data["items"]] == ["urgent-eval"]
    finally:
        r = astra(c, "astraeus", "delete", "urgent-eval")
    assert ok(r) == "urgent-eval deleted\n"
    # The workers stop (SIGTERM, the stop grace) and the GPUs are free again.
    c.wait_for(lambda: ok(astra(c, "astraeus", "machines")).splitlines()[1].split()[:7] == [
        "gpu-01", "main", "Ready", "-", "8", "0", "8"], what="GPUs free again")


def test_run_logs_tail_and_follow(c):
    ok(astra(c, "astraeus", "run", "--name", "eight", "--image", IMAGE, "--gpus", "8", "--cpus", "1", "--mem", "1G",
             "--", "python", "-c", "import time;print(8,'GPUs');time.sleep(300)"))
    ok(astra(c, "astraeus", "run", "--name", "lines", "--image", IMAGE, "--", "python", "-c",
             "import time\nfor i in range(5):\n    print('line', i, flush=True); time.sleep(0.3)"))
    try:
        c.wait_for(lambda: ok(astra(c, "astraeus", "logs", "eight-0")) == "8 GPUs\n", timeout=60, interval=0.5,
                   what="8 GPUs")
        # -f streams until the worker has ended; --tail keeps the last lines.
        r = astra(c, "astraeus", "logs", "lines-0", "-f", timeout=60)
        assert ok(r) == "".join(f"line {i}\n" for i in range(5))
        assert state(c, "lines") == "Completed"
        assert ok(astra(c, "astraeus", "logs", "lines-0", "--tail", "2")) == "line 3\nline 4\n"
        assert ok(astra(c, "astraeus", "logs", "lines", "--tail", "1")) == "line 4\n"  # a one-worker run's name
        stamped = ok(astra(c, "astraeus", "logs", "lines-0", "--tail", "1", "--timestamps"))
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\S+ line 4\n", stamped)
        assert "Completed   1 of 1 workers succeeded" in ok(astra(c, "astraeus", "runs"))
    finally:
        assert ok(astra(c, "astraeus", "delete", "eight", "lines")) == "eight deleted\nlines deleted\n"


def test_describe_says_why_a_worker_waits(c):
    ok(astra(c, "astraeus", "run", "--name", "hold", "--image", IMAGE, "--gpus", "8", "--", "sleep", "300"))
    ok(astra(c, "astraeus", "run", "--name", "waiter", "--image", IMAGE, "--gpus", "4", "--", "sleep", "300"))
    try:
        c.wait_for(lambda: c.run("waiter")["status"]["workers"][0].get("why_not"), what="why_not")
        out = ok(astra(c, "astraeus", "describe", "waiter"))
        assert "State:          Pending\n" in out
        assert re.search(r"\nWhy it is not running yet \(waiter-0\):\n  gpu-01: .*GPUs", out), out
        runs = ok(astra(c, "astraeus", "runs")).splitlines()
        assert runs[1].startswith("waiter                        main          Pending     ")
    finally:
        cleanup(c, "hold", "waiter")


FINETUNE = f"""#!/bin/bash
#SBATCH --container-image={IMAGE}
#SBATCH --gres=gpu:8
#SBATCH --time=00:20:00
#SBATCH --output=finetune-%j.out
echo "job $SLURM_JOB_NAME on $ASTRAEUS_GPU_COUNT GPUs, args: $# $*"
sleep 300
#SBATCH --time=1
"""


def test_sbatch_squeue_scancel(c, tmp_path):
    (tmp_path / "finetune.sbatch").write_text(FINETUNE)
    r = astra(c, "slurm", "sbatch", "--nice=100", "finetune.sbatch", "a b", "--c", cwd=tmp_path)
    try:
        assert ok(r) == "Submitted batch job finetune\n"
        assert "sbatch: note: --output ignored" in r.stderr
        run = c.run("finetune")
        assert run["spec"]["priority"] == -100
        assert run["spec"]["task_template"]["time_limit_seconds"] == 1200
        c.wait_for(lambda: ok(astra(c, "astraeus", "logs", "finetune-0")) ==
                   "job finetune on 8 GPUs, args: 2 a b --c\n", timeout=60, interval=0.5, what="the script's line")

        out = ok(astra(c, "slurm", "squeue")).splitlines()
        assert out[0] == "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
        assert re.fullmatch(r" {10}finetune {6}main finetune {4}admin  R +\d+:\d\d {6}1 gpu-01", out[1]), out[1]

        # Asking for more than the workspace's maximum priority (0): the server's 403, one line, exit 1.
        r = astra(c, "slurm", "sbatch", "--nice=-60", "-J", "too-high", "finetune.sbatch", cwd=tmp_path)
        err = one_line_error(r)
        assert re.fullmatch(r"sbatch: error: Batch job submission failed: 403 PRIORITY_NOT_ALLOWED: "
                            r"priority 60 is above namespace ws-[0-9a-f]+'s maximum of 0", err), err

        # A second job of lower priority (it preempts nothing) waits: squeue gives the reason in parentheses.
        ok(astra(c, "slurm", "sbatch", "-J", "second", "--nice=200", "--gres=gpu:1", "finetune.sbatch", cwd=tmp_path))
        c.wait_for(lambda: "(" in ok(astra(c, "slurm", "squeue", "-j", "second")), what="second pending")
        line = ok(astra(c, "slurm", "squeue", "-j", "second")).splitlines()[1]
        assert re.fullmatch(r" +second +main +second +admin PD +0:00 +1 \(Next to run \(priority -200\): starts by "
                            r"\d{4}-\d\d-\d\d \d\d:\d\d UTC as running work ends\)", line), line
        assert ok(astra(c, "slurm", "squeue", "-t", "PD")).count("\n") == 2

        assert ok(astra(c, "slurm", "scancel", "finetune", "second")) == ""
        # CG while the workers stop (the stop grace), then gone.
        sq = ok(astra(c, "slurm", "squeue"))
        assert re.search(r" finetune +admin +(CG|CA) ", sq) or _gone(c, "finetune"), sq
        c.wait_for(lambda: "finetune" not in ok(astra(c, "slurm", "squeue")), what="finetune gone")
        err = one_line_error(astra(c, "slurm", "scancel", "finetune"))
        assert err == "scancel: error: Kill job error on job id finetune: Invalid job id specified"
    finally:
        with c.client() as h:
            for name in ("finetune", "second", "too-high"):
                h.delete(f"/runs/{name}")


def test_unsupported_sbatch_option_is_refused(c, tmp_path):
    (tmp_path / "job.sbatch").write_text(FINETUNE)
    err = one_line_error(astra(c, "slurm", "sbatch", "--deadline=now", "job.sbatch", cwd=tmp_path))
    assert err.startswith("sbatch: option --deadline is not supported by astra slurm: give a --time limit instead")
    assert _gone(c, "job")


def test_drives(c, tmp_path):
    drive = {"metadata": {"name": "ft-ckpt"},
             "spec": {"sources": [{"node": "gpu-01", "path": "/data/astraeus/ft-ckpt", "mount_path": "/ckpt",
                                   "mode": "ReadWrite"}], "transport": "Auto", "permissions": {"create": True}}}
    (tmp_path / "drive.json").write_text(json.dumps(drive))
    assert ok(astra(c, "astraeus", "drives", "create", "-f", "drive.json", cwd=tmp_path)) == "ft-ckpt created\n"
    out = ok(astra(c, "astraeus", "drives", "list")).splitlines()
    assert out[0].split() == ["NAME", "MOUNT", "MODE", "TRANSPORT", "STATE", "SOURCES"]
    assert out[1].split() == ["ft-ckpt", "/ckpt", "ReadWrite", "Auto", "Ready", "gpu-01:/data/astraeus/ft-ckpt"]
    assert json.loads(ok(astra(c, "astraeus", "drives", "list", "-o", "json")))["items"][0]["metadata"]["name"] == \
        "ft-ckpt"
    err = one_line_error(astra(c, "astraeus", "drives", "create", "-f", "drive.json", cwd=tmp_path))
    assert err.startswith("error: 409")
    assert ok(astra(c, "astraeus", "drives", "delete", "ft-ckpt")) == "ft-ckpt deleted\n"
    assert ok(astra(c, "astraeus", "drives", "list")).count("\n") == 1


def test_errors_are_one_line(c):
    err = one_line_error(astra(c, "astraeus", "describe", "nope"))
    assert err.startswith("error: 404 ") and "nope" in err
    err = one_line_error(astra(c, "astraeus", "runs", env={"ASTRAEUS_TOKEN": "ast_u_bogus"}))
    assert err.startswith("error: 401 ") and "astra login" in err
    err = one_line_error(astra(c, "astraeus", "run", "--name", "Bad_Name", "--image", IMAGE, "--", "true"))
    assert err.startswith("error: 422 INVALID: metadata.name: ")
    err = one_line_error(astra(c, "astraeus", "run", "--name", "x", "--image", IMAGE, "--mem", "lots", "--", "true"))
    assert "--mem 'lots'" in err
    api = c.api.replace(f":{c.port}/", ":9/")
    err = one_line_error(astra(c, "astraeus", "runs", env={"ASTRAEUS_API": api}))
    assert err.startswith(f"error: cannot reach the Astraeus API at {api}: ")
    err = one_line_error(astra(c, "astraeus", "runs", env={"ASTRAEUS_API": "", "ASTRAEUS_TOKEN": ""}))
    assert "astra login" in err and "ASTRAEUS_API" in err


def test_login_then_commands_use_the_saved_config(c, tmp_path):
    env = {"ASTRAEUS_API": "", "ASTRAEUS_TOKEN": "", "ASTRAEUS_CONFIG": str(tmp_path / "cfg" / "config.json")}
    out = ok(astra(c, "login", "--api", c.api, "--token", c.token, env=env))
    assert out.startswith("Logged in to workspace vision (acme) as ")
    saved = json.loads((tmp_path / "cfg" / "config.json").read_text())
    assert saved == {"api": c.api, "token": c.token}
    assert ok(astra(c, "astraeus", "runs", env=env)).startswith("NAME")
    err = one_line_error(astra(c, "login", "--api", c.api, "--token", "ast_u_bogus",
                               env={**env, "ASTRAEUS_CONFIG": str(tmp_path / "other.json")}))
    assert err.startswith("error: 401 ")
    assert not (tmp_path / "other.json").exists()


def test_runs_watch_refreshes(c):
    p = subprocess.Popen([ASTRA, "astraeus", "runs", "--watch", "--interval", "0.2"], env=c.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        ok(astra(c, "astraeus", "run", "--name", "watched", "--image", IMAGE, "--", "sleep", "300"))
        c.wait_for(lambda: state(c, "watched") == "Running", what="watched running")
        time.sleep(1.0)
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=10)
        cleanup(c, "watched")
    assert out.startswith("NAME                          CLUSTER       STATE       REASON\n")
    assert "watched                       main          Running     1 of 1 workers running" in out
