"""Crash-loop backoff, driven directly on rows (no server process): 10 s doubling to 5 minutes, reset after an
attempt ran 10 minutes; shown as the time left; the scheduling loop offers no worker before its restart_at."""

from __future__ import annotations

import pytest

from astraeus.server import lifecycle as L
from astraeus.server import loop
from tests.lifecycle.rows import T0, exits, place, preempt, running, start_fails


@pytest.mark.parametrize(("streak", "delay"), [(0, 10), (1, 20), (2, 40), (3, 80), (4, 160), (5, 300), (6, 300),
                                               (40, 300), (10_000, 300)])
def test_delay_doubles_from_10s_to_at_most_5_minutes(streak, delay):
    assert L.backoff_delay(streak, 10) == delay


# Each row: how long the attempt ran before it failed, then the delay before the next restart, the streak after,
# and the worker's reason. An attempt that ran 10 minutes (600 s) starts the streak again; 599 s does not.
SEQUENCE = [
    (1, 10, 1, "Restarting in 10s (exit code 3; restart 1 of 20)"),
    (1, 20, 2, "Restarting in 20s (exit code 3; restart 2 of 20)"),
    (0, 40, 3, "Restarting in 40s (failed to start: image not found; restart 3 of 20)"),
    (5, 80, 4, "Restarting in 80s (exit code 3; restart 4 of 20)"),
    (1, 160, 5, "Restarting in 160s (exit code 3; restart 5 of 20)"),
    (1, 300, 6, "Restarting in 300s (exit code 3; restart 6 of 20)"),
    (599, 300, 7, "Restarting in 300s (exit code 3; restart 7 of 20)"),
    (600, 10, 1, "Restarting in 10s (exit code 3; restart 8 of 20)"),
    (30, 20, 2, "Restarting in 20s (exit code 3; restart 9 of 20)"),
    (3600, 10, 1, "Restarting in 10s (exit code 3; restart 10 of 20)"),
]


def test_backoff_sequence_and_its_reset_after_10_minutes_of_running(world):
    run = world.run(budget=20)
    w = run.workers[0]
    at = T0
    for n, (ran, delay, streak, reason) in enumerate(SEQUENCE, start=1):
        if n > 1:
            assert at >= w.restart_at
        at += 1
        place(0)(world, run, at)
        assert w.restart_at is None  # cleared when placed
        if ran:
            running(0)(world, run, at)
            at += ran
            exits(0, 3)(world, run, at)
        else:
            start_fails(0, "image not found")(world, run, at)
        assert (w.state, w.restarts, w.crash_streak, w.reason) == ("Pending", n, streak, reason)
        assert w.restart_at == at + delay
        assert (run.state, run.reason) == ("Pending", reason)
        at = w.restart_at


def test_the_reason_counts_down_as_it_is_shown(world):
    run = world.run()
    place(0)(world, run, T0)
    running(0)(world, run, T0 + 1)
    exits(0, 3)(world, run, T0 + 2)  # restart_at = T0 + 12
    w = run.workers[0]
    assert w.reason == "Restarting in 10s (exit code 3; restart 1 of 10)"
    shown = {t: (L.worker_reason(w, T0 + t), L.run_reason(run, T0 + t)) for t in (2, 2.5, 6.2, 11.9, 12, 30)}
    assert shown == {
        2: ("Restarting in 10s (exit code 3; restart 1 of 10)",) * 2,
        2.5: ("Restarting in 10s (exit code 3; restart 1 of 10)",) * 2,
        6.2: ("Restarting in 6s (exit code 3; restart 1 of 10)",) * 2,
        11.9: ("Restarting in 1s (exit code 3; restart 1 of 10)",) * 2,
        12: ("Restarting (exit code 3; restart 1 of 10)",) * 2,
        30: ("Restarting (exit code 3; restart 1 of 10)",) * 2,
    }
    place(0)(world, run, T0 + 30)
    assert L.worker_reason(w, T0 + 31) == "Starting on gpu-01"
    assert L.shown_reason("Queued behind big", T0 + 50, T0) == "Queued behind big"  # only a countdown changes


def test_a_preemption_never_waits_on_backoff(world):
    run = world.run()
    w = run.workers[0]
    place(0)(world, run, T0)
    running(0)(world, run, T0 + 1)
    exits(0, 3)(world, run, T0 + 2)
    place(0)(world, run, T0 + 12)
    running(0)(world, run, T0 + 13)
    preempt([0], "big", "Stopping: preempted by big (priority 100)")(world, run, T0 + 14)
    exits(0, 0)(world, run, T0 + 15)
    assert (w.state, w.restart_at, w.restarts, w.crash_streak) == ("Pending", None, 1, 1)
    snap, _ = loop.build_snapshot(world.s, world.cluster, T0 + 15)
    assert [r.name for r in snap.waiting] == ["r"]


def test_a_short_base_for_tests(world, monkeypatch):
    monkeypatch.setenv(L.BACKOFF_ENV, "0.5")
    run = world.run()
    place(0)(world, run, T0)
    exits(0, 3)(world, run, T0 + 1)
    w = run.workers[0]
    assert (w.restart_at, w.reason) == (T0 + 1.5, "Restarting in 1s (exit code 3; restart 1 of 10)")


@pytest.mark.parametrize("raw", ["soon", "-1", "301"])
def test_a_bad_base_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(L.BACKOFF_ENV, raw)
    with pytest.raises(ValueError, match=f"ASTRAEUS_RESTART_BACKOFF_BASE='{raw}': give"):
        L.backoff_base()


# ------------------------------------------------------------------------------- the scheduling loop


def waiting(world, at):
    snap, _ = loop.build_snapshot(world.s, world.cluster, at)
    return {r.name: [x.index for x in r.workers] for r in snap.waiting}


def test_the_loop_offers_a_worker_only_once_its_backoff_ends(world):
    run = world.run()
    place(0)(world, run, T0)
    exits(0, 3)(world, run, T0 + 1)  # restart_at T0 + 11
    world.s.flush()
    assert waiting(world, T0 + 10.9) == {}
    assert loop.next_due_at(world.s, T0 + 10.9) == T0 + 11  # the loop's one read of what is due next
    assert loop.next_due_at(world.s, T0 + 10.95) == T0 + 11
    assert waiting(world, T0 + 11) == {"r": [0]}
    assert loop.next_due_at(world.s, T0 + 11) is None
    assert loop.next_due_at(world.s, T0 + 12) is None


def test_a_gang_waits_for_the_latest_restart_of_its_workers(world):
    run = world.run(workers=2)
    w0, w1 = run.workers
    place(0)(world, run, T0)
    place(1, "gpu-02")(world, run, T0)
    exits(1, 3)(world, run, T0 + 1)
    exits(0, None, 15)(world, run, T0 + 2)
    assert (w0.state, w1.state, w0.restart_at, w1.restart_at) == ("Pending", "Pending", None, T0 + 11)
    world.s.flush()
    assert waiting(world, T0 + 5) == {}
    assert waiting(world, T0 + 11) == {"r": [0, 1]}


def test_independent_workers_back_off_one_by_one(world):
    run = world.run(workers=2, start="Independent")
    for i in (0, 1):
        place(i)(world, run, T0)
    exits(1, 3)(world, run, T0 + 1)  # w1 restarts at T0 + 11
    exits(0, 3)(world, run, T0 + 5)  # w0 restarts at T0 + 15
    world.s.flush()
    assert waiting(world, T0 + 6) == {}
    assert waiting(world, T0 + 11) == {"r": [1]}
    assert waiting(world, T0 + 15) == {"r": [0, 1]}
    assert (run.state, run.reason) == ("Pending", "Restarting in 10s (exit code 3; restart 1 of 10)")
    assert L.run_reason(run, T0 + 6) == "Restarting in 9s (exit code 3; restart 1 of 10)"  # the later one


def test_the_loop_does_not_place_a_worker_still_backing_off(world):
    """apply_plan checks again what the snapshot saw: a plan made for a worker that now backs off is skipped."""
    from astraeus import scheduler as sched

    run = world.run()
    place(0)(world, run, T0)
    exits(0, 3)(world, run, T0 + 1)
    world.s.flush()
    plan = sched.Plan(starts=(sched.StartRun(run="r", placements=(sched.Placement(
        worker_index=0, machine="gpu-01", gpu_indices=(0,), cpu_cores=1.0, memory_bytes=0),)),))
    lookups = loop.Lookups(runs={"r": run.id}, machines={"gpu-01": world.machines["gpu-01"].id}, interned={},
                           max_run_id=run.id, queue_reasons={}, why_not={}, workers={})
    touched, skipped = loop.apply_plan(world.s, plan, lookups, T0 + 5)
    assert (touched, skipped, run.workers[0].state) == (set(), True, "Pending")
    touched, skipped = loop.apply_plan(world.s, plan, lookups, T0 + 11)
    assert (skipped, run.workers[0].state, run.workers[0].restart_at) == (False, "Starting", None)


def test_a_gang_mate_asked_to_stop_by_a_report_is_told_at_once(world):
    """The agent on gpu-02 reports its worker failed; its mate on gpu-01 must stop: the loop tells gpu-01."""
    run = world.run(workers=2)
    place(0)(world, run, T0)
    place(1, "gpu-02")(world, run, T0)
    running(0)(world, run, T0 + 1)
    running(1)(world, run, T0 + 1)
    exits(1, 3)(world, run, T0 + 2)
    world.s.flush()
    w0 = run.workers[0]
    assert loop.stops_asked_since(world.s, T0) == {(w0.id, T0 + 2): world.machines["gpu-01"].id}
    assert loop.stops_asked_since(world.s, T0 + 3) == {}


def test_the_run_says_the_time_left_when_its_gang_is_queued_again(world):
    run = world.run(workers=2)
    place(0)(world, run, T0)
    place(1, "gpu-02")(world, run, T0)
    exits(1, 3)(world, run, T0 + 1)  # restart_at T0 + 11
    exits(0, None, 15)(world, run, T0 + 4.5)  # the mate took its stop grace
    assert (run.state, run.reason) == ("Pending", "Restarting in 7s (exit code 3; restart 1 of 10)")
    assert world.history(run)[-1] == ("Pending", "Restarting in 7s (exit code 3; restart 1 of 10)")
