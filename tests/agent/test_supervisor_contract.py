"""One contract, two per-worker supervisors (issue 43): every test here runs on the Python shim
(astraeus.agent.runtime.shim) and on the C supervisor (shim_native.c), ids "python" and "c".

What the agent relies on, whichever supervisor a worker got:
  log lines        log.jsonl's lines, byte for byte as json.dumps writes them (seq, time, stream, text), invalid
                   UTF-8 replaced, CR LF ends, long lines split at 64 KiB, partial lines flushed after a second;
  stop             stop.json + a signal, or SIGTERM to the supervisor: the stop reason and the grace left are
                   written for the worker before SIGTERM reaches its main process; SIGKILL to the whole tree when
                   the grace runs out;
  result files     shim.json, started.json, exit.json (and failed.json): the same keys, the same meanings;
  privacy          the worker's environment is on no command line and in no environment block of the supervisor;
  isolation        the worker's own IPC namespace, the containers' seccomp filter, no host data folder;
  missing plan     a supervisor started without what it needs writes failed.json at once.
Which workers get the C supervisor is tests/agent/test_native_shim.py's.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from astraeus.agent.runtime import native
from astraeus.agent.runtime.base import EXITED, RUNNING
from astraeus.agent.runtime.shim import INCOMPLETE_PLAN
from tests.agent.conftest import pid_alive, started, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LONG = "import time\nwhile True: time.sleep(0.1)\n"


@pytest.fixture(scope="session")
def c_binary() -> str:
    """The C supervisor, built from shim_native.c when it is missing or older (as `make install` builds it)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): every worker gets the Python shim, and the C supervisor cannot be built")
    r = subprocess.run(["make", "-s", os.path.relpath(native.BINARY, ROOT)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return native.BINARY


@pytest.fixture(params=["python", "c"])
def supervisor(request, monkeypatch) -> str:
    """Each test on the Python shim (ASTRAEUS_NATIVE_SHIM=0 in the agent) and on the C supervisor."""
    if request.param == "c":
        request.getfixturevalue("c_binary")
        if os.geteuid() != 0:
            pytest.skip("the C supervisor is for isolated workers: the agent must run as root")
        monkeypatch.delenv(native.ENV_VAR, raising=False)
        assert native.binary_for_agent() == native.BINARY, "the built binary is not the current shim_native.c's"
    else:
        monkeypatch.setenv(native.ENV_VAR, "0")
    return request.param


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("an isolated worker (its own namespaces, view and user) needs an agent that runs as root")


def _shim(rt, worker: str) -> int:
    with open(os.path.join(rt.dir(worker, 1), "shim.json")) as f:
        return json.load(f)["shim_pid"]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _check_supervisor(rt, worker: str, supervisor: str) -> int:
    """The worker's supervisor (its pid) is the one the test is for; while it runs."""
    pid = _shim(rt, worker)
    assert (os.readlink(f"/proc/{pid}/exe") == native.BINARY) == (supervisor == "c")
    return pid


def _final(rt, worker: str, timeout: float = 30):
    return wait_for(lambda: (s := rt.status(worker, 1)).final and s, timeout=timeout, what=f"{worker} ended")


def _files(rt, worker: str) -> dict[str, dict]:
    d = rt.dir(worker, 1)
    return {name: json.loads(_read(os.path.join(d, name))) for name in ("shim.json", "started.json", "exit.json")}


# ------------------------------------------------------------------------------------------------- log lines

# What a worker prints, as bytes: text, invalid UTF-8 (each maximal bad part one U+FFFD), controls, quotes,
# CR LF endings, a line longer than 64 KiB (split while it has no end), stderr, then a partial line the supervisor
# flushes after a second, and a last one without a newline (flushed when the worker ends).
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


def test_log_lines_are_written_alike(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    go = tmp_path / "go"
    a = assignment(f"LINES = {LINES!r}\n" + NOISY, args=[str(go)])
    rt.start(a)
    # the partial line is written on its own once it has waited a second (a progress bar's last state shows)
    wait_for(lambda: "progress 50%" in [ln.text for ln in rt.logs(a["worker"], 1)], timeout=30,
             what="the partial line flushed")
    _check_supervisor(rt, a["worker"], supervisor)
    go.write_text("")
    end = _final(rt, a["worker"])
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
        obj = json.loads(raw)
        assert raw.decode() == json.dumps(obj) and list(obj) == ["seq", "time", "stream", "text"]


def test_a_full_log_turns_into_log_jsonl_1_and_the_new_file_says_where_it_starts(tmp_path, make_rt, assignment,
                                                                                  supervisor, monkeypatch):
    """Two files of half the log's bytes in turn; the new log.jsonl starts with {"base": N}, N the bytes of the
    worker's log before it (its older files'), so offsets keep counting across files."""
    monkeypatch.setenv("ASTRAEUS_WORKER_LOG_FILE_BYTES", str(64 * 1024))
    rt = make_rt(tmp_path / "state")
    go = tmp_path / "go"
    script = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n" \
             "for i in range(1, 3001): print(f'line {i:05d} ' + 'x' * 90)\n"
    a = assignment(script)
    assert started(rt, a).state == RUNNING
    _check_supervisor(rt, a["worker"], supervisor)
    go.write_text("")
    assert _final(rt, a["worker"]).exit_code == 0
    d = rt.dir(a["worker"], 1)
    new, old = _read(os.path.join(d, "log.jsonl")), _read(os.path.join(d, "log.jsonl.1"))
    assert len(new) + len(old) <= 64 * 1024
    head, *lines = new.splitlines()
    old_head = json.loads(old.splitlines()[0])
    assert head == json.dumps({"base": old_head["base"] + len(old)}).encode() and "base" in old_head
    seqs = [json.loads(ln)["seq"] for ln in [*old.splitlines()[1:], *lines]]
    assert seqs == list(range(3001 - len(seqs), 3001))


# ------------------------------------------------------------------------------------------------------ stop

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


def test_a_stopped_worker_reads_why_and_how_long_it_has_before_sigterm(tmp_path, make_rt, assignment, supervisor):
    _needs_root()
    rt = make_rt(tmp_path / "state")
    out = tmp_path / "reason.json"
    a = _reason_keeper(rt, assignment, out, "sys.exit(3)")
    _check_supervisor(rt, a["worker"], supervisor)
    end = rt.stop(a["worker"], 1, grace=20, reason="preempted by run \u00e9t\u00e9 (priority 100 > 10)")
    assert end.state == EXITED and end.exit_code == 3 and end.extra["stop_requested"] is True
    assert end.extra["killed"] is False and end.message is None
    got = json.loads(out.read_text())
    assert list(got) == ["reason", "grace_seconds", "requested_at"]
    assert got["reason"] == "preempted by run \u00e9t\u00e9 (priority 100 > 10)"
    assert 15 < got["grace_seconds"] <= 20
    d = rt.dir(a["worker"], 1)
    st = os.stat(os.path.join(d, "signal", "stop-reason"))
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (0, "0o440")  # root's, readable by the worker's group only


def test_sigterm_to_the_supervisor_is_a_stop_with_the_runtimes_grace(tmp_path, make_rt, assignment, supervisor):
    """SIGTERM to the supervisor itself (a machine shutting down) is a stop with the runtime's grace: the worker
    reads why, and ends by SIGTERM."""
    _needs_root()
    rt = make_rt(tmp_path / "state", stop_grace=5)
    out = tmp_path / "reason.json"
    a = _reason_keeper(rt, assignment, out, "signal.signal(signal.SIGTERM, signal.SIG_DFL); os.kill(os.getpid(), 15)")
    os.kill(_check_supervisor(rt, a["worker"], supervisor), signal.SIGTERM)
    end = _final(rt, a["worker"])
    assert end.state == EXITED and end.signal == signal.SIGTERM and end.extra["stop_requested"] is True
    assert end.extra["killed"] is False
    got = json.loads(out.read_text())
    assert got["reason"] == "the worker's supervisor was asked to stop it"
    assert 3 < got["grace_seconds"] <= 5


STUBBORN = r"""
import os, signal, subprocess, sys, time
out = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: open(os.path.join(out, "term"), "w").close())  # noted, then ignored
child = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "time.sleep(300)"], start_new_session=True)  # its own session: only the tree finds it
with open(os.path.join(out, "child"), "w") as f:
    f.write(str(child.pid))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_sigterm_first_then_sigkill_to_the_whole_tree_when_the_grace_runs_out(tmp_path, make_rt, assignment,
                                                                              supervisor):
    rt = make_rt(tmp_path / "state")
    a = assignment(STUBBORN, args=[str(tmp_path)])
    st = started(rt, a)
    assert st.state == RUNNING
    wait_for(lambda: "ready" in [ln.text for ln in rt.logs(a["worker"], 1)], what="the worker ready")
    _check_supervisor(rt, a["worker"], supervisor)
    marked = [p for p in _pids_marked(rt.marker(a["worker"], 1)) if p != st.pid]
    assert marked, "the worker's child carries its marker"
    grace = 1.5
    t0 = time.monotonic()
    end = rt.stop(a["worker"], 1, grace=grace)
    took = time.monotonic() - t0
    assert grace - 0.2 <= took <= grace + 1.5, took
    assert (tmp_path / "term").exists(), "SIGTERM came first"
    assert end.state == EXITED and end.signal == signal.SIGKILL and end.exit_code is None
    assert end.extra["killed"] is True and end.extra["stop_requested"] is True
    assert end.message == "killed (SIGKILL) when the stop grace ran out"
    assert not any(pid_alive(p) for p in marked), "the whole tree is killed"


def _pids_marked(marker: str) -> list[int]:
    want = f"ASTRAEUS_WORKER_ID={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if want in _read(f"/proc/{name}/environ").split(b"\0"):
                    found.append(int(name))
            except OSError:
                pass
    return found


# ---------------------------------------------------------------------------------------------- result files

SHIM_KEYS = ["shim_pid", "shim_create_time"]
STARTED_KEYS = ["pid", "pid_create_time", "pgid", "shim_pid", "shim_create_time", "started_at", "cgroup", "cgroups",
                "limits"]
EXIT_KEYS = ["exit_code", "signal", "killed", "finished_at", "stop_requested", "message", "oom", "oom_limit_bytes"]


def test_an_exit_code_and_the_files_that_record_the_worker(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    t0 = time.time()
    go = tmp_path / "go"
    a = assignment(command="sh", args=["-c", f"echo up; while [ ! -e {go} ]; do sleep 0.05; done; exit 3"])
    st = started(rt, a)
    assert st.state == RUNNING
    shim = _check_supervisor(rt, a["worker"], supervisor)
    go.write_text("")
    end = _final(rt, a["worker"])
    assert end.state == EXITED and end.exit_code == 3 and end.signal is None
    files = _files(rt, a["worker"])
    assert list(files["shim.json"]) == SHIM_KEYS and list(files["started.json"]) == STARTED_KEYS
    assert list(files["exit.json"]) == EXIT_KEYS
    started_ = files["started.json"]
    assert started_["pid"] == started_["pgid"] == st.pid and started_["shim_pid"] == shim == files["shim.json"]["shim_pid"]
    assert started_["shim_create_time"] == files["shim.json"]["shim_create_time"]
    assert t0 - 1 <= started_["pid_create_time"] <= started_["started_at"] <= files["exit.json"]["finished_at"]
    assert started_["limits"] == json.loads(_read(os.path.join(rt.dir(a["worker"], 1), "spec.json"))).get("limits")
    assert files["exit.json"] == {**files["exit.json"], "exit_code": 3, "signal": None, "killed": False,
                                  "stop_requested": False, "message": None, "oom": False, "oom_limit_bytes": None}
    for name in ("shim.json", "started.json", "exit.json", "log.jsonl"):  # the worker's environment is in some
        assert os.stat(os.path.join(rt.dir(a["worker"], 1), name)).st_mode & 0o777 == 0o600, name
    assert [ln.text for ln in rt.logs(a["worker"], 1)] == ["up"]


def test_what_the_main_process_leaves_behind_is_killed_and_said(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    go = tmp_path / "go"
    a = assignment(command="sh", args=["-c", f"setsid sleep 300 & while [ ! -e {go} ]; do sleep 0.05; done"])
    assert started(rt, a).state == RUNNING
    _check_supervisor(rt, a["worker"], supervisor)
    left = wait_for(lambda: [p for p in _pids_marked(rt.marker(a["worker"], 1))
                             if _read(f"/proc/{p}/cmdline").startswith(b"sleep\0")], what="the sleep started")
    go.write_text("")
    end = _final(rt, a["worker"])
    assert end.exit_code == 0 and end.extra["killed"] is False and end.extra["stop_requested"] is False
    assert end.message == "processes left behind by the main process were killed"
    assert not any(pid_alive(p) for p in left)


def test_a_signal_that_ends_the_worker_is_its_result(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    go = tmp_path / "go"
    a = assignment(command="sh", args=["-c", f"while [ ! -e {go} ]; do sleep 0.05; done; kill -USR2 $$"])
    assert started(rt, a).state == RUNNING
    _check_supervisor(rt, a["worker"], supervisor)
    go.write_text("")
    end = _final(rt, a["worker"])
    assert end.state == EXITED and end.exit_code is None and end.signal == signal.SIGUSR2
    exit_ = _files(rt, a["worker"])["exit.json"]
    assert (exit_["killed"], exit_["stop_requested"], exit_["message"], exit_["oom"]) == (False, False, None, False)


# --------------------------------------------------------------------------------------------------- privacy

def test_the_workers_environment_stays_off_the_supervisor(tmp_path, make_rt, assignment, supervisor):
    """The worker's environment (tokens, keys) is on no command line and in no environment block of its
    supervisor; what the supervisor's environment block shows is what adoption looks for. The supervisor has its
    own session, started by the shim launcher, and holds none of the launcher's pipes to the agent."""
    _needs_root()
    rt = make_rt(tmp_path / "state")
    secret = "s3cr3t-value-of-the-worker"
    seen = tmp_path / "seen"
    a = assignment(command="sh", args=["-c", f'test "$API_TOKEN" = {secret} && touch {seen}; sleep 300'],
                   env={"API_TOKEN": secret})
    assert started(rt, a).state == RUNNING
    wait_for(seen.exists, what="the worker with its variable")
    shim = _check_supervisor(rt, a["worker"], supervisor)
    assert secret.encode() not in _read(f"/proc/{shim}/cmdline")
    environ = _read(f"/proc/{shim}/environ")
    assert secret.encode() not in environ
    env = dict(i.decode().split("=", 1) for i in environ.split(b"\0") if b"=" in i)
    assert env["ASTRAEUS_SHIM_OWNER"] == rt.owner  # what adopt() looks for
    assert env["ASTRAEUS_SHIM_ID"] == os.path.basename(rt.dir(a["worker"], 1))
    assert os.getsid(shim) == shim
    with open(f"/proc/{shim}/stat") as f:
        assert int(f.read().rsplit(")", 1)[1].split()[1]) == rt.launcher.proc.pid
    held = {os.readlink(f"/proc/{shim}/fd/{fd}") for fd in os.listdir(f"/proc/{shim}/fd")}
    for pipe in (rt.launcher.proc.stdin, rt.launcher.proc.stdout):
        assert os.readlink(f"/proc/self/fd/{pipe.fileno()}") not in held
    spec = _read(os.path.join(rt.dir(a["worker"], 1), "spec.json"))
    assert rt.stop(a["worker"], 1, grace=2).state == EXITED
    wait_for(lambda: not os.path.exists(f"/proc/{shim}"), what="the ended supervisor to be reaped")
    assert _read(os.path.join(rt.dir(a["worker"], 1), "spec.json")) == spec  # left as the agent wrote it


# ------------------------------------------------------------------------------------------------- isolation

# Issue 42, items 6 and 7: what an isolated worker can reach of the machine.
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
import time
time.sleep(300)  # still running while the test checks which supervisor it has
"""


def test_a_worker_gets_its_own_ipc_the_seccomp_filter_and_no_host_data(tmp_path, make_rt, assignment, supervisor):
    _needs_root()
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
        text = wait_for(lambda: [ln.text for ln in rt.logs(a["worker"], 1)], timeout=60, what="the probe's line")
        _check_supervisor(rt, a["worker"], supervisor)
        out = json.loads(text[-1])
        rt.stop(a["worker"], 1, grace=0)
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


# ---------------------------------------------------------------------------------------------- missing plan

def test_a_supervisor_without_its_plan_is_a_start_failure_at_once(tmp_path, supervisor):
    """Started without what it needs (never so by the launcher): failed.json says so at once, for the agent,
    instead of a start that times out. The C supervisor reads its plan from descriptor 4 (here: only the worker
    folder), the Python shim from spec.json (here: no command)."""
    d = tmp_path / "state" / "workers" / "w.1"
    d.mkdir(parents=True)
    if supervisor == "c":
        plan = tmp_path / "plan"
        plan.write_bytes(f"dir={d}\0".encode())
        argv = ["sh", "-c", 'exec "$0" 4<"$1"', native.BINARY, str(plan)]
    else:
        (d / "spec.json").write_text(json.dumps({"marker": "owner:w.1", "env": {}}))
        argv = [sys.executable, "-c", "import sys; from astraeus.agent.runtime import shim; "
                "shim.main(sys.argv, detached=True)", str(d / "spec.json")]
    r = subprocess.run(argv, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    failed = json.loads((d / "failed.json").read_text())
    assert list(failed) == ["message", "time"]
    assert failed["message"].startswith(INCOMPLETE_PLAN), failed
    assert not (d / "started.json").exists() and not (d / "exit.json").exists()
