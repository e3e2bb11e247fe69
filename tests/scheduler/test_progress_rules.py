"""Hung runs and the least work lost, decided purely (astraeus.scheduler.progress, choose_victims' order)."""

import calendar

import pytest

from astraeus import scheduler as sched
from astraeus.scheduler.head import _victim_order, least_work_lost_order
from astraeus.scheduler.progress import gang_reason, loss_words, matched, stall, work_lost

T0 = calendar.timegm((2026, 10, 1, 14, 2, 0))  # 14:02 UTC


@pytest.mark.parametrize("now, started, last, text, stall_s, expect", [
    (T0 + 100, T0 - 100, T0, "step 1234", 1200, None),  # quiet for 100 s of 1200
    (T0 + 1200, T0 - 100, T0, "step 1234", 1200, "No progress for 20 min (last: step 1234 at 14:02 UTC)"),
    (T0 + 1500, T0 - 100, T0, None, 1200, "No progress for 25 min (last: at 14:02 UTC)"),
    (T0 + 30, T0, None, None, 30, "No progress for 30 s (none reported since its start at 14:02 UTC)"),
    (T0 + 29, T0, None, None, 30, None),
    (T0 + 10_000, T0, None, None, None, None),  # no watch asked
    (T0 + 10_000, None, None, None, 30, None),  # not started
    # progress from an earlier attempt counts from this attempt's start
    (T0 + 40, T0 + 20, T0, "step 9", 30, None),
    (T0 + 50, T0 + 20, T0, "step 9", 30, "No progress for 30 s (none reported since its start at 14:02 UTC)"),
])
def test_stall_table(now, started, last, text, stall_s, expect):
    found = stall(now, started, last, text, stall_s)
    assert (found.reason if found else None) == expect


def test_a_gang_names_the_stalled_rank_and_its_machine():
    found = stall(T0 + 60, T0 - 10, T0, "step 7", 60)
    assert gang_reason(found, "ft-1", 1, "gpu-02") == (
        "No progress for 1 min (last: step 7 at 14:02 UTC): rank 1 (ft-1) on gpu-02")


@pytest.mark.parametrize("pattern, line, expect", [
    (r"step (\d+)", "epoch 1 step 1234 loss 0.3", "step 1234"),
    (r"step (\d+)", "loading data", None),
    (None, "step 1", None),
])
def test_progress_from_a_log_line(pattern, line, expect):
    assert matched(pattern, line) == expect


@pytest.mark.parametrize("now, started, ckpt, gpus, lost, words", [
    (T0 + 180, T0 - 600, T0, 4, 720.0, "loses 3 min of work since its checkpoint at 14:02 UTC"),
    (T0 + 180, T0, None, 2, 360.0, "loses 3 min of work since its start at 14:02 UTC (no checkpoint)"),
    (T0 + 180, T0, T0 - 50, 1, 180.0, "loses 3 min of work since its start at 14:02 UTC (no checkpoint)"),
])
def test_work_lost_table(now, started, ckpt, gpus, lost, words):
    assert work_lost(now, started, ckpt, gpus) == lost
    assert loss_words(now, started, ckpt) == words


def _unit(run: str, started: float, ckpt: float | None, gpus: int = 4, priority: int = -100,
          first_gpu: int = 0) -> sched.RunningUnit:
    w = sched.PlacedWorker(name=f"{run}-0", index=0, machine="gpu-01",
                           gpu_indices=tuple(range(first_gpu, first_gpu + gpus)),
                           cpu_cores=1, memory_bytes=0)
    return sched.RunningUnit(run=run, workspace="ws", priority=priority, started_at=started,
                             time_limit_seconds=None, workers=(w,), last_checkpoint=ckpt)


def test_least_work_lost_picks_the_most_recent_checkpoint_over_the_most_recent_start():
    now = T0 + 1000
    old_fresh_ckpt = _unit("old-fresh-ckpt", started=T0 - 5000, ckpt=now - 10)   # loses 10 s × 4 GPUs
    new_no_ckpt = _unit("new-no-ckpt", started=T0, ckpt=None)                     # loses 1000 s × 4 GPUs
    mid_old_ckpt = _unit("mid-old-ckpt", started=T0 - 2000, ckpt=T0 - 1000)       # loses 2000 s × 4 GPUs
    higher = _unit("higher", started=T0 - 9000, ckpt=None, priority=-10)
    units = [new_no_ckpt, mid_old_ckpt, higher, old_fresh_ckpt]
    assert [u.run for u in sorted(units, key=least_work_lost_order(now))] == [
        "old-fresh-ckpt", "new-no-ckpt", "mid-old-ckpt", "higher"]
    # the pages' rule: lowest priority, then the most recently started
    assert [u.run for u in sorted(units, key=_victim_order)] == [
        "new-no-ckpt", "mid-old-ckpt", "old-fresh-ckpt", "higher"]


def _snapshot(victims: str, now: float) -> sched.Snapshot:
    machine = sched.Machine(name="gpu-01", gpus=8, cpu_cores=64, memory_bytes=1 << 40, stop_grace_seconds=2)
    running = (_unit("a-new-start", started=now - 60, ckpt=None),
               _unit("b-fresh-ckpt", started=now - 7200, ckpt=now - 5, first_gpu=4))
    head = sched.WaitingRun(name="urgent", workspace="ws", priority=0, submitted_at=now, time_limit_seconds=None,
                            workers=(sched.WorkerRequest(index=0, gpus=4, cpu_cores=1, memory_bytes=0),))
    return sched.Snapshot(cluster="main", machines=(machine,), running=running, waiting=(head,),
                          workspaces=(sched.Workspace(id="ws", name="ws"),), victims=victims)


@pytest.mark.parametrize("victims, stopped", [("recent", "a-new-start"), ("least-work-lost", "b-fresh-ckpt")])
def test_plan_stops_the_victim_the_cluster_rule_picks(victims, stopped):
    now = T0
    plan = sched.plan(_snapshot(victims, now), now)
    assert [s.run for s in plan.stops] == [stopped]
    if victims == "least-work-lost":
        assert plan.stops[0].reason.endswith("loses 5 s of work since its checkpoint at 14:01 UTC")
    else:
        assert "loses" not in plan.stops[0].reason


def test_what_if_says_what_each_victim_loses_under_least_work_lost():
    from dataclasses import replace

    from astraeus.server.whatif import view

    now = T0
    snap = _snapshot("least-work-lost", now)
    head = snap.waiting[0]
    answer = sched.what_if(replace(snap, waiting=()), head, now)
    assert answer.outcome == "Preempts"
    assert answer.losses == (("b-fresh-ckpt", "loses 5 s of work since its checkpoint at 14:01 UTC"),)
    message = view(answer, "urgent", "main")["message"]
    assert message.endswith("; b-fresh-ckpt loses 5 s of work since its checkpoint at 14:01 UTC"), message
    assert sched.what_if(replace(_snapshot("recent", now), waiting=()), head, now).losses == ()
