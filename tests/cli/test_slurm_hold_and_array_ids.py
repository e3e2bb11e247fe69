"""`sbatch -H/--hold` submits a job already held, and `ID_N` names a job array's task by the array's job id
(issue 44 follow-ups), through `astra slurm` against a real local cluster (`astraeus up`, process runtime)."""

from __future__ import annotations

import pytest

from tests.cli.test_commands import astra, ok, one_line_error
from tests.cli.test_slurm_ids import fields

IMG = "--container-image=busybox"


@pytest.fixture(scope="module")
def c(shared_cluster):
    yield shared_cluster
    with shared_cluster.client() as h:
        for r in h.get("/runs", params={"limit": 1000}).json()["items"]:
            if r["metadata"]["name"].startswith(("hold-", "harr")):
                h.delete(f"/runs/{r['metadata']['name']}")


def states(c, name: str) -> list[str]:
    return [h["state"] for h in c.run(name)["status"].get("history") or []]


def test_sbatch_hold_submits_the_job_held_and_release_starts_it(c):
    out = ok(astra(c, "slurm", "sbatch", "-H", "-J", "hold-a", IMG, "--gres=gpu:1", "--wrap", "echo released"))
    assert out == "Submitted batch job hold-a\n"
    rec = c.run("hold-a")
    assert rec["status"]["state"] == "Pending" and rec["status"]["held"] is True
    assert rec["status"]["reason"] == "Held by user; waiting for astra slurm scontrol release hold-a"
    queue = ok(astra(c, "slurm", "squeue", "-j", "hold-a")).splitlines()
    assert queue[1].split()[0] == "hold-a" and queue[1].endswith("(JobHeldUser)")
    assert fields(ok(astra(c, "slurm", "scontrol", "show", "job", "hold-a")))["Reason"] == "JobHeldUser"
    assert set(states(c, "hold-a")) == {"Pending"}  # never placed: held from its first row
    ok(astra(c, "slurm", "scontrol", "release", "hold-a"))
    c.wait_for(lambda: c.run("hold-a")["status"]["state"] == "Completed", timeout=60, what="hold-a completed")
    assert c.logs("hold-a-0") == "released\n"


def test_hold_in_a_script_holds_every_task_of_an_array_and_id_n_names_a_task(c, tmp_path):
    script = tmp_path / "arr.sbatch"
    script.write_text("#!/bin/sh\n#SBATCH --job-name=harr\n#SBATCH --hold\n#SBATCH --array=0-2\n"
                      "#SBATCH --container-image=busybox\necho task $SLURM_ARRAY_TASK_ID\n")
    assert ok(astra(c, "slurm", "sbatch", str(script))).startswith("Submitted batch job harr\n")
    ids = {i: c.run(f"harr_{i}")["metadata"]["job_id"] for i in range(3)}
    assert all(c.run(f"harr_{i}")["status"]["held"] for i in range(3))
    array_id = ids[0]  # the array's job id: its first task's (any task's id names the array)
    # squeue and scontrol show job take Slurm's ID_N
    lines = ok(astra(c, "slurm", "squeue", "-j", f"{array_id}_2")).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["harr_2"]
    lines = ok(astra(c, "slurm", "squeue", "-j", f"{ids[1]}_[0,2]")).splitlines()
    assert sorted(line.split()[0] for line in lines[1:]) == ["harr_0", "harr_2"]
    shown = fields(ok(astra(c, "slurm", "scontrol", "show", "job", f"{array_id}_1")))
    assert shown["JobId"] == "harr_1" and shown["ArrayTaskId"] == "1" and shown["JobIdRaw"] == str(ids[1])
    # scontrol release ID_N releases that task alone
    ok(astra(c, "slurm", "scontrol", "release", f"{array_id}_1"))
    c.wait_for(lambda: c.run("harr_1")["status"]["state"] == "Completed", timeout=60, what="harr_1 completed")
    assert c.logs("harr_1-0") == "task 1\n"
    assert c.run("harr_0")["status"]["held"] and c.run("harr_2")["status"]["held"]
    # an index the array does not have, or an id no run has: Slurm's error, naming what was given
    err = one_line_error(astra(c, "slurm", "scontrol", "show", "job", f"{array_id}_9"))
    assert err.startswith(f"scontrol: error: Invalid job id specified: {array_id}_9")
    err = one_line_error(astra(c, "slurm", "scontrol", "show", "job", "987654321_1"))
    assert err.startswith("scontrol: error: Invalid job id specified: 987654321_1")


def test_held_in_a_run_body_must_be_true_or_false_and_nothing_is_stored(c):
    body = {"metadata": {"name": "hold-bad"}, "spec": {"held": "yes", "task_template": {
        "image": "busybox", "command": "true"}}}
    with c.client() as h:
        r = h.post("/runs", json=body)
        assert r.status_code == 422, r.text
        assert "held" in r.text and "valid boolean" in r.text
        assert h.get("/runs/hold-bad").status_code == 404
        body["spec"]["held"] = True  # the API's own field: held from the submit
        r = h.post("/runs", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["status"]["held"] is True and r.json()["status"]["reason"].startswith("Held by user")
        assert "held" not in r.json()["spec"]  # the run's status says it (scontrol release clears it)


def test_hold_is_parsed_as_slurm_writes_it():
    from astraeus.cli.slurm import parse_command_line

    for argv in (["-H", "x.sh"], ["--hold", "x.sh"], ["--ho", "x.sh"]):
        assert parse_command_line(argv).options.values["held"] is True


def test_srun_and_salloc_take_hold_as_slurm_does():
    from astraeus.cli import slurm_interactive as si

    for command in ("srun", "salloc"):
        cmd, rest, _ = si.parse(["-H", "--container-image=busybox", "hostname"], command)
        job = si.build(cmd, "hostname", "interactive", command)
        assert job.spec["spec"]["held"] is True and rest == ["hostname"]
