"""Issue 42, item 4: a worker's ephemeral storage limit (`requested_resources.ephemeral_storage_bytes`), measured by
its agent as the kubelet does: a worker writing past its limit is evicted with `Evicted: disk use over its limit
(64 MiB)` under its restart policy, and the control plane keeps answering. Bad limits are refused by name."""

from __future__ import annotations

import subprocess

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
