"""One case per rule of the "Priorities, preemption and checkpoints" page, asserting what a user sees."""

from __future__ import annotations

import pytest

from astraeus.scheduler import Quota, plan

from .builders import (
    GIB,
    HOUR,
    NOW,
    WS_A,
    WS_B,
    cluster,
    machine,
    started,
    started_names,
    stopped_names,
)

AT_14 = "2026-10-01 14:00 UTC"
# NOW is 12:00. Running work that started at 10:59:30 with a 3 h limit is stopped at 13:59:30, and gone by 14:00
# once its machine's 30 s stop grace has run out.
T0 = NOW - HOUR - 30


# ------------------------------------------------------------------------------------------------ order

ORDER_CASES = [
    pytest.param(
        cluster(machine("gpu-01", gpus=1)).waiting("low", prio=-5).waiting("high", prio=5),
        "high", id="priority-higher-first",
    ),
    pytest.param(
        cluster(machine("gpu-01", gpus=1)).waiting("first").waiting("second"),
        "first", id="submission-time-earlier-first",
    ),
    pytest.param(
        cluster(machine("gpu-01", gpus=1), machine("gpu-02", gpus=3))
        .workspace(WS_A, Quota(gpus=4)).workspace(WS_B, Quota(gpus=4))
        .running("busy", gpus=3, on="gpu-02", ws=WS_A)
        .waiting("a-run", ws=WS_A).waiting("b-run", ws=WS_B),
        "b-run", id="fair-share-smaller-dominant-share-first",
    ),
    pytest.param(
        cluster(machine("gpu-01", gpus=1), machine("gpu-02", gpus=3))
        .workspace(WS_A, Quota(gpus=4), weight=4.0).workspace(WS_B, Quota(gpus=4))
        .running("busy", gpus=2, on="gpu-02", ws=WS_A).running("b-busy", gpus=1, on="gpu-02", ws=WS_B)
        .waiting("a-run", ws=WS_A).waiting("b-run", ws=WS_B),
        "a-run", id="fair-share-divided-by-weight",
    ),
    pytest.param(
        cluster(machine("gpu-01", gpus=1), machine("gpu-02", gpus=3))
        .workspace(WS_A).workspace(WS_B, Quota(gpus=4))
        .running("busy", gpus=2, on="gpu-02", ws=WS_A).running("b-busy", gpus=1, on="gpu-02", ws=WS_B)
        .waiting("b-run", ws=WS_B).waiting("a-run", ws=WS_A),
        "a-run", id="fair-share-no-quota-is-share-0",
    ),
    pytest.param(
        cluster(machine("gpu-01", gpus=1), machine("gpu-02", gpus=3))
        .workspace(WS_A, Quota(gpus=4)).workspace(WS_B, Quota(gpus=4))
        .running("busy", gpus=3, on="gpu-02", ws=WS_A)
        .waiting("a-run", ws=WS_A).waiting("b-run", ws=WS_B).set(fair_share=False),
        "a-run", id="fair-share-off",
    ),
    pytest.param(
        cluster(machine("gpu-01", gpus=1)).waiting("old", prio=-5).waiting("new", prio=5).set(fifo=True),
        "old", id="fifo-ignores-priority",
    ),
]


@pytest.mark.parametrize("builder, first", ORDER_CASES)
def test_queue_order(builder, first):
    assert started_names(plan(builder.build(), NOW)) == [first]


def test_fair_share_counts_runs_started_earlier_in_the_same_cycle():
    snap = (
        cluster(machine("gpu-01", gpus=4))
        .workspace(WS_A, Quota(gpus=4)).workspace(WS_B, Quota(gpus=4))
        .waiting("a1", ws=WS_A).waiting("a2", ws=WS_A).waiting("a3", ws=WS_A)
        .waiting("b1", ws=WS_B).waiting("b2", ws=WS_B)
        .build()
    )
    # a1 (both at 0, a1 submitted first), then b1 (B at 0 < A at 1/4), then a2, then b2: they alternate.
    assert started_names(plan(snap, NOW)) == ["a1", "b1", "a2", "b2"]


# ---------------------------------------------------------------------------------------------- the head


STARTS_BY_CASES = [
    # (when the running work started, the machine's stop grace, the head's reason, its shadow time)
    pytest.param(T0, 30.0, f"starts by {AT_14}", NOW + 2 * HOUR, id="page-example"),
    pytest.param(NOW - HOUR, 30.0, "starts by 2026-10-01 14:01 UTC", NOW + 2 * HOUR + 30,
                 id="counts-the-stop-grace-and-rounds-up"),
    pytest.param(NOW - HOUR, 0.0, f"starts by {AT_14}", NOW + 2 * HOUR, id="no-stop-grace"),
    pytest.param(NOW - HOUR, 600.0, "starts by 2026-10-01 14:10 UTC", NOW + 2 * HOUR + 600, id="long-stop-grace"),
    pytest.param(NOW - HOUR + 1, 0.0, "starts by 2026-10-01 14:01 UTC", NOW + 2 * HOUR + 1,
                 id="a-second-past-the-minute-rounds-up"),
]


@pytest.mark.parametrize("started_at, grace, when, shadow_time", STARTS_BY_CASES)
def test_head_starts_by_shadow_time_as_running_work_ends(started_at, grace, when, shadow_time):
    """"starts by" never promises earlier than the shadow time: work stopped at its time limit is gone once
    its stop grace runs out, and the minute shown is rounded up."""
    snap = (
        cluster(machine("gpu-01", grace=grace))
        .running("other", prio=5, gpus=6, limit=3 * HOUR, started=started_at)
        .running("more", prio=5, gpus=2, limit=2 * HOUR, started=started_at)
        .waiting("big", gpus=8)
        .build()
    )
    p = plan(snap, NOW)
    assert p.head == "big"
    assert p.reasons["big"] == f"Next to run (priority 0): {when} as running work ends"
    assert p.shadow_time == shadow_time


def test_head_waits_for_running_work_to_end_without_time_limits():
    snap = cluster(machine("gpu-01")).running("other", gpus=6).waiting("big", gpus=8).build()
    p = plan(snap, NOW)
    assert p.reasons["big"] == "Next to run (priority 0): waits for running work to end"
    assert p.shadow_time is None


def test_head_reason_shows_its_priority():
    snap = cluster(machine("gpu-01")).running("other", prio=20, gpus=6).waiting("big", gpus=8, prio=10).build()
    assert plan(snap, NOW).reasons["big"] == "Next to run (priority 10): waits for running work to end"


def test_runs_behind_the_head_are_queued_behind_it():
    snap = (
        cluster(machine("gpu-01"))
        .running("other", gpus=6, limit=3 * HOUR, started=T0)
        .waiting("big", gpus=8)
        .waiting("small", gpus=1)
        .build()
    )
    p = plan(snap, NOW)
    assert started_names(p) == []
    assert p.reasons["small"] == f"Queued behind big, which starts by {AT_14}"


def test_queued_behind_a_head_that_waits_for_running_work():
    snap = cluster(machine("gpu-01")).running("other", gpus=6).waiting("big", gpus=8).waiting("small").build()
    assert plan(snap, NOW).reasons["small"] == "Queued behind big, which waits for running work to end"


def test_head_in_another_workspace_is_not_named():
    snap = (
        cluster(machine("gpu-01"))
        .running("other", gpus=6, limit=3 * HOUR, started=T0)
        .waiting("big", gpus=8, ws=WS_B)
        .waiting("small", gpus=1, ws=WS_A)
        .build()
    )
    assert plan(snap, NOW).reasons["small"] == f"Queued behind a job in another namespace, which starts by {AT_14}"


def test_a_run_that_never_fits_says_so_and_is_never_the_head():
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"))
        .running("other", gpus=8, on="gpu-02")
        .waiting("huge", gpus=16)
        .waiting("small", gpus=1)
        .build()
    )
    p = plan(snap, NOW)
    assert p.reasons["huge"] == "Cannot run on this cluster: asks for 16 GPUs on one machine; the largest machine has 8"
    assert p.head is None
    assert started_names(p) == ["small"]


def test_node_selection_that_matches_no_machine_cannot_run():
    snap = cluster(machine("gpu-01")).waiting("r", labels={"gpu": "h100"}).build()
    assert plan(snap, NOW).reasons["r"] == "Cannot run on this cluster: no machine matches its node_selection"


def test_gang_needs_as_many_machines_as_workers():
    snap = cluster(machine("gpu-01"), machine("gpu-02")).waiting("wide", gpus=1, workers=3).build()
    assert plan(snap, NOW).reasons["wide"] == (
        "Cannot run on this cluster: asks for 3 machines (one worker on each); only 2 can hold its workers"
    )


# ------------------------------------------------------------------------------------------------ quota

QUOTA_CASES = [
    pytest.param(Quota(gpus=8), dict(gpus=6), dict(gpus=4), "gpus 6 in use + 4 asked > 8", id="gpus"),
    pytest.param(Quota(cpu_cores=16), dict(cpu=10), dict(cpu=8), "cpu cores 10 in use + 8 asked > 16", id="cpu"),
    pytest.param(Quota(memory_bytes=128 * GIB), dict(mem_gib=96), dict(mem_gib=64),
                 "memory 96 GiB in use + 64 GiB asked > 128 GiB", id="memory"),
    pytest.param(Quota(workers=2), dict(), dict(workers=2), "workers 1 in use + 2 asked > 2", id="workers"),
    pytest.param(Quota(gpus=8, cpu_cores=1), dict(gpus=6, cpu=1), dict(gpus=4, cpu=1),
                 "gpus 6 in use + 4 asked > 8", id="first-exceeded-in-order"),
]


@pytest.mark.parametrize("quota, used, asked, detail", QUOTA_CASES)
def test_quota_waits_and_is_noted(quota, used, asked, detail):
    snap = (
        cluster(machine("gpu-01", gpus=8, cpu=64), machine("gpu-02", gpus=8, cpu=64))
        .workspace(WS_A, quota)
        .running("using", on="gpu-01", **used)
        .waiting("over", **asked)
        .build()
    )
    p = plan(snap, NOW)
    assert p.reasons["over"] == f"Waits for namespace quota: {detail}"
    assert [(q.run, q.message) for q in p.quota_reached] == [("over", f"Quota reached: {detail}")]
    assert p.head is None


def test_quota_noted_once():
    snap = (
        cluster(machine("gpu-01")).workspace(WS_A, Quota(gpus=8))
        .running("using", gpus=6).waiting("over", gpus=4, quota_noted=True).build()
    )
    p = plan(snap, NOW)
    assert p.reasons["over"] == "Waits for namespace quota: gpus 6 in use + 4 asked > 8"
    assert p.quota_reached == ()


def test_a_run_over_quota_blocks_no_one():
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"))
        .workspace(WS_A, Quota(gpus=8))
        .running("using", gpus=6)
        .waiting("over", gpus=4, prio=10)
        .waiting("other-ws", gpus=8, ws=WS_B)
        .build()
    )
    p = plan(snap, NOW)
    assert started_names(p) == ["other-ws"]
    assert p.head is None


def test_a_run_alone_over_quota():
    snap = cluster(machine("gpu-01"), machine("gpu-02")).workspace(WS_A, Quota(gpus=8)).waiting(
        "big", gpus=8, workers=2).build()
    p = plan(snap, NOW)
    assert p.reasons["big"] == (
        "Waits for more than the namespace's quota allows at all (gpus 16 asked > 8): raise the quota or ask for less"
    )
    assert [(q.run, q.message) for q in p.quota_reached] == [("big", "Quota reached: gpus 16 asked > 8")]


# ------------------------------------------------------------------------------------------- preemption


def test_page_example_urgent_eval_preempts_the_fine_tune():
    snap = (
        cluster(machine("gpu-01"))
        .running("finetune-r50", prio=-100, gpus=1, cpu=8, mem_gib=32)
        .waiting("urgent-eval", gpus=8)
        .build()
    )
    p = plan(snap, NOW)
    assert [(s.run, s.workers, s.preempted_by, s.reason) for s in p.stops] == [
        ("finetune-r50", ("finetune-r50-0",), "urgent-eval", "Preempted by higher-priority work (urgent-eval)")
    ]
    assert p.head == "urgent-eval"
    assert p.reasons["urgent-eval"] == "Preempting 1 lower-priority worker(s) of finetune-r50 to start"
    assert started_names(p) == []


def test_victims_in_another_workspace_are_not_named_either_way():
    snap = (
        cluster(machine("gpu-01"))
        .running("ft", prio=-100, gpus=4, ws=WS_B)
        .running("ft2", prio=-100, gpus=4, ws=WS_B, started=NOW - 2 * HOUR)
        .waiting("urgent", gpus=8, ws=WS_A)
        .build()
    )
    p = plan(snap, NOW)
    assert {s.reason for s in p.stops} == {"Preempted by higher-priority work (a job in another namespace)"}
    assert p.reasons["urgent"] == "Preempting 2 lower-priority worker(s) of a job in another namespace to start"


def test_equal_priority_never_preempts():
    snap = cluster(machine("gpu-01")).running("same", gpus=4).waiting("urgent", gpus=8).build()
    p = plan(snap, NOW)
    assert p.stops == ()
    assert p.reasons["urgent"] == "Next to run (priority 0): waits for running work to end"


def test_a_gang_is_stopped_whole():
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"))
        .running("gang", prio=-1, gpus=4, on=["gpu-01", "gpu-02"])
        .running("filler", prio=5, gpus=4, on="gpu-02")
        .waiting("urgent", gpus=8)
        .build()
    )
    p = plan(snap, NOW)
    assert [(s.run, s.workers) for s in p.stops] == [("gang", ("gang-0", "gang-1"))]
    assert p.reasons["urgent"] == "Preempting 2 lower-priority worker(s) of gang to start"


def test_lowest_priority_first_then_most_recently_started():
    snap = (
        cluster(machine("gpu-01", gpus=2), machine("gpu-02", gpus=2), machine("gpu-03", gpus=2))
        .running("low-old", prio=-10, gpus=2, on="gpu-01", started=NOW - 5 * HOUR)
        .running("low-new", prio=-10, gpus=2, on="gpu-02", started=NOW - 1 * HOUR)
        .running("lowest", prio=-20, gpus=2, on="gpu-03", started=NOW - 9 * HOUR)
        .waiting("a", gpus=2)
        .build()
    )
    assert stopped_names(plan(snap, NOW)) == ["lowest"]
    snap2 = (
        cluster(machine("gpu-01", gpus=2), machine("gpu-02", gpus=2))
        .running("low-old", prio=-10, gpus=2, on="gpu-01", started=NOW - 5 * HOUR)
        .running("low-new", prio=-10, gpus=2, on="gpu-02", started=NOW - 1 * HOUR)
        .waiting("a", gpus=2)
        .build()
    )
    assert stopped_names(plan(snap2, NOW)) == ["low-new"]


def test_units_not_needed_are_kept_running():
    # In victim order: b (gpu-02), then c (gpu-01), then a (gpu-01). a and c free gpu-01; b was not needed.
    snap = (
        cluster(machine("gpu-01", gpus=2), machine("gpu-02", gpus=2))
        .running("a", prio=-5, gpus=1, on="gpu-01", started=NOW - 3 * HOUR)
        .running("c", prio=-5, gpus=1, on="gpu-01", started=NOW - 2 * HOUR)
        .running("b", prio=-5, gpus=1, on="gpu-02", started=NOW - 1 * HOUR)
        .running("keep", prio=5, gpus=1, on="gpu-02")
        .waiting("urgent", gpus=2)
        .build()
    )
    assert sorted(stopped_names(plan(snap, NOW))) == ["a", "c"]


def test_victims_only_on_machines_the_head_may_use():
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"))
        .running("far", prio=-100, gpus=8, on="gpu-02")
        .running("near", prio=-1, gpus=8, on="gpu-01")
        .waiting("urgent", gpus=8, names=("gpu-01",))
        .build()
    )
    assert stopped_names(plan(snap, NOW)) == ["near"]


def test_while_victims_stop_the_head_waits_and_holds_the_room():
    snap = (
        cluster(machine("gpu-01"))
        .running("ft", prio=-100, gpus=4, on="gpu-01", stopping=True, preempted_for="urgent")
        .running("ft2", prio=-100, gpus=2, on="gpu-01", stopping=True, preempted_for="urgent")
        .running("other", prio=-100, gpus=1, on="gpu-01")
        .waiting("urgent", gpus=7)
        .waiting("small", gpus=1, prio=-200)
        .build()
    )
    p = plan(snap, NOW)
    assert p.stops == ()
    assert p.reasons["urgent"] == "Starting: waiting for 2 preempted worker(s) to stop"
    assert started_names(p) == []  # the one free GPU is the head's
    assert p.reasons["small"].startswith("Queued behind urgent, which starts by ")


def test_more_victims_when_the_room_being_freed_is_not_enough():
    snap = (
        cluster(machine("gpu-01"))
        .running("ft", prio=-100, gpus=4, stopping=True, preempted_for="urgent")
        .running("ft2", prio=-100, gpus=4)
        .waiting("urgent", gpus=8)
        .build()
    )
    p = plan(snap, NOW)
    assert stopped_names(p) == ["ft2"]
    assert p.reasons["urgent"] == "Preempting 1 lower-priority worker(s) of ft2 to start"


def test_stopping_work_is_never_chosen_again():
    snap = (
        cluster(machine("gpu-01"))
        .running("going", prio=-100, gpus=8, stopping=True, preempted_for="someone-else")
        .waiting("urgent", gpus=8)
        .build()
    )
    p = plan(snap, NOW)
    assert p.stops == ()
    # It is gone within its machine's 30 s stop grace: by 12:00:30, shown as the next minute.
    assert p.reasons["urgent"] == "Next to run (priority 0): starts by 2026-10-01 12:01 UTC as running work ends"


@pytest.mark.parametrize(
    "builder",
    [
        pytest.param(
            cluster(machine("gpu-01")).running("ft", prio=-100, gpus=4).waiting("urgent", gpus=8)
            .set(preemption=False), id="preemption-off",
        ),
        pytest.param(
            cluster(machine("gpu-01")).running("ft", prio=-100, gpus=4).running("hi", prio=10, gpus=4)
            .waiting("urgent", gpus=8), id="cannot-help",
        ),
    ],
)
def test_no_preemption_leaves_the_head_next_to_run(builder):
    p = plan(builder.build(), NOW)
    assert p.stops == ()
    assert p.reasons["urgent"] == "Next to run (priority 0): waits for running work to end"


# --------------------------------------------------------------------------------------------- backfill


def _busy(**switches):
    # gpu-01: 6 GPUs busy until 14:00; the head needs all 8. gpu-02 is full for good.
    return (
        cluster(machine("gpu-01", cpu=64), machine("gpu-02", cpu=8))
        .running("other", prio=5, gpus=6, on="gpu-01", limit=3 * HOUR, started=T0, cpu=8)
        .running("full", prio=5, gpus=8, on="gpu-02", cpu=8)
        .waiting("big", gpus=8, cpu=32)
        .set(**switches)
    )


BACKFILL_CASES = [
    pytest.param(dict(limit=HOUR), True, None, id="ends-before-shadow-starts"),
    # A run stopped at its time limit keeps its room for the stop grace (30 s) too.
    pytest.param(dict(limit=2 * HOUR - 30), True, None, id="ends-exactly-at-shadow-starts"),
    pytest.param(dict(limit=2 * HOUR), False, f"Queued behind big, which starts by {AT_14}",
                 id="its-stop-grace-would-delay-the-head"),
    pytest.param(dict(limit=3 * HOUR), False, f"Queued behind big, which starts by {AT_14}", id="ends-after"),
    pytest.param(dict(), False, f"Queued behind big, which starts by {AT_14}", id="no-time-limit"),
    # gpu-01 has 56 cores free; the head needs 32 at 14:00, when "other" gives back 8: 24 stay held now.
    pytest.param(dict(gpus=0, cpu=32), True, None, id="cpu-only-uses-a-machine-whose-gpus-are-promised"),
    pytest.param(dict(gpus=0, cpu=40), False, f"Queued behind big, which starts by {AT_14}",
                 id="cpu-only-may-not-take-the-heads-cpu"),
]


@pytest.mark.parametrize("small, starts, reason", BACKFILL_CASES)
def test_backfill(small, starts, reason):
    snap = _busy().waiting("small", **{"gpus": 1, **small}).build()
    p = plan(snap, NOW)
    assert p.head == "big"
    if starts:
        assert started(p, "small") is not None and started(p, "small").backfilled
    else:
        assert started(p, "small") is None
        assert p.reasons["small"] == reason


def test_backfill_off_starts_nothing_behind_the_head():
    snap = _busy(backfill=False).waiting("small", gpus=1, limit=60).build()
    p = plan(snap, NOW)
    assert started_names(p) == []
    assert p.reasons["small"] == f"Queued behind big, which starts by {AT_14}"


def test_backfill_in_room_the_head_does_not_need():
    snap = _busy().waiting("elsewhere", gpus=2).build()
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02", gpus=4))
        .running("other", prio=5, gpus=6, on="gpu-01", limit=3 * HOUR)
        .waiting("big", gpus=8)
        .waiting("elsewhere", gpus=4)
        .build()
    )
    p = plan(snap, NOW)
    assert started(p, "elsewhere").backfilled
    assert started(p, "elsewhere").placements[0].machine == "gpu-02"


def test_runs_before_the_head_are_not_backfilled():
    snap = cluster(machine("gpu-01")).waiting("a", gpus=2).build()
    assert started(plan(snap, NOW), "a").backfilled is False


# -------------------------------------------------------------------------------------------- placement


def test_best_fit_fewest_free_gpus_then_name_lowest_indices():
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"), machine("gpu-03"))
        .running("x", gpus=5, on="gpu-02")
        .running("y", gpus=5, on="gpu-03")
        .waiting("r", gpus=2)
        .build()
    )
    s = started(plan(snap, NOW), "r")
    assert [(pl.machine, pl.gpu_indices) for pl in s.placements] == [("gpu-02", (5, 6))]


def test_gang_on_distinct_machines_all_or_nothing():
    snap = cluster(machine("gpu-01"), machine("gpu-02")).waiting("g", gpus=8, workers=2).build()
    s = started(plan(snap, NOW), "g")
    assert sorted(pl.machine for pl in s.placements) == ["gpu-01", "gpu-02"]
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"))
        .running("x", prio=5, gpus=1, on="gpu-02")
        .waiting("g", gpus=8, workers=2)
        .build()
    )
    assert started_names(plan(snap, NOW)) == []


def test_independent_workers_start_as_room_allows():
    snap = (
        cluster(machine("gpu-01"), machine("gpu-02"), machine("gpu-03"))
        .running("x", prio=5, gpus=8, on="gpu-03")
        .waiting("ind", gpus=8, workers=3, start="Independent")
        .build()
    )
    p = plan(snap, NOW)
    assert sorted(pl.worker_index for pl in started(p, "ind").placements) == [0, 1]
    assert p.reasons["ind"] == "Next to run (priority 0): waits for running work to end"
    assert list(p.why_not) == ["ind-2"]


@pytest.mark.parametrize(
    "kw, machine_name",
    [
        pytest.param(dict(names=("gpu-02",)), "gpu-02", id="names"),
        pytest.param(dict(labels={"zone": "b"}), "gpu-02", id="labels"),
        pytest.param(dict(excluded=(("gpu-01", "drive ft-ckpt lives on gpu-02"),)), "gpu-02", id="excluded"),
        pytest.param(dict(cpu=100), "gpu-02", id="cpu"),
        pytest.param(dict(mem_gib=600), "gpu-02", id="memory"),
    ],
)
def test_placement_honours_constraints(kw, machine_name):
    snap = (
        cluster(machine("gpu-01", labels={"zone": "a"}), machine("gpu-02", cpu=128, mem_gib=1024, labels={"zone": "b"}))
        .waiting("r", gpus=1, **kw)
        .build()
    )
    assert started(plan(snap, NOW), "r").placements[0].machine == machine_name


def test_unschedulable_machines_get_nothing():
    snap = cluster(machine("gpu-01", schedulable=False), machine("gpu-02")).waiting("r").build()
    assert started(plan(snap, NOW), "r").placements[0].machine == "gpu-02"


# --------------------------------------------------------------------------------------------- why not


def test_why_not_lines_per_machine():
    snap = (
        cluster(
            machine("gpu-01"), machine("gpu-02"), machine("gpu-03"), machine("gpu-04", schedulable=False),
            machine("gpu-05", cpu=16), machine("gpu-06", labels={"zone": "b"}),
        )
        .running("finetune-r50", prio=-100, gpus=7, on="gpu-01")
        .running("theirs", prio=3, gpus=8, on="gpu-02", ws=WS_B)
        .running("cpu-hog", prio=3, gpus=0, cpu=60, on="gpu-03")
        .waiting("urgent-eval", gpus=8, cpu=32, labels={"zone": "a"},
                 excluded=(("gpu-03", "drive ft-ckpt is on gpu-01"),))
        .set(preemption=False)
        .build()
    )
    snap = type(snap)(**{**{f: getattr(snap, f) for f in snap.__dataclass_fields__},
                         "machines": tuple(
                             m if m.name == "gpu-06" else type(m)(**{**{f: getattr(m, f) for f in m.__dataclass_fields__},
                                                                     "labels": (("zone", "a"),)})
                             for m in snap.machines)})
    p = plan(snap, NOW)
    assert dict(p.why_not["urgent-eval-0"]) == {
        "gpu-01": "not enough free GPUs: 1 free, 8 asked (7 held by finetune-r50 at priority -100)",
        "gpu-02": "not enough free GPUs: 0 free, 8 asked (8 held by a job in another namespace at priority 3)",
        "gpu-03": "drive ft-ckpt is on gpu-01",
        "gpu-04": "machine is not schedulable (lost)",
        "gpu-05": "machine has 16 CPU cores, 32 asked",
        "gpu-06": "not selected by node_selection",
    }


def test_why_not_held_for_the_head_and_quota():
    snap = (
        cluster(machine("gpu-01"))
        .workspace(WS_B, Quota(gpus=1))
        .running("other", prio=5, gpus=6, limit=3 * HOUR)
        .running("b-use", prio=5, gpus=1, ws=WS_B)
        .waiting("urgent-eval", gpus=7)
        .waiting("small", gpus=1)
        .waiting("b-run", gpus=1, ws=WS_B)
        .build()
    )
    p = plan(snap, NOW)
    assert p.why_not["small-0"] == (("gpu-01", "held for the head (urgent-eval)"),)
    assert p.why_not["b-run-0"] == (("gpu-01", "namespace quota: gpus 1 in use + 1 asked > 1"),)


def test_why_not_limit_caps_the_runs_explained():
    b = cluster(machine("gpu-01")).running("x", prio=5, gpus=8)
    for k in range(5):
        b.waiting(f"r{k}")
    p = plan(b.set(why_not_limit=2).build(), NOW)
    assert list(p.why_not) == ["r0-0", "r1-0"]
    assert len(p.reasons) == 5


def test_every_waiting_run_gets_a_reason():
    b = cluster(machine("gpu-01"), machine("gpu-02")).running("x", prio=5, gpus=8, limit=HOUR)
    for k in range(10):
        b.waiting(f"r{k}", gpus=1 + k % 8, prio=k % 3)
    p = plan(b.build(), NOW)
    assert set(p.reasons) | set(started_names(p)) == {f"r{k}" for k in range(10)}


def test_nothing_else_takes_the_room_while_preempting():
    snap = (
        cluster(machine("gpu-01"))
        .running("ft", prio=-100, gpus=6)
        .waiting("urgent", gpus=8)
        .waiting("small", gpus=1, prio=-200)
        .build()
    )
    p = plan(snap, NOW)
    assert stopped_names(p) == ["ft"]
    assert p.reasons["urgent"] == "Preempting 1 lower-priority worker(s) of ft to start"
    assert started_names(p) == []  # the 2 free GPUs are held for urgent
    assert p.reasons["small"] == "Queued behind urgent, which starts by 2026-10-01 12:01 UTC"  # 12:00 + 30 s grace



@pytest.mark.parametrize("quota", [Quota(gpus=8), None], ids=["workspaces-with-quota", "workspaces-without-quota"])
def test_runs_submitted_at_the_same_time_go_by_name(quota):
    # Runs submitted at one moment (and one earlier), room for all of them: the earlier run first, then by name
    # (with quotas, fair share alternates the workspaces, ties between them by submission and name too).
    b = cluster(machine("gpu-01", gpus=6)).workspace(WS_A, quota).workspace(WS_B, quota)
    for run, ws in (("run-d", WS_B), ("run-c", WS_A), ("run-a", WS_B), ("run-b", WS_A), ("run-e", WS_A)):
        b.waiting(run, ws=ws, submitted=NOW - 60)
    b.waiting("run-z", ws=WS_B, submitted=NOW - 120)
    starts = plan(b.build(), NOW).starts
    order = [(s.run, s.placements[0].gpu_indices) for s in starts]
    if quota is None:
        assert order == [("run-z", (0,)), ("run-a", (1,)), ("run-b", (2,)), ("run-c", (3,)), ("run-d", (4,)),
                         ("run-e", (5,))]
    else:  # B ran run-z: A's run-b, then B's run-a (both at 1/8; run-a first by name), A's run-c, B's run-d ...
        assert [r for r, _ in order] == ["run-z", "run-b", "run-a", "run-c", "run-d", "run-e"]


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "gang"])
def test_a_run_that_ends_by_the_shadow_time_backfills_after_one_of_its_shape_that_does_not(workers):
    # Behind the head, one workspace's runs of one shape on the same machines: the first, with no time limit,
    # waits; the next, which ends before the head's shadow time, backfills. What the first met is not the
    # second's (the view a run may use depends on its time limit): settling runs in bulk must not lend it.
    # A gang has one worker on each machine: gpu-03 (4 GPUs, too small for the head) holds its other worker.
    gang = [machine("gpu-03", gpus=4)] if workers > 1 else []
    b = (cluster(machine("gpu-01", cpu=64), machine("gpu-02", cpu=8), *gang)
         .running("other", prio=5, gpus=6, on="gpu-01", limit=3 * HOUR, started=T0, cpu=8)
         .running("full", prio=5, gpus=8, on="gpu-02", cpu=8)
         .waiting("big", gpus=8, cpu=32))
    snap = (b.waiting("long", gpus=1, workers=workers).waiting("short", gpus=1, workers=workers, limit=HOUR)
            .waiting("long-2", gpus=1, workers=workers).waiting("short-2", gpus=1, workers=workers, limit=HOUR)
            .build())
    p = plan(snap, NOW)
    assert p.head == "big"
    assert started(p, "long") is None and started(p, "long-2") is None
    assert p.reasons["long"] == p.reasons["long-2"] == f"Queued behind big, which starts by {AT_14}"
    assert started(p, "short").backfilled and started(p, "short-2").backfilled
