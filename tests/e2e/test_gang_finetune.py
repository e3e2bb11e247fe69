"""A 2-machine gang fine-tune (examples/gang/finetune.py under `torchrun` with no flags, CPU, gloo) that keeps its
checkpoint on a shared-filesystem drive: rank 0 saves after a barrier, the gang is preempted whole by a
higher-priority run, and its next attempt resumes at the step it saved, with no restart spent."""

import ipaddress
import json
import re
from pathlib import Path

import pytest

from astraeus import rendezvous
from tests.conftest import start_cluster
from tests.e2e.test_recipe import sh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gang"


@pytest.fixture
def fleet(tmp_path):
    """gpu-01 and gpu-02, one simulated GPU each, each in its own network namespace, both with the shared
    filesystem `lab` (a host folder) mounted at the same path; the workspace may use all of `lab`."""
    from astraeus.fleet import netns

    why = netns.unavailable()
    if why:
        pytest.skip(f"--netns: {why}")
    lab = tmp_path / "lab"
    lab.mkdir()
    c = start_cluster(tmp_path / "home", gpus=1, machines=2, stop_grace=15,
                      extra_args=["--netns", "--shared-fs", f"lab={lab}", "--host-path", "lab:/"])
    c.lab = lab
    yield c
    c.stop()


def test_gang_finetune_saves_on_a_shared_drive_is_preempted_whole_and_resumes(fleet, tmp_path):
    with fleet.client() as c:
        machines = fleet.wait_for(lambda: (m := c.get("/machines").json()["items"]) and len(m) == 2
                                  and all(x["state"] == "Ready" for x in m) and m, 60, what="two Ready machines")
        assert all(m["shared_filesystems"] == {"lab": str(fleet.lab)} for m in machines), machines
        r = c.post("/drives", json=json.loads((EXAMPLE / "drive.json").read_text()))
        assert r.status_code in (200, 201), r.text

    spec = json.loads((EXAMPLE / "finetune.json").read_text())
    assert spec["spec"]["priority"] == -100
    tt = spec["spec"]["task_template"]
    assert (tt["command"], tt["args"]) == ("torchrun", ["/app/finetune.py"])  # no flags
    tt["configs"] = [{"mounts": ["/app/finetune.py"], "value": (EXAMPLE / "finetune.py").read_text()}]
    tt["env"].update({"STEP_SLEEP": "0.05", "SAVE_EVERY": "20", "LOG_EVERY": "10"})  # a pace for this CPU
    (tmp_path / "gang-ft.json").write_text(json.dumps(spec))
    out = sh(fleet, tmp_path, 'curl -fsS -X POST "$API/runs" -H "Authorization: Bearer $ASTRAEUS_TOKEN" '
                              "-H 'content-type: application/json' -d @gang-ft.json | jq -r .metadata.name")
    assert out == "gang-ft\n"
    fleet.wait_for(lambda: "checkpoint at step 20\n" in fleet.logs("gang-ft-0"), 120, interval=0.5,
                   what="a periodic checkpoint")
    workers = [fleet.worker(f"gang-ft-{i}") for i in (0, 1)]
    assert {w["machine"] for w in workers} == {"gpu-01", "gpu-02"}  # one GPU each: one per machine
    assert all(w["state"] == "Running" for w in workers)
    ckpt = fleet.lab / "ft" / "gang-ft" / "ckpt.pt"  # the drive's folder on the shared filesystem
    assert ckpt.exists()

    # A run at priority 0 that needs one machine's GPU: the gang is preempted whole (both workers stop).
    out = sh(fleet, tmp_path, "astra astraeus run --name urgent --image python:3.11 --gpus 1 --time 5m "
                              "-- python -c \"import time; time.sleep(3)\"")
    assert out.startswith("urgent submitted to main: ")
    fleet.wait_for(lambda: "written; exiting" in fleet.logs("gang-ft-0"), 90, interval=0.5,
                   what="the SIGTERM checkpoint")
    saved = int(re.search(r"^SIGTERM: checkpoint at step (\d+) written; exiting$", fleet.logs("gang-ft-0"), re.M)[1])
    run = fleet.wait_for(lambda: (r := fleet.run("gang-ft"))["status"]["state"] == "Pending" and r, 60,
                         what="the preempted gang to wait")
    assert run["status"]["reason"] == "Preempted by higher-priority work (urgent); waiting to run again"
    assert run["status"]["console_reason"] == "Paused to make room for higher-priority work"
    assert all(w["state"] == "Pending" for w in run["status"]["workers"]), run["status"]["workers"]
    with fleet.client() as c:
        events = c.get("/events").json()["items"]
    assert any(e["kind"] == "Preempted" and e["object"] == "gang-ft" for e in events)

    # The urgent run ends; the gang's next attempt (on both machines again) resumes at the step it saved.
    fleet.wait_for(lambda: "resuming at step" in fleet.logs("gang-ft-0"), 120, interval=0.5, what="the resume")
    log = fleet.logs("gang-ft-0")
    resumed = int(re.search(r"^resuming at step (\d+)$", log, re.M)[1])
    assert resumed == saved
    fleet.wait_for(lambda: re.search(r'^\{"step": (\d+)', fleet.logs("gang-ft-0").split("resuming at step")[1], re.M),
                   60, interval=0.5, what="a step after the resume")
    # each attempt's own rendezvous: 2 processes on 2 machines, rank 0's own address the master (a network of its
    # own per worker: astraeus.agent.network), a new one for the new attempt
    attempts = re.findall(r"^attempt (\d+): 2 processes on 2 machines, master ([\d.]+):(\d+)$", log, re.M)
    assert len(attempts) == 2 and int(attempts[1][0]) > int(attempts[0][0]), attempts
    with fleet.client() as c:
        addr = {m["name"]: m["address"] for m in c.get("/machines").json()["items"]}
    assert all(ipaddress.ip_address(a[1]) in rendezvous.ADDRESSES and a[1] not in addr.values() for a in attempts)
    after = [int(s) for s in re.findall(r'^\{"step": (\d+)', fleet.logs("gang-ft-0").split("resuming at step")[1],
                                        re.M)]
    assert after[0] > saved and after[0] % 10 == 0
    assert fleet.run("gang-ft")["status"]["state"] == "Running"
    assert fleet.run("urgent")["status"]["state"] == "Completed"
    for i in (0, 1):
        w = fleet.worker(f"gang-ft-{i}")
        assert w["restarts"] == 0 and w["preemptions"] == 1 and w["state"] == "Running", w
    run = fleet.run("gang-ft")
    assert run["status"]["restarts"] == 0 and run["status"]["preemptions"] == 1

    assert sh(fleet, tmp_path, "astra astraeus delete gang-ft") == "gang-ft deleted\n"
    assert ckpt.exists()  # Astraeus never deletes a drive's files
