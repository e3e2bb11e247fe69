"""Scheduler speed: one full cycle of `plan(snapshot, now)` at scale, and placements per second.

    .venv/bin/python benchmarks/bench_scheduler.py          # full: 1k, 10k and 50k waiting runs
    .venv/bin/python benchmarks/bench_scheduler.py --quick  # smoke: smaller cluster, fewer cycles
    .venv/bin/python benchmarks/bench_scheduler.py --constrained [--quick]  # a third of the runs constrained,
                                                             # side by side with the same runs unconstrained
    .venv/bin/python benchmarks/bench_scheduler.py --scale [--quick]  # 10,000 machines x 8 GPUs, 10k/50k/100k
                                                             # waiting, a third constrained (quick: 1,000 x 8)
    .venv/bin/python benchmarks/bench_scheduler.py --scale --against /tmp/was/src  # the scheduler of another
                                                             # checkout in the same process, cycle by cycle
                                                             # interleaved with this one (before/after pairs)

Prints figures; asserts nothing (wall-clock time is not a test). The cluster: 1,000 machines × 8 GPUs, 5,000
running units (priorities -100/0/10, 70 % with time limits, some 2-machine gangs), waiting runs in 20
workspaces (half with quotas) with priorities -100..50, 1-8 GPUs, some 2-4 machine gangs, half with time
limits. Seeded: the same figures' inputs every run.

Constrained runs (--constrained, --scale): machines carry a GPU model (A100 / H100 / L40S, as a label `model`
and as Machine.gpu_model), a `rack` label (64 machines each) and belong to one of three pools; a third of the
waiting runs select machines, in equal parts by label (model=H100 or rack=...), by names (a rack's 64 names),
by pool, and by GPU model ("a100"). The unconstrained figures are for the same snapshot with every
node_selection cleared (the same runs, shapes and order).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
import tracemalloc
from dataclasses import replace

from astraeus.scheduler import (
    Machine,
    NodeSelection,
    PlacedWorker,
    Pool,
    Quota,
    RunningUnit,
    Snapshot,
    WaitingRun,
    WorkerRequest,
    Workspace,
    interned_workers,
    plan,
)

GIB = 1 << 30
NOW = 1_790_856_000.0


MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L40S")
RACK = 64  # machines per rack label (and per names list of a constrained run)


def _machine(i: int, constrained: bool) -> Machine:
    if not constrained:
        return Machine(f"gpu-{i:05d}", 8, 128, 1024 * GIB)
    model = MODELS[i % 3]
    return Machine(f"gpu-{i:05d}", 8, 128, 1024 * GIB,
                   labels=(("model", model.split()[1].split("-")[0]), ("rack", f"r{i // RACK}")), gpu_model=model)


def make_cluster(machines: int, running: int, waiting: int, seed: int = 7, constrained: bool = False) -> Snapshot:
    rnd = random.Random(seed)
    ms = tuple(_machine(i, constrained) for i in range(machines))
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
    selections = _selections(ms) if constrained else []
    # One object for every run that selects any machine, as the control plane's loop gives them (one NodeSelection
    # per distinct selection in a snapshot, 67400b9); until the fourth round each run had its own.
    any_machine = NodeSelection()
    runs = []
    shared = {}  # and one workers tuple per distinct shape, as the control plane interns them too
    for k in range(waiting):
        gang = rnd.random() < 0.05
        count = rnd.choice([2, 4]) if gang else 1
        gpus = 8 if gang else rnd.choice([1, 1, 1, 2, 4, 8])
        reqs = interned_workers(shared, tuple((i, gpus, 8 * gpus, 64 * GIB * gpus) for i in range(count)))
        sel = any_machine
        if selections and k % 3 == 0:  # a third of the runs, spread over the queue
            sel = selections[rnd.randrange(len(selections))]
        runs.append(WaitingRun(
            f"wait{k}", rnd.choice(spaces).id, rnd.choice([-100, 0, 0, 0, 10, 50]), NOW - rnd.uniform(0, 86400),
            reqs, "Gang", rnd.choice([None, 600.0, 3600.0, 86400.0]), sel,
        ))
    pools = ()
    if constrained:
        pools = tuple(Pool(f"pool-{p}", tuple(m.name for i, m in enumerate(ms) if i % 3 == p)) for p in range(3))
    return Snapshot("bench", ms, tuple(units), tuple(runs), spaces, pools=pools)


def _selections(ms: tuple[Machine, ...]) -> list[NodeSelection]:
    """The constrained runs' choices: by label (a model, or a rack), by a rack's names, by pool, by GPU model.
    Runs share these objects as a cluster's users share a handful of selections."""
    racks = (len(ms) + RACK - 1) // RACK
    picks = [0, racks // 2, racks - 1]
    by_label = [NodeSelection("Labels", labels=(("model", "H100"),))]
    by_label += [NodeSelection("Labels", labels=(("rack", f"r{r}"),)) for r in picks]
    by_names = [NodeSelection("Names", tuple(m.name for m in ms[r * RACK:(r + 1) * RACK])) for r in picks]
    by_pool = [NodeSelection(pools=(f"pool-{p}",)) for p in range(3)]
    by_model = [NodeSelection(gpu_model="a100"), NodeSelection(gpu_model="l40s")]
    # equal parts by kind: repeat each kind's list to the same length
    kinds = [by_label, by_names, by_pool, by_model]
    n = max(len(k) for k in kinds)
    return [k[i % len(k)] for k in kinds for i in range(n)]


def unconstrained(snap: Snapshot) -> Snapshot:
    """The same snapshot with every run's node_selection cleared (and no pools)."""
    plain = NodeSelection()
    return replace(snap, waiting=tuple(replace(r, node_selection=plain) for r in snap.waiting), pools=())


def cycle_figures(snap: Snapshot, cycles: int) -> dict:
    plan(snap, NOW)  # warm
    times = []
    cpu = []
    result = None
    for _ in range(cycles):
        result = None  # the last plan is freed before the clock starts, not counted in the next cycle
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


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def constrained_table(machines: int, running: int, sizes: list[int], cycles: int, fixed: int | None = None) -> None:
    """Per size: plan() with a third of the runs constrained, and the same runs unconstrained, side by side
    (`fixed`: that many timed cycles at every size)."""
    print(f"cluster: {machines:,} machines x 8 GPUs, {running:,} running units; a third of the waiting runs "
          "constrained (label, names, pool, GPU model); the same runs unconstrained for the ratio")
    print(f"{'waiting':>8} {'cycles':>6} {'p50 ms':>8} {'p99 ms':>8} {'cpu p50':>8} {'peak MiB':>9} {'starts':>7} "
          f"{'| plain p50':>11} {'plain cpu':>10} {'plain MiB':>10} {'cpu ratio':>10}")
    for n in sizes:
        snap = make_cluster(machines, running, n, constrained=True)
        k = fixed or (cycles if n <= 10_000 else max(3, cycles // 4))
        f = cycle_figures(snap, k)
        b = cycle_figures(unconstrained(snap), k)
        print(f"{n:>8,} {k:>6} {f['p50_ms']:>8.1f} {f['p99_ms']:>8.1f} {f['cpu_p50_ms']:>8.1f} {f['peak_mib']:>9.1f} "
              f"{f['starts']:>7} {'| ' + format(b['p50_ms'], '.1f'):>11} {b['cpu_p50_ms']:>10.1f} "
              f"{b['peak_mib']:>10.1f} {f['cpu_p50_ms'] / b['cpu_p50_ms']:>9.2f}x", flush=True)
        del snap
    print(f"process max RSS (snapshots, plans and Python included): {max_rss_mib():,.0f} MiB")


def load_against(src: str):
    """`plan` of the scheduler under `src` (a checkout's src/ folder), imported as a package of its own."""
    import atexit
    import importlib
    import shutil
    import sys
    import tempfile
    tmp = tempfile.mkdtemp(prefix="bench-against-")
    atexit.register(shutil.rmtree, tmp, True)
    shutil.copytree(f"{src}/astraeus/scheduler", f"{tmp}/sched_against")
    sys.path.insert(0, tmp)
    return importlib.import_module("sched_against").plan


def paired_table(against, machines: int, running: int, sizes: list[int], cycles: int) -> None:
    """Per size, constrained and plain: the other scheduler's and this one's cycles interleaved in one process
    (the same load for both), CPU p50 each; their plans must read the same."""
    import os
    print(f"cluster: {machines:,} machines x 8 GPUs, {running:,} running units; --against (A) and this checkout (B), "
          f"{cycles} cycles each, interleaved; load {os.getloadavg()[0]:.1f}")
    print(f"{'waiting':>8} {'con A cpu':>10} {'con B cpu':>10} {'plain A':>8} {'plain B':>8} {'ratio A':>8} "
          f"{'ratio B':>8} {'MiB A':>6} {'MiB B':>6} {'load':>5}")
    for n in sizes:
        snap = make_cluster(machines, running, n, constrained=True)
        cpu: dict[tuple, list[float]] = {}
        mib = {}
        for kind, s in (("con", snap), ("plain", unconstrained(snap))):
            # Different classes (two packages): compared by their text.
            assert repr(against(s, NOW)) == repr(plan(s, NOW)), f"plans differ: {n} {kind}"
            for _ in range(cycles):
                for tag, f in (("A", against), ("B", plan)):
                    c0 = time.process_time()
                    f(s, NOW)
                    cpu.setdefault((kind, tag), []).append((time.process_time() - c0) * 1e3)
            if kind == "con":
                for tag, f in (("A", against), ("B", plan)):
                    tracemalloc.start()
                    f(s, NOW)
                    mib[tag] = tracemalloc.get_traced_memory()[1] / 2**20
                    tracemalloc.stop()
        m = {k: statistics.median(v) for k, v in cpu.items()}
        print(f"{n:>8,} {m['con', 'A']:>10.1f} {m['con', 'B']:>10.1f} {m['plain', 'A']:>8.1f} {m['plain', 'B']:>8.1f} "
              f"{m['con', 'A'] / m['plain', 'A']:>7.2f}x {m['con', 'B'] / m['plain', 'B']:>7.2f}x {mib['A']:>6.1f} "
              f"{mib['B']:>6.1f} {os.getloadavg()[0]:>5.1f}", flush=True)
        del snap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few cycles: a smoke run")
    ap.add_argument("--constrained", action="store_true",
                    help="a third of the waiting runs constrained, beside the same runs unconstrained")
    ap.add_argument("--scale", action="store_true",
                    help="10,000 machines x 8 GPUs, 10k/50k/100k waiting runs, a third constrained")
    ap.add_argument("--against", metavar="SRC",
                    help="with --scale: another checkout's src/ folder, its plan() interleaved with this one's")
    ap.add_argument("--cycles", type=int, metavar="N",
                    help="with --scale: N timed cycles at every size (default 5 at 10k and 3 above, 5 each with "
                         "--against): more cycles, a steadier p50")
    args = ap.parse_args()
    if args.cycles is not None and args.cycles < 1:
        ap.error("--cycles: give a number of cycles >= 1")
    if args.scale and args.against:
        sizes, cycles = ([1_000, 5_000, 10_000], 3) if args.quick else ([10_000, 50_000, 100_000], 5)
        cycles = args.cycles or cycles
        paired_table(load_against(args.against), 1_000 if args.quick else 10_000, 5_000 if args.quick else 50_000,
                     sizes, cycles)
        return
    if args.scale:
        if args.quick:
            constrained_table(1_000, 5_000, [1_000, 5_000, 10_000], 3, args.cycles)
        else:
            constrained_table(10_000, 50_000, [10_000, 50_000, 100_000], 5, args.cycles)
        return
    if args.constrained:
        if args.quick:
            constrained_table(100, 500, [1_000], 3)
        else:
            constrained_table(1_000, 5_000, [1_000, 10_000, 50_000], 20)
        return
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
