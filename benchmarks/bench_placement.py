"""Placement speed (issue 46): plan() at 10,000 machines x 8 GPUs and 100,000 waiting runs, with fractions and
topology in the mix, for each cluster placement (bestfit, fgd, spread).

    .venv/bin/python benchmarks/bench_placement.py            # 10,000 machines, 100,000 waiting, 3 cycles
    .venv/bin/python benchmarks/bench_placement.py --quick    # 1,000 machines, 10,000 waiting, 1 cycle

The snapshot is bench_scheduler's `--scale` one (a third of the runs constrained) with every machine in a network
block and a rack (`topology.astraeus.io/block`: 16 blocks, `/rack`: 64 machines each), a tenth of the one-worker
runs asking for a fraction of a GPU (0.25, 0.5 or 0.75), and half of the gangs requiring one block. Prints
figures; asserts nothing (wall-clock time is not a test).
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scheduler import cycle_figures, make_cluster  # noqa: E402

from astraeus.scheduler import interned_workers  # noqa: E402
from astraeus.scheduler.topology import BLOCK, RACK  # noqa: E402


def with_fractions_and_topology(snap, seed: int = 11, fractions: bool = True):
    rnd = random.Random(seed)
    blocks = 16
    per_block = max(1, len(snap.machines) // blocks)
    machines = tuple(replace(m, labels=tuple(sorted((dict(m.labels) | {BLOCK: f"b{k // per_block:02d}",
                                                                        RACK: f"r{k // 64:03d}"}).items())))
                     for k, m in enumerate(snap.machines))
    waiting = []
    shared = {}  # equal workers and selections are one object each, as the control plane gives them
    for r in snap.waiting:
        if len(r.workers) == 1 and rnd.random() < 0.1 and fractions:
            w = r.workers[0]
            r = replace(r, workers=interned_workers(shared, ((w.index, rnd.choice([0.25, 0.5, 0.75]), 2.0, 8 << 30),)))
        elif len(r.workers) > 1 and rnd.random() < 0.5:
            sel = replace(r.node_selection, topology_same="block")
            r = replace(r, node_selection=shared.setdefault(sel, sel))
        waiting.append(r)
    return replace(snap, machines=machines, waiting=tuple(waiting))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cycles", type=int, default=3, help="timed cycles per placement (after one to warm up)")
    ap.add_argument("--no-fractions", action="store_true", help="topology only: no run asks for a fraction")
    ap.add_argument("--placements", default="bestfit,fgd,spread", help="which placements, joined by commas")
    args = ap.parse_args()
    machines, waiting, cycles = (1_000, 10_000, 1) if args.quick else (10_000, 100_000, args.cycles)
    base = with_fractions_and_topology(make_cluster(machines, machines * 5 // 2, waiting, constrained=True),
                                       fractions=not args.no_fractions)
    mix = "topology" if args.no_fractions else "fractions and topology"
    print(f"{machines:,} machines x 8 GPUs, {waiting:,} waiting ({mix} in the mix), {cycles} cycles")
    print(f"{'placement':>10} {'p50 ms':>8} {'cpu p50':>8} {'starts':>7} {'stops':>6}")
    for placement in args.placements.split(","):
        f = cycle_figures(replace(base, placement=placement), cycles)
        print(f"{placement:>10} {f['p50_ms']:>8.0f} {f['cpu_p50_ms']:>8.0f} {f['starts']:>7} {f['stops']:>6}")


if __name__ == "__main__":
    main()
