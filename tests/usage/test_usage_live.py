"""Accounting on a real local cluster (`astraeus up`, a real agent, process runtime): runs of known GPUs — one that
succeeds, one that crashes and is restarted, one preempted by an urgent run and deleted after it came back — leave
one usage record per worker attempt; $API/usage, `astra astraeus usage`, `astra slurm sreport` and the Prometheus
counters add up to exactly those records; deleting a run keeps them."""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest

from tests.cli.test_commands import astra, ok, one_line_error
from tests.conftest import start_cluster

POLITE = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
          "while True:\n    time.sleep(0.1)\n")


def body(name: str, gpus: int, code: str, priority: int = 0, restart: str = "Never", max_restarts: int = 0) -> dict:
    return {"metadata": {"name": name}, "spec": {"priority": priority, "task_template": {
        "image": "python:3.11", "command": "python", "args": ["-c", code], "restart_policy": restart,
        "max_restarts": max_restarts,
        "requested_resources": {"cpu_cores": 1, "memory_bytes": 1 << 28, "gpu_requests": {"count": gpus}}}}}


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("usage") / "home", env={"ASTRAEUS_RESTART_BACKOFF_BASE": "0.5"})
    yield c
    c.stop()


def records(c, run: str) -> list[dict]:
    with c.client() as h:
        r = h.get("/usage/records", params={"run": run, "since": "1h"})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def state(c, run: str) -> str:
    return c.run(run)["status"]["state"]


def metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}\{{workspace="vision"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def story(c):
    """done: 2 GPUs, succeeds; crash: 1 GPU, fails, restarted once, fails again; low: 4 GPUs at priority -10,
    preempted by urgent (8 GPUs), back once urgent ended, then deleted. The machine is in the pool `fleet`."""
    with c.admin() as a:
        assert a.post("/clusters/main/pools", json={"name": "fleet", "machines": ["gpu-01"]}).status_code == 201
    with c.client() as h:
        for b in (body("done", 2, "import time; time.sleep(1)"),
                  body("crash", 1, "import sys, time; time.sleep(0.5); sys.exit(3)", restart="OnFailure",
                       max_restarts=1),
                  body("low", 4, POLITE, priority=-10, restart="OnFailure", max_restarts=3)):
            assert h.post("/runs", json=b).status_code == 201, b["metadata"]["name"]
        c.wait_for(lambda: state(c, "done") == "Completed" and state(c, "crash") == "Failed"
                   and state(c, "low") == "Running", timeout=60, what="done, crash ended; low running")
        assert h.post("/runs", json=body("urgent", 8, "import time; time.sleep(1)")).status_code == 201
        c.wait_for(lambda: state(c, "urgent") == "Completed", timeout=60, what="urgent completed")
        c.wait_for(lambda: state(c, "low") == "Running", timeout=60, what="low back")
        users = {n: c.run(n)["metadata"].get("created_by") for n in ("done", "crash", "low", "urgent")}
        before = h.get("/usage", params={"group_by": "run", "since": "1h"}).json()
        assert h.delete("/runs/low").status_code == 200
        c.wait_for(lambda: len(records(c, "low")) == 2, timeout=60, what="low's second attempt recorded")
        c.wait_for(lambda: h.get("/runs/low").status_code == 404 or state(c, "low") == "Cancelled", timeout=60,
                   what="low deleted")
    return {"users": users, "before": before}


def test_one_record_per_attempt_with_how_it_ended(c, story):
    done, crash, low, urgent = (records(c, n) for n in ("done", "crash", "low", "urgent"))
    assert [(r["state"], r["gpus"], r["attempt"]) for r in done] == [("Succeeded", 2, 1)]
    assert [(r["state"], r["gpus"], r["attempt"]) for r in crash] == [("Failed", 1, 1), ("Failed", 1, 2)]
    assert crash[0]["reason"].startswith("Restarting in ") and "exit code 3" in crash[0]["reason"]
    assert crash[1]["reason"] == "Failed (exit code 3); restart budget spent"
    assert [(r["state"], r["gpus"], r["preempted_by"]) for r in low] == [("Preempted", 4, "urgent"),
                                                                          ("Cancelled", 4, None)]
    assert [(r["state"], r["gpus"]) for r in urgent] == [("Succeeded", 8)]
    with c.client() as h:
        machine = h.get("/machines").json()["items"][0]
    for name, rs in (("done", done), ("crash", crash), ("low", low), ("urgent", urgent)):
        for r in rs:
            assert r["workspace"] == "vision" and r["cluster"] == "main" and r["machine"] == machine["name"]
            assert r["pool"] == "fleet"
            assert r["user"] == story["users"][name]
            assert r["gpu_model"] == (machine.get("gpu_models") or [None])[0]
            assert r["gpu_seconds"] == pytest.approx(r["gpus"] * r["seconds"], abs=0.01)
            assert r["seconds"] > 0 and r["wait_seconds"] >= 0


def test_usage_is_the_sum_of_the_attempts_and_outlives_the_run(c, story):
    recs = {n: records(c, n) for n in ("done", "crash", "low", "urgent")}
    with c.client() as h:
        by_run = {r["run"]: r for r in h.get("/usage", params={"group_by": "run", "since": "1h"}).json()["items"]}
        total = h.get("/usage", params={"since": "1h"}).json()["total"]
    assert set(by_run) == set(recs)  # low is deleted: its usage stays
    for name, rs in recs.items():
        assert by_run[name]["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for r in rs), abs=0.01)
        assert by_run[name]["attempts"] == len(rs)
        assert by_run[name]["preemptions"] == sum(r["state"] == "Preempted" for r in rs)
        assert by_run[name]["gpu_hours"] == pytest.approx(by_run[name]["gpu_seconds"] / 3600, abs=1e-5)
    assert total["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for rs in recs.values() for r in rs), abs=0.05)
    assert total["attempts"] == 6 and total["preemptions"] == 1
    # deleting low kept what it had used (and added its last attempt's)
    was = {r["run"]: r for r in story["before"]["items"]}
    assert by_run["low"]["gpu_seconds"] >= was["low"]["gpu_seconds"] and by_run["done"] == was["done"]


def test_the_organisation_report_and_the_cli_say_the_same(c, story):
    with c.client() as h:
        ws = h.get("/usage", params={"group_by": "user", "since": "1h"}).json()
    with c.admin() as a:
        org = a.get("/usage", params={"group_by": "user", "since": "1h"}).json()
    assert org["items"] == ws["items"]
    out = json.loads(ok(astra(c, "astraeus", "usage", "--by", "user", "--since", "1h", "-o", "json")))
    assert out["items"] == ws["items"]
    table = ok(astra(c, "astraeus", "usage", "--by", "run", "--since", "1h")).splitlines()
    assert table[1].split() == ["RUN", "GPU-HOURS", "ATTEMPTS", "PREEMPTED", "QUEUE", "WAIT"]
    with c.client() as h:
        by_run = {r["run"]: r for r in h.get("/usage", params={"group_by": "run", "since": "1h"}).json()["items"]}
    rows = {line.split()[0]: line.split() for line in table[2:]}
    for name, r in by_run.items():
        assert rows[name][1:4] == [f"{r['gpu_hours']:.2f}", str(r["attempts"]), str(r["preemptions"])]
    assert rows["TOTAL"][2] == "6"
    assert "--by 'bogus'" not in one_line_error(astra(c, "astraeus", "usage", "--by", "bogus"))
    assert "is not a time" in one_line_error(astra(c, "astraeus", "usage", "--since", "yesterdayish"))


def test_sreport_lines_match_the_records(c, story):
    recs = [r for n in ("done", "crash", "low", "urgent") for r in records(c, n)]
    minutes = math.floor(sum(r["gpu_seconds"] for r in recs) / 60 + 1e-9)
    user = recs[0]["user"] or "vision"
    out = ok(astra(c, "slurm", "sreport", "-P", "cluster", "AccountUtilizationByUser", "start=now-1hours",
                   "end=now+1hours")).splitlines()
    assert out[0] == "-" * 80 and out[1].startswith("Cluster/Account/User Utilization ")
    assert out[1].endswith("(7200 secs)") and out[2] == "Usage reported in TRES Minutes" and out[3] == "-" * 80
    assert out[4:] == ["Cluster|Account|Login|Proper Name|TRES Name|Used",
                       f"main|root|||gres/gpu|{minutes}", f"main|vision|||gres/gpu|{minutes}",
                       f"main|vision|{user}||gres/gpu|{minutes}"]
    seconds = ok(astra(c, "slurm", "sreport", "-n", "-P", "-t", "seconds", "user", "TopUsage",
                       "start=now-1hours", "end=now+1hours")).splitlines()
    assert seconds == [f"main|{user}||vision|gres/gpu|{math.floor(sum(r['gpu_seconds'] for r in recs) + 1e-9)}"]
    table = ok(astra(c, "slurm", "sreport", "user", "TopUsage", "start=now-1hours", "end=now+1hours")).splitlines()
    assert table[1].startswith("Top 10 Users ")
    assert table[4].split() == ["Cluster", "Login", "Proper", "Name", "Account", "TRES", "Name", "Used"]
    assert table[5] == "--------- --------- --------------- --------------- -------------- ---------- "
    assert table[6].split() == ["main", user, "vision", "gres/gpu", str(minutes)]
    for args, says in ((["cluster", "Bogus"], "sreport: error: unknown report 'cluster Bogus'"),
                       (["cluster", "AccountUtilizationByUser", "start=yesterdayish"],
                        "sreport: error: invalid time start='yesterdayish'"),
                       (["-t", "fortnights", "user", "TopUsage"], "sreport: error: -t fortnights: give Minutes")):
        assert one_line_error(astra(c, "slurm", "sreport", *args)).startswith(says)


def test_prometheus_counts_per_workspace(c, story):
    recs = [r for n in ("done", "crash", "low", "urgent") for r in records(c, n)]
    text = httpx.get(f"{c.server}/metrics", timeout=30).text
    assert metric(text, "astraeus_gpu_seconds_total") == pytest.approx(sum(r["gpu_seconds"] for r in recs), abs=0.05)
    assert metric(text, "astraeus_preemptions_total") == 1
    assert metric(text, "astraeus_queue_wait_seconds_count") == len(recs)
