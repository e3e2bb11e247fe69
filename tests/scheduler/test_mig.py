"""MIG devices (issue 46): a run asking `mig` devices of a profile is placed where a GPU has free devices of it,
each device one worker's whole (never two workers on one device); a GPU with MIG on takes no whole-GPU or
fractional worker; a run whose profile no machine has, or whose devices are all held, waits with its reason; quotas
count a device as its slices of a GPU (N/7 for a profile "Ng.*"); an urgent MIG run preempts lower-priority holders
of its profile's devices, as the GPU head's victims are chosen (`choose_victims`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from astraeus.scheduler import NodeSelection, PlacedWorker, Quota, RunningUnit, WaitingRun, WorkerRequest, plan
from astraeus.scheduler.gpushare import check_mig_profile, mig_milli

from .builders import GIB, HOUR, NOW, WS_A, cluster, machine, started

A100_7 = (("1g.10gb", 7),)


def mig_machine(name: str, gpus: int = 2, mig: tuple = (A100_7,)):
    """A machine whose first GPUs are partitioned as `mig` says (one entry per GPU), the others whole."""
    return replace(machine(name, gpus=gpus), gpu_mig=tuple(mig) + ((),) * (gpus - len(mig)))


def mig_run(name: str, profile: str = "1g.10gb", count: int = 1, at: float = 0.0, ws: str = WS_A,
            prio: int = 0) -> WaitingRun:
    w = WorkerRequest(0, mig_milli(profile, count) / 1000, 1.0, GIB, mig=profile, mig_count=count)
    return WaitingRun(name, ws, prio, NOW - 1000 + at, (w,), node_selection=NodeSelection(mig=profile))


def with_runs(snap, *runs):
    return replace(snap, waiting=snap.waiting + tuple(runs))


def holding(snap, run: str, machine_name: str, devices: tuple, profile: str = "1g.10gb", prio: int = 0,
            stopping_for: str | None = None):
    gpus = tuple(sorted({d[0] for d in devices}))
    w = PlacedWorker(f"{run}-0", 0, machine_name, gpus, 1.0, GIB, mig_milli(profile, len(devices)), devices)
    unit = RunningUnit(run, WS_A, prio, NOW - HOUR, None, (w,), stopping_for is not None, stopping_for)
    return replace(snap, running=snap.running + (unit,))


def test_two_mig_runs_get_distinct_devices_of_the_profile():
    snap = with_runs(cluster(mig_machine("gpu-01")).build(), mig_run("a"), mig_run("b", at=1))
    p = plan(snap, NOW)
    devs = [started(p, r).placements[0].mig_devices for r in ("a", "b")]
    assert devs == [((0, "1g.10gb", 0),), ((0, "1g.10gb", 1),)]
    assert [started(p, r).placements[0].gpu_indices for r in ("a", "b")] == [(0,), (0,)]
    assert started(p, "a").placements[0].gpu_milli == 143  # 1/7 of a GPU, as quotas count it


def test_a_device_held_is_never_given_again():
    snap = holding(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 2),),))).build(), "held", "gpu-01",
                   ((0, "1g.10gb", 0),))
    p = plan(with_runs(snap, mig_run("a"), mig_run("b", at=1)), NOW)
    assert started(p, "a").placements[0].mig_devices == ((0, "1g.10gb", 1),)
    assert started(p, "b") is None
    # the head, as a GPU run would be: the holder has no time limit, so when its device frees is not known
    assert p.head == "b" and p.shadow_time is None
    assert p.reasons["b"] == "Next to run (priority 0): waits for running work to end"
    assert dict(p.why_not["b-0"])["gpu-01"] == "not enough free MIG 1g.10gb devices: 0 free, 1 asked"


def test_a_mig_head_starts_by_its_holders_time_limit_and_holds_the_device_it_counts_on():
    # Two devices: D0 held by a run of equal priority (no victim) whose time limit ends in an hour, D1 free. "pair"
    # asks both: it is the head, its shadow time the holder's end and the machine's stop grace; D1 is held for it.
    # A run behind it without a time limit does not take D1; one that ends by the shadow time does (backfill).
    snap = cluster(mig_machine("gpu-01", mig=((("1g.10gb", 2),),))).build()
    w = PlacedWorker("held-0", 0, "gpu-01", (0,), 1.0, GIB, mig_milli("1g.10gb", 1), ((0, "1g.10gb", 0),))
    snap = replace(snap, running=(RunningUnit("held", WS_A, 0, NOW - HOUR, 2 * HOUR, (w,)),))
    late = mig_run("late", at=2)
    short = replace(mig_run("short", at=3), time_limit_seconds=600.0)
    p = plan(with_runs(snap, mig_run("pair", count=2), late, short), NOW)
    assert not p.stops and p.head == "pair" and p.shadow_time == NOW + HOUR + 30.0
    assert p.reasons["pair"].startswith("Next to run (priority 0): starts by ")
    assert started(p, "late") is None and p.reasons["late"].startswith("Queued behind pair")
    assert started(p, "short").placements[0].mig_devices == ((0, "1g.10gb", 1),)
    assert started(p, "short").backfilled


def test_several_devices_on_one_machine():
    snap = with_runs(cluster(mig_machine("gpu-01", mig=(A100_7, A100_7))).build(), mig_run("r", count=9))
    (pl,) = started(plan(snap, NOW), "r").placements
    assert len(pl.mig_devices) == 9 and len(set(pl.mig_devices)) == 9
    assert pl.gpu_indices == (0, 1) and pl.gpu_milli == 1286  # 9/7 of a GPU


def test_a_mig_gpu_is_never_given_whole_nor_shared():
    # GPU 0 is partitioned: whole-GPU and fractional workers take GPU 1 only.
    snap = (cluster(mig_machine("gpu-01")).waiting("whole", gpus=1).waiting("two", gpus=2)
            .waiting("frac", gpus=0.5).build())
    p = plan(snap, NOW)
    assert started(p, "whole").placements[0].gpu_indices == (1,)
    assert started(p, "two") is None
    assert p.reasons["two"].startswith("Cannot run on this cluster: asks for 2 GPUs on one machine")
    assert dict(p.why_not["two-0"]) == {"gpu-01": "machine has 1 GPUs (GPU 0 MIG), 2 asked"}
    assert started(p, "frac") is None  # GPU 1 is held whole; GPU 0 is MIG


def test_best_fit_takes_the_machine_with_the_fewest_free_devices():
    snap = holding(cluster(mig_machine("gpu-01"), mig_machine("gpu-02")).build(), "held", "gpu-02",
                   ((0, "1g.10gb", 0),))
    (pl,) = started(plan(with_runs(snap, mig_run("r")), NOW), "r").placements
    assert (pl.machine, pl.mig_devices) == ("gpu-02", ((0, "1g.10gb", 1),))


def test_a_profile_no_machine_has_names_the_clusters_profiles():
    snap = with_runs(cluster(mig_machine("gpu-01", mig=((("3g.40gb", 2),), A100_7)), machine("gpu-02")).build(),
                     mig_run("r", "2g.20gb"))
    p = plan(snap, NOW)
    assert p.reasons["r"] == ("Cannot run on this cluster: asks for MIG 2g.20gb devices; the cluster's machines have "
                              "1g.10gb, 3g.40gb")
    assert dict(p.why_not["r-0"]) == {"gpu-01": "machine has no MIG 2g.20gb devices",
                                      "gpu-02": "machine has no MIG 2g.20gb devices"}


def test_more_devices_than_a_machine_has_cannot_run():
    snap = with_runs(cluster(mig_machine("gpu-01")).build(), mig_run("r", count=8))
    assert plan(snap, NOW).reasons["r"] == ("Cannot run on this cluster: asks for 8 MIG 1g.10gb devices on one "
                                            "machine; a machine it may use has 7")


def test_quota_counts_a_device_as_its_slices():
    snap = cluster(mig_machine("gpu-01")).workspace(WS_A, quota=Quota(gpus=1)).build()
    snap = with_runs(snap, mig_run("big", "1g.10gb", count=7), mig_run("one", at=1))
    p = plan(snap, NOW)
    assert started(p, "big") is not None  # 7/7 = 1 GPU
    assert started(p, "one") is None
    assert p.reasons["one"] == "Waits for namespace quota: gpus 1 in use + 0.14 asked > 1"


def test_a_whole_gpu_head_does_not_count_mig_workers_as_freeing_gpus():
    # gpu-01: GPU 0 MIG (a low-priority MIG worker on it), GPU 1 held by a low-priority whole worker. A 2-GPU head
    # can never have 2 GPUs here (one is MIG): it cannot run, and nothing is preempted for it.
    snap = holding(cluster(mig_machine("gpu-01")).running("low", prio=-5, gpus=1, on="gpu-01")
                   .waiting("head", gpus=2, prio=10).build(), "mig-low", "gpu-01", ((0, "1g.10gb", 0),))
    p = plan(snap, NOW)
    assert not p.stops and p.reasons["head"].startswith("Cannot run on this cluster")


@pytest.mark.parametrize("profile", ["1g.10gb", "3g.40gb", "7g.80gb", "1g.20gb+me", "1g.5gb"])
def test_profiles_as_nvml_names_them(profile):
    assert check_mig_profile(profile) == profile


@pytest.mark.parametrize("profile", ["1g", "10gb", "8g.80gb", "1g.10GB", "MIG 1g.10gb", ""])
def test_other_profiles_say_what_one_looks_like(profile):
    with pytest.raises(ValueError) as e:
        check_mig_profile(profile)
    assert 'is not a MIG profile: give it as NVML names it, <slices>g.<memory>gb such as "1g.10gb"' in str(e.value)


def test_on_a_big_cluster_a_mig_workers_lines_are_grouped_by_reason():
    snap = with_runs(cluster(mig_machine("gpu-01"), mig_machine("gpu-02"), machine("gpu-03"), machine("gpu-04"))
                     .set(why_not_machines=2).build(), mig_run("r", count=8))
    lines = plan(snap, NOW).why_not["r-0"]
    assert lines == (("gpu-01, gpu-02", "machine has 7 MIG 1g.10gb devices, 8 asked"),
                     ("gpu-03, gpu-04", "machine has no MIG 1g.10gb devices"))


# ------------------------------------------------------------------------------------------------ preemption

D0, D1, D2 = ((0, "1g.10gb", k) for k in range(3))


def whole(snap, run: str, gpu: int, prio: int):
    """A worker holding GPU `gpu` of gpu-01 whole."""
    unit = RunningUnit(run, WS_A, prio, NOW - HOUR, None, (PlacedWorker(f"{run}-0", 0, "gpu-01", (gpu,), 1.0, GIB),))
    return replace(snap, running=snap.running + (unit,))


def test_an_urgent_mig_run_preempts_the_lowest_priority_holder_and_starts_on_its_device():
    # gpu-01: GPU 0 has two 1g.10gb devices, held at priorities -5 and -10; GPU 1 is held whole at -20 (it frees no
    # device: never a victim for a MIG run).
    snap = whole(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 2),),))).build(), "whole-low", 1, -20)
    snap = holding(holding(snap, "low-a", "gpu-01", (D0,), prio=-5), "low-b", "gpu-01", (D1,), prio=-10)
    p = plan(with_runs(snap, mig_run("urgent", prio=10)), NOW)
    assert [(s.run, s.preempted_by, s.reason) for s in p.stops] == [
        ("low-b", "urgent", "Preempted by higher-priority work (urgent)")]
    assert p.head == "urgent" and started(p, "urgent") is None
    assert p.reasons["urgent"] == "Preempting 1 lower-priority worker(s) of low-b to start"
    assert p.shadow_time == NOW + 30.0  # the machine's stop grace: SIGTERM, then SIGKILL after it

    # Next cycle: the victim is stopping for it, nothing more is preempted.
    stopping = holding(holding(whole(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 2),),))).build(), "whole-low",
                                     1, -20), "low-a", "gpu-01", (D0,), prio=-5),
                       "low-b", "gpu-01", (D1,), prio=-10, stopping_for="urgent")
    p = plan(with_runs(stopping, mig_run("urgent", prio=10)), NOW)
    assert not p.stops and p.reasons["urgent"] == "Starting: waiting for 1 preempted worker(s) to stop"

    # Once it is gone the urgent run takes its device.
    gone = holding(whole(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 2),),))).build(), "whole-low", 1, -20),
                   "low-a", "gpu-01", (D0,), prio=-5)
    (pl,) = started(plan(with_runs(gone, mig_run("urgent", prio=10)), NOW), "urgent").placements
    assert (pl.machine, pl.mig_devices) == ("gpu-01", (D1,))


def test_an_equal_priority_holder_is_never_a_victim():
    snap = holding(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 1),),))).build(), "peer", "gpu-01", (D0,), prio=10)
    p = plan(with_runs(snap, mig_run("urgent", prio=10)), NOW)
    assert not p.stops and started(p, "urgent") is None and p.head == "urgent"
    assert p.reasons["urgent"] == "Next to run (priority 10): waits for running work to end"


def test_only_holders_of_the_profile_asked_are_victims():
    # A 3g.40gb holder at the lowest priority frees no 1g.10gb device: the 1g.10gb holder is the victim.
    mig = ((("1g.10gb", 1), ("3g.40gb", 1)),)
    snap = holding(cluster(mig_machine("gpu-01", mig=mig)).build(), "big-low", "gpu-01", ((0, "3g.40gb", 0),),
                   "3g.40gb", prio=-50)
    snap = holding(snap, "small-low", "gpu-01", (D0,), prio=-1)
    p = plan(with_runs(snap, mig_run("urgent", prio=10)), NOW)
    assert [s.run for s in p.stops] == ["small-low"]


def test_a_mig_head_holds_the_free_devices_it_counts_on():
    # Three devices: two held at low priority, one free. The urgent run asks two: it preempts one holder (the
    # lowest) and keeps the free device; a run behind it does not take that device.
    snap = holding(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 3),),))).build(), "low-a", "gpu-01", (D0,),
                   prio=-5)
    snap = holding(snap, "low-b", "gpu-01", (D1,), prio=-10)
    p = plan(with_runs(snap, mig_run("urgent", count=2, prio=10), mig_run("late", at=1)), NOW)
    assert [s.run for s in p.stops] == ["low-b"]
    assert started(p, "late") is None and p.reasons["late"].startswith("Queued behind")


def test_no_preemption_on_a_cluster_without_it():
    snap = holding(cluster(mig_machine("gpu-01", mig=((("1g.10gb", 1),),))).set(preemption=False).build(), "low",
                   "gpu-01", (D0,), prio=-5)
    p = plan(with_runs(snap, mig_run("urgent", prio=10)), NOW)
    assert not p.stops and p.reasons["urgent"] == "Next to run (priority 10): waits for running work to end"


def test_a_whole_gpu_urgent_run_never_preempts_mig_holders_to_get_a_mig_gpu_whole():
    # GPU 0 is MIG, its device held at low priority; GPU 1 is held whole at a higher priority than the urgent run.
    # The urgent run cannot have GPU 0 whole: the MIG holder is no victim, and nothing is stopped.
    snap = holding(whole(cluster(mig_machine("gpu-01")).waiting("urgent", gpus=1, prio=10).build(), "high", 1, 50),
                   "mig-low", "gpu-01", (D0,), prio=-5)
    p = plan(snap, NOW)
    assert not p.stops and started(p, "urgent") is None
    assert p.head == "urgent" and p.reasons["urgent"].startswith("Next to run")
