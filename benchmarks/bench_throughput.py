"""Throughput: n trivial one-GPU runs on 8 GPUs, first submit → last exit; Astraeus, Slurm and the floor
(`xargs -P 8` running the same commands with no scheduler), side by side in one run.

Each run's command writes a timestamp to its own file and exits; the last of those is the last exit.

    python benchmarks/bench_throughput.py --jobs 500
    python benchmarks/bench_throughput.py --jobs 500 --no-slurm
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from astraeus_local import LocalAstraeus
from slurm_peer import (
    GPUS,
    machine_info,
    measure_slurm_throughput,
    measure_xargs_floor,
    read_stamp,
    stamp_command,
)


def measure_astraeus_throughput(n: int = 500) -> dict:
    d = Path(tempfile.mkdtemp(prefix="astraeus-tput-"))
    with LocalAstraeus(gpus=GPUS) as ax:
        tag = str(int(time.time()))[-6:]
        t0 = time.time()
        for i in range(n):
            ax.submit(f"tput-{tag}-{i}", ["sh", "-c", stamp_command(d / f"done.{i}")], gpus=1)
        t_submitted = time.time()
        # Until every run wrote its file, or every run has ended (a run that failed to start writes none). The
        # API is asked every 2 s only, so the check adds little load to the control plane being measured.
        deadline = time.time() + 3600
        next_check = time.time() + 2.0
        while len(list(d.glob("done.*[0-9]"))) < n:
            if time.time() > deadline:
                raise TimeoutError(f"{n} runs did not finish in an hour")
            time.sleep(0.1)
            if time.time() >= next_check:
                next_check = time.time() + 2.0
                states = [r["status"]["state"] for r in ax.get("/runs")["items"]]
                if len(states) >= n and all(st in ("Completed", "Failed", "Cancelled") for st in states):
                    break
        failed = ax.failed_runs()
        stamps = [read_stamp(p) or 0.0 for p in d.glob("done.*[0-9]")]
        last = max(stamps, default=t0)
    total = last - t0
    done = len(stamps)
    return {"system": "astraeus", "jobs": n, "seconds": total, "jobs_per_second": done / total if total > 0 else None,
            "submit_seconds": t_submitted - t0, "failed": len(failed),
            "failed_reasons": sorted({r["status"].get("reason", "") for r in failed})}


def print_side_by_side(results: list[dict]) -> None:
    floor = next((r for r in results if r["system"].startswith("xargs")), None)
    slurm = next((r for r in results if r["system"] == "slurm"), None)
    print(f"{'system':<14}{'jobs':>6}{'seconds':>10}{'jobs/s':>9}{'vs Slurm':>10}{'vs floor':>10}")
    for r in results:
        vs_s = f"{r['seconds'] / slurm['seconds']:.2f}x" if slurm else "-"
        vs_f = f"{r['seconds'] / floor['seconds']:.1f}x" if floor else "-"
        print(f"{r['system']:<14}{r['jobs']:>6}{r['seconds']:>10.2f}{r['jobs_per_second']:>9.1f}{vs_s:>10}{vs_f:>10}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--no-slurm", action="store_true")
    ap.add_argument("--no-astraeus", action="store_true")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)
    results = []
    if not a.no_astraeus:
        results.append(measure_astraeus_throughput(a.jobs))
    if not a.no_slurm:
        results.append(measure_slurm_throughput(a.jobs))
    results.append(measure_xargs_floor(a.jobs))
    info = machine_info()
    print(f"{a.jobs} one-GPU runs on {GPUS} GPUs, first submit → last exit; machine: {info['nproc']} CPUs, "
          f"{info['cpu_model']}, load average {info['loadavg_1m']}")
    print_side_by_side(results)
    for r in results:
        if r.get("failed"):
            print(f"{r['system']}: {r['failed']} of {r['jobs']} runs FAILED (not counted in jobs/s): "
                  f"{r['failed_reasons']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
