"""Items 8 and 9: drive paths through the file system, and read-only drives, against real shims (ProcessRuntime).

A symlink inside a granted folder that points out, and a folder swapped for a symlink (renameat2
RENAME_EXCHANGE, thousands of times) while workers are being set up: a worker never sees the canary outside the
grant (checked by inode); it gets the intended folder or fails to start with a clear reason. A ReadOnly drive
stays read-only: writes fail with EROFS and the worker cannot remount it read-write; mounts made inside a
worker do not appear on the host. (tests/agent/test_runtime.py::test_symlink_escape_is_refused covers
`link -> /etc`; test_configs_and_drives_inside_the_worker covers EROFS.)"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import threading
import time

import pytest

from astraeus.agent.runtime.base import START_FAILED, StartFailed
from astraeus.agent.runtime.process import ProcessRuntime

from .conftest import wait_for

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
AT_FDCWD = -100
RENAME_EXCHANGE = 2

PROBE = r"""
import json, os, sys
root = sys.argv[1]
st = os.stat(root)
print(json.dumps({"ino": st.st_ino, "dev": st.st_dev, "names": sorted(os.listdir(root))}), flush=True)
"""


@pytest.fixture
def rt(tmp_path):
    r = ProcessRuntime(str(tmp_path / "state"), stop_grace=1)
    yield r
    for st in r.list():
        if not st.final:
            r.stop(st.worker, st.attempt, grace=0)


def _assignment(tmp_path, worker: str, code: str, args: list[str], mounts: list[dict]) -> dict:
    script = tmp_path / f"{worker}.py"
    script.write_text(code)
    # workers see the host read-only with a private /tmp: the test's folder is shared as a ReadWrite drive
    os.chmod(tmp_path, 0o777)
    share = {"host_path": str(tmp_path), "mount_path": str(tmp_path), "read_only": False, "create": False,
             "granted_root": str(tmp_path)}
    return {"worker": worker, "attempt": 1, "run": "fs", "desired": "Running", "image": "python:3.11",
            "command": "python", "args": [str(script), *args], "env": {}, "gpu_indices": [],
            "mounts": [share, *mounts], "configs": []}


def _result(rt, worker: str) -> tuple[object, list[str]]:
    st = wait_for(lambda: (s := rt.status(worker, 1)) is not None and s.final and s, timeout=30, what=worker)
    return st, [ln.text for ln in rt.logs(worker, 1)]


def _canary(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "CANARY").write_text("secret")
    return outside, os.stat(outside).st_ino


@pytest.mark.parametrize("target", ["../..", "/etc", "../outside", "..", "."])
def test_symlink_inside_a_grant_pointing_out_is_refused(rt, tmp_path, target):
    granted = tmp_path / "data"
    granted.mkdir()
    outside, _ = _canary(tmp_path)
    os.symlink(target, granted / "link")
    for hp in (granted / "link", granted / "link" / "sub"):
        a = _assignment(tmp_path, f"ln{abs(hash((target, str(hp)))) % 10**8}", PROBE, ["/mnt/x"], [
            {"host_path": str(hp), "mount_path": str(tmp_path / "m"), "read_only": False, "create": True,
             "granted_root": str(granted)}])
        with pytest.raises(StartFailed, match="symlink"):
            rt.start(a)
        assert rt.status(a["worker"], 1).state == START_FAILED
    assert not (outside / "sub").exists() and not os.path.exists("/etc/sub")


@pytest.mark.faults
def test_folder_swapped_for_a_symlink_during_setup_never_escapes(rt, tmp_path):
    granted = tmp_path / "data"
    (granted / "d" / "sub").mkdir(parents=True)
    (granted / "d" / "sub" / "INSIDE").write_text("ok")
    outside, canary_ino = _canary(tmp_path)
    (outside / "sub").mkdir()
    (outside / "sub" / "CANARY").write_text("secret")
    evil_sub_ino = os.stat(outside / "sub").st_ino
    good_ino = os.stat(granted / "d" / "sub").st_ino
    os.symlink(str(outside), granted / "evil")
    a, b = os.fsencode(granted / "d"), os.fsencode(granted / "evil")
    stop = threading.Event()
    swaps = [0]

    def swapper():
        while not stop.is_set():
            if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0:
                swaps[0] += 1

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    outcomes = {"intended": 0, "refused": 0}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        for i in range(24):
            a_ = _assignment(tmp_path, f"race{i}", PROBE, [str(mnt / f"m{i}")], [
                {"host_path": str(granted / "d" / "sub"), "mount_path": str(mnt / f"m{i}"), "read_only": True,
                 "create": False, "granted_root": str(granted)}])
            try:
                rt.start(a_)
            except StartFailed as e:
                assert "symlink" in str(e) or "does not exist" in str(e) or "not a directory" in str(e), str(e)
                outcomes["refused"] += 1
                continue
            st, text = _result(rt, f"race{i}")
            assert st.exit_code == 0, text
            seen = json.loads(text[0])
            assert seen["ino"] not in (canary_ino, evil_sub_ino) and "CANARY" not in seen["names"], seen
            assert seen["ino"] == good_ino and seen["names"] == ["INSIDE"], seen
            outcomes["intended"] += 1
        while swaps[0] < 2000:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join()
    assert swaps[0] >= 2000
    assert sum(outcomes.values()) == 24, outcomes


REMOUNT = r"""
import ctypes, ctypes.util, errno, json, os, sys
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
ro, scratch = sys.argv[1], sys.argv[2]
out = {}
try:
    open(os.path.join(ro, "w"), "w")
    out["write"] = "ok"
except OSError as e:
    out["write"] = errno.errorcode[e.errno]
MS_REMOUNT, MS_BIND = 32, 4096
r = libc.mount(None, ro.encode(), None, MS_REMOUNT | MS_BIND, None)
out["remount"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
try:
    open(os.path.join(ro, "w2"), "w")
    out["write_after"] = "ok"
except OSError as e:
    out["write_after"] = errno.errorcode[e.errno]
# a mount of its own, made inside: plain, then in a user namespace of its own
os.makedirs(scratch, exist_ok=True)
r = libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", 0, None)
out["mount"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
    r = libc.mount(None, ro.encode(), None, MS_REMOUNT | MS_BIND, None)
    out["userns_remount"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
    r = libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", 0, None)
    out["userns_mount"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
    try:
        open(os.path.join(ro, "w3"), "w")
        out["userns_write"] = "ok"
    except OSError as e:
        out["userns_write"] = errno.errorcode[e.errno]
print(json.dumps(out), flush=True)
"""


def test_read_only_stays_read_only_and_worker_mounts_stay_inside(rt, tmp_path):
    granted = tmp_path / "data"
    (granted / "ro").mkdir(parents=True)
    (granted / "ro" / "hello").write_text("hi")
    ro, scratch = tmp_path / "mnt" / "ro", tmp_path / "scratch"
    ro.parent.mkdir()  # (its mount point is made in the worker's view, never here)
    a = _assignment(tmp_path, "remount", REMOUNT, [str(ro), str(scratch)], [
        {"host_path": str(granted / "ro"), "mount_path": str(ro), "read_only": True, "create": False,
         "granted_root": str(granted)}])
    rt.start(a)
    st, text = _result(rt, "remount")
    assert st.exit_code == 0, text
    out = json.loads(text[-1])
    assert out["write"] == "EROFS"
    assert out["remount"] != "ok" and out["write_after"] == "EROFS", out
    assert out.get("userns_remount", "EPERM") != "ok" and out.get("userns_write", "EROFS") == "EROFS", out
    assert sorted(os.listdir(granted / "ro")) == ["hello"]  # nothing written through
    with open("/proc/self/mountinfo") as f:
        host = f.read()
    assert str(scratch) not in host and str(ro) not in host  # nothing the worker mounted shows on the host
