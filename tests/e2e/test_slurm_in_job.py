"""`srun` and `scontrol show hostnames` inside a batch job (issue 44): the POSIX sh programs every worker has first
on its PATH (astraeus.agent.slurm), run here with dash and busybox sh as real processes, the job's /etc/hosts
(rendezvous.hosts_file), and a batch script submitted with `astra slurm sbatch` to two machines with their own
addresses (`astraeus up --machines 2 --netns`) on both runtimes: it finds its head with `scontrol show hostnames
$SLURM_JOB_NODELIST | head -n1`, and `srun` starts two tasks on each machine that reach the head by that name."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from astraeus import rendezvous
from astraeus.agent.slurm import BIN
from tests.conftest import start_cluster
from tests.e2e.test_recipe import sh
from tests.runtimes import KINDS, container_skip_reason

SHELLS = [s for s in ("dash", "busybox") if shutil.which(s)] or ["sh"]  # the shells of minimal images
SRUN, SCONTROL = str(Path(BIN) / "srun"), str(Path(BIN) / "scontrol")


def run_sh(shell: str, prog: str, *args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    argv = ["busybox", "sh", prog, *args] if shell == "busybox" else [shell, prog, *args]
    return subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True, text=True,
                          timeout=30, cwd=cwd)


# ------------------------------------------------------------------ scontrol show hostnames

@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("hostlist,names", [
    ("gpu-[01-03,07],cpu1", ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "cpu1"]),
    ("gpu-01,gpu-02", ["gpu-01", "gpu-02"]),
    ("node[8-10]", ["node8", "node9", "node10"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("solo", ["solo"]),
])
def test_scontrol_show_hostnames_expands_a_hostlist(shell, hostlist, names):
    p = run_sh(shell, SCONTROL, "show", "hostnames", hostlist)
    assert p.returncode == 0 and p.stdout.splitlines() == names, p


@pytest.mark.parametrize("shell", SHELLS)
def test_scontrol_show_hostnames_reads_the_jobs_nodelist_and_hostlist_compresses_back(shell):
    p = run_sh(shell, SCONTROL, "show", "hostnames", env={"SLURM_JOB_NODELIST": "gpu-[01-02]"})
    assert p.returncode == 0 and p.stdout == "gpu-01\ngpu-02\n", p
    p = run_sh(shell, SCONTROL, "show", "hostlist", "a[1-2],b")
    assert p.returncode == 0 and p.stdout == "a[1-2],b\n", p


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("args,says", [
    (["show", "hostnames", "gpu-[01"], "bad hostlist 'gpu-[01': a '[' without its ']'"),
    (["show", "hostnames", "gpu-]"], "a ']' without its '['"),
    (["show", "hostnames", "n[3-1]"], "the range 3-1 goes down; write it low-high"),
    (["show", "hostnames", "n[a-b]"], "'a-b' is not a number or a range of numbers (01-03)"),
    (["show", "hostnames", "n[[1]]"], "brackets inside brackets"),
    (["show", "hostnames", "n[]"], "empty brackets"),
    (["show", "hostnames"], "no hostlist: give one (scontrol show hostnames gpu-[01-02]), or run it inside a job"),
    (["show", "job", "7"], "'scontrol show job 7' needs the control plane, and astra is not on this worker's PATH: "
                           "run 'astra slurm scontrol show job 7' where astra is set up"),
])
def test_scontrol_refuses_what_it_cannot_answer_and_says_what_to_write(shell, args, says):
    p = run_sh(shell, SCONTROL, *args)
    assert p.returncode == 1 and p.stdout == "" and p.stderr.startswith("scontrol: error: ") and says in p.stderr, p


# ------------------------------------------------------------------ srun: this machine's tasks of a step

TASK = 'echo "task $SLURM_PROCID local $SLURM_LOCALID step $SLURM_STEP_ID of $SLURM_NTASKS on $SLURM_NODEID"'


def job(tmp_path, **env) -> dict:
    return {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu-02",
            "TMPDIR": str(tmp_path), **env}


@pytest.mark.parametrize("shell", SHELLS)
def test_srun_runs_this_machines_tasks_with_their_ids(shell, tmp_path):
    # one task per machine by default: the second machine's is task 1
    p = run_sh(shell, SRUN, "sh", "-c", TASK, env=job(tmp_path))
    assert p.returncode == 0 and p.stdout == "task 1 local 0 step 0 of 2 on 1\n", p
    # the job's --ntasks-per-node (sbatch sets SLURM_NTASKS_PER_NODE): tasks 2 and 3 here, step 1 (the second srun)
    p = run_sh(shell, SRUN, "--kill-on-bad-exit=1", "--cpu-bind=none", "-K", "sh", "-c", TASK,
               env=job(tmp_path, SLURM_NTASKS_PER_NODE="2"))
    assert p.returncode == 0, p
    assert sorted(p.stdout.splitlines()) == ["task 2 local 0 step 1 of 4 on 1", "task 3 local 1 step 1 of 4 on 1"]
    # -n 3 on 2 machines: the first takes 2 (tasks 0, 1), the second 1 (task 2), as Slurm's block distribution
    p = run_sh(shell, SRUN, "-n3", "sh", "-c", TASK, env=job(tmp_path, SLURM_NODEID="0"))
    assert sorted(p.stdout.splitlines()) == ["task 0 local 0 step 2 of 3 on 0", "task 1 local 1 step 2 of 3 on 0"]
    p = run_sh(shell, SRUN, "--ntasks", "3", "sh", "-c", TASK, env=job(tmp_path))
    assert p.stdout == "task 2 local 0 step 3 of 3 on 1\n", p
    # -n 1: none of the step's tasks is on the second machine
    p = run_sh(shell, SRUN, "-n", "1", "sh", "-c", TASK, env=job(tmp_path))
    assert p.returncode == 0 and p.stdout == "", p


@pytest.mark.parametrize("shell", SHELLS)
def test_srun_label_prefixes_each_line_with_the_task_id(shell, tmp_path):
    p = run_sh(shell, SRUN, "-l", "--ntasks-per-node=2", "sh", "-c", 'echo one; echo two >&2',
               env=job(tmp_path))
    assert p.returncode == 0, p
    assert sorted(p.stdout.splitlines()) == ["2: one", "2: two", "3: one", "3: two"]


@pytest.mark.parametrize("shell", SHELLS)
def test_srun_waits_for_every_task_and_fails_when_one_fails(shell, tmp_path):
    p = run_sh(shell, SRUN, "--ntasks-per-node=3", "sh", "-c", 'sleep 0.$SLURM_LOCALID; exit $SLURM_LOCALID',
               env=job(tmp_path, SLURM_NODEID="0"))
    assert p.returncode == 2, p
    assert "srun: error: gpu-02: task 1: Exited with exit code 1" in p.stderr
    assert "srun: error: gpu-02: task 2: Exited with exit code 2" in p.stderr
    p = run_sh(shell, SRUN, "-D", str(tmp_path), "pwd", env=job(tmp_path))
    assert p.returncode == 0 and p.stdout == f"{tmp_path}\n", p


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("args,says", [
    (["--bogus", "x"], "unrecognized option '--bogus': inside an Astraeus job srun takes -n/--ntasks"),
    (["-n", "0", "x"], "-n needs a whole number of 1 or more, not '0' (e.g. -n 2)"),
    (["--ntasks-per-node=two", "x"], "--ntasks-per-node needs a whole number of 1 or more, not 'two'"),
    (["-N", "3", "true"], "-N 3: the job has 2 machine(s) (gpu-[01-02]); give -N 2 or fewer"),
    (["-n"], "-n needs a value"),
    ([], "no command: give the program to run, e.g. srun python train.py"),
    (["--pty", "bash"], "--pty: an interactive shell comes from outside the job: astra astraeus shell RUN"),
])
def test_srun_refuses_bad_lines_and_says_what_to_change(shell, tmp_path, args, says):
    p = run_sh(shell, SRUN, *args, env=job(tmp_path, SLURM_JOB_NODELIST="gpu-[01-02]"))
    assert p.returncode == 1 and p.stdout == "" and p.stderr.startswith("srun: error: ") and says in p.stderr, p


# ------------------------------------------------------------------ the job's /etc/hosts

def test_hosts_file_names_the_jobs_machines_at_their_workers_addresses():
    base = "127.0.0.1\tlocalhost\n10.0.0.5 gpu-02 stale\n# a comment naming gpu-01\n"
    out = rendezvous.hosts_file(base, ["gpu-01", "gpu-02", "gpu-01"], ["100.64.0.9", "100.64.1.3", "100.64.7.7"])
    assert out == ("127.0.0.1\tlocalhost\n# a comment naming gpu-01\n# the job's machines (Astraeus)\n"
                   "100.64.0.9\tgpu-01\n100.64.1.3\tgpu-02\n")


def test_a_worker_gets_the_jobs_hosts_only_in_a_multi_machine_job_without_its_own():
    from astraeus.agent.runtime.process import job_hosts

    gang = {"SLURM_JOB_NODELIST": "gpu-01,gpu-02", "ASTRAEUS_NODE_ADDRS": "100.64.0.9,100.64.1.3"}
    [hosts] = job_hosts(gang, [])
    assert hosts["mount_path"] == "/etc/hosts" and hosts["value"].endswith("100.64.0.9\tgpu-01\n100.64.1.3\tgpu-02\n")
    assert job_hosts(gang, [{"mount_path": "/etc/hosts", "value": "1.2.3.4 mine\n"}]) == []  # the run's own wins
    assert job_hosts({"SLURM_JOB_NODELIST": "gpu-01", "ASTRAEUS_NODE_ADDRS": "100.64.0.9"}, []) == []
    assert job_hosts({"SLURM_JOB_NODELIST": "gpu-01"}, []) == []


# ------------------------------------------------------------------ end to end: sbatch on two --netns machines

# Rank 0 (on the head) listens on $head:$MASTER_PORT (a bind that works only where $head is this worker's own
# address), every other task connects to $head and sends its id; each prints what it did.
TASK_PY = r'''
import os, socket, time
head, port, me = os.environ["HEAD"], int(os.environ["MASTER_PORT"]), os.environ["SLURM_PROCID"]
where = f"node {os.environ['SLURM_NODEID']} local {os.environ['SLURM_LOCALID']} step {os.environ['SLURM_STEP_ID']}"
if me == "0":
    s = socket.create_server((head, port))
    got = []
    while len(got) < int(os.environ["SLURM_NTASKS"]) - 1:
        c, _ = s.accept()
        got.append(c.recv(16).decode())
        c.close()
    print(f"task 0 ({where}) on {head} heard tasks {','.join(sorted(got))}", flush=True)
else:
    for _ in range(600):
        try:
            c = socket.create_connection((head, port), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    c.sendall(me.encode())
    c.close()
    print(f"task {me} ({where}) reached {head}", flush=True)
'''

SCRIPT = f"""#!/bin/bash
#SBATCH --job-name=srun-head
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=5
head=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
echo "node $SLURM_NODEID: head is $head; srun is $(command -v srun)"
cat > /tmp/task.py <<'EOF'
{TASK_PY}
EOF
HEAD=$head srun -l python3 /tmp/task.py
echo "node $SLURM_NODEID: srun exited $?"
"""


@pytest.fixture(params=KINDS)
def kind(request):
    if request.param == "container" and container_skip_reason():
        pytest.skip(container_skip_reason())
    return request.param


def test_srun_and_scontrol_in_a_batch_job_across_two_netns_machines(kind, request, tmp_path):
    from astraeus.fleet import netns

    why = netns.unavailable()
    if why:
        pytest.skip(f"--netns: {why}")
    from tests.runtimes import runtime_env

    containers = request.getfixturevalue("containers") if kind == "container" else None
    image = "python:3.11"
    if containers:
        from astraeus.agent.runtime.oci_images import ImageCache

        # pinned by digest: the machines' own network reaches no registry on the host's 127.0.0.1, and an image
        # pinned by digest and cached needs none (the session's cache holds it)
        digest = ImageCache(containers.cache_dir, insecure=[containers.registry]).pull(containers.image).digest
        image = f"{containers.image}@{digest}"
    fleet = start_cluster(tmp_path / "home", gpus=2, machines=2, extra_args=["--netns"],
                          env=runtime_env(kind, containers))
    try:
        (tmp_path / "job.sbatch").write_text(SCRIPT)
        out = sh(fleet, tmp_path, f"astra slurm sbatch --container-image={image} job.sbatch")
        assert out.splitlines()[-1] == "Submitted batch job srun-head", out
        run = fleet.wait_for(lambda: (x := fleet.run("srun-head"))["status"]["state"] in ("Completed", "Failed")
                             and x, 180, interval=0.5, what="the batch job to end")
        logs = {i: fleet.logs(f"srun-head-{i}") for i in (0, 1)}
        assert run["status"]["state"] == "Completed", (run["status"], logs)
        machines = [fleet.worker(f"srun-head-{i}")["machine"] for i in (0, 1)]
        assert sorted(machines) == ["gpu-01", "gpu-02"]
        head = machines[0]  # rank 0's machine: the first name of SLURM_JOB_NODELIST
        srun = "/opt/astraeus/bin/srun" if kind == "container" else f"{BIN}/srun"
        for i in (0, 1):
            assert f"node {i}: head is {head}; srun is {srun}" in logs[i], logs[i]
            assert f"node {i}: srun exited 0" in logs[i], logs[i]
        # -l labels; tasks 0 and 1 on the first machine, 2 and 3 on the second, all reached the head by name
        assert re.search(rf"^0: task 0 \(node 0 local 0 step 0\) on {head} heard tasks 1,2,3$", logs[0], re.M), logs
        assert f"1: task 1 (node 0 local 1 step 0) reached {head}" in logs[0], logs
        assert f"2: task 2 (node 1 local 0 step 0) reached {head}" in logs[1], logs
        assert f"3: task 3 (node 1 local 1 step 0) reached {head}" in logs[1], logs
    finally:
        fleet.stop()
