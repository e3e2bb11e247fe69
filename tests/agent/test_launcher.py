"""The shim launcher (astraeus.agent.runtime.launcher): shims forked by a pre-started process are the same as shims
started with an interpreter of their own (environment as the agent finds them, detached, adoptable), and the
runtime falls back to starting them the old way whenever the launcher cannot."""

from __future__ import annotations

import os
import shutil

from astraeus.agent.runtime import launcher as launcher_mod
from astraeus.agent.runtime.base import EXITED, RUNNING
from astraeus.agent.runtime.process import ProcessRuntime, _environ
from tests.agent.conftest import pid_alive, started, wait_for

LONG = "import time\nwhile True: time.sleep(0.1)\n"


def _shim_pid(rt: ProcessRuntime, worker: str) -> int:
    import json

    with open(os.path.join(rt.dir(worker, 1), "shim.json")) as f:
        return json.load(f)["shim_pid"]


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def _env(pid: int) -> dict[str, str]:
    return dict(item.decode().split("=", 1) for item in _environ(pid) if b"=" in item)


def test_a_launched_shim_looks_to_the_agent_as_a_started_one(tmp_path, make_rt, assignment, monkeypatch):
    monkeypatch.setenv("ASTRAEUS_NATIVE_SHIM", "0")  # the Python shim, forked (the C one: test_native_shim.py)
    rt = make_rt(tmp_path / "state")
    assert rt.launcher is not None
    a = assignment(LONG)
    st = started(rt, a)
    assert st.state == RUNNING
    shim = _shim_pid(rt, a["worker"])
    assert launcher_mod.LAUNCHER_MODULE in _cmdline(shim)  # forked by the launcher, no interpreter of its own
    env = _env(shim)
    assert env["ASTRAEUS_SHIM_OWNER"] == rt.owner  # what adopt() looks for in /proc/PID/environ
    assert env["ASTRAEUS_SHIM_ID"] == os.path.basename(rt.dir(a["worker"], 1))
    assert env["ASTRAEUS_SHIM_DIR"] == rt.dir(a["worker"], 1)
    assert launcher_mod.SLOT_VAR not in env
    # its own session, the launcher's own child (no double fork: one Python fork and exit less per worker)
    assert os.getsid(shim) == shim
    assert psutil_ppid(shim) == rt.launcher.proc.pid
    # the launcher's pipes to the agent are not held by the shim
    fds = {os.readlink(f"/proc/{shim}/fd/{fd}") for fd in os.listdir(f"/proc/{shim}/fd")}
    lp = rt.launcher.proc
    for pipe in (lp.stdin, lp.stdout):
        assert os.readlink(f"/proc/self/fd/{pipe.fileno()}") not in fds
    end = rt.stop(a["worker"], 1, grace=2)
    assert end.state == EXITED
    # the ended shim is reaped at once (the launcher ignores SIGCHLD): no zombie left behind the launcher
    wait_for(lambda: not os.path.exists(f"/proc/{shim}"), what="the ended shim to be reaped")
    assert rt.launcher.proc.poll() is None


def psutil_ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_shims_outlive_the_launcher_and_a_wiped_state_dir_is_adopted(tmp_path, make_rt, assignment):
    state = str(tmp_path / "state")
    rt1 = make_rt(state)
    a = assignment(LONG)
    pid = started(rt1, a).pid
    launcher_pid = rt1.launcher.proc.pid
    rt1.close()  # the agent goes: its launcher ends, its workers do not
    wait_for(lambda: not pid_alive(launcher_pid), what="the launcher to end")
    assert pid_alive(pid)
    shutil.rmtree(state)
    rt2 = make_rt(state)
    found = {st.key: st for st in rt2.adopt()}
    assert found[(a["worker"], 1)].state == RUNNING and found[(a["worker"], 1)].pid == pid
    assert rt2.start(a).pid == pid  # no second copy
    assert rt2.stop(a["worker"], 1, grace=2).state == EXITED


def test_a_dead_launcher_is_started_again(tmp_path, make_rt, assignment, monkeypatch):
    monkeypatch.setenv("ASTRAEUS_NATIVE_SHIM", "0")  # the Python shim, forked, tells it was the launcher's
    rt = make_rt(tmp_path / "state")
    first = started(rt, assignment(command="true"))
    assert wait_for(lambda: (s := rt.status(first.worker, 1)).final and s).exit_code == 0
    old = rt.launcher.proc
    old.kill()
    old.wait()
    a = assignment(LONG)
    assert started(rt, a).state == RUNNING
    assert rt.launcher.proc is not old and rt.launcher.proc.poll() is None
    assert launcher_mod.LAUNCHER_MODULE in _cmdline(_shim_pid(rt, a["worker"]))
    rt.stop(a["worker"], 1, grace=2)


def test_without_the_launcher_each_shim_has_its_interpreter(tmp_path, make_rt, assignment, monkeypatch):
    monkeypatch.setenv("ASTRAEUS_SHIM_LAUNCHER", "0")
    rt = make_rt(tmp_path / "state")
    assert rt.launcher is None
    a = assignment(LONG)
    assert started(rt, a).state == RUNNING
    assert "-m astraeus.agent.runtime.shim" in _cmdline(_shim_pid(rt, a["worker"]))
    rt.stop(a["worker"], 1, grace=2)


def test_a_launcher_that_cannot_start_falls_back_to_an_interpreter(tmp_path, make_rt, assignment, monkeypatch):
    rt = make_rt(tmp_path / "state")
    monkeypatch.setattr(rt.launcher, "_ensure", lambda: (_ for _ in ()).throw(OSError("no launcher here")))
    a = assignment(LONG)
    assert started(rt, a).state == RUNNING
    assert "-m astraeus.agent.runtime.shim" in _cmdline(_shim_pid(rt, a["worker"]))
    rt.stop(a["worker"], 1, grace=2)


def test_an_environment_too_big_for_the_slot_execs_the_shim(tmp_path, make_rt, assignment, monkeypatch):
    monkeypatch.setattr(launcher_mod, "SLOT_BYTES", 16)  # the shim's variables do not fit: the child execs it
    monkeypatch.setenv("ASTRAEUS_NATIVE_SHIM", "0")  # (the C shim has no slot: its environment is its own)
    rt = make_rt(tmp_path / "state")
    a = assignment(LONG)
    assert started(rt, a).state == RUNNING
    shim = _shim_pid(rt, a["worker"])
    assert "-m astraeus.agent.runtime.shim" in _cmdline(shim)
    assert _env(shim)["ASTRAEUS_SHIM_OWNER"] == rt.owner
    rt.stop(a["worker"], 1, grace=2)


def test_a_command_that_cannot_start_is_start_failed_through_the_launcher(tmp_path, make_rt, assignment):
    from tests.agent.conftest import start_failure

    rt = make_rt(tmp_path / "state")
    msg = start_failure(rt, assignment(command="/no/such/program"))
    assert "/no/such/program" in msg


VIEW_PROBE = r"""
import errno, json, os, sys
d = sys.argv[1]
try:
    open(os.path.join(d, "w"), "w")
    w = "ok"
except OSError as e:
    w = errno.errorcode[e.errno]
print(json.dumps({"ls": sorted(os.listdir(d)), "write": w, "tmp": "mine" in os.listdir("/tmp"),
                  "root_ro": os.statvfs("/").f_flag & os.ST_RDONLY != 0}), flush=True)
open("/tmp/mine", "w").write("x")
"""


def test_the_view_prepared_once_follows_the_hosts_mounts(tmp_path, make_rt, assignment):
    """Workers' views are made from one the launcher prepared (the host's system folders read-only): a mount made
    on the host in one of them (here /opt) after that shows in the next worker's view, read-only like the rest; each
    worker's /tmp is its own; the shims hold no descriptor of the prepared view."""
    import json
    import subprocess
    import tempfile

    import pytest

    if os.geteuid() != 0:
        pytest.skip("workers' views need root")
    rt = make_rt(tmp_path / "state")
    os.makedirs("/opt", exist_ok=True)
    host = tempfile.mkdtemp(dir="/opt", prefix="astraeus-view-")
    os.chmod(host, 0o755)
    mounted = False
    try:
        def run(name: str) -> dict:
            a = assignment(VIEW_PROBE, args=[host], worker=name)
            rt.start(a)
            st = wait_for(lambda: (s := rt.status(name, 1)).final and s)
            text = [ln.text for ln in rt.logs(name, 1)]
            assert st.exit_code == 0, text
            return json.loads(text[-1])

        first = run("view-1")
        assert first == {"ls": [], "write": "EROFS", "tmp": False, "root_ro": True}
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", host], check=True)
        mounted = True
        with open(os.path.join(host, "new.txt"), "w") as f:
            f.write("made after the first worker")
        second = run("view-2")
        assert second == {"ls": ["new.txt"], "write": "EROFS", "tmp": False, "root_ro": True}
        a = assignment(LONG, worker="view-3")
        started(rt, a)
        shim = _shim_pid(rt, "view-3")
        assert not any(os.readlink(f"/proc/{shim}/fd/{fd}").startswith("mnt:") for fd in os.listdir(f"/proc/{shim}/fd"))
        rt.stop("view-3", 1, grace=0)
        # made from the prepared view, prepared again after the host's mounts changed: not from scratch
        with open(os.path.join(rt.state_dir, "launcher.log")) as f:
            said = f.read()
        assert "from scratch" not in said, said
    finally:
        if mounted:
            subprocess.run(["umount", "-l", host], check=False)
        os.rmdir(host)


def test_the_launcher_holds_only_what_the_shims_need(tmp_path):
    """Every module the launcher holds makes each fork, and each forked process's exit, dearer for the machine
    (psutil alone doubled it): the launcher of a process runtime imports the shim's modules and no heavier ones; a
    container runtime's adds the container shim."""
    import subprocess
    import sys

    probe = ("import importlib, sys\nfrom astraeus.agent.runtime import launcher\n"
             "for m in (*launcher.SHIM_MODULES, *sys.argv[1:]): importlib.import_module(m)\n"
             "print(' '.join(sorted(sys.modules)))\n")
    held = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              cwd=tmp_path).stdout.split())
    assert {"astraeus.agent.runtime.shim", "astraeus.agent.runtime.mounts", "astraeus.agent.runtime.cgroups"} <= held
    assert not held & {"psutil", "subprocess", "threading", "dataclasses", "typing", "inspect", "ctypes.util",
                       "traceback", "platform", "astraeus.agent.runtime.container_shim"}
    container = subprocess.run([sys.executable, "-c", probe, "astraeus.agent.runtime.container_shim"],
                               capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert "astraeus.agent.runtime.container_shim" in container
    from astraeus.agent.runtime.container import ContainerRuntime

    assert ContainerRuntime.SHIM_PRELOAD == ("astraeus.agent.runtime.container_shim",)
    assert ProcessRuntime.SHIM_PRELOAD == ()


def test_the_shim_reads_process_start_times_and_children_as_psutil_does():
    """The shim no longer imports psutil: the start times it records (compared by the agent with psutil's, within
    0.05 s) and the children it finds without /proc/PID/task/TID/children are read from /proc the same way."""
    import subprocess

    import psutil

    from astraeus.agent.runtime import shim

    child = subprocess.Popen(["sleep", "30"])
    try:
        for pid in (os.getpid(), child.pid):
            assert abs(shim.create_time(pid) - psutil.Process(pid).create_time()) < 0.05
        assert child.pid in shim.children_by_scan()[os.getpid()]
        assert shim.proc_state(child.pid) in ("S", "R")
    finally:
        child.kill()
        child.wait()
    assert shim.proc_state(child.pid) is None
    assert shim.create_time(child.pid) is None
