"""The simulator under both victim rules (issue 47): GPU-hours lost to preemption."""

from __future__ import annotations

import pytest

from astraeus.sim import simulate_main

TASKS_HEADER = "name,submit_time,duration,gpus,priority,workspace,time_limit"


def test_least_work_lost_stops_the_victim_that_checkpointed_last(write_csv):
    machines = write_csv("machines.csv", "name,gpus", "gpu-01,8")
    # old starts at 0 and new at 250, 4 GPUs each, saving every 300 s of run time; high needs 4 GPUs at t=1000.
    # At 1000 old last saved at 900 (loses 100 s), new at 250 + 600 = 850 (loses 150 s): the pages' rule stops
    # new (the most recently started), least-work-lost stops old.
    tasks = write_csv("t.csv", TASKS_HEADER, "old,0,5000,4,-100,a,", "new,250,5000,4,-100,a,",
                      "high,1000,600,4,100,b,")
    recent = simulate_main(machines, tasks, "csv", quiet=True, checkpoint_interval=300)
    least = simulate_main(machines, tasks, "csv", quiet=True, checkpoint_interval=300, victims="least-work-lost")
    assert recent["preemptions"] == least["preemptions"] == 1
    assert recent["gpu_hours_lost"] == pytest.approx(150 * 4 / 3600)
    assert least["gpu_hours_lost"] == pytest.approx(100 * 4 / 3600)


def test_the_alibaba_slice_loses_no_more_under_least_work_lost(trace_dir):
    common = dict(arrival_scale=0.001, max_machines=10, checkpoint_interval=1800, quiet=True)
    machines, tasks = trace_dir / "openb_node_list_gpu_node.csv", trace_dir / "openb_pod_list_default.csv"
    recent = simulate_main(machines, tasks, "alibaba", **common)
    least = simulate_main(machines, tasks, "alibaba", victims="least-work-lost", **common)
    assert recent["invalid_placements"] == least["invalid_placements"] == 0
    assert recent["preemptions"] > 0
    assert least["gpu_hours_lost"] <= recent["gpu_hours_lost"]


def test_an_unknown_victim_rule_is_refused(write_csv):
    from typer.testing import CliRunner

    from astraeus.sim.cli import sim_app

    machines = write_csv("machines.csv", "name,gpus", "gpu-01,8")
    tasks = write_csv("t.csv", TASKS_HEADER, "a,0,10,1,0,a,")
    r = CliRunner().invoke(sim_app, ["--machines", str(machines), "--tasks", str(tasks), "--format", "csv",
                                     "--victims", "oldest"])
    assert r.exit_code == 2 and "use recent or least-work-lost" in r.output, r.output
