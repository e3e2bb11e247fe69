"""Slurm's views as tables (astraeus.cli.slurm_views): sinfo, sacct, scontrol show job, squeue's MinJobAge and
filters, Slurm's time formats; run and machine records written as the API answers them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from astraeus.cli import slurm_views as sv

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def run(name, state, *, pools=None, gpus=0, cpus=None, mem=None, machines=1, started=None, finished=None,
        workers=None, preemptions=0, reason="", created=None, array=None, limit=None, priority=0):
    res = {"gpu_requests": {"count": gpus}, "machines": machines, "node_selection": {"pools": pools or []}}
    if cpus is not None:
        res["cpu_cores"] = cpus
    if mem is not None:
        res["memory_bytes"] = mem
    spec = {"priority": priority, "cluster": "main",
            "task_template": {"image": "busybox", "command": "sh", "args": ["-c", "true"],
                              "time_limit_seconds": limit, "requested_resources": res}}
    if array:
        spec["array"] = {"job": array[0], "index": array[1]}
    return {"metadata": {"name": name, "workspace": "vision", "cluster": "main",
                         "created_at": iso(created or NOW - timedelta(hours=1))},
            "spec": spec,
            "status": {"state": state, "reason": reason, "preemptions": preemptions, "workers": workers or [],
                       "started_at": iso(started) if started else None,
                       "finished_at": iso(finished) if finished else None}}


def worker(i, state, machine="gpu-01", started=None, finished=None, code=None, gpus=(), reason=""):
    return {"name": f"w-{i}", "index": i, "state": state, "machine": machine, "exit_code": code,
            "gpu_indices": list(gpus), "cpu_cores": 4, "memory_bytes": 16 * 1024**3, "reason": reason,
            "started_at": iso(started) if started else None, "finished_at": iso(finished) if finished else None}


def local(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


# --- sacct -------------------------------------------------------------------------------------------------------

def test_sacct_default_layout_is_slurms():
    t0 = NOW - timedelta(minutes=30)
    done = run("train", "Completed", gpus=8, cpus=8, mem=64 * 1024**3, started=t0, finished=t0 + timedelta(seconds=95),
               workers=[worker(0, "Succeeded", started=t0, finished=t0 + timedelta(seconds=95), code=0,
                               gpus=range(8))])
    rows = sv.sacct_rows([done], NOW)
    out = sv.sacct_table(rows, sv.sacct_fields(None))
    assert out.splitlines() == [
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
        "------------ ---------- ---------- ---------- ---------- ---------- -------- ",
        "train             train       main     vision          8  COMPLETED      0:0 ",
        "train.0           batch                vision          4  COMPLETED      0:0 ",
    ]


def test_sacct_format_parsable_and_fields_from_the_record():
    t0 = NOW - timedelta(minutes=30)
    failed = run("eval", "Failed", pools=["a100"], gpus=2, cpus=4, mem=512 * 1024**2, started=t0,
                 finished=t0 + timedelta(hours=25, seconds=3),
                 workers=[worker(0, "Failed", started=t0, finished=t0 + timedelta(hours=25, seconds=3), code=3)])
    fields = sv.sacct_fields("JobID,State,ExitCode,Elapsed,Start,End,AllocTRES,Partition")
    out = sv.sacct_table(sv.sacct_rows([failed], NOW, steps=False), fields, "plain")
    assert out.splitlines() == [
        "JobID|State|ExitCode|Elapsed|Start|End|AllocTRES|Partition",
        f"eval|FAILED|3:0|1-01:00:03|{local(t0)}|{local(t0 + timedelta(hours=25, seconds=3))}|"
        "cpu=4,gres/gpu=2,mem=512M,node=1|a100",
    ]
    trailing = sv.sacct_table(sv.sacct_rows([failed], NOW, steps=False), fields, "trailing", header=False)
    assert trailing.startswith("eval|FAILED|3:0|") and trailing.endswith("|a100|\n")


def test_sacct_states_exit_codes_and_cut_values():
    pending = run("a-very-long-job-name", "Pending", preemptions=1)
    timeout = run("slow", "Failed", started=NOW - timedelta(minutes=5), finished=NOW,
                  workers=[worker(0, "Failed", started=NOW - timedelta(minutes=5), finished=NOW, code=-15,
                                  reason="Stopped at its time limit (5m); not restarted")])
    out = sv.sacct_table(sv.sacct_rows([pending, timeout], NOW), sv.sacct_fields("JobID,JobName%10,State,ExitCode,"
                                                                                 "Start,End,AllocTRES"))
    lines = out.splitlines()
    assert lines[2].split() == ["a-very-long+", "a-very-lo+", "REQUEUED", "0:0", "Unknown", "Unknown"]
    assert lines[3].split()[:4] == ["slow", "slow", "TIMEOUT", "0:15"]
    assert lines[4].split()[:3] == ["slow.0", "batch", "TIMEOUT"]
    assert sv.exit_code(137) == "0:9" and sv.exit_code(2) == "2:0"


def test_sacct_bad_field_and_window():
    with pytest.raises(sv.ViewError, match='Invalid field requested: "Bogus"'):
        sv.sacct_fields("JobID,Bogus")
    old = run("old", "Completed", created=NOW - timedelta(days=3), started=NOW - timedelta(days=3),
              finished=NOW - timedelta(days=2))
    live = run("live", "Running", created=NOW - timedelta(days=3), started=NOW - timedelta(days=3))
    since = NOW - timedelta(days=1)
    assert [sv.name_of(r) for r in (old, live) if sv.in_window(r, since, None)] == ["live"]
    assert sv.in_window(old, None, NOW - timedelta(days=1)) and not sv.in_window(old, None, NOW - timedelta(days=4))


# --- time formats -----------------------------------------------------------------------------------------------

def test_slurm_time_formats():
    now = datetime(2026, 12, 6, 15, 30, 0).astimezone()
    assert sv.parse_when("2026-12-01", now) == datetime(2026, 12, 1).astimezone()
    assert sv.parse_when("2026-12-01T10:20", now) == datetime(2026, 12, 1, 10, 20).astimezone()
    assert sv.parse_when("2026-12-01T10:20:30", now) == datetime(2026, 12, 1, 10, 20, 30).astimezone()
    assert sv.parse_when("12/01", now) == datetime(2026, 12, 1).astimezone()
    assert sv.parse_when("12/01/25", now) == datetime(2025, 12, 1).astimezone()
    assert sv.parse_when("1201", now) == datetime(2026, 12, 1).astimezone()
    assert sv.parse_when("08:15", now) == now.replace(hour=8, minute=15)
    assert sv.parse_when("now-2hours", now) == now - timedelta(hours=2)
    assert sv.parse_when("now-30", now) == now - timedelta(seconds=30)
    assert sv.parse_when("midnight", now) == now.replace(hour=0, minute=0)
    for bad in ("yesterdayish", "2026-13-01", "now-3fortnights", "12:7", ""):
        with pytest.raises(sv.ViewError, match="invalid time --starttime="):
            sv.parse_when(bad, now)


# --- squeue ----------------------------------------------------------------------------------------------------------

def test_squeue_drops_ended_jobs_after_min_job_age_and_filters():
    live = run("live", "Running", started=NOW - timedelta(hours=1))
    just = run("just", "Completed", started=NOW - timedelta(hours=1), finished=NOW - timedelta(seconds=100))
    old = run("old", "Failed", started=NOW - timedelta(hours=1), finished=NOW - timedelta(seconds=400))
    waiting = run("wait", "Pending")
    runs = [live, just, old, waiting]
    assert [sv.name_of(r) for r in sv.squeue_keep(runs, NOW, 300)] == ["live", "just", "wait"]
    assert [sv.name_of(r) for r in sv.squeue_keep(runs, NOW, 0)] == ["live", "wait"]
    assert [sv.name_of(r) for r in sv.squeue_keep(runs, NOW, 300, sv.state_codes("PD,cd"))] == ["just", "wait"]
    assert [sv.name_of(r) for r in sv.squeue_keep(runs, NOW, 300, sv.state_codes("running"))] == ["live"]
    assert sv.squeue_keep(runs, NOW, 300, users={"other"}) == []
    assert len(sv.squeue_keep(runs, NOW, 300, users={"vision"})) == 3
    with pytest.raises(sv.ViewError, match="invalid job state 'XX'"):
        sv.state_codes("R,XX")


# --- scontrol show job ---------------------------------------------------------------------------------------------

def test_show_job_key_values():
    t0 = NOW - timedelta(minutes=10)
    r = run("train", "Running", pools=["a100"], gpus=8, cpus=16, mem=64 * 1024**3, started=t0, limit=3600,
            priority=20, workers=[worker(0, "Running", started=t0, gpus=range(8))])
    text = sv.show_job(r, NOW)
    fields = dict(kv.split("=", 1) for line in text.split("\n") for kv in line.split() if "=" in kv)
    assert text.startswith("JobId=train JobName=train\n   UserId=vision ")
    assert fields["JobState"] == "RUNNING" and fields["Reason"] == "None"
    assert fields["Priority"] == "20" and fields["Partition"] == "a100" and fields["NodeList"] == "gpu-01"
    assert fields["RunTime"] == "00:10:00" and fields["TimeLimit"] == "01:00:00"
    assert fields["StartTime"] == local(t0) and fields["EndTime"] == local(t0 + timedelta(hours=1))
    assert fields["TRES"] == "cpu=16,gres/gpu=8,mem=64G,node=1" and fields["NumNodes"] == "1"
    assert fields["Command"] == "sh" and fields["StdOut"] == "astra"
    pending = sv.show_job(run("wait", "Pending", reason="Waiting for 8 GPUs"), NOW)
    assert "JobState=PENDING Reason=Waiting for 8 GPUs" in pending and "StartTime=Unknown" in pending
    assert "TimeLimit=UNLIMITED" in pending


# --- sinfo -----------------------------------------------------------------------------------------------------------

def machine(name, gpus=8, used=0, state="Ready", cluster="main", schedulable=True, model="NVIDIA A100-SXM4-80GB"):
    return {"name": name, "cluster": cluster, "gpus": gpus, "gpus_used": used, "gpus_free": gpus - used,
            "state": state, "schedulable": schedulable, "gpu_models": [model] * gpus, "cpu_cores": 64,
            "memory_bytes": 512 * 1024**3}


def test_sinfo_without_pools_is_one_default_partition_by_state():
    ms = [machine("gpu-01"), machine("gpu-02", used=8), machine("gpu-03", used=3), machine("gpu-04"),
          machine("gpu-05", state="Lost"), machine("gpu-06", schedulable=False), machine("cpu-1", gpus=0)]
    out = sv.sinfo_table(ms, [], busy={"cpu-1"})
    assert out.splitlines() == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "main*        up   infinite      2   idle gpu-[01,04]",
        "main*        up   infinite      2  alloc cpu-1,gpu-02",
        "main*        up   infinite      1    mix gpu-03",
        "main*        up   infinite      1   down gpu-05",
        "main*        up   infinite      1  drain gpu-06",
    ]


def test_sinfo_pools_nodes_and_format():
    ms = [machine("gpu-01"), machine("gpu-02", used=2), machine("h-1", model="NVIDIA H100 80GB HBM3", used=8)]
    pools = [{"name": "a100", "cluster": "main", "machines": ["gpu-01", "gpu-02"]},
             {"name": "h100", "cluster": "main", "machines": ["h-1"]}]
    assert sv.sinfo_table(ms, pools).splitlines() == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "a100         up   infinite      1   idle gpu-01",
        "a100         up   infinite      1    mix gpu-02",
        "h100         up   infinite      1  alloc h-1",
    ]
    assert sv.sinfo_table(ms, pools, nodes=True).splitlines() == [
        "NODELIST    NODES PARTITION STATE ",
        "gpu-01          1      a100 idle  ",
        "gpu-02          1      a100 mix   ",
        "h-1             1      h100 alloc ",
    ]
    assert sv.sinfo_table(ms, pools, fmt="%P|%D|%G|%C|%T").splitlines() == [
        "PARTITION|NODES|GRES|GPUS(A/I/O/T)|STATE",
        "a100|1|gpu:a100:8|0/8/0/8|idle",
        "a100|1|gpu:a100:8|2/6/0/8|mixed",
        "h100|1|gpu:h100:8|8/0/0/8|allocated",
    ]
    with pytest.raises(sv.ViewError, match="unknown format letter %Z"):
        sv.sinfo_table(ms, pools, fmt="%P %Z")


def test_hostlist():
    assert sv.hostlist(["gpu-03", "gpu-01", "gpu-02", "cpu", "gpu-10"]) == "cpu,gpu-[01-03,10]"
    assert sv.hostlist(["node7"]) == "node7"
    assert sv.hostlist([]) == ""
