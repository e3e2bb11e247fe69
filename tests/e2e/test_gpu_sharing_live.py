"""Issue 46, live: 16 runs of `fraction: 0.5` run at once on one 8-GPU simulated machine (`astraeus up`, real agent,
real processes), on both runtimes; each sees its share in its environment: ASTRAEUS_GPU_FRACTION, its GPU in
CUDA_VISIBLE_DEVICES and the MPS variables of that GPU's daemon (simulated GPUs: the variables, and the agent log's
note that no MPS control daemon runs)."""

from __future__ import annotations

import re
from collections import Counter

from tests.conftest import start_cluster

SHOW = ('echo "share $ASTRAEUS_GPU_FRACTION gpu $CUDA_VISIBLE_DEVICES threads $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE '
        'pipe $CUDA_MPS_PIPE_DIRECTORY logdir $CUDA_MPS_LOG_DIRECTORY"; sleep 120')


def half(name: str, image: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": image, "command": "sh", "args": ["-c", SHOW],
        "requested_resources": {"gpu_requests": {"count": 1, "fraction": 0.5}, "cpu_cores": 0.05,
                                "memory_bytes": 64 << 20}}}}


def test_sixteen_halves_run_at_once_on_eight_gpus_each_with_its_share(tmp_path, runtime):
    c = start_cluster(tmp_path / "home", gpus=8, env=runtime.env)
    try:
        names = [f"half-{k:02}" for k in range(16)]
        with c.client() as cl:
            for n in names:
                r = cl.post("/runs", json=half(n, runtime.image))
                assert r.status_code == 201, r.text

        def all_running():
            runs = [c.run(n) for n in names]
            return runs if all(r["status"]["state"] == "Running" for r in runs) else None

        c.wait_for(all_running, 120, 0.5, "16 shared runs Running at once")
        gpus = Counter()
        for n in names:
            w = c.worker(f"{n}-0")
            assert len(w["gpu_indices"]) == 1
            gpus[w["gpu_indices"][0]] += 1
            line = c.wait_for(lambda n=n: re.search(r"share .*", c.logs(f"{n}-0")), 60, 0.5, f"{n}'s line")
            said = line.group(0)
            assert said.startswith("share 0.5 gpu "), said
            assert "threads 50 " in said, said
            gpu = w["gpu_indices"][0]
            assert f"/mps/gpu{gpu}/pipe" in said and f"/mps/gpu{gpu}/log" in said, said
            seen = said.split()[3]
            assert seen == ("0" if runtime.kind == "container" else str(gpu)), said
        assert sorted(gpus) == list(range(8)) and set(gpus.values()) == {2}  # two tenants on each GPU, none over
        with c.client() as cl:  # the machine's view: every GPU held by two halves, as a whole
            (m,) = cl.get("/machines").json()["items"]
        assert (m["gpus_used"], m["gpus_allocated"], m["gpu_allocated"]) == (8, 8, [1] * 8), m
        table = c.run(names[0])["spec"]["task_template"]["requested_resources"]["gpu_requests"]
        assert table["count"] == 1 and table["fraction"] == 0.5
        log = (tmp_path / "home" / "agent-gpu-01.log").read_text()
        assert "is shared: nvidia-cuda-mps-control not found (simulated GPUs)" in log or "MPS control daemon" in log
    finally:
        c.stop()
