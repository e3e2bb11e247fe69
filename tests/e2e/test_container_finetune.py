"""The recipe's fine-tune (examples/finetune/finetune.py, offline mode) in a container: a local cluster started
with `astraeus up --runtime container`, the run's image the python test image in a real local registry
(tests/oci.py: Debian bookworm minbase + python3, pushed to Debian's `docker-registry` on 127.0.0.1 and listed in
ASTRAEUS_INSECURE_REGISTRIES). It is preempted by an 8-GPU run and resumes at the same global step, with 0
restarts spent (issue 14, "Done when").

Where torch comes from: the python test image has no torch, and building a derived image with a torch layer
would push and unpack ~750 MiB on every fresh image cache. Instead the workspace is granted the folder where
this test's own venv has torch installed (its site-packages: torch==2.13.0+cpu and what it imports), a ReadOnly
drive `torch-site` mounts it at /opt/torch-site in the container, and the run's env sets
PYTHONPATH=/opt/torch-site. The wheel's ABI is CPython 3.11 on glibc, which the image's python3 (Debian's
3.11) and glibc (2.36) match. Everything else the worker runs is the image's: its python3, its libc, its
libstdc++, its root filesystem. This is also how a site shares a read-only software tree with its workers.

The checkpoints go to a ReadWrite drive (`ft-ckpt`, the recipe's drive.json, on a folder of its own so it does
not share one with the process-runtime recipe test); the preempting run is the busybox test image.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from astraeus.agent.runtime.container import container_tools_missing
from tests import oci
from tests.conftest import start_cluster
from tests.containers.conftest import busybox_image, busybox_layout  # noqa: F401
from tests.e2e.test_recipe import OFFLINE_ENV, sh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune"
CKPT_HOST = Path("/data/astraeus/ft-ckpt-container")
TORCH_MOUNT = "/opt/torch-site"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the container runtime needs root"),
    pytest.mark.skipif(bool(container_tools_missing()),
                       reason=f"container tools not installed: {', '.join(container_tools_missing())}"),
]


def torch_site_packages() -> str:
    """The site-packages folder holding this interpreter's torch (found without importing it)."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin, "the e2e tests need torch in the venv (make install)"
    return os.path.realpath(os.path.dirname(os.path.dirname(spec.origin)))


@pytest.fixture
def container_cluster(tmp_path, registry):  # noqa: F811
    site = torch_site_packages()
    c = start_cluster(tmp_path / "home", extra_args=["--runtime", "container", "--host-path", "/data/astraeus",
                                                     "--host-path", site],
                      env={"ASTRAEUS_INSECURE_REGISTRIES": registry.host})
    yield c
    c.stop()


def test_the_finetune_in_a_container_is_preempted_and_resumes_at_the_same_global_step(
        container_cluster, tmp_path, registry, python_layout, python_image, busybox_image):  # noqa: F811
    cluster = container_cluster
    layers = oci.layer_digests(python_layout)
    gets_before = {d: registry.blob_gets(d) for d in layers}
    site = torch_site_packages()
    cluster.wait_for(lambda: "ready (runtime: container (runc" in (cluster.home / "up.log").read_text(), 30,
                     what="astraeus up to say its machine runs containers")
    with cluster.client() as c:
        assert c.get("/machines").json()["items"][0]["runtime"].startswith("container (runc")
    for f in ("finetune.json", "urgent.json", "finetune.py"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    # a new cluster's workspace is a new owner (its own uid): the drive's folder starts afresh, handed to it
    shutil.rmtree(CKPT_HOST, ignore_errors=True)
    drive = json.loads((EXAMPLE / "drive.json").read_text())
    drive["spec"]["sources"][0]["path"] = str(CKPT_HOST)
    (tmp_path / "drive.json").write_text(json.dumps(drive))
    torch_drive = {"metadata": {"name": "torch-site"},
                   "spec": {"sources": [{"node": "gpu-01", "path": site, "mount_path": TORCH_MOUNT,
                                         "mode": "ReadOnly"}]}}
    (tmp_path / "torch-drive.json").write_text(json.dumps(torch_drive))
    for body, name in (("drive.json", "ft-ckpt"), ("torch-drive.json", "torch-site")):
        out = sh(cluster, tmp_path, f"""curl -fsS -X POST "$API/drives" -H "Authorization: Bearer $ASTRAEUS_TOKEN" \\
    -H 'content-type: application/json' -d @{body} | jq -r .metadata.name""")
        assert out == f"{name}\n"

    # The recipe's spec, with the local registry's image, the offline switches and torch from the drive.
    spec = json.loads((tmp_path / "finetune.json").read_text())
    tt = spec["spec"]["task_template"]
    tt["image"] = python_image
    tt["env"].update({**OFFLINE_ENV, "PYTHONPATH": TORCH_MOUNT})
    tt["datavolume_refs"].append({"name": "torch-site", "mount_path": TORCH_MOUNT, "mode": "ReadOnly"})
    tt["configs"] = [{"mounts": ["/app/finetune.py"], "value": (tmp_path / "finetune.py").read_text()}]
    (tmp_path / "finetune.full.json").write_text(json.dumps(spec))
    out = sh(cluster, tmp_path, """curl -fsS -X POST "$API/runs" -H "Authorization: Bearer $ASTRAEUS_TOKEN" \\
    -H 'content-type: application/json' -d @finetune.full.json | jq -r .metadata.name""")
    assert out == "finetune-r50\n"

    # While the machine pulls the image, the worker says so; then it runs from the image.
    reasons: set[str] = set()

    def steps() -> bool:
        reasons.add(str(cluster.worker("finetune-r50-0").get("reason")))
        return cluster.logs("finetune-r50-0").count("global_step") >= 2

    cluster.wait_for(steps, 240, interval=0.05, what="periodic lines")
    assert f"Pulling image {python_image}" in reasons, reasons
    w = cluster.worker("finetune-r50-0")
    assert w["state"] == "Running" and w["image"] == python_image
    assert w["environment"] == f"container {python_image}"  # the machine ran it from the image, not the host
    tail = sh(cluster, tmp_path, "astra astraeus logs finetune-r50-0 | tail -n 2").splitlines()
    assert all(json.loads(t)["global_step"] % 10 == 0 for t in tail)

    # Preempt it with an 8-GPU run from another image of the same registry.
    out = sh(cluster, tmp_path, f"""astra astraeus run --name urgent-eval --image {busybox_image} \\
    --gpus 8 --machines 1 --cpus 4 --mem 16G --time 20m -- sh -c 'cat /etc/astraeus-test-image; sleep 8'""")
    assert re.fullmatch(r"urgent-eval submitted to main: http://127\.0\.0\.1:\d+/o/acme/w/vision/jobs/main/urgent-eval\n",
                        out), out
    cluster.wait_for(lambda: "written in" in cluster.logs("finetune-r50-0"), 90, what="the checkpoint on SIGTERM")
    tail = sh(cluster, tmp_path, "astra astraeus logs finetune-r50-0 | tail -n 3").splitlines()
    assert tail[1] == "SIGTERM: saving a checkpoint after this step"
    m = re.fullmatch(r"checkpoint at global step (\d+) written in \d+\.\ds; exiting", tail[2])
    assert m, tail
    saved_step = int(m.group(1))
    assert (CKPT_HOST / "finetune-r50" / "ckpt.pt").exists()  # written from inside the container, on the drive
    runs = cluster.wait_for(lambda: (o := sh(cluster, tmp_path, "astra astraeus runs")) and
                            "waiting to run again" in o and "1 of 1 workers running" in o and o, 60,
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
    cluster.wait_for(lambda: "busybox test image" in cluster.logs("urgent-eval-0"), 60, what="the urgent run's output")

    # It resumes when the urgent run ends: same global step, no restart spent, the image not pulled again.
    cluster.wait_for(lambda: "resuming at" in cluster.logs("finetune-r50-0"), 180, what="the resume")
    cluster.wait_for(lambda: cluster.logs("finetune-r50-0").split("resuming at")[1].count("global_step") >= 1,
                     120, what="a line after resuming")
    tail = sh(cluster, tmp_path, "astra astraeus logs finetune-r50-0 | grep -A1 'resuming at'").splitlines()
    r = re.fullmatch(r"resuming at epoch (\d+), step (\d+) \(global step (\d+)\)", tail[0])
    assert r and int(r.group(3)) == saved_step, tail
    assert json.loads(tail[1])["global_step"] > saved_step
    worker = cluster.worker("finetune-r50-0")
    assert worker["state"] == "Running"
    assert worker["restarts"] == 0 and worker["preemptions"] == 1
    assert cluster.run("finetune-r50")["status"]["preemptions"] == 1
    assert cluster.run("urgent-eval")["status"]["state"] == "Completed"
    # one pull in all: the resumed attempt started from the machine's image cache
    assert {d: registry.blob_gets(d) - gets_before[d] for d in layers} == {d: 1 for d in layers}

    assert sh(cluster, tmp_path, "astra astraeus delete finetune-r50") == "finetune-r50 deleted\n"
    cluster.wait_for(lambda: cluster.run("finetune-r50").get("status", {}).get("state") in (None, "Cancelled"),
                     60, what="the run to be deleted")
