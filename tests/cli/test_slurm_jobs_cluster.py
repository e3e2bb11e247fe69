"""Job arrays and dependencies on a real local cluster (`astraeus up`, process runtime), through `astra slurm`:
an array of 20 with `%4` never runs more than 4 at once and completes all 20, each task seeing its SLURM_ARRAY_*
variables; an `afterok` run starts only once its job completed, and fails with a reason when its job fails;
squeue and scancel take `job`, `job_3` and `job_[0-2]`."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from tests.cli.test_commands import _gone, astra, ok, one_line_error, state


@pytest.fixture
def c(shared_cluster):
    return shared_cluster


ARRAY = """#!/bin/bash
#SBATCH --job-name=arr
#SBATCH --container-image=busybox
#SBATCH --array=0-19%4
echo "start $(date +%s.%N) task=$SLURM_ARRAY_TASK_ID job=$SLURM_ARRAY_JOB_ID count=$SLURM_ARRAY_TASK_COUNT \
min=$SLURM_ARRAY_TASK_MIN max=$SLURM_ARRAY_TASK_MAX index=$ASTRAEUS_ARRAY_INDEX"
sleep 1
echo "end $(date +%s.%N)"
"""


def runs_of(c, job: str) -> list[dict]:
    with c.client() as h:
        items = h.get("/runs").json()
    items = items.get("items", items) if isinstance(items, dict) else items
    return [r for r in items if (r["spec"].get("array") or {}).get("job") == job]


def test_an_array_of_20_with_at_most_4_at_once_completes_all(c, tmp_path):
    (tmp_path / "arr.sbatch").write_text(ARRAY)
    r = astra(c, "slurm", "sbatch", "arr.sbatch", cwd=tmp_path)
    names = [f"arr_{i}" for i in range(20)]
    try:
        assert ok(r) == "Submitted batch job arr\n"
        assert "sbatch: note: job array arr: 20 runs arr_[0-19], at most 4 at once" in r.stderr
        most = 0
        waiting_said = False

        def all_done() -> bool:
            nonlocal most, waiting_said
            rs = runs_of(c, "arr")
            live = [x for x in rs if x["status"]["state"] in ("Starting", "Running", "Stopping")]
            most = max(most, len(live))
            waiting_said = waiting_said or any(
                x["status"].get("reason") == "Waiting: 4 of array arr are running (at most 4 at once)" for x in rs)
            return len(rs) == 20 and all(x["status"]["state"] == "Completed" for x in rs)

        c.wait_for(all_done, timeout=80, interval=0.2, what="all 20 runs of arr completed")
        assert most <= 4
        assert waiting_said
        spans = []
        for i in range(20):
            log = c.logs(f"arr_{i}-0")
            m = re.search(r"start (\S+) task=(\d+) job=arr count=20 min=0 max=19 index=(\d+)", log)
            assert m and m.group(2) == m.group(3) == str(i), log
            spans.append((float(m.group(1)), float(re.search(r"end (\S+)", log).group(1))))
        # The tasks' own clocks: at no moment did more than 4 of them run.
        for t, _ in spans:
            assert sum(1 for s, e in spans if s <= t <= e) <= 4
    finally:
        with c.client() as h:
            for n in names:
                h.delete(f"/runs/{n}")


def test_afterok_waits_for_its_job_and_fails_when_it_fails(c, tmp_path):
    img = "--container-image=busybox"
    try:
        # long enough that `after` is still held when squeue looks, however loaded the machine (it was 3 s: side
        # by side with other test files, prep could end between the two looks and `after` be running already)
        ok(astra(c, "slurm", "sbatch", "-J", "prep", img, "--wrap", "sleep 8"))
        r = astra(c, "slurm", "sbatch", "-J", "after", img, "--dependency=afterok:prep", "--wrap", "echo after")
        assert ok(r) == "Submitted batch job after\n"
        c.wait_for(lambda: c.run("after")["status"].get("reason") == "Waiting for prep to complete (afterok)",
                   what="after waits for prep")
        sq = ok(astra(c, "slurm", "squeue", "-j", "after"))
        assert sq.rstrip().endswith("PD       0:00      1 (Waiting for prep to complete (afterok))"), sq
        c.wait_for(lambda: state(c, "after") == "Completed", timeout=40, what="after completed")
        prep, after = c.run("prep"), c.run("after")
        assert prep["status"]["state"] == "Completed"
        placed = datetime.fromisoformat(after["status"]["workers"][0]["placed_at"].replace("Z", "+00:00"))
        assert placed >= datetime.fromisoformat(prep["status"]["finished_at"].replace("Z", "+00:00"))

        ok(astra(c, "slurm", "sbatch", "-J", "bad", img, "--wrap", "sleep 1; exit 3"))
        ok(astra(c, "slurm", "sbatch", "-J", "never", img, "--dependency=afterok:bad", "--wrap", "echo never"))
        c.wait_for(lambda: state(c, "never") == "Failed", timeout=40, what="never failed")
        assert c.run("never")["status"]["reason"] == "bad failed: afterok can no longer be met"
        assert "never" not in c.logs("never-0")

        err = one_line_error(astra(c, "slurm", "sbatch", "-J", "x", img, "--dependency=afterok:nosuch", "--wrap", "t"))
        assert err.startswith("sbatch: error: Batch job submission failed: 400 DEPENDENCY_NOT_FOUND: "
                              "spec.dependency.runs: no run or job array named nosuch"), err
        assert _gone(c, "x")
    finally:
        with c.client() as h:
            for n in ("prep", "after", "bad", "never"):
                h.delete(f"/runs/{n}")


def test_squeue_and_scancel_take_arrays(c):
    img = "--container-image=busybox"
    r = astra(c, "slurm", "sbatch", "-J", "sc", img, "--array=0-5%2", "--wrap", "sleep 300")
    try:
        assert ok(r) == "Submitted batch job sc\n"
        sq = ok(astra(c, "slurm", "squeue", "-j", "sc_[0-2]"))
        assert sorted(line.split()[0] for line in sq.splitlines()[1:]) == ["sc_0", "sc_1", "sc_2"], sq
        assert all(line.split()[2] == "sc" for line in sq.splitlines()[1:]), sq  # NAME: the array's job
        assert len(ok(astra(c, "slurm", "squeue", "-j", "sc")).splitlines()) == 7
        ok(astra(c, "slurm", "scancel", "sc_[0-2]"))
        c.wait_for(lambda: all(_gone(c, f"sc_{i}") for i in range(3)), what="sc_0..2 cancelled")
        ok(astra(c, "slurm", "scancel", "sc_4"))
        c.wait_for(lambda: _gone(c, "sc_4"), what="sc_4 cancelled")
        assert not _gone(c, "sc_3") and not _gone(c, "sc_5")
        ok(astra(c, "slurm", "scancel", "sc"))
        c.wait_for(lambda: _gone(c, "sc_3") and _gone(c, "sc_5"), what="sc cancelled")
        err = one_line_error(astra(c, "slurm", "scancel", "sc"))
        assert err == "scancel: error: Kill job error on job id sc: Invalid job id specified"
    finally:
        with c.client() as h:
            for i in range(6):
                h.delete(f"/runs/sc_{i}")
