"""The queue's reasons and why-not lines written in bulk (lifecycle.set_queue_reasons, one UPDATE per table for a
whole cycle) show what the per-run writes (set_queue_reason, set_why_not) show, whatever the run went through
since the scheduler's snapshot: plainly waiting, preempted and waiting again, backing off after a failure,
being deleted, placed."""

from __future__ import annotations

import pytest

from astraeus.server import lifecycle as L
from tests.lifecycle.rows import T0, delete, exits, place, preempt, running

REASON = "Queued behind big, which waits for running work to end"
LINES = [["gpu-01", "4 GPUs free, needs 8"], ["gpu-02", "Lost"]]

CASES = {
    "waiting": [],
    "preempted": [place(0), running(0), preempt([0], "urgent", "Preempted by higher-priority work (urgent)"),
                  exits(0, sig=15)],
    "backing-off": [place(0), running(0), exits(0, 3)],
    "deleting": [place(0), running(0), delete()],
    "placed": [place(0)],
}


def shown(world, run, now: float = T0 + 6) -> tuple:
    """What the API shows of the run at `now` (its reason as run_reason shows it), and its History."""
    world.s.flush()
    world.s.expire_all()
    return (run.state, L.run_reason(run, now), run.queue_reason, run.workers[0].why_not, world.history(run))


def prepared(world, steps, name):
    run = world.run(name)
    for n, step in enumerate(steps):
        step(world, run, T0 + n)
    world.s.flush()
    return run


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_bulk_write_shows_what_the_per_run_write_shows(world, case):
    at = T0 + 5  # within a failed worker's backoff (10 s)
    one = prepared(world, CASES[case], "one")
    if not one.deleting:
        L.set_queue_reason(world.s, one, REASON, at)
    L.set_why_not(one.workers[0], LINES)
    expected = shown(world, one)

    bulk = prepared(world, CASES[case], "bulk")
    L.set_queue_reasons(world.s, {bulk.id: REASON}, {bulk.workers[0].id: LINES}, at)
    assert shown(world, bulk)[:4] == expected[:4]
    assert [h[1] for h in shown(world, bulk)[4]] == [h[1] for h in expected[4]]  # no History line of its own


def test_a_waiting_run_shows_the_queue_reason_and_its_lines(world):
    run = prepared(world, [], "r")
    L.set_queue_reasons(world.s, {run.id: REASON}, {run.workers[0].id: LINES}, T0)
    assert shown(world, run)[:4] == ("Pending", REASON, REASON, LINES)


def test_runs_that_share_a_reason_end_as_each_written_alone(world):
    """A reason many waiting runs share, and why-not lines many waiting workers share, are written for them in one
    UPDATE (by id): each run ends as the per-run write leaves it, whatever it went through since the snapshot (every
    case at once, one reason, one set of lines: only a worker still waiting gets them)."""
    at = T0 + 5
    expected = {}
    for case, steps in sorted(CASES.items()):
        one = prepared(world, steps, f"one-{case}")
        if not one.deleting:
            L.set_queue_reason(world.s, one, REASON, at)
        expected[case] = shown(world, one)
    bulk = {case: prepared(world, steps, f"bulk-{case}") for case, steps in sorted(CASES.items())}
    assert len(bulk) >= 4  # the shared reason's own UPDATE, not the per-row batch
    L.set_queue_reasons(world.s, {r.id: REASON for r in bulk.values()}, {r.workers[0].id: LINES for r in bulk.values()},
                        at)
    for case, run in bulk.items():
        got = shown(world, run)
        assert got[:3] == expected[case][:3], case
        assert got[3] == (LINES if run.workers[0].state == "Pending" else expected[case][3]), case
        assert [h[1] for h in got[4]] == [h[1] for h in expected[case][4]], case
