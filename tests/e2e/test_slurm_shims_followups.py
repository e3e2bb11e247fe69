"""The in-job Slurm shims' follow-ups (issue 44): `scontrol show hostlist` compresses names back into Slurm's
ranges, and `srun`s started at once in one worker get distinct step ids. Run with dash and busybox sh as real
processes, as tests/e2e/test_slurm_in_job.py does."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.test_slurm_in_job import SCONTROL, SHELLS, SRUN, TASK, job, run_sh


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("names,hostlist", [
    ("a1,a2,a3,b", "a[1-3],b"),
    ("a[1-2],b", "a[1-2],b"),
    ("gpu-01,gpu-02,gpu-03,gpu-07,cpu1", "gpu-[01-03,07],cpu1"),
    ("a9,a10,a12", "a[9-10,12]"),
    ("a1,b1,a2", "a1,b1,a2"),  # the order is kept: only neighbours share brackets
    ("a01,a1,a2", "a01,a[1-2]"),  # a zero-padded number keeps its width
    ("head", "head"),
])
def test_scontrol_show_hostlist_compresses_names_into_ranges(shell, names, hostlist):
    p = run_sh(shell, SCONTROL, "show", "hostlist", names)
    assert p.returncode == 0 and p.stdout == f"{hostlist}\n", p
    # and back: the hostlist expands to the same names
    back = run_sh(shell, SCONTROL, "show", "hostnames", p.stdout.strip())
    assert back.stdout.split() == run_sh(shell, SCONTROL, "show", "hostnames", names).stdout.split()


@pytest.mark.parametrize("shell", SHELLS)
def test_scontrol_show_hostlistsorted_sorts_and_drops_repeats(shell):
    p = run_sh(shell, SCONTROL, "show", "hostlistsorted", "b,a3,a1,a2,a2")
    assert p.returncode == 0 and p.stdout == "a[1-3],b\n", p


@pytest.mark.parametrize("shell", SHELLS)
def test_sruns_started_at_once_get_distinct_step_ids(shell, tmp_path):
    env = {"PATH": "/usr/bin:/bin", **job(tmp_path, SLURM_NNODES="1", SLURM_NODEID="0")}
    argv = (["busybox", "sh"] if shell == "busybox" else [shell]) + [SRUN, "sh", "-c", TASK]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = [p.communicate(timeout=30) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    steps = sorted(int(out.split()[5]) for out, _ in outs)
    assert steps == [0, 1, 2, 3, 4, 5], outs
    # the next srun goes on counting
    p = run_sh(shell, SRUN, "sh", "-c", TASK, env=job(tmp_path, SLURM_NNODES="1", SLURM_NODEID="0"))
    assert p.stdout == "task 0 local 0 step 6 of 1 on 0\n", p
