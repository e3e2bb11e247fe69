"""Requested resources are enforced by the worker's cgroup(s): memory (an OOM kill is reported as
`Out of memory (limit 256 MiB)`), CPU quota, pids (a fork bomb stops there), and GPU device nodes other than the
assigned ones. Real processes through the ProcessRuntime (cgroup v1 on this hybrid host, v2 where that has the
controllers); one end-to-end test through a real cluster for the OOM reason. Every cgroup is gone afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys

import pytest

from astraeus.agent.gpus import gpu_deny_rules, gpu_device_nodes
from astraeus.agent.runtime import cgroups
from astraeus.agent.runtime.base import EXITED, RUNNING
from astraeus.agent.runtime.process import ProcessRuntime
from tests.conftest import start_cluster

from .conftest import pid_alive, wait_for

MIB = 1 << 20
HOST = cgroups.detect()
needs_limits = pytest.mark.skipif(
    not all(HOST.worker("x")._dir(c)[0] for c in ("memory", "cpu", "pids")),
    reason="this machine has no cgroup memory, cpu and pids controllers (v1 or v2) the agent may use")

HOG = r"""
import sys, time
print("allocating", flush=True)
chunks = []
for i in range(64):  # 64 x 16 MiB = 1 GiB, each page written
    chunks.append(b"x" * (16 << 20))
    if i % 8 == 0:
        print(f"{(i + 1) * 16} MiB", flush=True)
print("allocated 1 GiB: the limit did not hold", flush=True)
"""

SLEEPER = r"""
import os, sys, time
open(os.path.join(sys.argv[1], "ready"), "w").close()
time.sleep(60)
"""

# Forks children that sleep, up to 1000 of them and for 20 s at most, so a limit that fails cannot hang the
# machine; prints how many it got before fork() failed.
FORK_BOMB = r"""
import errno, os, sys, time
out = sys.argv[1]
n, end = 0, time.monotonic() + 20
while n < 1000 and time.monotonic() < end:
    try:
        pid = os.fork()
    except OSError as e:
        print(f"fork failed after {n} children: {errno.errorcode[e.errno]}", flush=True)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
    with open(os.path.join(out, "children"), "a") as f:
        f.write(f"{pid}\n")
else:
    print(f"forked {n} children: no limit", flush=True)
open(os.path.join(out, "done"), "w").close()
time.sleep(0.5)
"""


def worker_cgroup(rt: ProcessRuntime, worker: str, attempt: int = 1) -> cgroups.WorkerCgroup:
    with open(os.path.join(rt.dir(worker, attempt), "started.json")) as f:
        started = json.load(f)
    cg = cgroups.WorkerCgroup.from_json(started["cgroups"])
    assert cg is not None and cg.dirs, f"the worker has no cgroup: {started}"
    return cg


def read(cg: cgroups.WorkerCgroup, controller: str, name: str) -> str:
    d, _ = cg._dir(controller)
    assert d, f"no {controller} folder in {cg.dirs}"
    with open(os.path.join(d, name)) as f:
        return f.read().strip()


def assert_removed(rt: ProcessRuntime, cg: cgroups.WorkerCgroup | None = None) -> None:
    """Every cgroup folder of this runtime's workers is gone (the shim removes them when the worker ends)."""
    for d in cg.dirs if cg else []:
        wait_for(lambda d=d: not os.path.exists(d), timeout=5, what=f"{d} removed")
    assert cgroups.leftovers(rt.cgroups, rt.owner + "-") == []


def final(rt: ProcessRuntime, worker: str, timeout: float = 30):
    return wait_for(lambda: (s := rt.status(worker, 1)) is not None and s.final and s, timeout=timeout,
                    what=f"{worker} ended")


@needs_limits
def test_over_its_memory_limit_the_worker_is_oom_killed_and_says_so(tmp_path, assignment):
    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    a = assignment(HOG, memory_bytes=256 * MIB, cpu_cores=1)
    st = rt.start(a)
    cg = worker_cgroup(rt, a["worker"])
    end = final(rt, a["worker"])
    lines = [ln.text for ln in rt.logs(a["worker"], 1)]
    assert "allocated 1 GiB: the limit did not hold" not in lines, lines
    assert end.state == EXITED and end.signal == 9 and end.exit_code is None, end
    assert end.extra["oom"] and end.extra["oom_limit_bytes"] == 256 * MIB
    assert end.message == "killed by the kernel: out of memory (limit 256 MiB)"
    report = end.report()
    assert report.oom_limit_bytes == 256 * MIB and report.signal == 9
    assert not pid_alive(st.pid)
    assert_removed(rt, cg)


def test_no_memory_limit_when_the_assignment_gives_none(tmp_path, assignment):
    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    if rt.cgroup_root is None:
        pytest.skip("no cgroup on this machine")
    a = assignment(SLEEPER, args=[str(tmp_path)], memory_bytes=0)
    rt.start(a)
    wait_for(lambda: (tmp_path / "ready").exists())
    cg = worker_cgroup(rt, a["worker"])
    d, version = cg._dir("memory")
    if d:
        limit = read(cg, "memory", "memory.max" if version == 2 else "memory.limit_in_bytes")
        assert limit == "max" or int(limit) >= 1 << 60, limit
    end = rt.stop(a["worker"], 1, grace=1)
    assert end.state == EXITED and not end.extra["oom"] and end.report().oom_limit_bytes is None
    assert_removed(rt, cg)


@needs_limits
def test_limits_are_written_as_asked(tmp_path, assignment):
    """0.5 cores is a CFS quota of 50000 per 100000 µs; the memory limit leaves no swap; pids.max is the
    agent's setting. Read from the cgroup's files (never measured)."""
    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1, pids_max=64)
    a = assignment(SLEEPER, args=[str(tmp_path)], memory_bytes=256 * MIB, cpu_cores=0.5)
    st = rt.start(a)
    assert st.state == RUNNING
    wait_for(lambda: (tmp_path / "ready").exists())
    cg = worker_cgroup(rt, a["worker"])
    for d in cg.dirs:  # the worker's main process is in every one of them
        with open(os.path.join(d, "cgroup.procs")) as f:
            assert str(st.pid) in f.read().split(), d
    if cg._dir("cpu")[1] == 2:
        assert read(cg, "cpu", "cpu.max") == "50000 100000"
        assert read(cg, "memory", "memory.max") == str(256 * MIB)
        assert read(cg, "memory", "memory.swap.max") == "0"
    else:
        assert (read(cg, "cpu", "cpu.cfs_quota_us"), read(cg, "cpu", "cpu.cfs_period_us")) == ("50000", "100000")
        assert read(cg, "memory", "memory.limit_in_bytes") == str(256 * MIB)
        if os.path.exists(os.path.join(cg.v1["memory"], "memory.memsw.limit_in_bytes")):
            assert read(cg, "memory", "memory.memsw.limit_in_bytes") == str(256 * MIB)
    assert read(cg, "pids", "pids.max") == "64"
    end = rt.stop(a["worker"], 1, grace=1)
    assert end.state == EXITED
    assert_removed(rt, cg)


@needs_limits
def test_a_fork_bomb_stops_at_its_pids_limit(tmp_path, assignment):
    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1, pids_max=64)
    a = assignment(FORK_BOMB, args=[str(tmp_path)])
    rt.start(a)
    cg = worker_cgroup(rt, a["worker"])
    end = final(rt, a["worker"], timeout=60)
    lines = [ln.text for ln in rt.logs(a["worker"], 1)]
    failed = [ln for ln in lines if ln.startswith("fork failed after")]
    assert failed and failed[0].endswith(": EAGAIN"), lines
    n = int(failed[0].split()[3])
    assert 0 < n < 64, failed  # the main process and its children: 64 at most
    assert end.exit_code == 0  # the bomb's main process went on (the machine too) and ended on its own
    assert len((tmp_path / "children").read_text().split()) == n
    # what it left behind was killed with its tree: its cgroup is empty, and removed (the children's pids are
    # not checked by number: in the worker's own PID namespace they are not the host's)
    assert_removed(rt, cg)
    # the machine is fine: the next worker starts and runs
    b = assignment("print('still fine')")
    rt.start(b)
    assert final(rt, b["worker"]).exit_code == 0
    assert "still fine" in [ln.text for ln in rt.logs(b["worker"], 1)]
    assert_removed(rt)


# ------------------------------------------------------------------------------------------- GPU nodes


def make_nodes(dev, minors) -> None:
    dev.mkdir()
    for n in minors:
        os.mknod(dev / f"nvidia{n}", 0o666 | stat.S_IFCHR, os.makedev(195, n))
        os.chmod(dev / f"nvidia{n}", 0o666)
    os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    os.chmod(dev / "nvidiactl", 0o666)


def test_gpu_deny_rules_for_a_fake_set_of_device_numbers(tmp_path):
    dev = tmp_path / "dev"
    try:
        make_nodes(dev, [0, 1, 2, 3])
    except PermissionError:
        pytest.skip("cannot make device nodes here (not root)")
    (dev / "nvidia-uvm").touch()  # not a GPU node
    assert gpu_device_nodes(str(dev)) == {n: (195, n) for n in range(4)}
    assert gpu_deny_rules([1, 2], str(dev)) == ["c 195:0", "c 195:3"]
    assert gpu_deny_rules([], str(dev)) == [f"c 195:{n}" for n in range(4)]
    # NVML numbers GPUs by PCI order, the driver its nodes by minor: GPU index 0 may be /dev/nvidia3
    assert gpu_deny_rules([0], str(dev), minors={0: 3, 1: 2, 2: 1, 3: 0}) == ["c 195:0", "c 195:1", "c 195:2"]
    assert gpu_device_nodes(str(tmp_path / "none")) == {} and gpu_deny_rules([0], str(tmp_path / "none")) == []


NODE_PROBE = r"""
import errno, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    try:
        os.close(os.open(os.path.join(sys.argv[1], name), os.O_RDONLY))
        print(name, "opened", flush=True)
    except OSError as e:
        print(name, errno.errorcode[e.errno], flush=True)
"""


@pytest.mark.skipif("devices" not in HOST.v1, reason="no cgroup v1 devices controller (v2 filtering not implemented)")
def test_gpu_nodes_of_other_workers_are_unreachable(tmp_path, assignment):
    """Fake /dev/nvidia<N> nodes (major 195, no driver here): the worker's own GPUs' nodes pass the devices
    cgroup (ENXIO: no driver), the others are refused (EPERM). Not run on a real GPU machine."""
    dev = tmp_path / "dev"
    try:
        make_nodes(dev, [0, 1, 2, 3])
    except PermissionError:
        pytest.skip("cannot make device nodes here (not root)")
    rt = ProcessRuntime(str(tmp_path / "state"), stop_grace=1, device_dir=str(dev))
    a = assignment(NODE_PROBE, args=[str(dev)], gpu_indices=[1, 2])
    rt.start(a)
    cg = worker_cgroup(rt, a["worker"])
    assert final(rt, a["worker"]).exit_code == 0
    seen = dict(ln.text.split() for ln in rt.logs(a["worker"], 1))
    assert seen == {"nvidia0": "EPERM", "nvidia1": "ENXIO", "nvidia2": "ENXIO", "nvidia3": "EPERM",
                    "nvidiactl": "ENXIO"}, seen
    assert_removed(rt, cg)


# ------------------------------------------------------------------------------------------ end to end

OOM_CODE = ("chunks = []\nfor i in range(64):\n    chunks.append(b'x' * (16 << 20))\n"
            "print('allocated 1 GiB: the limit did not hold')")


@pytest.mark.faults
@needs_limits
def test_oom_reason_through_a_real_cluster(tmp_path):
    c = start_cluster(tmp_path / "home", gpus=2, env={"ASTRAEUS_RESTART_BACKOFF_BASE": "1"})
    try:
        with c.client() as cl:
            for name, policy in (("hog-never", "Never"), ("hog-retry", "OnFailure")):
                tt = {"image": "python:3.11", "command": sys.executable, "args": ["-c", OOM_CODE],
                      "restart_policy": policy, "max_restarts": 1,
                      "requested_resources": {"memory_bytes": 256 * MIB, "cpu_cores": 1}}
                r = cl.post("/runs", json={"metadata": {"name": name}, "spec": {"task_template": tt}})
                assert r.status_code == 201, r.text
        for name in ("hog-never", "hog-retry"):
            c.wait_for(lambda name=name: c.run(name)["status"]["state"] == "Failed", 90, what=f"{name} Failed")
        never = c.run("hog-never")["status"]["workers"][0]
        assert never["reason"] == "Failed (Out of memory (limit 256 MiB))"
        assert never["exit_code"] == 137
        retry = c.run("hog-retry")["status"]
        assert retry["workers"][0]["reason"] == "Failed (Out of memory (limit 256 MiB)); restart budget spent"
        reasons = [h["reason"] for h in retry["history"]]
        assert "Failed (Out of memory (limit 256 MiB)); restart 1 of 1 in 1s" in reasons, reasons
        assert "allocated 1 GiB" not in c.logs("hog-never-0")
    finally:
        c.stop()
    agents = tmp_path / "home" / "agents"
    for state in agents.iterdir() if agents.exists() else []:
        owner = hashlib.sha1(os.path.realpath(state).encode()).hexdigest()[:12]  # ProcessRuntime.owner
        wait_for(lambda o=owner: cgroups.leftovers(HOST, o + "-") == [], timeout=10, what="cgroups removed")


# ------------------------------------------------------------------------------------------ the reason


@pytest.mark.parametrize(("policy", "reason"), [
    ("OnFailure", "Restarting in 10s (Out of memory (limit 256 MiB); restart 1 of 10)"),
    ("Never", "Failed (Out of memory (limit 256 MiB))"),
])
def test_an_oom_kill_is_the_workers_reason(monkeypatch, policy, reason):
    """lifecycle.ended with the report's oom_limit_bytes (rows in SQLite, as tests/lifecycle makes them)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from astraeus.server import lifecycle as L
    from astraeus.server.db import Base
    from tests.lifecycle.rows import T0, World, place, running

    monkeypatch.delenv(L.BACKOFF_ENV, raising=False)
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine, expire_on_commit=False) as s:
        world = World(s)
        run = world.run(policy=policy)
        place(0)(world, run, T0)
        running(0)(world, run, T0 + 1)
        L.ended(s, run, run.workers[0], None, 9, None, T0 + 2, oom_limit_bytes=256 * MIB)
        w = run.workers[0]
        assert (w.reason, w.exit_code) == (reason, 137)
        if policy == "OnFailure":
            assert ("Pending", "Failed (Out of memory (limit 256 MiB)); restart 1 of 10 in 10s") in world.history(run)
        else:
            assert run.reason == "Failed (Out of memory (limit 256 MiB))"
    engine.dispose()


def test_cgroup_v2_files_written_for_a_worker(tmp_path):
    """cgroup v2 (a host whose v2 hierarchy has the memory, cpu and pids controllers; not this hybrid one): the
    files WorkerCgroup writes, in a stand-in folder, and the OOM count it reads back from memory.events."""
    h = cgroups.Hierarchies(v2=str(tmp_path / "astraeus"), v2_controllers=["memory", "cpu", "pids"])
    cg = h.worker("owner-job.1")
    assert cg.v1 == {} and cg.dirs == [str(tmp_path / "astraeus" / "owner-job.1")]
    d = tmp_path / "astraeus" / "owner-job.1"
    d.mkdir(parents=True)
    (d / "memory.swap.max").write_text("max")
    warnings = cg.create(cgroups.Limits(memory_bytes=256 * MIB, cpu_cores=0.5, pids_max=64,
                                        deny_devices=["c 195:1"]))
    got = {n: (d / n).read_text() for n in ("memory.max", "memory.swap.max", "cpu.max", "pids.max")}
    assert got == {"memory.max": str(256 * MIB), "memory.swap.max": "0", "cpu.max": "50000 100000", "pids.max": "64"}
    assert warnings == ["GPU device nodes of other workers are not blocked: no cgroup v1 devices controller "
                        "(cgroup v2 device filtering is not implemented)"]
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert cg.oom_kills() == 1
    assert cgroups.WorkerCgroup.from_json(cg.to_json()) == cg
    assert cgroups.cpu_quota_us(0.001) == 1000 and cgroups.cpu_quota_us(32) == 3_200_000


@pytest.mark.parametrize("wiped", [False, True], ids=["records", "state-wiped"])
def test_a_lost_shims_cgroup_is_removed_on_adoption(tmp_path, assignment, wiped):
    """The shim is SIGKILLed (and, in one variant, the state dir wiped too): the restarted agent stops the
    worker and removes its cgroup(s), from its records or by its name."""
    import shutil
    import signal as sig

    state = str(tmp_path / "state")
    rt1 = ProcessRuntime(state, stop_grace=1)
    if rt1.cgroup_root is None:
        pytest.skip("no cgroup on this machine")
    a = assignment(SLEEPER, args=[str(tmp_path)], memory_bytes=256 * MIB)
    pid = rt1.start(a).pid
    wait_for(lambda: (tmp_path / "ready").exists())
    cg = worker_cgroup(rt1, a["worker"])
    with open(os.path.join(rt1.dir(a["worker"], 1), "shim.json")) as f:
        shim = json.load(f)["shim_pid"]
    os.kill(shim, sig.SIGKILL)
    wait_for(lambda: not pid_alive(shim))
    if wiped:
        shutil.rmtree(rt1.workers_dir)
    assert cg.exists() and pid in cg.pids()
    rt2 = ProcessRuntime(state, stop_grace=1)
    rt2.adopt()
    wait_for(lambda: not pid_alive(pid), timeout=10, what="the worker stopped")
    assert_removed(rt2, cg)


def test_a_cgroup_that_cannot_be_made_is_an_error_not_a_silent_miss(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    cg = cgroups.WorkerCgroup("owner-job.1", v2=str(tmp_path / "file" / "owner-job.1"), v2_controllers=["memory"])
    with pytest.raises(OSError, match="cannot create the worker's cgroup owner-job.1"):
        cg.create(cgroups.Limits(memory_bytes=256 * MIB))
