"""The runtimes against real processes: signals, stop grace, trees, mounts, logs, adoption. Tests marked `@both`
run on the process runtime and on the container runtime (ids "process"/"container": runc, from the python test
image in the session's local registry); the others check what only the process runtime has (its image map, its
worker user setting) or variants of what a `@both` test already covers."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time

import pytest

from astraeus.agent.runtime.base import EXITED, RUNNING, StartFailed
from astraeus.agent.runtime.images import ImageMap
from astraeus.agent.runtime.process import ProcessRuntime
from astraeus.agent.slurm import BIN as SLURM_BIN

from .conftest import both, pid_alive, start_failure, started, wait_for

CHECKPOINTER = r"""
import os, signal, sys, time
out = sys.argv[1]
def save(tag):
    tmp = os.path.join(out, "ckpt.tmp")
    with open(tmp, "w") as f:
        f.write(tag)
    os.replace(tmp, os.path.join(out, "ckpt"))
def on_term(signum, frame):
    save("sigterm")
    print("SIGTERM: checkpoint written", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
# printed before the file says ready: a SIGTERM between print's "ready" and its newline once made the handler's
# line "readySIGTERM: checkpoint written"
print("ready", flush=True)
open(os.path.join(out, "ready"), "w").close()
while True:
    time.sleep(0.05)
"""


@both
def test_sigterm_reaches_python_started_directly(rt, assignment, tmp_path):
    a = assignment(CHECKPOINTER, args=[str(tmp_path)])
    st = started(rt, a)
    assert st.state == RUNNING and st.pid
    wait_for(lambda: (tmp_path / "ready").exists())
    with open(f"/proc/{st.pid}/cmdline", "rb") as f:  # the worker's main process IS the command
        assert b"python" in f.read().split(b"\0")[0]
    t0 = time.monotonic()
    end = rt.stop(a["worker"], 1, grace=5)
    assert time.monotonic() - t0 < 5  # it ended on SIGTERM: stop did not wait out the grace
    assert end.state == EXITED and end.exit_code == 0 and end.signal is None
    assert not end.extra["killed"]
    assert (tmp_path / "ckpt").read_text() == "sigterm"
    assert "SIGTERM: checkpoint written" in [ln.text for ln in rt.logs(a["worker"], 1)]


@both
def test_shell_without_exec_swallows_sigterm_and_sigkill_follows_at_grace(rt, assignment, tmp_path):
    script = tmp_path / "ck.py"
    script.write_text(CHECKPOINTER)
    a = assignment(command="sh", args=["-c", f"python {script} {tmp_path}; echo after"])
    st = started(rt, a)
    wait_for(lambda: (tmp_path / "ready").exists())
    marker = rt.marker(a["worker"], 1)
    pythons = [p for p in _marked(marker) if p != st.pid]
    assert pythons, "the python under the shell should carry the worker marker"
    grace = 1.5
    t0 = time.monotonic()
    end = rt.stop(a["worker"], 1, grace=grace)
    took = time.monotonic() - t0
    assert grace - 0.2 <= took <= grace + 1.0, took
    assert end.state == EXITED and end.extra["killed"]
    assert not (tmp_path / "ckpt").exists(), "the python never saw SIGTERM"
    assert not any(pid_alive(p) for p in pythons)


def test_atomic_checkpoint_survives_sigkill_mid_save(rt, assignment, tmp_path):
    script = r"""
import os, signal, sys, time
out = sys.argv[1]
def save(tag, slow=False):
    tmp = os.path.join(out, "ckpt.tmp")
    with open(tmp, "w") as f:
        for i in range(1000 if slow else 1):
            f.write(tag * 100)
            f.flush()
            if slow:
                time.sleep(0.01)
    os.replace(tmp, os.path.join(out, "ckpt"))
save("1")
stop = []
signal.signal(signal.SIGTERM, lambda s, f: stop.append(1))
print("saved", flush=True)
while not stop:
    time.sleep(0.01)
save("2", slow=True)  # takes 10 s: longer than the grace
"""
    a = assignment(script, args=[str(tmp_path)])
    rt.start(a)
    wait_for(lambda: (tmp_path / "ckpt").exists())
    end = rt.stop(a["worker"], 1, grace=1)
    assert end.extra["killed"] and end.signal == 9
    assert (tmp_path / "ckpt").read_text() == "1" * 100  # the previous checkpoint is whole
    assert (tmp_path / "ckpt.tmp").exists()  # the interrupted save


@both
def test_early_exit_never_gets_sigkill(rt, assignment, tmp_path):
    a = assignment(CHECKPOINTER, args=[str(tmp_path)])
    started(rt, a)
    wait_for(lambda: (tmp_path / "ready").exists())
    t0 = time.monotonic()
    end = rt.stop(a["worker"], 1, grace=3)
    assert time.monotonic() - t0 < 3  # it ended on SIGTERM: stop did not wait out the grace
    assert end.exit_code == 0 and end.signal is None and not end.extra["killed"]
    # a worker that ends on its own reports its exit code
    b = assignment(command="python", args=["-c", "import sys; print('bye'); sys.exit(3)"])
    rt.start(b)
    st = wait_for(lambda: (s := rt.status(b["worker"], 1)).final and s)
    assert st.state == EXITED and st.exit_code == 3 and st.signal is None and not st.extra["killed"]


DOUBLE_FORK = r"""
import os, signal, sys, time
out = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the main process ignores SIGTERM
if os.fork() == 0:
    os.setsid()  # leave the process group
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.path.join(out, "grandchild"), "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(0.1)
    os._exit(0)
child = os.fork()
if child == 0:
    while True:
        time.sleep(0.1)
with open(os.path.join(out, "child"), "w") as f:
    f.write(str(child))
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("kind,cgroups", [("process", True), ("process", False), ("container", True)],
                         ids=["process-cgroup", "process-no-cgroup", "container"], indirect=["kind"])
def test_stop_kills_whole_tree_including_double_forked(tmp_path, make_rt, assignment, kind, cgroups):
    rt = make_rt(tmp_path / "state", stop_grace=1, use_cgroups=cgroups)
    if cgroups and rt.cgroup_root is None:
        pytest.skip("this machine has no writable cgroup v2 (the no-cgroup variant checks the fallback here)")
    a = assignment(DOUBLE_FORK, args=[str(tmp_path)])
    st = started(rt, a)
    marker = rt.marker(a["worker"], 1)
    # the worker writes its pids as its own PID namespace numbers them
    gc = _host_pid(marker, int(wait_for(lambda: (tmp_path / "grandchild").exists() and
                                        (tmp_path / "grandchild").read_text())))
    child = _host_pid(marker, int(wait_for(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text())))
    assert os.getpgid(gc) != st.pid  # escaped the process group
    end = rt.stop(a["worker"], 1, grace=1)
    assert end.extra["killed"] and end.signal == 9
    for pid in (st.pid, child, gc):
        wait_for(lambda pid=pid: not pid_alive(pid), timeout=3)


@both
def test_main_exit_kills_leftovers(rt, assignment, tmp_path):
    script = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    with open(os.path.join(sys.argv[1], "bg"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
    os._exit(0)
time.sleep(0.3)
"""
    a = assignment(script, args=[str(tmp_path)])
    rt.start(a)
    bg = _host_pid(rt.marker(a["worker"], 1), int(wait_for(lambda: (tmp_path / "bg").exists() and
                                                            (tmp_path / "bg").read_text())))
    st = wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s)
    assert st.exit_code == 0
    wait_for(lambda: not pid_alive(bg), timeout=3)


@both
def test_configs_and_drives_inside_the_worker(rt, assignment, tmp_path):
    granted = tmp_path / "data"
    (granted / "ro").mkdir(parents=True)
    (granted / "ro" / "hello.txt").write_text("hello")
    mnt = tmp_path / "mnt"  # does not exist on the host: a tmpfs is used for the missing parents
    script = r"""
import errno, os, sys
m = sys.argv[1]
print("config:", open(os.path.join(m, "app", "conf.json")).read())
with open(os.path.join(m, "ckpt", "out.txt"), "w") as f:
    f.write("written")
print("ro:", open(os.path.join(m, "ro", "hello.txt")).read())
try:
    open(os.path.join(m, "ro", "x"), "w")
    print("ro write: ok")
except OSError as e:
    print("ro write:", errno.errorcode[e.errno])
print("cwd:", os.getcwd())
"""
    a = assignment(script, args=[str(mnt)], mounts=[
        {"host_path": str(granted / "ft-ckpt"), "mount_path": str(mnt / "ckpt"), "read_only": False,
         "create": True, "granted_root": str(granted)},
        {"host_path": str(granted / "ro"), "mount_path": str(mnt / "ro"), "read_only": True,
         "create": False, "granted_root": str(granted)},
    ], configs=[{"mount_path": str(mnt / "app" / "conf.json"), "value": '{"lr": 0.1}'}])
    rt.start(a)
    st = wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s)
    text = [ln.text for ln in rt.logs(a["worker"], 1)]
    assert st.exit_code == 0, text
    assert 'config: {"lr": 0.1}' in text
    assert "ro: hello" in text
    assert "ro write: EROFS" in text
    assert (granted / "ft-ckpt" / "out.txt").read_text() == "written"  # the drive's bytes are on the host
    assert not (granted / "ro" / "x").exists()
    # the mount points were made in the worker's own view: nothing was made (nor mounted) on the host
    assert not mnt.exists()


@both
def test_symlink_escape_is_refused(rt, assignment, tmp_path):
    granted = tmp_path / "data"
    granted.mkdir()
    os.symlink("/etc", granted / "link")
    a = assignment(command="true", mounts=[{"host_path": str(granted / "link"), "mount_path": str(tmp_path / "m"),
                                            "read_only": False, "create": True, "granted_root": str(granted)}])
    assert "symlink" in start_failure(rt, a)
    b = assignment(command="true", mounts=[{"host_path": str(granted / "link" / "sub"),
                                            "mount_path": str(tmp_path / "m"), "read_only": False, "create": True,
                                            "granted_root": str(granted)}])
    assert "symlink" in start_failure(rt, b)
    assert not os.path.exists("/etc/sub")
    c = assignment(command="true", mounts=[{"host_path": "/etc", "mount_path": str(tmp_path / "m"),
                                            "read_only": False, "create": False, "granted_root": str(granted)}])
    assert "outside the granted" in start_failure(rt, c)
    assert rt.status(c["worker"], 1).state == "StartFailed"  # reported, and never started twice
    with pytest.raises(StartFailed, match="outside the granted"):
        rt.start(c)


@both
def test_command_not_found_is_start_failed(rt, assignment, kind):
    a = assignment(command="no-such-command-xyz")
    # the process runtime says what exec said; runc's "executable file not found in $PATH" is said plainly
    want = "no-such-command-xyz: No such file" if kind == "process" else "no such command: no-such-command-xyz"
    assert want in start_failure(rt, a)


@both
def test_logs_have_every_line_once(rt, assignment):
    script = r"""
import sys
for i in range(3000):
    print(f"out {i}")
    if i % 100 == 0:
        print(f"err {i}", file=sys.stderr)
sys.stdout.write("no newline at the end")
"""
    a = assignment(script)
    rt.start(a)
    wait_for(lambda: rt.status(a["worker"], 1).final)
    lines, offset = [], 0
    while True:  # in small batches, as the agent ships them
        batch, offset = rt.read_logs(a["worker"], 1, offset, limit=137)
        if not batch:
            break
        lines += batch
    assert [ln.seq for ln in lines] == list(range(1, len(lines) + 1))
    out = [ln.text for ln in lines if ln.stream == "stdout"]
    err = [ln.text for ln in lines if ln.stream == "stderr"]
    assert out == [f"out {i}" for i in range(3000)] + ["no newline at the end"]
    assert err == [f"err {i}" for i in range(0, 3000, 100)]
    assert all(ln.time > 0 for ln in lines)


# Process runtime only: its map of images to environments on the host (a container's environment is its image).
def test_env_and_image_environment(tmp_path, assignment):
    envdir = tmp_path / "torchenv"
    (envdir / "bin").mkdir(parents=True)
    os.symlink(sys.executable, envdir / "bin" / "python")
    rt = ProcessRuntime(str(tmp_path / "state"), image_map=ImageMap({"pytorch/*": str(envdir)}), stop_grace=1)
    a = assignment(command="python", args=["-c", "import os; print(*os.environ['PATH'].split(':')[:2]);"
                                           "print(os.environ['ASTRAEUS_WORKER_ID']); print(os.environ['FOO'])"],
                   env={"FOO": "bar", "CUDA_VISIBLE_DEVICES": "3"})
    st = rt.start(a)
    assert st.environment == str(envdir)
    wait_for(lambda: rt.status(a["worker"], 1).final)
    # Astraeus' srun and scontrol first (astraeus.agent.slurm), then the image's environment
    assert [ln.text for ln in rt.logs(a["worker"], 1)] == [f"{SLURM_BIN} {envdir / 'bin'}", rt.marker(a["worker"], 1),
                                                           "bar"]
    other = assignment(command="true", image="ubuntu:24.04")
    assert rt.start(other).environment == sys.prefix  # the default: the agent's own environment


def test_image_map_from_env(tmp_path):
    m = ImageMap.from_env({"ASTRAEUS_IMAGE_MAP": '{"nvcr.io/nvidia/pytorch:*": "/opt/a", "*": "host"}'})
    assert m.resolve("nvcr.io/nvidia/pytorch:24.08-py3").path == "/opt/a"
    assert m.resolve("ubuntu").path is None and m.resolve("ubuntu").name == "host"
    f = tmp_path / "map.json"
    f.write_text('{"pytorch/*": "/opt/b"}')
    m = ImageMap.from_env({"ASTRAEUS_IMAGE_MAP": str(f)})
    assert m.resolve("pytorch/pytorch:2.4.1").path == "/opt/b"
    assert m.resolve("other").path == sys.prefix


@both
def test_start_is_idempotent(rt, assignment, tmp_path):
    a = assignment(CHECKPOINTER, args=[str(tmp_path)])
    first = started(rt, a)
    again = rt.start(a)
    assert again.pid == first.pid


@both
def test_adoption_after_runtime_restart(tmp_path, make_rt, assignment):
    state = str(tmp_path / "state")
    rt1 = make_rt(state, stop_grace=2)
    long = assignment(CHECKPOINTER, args=[str(tmp_path)])
    short = assignment(command="python", args=["-c", "import time; time.sleep(0.8); raise SystemExit(7)"])
    p_long = started(rt1, long).pid
    p_short = started(rt1, short).pid
    del rt1  # the agent goes away; its workers do not
    time.sleep(1.2)  # the short one ends while no agent runs
    rt2 = make_rt(state, stop_grace=2)
    found = {st.worker: st for st in rt2.adopt()}
    assert found[long["worker"]].state == RUNNING and found[long["worker"]].pid == p_long
    assert found[short["worker"]].state == EXITED and found[short["worker"]].exit_code == 7
    assert found[short["worker"]].pid == p_short
    end = rt2.stop(long["worker"], 1, grace=3)
    assert end.exit_code == 0 and (tmp_path / "ckpt").read_text() == "sigterm"


@both
def test_adoption_after_state_dir_wiped(tmp_path, make_rt, assignment):
    state = str(tmp_path / "state")
    rt1 = make_rt(state, stop_grace=2)
    a = assignment(CHECKPOINTER, args=[str(tmp_path)])
    pid = started(rt1, a).pid
    wait_for(lambda: (tmp_path / "ready").exists())
    shutil.rmtree(state)
    rt2 = make_rt(state, stop_grace=2)
    found = {st.key: st for st in rt2.adopt()}
    assert found[(a["worker"], 1)].state == RUNNING and found[(a["worker"], 1)].pid == pid
    assert rt2.start(a).pid == pid  # no second copy
    end = rt2.stop(a["worker"], 1, grace=3)
    assert end.exit_code == 0
    assert _cgroups_left(rt2, a["worker"], 1) == []  # a container's too, though runc's record was wiped


def _cgroups_left(rt, worker: str, attempt: int) -> list[str]:
    """The attempt's cgroup folders left in any hierarchy mounted here: Astraeus's own and (containers) runc's."""
    import glob

    name = rt.cgroup_name(worker, attempt)
    return glob.glob(f"/sys/fs/cgroup/*/astraeus/{name}") + glob.glob(f"/sys/fs/cgroup/astraeus/{name}")


@both
def test_unrelated_runtime_does_not_adopt(tmp_path, make_rt, assignment):
    rt1 = make_rt(tmp_path / "a", stop_grace=1)
    a = assignment(CHECKPOINTER, args=[str(tmp_path)])
    started(rt1, a)
    rt2 = make_rt(tmp_path / "b", stop_grace=1)
    assert rt2.adopt() == []
    rt1.stop(a["worker"], 1, grace=1)


def _host_pid(marker: str, ns_pid: int) -> int:
    """The host's pid of the worker's process that its own PID namespace calls `ns_pid`."""
    for pid in _marked(marker):
        try:
            with open(f"/proc/{pid}/status") as f:
                ns = next(ln.split()[1:] for ln in f if ln.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if ns[-1] == str(ns_pid):
            return pid
    raise AssertionError(f"no process of {marker} is pid {ns_pid} in its namespace")


def _marked(marker: str) -> list[int]:
    want = f"ASTRAEUS_WORKER_ID={marker}".encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if want in f.read().split(b"\0"):
                        out.append(int(name))
            except OSError:
                pass
    return out


@both
def test_worker_whose_shim_died_is_stopped_on_adoption(tmp_path, make_rt, assignment):
    import json
    import signal as sig

    state = str(tmp_path / "state")
    rt1 = make_rt(state, stop_grace=1)
    a = assignment(command="python", args=["-c", "import time\nwhile True: time.sleep(0.05)"])
    pid = started(rt1, a).pid
    shim = json.loads(open(os.path.join(rt1.dir(a["worker"], 1), "shim.json")).read())["shim_pid"]
    os.kill(shim, sig.SIGKILL)
    wait_for(lambda: not pid_alive(shim))
    rt2 = make_rt(state, stop_grace=1)
    rt2.adopt()
    st = wait_for(lambda: (s := rt2.status(a["worker"], 1)).final and s, timeout=5)
    assert st.state == EXITED and "supervisor" in st.message
    assert not pid_alive(pid)


@both
def test_worker_whose_shim_died_while_the_agent_runs_is_stopped_and_leaves_nothing(tmp_path, make_rt, assignment,
                                                                                    kind):
    import signal as sig
    import subprocess

    rt = make_rt(str(tmp_path / "state"), stop_grace=1)
    a = assignment(command="python", args=["-c", "import time\nwhile True: time.sleep(0.05)"])
    pid = started(rt, a).pid
    shim = json.loads(open(os.path.join(rt.dir(a["worker"], 1), "shim.json")).read())["shim_pid"]
    os.kill(shim, sig.SIGKILL)
    wait_for(lambda: not pid_alive(shim))
    # a process worker runs on unsupervised until the agent stops it; a container's ends with its shim (the
    # container's PID 1, the shim's child, ends with it, and the kernel kills the rest of its namespace)
    st = rt.status(a["worker"], 1)
    if not st.final:
        assert st.state == RUNNING and st.extra.get("orphan"), st
        st = rt.stop(a["worker"], 1, grace=1)
    assert st.state == EXITED and "supervisor" in st.message, st
    assert not pid_alive(pid)
    assert _cgroups_left(rt, a["worker"], 1) == []  # neither Astraeus's own nor (containers) runc's
    if kind == "container":
        listed = subprocess.run(["runc", "--root", rt.runc_root, "list", "-q"], capture_output=True, text=True)
        assert listed.stdout.split() == []


ISOLATION_PROBE = r"""
import json, os, sys
state, cfg_host = sys.argv[1], sys.argv[2]
status = {ln.split(":")[0]: ln.split()[1] for ln in open("/proc/self/status") if ":" in ln and ln.split()[1:]}
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
       "CapEff": status["CapEff"], "CapBnd": status["CapBnd"], "CapPrm": status["CapPrm"],
       "NoNewPrivs": status["NoNewPrivs"], "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
       "state": None, "config": open("/etc/astraeus-t/c").read(),
       "home": os.environ["HOME"], "job": os.environ.get("ASTRAEUS_JOB_NAME")}
with open(os.path.join(os.environ["HOME"], "h"), "w") as f:  # HOME is the worker's own, writable
    f.write("x")
try:
    out["state"] = sorted(os.listdir(state)) if os.path.isdir(state) else None
except OSError as e:
    out["state"] = e.strerror
for name, path in (("etc", "/etc/astraeus-t-w"), ("usr", "/usr/astraeus-t-w"), ("tmp", "/tmp/ok")):
    try:
        open(path, "w").close()
        out[name] = "written"
    except OSError as e:
        out[name] = e.strerror
out["ckpt_owner"] = os.stat("/ckpt").st_uid
with open("/ckpt/a" + os.environ["ASTRAEUS_ATTEMPT"], "w") as f:
    f.write("attempt")
out["ckpt"] = sorted(os.listdir("/ckpt"))
print(json.dumps(out), flush=True)
"""


@both
def test_the_worker_is_unprivileged_in_its_own_namespaces_and_view(rt, assignment, tmp_path, kind):
    """Its workspace's uid (not root), no capabilities, no_new_privs, PID 2 of its own PID namespace seeing only
    its own processes, the agent's state dir hidden, a config at /etc/… made in its view only; its ReadWrite
    drive's new folder is handed to the workspace and what one attempt wrote is there for the next. (In a
    container the root filesystem is the image's under the attempt's own layer: /etc and /usr are root's, so
    the worker's writes there are refused for permission rather than a read-only view.)"""
    granted = tmp_path / "data"
    granted.mkdir()
    ws = "ws-0123456789ab"
    ckpt = {"host_path": str(granted / "ckpt"), "mount_path": "/ckpt", "read_only": False, "create": True,
            "granted_root": str(granted)}
    outs = []
    for attempt in (1, 2):
        a = assignment(ISOLATION_PROBE, args=[rt.state_dir, "/etc/astraeus-t/c"], worker=f"{ws}.probe",
                       attempt=attempt, env={"ASTRAEUS_JOB_NAME": f"{ws}.probe", "ASTRAEUS_ATTEMPT": str(attempt)},
                       mounts=[ckpt], configs=[{"mount_path": "/etc/astraeus-t/c", "value": "conf"}])
        rt.start(a)
        st = wait_for(lambda a=a: (s := rt.status(a["worker"], a["attempt"])).final and s)
        text = [ln.text for ln in rt.logs(a["worker"], attempt)]
        assert st.exit_code == 0, text
        outs.append(json.loads(text[-1]))
    out = outs[0]
    uid = 200000 + 0x0123456789AB % 65536  # ASTRAEUS_WORKER_UID_BASE + the namespace's hex mod the range
    assert (out["uid"], out["gid"], out["groups"]) == (uid, uid, [])
    assert out["CapEff"] == out["CapBnd"] == out["CapPrm"] == "0000000000000000" and out["NoNewPrivs"] == "1"
    assert out["pid"] == 2 and out["procs"] == [1, 2]  # PID 1 is its reaper; nothing of the host's
    if kind == "process":  # the agent's state dir: empty but for the way to its own cwd
        assert out["state"] in (None, ["workers"])
    else:  # not in the image; here it is reached through the test's folder, shared as a drive, and closed to it
        assert out["state"] in (None, "Permission denied")
    assert out["config"] == "conf" and out["job"] == f"{ws}.probe"
    refused = "Read-only file system" if kind == "process" else "Permission denied"
    assert out["etc"] == out["usr"] == refused and out["tmp"] == "written"
    assert not os.path.exists("/etc/astraeus-t") and not os.path.exists("/etc/astraeus-t-w")
    assert not os.path.exists("/usr/astraeus-t-w")
    if kind == "process":  # its own folder under the state dir (a container's HOME is in its own layer)
        assert out["home"].startswith(rt.state_dir)
    assert out["ckpt_owner"] == uid
    st = os.stat(granted / "ckpt")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (uid, uid, 0o700)  # handed over to the workspace
    assert outs[1]["ckpt"] == ["a1", "a2"]  # the next attempt reads and writes what the first left
    assert (granted / "ckpt" / "a1").stat().st_uid == uid
    spec = os.path.join(rt.dir(f"{ws}.probe", 1), "spec.json")
    assert os.stat(spec).st_mode & 0o777 == 0o600


def test_a_configured_worker_user(tmp_path, assignment, monkeypatch):
    monkeypatch.setenv("ASTRAEUS_WORKER_USER", "nobody")
    r = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    a = assignment(command="python", args=["-c", "import os; print(os.getuid(), os.getgid())"])
    r.start(a)
    st = wait_for(lambda: (s := r.status(a["worker"], 1)).final and s)
    import pwd

    nobody = pwd.getpwnam("nobody")
    assert st.exit_code == 0 and [ln.text for ln in r.logs(a["worker"], 1)] == [f"{nobody.pw_uid} {nobody.pw_gid}"]
    monkeypatch.setenv("ASTRAEUS_WORKER_USER", "root")
    from astraeus.settings import AgentSettings, SettingsError

    with pytest.raises((SettingsError, ValueError), match="root"):
        AgentSettings.load()


def test_each_workspace_number_is_its_own_uid(rt, assignment):
    """The control plane numbers workspaces uniquely; the uid is the base plus that number, so two workspaces
    never share a uid. A number outside ASTRAEUS_WORKER_UID_RANGE is refused with a reason, and nothing starts."""
    seen = []
    for number, ws in ((7, "ws-00000000000a"), (8, "ws-00000000000b")):
        a = assignment(command="python", args=["-c", "import os; print(os.getuid(), os.getgid())"],
                       worker=f"{ws}.who-0", workspace_number=number, env={"ASTRAEUS_JOB_NAME": f"{ws}.who"})
        rt.start(a)
        st = wait_for(lambda a=a: (s := rt.status(a["worker"], 1)).final and s)
        assert st.exit_code == 0
        seen.append([ln.text for ln in rt.logs(a["worker"], 1)])
    assert seen == [["200007 200007"], ["200008 200008"]]
    a = assignment(command="true", worker="ws-00000000000c.who-0", workspace_number=70000)
    with pytest.raises(StartFailed, match="workspace number 70000 is outside ASTRAEUS_WORKER_UID_RANGE"):
        rt.start(a)
    assert not os.path.exists(rt.dir("ws-00000000000c.who-0", 1))


def test_the_workers_pid_1_holds_nothing_of_its_shim(rt, assignment):
    """PID 1 of the worker's namespace (its reaper, a fork of the shim) shows no environment (the shim's names the
    agent's state dir and owner, which adoption looks for), is named astraeus-reaper and holds no file of the
    shim's open: only its standard streams and its two pipes to the shim. The worker still ends and reports."""
    a = assignment(command="sleep", args=["30"])
    st = started(rt, a)
    with open(f"/proc/{st.pid}/stat") as f:
        init = int(f.read().rsplit(")", 1)[1].split()[1])  # the command's parent: PID 1 of its namespace
    with open(f"/proc/{init}/cmdline", "rb") as f:
        assert f.read().rstrip(b"\0") == b"astraeus-reaper"
    with open(f"/proc/{init}/environ", "rb") as f:
        assert f.read().strip(b"\0") == b""
    fds = {int(n): os.readlink(f"/proc/{init}/fd/{n}") for n in os.listdir(f"/proc/{init}/fd")}
    assert sorted(n for n in fds if n > 2) == sorted(n for n in fds if n > 2 and fds[n].startswith("pipe:"))
    assert len([n for n in fds if n > 2]) == 2, fds
    end = rt.stop(a["worker"], 1, grace=2)
    assert end.signal == 15 and not pid_alive(init)


PROBE_PID_1 = """
import os, signal, sys, time
out = {}
for name, path in (("fd", "/proc/1/fd"), ("environ", "/proc/1/environ"), ("mem", "/proc/1/mem")):
    try:
        os.listdir(path) if name == "fd" else open(path, "rb").read(1)
        out[name] = "read"
    except OSError as e:
        out[name] = e.errno
for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
    try:
        os.kill(1, sig)
        out[sig.name] = "sent"
    except OSError as e:
        out[sig.name] = e.errno
time.sleep(0.3)
print(sorted(out.items()), flush=True)
sys.exit(7)
"""


def test_the_worker_cannot_reach_its_pid_1(rt, assignment, tmp_path):
    """PID 1 of the worker's namespace runs as the workspace's user once the view is built (it starts the command
    with posix_spawn, which inherits that user), with no capabilities and not dumpable: the worker, the same user,
    cannot open its descriptors, environment or memory, and its signals (SIGKILL, SIGSTOP, SIGTERM) do not touch
    it (the kernel drops a namespace's signals to its init without a handler); the worker's own exit status is
    what is reported."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE_PID_1)
    a = assignment(command="python", args=[str(script)])
    st = started(rt, a)
    with open(f"/proc/{st.pid}/stat") as f:
        init = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{init}/status") as f:
        status = {ln.split(":")[0]: ln.split(":", 1)[1].split() for ln in f}
    assert status["Uid"][0] != "0" and set(status["Uid"]) == {status["Uid"][0]}, status["Uid"]
    assert int(status["CapEff"][0], 16) == 0 and int(status["CapBnd"][0], 16) == 0
    assert status["NoNewPrivs"] == ["1"]
    end = wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s, timeout=30, what="the probe to end")
    assert end.exit_code == 7, end
    text = [ln.text for ln in rt.logs(a["worker"], 1)]
    assert text == [str(sorted({"fd": errno.EACCES, "environ": errno.EACCES, "mem": errno.EACCES,
                                "SIGKILL": "sent", "SIGSTOP": "sent", "SIGTERM": "sent"}.items()))], text


def test_a_flooding_worker_keeps_at_most_its_log_bytes_on_the_machine(rt, assignment, monkeypatch):
    """The shim keeps an attempt's output in two files of half ASTRAEUS_WORKER_LOG_FILE_BYTES in turn: a flood
    cannot fill the machine's disk, and a reader that keeps up (the agent) gets every line once, in order."""
    monkeypatch.setenv("ASTRAEUS_WORKER_LOG_FILE_BYTES", str(64 * 1024))
    a = assignment(command="python", args=["-c", "import sys\nfor i in range(1, 3001): print(f'line {i:05d} ' + 'x' * 90)"])
    rt.start(a)
    shipped, offset = [], 0
    while True:  # read as the agent does, while the worker writes
        # (its state before the read: ended then, nothing it wrote comes after the read; read after, a loaded
        # machine could let it write its last lines and end between the two)
        final = rt.status(a["worker"], 1).final
        batch, offset = rt.read_logs(a["worker"], 1, offset, limit=200)
        shipped += batch
        if final and not batch:
            break
        if not batch:
            time.sleep(0.01)
    d = rt.dir(a["worker"], 1)
    kept = sum(os.path.getsize(os.path.join(d, f)) for f in ("log.jsonl", "log.jsonl.1"))
    assert kept <= 64 * 1024
    seqs = [ln.seq for ln in shipped]
    assert seqs == sorted(set(seqs)) and seqs[-1] == 3000  # in order, no repeat, up to the last line
    assert shipped[-1].text.startswith("line 03000 ")
    # A reader from the start gets what is kept: the newest lines, contiguous up to the last.
    kept_lines = rt.logs(a["worker"], 1)
    assert 0 < len(kept_lines) < 3000
    assert [ln.seq for ln in kept_lines] == list(range(3001 - len(kept_lines), 3001))


def test_a_forgotten_attempt_leaves_nothing_on_the_machine(rt, assignment):
    """forget(): the attempt is gone at once (no status, no folder among the workers') and its files are deleted
    from the machine soon after (by the runtime's own thread, not the caller)."""
    a = assignment("print('bye')")
    rt.start(a)
    wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s)
    d = rt.dir(a["worker"], 1)
    assert os.path.isdir(d)
    rt.forget(a["worker"], 1)
    assert rt.status(a["worker"], 1) is None and not os.path.exists(d)
    assert all(st.worker != a["worker"] for st in rt.list())
    trash = os.path.join(rt.state_dir, "forgotten")
    wait_for(lambda: not os.path.exists(trash) or os.listdir(trash) == [], timeout=10, what="its files deleted")
