"""Numeric job ids, scontrol hold/release, resubmitted arrays and --test-only without an image (issue 44), through
`astra slurm` against a real local cluster (`astraeus up`, process runtime).

A job id is the run's `metadata.job_id` (SLURM_JOB_ID in its workers): `sbatch --parsable` prints it, and
`--dependency=afterok:ID`, `scancel ID`, `squeue -j ID`, `sacct -j ID`, `scontrol show job ID`, `scontrol update
JobId=ID` and `scontrol hold|release ID` take it. A JOB of digits only is a job id first; a run named with digits
only is found by its name where no run has that job id."""

from __future__ import annotations

import re

import pytest

from tests.cli.test_commands import astra, ok, one_line_error

IMG = "--container-image=busybox"


@pytest.fixture(scope="module")
def c(shared_cluster):
    yield shared_cluster
    with shared_cluster.client() as h:
        for r in h.get("/runs", params={"limit": 1000}).json()["items"]:
            if r["metadata"]["name"].startswith(("ids-", "arr", "999999")):
                h.delete(f"/runs/{r['metadata']['name']}")


def fields(out: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for line in out.splitlines() for kv in line.split() if "=" in kv)


def test_job_ids_work_wherever_a_slurm_user_types_one(c):
    out = ok(astra(c, "slurm", "sbatch", "--parsable", "-J", "ids-a", IMG, "--gres=gpu:8",
                   "--wrap", "echo job=$SLURM_JOB_ID; sleep 300"))
    assert re.fullmatch(r"\d+\n", out), out
    a = int(out)
    assert c.run("ids-a")["metadata"]["job_id"] == a
    c.wait_for(lambda: f"job={a}" in c.logs("ids-a-0"), timeout=60, what="ids-a's SLURM_JOB_ID line")
    # a dependency on the id is a dependency on the run
    b = int(ok(astra(c, "slurm", "sbatch", "--parsable", "-J", "ids-b", f"--dependency=afterok:{a}", IMG,
                     "--wrap", "true")))
    assert c.run("ids-b")["spec"]["dependency"] == {"type": "afterok", "runs": ["ids-a"]}
    # squeue, sacct, scontrol show job and update by id
    lines = ok(astra(c, "slurm", "squeue", "-j", str(a))).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["ids-a"]
    assert ok(astra(c, "slurm", "sacct", "-j", str(a), "-X", "-P", "-n", "-o", "JobID,JobIDRaw")) == f"ids-a|{a}\n"
    shown = fields(ok(astra(c, "slurm", "scontrol", "show", "job", str(a))))
    assert shown["JobId"] == "ids-a" and shown["JobIdRaw"] == str(a)
    ok(astra(c, "slurm", "scontrol", "update", f"jobid={b}", "Priority=-3"))
    assert c.run("ids-b")["spec"]["priority"] == -3
    # hold and release: ids-b waits for ids-a, so it is Pending
    ok(astra(c, "slurm", "scontrol", "hold", str(b)))
    rec = c.run("ids-b")
    assert rec["status"]["held"] is True and rec["status"]["reason"].startswith("Held by user")
    queue = ok(astra(c, "slurm", "squeue", "-j", "ids-b")).splitlines()
    assert queue[1].split()[0] == "ids-b" and queue[1].endswith("(JobHeldUser)")
    shown = fields(ok(astra(c, "slurm", "scontrol", "show", "job", "ids-b")))
    assert shown["JobState"] == "PENDING" and shown["Reason"] == "JobHeldUser"
    ok(astra(c, "slurm", "scontrol", "release", "ids-b"))
    assert c.run("ids-b")["status"]["held"] is False
    # only a Pending job can be held; an unknown job is Slurm's error
    err = one_line_error(astra(c, "slurm", "scontrol", "hold", str(a)))
    assert err.startswith(f"scontrol: error: {a}: ") and "run ids-a is Running: only a Pending run can be held" in err
    assert "scancel ids-a" in err
    assert "Invalid job id specified: no-such" in one_line_error(astra(c, "slurm", "scontrol", "hold", "no-such"))
    assert "give the job to hold" in one_line_error(astra(c, "slurm", "scontrol", "hold"))
    # scancel by id
    ok(astra(c, "slurm", "scancel", str(a)))
    c.wait_for(lambda: c.run("ids-a").get("code") == "NOT_FOUND", timeout=30, what="ids-a cancelled")


def test_a_run_named_with_digits_is_found_by_name_where_no_run_has_that_id(c):
    ok(astra(c, "slurm", "sbatch", "-J", "999999", IMG, "--gres=gpu:64", "--wrap", "true"))
    assert fields(ok(astra(c, "slurm", "scontrol", "show", "job", "999999")))["JobId"] == "999999"
    ok(astra(c, "slurm", "scancel", "999999"))


def test_a_resubmitted_job_array_gets_a_new_name(c):
    args = ("slurm", "sbatch", "-J", "arr", "--array=0-1", IMG, "--gres=gpu:64", "--wrap", "true")
    assert ok(astra(c, *args)).startswith("Submitted batch job arr\n")
    assert ok(astra(c, *args)).startswith("Submitted batch job arr-2\n")
    assert c.run("arr-2_1")["spec"]["array"]["job"] == "arr-2"
    assert c.run("arr_1")["spec"]["array"]["job"] == "arr"


def test_test_only_of_a_script_naming_no_image_uses_the_workspace_default(c):
    with c.admin() as a:
        ws = c.api.rsplit("/", 1)[1]
        r = a.patch(f"/workspaces/{ws}", json={"clusters": {"main": {"default_image": "busybox"}}})
        assert r.status_code == 200, r.text
        try:
            r = astra(c, "slurm", "sbatch", "--test-only", "-J", "ids-noimage", "--gres=gpu:1", "--wrap", "true")
            # the question is answered (it starts now, or would wait for room): no refusal for the missing image
            assert r.returncode in (0, 1) and r.stderr.startswith("sbatch: Job ids-noimage "), r
        finally:
            a.patch(f"/workspaces/{ws}", json={"clusters": {"main": {"default_image": None}}})


# --- pure: which run a JOB of digits names, and how a held run shows -------------------------------------------------


def _rec(name: str, job_id: int, state: str = "Pending", held: bool = False) -> dict:
    return {"metadata": {"name": name, "job_id": job_id, "workspace": "vision", "cluster": "main",
                         "created_at": "2026-12-06T21:00:00Z"},
            "spec": {"task_template": {"image": "busybox", "command": "true"}},
            "status": {"state": state, "reason": "Held by user; waiting for …" if held else "Queued", "held": held,
                       "workers": []}}


def test_digits_are_a_job_id_first_then_a_name():
    from astraeus.cli import slurm_views as sv

    runs = [_rec("prep", 7), _rec("12", 3), _rec("7", 12)]
    assert [r["metadata"]["name"] for r in sv.runs_with_job_id(runs, "7")] == ["prep"]  # the id wins over the name
    assert sv.runs_with_job_id(runs, "99") == []  # no run has it: the caller tries it as a name
    assert sv.runs_with_job_id(runs, "prep") == [] and sv.runs_with_job_id(runs, "٣") == []  # not ASCII digits
    assert sv.is_job_id("42") and not sv.is_job_id("4x") and not sv.is_job_id("")


def test_a_held_job_shows_slurms_reason():
    from datetime import UTC, datetime

    from astraeus.cli import format as fmt
    from astraeus.cli import slurm_views as sv

    held, waiting = _rec("h", 1, held=True), _rec("w", 2)
    lines = fmt.squeue_table([held, waiting]).splitlines()
    assert lines[1].endswith("(JobHeldUser)") and lines[2].endswith("(Queued)")
    shown = fields(sv.show_job(held, datetime.now(UTC)))
    assert shown["Reason"] == "JobHeldUser" and shown["JobIdRaw"] == "1" and shown["JobState"] == "PENDING"
