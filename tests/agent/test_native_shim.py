"""The per-worker supervisor in C (astraeus.agent.runtime.native, shim_native.c): an isolated worker gets it from the
shim launcher; it looks to the agent as the Python shim does (files, environment, session), keeps the worker's
environment off every command line, writes the same log lines, and every worker it does not fit gets the Python
shim. The rest of its contract (stops and their grace, the whole tree killed, OOM, adoption after a wiped state dir,
start failures, the worker's view and user) is what tests/agent and tests/faults assert of every isolated worker:
with `make install` these run on it."""

from __future__ import annotations

import json
import os

import pytest

from astraeus.agent.runtime import native
from astraeus.agent.runtime.base import EXITED, RUNNING
from tests.agent.conftest import started, wait_for

LONG = "import time\nwhile True: time.sleep(0.1)\n"


def _native_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("the C supervisor is for isolated workers: the agent must run as root")
    if not os.access(native.BINARY, os.X_OK):
        pytest.skip(f"{native.BINARY} is not built (`make install` builds it with cc)")


@pytest.fixture(params=["native", "python"])
def supervisor(request, monkeypatch) -> str:
    """Each test twice: on the C supervisor and on the Python shim (ASTRAEUS_NATIVE_SHIM=0)."""
    if request.param == "native":
        _native_or_skip()
    else:
        monkeypatch.setenv("ASTRAEUS_NATIVE_SHIM", "0")
    return request.param


def _shim(rt, worker: str) -> int:
    with open(os.path.join(rt.dir(worker, 1), "shim.json")) as f:
        return json.load(f)["shim_pid"]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_an_isolated_worker_gets_the_c_supervisor_and_its_environment_stays_private(tmp_path, make_rt, assignment):
    _native_or_skip()
    rt = make_rt(tmp_path / "state")
    secret = "s3cr3t-value-of-the-worker"
    a = assignment(LONG, env={"API_TOKEN": secret})
    assert started(rt, a).state == RUNNING
    shim = _shim(rt, a["worker"])
    assert os.readlink(f"/proc/{shim}/exe") == native.BINARY
    assert _read(f"/proc/{shim}/cmdline") == b"astraeus-shim-native\0"
    env = dict(i.decode().split("=", 1) for i in _read(f"/proc/{shim}/environ").split(b"\0") if b"=" in i)
    assert env["ASTRAEUS_SHIM_OWNER"] == rt.owner  # what adopt() looks for
    assert env["ASTRAEUS_SHIM_ID"] == os.path.basename(rt.dir(a["worker"], 1))
    assert secret.encode() not in _read(f"/proc/{shim}/environ")  # the worker's own environment: not the shim's
    # its own session, started by the launcher, holding none of the launcher's pipes to the agent
    assert os.getsid(shim) == shim
    with open(f"/proc/{shim}/stat") as f:
        assert int(f.read().rsplit(")", 1)[1].split()[1]) == rt.launcher.proc.pid
    held = {os.readlink(f"/proc/{shim}/fd/{fd}") for fd in os.listdir(f"/proc/{shim}/fd")}
    for pipe in (rt.launcher.proc.stdin, rt.launcher.proc.stdout):
        assert os.readlink(f"/proc/self/fd/{pipe.fileno()}") not in held
    spec = _read(os.path.join(rt.dir(a["worker"], 1), "spec.json"))
    assert rt.stop(a["worker"], 1, grace=2).state == EXITED
    wait_for(lambda: not os.path.exists(f"/proc/{shim}"), what="the ended shim to be reaped")
    assert _read(os.path.join(rt.dir(a["worker"], 1), "spec.json")) == spec


def test_turned_off_or_not_fitting_a_worker_gets_the_python_shim(tmp_path, make_rt, assignment, monkeypatch):
    _native_or_skip()
    rt = make_rt(tmp_path / "state")
    # a drive at a new top-level folder needs a view built from scratch: the Python shim's
    top = f"/astraeus-test-{os.getpid()}"
    assert not os.path.exists(top)
    drive = {"host_path": str(tmp_path), "mount_path": top, "read_only": True, "create": False,
             "granted_root": str(tmp_path)}
    a = assignment(command="sh", args=["-c", f"test -d {top} && echo mounted; sleep 30"], mounts=[drive])
    assert started(rt, a).state == RUNNING
    assert os.readlink(f"/proc/{_shim(rt, a['worker'])}/exe") != native.BINARY
    wait_for(lambda: [ln.text for ln in rt.logs(a["worker"], 1)] == ["mounted"], what="the drive in its view")
    rt.stop(a["worker"], 1, grace=2)
    assert not os.path.exists(top)  # made in the worker's view only
    monkeypatch.setenv("ASTRAEUS_NATIVE_SHIM", "0")
    rt2 = make_rt(tmp_path / "state2")
    b = assignment(LONG)
    assert started(rt2, b).state == RUNNING
    assert os.readlink(f"/proc/{_shim(rt2, b['worker'])}/exe") != native.BINARY
    rt2.stop(b["worker"], 1, grace=2)


# What a worker prints, as bytes: text, invalid UTF-8 (each maximal bad part one U+FFFD), controls, quotes,
# CR LF endings, a line longer than 64 KiB (split while it has no end), stderr, then a partial line the shim flushes after a second,
# and a last one without a newline (flushed when the worker ends).
NOISY = r"""
import os, sys, time
o, e = sys.stdout.buffer, sys.stderr.buffer
for line in LINES:
    o.write(line)
o.flush()
e.write(b"err \xff line\n")
e.flush()
o.write(b"progress 50%")
o.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
o.write(b"\ndone\ntail without newline")
"""
LINES = [b"plain\n", "caf\u00e9 \U0001F600 \u4e2d\n".encode(), b"bad \xff \xc3\x28 \xe2\x82 \xf0\x9f\x98 end\n",
         b"\xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf \xe0\x80\x80 \xf5 ok\n", b"ctl \x01\x1b[31m\t\"q\" \\ b\x7f\x08\x0c\n",
         b"crlf\r\n", b"two cr\r\r\n", b"x" * 70000 + b"\n"]


def test_both_supervisors_write_the_same_log_lines(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    go = tmp_path / "go"
    a = assignment(f"LINES = {LINES!r}\n" + NOISY, args=[str(go)])
    rt.start(a)
    # the partial line is written on its own once it has waited a second (a progress bar's last state shows)
    wait_for(lambda: "progress 50%" in [ln.text for ln in rt.logs(a["worker"], 1)], timeout=30,
             what="the partial line flushed")
    go.write_text("")
    end = wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s, timeout=30)
    assert end.state == EXITED and end.exit_code == 0
    lines = rt.logs(a["worker"], 1)
    assert sorted(ln.seq for ln in lines) == list(range(1, len(lines) + 1))
    want = [raw[:-1].decode("utf-8", "replace").rstrip("\r") for raw in LINES[:-1]]
    want += ["progress 50%", "", "done", "tail without newline"]
    out = [ln.text for ln in lines if ln.stream == "stdout"]
    # the long line: 64 KiB parts while it has no end yet (where its end falls in the pipe's reads decides
    # whether the rest is one more part or two)
    long = [t for t in out if t and set(t) == {"x"}]
    assert "".join(long) == "x" * 70000 and all(len(t) == 65536 for t in long[:-1]) and len(long) >= 1
    assert [t for t in out if t not in long] == want
    assert [ln.text for ln in lines if ln.stream == "stderr"] == ["err \ufffd line"]
    assert want[2] == "bad \ufffd \ufffd( \ufffd \ufffd end"
    # each line of the file is what json.dumps writes (ASCII, its escapes, its spacing): byte for byte the same
    # from either supervisor, so offsets and sizes mean the same
    for raw in _read(os.path.join(rt.dir(a["worker"], 1), "log.jsonl")).splitlines():
        assert raw.decode() == json.dumps(json.loads(raw))


def _reason_keeper(rt, assignment, out, then: str) -> dict:
    """Start a worker that, on SIGTERM, copies its stop reason file to `out` and then runs `then`; once it is ready."""
    script = f"""
import os, signal, sys, time
def term(*_):
    with open(os.environ["ASTRAEUS_STOP_REASON_FILE"]) as f, open({str(out)!r}, "w") as o:
        o.write(f.read())
    {then}
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
    a = assignment(script)
    rt.start(a)
    wait_for(lambda: "ready" in [ln.text for ln in rt.logs(a["worker"], 1)], what="the worker ready")
    return a


def test_both_supervisors_tell_a_stopped_worker_why_and_how_long_it_has(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    out = tmp_path / "reason.json"
    a = _reason_keeper(rt, assignment, out, "sys.exit(3)")
    end = rt.stop(a["worker"], 1, grace=20, reason="preempted by run \u00e9t\u00e9 (priority 100 > 10)")
    assert end.state == EXITED and end.exit_code == 3 and end.extra["stop_requested"] is True
    assert end.extra["killed"] is False and end.message is None
    got = json.loads(out.read_text())
    assert got["reason"] == "preempted by run \u00e9t\u00e9 (priority 100 > 10)"
    assert 15 < got["grace_seconds"] <= 20
    d = rt.dir(a["worker"], 1)
    st = os.stat(os.path.join(d, "signal", "stop-reason"))
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (0, "0o440")  # root's, readable by the worker's group only


def test_both_supervisors_stop_their_worker_when_they_are_sent_sigterm(tmp_path, make_rt, assignment, supervisor):
    """SIGTERM to the supervisor itself (a machine shutting down) is a stop with the runtime's grace: the worker
    reads why, and ends by SIGTERM."""
    import signal

    rt = make_rt(tmp_path / "state", stop_grace=5)
    out = tmp_path / "reason.json"
    a = _reason_keeper(rt, assignment, out, "signal.signal(signal.SIGTERM, signal.SIG_DFL); os.kill(os.getpid(), 15)")
    os.kill(_shim(rt, a["worker"]), signal.SIGTERM)
    end = wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s, timeout=30, what="the worker stopped")
    assert end.state == EXITED and end.signal == signal.SIGTERM and end.extra["stop_requested"] is True
    assert end.extra["killed"] is False
    got = json.loads(out.read_text())
    assert got["reason"] == "the worker's supervisor was asked to stop it"
    assert 3 < got["grace_seconds"] <= 5


def test_more_environment_than_the_c_supervisor_holds_gets_the_python_shim(tmp_path, make_rt, assignment):
    _native_or_skip()
    rt = make_rt(tmp_path / "state")
    env = {f"V{i}": str(i) for i in range(native.MAX_ITEMS["env"] + 5)}
    a = assignment(command="sh", args=["-c", "echo $V4099; sleep 30"], env=env)
    assert started(rt, a).state == RUNNING
    assert os.readlink(f"/proc/{_shim(rt, a['worker'])}/exe") != native.BINARY
    wait_for(lambda: [ln.text for ln in rt.logs(a["worker"], 1)] == ["4099"], what="every variable in the worker")
    rt.stop(a["worker"], 1, grace=2)


def test_an_incomplete_plan_is_a_start_failure_at_once(tmp_path):
    """The binary started without what it needs (never so by the launcher): failed.json says so at once, for the
    agent, instead of a start that times out."""
    _native_or_skip()
    import subprocess

    d = tmp_path / "state" / "workers" / "w.1"
    d.mkdir(parents=True)
    plan = tmp_path / "plan"
    plan.write_bytes(f"dir={d}\0".encode())  # the plan is read from descriptor 4
    r = subprocess.run(["sh", "-c", 'exec "$0" 4<"$1"', native.BINARY, str(plan)], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    failed = json.loads((d / "failed.json").read_text())
    assert failed["message"] == "the worker's supervisor got an incomplete plan from the shim launcher"
    assert not (d / "started.json").exists()


# Issue 42, items 6 and 7: what an isolated worker can reach of the machine, the same from either supervisor.
PARITY_PROBE = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def err(r):
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
out = {"host_shm": err(libc.shmget(int(sys.argv[1]), 0, 0)),
       "own_shm": err(libc.shmget(int(sys.argv[1]), 4096, 0o1000 | 0o600)),
       "ipc": os.readlink("/proc/self/ns/ipc"),
       "mqueue": [ln.split()[2] for ln in open("/proc/self/mounts") if ln.split()[1] == "/dev/mqueue"],
       "seccomp": next(ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("Seccomp:")),
       "unshare_user": err(libc.unshare(0x10000000)), "unshare_net": err(libc.unshare(0x40000000)),
       "clone3": err(libc.syscall(435, None, 0)),
       "add_key": err(libc.syscall({"x86_64": 248, "aarch64": 217}[os.uname().machine], b"user", b"k", b"v", 1, -2)),
       "dev": sorted(os.listdir("/dev")), "data": os.path.exists(sys.argv[2]),
       "data_top": sorted(os.listdir("/" + sys.argv[2].split("/")[1]))}
import multiprocessing
with multiprocessing.get_context("fork").Pool(2) as pool:  # threads, fork and /dev/shm as before
    out["pool"] = pool.map(abs, [-1, -2])
print(json.dumps(out), flush=True)
"""


def test_both_supervisors_give_a_worker_its_own_ipc_the_seccomp_filter_and_no_host_data(tmp_path, make_rt, assignment,
                                                                                         supervisor):
    import ctypes
    import shutil
    import tempfile
    import uuid

    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x42000000 | (uuid.uuid4().int & 0xFFFFFF)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # the host's segment, open to everyone
    assert shmid >= 0
    data = tempfile.mkdtemp(dir="/srv", prefix="astraeus-data-")  # a host data folder, open to everyone
    os.chmod(data, 0o755)
    with open(os.path.join(data, "train.csv"), "w") as f:
        f.write("x,y\n")
    try:
        rt = make_rt(tmp_path / "state")
        a = assignment(PARITY_PROBE, args=[str(key), os.path.join(data, "train.csv")])
        rt.start(a)
        end = wait_for(lambda: (s := rt.status(a["worker"], 1)).final and s, timeout=60)
        text = [ln.text for ln in rt.logs(a["worker"], 1)]
        assert end.exit_code == 0, text
        out = json.loads(text[-1])
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
        shutil.rmtree(data, ignore_errors=True)
    # its own IPC namespace: the host's segment cannot be named, its own can be made; its own POSIX queues
    assert out["host_shm"] == "ENOENT" and out["own_shm"] == "ok", out
    assert out["ipc"] != os.readlink("/proc/self/ns/ipc") and out["mqueue"] == ["mqueue"], out
    # the containers' seccomp filter
    assert out["seccomp"] == "2"
    assert out["unshare_user"] == out["unshare_net"] == out["add_key"] == "EPERM" and out["clone3"] == "ENOSYS", out
    # a container's /dev (and the GPUs'), no host data folder
    assert "fuse" not in out["dev"] and "net" not in out["dev"] and "kvm" not in out["dev"], out["dev"]
    assert {"null", "zero", "urandom", "shm", "pts", "mqueue"} <= set(out["dev"]), out["dev"]
    assert out["data"] is False and out["data_top"] == [], out  # /srv: an empty folder in the view
    assert out["pool"] == [1, 2]
