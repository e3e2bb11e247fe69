"""The pure reconciler of replica groups: what to create and what to delete, from the group's runs."""

from astraeus.replica_groups import (
    BACKOFF_CAP,
    KEEP_ENDED,
    Replica,
    backoff_delay,
    failure_streak,
    reconcile,
    replica_name,
    scale_down_order,
)

T = 1000.0


def r(name, state="Running", created=0.0, started=None, finished=None, deleting=False, handled=False):
    return Replica(name=name, state=state, created_at=created, started_at=started, finished_at=finished,
                   deleting=deleting, handled=handled)


def test_a_new_group_creates_every_replica():
    d = reconcile(3, [], T, base=10)
    assert (d.create, d.replaces, d.scale_down, d.backing_off, d.alive, d.missing) == (3, (), (), False, 0, 3)


def test_a_full_group_does_nothing():
    d = reconcile(2, [r("web-1", started=1), r("web-2", "Pending")], T, base=10)
    assert (d.create, d.scale_down, d.forget) == (0, (), ())


def test_a_preempted_replica_is_alive_and_not_replaced():
    # Preempted: its run is Stopping, then Pending again (queued like any run).
    for state in ("Stopping", "Pending"):
        d = reconcile(2, [r("web-1", started=1), r("web-2", state, started=2)], T, base=10)
        assert d.create == 0 and d.alive == 2


def test_an_ended_replica_is_replaced_and_named():
    d = reconcile(2, [r("web-1", started=1), r("web-2", "Completed", started=2, finished=900)], T, base=10)
    assert (d.create, d.replaces) == (1, ("web-2",))


def test_a_deleted_replica_is_replaced_at_once_even_while_it_stops():
    d = reconcile(2, [r("web-1", started=1), r("web-2", "Stopping", started=2, deleting=True)], T, base=10)
    assert (d.create, d.replaces, d.alive) == (1, ("web-2",), 1)


def test_a_replica_already_replaced_is_not_replaced_twice():
    reps = [r("web-1", started=1), r("web-3", "Pending", created=950),
            r("web-2", "Failed", started=2, finished=900, handled=True)]
    d = reconcile(2, reps, T, base=10)
    assert (d.create, d.replaces) == (0, ())


def test_the_first_failure_is_replaced_at_once_then_backoff_doubles():
    assert [backoff_delay(n, 10) for n in range(0, 8)] == [0, 0, 10, 20, 40, 80, 160, BACKOFF_CAP]
    one = [r("web-1", "Failed", started=990, finished=999)]
    d = reconcile(1, one, T, base=10)
    assert (d.create, d.failures, d.backing_off, d.retry_at) == (1, 1, False, None)
    two = one + [r("web-2", "Failed", created=999, started=995, finished=998, handled=True)]
    d = reconcile(1, two, T, base=10)
    assert (d.create, d.failures, d.backing_off, d.retry_at) == (0, 2, True, 1009)
    assert reconcile(1, two, 1009, base=10).create == 1


def test_a_success_or_a_long_run_ends_the_failure_streak():
    reps = [r("a", "Failed", started=900, finished=990), r("b", "Completed", started=800, finished=899),
            r("c", "Failed", started=700, finished=799)]
    assert failure_streak(reps) == (1, 990)
    long_run = [r("a", "Failed", started=100, finished=990), r("c", "Failed", started=50, finished=80)]
    assert failure_streak(long_run) == (1, 990)
    deleted = [r("a", "Failed", started=900, finished=990), r("b", "Cancelled", finished=950, deleting=True),
               r("c", "Failed", started=700, finished=799)]
    assert failure_streak(deleted) == (2, 990)


def test_scale_down_removes_waiting_replicas_first_then_the_most_recently_started():
    reps = [r("web-1", started=10, created=1), r("web-2", started=30, created=2), r("web-3", started=20, created=3),
            r("web-4", "Pending", created=4), r("web-5", "Pending", created=5), r("web-6", "Stopping", started=40,
                                                                                   created=6)]
    assert [x.name for x in scale_down_order(reps)] == ["web-5", "web-4", "web-6", "web-2", "web-3", "web-1"]
    assert reconcile(3, reps, T, base=10).scale_down == ("web-5", "web-4", "web-6")
    assert reconcile(1, reps, T, base=10).scale_down == ("web-5", "web-4", "web-6", "web-2", "web-3")
    assert reconcile(0, reps, T, base=10).create == 0


def test_a_refusal_wait_holds_replacements_back():
    d = reconcile(2, [r("web-1")], T, base=10, retry_at=T + 30)
    assert (d.create, d.backing_off, d.retry_at) == (0, True, T + 30)
    assert reconcile(2, [r("web-1")], T + 30, base=10, retry_at=T + 30).create == 1


def test_old_ended_replicas_are_forgotten_once_replaced():
    ended = [r(f"web-{i}", "Completed", started=i, finished=i + 1, handled=True) for i in range(KEEP_ENDED + 3)]
    d = reconcile(1, [r("live", started=1)] + ended, T, base=10)
    assert set(d.forget) == {"web-0", "web-1", "web-2"}


def test_replica_names():
    assert replica_name("web", 12) == "web-12"
