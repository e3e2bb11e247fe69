"""sinfo, sacct, scontrol and squeue's filters on a real local cluster (`astraeus up`, process runtime), through
`astra slurm`, compared field by field with the runs' and machines' records that the API answers."""

from __future__ import annotations

import pytest

from astraeus.cli import slurm_views as sv
from tests.cli.test_commands import astra, ok, one_line_error

IMG = "--container-image=busybox"


@pytest.fixture(scope="module")
def c(shared_cluster):
    """Two jobs: `vdone` (2 GPUs, completes at once) and `vlong` (1 GPU, runs on)."""
    c = shared_cluster
    r1 = astra(c, "slurm", "sbatch", "-J", "vdone", IMG, "--gres=gpu:2", "-c", "2", "--mem=1G", "--wrap", "echo hi")
    r2 = astra(c, "slurm", "sbatch", "-J", "vlong", IMG, "--gres=gpu:1", "-t", "30", "--wrap", "sleep 300")
    assert ok(r1) == "Submitted batch job vdone\n" and ok(r2) == "Submitted batch job vlong\n"
    c.wait_for(lambda: c.run("vdone")["status"]["state"] == "Completed" and
               c.run("vlong")["status"]["state"] == "Running", timeout=60, what="vdone completed, vlong running")
    yield c
    with c.client() as h:
        for n in ("vdone", "vlong"):
            h.delete(f"/runs/{n}")


def test_sacct_fields_are_the_runs_records(c):
    fields = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode,Start,End,AllocTRES"
    out = ok(astra(c, "slurm", "sacct", "-j", "vdone,vlong", "-X", "-P", "-o", fields))
    lines = out.splitlines()
    assert lines[0] == fields.replace(",", "|")
    rows = {line.split("|")[0]: dict(zip(fields.split(","), line.split("|"), strict=True)) for line in lines[1:]}
    assert set(rows) == {"vdone", "vlong"}
    done, long_ = c.run("vdone"), c.run("vlong")
    for rec in (done, long_):
        row = rows[rec["metadata"]["name"]]
        assert row["Partition"] == rec["metadata"]["cluster"]
        assert row["Account"] == rec["metadata"]["workspace"]
        assert row["Start"] == sv.stamp(rec["status"]["started_at"])
        assert row["State"] == sv.job_state(rec)
    assert rows["vdone"]["State"] == "COMPLETED" and rows["vdone"]["ExitCode"] == "0:0"
    assert rows["vdone"]["End"] == sv.stamp(done["status"]["finished_at"]) != "Unknown"
    assert rows["vdone"]["AllocCPUS"] == "2" and rows["vdone"]["AllocTRES"] == "cpu=2,gres/gpu=2,mem=1G,node=1"
    assert rows["vlong"]["State"] == "RUNNING" and rows["vlong"]["End"] == "Unknown"
    assert "gres/gpu=1" in rows["vlong"]["AllocTRES"]
    # the default layout, steps included (a worker: JOBID.INDEX), and -n without headers
    table = ok(astra(c, "slurm", "sacct", "-j", "vdone")).splitlines()
    assert table[0].split() == ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]
    assert table[2].split()[0] == "vdone" and table[3].split()[:2] == ["vdone.0", "batch"]
    assert ok(astra(c, "slurm", "sacct", "-n", "-X", "-j", "vdone", "-o", "JobID,State")).split() == [
        "vdone", "COMPLETED"]
    # a window that ended before they were submitted holds neither
    assert ok(astra(c, "slurm", "sacct", "-X", "-P", "-n", "-S", "2020-01-01", "-E", "2020-01-02T10:00")) == ""
    assert {"vdone", "vlong"} <= {line.split("|")[0] for line in ok(astra(
        c, "slurm", "sacct", "-X", "-P", "-n", "-S", "now-1hours")).splitlines()}


def test_squeue_states_users_and_min_job_age(c):
    def jobs(*args, env=None):
        return [line.split()[0] for line in ok(astra(c, "slurm", "squeue", *args, env=env)).splitlines()[1:]]

    assert {"vdone", "vlong"} <= set(jobs())  # vdone ended less than 300 s ago
    assert "vdone" not in jobs(env={"ASTRAEUS_SQUEUE_MIN_JOB_AGE": "0"})
    assert "vlong" in jobs(env={"ASTRAEUS_SQUEUE_MIN_JOB_AGE": "0"})
    assert "vdone" not in jobs("-t", "R") and "vlong" in jobs("-t", "running")
    assert jobs("-t", "CD", "-j", "vdone,vlong") == ["vdone"]
    ws = c.run("vlong")["metadata"]["workspace"]
    assert "vlong" in jobs("-u", ws) and "vlong" in jobs("--me") and jobs("-u", "nobody-else") == []
    assert "invalid job state 'XX'" in one_line_error(astra(c, "slurm", "squeue", "-t", "XX"))


def test_scontrol_show_job_is_the_runs_record(c):
    rec = c.run("vlong")
    out = ok(astra(c, "slurm", "scontrol", "show", "job", "vlong"))
    fields = dict(kv.split("=", 1) for line in out.splitlines() for kv in line.split() if "=" in kv)
    assert fields["JobId"] == "vlong" and fields["JobName"] == "vlong"
    assert fields["UserId"] == rec["metadata"]["created_by"] == "admin"  # who submitted it (issue 45)
    assert fields["JobState"] == "RUNNING" and fields["Priority"] == str(rec["spec"].get("priority", 0))
    assert fields["TimeLimit"] == "00:30:00"
    assert fields["SubmitTime"] == sv.stamp(rec["metadata"]["created_at"])
    assert fields["StartTime"] == sv.stamp(rec["status"]["started_at"])
    assert fields["NodeList"] == rec["status"]["workers"][0]["machine"]
    assert fields["Partition"] == rec["metadata"]["cluster"] and fields["NumNodes"] == "1"
    assert "gres/gpu=1" in fields["TRES"]


def test_scontrol_update_priority_and_time_limit(c):
    ok(astra(c, "slurm", "scontrol", "update", "JobId=vlong", "Priority=-5", "TimeLimit=1:00:00"))
    rec = c.run("vlong")
    assert rec["spec"]["priority"] == -5 and rec["spec"]["task_template"]["time_limit_seconds"] == 3600
    assert rec["status"]["state"] == "Running"
    with c.client() as h:
        events = h.get("/events").json()["items"]
    assert any(e["kind"] == "RunUpdated" and e["object"] == "vlong" for e in events)
    err = one_line_error(astra(c, "slurm", "scontrol", "update", "JobId=vlong", "Priority=1000000000"))
    assert "priority 1000000000 is above" in err and "maximum" in err
    assert c.run("vlong")["spec"]["priority"] == -5
    err = one_line_error(astra(c, "slurm", "scontrol", "update", "JobId=vdone", "Priority=1"))
    assert "has ended" in err
    assert "invalid TimeLimit='soon'" in one_line_error(
        astra(c, "slurm", "scontrol", "update", "JobId=vlong", "TimeLimit=soon"))
    assert "not supported yet: suspend" in one_line_error(astra(c, "slurm", "scontrol", "suspend", "vlong"))
    with c.client() as h:  # the route itself: only these two fields, and at least one of them
        for body in ({"bogus": 1}, {}, {"priority": None}):
            assert h.patch("/runs/vlong", json=body).status_code == 422, body
        r = h.patch("/runs/vlong", json={"time_limit_seconds": None})
        assert r.status_code == 200 and r.json()["spec"]["task_template"]["time_limit_seconds"] is None
        assert h.patch("/runs/nope", json={"priority": 1}).status_code == 404


def test_sinfo_is_the_machines_records(c):
    with c.client() as h:
        machines = h.get("/machines").json()["items"]
        pools = h.get("/pools").json()["items"]
    assert pools == []  # the test cluster has no pools: one partition, the cluster's, the default
    out = ok(astra(c, "slurm", "sinfo"))
    lines = out.splitlines()
    assert lines[0] == "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"
    cluster = machines[0]["cluster"]
    m = machines[0]
    state = "mix" if 0 < m["gpus_used"] < m["gpus"] else ("alloc" if m["gpus_used"] else "idle")
    assert lines[1].split() == [f"{cluster}*", "up", "infinite", "1", state, m["name"]]
    assert m["gpus_used"] >= 1  # vlong holds a GPU
    gres = ok(astra(c, "slurm", "sinfo", "-h", "-o", "%P %D %C %N")).split()
    assert gres == [f"{cluster}*", "1", f"{m['gpus_used']}/{m['gpus'] - m['gpus_used']}/0/{m['gpus']}", m["name"]]
    assert ok(astra(c, "slurm", "sinfo", "-N")).splitlines()[1].split() == [m["name"], "1", f"{cluster}*", state]


@pytest.mark.parametrize("args,says", [
    (("sacct", "--bogus"), "sacct: error: unrecognized option or argument '--bogus'"),
    (("sacct", "-S", "yesterdayish"), "sacct: error: invalid time --starttime='yesterdayish'"),
    (("sacct", "-o", "JobID,Nope"), 'sacct: error: Invalid field requested: "Nope"'),
    (("sacct", "-j", "no-such-job"), "sacct: error: no job no-such-job"),
    (("scontrol", "show", "job", "no-such-job"), "scontrol: error: Invalid job id specified: no-such-job"),
    (("scontrol", "update", "JobId=no-such-job", "Priority=1"), "Invalid job id specified: no-such-job"),
    (("scontrol", "frobnicate"), "scontrol: error: invalid command 'frobnicate'"),
    (("sinfo", "-o", "%P %Z"), "sinfo: error: unknown format letter %Z"),
    (("sinfo", "--bogus"), "sinfo: error: unrecognized option"),
    (("sinfo", "-p", "nope"), "sinfo: error: no partition named nope"),
    (("squeue", "--bogus"), "squeue: error: unrecognized option"),
])
def test_bad_input_is_one_line_and_exit_1(c, args, says):
    assert says in one_line_error(astra(c, "slurm", *args))


def test_a_shorter_time_limit_ends_a_running_job(c):
    assert ok(astra(c, "slurm", "sbatch", "-J", "vshort", IMG, "--wrap", "sleep 300")) == "Submitted batch job vshort\n"
    try:
        c.wait_for(lambda: c.run("vshort")["status"]["state"] == "Running", timeout=60, what="vshort running")
        ok(astra(c, "slurm", "scontrol", "update", "JobId=vshort", "TimeLimit=0:01"))
        c.wait_for(lambda: c.run("vshort")["status"]["state"] == "Failed", timeout=60, what="vshort stopped")
        out = ok(astra(c, "slurm", "sacct", "-X", "-P", "-n", "-j", "vshort", "-o", "JobID,State,Timelimit"))
        assert out == "vshort|TIMEOUT|00:00:01\n"
    finally:
        with c.client() as h:
            h.delete("/runs/vshort")
