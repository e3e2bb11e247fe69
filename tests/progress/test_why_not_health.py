"""A waiting run's why-not lines name the failed GPU or the cordon that keeps it off a machine (issue 47): a table
over the pure plan, with the per-machine lines and with the lines of a cluster past `why_not_machines`."""

import pytest

from astraeus import scheduler as sched

T0 = 1_790_000_000.0


def _machine(name: str, **kw) -> sched.Machine:
    return sched.Machine(name=name, gpus=8, cpu_cores=64, memory_bytes=1 << 40, stop_grace_seconds=2, **kw)


def _busy(gpus: tuple[int, ...]) -> sched.RunningUnit:
    w = sched.PlacedWorker(name="busy-0", index=0, machine="gpu-01", gpu_indices=gpus, cpu_cores=1, memory_bytes=0)
    return sched.RunningUnit(run="busy", workspace="ws", priority=0, started_at=T0 - 60, time_limit_seconds=None,
                             workers=(w,))


@pytest.mark.parametrize("machine, running, asked, line", [
    (_machine("gpu-01", quarantined_gpus=(3,)), (), 8,
     "machine has 7 GPUs (GPU 3 quarantined), 8 asked"),
    (_machine("gpu-01", quarantined_gpus=(3, 5)), (), 7,
     "machine has 6 GPUs (GPUs 3, 5 quarantined), 7 asked"),
    (_machine("gpu-01", quarantined_gpus=(3,)), (_busy((0, 1, 2, 4)),), 4,
     "not enough free GPUs: 3 free (GPU 3 quarantined), 4 asked (4 held by busy at priority 0)"),
    (_machine("gpu-01", schedulable=False, unschedulable_reason="cordoned by admin: firmware update tonight"), (), 1,
     "machine is not schedulable (cordoned by admin: firmware update tonight)"),
    (_machine("gpu-01", schedulable=False, unschedulable_reason="drained by health-check: ECC errors"), (), 1,
     "machine is not schedulable (drained by health-check: ECC errors)"),
    (_machine("gpu-01", quarantined_gpus=(3,)), (_busy((0, 1)),), 4, None),  # room on its other GPUs: it starts
])
@pytest.mark.parametrize("grouped", [False, True])
def test_why_not_names_the_quarantined_gpu_or_the_cordon(machine, running, asked, line, grouped):
    head = sched.WaitingRun(name="wants", workspace="ws", priority=0, submitted_at=T0, time_limit_seconds=None,
                            workers=(sched.WorkerRequest(index=0, gpus=asked, cpu_cores=1, memory_bytes=0),))
    snap = sched.Snapshot(cluster="main", machines=(machine,), running=running, waiting=(head,),
                          workspaces=(sched.Workspace(id="ws", name="ws"),), why_not_machines=0 if grouped else 100)
    plan = sched.plan(snap, T0)
    if line is None:
        assert [s.run for s in plan.starts] == ["wants"] and 3 not in plan.starts[0].placements[0].gpu_indices
        return
    got = dict(plan.why_not["wants-0"])["gpu-01"]
    assert got == line, got  # grouped too: a machine that keeps a line of its own names its holders
