"""`astra slurm srun`, `salloc` and `sbatch --wait/--parsable` against a real local cluster (`astraeus up`,
process runtime): exit codes passed through, output streamed, the runs srun and salloc make deleted afterwards,
refusals in one line. The interactive ones (srun --pty, salloc with srun inside) run on both runtimes
(tests/runtimes.py: the container variant in the python test image, through `runc exec`)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.cli.test_commands import ASTRA, _gone, astra, ok, one_line_error, state
from tests.conftest import start_cluster
from tests.runtimes import KINDS, container_skip_reason, runtime_env

pytestmark = pytest.mark.timeout(240)
IMG = "--container-image=busybox"


@pytest.fixture
def c(shared_cluster):
    return shared_cluster


@pytest.fixture(scope="module")
def container_cluster(tmp_path_factory, request):
    """One container-runtime cluster for the module's container variants, and its `--container-image=` option."""
    if (why := container_skip_reason()) is not None:
        pytest.skip(why)
    containers = request.getfixturevalue("containers")
    cluster = start_cluster(tmp_path_factory.mktemp("slurm-container") / "home", stop_grace=1.0,
                            env=runtime_env("container", containers))
    try:
        yield cluster, f"--container-image={containers.image}"
    finally:
        cluster.stop()


@pytest.fixture(params=KINDS)
def ci(request):
    """Each runtime's cluster in turn, with the image option its runs name."""
    if request.param == "process":
        return request.getfixturevalue("shared_cluster"), IMG
    return request.getfixturevalue("container_cluster")


def _env(c) -> dict:
    """The cluster's environment with astra on PATH (salloc's shell runs `astra slurm srun`)."""
    e = dict(c.env)
    e["PATH"] = os.path.dirname(ASTRA) + os.pathsep + e.get("PATH", os.environ.get("PATH", ""))
    e.pop("SLURM_JOB_ID", None)
    return e


def test_sbatch_wait_and_parsable_exit_with_the_jobs_code(c):
    r = astra(c, "slurm", "sbatch", "--parsable", "-W", "-J", "waited", IMG, "--wrap", "echo hi; exit 3",
              timeout=120)
    try:
        assert r.returncode == 3, r
        assert r.stdout == f"{c.run('waited')['metadata']['job_id']}\n", r  # the numeric job id, as Slurm prints
        assert state(c, "waited") == "Failed"
    finally:
        with c.client() as h:
            h.delete("/runs/waited")
    r = astra(c, "slurm", "sbatch", "--wait", "-J", "waited-ok", IMG, "--wrap", "true", timeout=120)
    try:
        assert ok(r) == "Submitted batch job waited-ok\n"
    finally:
        with c.client() as h:
            h.delete("/runs/waited-ok")


def test_srun_streams_output_and_exits_with_the_commands_code(c):
    r = astra(c, "slurm", "srun", "-J", "oneoff", IMG, "-t", "5", "sh", "-c", "echo out-line; echo err-line >&2; exit 5",
              timeout=120)
    assert r.returncode == 5, r
    assert "out-line" in r.stdout and "err-line" in r.stdout, r  # the worker's log holds both streams
    c.wait_for(lambda: _gone(c, "oneoff"), timeout=30, what="oneoff deleted")


def test_srun_refuses_a_bad_option_in_one_line(c):
    err = one_line_error(astra(c, "slurm", "srun", "--bogus-opt", "echo"))
    assert "srun" in err and "--bogus-opt" in err and "not supported" in err
    err = one_line_error(astra(c, "slurm", "srun", "--array=1-3", IMG, "echo"))
    assert err == "srun: error: --array is not supported by astra slurm srun: use astra slurm sbatch for it"
    err = one_line_error(astra(c, "slurm", "srun", IMG))
    assert err.startswith("srun: error: give a command")
    err = one_line_error(astra(c, "slurm", "salloc", "-N", "zero"))
    assert err.startswith("salloc: error: invalid --nodes='zero'")


def test_srun_ctrl_c_deletes_the_run(c):
    p = subprocess.Popen([ASTRA, "slurm", "srun", "-J", "interrupted", IMG, "sh", "-c", "echo started; sleep 300"],
                         env=_env(c), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "started\n"
        p.send_signal(signal.SIGINT)
        assert p.wait(60) == 130
        assert "deleting job interrupted" in p.stderr.read()
        c.wait_for(lambda: _gone(c, "interrupted"), timeout=30, what="interrupted deleted")
    finally:
        if p.poll() is None:
            p.kill()


def test_srun_pty_bash_opens_a_shell_in_the_job_and_deletes_it(ci):
    pexpect = pytest.importorskip("pexpect")
    c, img = ci
    child = pexpect.spawn(ASTRA, ["slurm", "srun", "-J", "ptyjob", img, "--pty", "bash"], env=_env(c), timeout=60,
                          encoding="utf-8")
    child.expect(r"[$#] ")  # the prompt (a container's shell runs as its image's user, root)
    child.sendline("echo worker=$ASTRAEUS_WORKER_NAME; tty")
    child.expect("worker=ptyjob-0")
    child.expect(r"/dev/pts/\d+")
    child.sendline("exit 4")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 4
    c.wait_for(lambda: _gone(c, "ptyjob"), timeout=30, what="ptyjob deleted")


def test_salloc_runs_its_command_and_srun_inside_uses_the_allocation(ci):
    c, img = ci
    inner = ("echo job=$SLURM_JOB_ID nodes=$SLURM_NNODES; "
             "astra slurm srun sh -c 'echo in-$ASTRAEUS_WORKER_NAME; exit 6'; echo inner=$?; exit 2")
    r = subprocess.run([ASTRA, "slurm", "salloc", "-J", "alloc1", img, "sh", "-c", inner], env=_env(c),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    assert "job=alloc1 nodes=1" in r.stdout and "in-alloc1-0" in r.stdout and "inner=6" in r.stdout, r
    assert "salloc: Granted job allocation alloc1" in r.stderr, r
    assert "salloc: Relinquishing job allocation alloc1" in r.stderr, r
    c.wait_for(lambda: _gone(c, "alloc1"), timeout=30, what="alloc1 deleted")


def test_salloc_interactive_shell_and_srun_pty_inside(ci):
    pexpect = pytest.importorskip("pexpect")
    c, img = ci
    env = dict(_env(c), SHELL="/bin/sh", PS1="local$ ")
    child = pexpect.spawn(ASTRA, ["slurm", "salloc", "-J", "alloc2", img], env=env, timeout=60, encoding="utf-8")
    child.expect("salloc: Granted job allocation alloc2")
    child.expect(r"local\$ ")
    child.sendline("astra slurm srun sh -c 'echo on-$ASTRAEUS_WORKER_NAME'; echo rc=$?")
    child.expect("on-alloc2-0")
    child.expect("rc=0")
    child.expect(r"local\$ ")
    child.sendline("astra slurm srun --pty bash")
    child.expect(r"[$#] ")
    child.sendline("echo remote=$ASTRAEUS_WORKER_NAME; exit 7")
    child.expect("remote=alloc2-0")
    child.expect(r"local\$ ")
    child.sendline("echo back=$?")
    child.expect("back=7")
    assert state(c, "alloc2") == "Running"
    child.sendline("exit 3")
    child.expect("salloc: Relinquishing job allocation alloc2")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3
    c.wait_for(lambda: _gone(c, "alloc2"), timeout=30, what="alloc2 deleted")
