"""The recipe "Preemptible fine-tuning with checkpoints", its shell lines run verbatim against a local cluster
(the fine-tune in its offline mode), asserting what the page shows."""

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune"
OFFLINE_ENV = {"ASTRAEUS_OFFLINE": "1", "SAVE_EVERY": "10", "BATCH_SIZE": "16", "OFFLINE_SAMPLES": "1024",
               "STEP_SLEEP": "0.05", "EPOCHS": "2"}


def sh(cluster, cwd, line: str, check: bool = True) -> str:
    p = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=cluster.env, text=True,
                       capture_output=True, timeout=120)
    if check:
        assert p.returncode == 0, f"{line}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_the_recipe_end_to_end(cluster, tmp_path):
    for f in ("drive.json", "finetune.json", "urgent.json", "finetune.py"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    ckpt = Path("/data/astraeus/ft-ckpt/finetune-r50")
    # a new cluster's workspace is a new owner (its own uid): the drive's folder starts afresh, handed to it
    shutil.rmtree(ckpt.parent, ignore_errors=True)

    # 1. Create the checkpoint drive
    out = sh(cluster, tmp_path, """curl -fsS -X POST "$API/drives" -H "Authorization: Bearer $ASTRAEUS_TOKEN" \\
    -H 'content-type: application/json' -d @drive.json | jq -r .metadata.name""")
    assert out == "ft-ckpt\n"

    # 3. Submit the fine-tune at low priority (offline switches added to the page's env)
    sh(cluster, tmp_path, f"jq '.spec.task_template.env += {json.dumps(OFFLINE_ENV)}' finetune.json > ft.json && "
                          "mv ft.json finetune.json")
    sh(cluster, tmp_path, """jq --rawfile src finetune.py \\
    '.spec.task_template.configs = [{"mounts": ["/app/finetune.py"], "value": $src}]' \\
    finetune.json > finetune.full.json""")
    out = sh(cluster, tmp_path, """curl -fsS -X POST "$API/runs" -H "Authorization: Bearer $ASTRAEUS_TOKEN" \\
    -H 'content-type: application/json' -d @finetune.full.json | jq -r .metadata.name""")
    assert out == "finetune-r50\n"
    cluster.wait_for(lambda: cluster.logs("finetune-r50-0").count("global_step") >= 2, 180, what="periodic lines")
    tail = sh(cluster, tmp_path, "astra astraeus logs finetune-r50-0 | tail -n 2").splitlines()
    assert all(json.loads(t)["global_step"] % 10 == 0 for t in tail)

    # 4. Preempt it
    out = sh(cluster, tmp_path, """astra astraeus run --name urgent-eval --image pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime \\
    --gpus 8 --machines 1 --cpus 4 --mem 16G --time 20m \\
    -- python -c "import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep(8)\"""")
    assert re.fullmatch(r"urgent-eval submitted to main: http://127\.0\.0\.1:\d+/o/acme/w/vision/jobs/main/urgent-eval\n",
                        out), out
    cluster.wait_for(lambda: "written in" in cluster.logs("finetune-r50-0"), 60, what="the checkpoint on SIGTERM")
    tail = sh(cluster, tmp_path, "astra astraeus logs finetune-r50-0 | tail -n 3").splitlines()
    assert tail[1] == "SIGTERM: saving a checkpoint after this step"
    m = re.fullmatch(r"checkpoint at global step (\d+) written in \d+\.\ds; exiting", tail[2])
    assert m, tail
    saved_step = int(m.group(1))
    runs = cluster.wait_for(lambda: (o := sh(cluster, tmp_path, "astra astraeus runs")) and
                            "waiting to run again" in o and "1 of 1 workers running" in o and o, 30,
                            what="the runs table")
    assert runs.splitlines() == [
        "NAME                          CLUSTER       STATE       REASON",
        "urgent-eval                   main          Running     1 of 1 workers running",
        "finetune-r50                  main          Pending     Preempted by higher-priority work (urgent-eval); "
        "waiting to run again",
    ]
    run = cluster.run("finetune-r50")
    assert run["status"]["console_reason"] == "Paused to make room for higher-priority work"
    assert any(h["reason"] == "Preempted by higher-priority work (urgent-eval)" for h in run["status"]["history"])
    with cluster.client() as c:
        events = c.get("/events").json()["items"]
    assert any(e["kind"] == "Preempted" and e["object"] == "finetune-r50" for e in events)

    # 5. Watch it resume: the global step continues, and no restart is spent
    cluster.wait_for(lambda: "resuming at" in cluster.logs("finetune-r50-0"), 120, what="the resume")
    cluster.wait_for(lambda: cluster.logs("finetune-r50-0").split("resuming at")[1].count("global_step") >= 1,
                     120, what="a line after resuming")
    # (the page shows `tail -n 2` right after the resume; here lines keep coming, so take the two from the resume on)
    tail = sh(cluster, tmp_path, "astra astraeus logs finetune-r50-0 | grep -A1 'resuming at'").splitlines()
    r = re.fullmatch(r"resuming at epoch (\d+), step (\d+) \(global step (\d+)\)", tail[0])
    assert r and int(r.group(3)) == saved_step, tail
    assert json.loads(tail[1])["global_step"] > saved_step
    worker = cluster.worker("finetune-r50-0")
    assert worker["restarts"] == 0 and worker["preemptions"] == 1
    assert cluster.run("finetune-r50")["status"]["preemptions"] == 1

    # 6. Clean up
    assert sh(cluster, tmp_path, "astra astraeus delete finetune-r50") == "finetune-r50 deleted\n"
    assert sh(cluster, tmp_path, "astra astraeus delete urgent-eval") == "urgent-eval deleted\n"
    sh(cluster, tmp_path, 'curl -fsS -X DELETE "$API/drives/ft-ckpt" -H "Authorization: Bearer $ASTRAEUS_TOKEN"')
    assert (ckpt / "ckpt.pt").exists()  # Astraeus never deletes the files of a drive on one machine
    with cluster.client() as c:
        assert c.get("/drives/ft-ckpt").status_code == 404
    time.sleep(0.1)
