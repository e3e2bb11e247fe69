from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from astraeus.agent.runtime.base import START_FAILED, STARTING, StartFailed
from astraeus.agent.runtime.process import ProcessRuntime
from tests.runtimes import KINDS, container_skip_reason


def wait_for(pred, timeout: float = 10.0, interval: float = 0.02, what: str | None = None):
    end = time.monotonic() + timeout
    v = None
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}; last: {v!r}")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# A test marked `@both` runs on the process runtime and on the container runtime (ids "process", "container"):
# its `kind`, `rt`, `make_rt` and `assignment` are of that runtime. Unmarked tests run on the process runtime.
both = pytest.mark.parametrize("kind", KINDS, indirect=True)


@pytest.fixture
def kind(request) -> str:
    k = getattr(request, "param", "process")
    if k == "container":
        reason = container_skip_reason()
        if reason:
            pytest.skip(reason)
    return k


@pytest.fixture
def make_rt(kind, request):
    """make_rt(state_dir, stop_grace=2, **kw): a runtime of the test's kind (several may share a state dir, as an
    agent restarted on it does); whatever they left running is stopped at the end."""
    made = []

    def make(state_dir, stop_grace: float = 2, **kw):
        if kind == "container":
            r = request.getfixturevalue("containers").runtime(str(state_dir), stop_grace=stop_grace, **kw)
        else:
            r = ProcessRuntime(str(state_dir), stop_grace=stop_grace, **kw)
        made.append(r)
        return r

    yield make
    for r in reversed(made):  # leave nothing running
        try:
            sts = r.list()
        except OSError:
            continue
        for st in sts:
            if not st.final:
                r.stop(st.worker, st.attempt, grace=0)


@pytest.fixture
def rt(tmp_path, make_rt):
    return make_rt(tmp_path / "state", stop_grace=2)


def started(rt, a: dict):
    """Start `a` and wait until its command runs (a container's start may return while it is still Starting, e.g.
    mounting its root filesystem); returns the Running status, or the final one if it ended first."""
    st = rt.start(a)
    if st.state == STARTING:
        st = wait_for(lambda: (s := rt.status(a["worker"], a.get("attempt", 1))).state != STARTING and s,
                      what=f"{a['worker']} running")
    return st


def start_failure(rt, a: dict) -> str:
    """The reason `a` could not start: from start()'s StartFailed, or (a container that failed after start
    returned) from its StartFailed status."""
    try:
        st = rt.start(a)
    except StartFailed as e:
        return str(e)
    st = wait_for(lambda: (s := rt.status(a["worker"], a.get("attempt", 1))).state != STARTING and s,
                  what=f"{a['worker']} failing to start")
    assert st.state == START_FAILED, st
    return st.message or ""


@pytest.fixture
def assignment(tmp_path, kind, request):
    n = [0]
    # the container runtime's image is the python test image in the session's registry
    image = (request.getfixturevalue("containers").image if kind == "container"
             else "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime")

    def make(script: str | None = None, command: str = "python", args: list[str] | None = None, **kw) -> dict:
        n[0] += 1
        if script is not None:
            path = tmp_path / f"script{n[0]}.py"
            path.write_text(script)
            args = [str(path)] + list(args or [])
        # Workers see the host read-only with a private /tmp: the test's folder (its scripts, and what the worker
        # writes for the test to read) is shared with them as a ReadWrite drive at the same path, writable by the
        # workspace's unprivileged user (the agent's state dir inside it stays hidden).
        os.chmod(tmp_path, 0o777)
        share = {"host_path": str(tmp_path), "mount_path": str(tmp_path), "read_only": False, "create": False,
                 "granted_root": str(tmp_path)}
        a = {"worker": kw.pop("worker", f"job-{n[0]}"), "attempt": kw.pop("attempt", 1), "run": "job",
             "desired": "Running", "image": kw.pop("image", image),
             "command": command, "args": args or [], "env": kw.pop("env", {"TMPDIR_TEST": str(tmp_path)}),
             "gpu_indices": [], "mounts": [share, *kw.pop("mounts", [])], "configs": kw.pop("configs", [])}
        a.update(kw)
        return a

    return make


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path, request):
    """A real control plane (uvicorn in a thread, SQLite): its bootstrap tokens, "url", "api", and "cp". A test
    parametrized indirectly gives more of its settings (a dict of ServerSettings keywords)."""
    uvicorn = pytest.importorskip("uvicorn")
    from astraeus.app import create_app
    from astraeus.main import bootstrap
    from astraeus.server.core import ControlPlane
    from astraeus.settings import ServerSettings

    port = _free_port()
    settings = ServerSettings(home=tmp_path / "home", port=port, heartbeat=1, schedule_interval=1,
                              **getattr(request, "param", {}))
    cp = ControlPlane.open(settings)
    boot = bootstrap(cp, "acme", "vision", "main", [str(tmp_path / "data")])
    srv = uvicorn.Server(uvicorn.Config(create_app(settings, cp), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.02)
    boot["url"] = f"http://127.0.0.1:{port}"
    boot["api"] = f"{boot['url']}/api/v1/o/acme/w/vision"
    boot["cp"] = cp
    yield boot
    srv.should_exit = True
    t.join(timeout=10)
    cp.engine.dispose()


os.environ.setdefault("ASTRAEUS_STOP_GRACE", "2")
