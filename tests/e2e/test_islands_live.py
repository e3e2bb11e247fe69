"""Issue 46, live: `astraeus up --gpus 8 --nvlink-islands 0-3,4-7` (real control plane, real agent declaring two
NVLink islands, process runtime): a 4-GPU worker started beside a 1-GPU one gets the other island whole
(CUDA_VISIBLE_DEVICES 4,5,6,7, never 1-4); a 4-GPU run with 5 GPUs free but no island holding 4 of them waits
with a why-not line that says so; bad islands are refused with what to change."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from astraeus.main import app as astraeus_app
from tests.conftest import start_cluster

SHOW = 'echo "gpus $CUDA_VISIBLE_DEVICES"; sleep 60'


def asking(name: str, gpus: int) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sh", "args": ["-c", SHOW],
        "requested_resources": {"gpu_requests": {"count": gpus}, "cpu_cores": 0.05, "memory_bytes": 64 << 20}}}}


def test_a_workers_gpus_lie_in_one_nvlink_island(tmp_path):
    c = start_cluster(tmp_path / "home", gpus=8, extra_args=["--nvlink-islands", "0-3,4-7"])
    try:
        with c.client() as cl:
            def start(name: str, gpus: int) -> list[int]:
                assert cl.post("/runs", json=asking(name, gpus)).status_code == 201
                c.wait_for(lambda: c.run(name)["status"]["state"] == "Running", 120, 0.5, f"{name} Running")
                return c.worker(f"{name}-0")["gpu_indices"]

            def end(name: str) -> None:
                assert cl.delete(f"/runs/{name}").status_code in (200, 202)
                c.wait_for(lambda: (c.run(name).get("status") or {}).get("state") not in ("Running", "Stopping"), 120, 0.5,
                           f"{name} ended")

            assert start("one", 1) == [0]
            assert start("four", 4) == [4, 5, 6, 7]  # the lowest free GPUs would be 1-4, across the islands
            line = c.wait_for(lambda: re.search(r"gpus \S+", c.logs("four-0")), 60, 0.5, "four's line")
            assert line.group(0) == "gpus 4,5,6,7"
            assert start("trio", 3) == [1, 2, 3]
            end("four")
            assert start("pair", 2) == [4, 5]
            end("trio")
            # Free now: 1, 2, 3 and 6, 7: five GPUs, no island with four of them.
            assert cl.post("/runs", json=asking("late", 4)).status_code == 201

        def lines():
            return {x["machine"]: x["reason"] for x in c.worker("late-0").get("why_not") or []} or None

        got = c.wait_for(lines, 60, 0.5, "late's why-not lines")
        assert got["gpu-01"].startswith("no NVLink island has 4 free GPUs"), got
        assert c.run("late")["status"]["state"] == "Pending"
    finally:
        c.stop()


def test_up_and_agent_refuse_islands_that_are_not_the_machines():
    r = CliRunner().invoke(astraeus_app, ["up", "--home", "/nonexistent-astraeus-home", "--gpus", "8",
                                          "--nvlink-islands", "0-3,4-8"])
    assert r.exit_code == 2
    assert "--nvlink-islands 0-3,4-8: '4-8' names GPU 8, and the machine has 8 GPUs (indices 0-7)" in r.output
    r = CliRunner().invoke(astraeus_app, ["agent", "--server", "http://127.0.0.1:9", "--token", "t",
                                          "--gpus", "8", "--nvlink-islands", "0-3,3-7"])
    assert r.exit_code == 2
    assert "--nvlink-islands 0-3,3-7: GPU 3 is in two islands ('0-3' and '3-7'): a GPU is in one island" in r.output
