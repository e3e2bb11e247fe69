"""`astra astraeus run --what-if` and `astra slurm sbatch --test-only` (issue 18) as a subprocess against a real local
cluster (one machine gpu-01 with 8 simulated GPUs, the process runtime): the answer printed, nothing submitted,
refusals as a submit prints them."""

from __future__ import annotations

import pytest

from tests.cli.test_commands import astra, cleanup, ok, one_line_error, state

SCRIPT = "#!/bin/bash\n#SBATCH --container-image=python:3.11\n#SBATCH -J probe\nsleep 600\n"


@pytest.fixture
def c(shared_cluster):
    return shared_cluster


def runs(c) -> list[str]:
    with c.client() as h:
        return [r["metadata"]["name"] for r in h.get("/runs").json()["items"]]


def test_run_what_if_prints_where_it_starts_and_submits_nothing(c):
    out = ok(astra(c, "astraeus", "run", "--what-if", "--name", "probe", "--image", "python:3.11", "--gpus", "2",
                   "--", "sleep", "600"))
    assert out.splitlines()[0] == "Starts now on gpu-01 (GPUs 0,1)", out
    assert "  probe-0 on gpu-01 (GPUs 0,1)" in out.splitlines()
    assert "probe" not in runs(c)


def test_run_what_if_names_the_victims_and_a_refusal_is_the_submits(c, tmp_path):
    assert ok(astra(c, "astraeus", "run", "--name", "low", "--image", "python:3.11", "--gpus", "8", "--", "sleep",
                    "600"))
    c.wait_for(lambda: state(c, "low") == "Running", 30, what="low to run")
    # a run of priority 0 cannot preempt low (priority 0 too): it would be the head and wait for low to end
    out = ok(astra(c, "astraeus", "run", "--what-if", "--name", "next", "--image", "python:3.11", "--gpus", "8",
                   "--", "sleep", "1"))
    assert out.startswith("Would be next to run: "), out
    assert "Reason: Next to run (priority 0)" in out
    spec = tmp_path / "urgent.json"
    spec.write_text('{"metadata": {"name": "urgent"}, "spec": {"priority": 60, "task_template": {"image": '
                    '"python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 8}}}}}')
    err = one_line_error(astra(c, "astraeus", "run", "--what-if", "-f", str(spec)))
    assert err.startswith("error: 403 PRIORITY_NOT_ALLOWED: priority 60 is above namespace"), err
    assert "urgent" not in runs(c) and "next" not in runs(c)
    cleanup(c, "low")


def test_sbatch_test_only_prints_as_slurm_does(c, tmp_path):
    script = tmp_path / "probe.sbatch"
    script.write_text(SCRIPT)
    r = astra(c, "slurm", "sbatch", "--test-only", "--gres=gpu:2", "-c", "4", str(script))
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip()
    assert line.startswith("sbatch: Job probe to start at 20"), line
    assert line.endswith(" using 4 processors on nodes gpu-01 in partition main"), line
    assert "probe" not in runs(c)
    # a GPU type no machine has: it would fail at once (or never fit): exit 1 with the reason
    r = astra(c, "slurm", "sbatch", "--test-only", "--gres=gpu:nosuchgpu:1", str(script))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("sbatch: Job probe would not start: "), r.stderr
    # a refusal is the submit's
    r = astra(c, "slurm", "sbatch", "--test-only", "--nice=-60", str(script))
    assert r.returncode == 1 and r.stderr.startswith(
        "sbatch: error: Batch job submission failed: 403 PRIORITY_NOT_ALLOWED"), r.stderr
    assert "probe" not in runs(c)


def test_what_if_text_lists_placements_victims_and_why_not_lines():
    from astraeus.cli import format as fmt

    answer = {"outcome": "Preempts", "message": "Would preempt 2 worker(s) (train-0, a job in another namespace) and "
                                                "start by 2026-12-01 10:00 UTC",
              "reason": "Preempting 2 lower-priority worker(s) of train to start", "placements": [],
              "preempts": ["train-0", "a job in another namespace"],
              "why_not": {"urgent-0": [{"machine": "gpu-01", "reason": "machine is reserved for another namespace"}]}}
    assert fmt.what_if(answer).splitlines() == [
        "Would preempt 2 worker(s) (train-0, a job in another namespace) and start by 2026-12-01 10:00 UTC",
        "Reason: Preempting 2 lower-priority worker(s) of train to start",
        "Would preempt: train-0, a job in another namespace",
        "Why not:",
        "  urgent-0 gpu-01: machine is reserved for another namespace",
    ]
