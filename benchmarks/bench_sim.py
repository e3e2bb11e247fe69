"""The simulator on the whole Alibaba GPU trace (cluster-trace-gpu-v2023, CC BY 4.0): the report, and with
--variants each scheduling rule turned off in turn, side by side.

    python benchmarks/bench_sim.py                       # 8,152 tasks on their 1,213 machines
    python benchmarks/bench_sim.py --constrained         # the same with gpu_spec: a third of the tasks may use
                                                         # only machines of their GPU models (openb_pod_list_gpuspec33)
    python benchmarks/bench_sim.py --plot util.png --json sim.json
    python benchmarks/bench_sim.py --variants --arrival-scale 0.02 --max-machines 300

On its own 6,212 GPUs the trace is light (at most 70 GPUs in use at once), so every rule looks the same;
--arrival-scale packs the arrivals closer and --max-machines shrinks the cluster to make runs wait.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from astraeus.sim import simulate_main

TRACE = Path(os.environ.get("ASTRAEUS_TRACE_DIR",
                            Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023"))

VARIANTS = {
    "all rules": {},
    "no backfill": {"backfill": False},
    "no preemption": {"preemption": False},
    "FIFO": {"fifo": True},
    "no fair share": {"fair_share": False},
}


def _p(report: dict, cls: str, q: str) -> str:
    w = report["waits"].get(cls)
    v = w["simulated"][q] if w else None
    return "-" if v is None else f"{v:.0f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=str(TRACE / "openb_pod_list_default.csv"))
    ap.add_argument("--constrained", action="store_true",
                    help="tasks from openb_pod_list_gpuspec33.csv: a third restricted to their GPU models' machines")
    ap.add_argument("--machines", default=str(TRACE / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--arrival-scale", type=float, default=1.0)
    ap.add_argument("--max-machines", type=int)
    ap.add_argument("--checkpoint-interval", type=float, default=0.0)
    ap.add_argument("--honest-time-limits", action="store_true")
    ap.add_argument("--plot")
    ap.add_argument("--json")
    ap.add_argument("--variants", action="store_true", help="also run with each rule off and compare")
    ap.add_argument("--victims", action="store_true",
                    help="also run with least-work-lost victims and compare the GPU-hours lost to preemption")
    a = ap.parse_args(argv)
    if a.constrained:
        a.tasks = str(Path(a.tasks).with_name("openb_pod_list_gpuspec33.csv"))
    common = dict(limit=a.limit, arrival_scale=a.arrival_scale, max_machines=a.max_machines,
                  checkpoint_interval=a.checkpoint_interval, honest_time_limits=a.honest_time_limits)
    t0, c0 = time.perf_counter(), time.process_time()
    report = simulate_main(a.machines, a.tasks, "alibaba", plot=a.plot, json_out=a.json, **common)
    print(f"\nwhole run, reading the trace included: {time.perf_counter() - t0:.1f}s "
          f"({time.process_time() - c0:.1f}s CPU)")
    if a.victims:
        least = simulate_main(a.machines, a.tasks, "alibaba", quiet=True, victims="least-work-lost", **common)
        print("\nGPU-hours lost to preemption, by the victims stopped first among equal priorities:")
        for label, r in (("recent", report), ("least-work-lost", least)):
            print(f"  {label:<16}{r['gpu_hours_lost']:>9.1f} GPU-h lost{r['preemptions']:>7} preemptions")
    if not a.variants:
        return
    rows = [("all rules", report)]
    for label, switches in VARIANTS.items():
        if switches:
            rows.append((label, simulate_main(a.machines, a.tasks, "alibaba", quiet=True, **common, **switches)))
    print("\nEach rule off in turn (waits in seconds: LS p50/p99, BE p50/p99):")
    print(f"  {'rules':<15}{'LS p50':>8}{'LS p99':>9}{'BE p50':>8}{'BE p99':>9}{'util':>7}{'preempt':>9}"
          f"{'GPU-h lost':>11}{'backfill':>9}{'makespan d':>11}{'plan p99 ms':>12}")
    for label, r in rows:
        print(f"  {label:<15}{_p(r, 'LS', 'p50'):>8}{_p(r, 'LS', 'p99'):>9}{_p(r, 'BE', 'p50'):>8}"
              f"{_p(r, 'BE', 'p99'):>9}{r['utilisation'] * 100:>6.1f}%{r['preemptions']:>9}"
              f"{r['gpu_hours_lost']:>11.1f}{r['backfilled_starts']:>9}{r['makespan_seconds'] / 86400:>11.1f}"
              f"{r['scheduler']['p99_ms']:>12.2f}")


if __name__ == "__main__":
    main()
