"""Issue 17's "done when": an `astra slurm sbatch --template=ft` fine-tune gets its checkpoint drive from the
template (the `ft-ckpt` drive at /ckpt), checkpoints to it, is preempted and resumes. The page's finetune.sbatch
as it is (`-J finetune`, its image, `--gres=gpu:8`; train.py checkpoints to /ckpt/$SLURM_JOB_NAME/latest.pt):
the script cannot mount a drive, the template does. Modelled on test_ft_lowprio, which does the same through
the API without a template."""

import json
import re
import shutil
from pathlib import Path

from tests.e2e.test_recipe import sh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ft-lowprio"
DATA = Path("/data/astraeus/ft-ckpt")
DRIVE = {"metadata": {"name": "ft-ckpt"},
         "spec": {"sources": [{"node": "gpu-01", "path": str(DATA), "mount_path": "/ckpt", "mode": "ReadWrite"}],
                  "permissions": {"create": True}}}
# The template: the drive the script cannot mount, CPU and memory per GPU as ft-lowprio.json asks, and a pace for
# this CPU (the tiny model would finish 20,000 steps in seconds).
TEMPLATE = {"metadata": {"name": "ft", "labels": {"kind": "fine-tune"}},
            "spec": {"task_template": {
                "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}],
                "env": {"STEP_SLEEP": "0.02", "LOG_EVERY": "20"},
                "requested_resources": {"per_gpu": {"cpu_cores": 8, "memory_bytes": 64 << 30}}}}}


def test_sbatch_template_fine_tune_checkpoints_to_the_drive_is_preempted_and_resumes(cluster, tmp_path):
    # a new cluster's workspace is a new owner (its own uid): the drive's folder starts afresh, handed to it
    shutil.rmtree(DATA, ignore_errors=True)
    (DATA / "code").mkdir(parents=True)
    shutil.copy(EXAMPLE / "train.py", DATA / "code" / "train.py")
    shutil.copy(EXAMPLE / "finetune.sbatch", tmp_path / "finetune.sbatch")
    (tmp_path / "drive.json").write_text(json.dumps(DRIVE))
    (tmp_path / "ft.json").write_text(json.dumps(TEMPLATE))

    assert sh(cluster, tmp_path, "astra astraeus drives create -f drive.json") == "ft-ckpt created\n"
    assert sh(cluster, tmp_path, "astra astraeus templates create -f ft.json") == "template ft created (version 1)\n"
    out = sh(cluster, tmp_path, "astra slurm sbatch --template=ft --nice=100 finetune.sbatch")
    assert out == "Submitted batch job finetune\n"

    run = cluster.run("finetune")
    assert run["spec"]["priority"] == -100 and run["spec"]["template"] == "ft"
    assert run["metadata"]["labels"] == {"kind": "fine-tune"}
    tt = run["spec"]["task_template"]
    assert [(d["name"], d["mount_path"]) for d in tt["datavolume_refs"]] == [("ft-ckpt", "/ckpt")]
    assert tt["image"] == "nvcr.io/nvidia/pytorch:24.08-py3" and tt["time_limit_seconds"] == 48 * 3600
    assert tt["requested_resources"]["gpu_requests"]["count"] == 8  # the script's --gres=gpu:8, the template's per_gpu
    assert tt["requested_resources"]["per_gpu"] == {"cpu_cores": 8, "memory_bytes": 64 << 30}

    cluster.wait_for(lambda: cluster.logs("finetune-0").count('"step"') >= 2, 180, what="training steps")
    assert cluster.worker("finetune-0")["gpu_indices"] == list(range(8))

    out = sh(cluster, tmp_path, "astra astraeus run --name urgent --image python:3.11 --gpus 8 --time 5m "
                                "-- python -c \"import time; time.sleep(3)\"")
    assert out.startswith("urgent submitted to main: ")
    cluster.wait_for(lambda: "written; exiting" in cluster.logs("finetune-0"), 90, what="the SIGTERM checkpoint")
    saved = int(re.search(r"SIGTERM: checkpoint at step (\d+) written; exiting", cluster.logs("finetune-0"))[1])
    assert (DATA / "finetune" / "latest.pt").exists()  # on the drive, through the template's mount
    run = cluster.wait_for(lambda: (r := cluster.run("finetune"))["status"]["state"] == "Pending" and r, 60,
                           what="the preempted job to wait")
    assert run["status"]["reason"] == "Preempted by higher-priority work (urgent); waiting to run again"
    line = cluster.wait_for(lambda: (o := sh(cluster, tmp_path, "astra slurm squeue -j finetune")) and
                            " PD " in o and o.splitlines()[1], 30, what="squeue's PD line")
    assert "finetune" in line

    cluster.wait_for(lambda: "resuming at step" in cluster.logs("finetune-0"), 180, what="the resume")
    resumed = int(re.search(r"resuming at step (\d+)", cluster.logs("finetune-0"))[1])
    assert resumed == saved + 1  # the page's train.py: start = state["step"] + 1
    w = cluster.worker("finetune-0")
    assert w["restarts"] == 0 and w["preemptions"] == 1
