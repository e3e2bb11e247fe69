"""Issue 46, live: `astraeus up --gpu-memory-gib 40` (real control plane, real agent, process runtime): a run asking
20 GiB of GPU memory takes half of one simulated 40 GiB GPU and sees it in its environment (ASTRAEUS_GPU_FRACTION,
its GPU, an MPS memory limit of the bytes asked); one asking more than a GPU holds waits with a why-not line."""

from __future__ import annotations

import re

from astraeus.main import app as astraeus_app
from tests.conftest import start_cluster

SHOW = 'echo "share $ASTRAEUS_GPU_FRACTION gpu $CUDA_VISIBLE_DEVICES limit $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"; sleep 60'
GIB = 1 << 30


def asking(name: str, gpu_memory: int) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sh", "args": ["-c", SHOW],
        "requested_resources": {"gpu_requests": {"count": 1, "memory_bytes": gpu_memory}, "cpu_cores": 0.05,
                                "memory_bytes": 64 << 20}}}}


def test_a_gpu_memory_run_takes_its_share_of_a_simulated_gpu(tmp_path):
    c = start_cluster(tmp_path / "home", gpus=2, extra_args=["--gpu-memory-gib", "40"])
    try:
        with c.client() as cl:
            for name, asked in (("mem-a", 20 * GIB), ("mem-b", 20 * GIB), ("huge", 48 * GIB)):
                r = cl.post("/runs", json=asking(name, asked))
                assert r.status_code == 201, r.text
        for n in ("mem-a", "mem-b"):
            c.wait_for(lambda n=n: c.run(n)["status"]["state"] == "Running", 120, 0.5, f"{n} Running")
            w = c.worker(f"{n}-0")
            assert w["gpu_fraction"] == 0.5 and w["gpu_indices"] == [0], w  # both halves of GPU 0 (best fit)
            line = c.wait_for(lambda n=n: re.search(r"share .*", c.logs(f"{n}-0")), 60, 0.5, f"{n}'s line")
            assert line.group(0) == "share 0.5 gpu 0 limit 0=20480M", line.group(0)

        def lines():
            return {x["machine"]: x["reason"] for x in c.worker("huge-0").get("why_not") or []} or None

        got = c.wait_for(lines, 60, 0.5, "huge's why-not lines")
        assert got["gpu-01"] == "machine's GPUs have 40 GiB of memory, 48 GiB asked (less than one GPU's memory)"
        assert c.run("huge")["status"]["state"] == "Pending"
    finally:
        c.stop()


def test_up_refuses_a_gpu_memory_that_is_no_size(tmp_path):
    from typer.testing import CliRunner

    r = CliRunner().invoke(astraeus_app, ["up", "--home", str(tmp_path), "--gpu-memory-gib", "0"])
    assert r.exit_code == 2
    assert "--gpu-memory-gib 0: give each GPU's memory in GiB, more than 0" in r.output


def test_agent_refuses_a_gpu_memory_that_is_no_size():
    from typer.testing import CliRunner

    r = CliRunner().invoke(astraeus_app, ["agent", "--server", "http://127.0.0.1:9", "--token", "t",
                                          "--gpus", "1", "--gpu-memory-gib", "-1"])
    assert r.exit_code == 2
    assert "--gpu-memory-gib -1: give each GPU's memory in GiB, more than 0" in r.output
