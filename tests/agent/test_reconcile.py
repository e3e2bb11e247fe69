"""The agent's reconcile loop without a control plane: what it starts, stops and reports."""

from __future__ import annotations

import time

import pytest

from astraeus.agent.agent import Agent
from astraeus.agent.runtime.base import EXITED, RUNNING
from astraeus.agent.runtime.process import ProcessRuntime
from astraeus.protocol import Assignment

from .conftest import pid_alive, wait_for
from .test_runtime import CHECKPOINTER

DEAD = "http://127.0.0.1:1"  # nothing listens: the control plane is down


_made: list[Agent] = []


def _agent(tmp_path, **kw) -> Agent:
    rt = ProcessRuntime(str(tmp_path / "agent"), stop_grace=1)
    a = Agent(DEAD, "t", "gpu-01", runtime=rt, gpus=1, state_dir=str(tmp_path / "agent"), stop_grace=1,
              poll_wait=1, **kw)
    _made.append(a)
    return a


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    while _made:
        a = _made.pop()
        a.pool.shutdown(wait=True)
        for st in a.runtime.list():
            if not st.final:
                a.runtime.stop(st.worker, st.attempt, grace=0)


def _assign(agent, version: int, *items: dict) -> None:
    """What the agent does with a GET /assignments answer."""
    agent.set_assignments(version, [Assignment.model_validate(a) for a in items])


def _status(agent, key):
    return agent.statuses().get(key)


def test_reconcile_starts_once_and_stops_when_desired_stopped(tmp_path, assignment):
    agent = _agent(tmp_path)
    a = assignment(CHECKPOINTER, args=[str(tmp_path)], worker="ft-0", attempt=1)
    _assign(agent, 1, a)
    for _ in range(3):
        agent.reconcile()
    st = wait_for(lambda: (s := _status(agent, ("ft-0", 1))) and s.state == RUNNING and s)
    agent.reconcile()
    assert len(agent.runtime.list()) == 1 and agent.runtime.status("ft-0", 1).pid == st.pid
    wait_for(lambda: (tmp_path / "ready").exists())
    _assign(agent, 2, dict(a, desired="Stopped", stop_reason="Preempted"))
    agent.reconcile()
    end = wait_for(lambda: (s := _status(agent, ("ft-0", 1))).final and s, timeout=5)
    assert end.state == EXITED and end.exit_code == 0
    assert (tmp_path / "ckpt").read_text() == "sigterm"
    assert end.report().environment


def test_unassigned_worker_is_stopped_and_new_attempt_waits_for_it(tmp_path, assignment):
    agent = _agent(tmp_path)
    stubborn = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "open(sys.argv[1], 'w').close()\nwhile True: time.sleep(0.05)\n")
    a1 = assignment(stubborn, args=[str(tmp_path / "ignoring")], worker="w-0", attempt=1)
    _assign(agent, 1, a1)
    agent.reconcile()
    p1 = wait_for(lambda: (s := _status(agent, ("w-0", 1))) and s.state == RUNNING and s).pid
    wait_for(lambda: (tmp_path / "ignoring").exists())
    wait_for(lambda: not agent.starting)  # its start done: a worker still starting is left to the loop's next pass
    # a partition heals: attempt 1 is no longer assigned here, attempt 2 is
    a2 = assignment(command="python", args=["-c", "import time; time.sleep(30)"], worker="w-0", attempt=2)
    _assign(agent, 2, a2)
    t0 = time.monotonic()
    agent.reconcile()
    time.sleep(0.3)
    agent.reconcile()
    assert _status(agent, ("w-0", 2)) is None  # never two attempts of one worker at once
    wait_for(lambda: not pid_alive(p1), timeout=4)
    assert time.monotonic() - t0 >= 0.9  # SIGTERM ignored, SIGKILL at the grace
    wait_for(lambda: (agent.reconcile(), _status(agent, ("w-0", 2)))[1] is not None, timeout=5)
    st = wait_for(lambda: (s := _status(agent, ("w-0", 2))) and s.state == RUNNING and s)
    agent.runtime.stop("w-0", 2, grace=0)
    assert st.pid != p1


def test_stopped_before_it_started(tmp_path, assignment):
    agent = _agent(tmp_path)
    _assign(agent, 1, assignment(command="true", worker="x-0", attempt=3, desired="Stopped"))
    agent.reconcile()
    st = _status(agent, ("x-0", 3))
    assert st.state == EXITED and st.message == "stopped before it started"
    assert agent.runtime.list() == []


def test_control_plane_down_keeps_workers_running(tmp_path, assignment):
    rt = ProcessRuntime(str(tmp_path / "agent"), stop_grace=1)
    pid = rt.start(assignment(CHECKPOINTER, args=[str(tmp_path)], worker="keep-0", attempt=1)).pid
    agent = _agent(tmp_path)
    agent.start()
    try:
        time.sleep(1.5)  # registration fails and is retried; nothing is stopped
        assert pid_alive(pid)
        assert agent.assignments is None
    finally:
        agent.shutdown()
    assert pid_alive(pid)  # the agent exits without killing its workers
    rt.stop("keep-0", 1, grace=2)
    assert not pid_alive(pid)
