"""The reference page's preemptible fine-tune: `ft-lowprio.json` (bash -c "exec torchrun …", the
"checkpoints" drive at /ckpt, /ckpt/ft-lowprio/latest.pt) preempted by an 8-GPU run and resumed."""

import json
import re
import shutil
from pathlib import Path

from tests.e2e.test_recipe import sh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ft-lowprio"
DRIVE = {"metadata": {"name": "checkpoints"},
         "spec": {"sources": [{"node": "gpu-01", "path": "/data/astraeus/checkpoints", "mount_path": "/ckpt",
                               "mode": "ReadWrite"}], "permissions": {"create": True}}}


def test_ft_lowprio_resumes_from_latest_pt(cluster, tmp_path):
    code = Path("/data/astraeus/checkpoints/code")
    # a new cluster's workspace is a new owner (its own uid): the drive's folder starts afresh, handed to it
    shutil.rmtree(code.parent, ignore_errors=True)
    code.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE / "train.py", code / "train.py")
    shutil.rmtree("/data/astraeus/checkpoints/ft-lowprio", ignore_errors=True)
    spec = json.loads((EXAMPLE / "ft-lowprio.json").read_text())
    assert spec["spec"]["priority"] == -100
    # The page's spec as it is, plus a pace for this CPU (the tiny model would finish 20,000 steps in seconds).
    spec["spec"]["task_template"]["env"] = {"STEP_SLEEP": "0.02", "LOG_EVERY": "20"}
    (tmp_path / "ft-lowprio.json").write_text(json.dumps(spec))
    (tmp_path / "drive.json").write_text(json.dumps(DRIVE))
    sh(cluster, tmp_path, 'curl -fsS -X POST "$API/drives" -H "Authorization: Bearer $ASTRAEUS_TOKEN" '
                          "-H 'content-type: application/json' -d @drive.json")
    out = sh(cluster, tmp_path, 'curl -fsS -X POST "$API/runs" -H "Authorization: Bearer $ASTRAEUS_TOKEN" '
                                "-H 'content-type: application/json' -d @ft-lowprio.json | jq -r .metadata.name")
    assert out == "ft-lowprio\n"
    cluster.wait_for(lambda: cluster.logs("ft-lowprio-0").count('"step"') >= 2, 180, what="training steps")
    w = cluster.worker("ft-lowprio-0")
    assert w["gpu_indices"] == list(range(8)) and w["image"] == "nvcr.io/nvidia/pytorch:24.08-py3"

    out = sh(cluster, tmp_path, "astra astraeus run --name urgent --image python:3.11 --gpus 8 --time 5m "
                                "-- python -c \"import time; time.sleep(3)\"")
    assert out.startswith("urgent submitted to main: ")
    cluster.wait_for(lambda: "written; exiting" in cluster.logs("ft-lowprio-0"), 90, what="the SIGTERM checkpoint")
    saved = int(re.search(r"SIGTERM: checkpoint at step (\d+) written; exiting", cluster.logs("ft-lowprio-0"))[1])
    assert Path("/data/astraeus/checkpoints/ft-lowprio/latest.pt").exists()
    run = cluster.wait_for(lambda: (r := cluster.run("ft-lowprio"))["status"]["state"] == "Pending" and r, 60,
                           what="the preempted run to wait")
    assert run["status"]["reason"] == "Preempted by higher-priority work (urgent); waiting to run again"
    assert run["status"]["console_reason"] == "Paused to make room for higher-priority work"

    cluster.wait_for(lambda: "resuming at step" in cluster.logs("ft-lowprio-0"), 180, what="the resume")
    resumed = int(re.search(r"resuming at step (\d+)", cluster.logs("ft-lowprio-0"))[1])
    assert resumed == saved + 1  # the page's train.py: start = state["step"] + 1
    w = cluster.worker("ft-lowprio-0")
    assert w["restarts"] == 0 and w["preemptions"] == 1
