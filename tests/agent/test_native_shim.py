"""Which workers get the C supervisor (astraeus.agent.runtime.native, shim_native.c): an isolated worker gets it from
the shim launcher; every worker it does not fit, and every worker where it is turned off (ASTRAEUS_NATIVE_SHIM=0),
gets the Python shim. What either supervisor does for its worker (log lines, stops and their grace, result files,
environment privacy, isolation, a missing plan) is one contract: tests/agent/test_supervisor_contract.py runs it on
both. The rest (the whole tree killed, OOM, adoption after a wiped state dir, start failures, the worker's view and
user) is what tests/agent and tests/faults assert of every isolated worker: with `make install` these run on it."""

from __future__ import annotations

import os

import pytest

from astraeus.agent.runtime import native
from astraeus.agent.runtime.base import EXITED, RUNNING
from tests.agent.conftest import started, wait_for
from tests.agent.test_supervisor_contract import _read, _shim

LONG = "import time\nwhile True: time.sleep(0.1)\n"


def _native_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("the C supervisor is for isolated workers: the agent must run as root")
    if not os.access(native.BINARY, os.X_OK):
        pytest.skip(f"{native.BINARY} is not built (`make install` builds it with cc)")


def test_an_isolated_worker_gets_the_c_supervisor(tmp_path, make_rt, assignment):
    _native_or_skip()
    rt = make_rt(tmp_path / "state")
    a = assignment(LONG)
    assert started(rt, a).state == RUNNING
    shim = _shim(rt, a["worker"])
    assert os.readlink(f"/proc/{shim}/exe") == native.BINARY
    assert _read(f"/proc/{shim}/cmdline") == b"astraeus-shim-native\0"
    assert rt.stop(a["worker"], 1, grace=2).state == EXITED


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


def test_more_environment_than_the_c_supervisor_holds_gets_the_python_shim(tmp_path, make_rt, assignment):
    _native_or_skip()
    rt = make_rt(tmp_path / "state")
    env = {f"V{i}": str(i) for i in range(native.MAX_ITEMS["env"] + 5)}
    a = assignment(command="sh", args=["-c", "echo $V4099; sleep 30"], env=env)
    assert started(rt, a).state == RUNNING
    assert os.readlink(f"/proc/{_shim(rt, a['worker'])}/exe") != native.BINARY
    wait_for(lambda: [ln.text for ln in rt.logs(a["worker"], 1)] == ["4099"], what="every variable in the worker")
    rt.stop(a["worker"], 1, grace=2)
