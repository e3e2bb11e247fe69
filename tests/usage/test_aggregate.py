"""Accounting's pure part (astraeus.usage): an attempt's outcome, the input a report takes, and how attempts add up
(GPU-hours = GPUs × hours held, clipped to the window, split at UTC midnights by day)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astraeus import usage as U

DAY = 86400.0
T0 = 1_900_000_000.0 - 1_900_000_000.0 % DAY  # a UTC midnight


def att(ws="vision", user="alice", run="r", gpus=1, start=T0, end=T0 + 3600, state="Succeeded", wait=0.0,
        model="H100", cpu=1.0):
    return U.Attempt(ws, user, run, "main", model, gpus, cpu, start, end, wait, state)


def test_outcomes_follow_the_stop_asked():
    assert U.outcome(None, 0, False) == "Succeeded"
    assert U.outcome(None, 1, False) == "Failed"
    assert U.outcome(None, 0, True) == "Failed"  # evicted over its storage limit
    assert U.outcome("preempt", 143, False) == "Preempted"
    assert U.outcome("reservation", None, False) == "Preempted"
    assert U.outcome("delete", 143, False) == "Cancelled"
    assert U.outcome("timelimit", 143, False) == "Failed"
    assert U.outcome("gang", 0, False) == "Cancelled"


def test_wait_is_from_queued_to_placed_and_never_negative():
    assert U.wait_seconds(T0 + 30, T0) == 30
    assert U.wait_seconds(T0, T0 + 5) == 0
    assert U.wait_seconds(None, T0) == 0


def test_gpu_hours_are_gpus_times_duration_summed_per_group():
    rows, total = U.aggregate([att(user="alice", gpus=2), att(user="bob", gpus=4, end=T0 + 1800),
                               att(user="alice", gpus=1, start=T0 + 7200, end=T0 + 9000, state="Preempted")],
                              ("user",), T0, T0 + DAY, T0 + DAY)
    assert rows == [
        {"user": "alice", "gpu_hours": 2.5, "gpu_seconds": 9000.0, "cpu_core_hours": 1.5, "attempts": 2,
         "preemptions": 1, "queue_wait_seconds": 0.0},
        {"user": "bob", "gpu_hours": 2.0, "gpu_seconds": 7200.0, "cpu_core_hours": 0.5, "attempts": 1,
         "preemptions": 0, "queue_wait_seconds": 0.0}]
    assert total["gpu_hours"] == 4.5 and total["attempts"] == 3


def test_a_running_attempt_counts_until_now_and_the_window_clips():
    rows, total = U.aggregate([att(gpus=8, end=None)], (), T0 + 1800, T0 + DAY, T0 + 3600)
    assert total["gpu_seconds"] == 8 * 1800
    assert rows == [{"gpu_hours": 4.0, "gpu_seconds": 14400.0, "cpu_core_hours": 0.5, "attempts": 1,
                     "preemptions": 0, "queue_wait_seconds": 0.0}]
    _, outside = U.aggregate([att(end=T0 + 60)], (), T0 + 3600, T0 + DAY, T0 + DAY)
    assert outside["attempts"] == 0 and outside["gpu_seconds"] == 0


def test_by_day_an_attempt_is_split_at_midnight():
    rows, total = U.aggregate([att(gpus=2, start=T0 + DAY - 3600, end=T0 + DAY + 7200, wait=12)],
                              ("workspace", "day"), T0, T0 + 3 * DAY, T0 + 3 * DAY)
    assert [(r["day"], r["gpu_seconds"], r["attempts"], r["queue_wait_seconds"]) for r in rows] == [
        (U.day_of(T0), 7200.0, 1, 12.0), (U.day_of(T0 + DAY), 14400.0, 0, 0.0)]
    assert total["gpu_seconds"] == 21600 and total["attempts"] == 1


@pytest.mark.parametrize("given_, groups", [
    (None, ()), (["user"], ("user",)), (["day,workspace"], ("workspace", "day")),
    (["user", "workspace", "user"], ("workspace", "user")), (["run", "gpu_model"], ("run", "gpu_model"))])
def test_group_by_takes_repeats_and_commas(given_, groups):
    assert U.parse_group_by(given_) == groups


def test_bad_group_by_says_what_to_use():
    with pytest.raises(U.UsageError, match=r"group_by='bogus' is not a grouping: use one or more of cluster, "
                                           r"workspace, user, run, gpu_model, day"):
        U.parse_group_by(["user,bogus"])


@pytest.mark.parametrize("text, expected", [
    ("now", T0), ("7d", T0 - 7 * DAY), ("12h", T0 - 12 * 3600), ("30m", T0 - 1800),
    ("2030-01-01", 1893456000.0), ("2030-01-01T12:00:00Z", 1893456000.0 + 43200), ("2030-01-01T12:00", 1893499200.0),
    ("1893456000", 1893456000.0)])
def test_times(text, expected):
    assert U.parse_time(text, T0, "since") == expected


@pytest.mark.parametrize("text", ["yesterdayish", "7 days", "2030-13-01", "-5", "7y", ""])
def test_bad_times_say_what_to_give(text):
    with pytest.raises(U.UsageError, match=r"since=.* is not a time: give a duration back from now \(7d, 12h, 30m\)"):
        U.parse_time(text, T0, "since")


def test_a_window_must_go_forward():
    assert U.window(None, None, T0) == (T0 - 7 * DAY, T0)
    with pytest.raises(U.UsageError, match="since=1d is not before until=2d: give a since earlier than until"):
        U.window("1d", "2d", T0)


attempts = st.lists(st.builds(
    att, ws=st.sampled_from(["vision", "nlp"]), user=st.sampled_from(["alice", "bob", None]),
    run=st.sampled_from(["a", "b", "c"]), gpus=st.integers(0, 8),
    start=st.floats(T0 - DAY, T0 + 3 * DAY, allow_nan=False),
    end=st.one_of(st.none(), st.floats(0, 2 * DAY, allow_nan=False)),
    state=st.sampled_from(["Succeeded", "Preempted", "Failed"]), model=st.sampled_from(["H100", "A100", None])),
    max_size=30).map(lambda xs: [U.Attempt(**{**a.__dict__, "end": None if a.end is None else a.start + a.end})
                                 for a in xs])


@settings(max_examples=150, deadline=None)
@given(attempts, st.sets(st.sampled_from(U.GROUPS)), st.floats(0, 2 * DAY), st.floats(1, 2 * DAY))
def test_any_grouping_adds_up_to_the_sum_of_the_attempts(xs, groups, lo, span):
    """Grouped any way, the rows add up to the total, and the total to the sum over attempts of GPUs × overlap."""
    since, until, now = T0 + lo - DAY, T0 + lo - DAY + span, T0 + 2 * DAY
    order = tuple(g for g in U.GROUPS if g in groups)
    rows, total = U.aggregate(xs, order, since, until, now)
    expected = sum(U.gpu_seconds(a, since, until, now) for a in xs)
    assert total["gpu_seconds"] == pytest.approx(expected, abs=1e-3)
    assert sum(r["gpu_seconds"] for r in rows) == pytest.approx(expected, abs=1e-2)
    assert sum(r["attempts"] for r in rows) == total["attempts"]
    assert sum(r["preemptions"] for r in rows) == total["preemptions"]
