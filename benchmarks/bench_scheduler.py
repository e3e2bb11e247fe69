"""Scheduler speed: one full cycle of `plan(snapshot, now)` at scale, and placements per second.

    .venv/bin/python benchmarks/bench_scheduler.py          # full: 1k, 10k and 50k waiting runs
    .venv/bin/python benchmarks/bench_scheduler.py --quick  # smoke: smaller cluster, fewer cycles

Prints figures; asserts nothing (wall-clock time is not a test). The cluster: 1,000 machines × 8 GPUs, 5,000
running units (priorities -100/0/10, 70 % with time limits, some 2-machine gangs), waiting runs in 20
workspaces (half with quotas) with priorities -100..50, 1-8 GPUs, some 2-4 machine gangs, half with time
limits. Seeded: the same figures' inputs every run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from astraeus.scheduler import (
    Machine,
    PlacedWorker,
    Quota,
    RunningUnit,
    Snapshot,
    WaitingRun,
    WorkerRequest,
    Workspace,
    plan,
)

GIB = 1 << 30
NOW = 1_790_856_000.0


def make_cluster(machines: int, running: int, waiting: int, seed: int = 7) -> Snapshot:
    rnd = random.Random(seed)
    ms = tuple(Machine(f"gpu-{i:04d}", 8, 128, 1024 * GIB) for i in range(machines))
    spaces = tuple(
        Workspace(f"ws-{k:012x}", f"team-{k}", Quota(gpus=rnd.choice([64, 256, 1024])) if k % 2 else None,
                  rnd.choice([1.0, 1.0, 2.0]))
        for k in range(20)
    )
    free = {m.name: list(range(8)) for m in ms}
    units: list[RunningUnit] = []
    names = [m.name for m in ms]
    mi = 0
    while len(units) < running and mi < machines:
        name = names[mi]
        if rnd.random() < 0.04 and mi + 1 < machines and len(free[name]) == 8:
            # a 2-machine gang, whole machines
            ws = []
            for k, n in enumerate((name, names[mi + 1])):
                ws.append(PlacedWorker(f"gang{len(units)}-{k}", k, n, tuple(free[n]), 64, 512 * GIB))
                free[n] = []
            mi += 2
        else:
            size = rnd.choice([1, 1, 1, 1, 2, 2, 4, 8])
            if size > len(free[name]):
                mi += 1
                continue
            take = tuple(free[name][:size])
            del free[name][:size]
            ws = [PlacedWorker(f"run{len(units)}-0", 0, name, take, 8 * size, 64 * GIB * size)]
        units.append(RunningUnit(
            ws[0].name.rsplit("-", 1)[0], rnd.choice(spaces).id, rnd.choice([-100, 0, 0, 10]),
            NOW - rnd.uniform(60, 86400), rnd.choice([None, 3600.0, 86400.0, 172800.0]) if rnd.random() < 0.9 else None,
            tuple(ws),
        ))
    runs = []
    for k in range(waiting):
        gang = rnd.random() < 0.05
        count = rnd.choice([2, 4]) if gang else 1
        gpus = 8 if gang else rnd.choice([1, 1, 1, 2, 4, 8])
        reqs = tuple(WorkerRequest(i, gpus, 8 * gpus, 64 * GIB * gpus) for i in range(count))
        runs.append(WaitingRun(
            f"wait{k}", rnd.choice(spaces).id, rnd.choice([-100, 0, 0, 0, 10, 50]), NOW - rnd.uniform(0, 86400),
            reqs, "Gang", rnd.choice([None, 600.0, 3600.0, 86400.0]),
        ))
    return Snapshot("bench", ms, tuple(units), tuple(runs), spaces)


def cycle_figures(snap: Snapshot, cycles: int) -> dict:
    plan(snap, NOW)  # warm
    times = []
    cpu = []
    result = None
    for _ in range(cycles):
        t0, c0 = time.perf_counter(), time.process_time()
        result = plan(snap, NOW)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    tracemalloc.start()
    plan(snap, NOW)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times.sort()
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
        "cpu_p50_ms": statistics.median(cpu) * 1e3,  # CPU time: less noisy than wall time on shared cores
        "peak_mib": peak / 2**20,
        "starts": len(result.starts),
        "stops": len(result.stops),
        "head": result.head,
    }


def placements_per_second(machines: int, runs: int) -> tuple[float, int]:
    ms = tuple(Machine(f"gpu-{i:04d}", 8, 128, 1024 * GIB) for i in range(machines))
    waiting = tuple(
        WaitingRun(f"one{k}", "ws-000000000000", 0, NOW - runs + k, (WorkerRequest(0, 1, 8, 64 * GIB),))
        for k in range(runs)
    )
    snap = Snapshot("empty", ms, (), waiting, (Workspace("ws-000000000000", "team"),), why_not_limit=0)
    best = float("inf")
    started = 0
    for _ in range(3):
        t0 = time.perf_counter()
        p = plan(snap, NOW)
        best = min(best, time.perf_counter() - t0)
        started = sum(len(s.placements) for s in p.starts)
    return started / best, started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few cycles: a smoke run")
    args = ap.parse_args()
    if args.quick:
        machines, running, sizes, cycles, place = 100, 500, [1_000], 3, 800
    else:
        machines, running, sizes, cycles, place = 1_000, 5_000, [1_000, 10_000, 50_000], 20, 8_000
    print(f"cluster: {machines} machines x 8 GPUs, {running} running units; {cycles} cycles each")
    print(f"{'waiting':>8} {'p50 ms':>8} {'p99 ms':>8} {'cpu p50':>8} {'peak MiB':>9} {'starts':>7} {'stops':>6}  head")
    for n in sizes:
        snap = make_cluster(machines, running, n)
        f = cycle_figures(snap, cycles if n <= 10_000 else max(3, cycles // 4))
        print(f"{n:>8} {f['p50_ms']:>8.1f} {f['p99_ms']:>8.1f} {f['cpu_p50_ms']:>8.1f} {f['peak_mib']:>9.1f} {f['starts']:>7} "
              f"{f['stops']:>6}  {f['head']}")
    rate, started = placements_per_second(machines, place)
    print(f"placements onto an empty {machines}x8 cluster: {started} one-GPU runs, {rate:,.0f} placements/s")


if __name__ == "__main__":
    main()
