"""The simulator on small hand-made traces, driving the real scheduler: outcomes a user would read."""

from __future__ import annotations

import json

import pytest

from astraeus.sim import simulate_main

TASKS_HEADER = "name,submit_time,duration,gpus,priority,workspace,time_limit"


@pytest.fixture
def one_machine(write_csv):
    return write_csv("machines.csv", "name,gpus", "gpu-01,8")


def run(machines, tasks, **kw):
    report = simulate_main(machines, tasks, "csv", quiet=True, **kw)
    assert report["invalid_placements"] == 0, report["invalid_examples"]
    return report


def wait_of(report, cls):
    return report["waits"][cls]["simulated"]["p50"]


def test_high_priority_preempts_low_and_the_lost_work_is_counted(one_machine, write_csv):
    # low holds all 8 GPUs from t=0; high arrives at t=1000 and needs them all.
    tasks = write_csv("t.csv", TASKS_HEADER, "low,0,3600,8,-100,a,", "high,1000,1200,8,100,b,")
    r = run(one_machine, tasks, checkpoint_interval=300)
    assert r["preemptions"] == 1
    assert r["preempted_tasks"] == 1
    # It saved at 300, 600 and 900 s of run time: the 100 s since its last checkpoint are lost, on 8 GPUs.
    assert r["gpu_hours_lost"] == pytest.approx(100 * 8 / 3600)
    # The victim holds its room for the 30 s stop grace, then high starts.
    assert wait_of(r, "priority 100") == pytest.approx(30)
    assert wait_of(r, "priority -100") == 0
    # low resumes when high ends (1030 + 1200) with 3600 - 900 s left.
    assert r["makespan_seconds"] == pytest.approx(1030 + 1200 + 2700)
    assert r["outcomes"] == {"Completed": 2}


def test_without_checkpoints_a_victim_loses_its_whole_attempt(one_machine, write_csv):
    tasks = write_csv("t.csv", TASKS_HEADER, "low,0,3600,8,-100,a,", "high,1000,1200,8,100,b,")
    r = run(one_machine, tasks, checkpoint_interval=0)
    assert r["preemptions"] == 1
    assert r["gpu_hours_lost"] == pytest.approx(1000 * 8 / 3600)
    assert r["makespan_seconds"] == pytest.approx(1030 + 1200 + 3600)


def test_no_preemption_makes_the_urgent_task_wait(one_machine, write_csv):
    tasks = write_csv("t.csv", TASKS_HEADER, "low,0,3600,8,-100,a,", "high,1000,1200,8,100,b,")
    r = run(one_machine, tasks, preemption=False)
    assert r["preemptions"] == 0
    assert r["gpu_hours_lost"] == 0
    assert wait_of(r, "priority 100") == pytest.approx(2600)


def test_equal_priority_never_preempts(one_machine, write_csv):
    tasks = write_csv("t.csv", TASKS_HEADER, "first,0,3600,8,5,a,", "second,1000,1200,8,5,b,")
    r = run(one_machine, tasks)
    assert r["preemptions"] == 0
    assert wait_of(r, "priority 5") in (0, 2600)


def test_priority_order_and_fifo_order_differ(one_machine, write_csv):
    # A blocker of the highest priority holds the machine until t=100 (nothing may preempt it); behind it
    # low (submitted first) and high both wait for all 8 GPUs.
    tasks = write_csv(
        "t.csv", TASKS_HEADER, "blocker,0,100,8,50,a,", "low,10,100,8,-10,a,", "high,20,100,8,10,b,"
    )
    by_priority = run(one_machine, tasks)
    assert wait_of(by_priority, "priority 10") == pytest.approx(100 - 20)
    assert wait_of(by_priority, "priority -10") == pytest.approx(200 - 10)
    fifo = run(one_machine, tasks, fifo=True)
    assert wait_of(fifo, "priority -10") == pytest.approx(100 - 10)
    assert wait_of(fifo, "priority 10") == pytest.approx(200 - 20)
    assert by_priority["preemptions"] == fifo["preemptions"] == 0


def test_backfill_starts_a_short_run_with_an_honest_time_limit(one_machine, write_csv):
    # running holds 4 GPUs until t=1000 (time limit 1000); head needs all 8 so waits until then;
    # short (2 GPUs, ends by t=500) fits before the head's shadow time; nolimit has no time limit.
    # One workspace, so fair share does not put short and nolimit ahead of the head.
    tasks = write_csv(
        "t.csv", TASKS_HEADER,
        "running,0,1000,4,0,a,1000",
        "head,10,100,8,0,a,100",
        "short,20,480,2,0,a,480",
        "nolimit,30,480,2,0,a,",
    )
    r = run(one_machine, tasks)
    assert r["backfilled_starts"] == 1
    off = run(one_machine, tasks, backfill=False)
    assert off["backfilled_starts"] == 0
    # With backfill, short starts at once (wait 0); without, it waits behind the head.
    waits_on = _waits(one_machine, tasks)
    waits_off = _waits(one_machine, tasks, backfill=False)
    assert waits_on["short"] == 0
    assert waits_off["short"] > 0
    # nolimit cannot be known to end in time: it only gets room the head does not need (none here).
    assert waits_on["nolimit"] > 0
    assert waits_on["head"] == waits_off["head"] == pytest.approx(1000 - 10)


def _waits(machines, tasks, **kw):
    from astraeus.sim.engine import SimOptions, simulate
    from astraeus.sim.trace import load_trace

    trace = load_trace(machines, tasks, "csv")
    result = simulate(trace, SimOptions(**kw))
    return {n: st.first_start - st.task.submit_time for n, st in result.states.items()}


def test_a_task_over_its_time_limit_fails(one_machine, write_csv):
    tasks = write_csv("t.csv", TASKS_HEADER, "over,0,500,1,0,a,100", "fine,0,50,1,0,a,100")
    r = run(one_machine, tasks)
    assert r["outcomes"] == {"Completed": 1, "Failed": 1}


def test_utilisation_is_a_fraction_of_the_gpus(one_machine, write_csv):
    lines = [TASKS_HEADER] + [f"t{i},{i * 7},{300 + 37 * i},{1 + i % 8},{(i % 3 - 1) * 50},w{i % 3}," for i in range(60)]
    r = run(one_machine, write_csv("t.csv", *lines), checkpoint_interval=60)
    assert 0 < r["utilisation"] <= 1.0
    assert r["peak_gpus_busy"] <= 8
    assert sum(r["outcomes"].values()) == 60
    assert r["outcomes"].get("Completed") == 60


def test_a_task_that_fits_nowhere_is_reported_as_never_started(one_machine, write_csv):
    tasks = write_csv("t.csv", TASKS_HEADER, "huge,0,10,16,0,a,", "small,0,10,1,0,a,")
    r = run(one_machine, tasks)
    assert r["never_started"] == 1
    assert r["outcomes"] == {"Completed": 1, "Pending": 1}


def test_report_json_and_plot_files(one_machine, write_csv, tmp_path, capsys):
    tasks = write_csv("t.csv", TASKS_HEADER, "low,0,3600,8,-100,a,", "high,1000,1200,8,100,b,")
    out, png = tmp_path / "r.json", tmp_path / "u.png"
    simulate_main(one_machine, tasks, "csv", json_out=out, plot=png)
    text = capsys.readouterr().out
    assert "Preemptions: 1" in text
    assert "p50" in text and "Makespan" in text and "Scheduler:" in text
    data = json.loads(out.read_text())
    assert data["preemptions"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_typer_command(one_machine, write_csv, tmp_path):
    import typer
    from typer.testing import CliRunner

    from astraeus.sim import simulate_command

    app = typer.Typer()
    app.command("simulate")(simulate_command)
    app.command("other")(lambda: None)  # with two commands, typer keeps the "simulate" name
    tasks = write_csv("t.csv", TASKS_HEADER, "low,0,3600,8,-100,a,", "high,1000,1200,8,100,b,")
    res = CliRunner().invoke(
        app, ["simulate", "--machines", str(one_machine), "--tasks", str(tasks), "--format", "csv",
              "--no-preemption", "--json", str(tmp_path / "o.json")],
    )
    assert res.exit_code == 0, res.output
    assert "preemption OFF" in res.output
    assert json.loads((tmp_path / "o.json").read_text())["preemptions"] == 0
    bad = CliRunner().invoke(app, ["simulate", "--machines", str(one_machine), "--tasks", str(tasks), "--format", "x"])
    assert bad.exit_code != 0


def test_fair_share_puts_the_less_used_workspace_first(one_machine, write_csv):
    # Workspace a holds 4 GPUs all along; c's blocker holds the other 4 until t=100. x (a) was submitted
    # before y (b); when 4 GPUs free up, fair share starts y first, submission order starts x first.
    tasks = write_csv(
        "t.csv", TASKS_HEADER,
        "a-long,0,1000,4,0,a,", "c-blocker,0,100,4,0,c,", "x,10,50,4,0,a,", "y,20,50,4,0,b,",
    )
    fair = _waits(one_machine, tasks)
    assert (fair["y"], fair["x"]) == (pytest.approx(100 - 20), pytest.approx(150 - 10))
    plain = _waits(one_machine, tasks, fair_share=False)
    assert (plain["x"], plain["y"]) == (pytest.approx(100 - 10), pytest.approx(150 - 20))
