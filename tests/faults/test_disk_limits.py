"""Issue 42, item 4: a worker's ephemeral storage limit (`requested_resources.ephemeral_storage_bytes`), measured by
its agent as the kubelet does: a worker writing past its limit is evicted with `Evicted: disk use over its limit
(64 MiB)` under its restart policy, and the control plane keeps answering. A drive's size (`spec.size_bytes`) the
same way: its writers on the machine keeping it are evicted with `Evicted: drive ckpt over its size (64 MiB)`, its
ReadOnly readers run on. Bad limits and sizes are refused by name."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from .conftest import VENV_BIN, sleeper_run, wait_for

WRITER = """
import os, time
with open('big', 'wb') as f:
    for i in range(40):
        f.write(os.urandom(4 << 20)); f.flush(); os.fsync(f.fileno())
        print('wrote', (i + 1) * 4, 'MiB', flush=True)
        time.sleep(0.1)
print('all written', flush=True)
time.sleep(60)
"""


@pytest.mark.faults
def test_a_worker_writing_past_its_disk_limit_is_evicted(fleet):
    srv = fleet.server()
    fleet.agent(srv)
    with srv.client() as c:
        body = sleeper_run("filler", gpus=0, code=WRITER, restart="Never")
        body["spec"]["task_template"]["requested_resources"]["ephemeral_storage_bytes"] = 64 << 20
        assert c.post("/runs", json=body).status_code == 201, body
        run = wait_for(lambda: (r := c.get("/runs/filler").json())["status"]["state"] == "Failed" and r,
                       timeout=90, what="the worker evicted")
        w = c.get("/workers/filler-0").json()
        assert "Evicted: disk use over its limit (64 MiB)" in w["reason"], w
        assert "all written" not in c.get("/workers/filler-0/logs").text
        assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
        assert c.get("/runs").status_code == 200, run


def test_a_bad_disk_limit_is_refused_by_name(app):
    body = sleeper_run("bad", gpus=0)
    body["spec"]["task_template"]["requested_resources"]["ephemeral_storage_bytes"] = -1
    r = app.client.post(app.api + "/runs", headers=app.h(), json=body)
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith(
        "spec.task_template.requested_resources.ephemeral_storage_bytes: "), r.json()


@pytest.mark.parametrize("var,value", [("ASTRAEUS_DISK_PRESSURE_FREE_PERCENT", "-1"),
                                       ("ASTRAEUS_DISK_PRESSURE_FREE_PERCENT", "101"),
                                       ("ASTRAEUS_DEFAULT_EPHEMERAL_STORAGE_BYTES", "-5"),
                                       ("ASTRAEUS_DEFAULT_EPHEMERAL_STORAGE_BYTES", "lots")])
def test_bad_disk_settings_stop_the_server_with_the_variable_named(tmp_path, var, value):
    import os

    env = {**os.environ, var: value, "ASTRAEUS_HOME": str(tmp_path / "home")}
    p = subprocess.run([str(VENV_BIN / "astraeus"), "server", "--port", "1"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert f"{var}: must be" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


# ------------------------------------------------------------------------------------------- a drive's size
DRIVE_WRITER = """
import os, time
with open('/ckpt/big', 'wb') as f:
    for i in range(25):
        f.write(os.urandom(4 << 20)); f.flush(); os.fsync(f.fileno())
        print('wrote', (i + 1) * 4, 'MiB', flush=True)
        time.sleep(0.2)
print('all written', flush=True)
time.sleep(60)
"""

DRIVE_READER = """
import os, time
print('reading', os.path.getsize('/ckpt/big'), flush=True)
with open('/ckpt/big', 'rb') as f:
    while f.read(4 << 20):
        pass
print('read all', flush=True)
time.sleep(60)
"""


def _sized_drive(c: httpx.Client, name: str, size) -> tuple[httpx.Response, Path]:
    path = Path("/data/astraeus") / f"test-drive-size-{uuid.uuid4().hex[:12]}"
    body = {"metadata": {"name": name}, "spec": {"sources": [
        {"node": "gpu-01", "path": str(path), "mount_path": "/ckpt", "mode": "ReadWrite"}],
        "permissions": {"create": True}, "size_bytes": size}}
    return c.post("/drives", json=body), path


def _on_drive(run: dict, name: str, mode: str = "ReadWrite") -> dict:
    run["spec"]["task_template"]["datavolume_refs"] = [{"name": name, "mount_path": "/ckpt", "mode": mode}]
    return run


@pytest.mark.faults
def test_a_worker_writing_past_its_drives_size_is_evicted_and_a_reader_is_not(fleet):
    srv = fleet.server()
    fleet.agent(srv)
    with srv.client() as c:
        r, path = _sized_drive(c, "ckpt", 64 << 20)
        try:
            assert r.status_code == 201, r.text
            assert r.json()["spec"]["size_bytes"] == 64 << 20
            assert c.get("/drives/ckpt").json()["spec"]["size_bytes"] == 64 << 20
            assert c.post("/runs", json=_on_drive(sleeper_run("writer", gpus=0, code=DRIVE_WRITER, restart="Never"),
                                                  "ckpt")).status_code == 201
            run = wait_for(lambda: (r := c.get("/runs/writer").json())["status"]["state"] == "Failed" and r,
                           timeout=90, what="the drive's writer evicted")
            w = c.get("/workers/writer-0").json()
            assert "Evicted: drive ckpt over its size (64 MiB)" in w["reason"], w
            history = [h.get("reason") or "" for h in run["status"].get("history") or []]
            assert any("Evicted: drive ckpt over its size (64 MiB)" in h for h in history), run["status"]
            assert (path / "big").stat().st_size >= 64 << 20  # the drive is full (as measured): a reader finds it so
            assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
            assert c.get("/runs").status_code == 200

            # a worker reading (ReadOnly) the full drive runs on: it writes nothing to it
            assert c.post("/runs", json=_on_drive(sleeper_run("reader", gpus=0, code=DRIVE_READER, restart="Never"),
                                                  "ckpt", "ReadOnly")).status_code == 201
            wait_for(lambda: "read all" in c.get("/workers/reader-0/logs").text, timeout=60, what="the reader read")
            time.sleep(8)  # four measuring periods
            reader = c.get("/workers/reader-0").json()
            assert reader["state"] == "Running", reader
            assert "Evicted" not in (reader.get("reason") or ""), reader
        finally:
            shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("size", [0, -1, "64Mi", "67108864", 2**63, 1.5, True])
def test_a_bad_drive_size_is_refused_by_name_and_nothing_is_stored(app, size):
    body = {"metadata": {"name": "sized"}, "spec": {"sources": [
        {"node": "gpu-01", "path": "/data/astraeus/sized", "mount_path": "/ckpt", "mode": "ReadWrite"}],
        "size_bytes": size}}
    r = app.client.post(app.api + "/drives", headers=app.h(), json=body)
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("spec.size_bytes: "), r.json()
    assert app.client.get(app.api + "/drives/sized", headers=app.h()).status_code == 404
    assert "sized" not in [d["metadata"]["name"] for d in
                           app.client.get(app.api + "/drives", headers=app.h()).json()["items"]]


def test_a_drive_is_measured_as_it_is_mounted_and_a_full_one_cheaply(tmp_path):
    """The agent's measure of a drive folder (agent/disk.py): what it holds, opened below its granted root as the
    runtime opens it (a symlink in its path measures nothing); a full drive's walk ends once past its size."""
    from astraeus.agent.disk import drive_used_bytes, used_bytes

    drive = tmp_path / "grant" / "ckpt"
    for i in range(20):
        (drive / f"d{i}").mkdir(parents=True)
        (drive / f"d{i}" / "f").write_bytes(b"x" * (1 << 20))
    whole = used_bytes(str(drive))
    assert whole >= 20 << 20
    assert drive_used_bytes(str(drive), str(tmp_path / "grant")) == whole
    assert used_bytes(str(drive), stop_above=2 << 20) < whole  # stopped early, still over
    assert used_bytes(str(drive), stop_above=2 << 20) > 2 << 20
    (tmp_path / "grant" / "link").symlink_to(drive)
    assert drive_used_bytes(str(tmp_path / "grant" / "link"), str(tmp_path / "grant")) is None
    assert drive_used_bytes(str(tmp_path / "grant" / "gone"), str(tmp_path / "grant")) is None
