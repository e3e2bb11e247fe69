"""Preemption latency, Astraeus beside Slurm, in one run.

A victim at low priority holds all 8 GPUs; an urgent 8-GPU run is submitted. Measured from the urgent
submit: the victim's SIGTERM (its handler writes a timestamp to a file) and the urgent run's start (its
command writes a timestamp). p50/p99 over the trials.

- Astraeus: `astraeus up --gpus 8 --machines 1` with ASTRAEUS_STOP_GRACE=2; victim priority -100, urgent
  priority 0 (above the victim, and within the workspace's default maximum of 0); POST $API/runs.
- Slurm: shared/peers/slurm beside the checkout (partition `low` REQUEUE-preemptible, `high` above it).

    python benchmarks/bench_preemption.py --trials 20            # both, side by side
    python benchmarks/bench_preemption.py --trials 20 --no-slurm # Astraeus only
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from astraeus_local import LocalAstraeus, python
from slurm_peer import (
    GPUS,
    VICTIM_PY,
    machine_info,
    measure_slurm_preemption,
    read_stamp,
    stamp_command,
    summary,
    wait_for,
)


def measure_astraeus_preemption(trials: int = 20, stop_grace: float = 2.0) -> dict:
    base = Path(tempfile.mkdtemp(prefix="astraeus-preempt-"))
    (base / "victim.py").write_text(VICTIM_PY)
    py = python()
    to_term: list[float] = []
    to_start: list[float] = []
    with LocalAstraeus(gpus=GPUS, stop_grace=stop_grace) as ax:
        for i in range(trials):
            d = base / f"trial{i}"
            d.mkdir()
            ax.submit(f"victim-{i}", [py, str(base / "victim.py"), str(d)], gpus=GPUS, priority=-100)
            wait_for(lambda d=d: (d / "started").exists(), 120, what="the victim to start")
            time.sleep(0.5)  # as for Slurm: let the control plane settle after the victim's start
            t0 = time.time()
            ax.submit(f"urgent-{i}", ["sh", "-c", stamp_command(d / "urgent")], gpus=GPUS, priority=0)
            t_term = wait_for(lambda d=d: read_stamp(d / "term"), 300, what="the victim's SIGTERM")
            try:
                t_start = wait_for(lambda d=d: read_stamp(d / "urgent"), 60, what="the urgent run to start")
            except TimeoutError:
                raise RuntimeError(f"urgent-{i} did not start: {ax.get(f'/runs/urgent-{i}')['status']}") from None
            to_term.append(t_term - t0)
            to_start.append(t_start - t0)
            ax.delete(f"victim-{i}")  # it was queued again: remove it before the next trial
            ax.delete(f"urgent-{i}")
            ax.wait_idle()
    return {"system": "astraeus", "trials": trials, "stop_grace": stop_grace, "to_sigterm": summary(to_term),
            "to_urgent_start": summary(to_start), "raw_to_sigterm": to_term, "raw_to_urgent_start": to_start}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def print_side_by_side(ax: dict | None, sl: dict | None) -> None:
    print(f"{'preemption latency':<38}{'Astraeus':>12}{'Slurm':>12}{'Astraeus/Slurm':>16}")
    for key, label in (("to_sigterm", "urgent submit → victim SIGTERM"), ("to_urgent_start", "urgent submit → urgent start")):
        for q in ("p50", "p99"):
            a = ax[key][q] if ax else None
            s = sl[key][q] if sl else None
            print(f"  {label + ' ' + q:<36}{(f'{a:.3f}s' if a is not None else '-'):>12}"
                  f"{(f'{s:.3f}s' if s is not None else '-'):>12}{_ratio(a, s):>16}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--stop-grace", type=float, default=2.0)
    ap.add_argument("--no-slurm", action="store_true", help="measure Astraeus only")
    ap.add_argument("--no-astraeus", action="store_true", help="measure Slurm only")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)
    out: dict = {"machine": machine_info()}
    if not a.no_astraeus:
        out["astraeus"] = measure_astraeus_preemption(a.trials, a.stop_grace)
    if not a.no_slurm:
        out["slurm"] = measure_slurm_preemption(a.trials)
    print(f"{a.trials} trials; machine: {out['machine']['nproc']} CPUs, {out['machine']['cpu_model']}")
    print_side_by_side(out.get("astraeus"), out.get("slurm"))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
