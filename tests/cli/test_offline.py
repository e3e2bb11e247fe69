"""The `astra` commands that need no server: argument handling, --dry-run, and errors before any request."""

import json
import socket

from typer.testing import CliRunner

from astraeus.cli.astra import app

TORCH = "import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep(300)"
runner = CliRunner()


def invoke(args, env=None, **kw):
    base = {"ASTRAEUS_API": "", "ASTRAEUS_TOKEN": "", "ASTRAEUS_CONFIG": "/nonexistent/astra.json"}
    base.update(env or {})
    return runner.invoke(app, args, env=base, **kw)


def test_run_passes_the_command_exactly():
    r = invoke(["astraeus", "run", "--name", "urgent-eval", "--image", "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime",
                "--gpus", "8", "--machines", "1", "--cpus", "4", "--mem", "16G", "--time", "20m", "--dry-run",
                "--", "python", "-c", TORCH])
    assert r.exit_code == 0, r.output
    spec = json.loads(r.stdout)
    tt = spec["spec"]["task_template"]
    assert tt["command"] == "python" and tt["args"] == ["-c", TORCH]
    assert tt["requested_resources"]["cpu_cores"] == 32
    assert tt["requested_resources"]["memory_bytes"] == 137438953472


def test_run_args_after_double_dash_are_not_options():
    r = invoke(["astraeus", "run", "--name", "a", "--image", "i", "--dry-run", "--", "train.py", "--name", "x",
                "--", "-f", "a b", "'q'", '"dq"', ""])
    assert r.exit_code == 0, r.output
    tt = json.loads(r.stdout)["spec"]["task_template"]
    assert [tt["command"], *tt["args"]] == ["train.py", "--name", "x", "--", "-f", "a b", "'q'", '"dq"', ""]
    assert json.loads(r.stdout)["metadata"]["name"] == "a"


def test_run_errors_are_one_line():
    r = invoke(["astraeus", "run", "--name", "a", "--image", "i", "--time", "20", "--", "true"])
    assert r.exit_code == 1
    assert r.stderr.strip().count("\n") == 0 and "--time '20'" in r.stderr and "Traceback" not in r.output


def test_run_f_with_options_is_refused(tmp_path):
    p = tmp_path / "s.json"
    p.write_text("{}")
    r = invoke(["astraeus", "run", "-f", str(p), "--gpus", "2"])
    assert r.exit_code == 1 and "-f submits the spec as it is" in r.stderr


def test_no_config():
    r = invoke(["astraeus", "runs"])
    assert r.exit_code == 1
    assert "run `astra login" in r.stderr and "ASTRAEUS_API" in r.stderr and "ASTRAEUS_TOKEN" in r.stderr


def test_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api/v1/o/acme/w/vision"
    for args in (["astraeus", "runs"], ["slurm", "squeue"], ["astraeus", "delete", "x"]):
        r = invoke(args, env={"ASTRAEUS_API": api, "ASTRAEUS_TOKEN": "t"})
        assert r.exit_code == 1, r.output
        assert f"cannot reach the Astraeus API at {api}: " in r.stderr
        assert "Traceback" not in r.output and r.stderr.count("\n") == 1


def test_bad_output_format():
    r = invoke(["astraeus", "runs", "-o", "xml"], env={"ASTRAEUS_API": "http://127.0.0.1:9", "ASTRAEUS_TOKEN": "t"})
    assert r.exit_code == 1 and "-o json" in r.stderr


SCRIPT = """#!/bin/bash
#SBATCH --container-image=pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime
#SBATCH --gres=gpu:8
python train.py "$@"
"""


def test_sbatch_dry_run(tmp_path):
    p = tmp_path / "finetune.sbatch"
    p.write_text(SCRIPT)
    r = invoke(["slurm", "sbatch", "--nice=100", "--dry-run", str(p), "--lr", "1e-4", "x y"])
    assert r.exit_code == 0, r.output
    spec = json.loads(r.stdout)
    assert spec["metadata"]["name"] == "finetune"
    assert spec["spec"]["priority"] == -100
    assert spec["spec"]["task_template"]["args"] == ["/astraeus/slurm/finetune.sbatch", "--lr", "1e-4", "x y"]
    assert spec["spec"]["task_template"]["configs"][0]["value"] == SCRIPT


def test_sbatch_refuses_unsupported_options_by_name(tmp_path):
    p = tmp_path / "a.sbatch"
    p.write_text(SCRIPT)
    r = invoke(["slurm", "sbatch", "--deadline=now", str(p)])
    assert r.exit_code == 1
    assert r.stderr.startswith("sbatch: option --deadline is not supported by astra slurm")
    p.write_text(SCRIPT.replace("#SBATCH --gres=gpu:8", "#SBATCH --nodelist=gpu-01"))
    r = invoke(["slurm", "sbatch", str(p)])
    assert r.exit_code == 1 and r.stderr.startswith("sbatch: option --nodelist is not supported by astra slurm")


def test_sbatch_missing_script():
    r = invoke(["slurm", "sbatch", "/nonexistent/job.sbatch"])
    assert r.exit_code == 1 and r.stderr.startswith("sbatch: error: Unable to open file /nonexistent/job.sbatch")


def test_sbatch_output_is_noted(tmp_path):
    p = tmp_path / "a.sbatch"
    p.write_text(SCRIPT)
    r = invoke(["slurm", "sbatch", "-o", "out.log", "--dry-run", str(p)])
    assert r.exit_code == 0
    assert "sbatch: note: --output ignored (out.log): Astraeus keeps each worker's output" in r.stderr


def test_sbatch_help():
    r = invoke(["slurm", "sbatch", "--help"])
    assert r.exit_code == 0 and "--container-image" in r.stdout
