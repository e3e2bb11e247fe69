"""Slurm's `--signal=[B:]SIG@SECS` on both supervisors (the Python shim and the C one): the worker gets SIG that many
seconds before its time limit, counted from the command's start, once, and runs on (the control plane stops it at
the limit itself)."""

from __future__ import annotations

import pytest

from astraeus.agent.runtime.base import EXITED
from tests.agent import test_supervisor_contract as contract
from tests.agent.conftest import wait_for
from tests.agent.test_supervisor_contract import _check_supervisor, _final

c_binary, supervisor = contract.c_binary, contract.supervisor  # its fixtures: each test on both supervisors

# A batch shell that traps USR1 and a child of it that says whether it got USR1 too. Each line is one write(): the
# whole-tree signal reaches both at once, and print()'s text and newline (two writes under PYTHONUNBUFFERED) from the
# two would interleave in the one pipe ("child got USR1main got USR1", then an empty line).
SCRIPT = r"""
import os, signal, subprocess, sys, time
def usr1(*_):
    os.write(1, b"main got USR1\n")
signal.signal(signal.SIGUSR1, usr1)
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, time\nsignal.signal(signal.SIGUSR1, lambda *_: os.write(1, b'child got USR1\\n'))\n"
    "os.write(1, b'child ready\\n')\nfor _ in range(200): time.sleep(0.05)\n"])
for _ in range(100):
    time.sleep(0.05)
child.kill()
os.write(1, b"main ends\n")
"""


def _texts(rt, worker: str) -> list[str]:
    return [ln.text for ln in rt.logs(worker, 1)]


@pytest.mark.parametrize("batch_only", [False, True], ids=["whole", "batch"])
def test_the_signal_comes_before_the_time_limit_and_the_worker_runs_on(tmp_path, make_rt, assignment, supervisor,
                                                                       batch_only):
    rt = make_rt(tmp_path / "state")
    # a time limit of 4 s, the signal 3 s before it: 1 s after the start
    a = assignment(SCRIPT, time_limit_seconds=4, signal={"name": "USR1", "seconds_before_limit": 3,
                                                         "batch_only": batch_only})
    rt.start(a)
    wait_for(lambda: "main got USR1" in _texts(rt, a["worker"]), timeout=15, what="the signal")
    _check_supervisor(rt, a["worker"], supervisor)
    end = _final(rt, a["worker"])
    assert end.state == EXITED and end.exit_code == 0
    texts = _texts(rt, a["worker"])
    assert texts.count("main got USR1") == 1 and "main ends" in texts  # once, and it ran on after it
    assert ("child got USR1" in texts) is not batch_only  # B: the batch shell alone


def test_no_time_limit_no_signal(tmp_path, make_rt, assignment, supervisor):
    rt = make_rt(tmp_path / "state")
    a = assignment(SCRIPT, signal={"name": "USR1", "seconds_before_limit": 3})
    rt.start(a)
    assert _final(rt, a["worker"]).exit_code == 0
    assert "main got USR1" not in _texts(rt, a["worker"])
