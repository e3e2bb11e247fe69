"""Slurm as a peer: the same preemption and throughput work as Astraeus's benchmarks, on Debian's slurm-wlm.

Slurm is started by shared/peers/slurm/start.sh (beside the checkout) (root; installs slurm-wlm and munge with apt-get if
they are missing): one machine with 8 fake GPUs, partitions `low` (preemptible, REQUEUE, GraceTime=0,
KillWait=30: SIGTERM at once, SIGKILL 30 s later) and `high`.

    python benchmarks/slurm_peer.py --preemption --trials 20
    python benchmarks/slurm_peer.py --throughput --jobs 500
    python benchmarks/slurm_peer.py --floor --jobs 500

Measured:
- preemption latency: a victim holds all 8 GPUs in `low`; an urgent 8-GPU job is submitted to `high`.
  submit → the victim's SIGTERM (its handler writes a timestamp to a file) and submit → the urgent job's
  first line (it writes a timestamp). p50/p99 over the trials.
- throughput: n one-GPU jobs that each write a timestamp (`date`) and exit, on 8 GPUs: first submit → last
  exit.
- floor: `xargs -P 8` running the same n commands, no scheduler at all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_SH = Path(__file__).resolve().parents[2] / "shared" / "peers" / "slurm" / "start.sh"  # shared/ beside the checkout
GPUS = 8  # the peer's fake GPUs, /dev/fakegpu0..7

# The victim: saves nothing, but records when SIGTERM arrives and exits at once (a checkpoint-friendly run
# with nothing to save). It records its start first, so a trial only submits the urgent job once it runs.
VICTIM_PY = r"""
import os, signal, sys, time
d = sys.argv[1]
def on_term(signum, frame):
    with open(os.path.join(d, "term.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.replace(os.path.join(d, "term.tmp"), os.path.join(d, "term"))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(d, "started.tmp"), "w") as f:
    f.write(repr(time.time()))
os.replace(os.path.join(d, "started.tmp"), os.path.join(d, "started"))
while True:
    time.sleep(3600)
"""



def stamp_command(path: Path | str) -> str:
    """The trivial job: write the time it runs to `path` (a temporary name, then a rename, so a reader never
    sees half a line) and exit. A shell and `date`: starting a Python would cost more than the scheduling
    being measured on a small machine."""
    return f"date +%s.%N > {path}.tmp && mv {path}.tmp {path}"


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))]


def summary(values: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "min": min(values, default=None),
        "max": max(values, default=None),
    }


def machine_info() -> dict[str, str | int]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return {"nproc": os.cpu_count() or 0, "cpu_model": model, "loadavg_1m": f"{load:.1f}"}


def wait_for(pred, timeout: float, interval: float = 0.01, what: str = "condition"):
    """Poll `pred` until it returns something truthy; every 10 ms, as a person's script would not."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_stamp(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- Slurm


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def slurm_running() -> bool:
    if not shutil.which("sinfo"):
        return False
    r = subprocess.run(["sinfo", "-h", "-o", "%P %a %t"], capture_output=True, text=True)
    return r.returncode == 0 and any(state in r.stdout for state in ("idle", "mix", "alloc"))


def start_slurm() -> None:
    """Start the peer with its own start.sh (idempotent: it starts only what is not running)."""
    if slurm_running():
        return
    if os.geteuid() != 0:
        raise RuntimeError("start.sh must run as root (it writes /etc/slurm and starts munged, slurmctld, slurmd)")
    subprocess.run(["sh", str(START_SH)], check=True, capture_output=True, text=True, timeout=600)
    wait_for(slurm_running, 60, 0.5, "Slurm to report its node")


def clear_slurm() -> None:
    subprocess.run(["scancel", "-u", "root"], capture_output=True)
    wait_for(lambda: not _run(["squeue", "-h", "-o", "%i"]).stdout.strip(), 120, 0.2, "Slurm's queue to empty")


def sbatch(partition: str, gpus: int, command: str, workdir: Path) -> str:
    out = _run(
        ["sbatch", "--parsable", "-p", partition, f"--gres=gpu:{gpus}", "-o", "/dev/null", "-e", "/dev/null",
         "-D", str(workdir), "--wrap", command]
    ).stdout.strip()
    return out.split(";")[0]


def measure_slurm_preemption(trials: int = 20) -> dict:
    """Urgent submit → victim SIGTERM and → urgent start, on Slurm's partition_prio preemption."""
    start_slurm()
    clear_slurm()
    base = Path(tempfile.mkdtemp(prefix="slurm-preempt-"))
    (base / "victim.py").write_text(VICTIM_PY)
    to_term: list[float] = []
    to_start: list[float] = []
    py = shutil.which("python3") or sys.executable
    for i in range(trials):
        d = base / f"trial{i}"
        d.mkdir()
        sbatch("low", GPUS, f"exec {py} {base}/victim.py {d}", d)
        wait_for(lambda d=d: (d / "started").exists(), 120, what="the victim to start")
        time.sleep(0.5)  # let the controller settle after the victim's start
        t0 = time.time()
        sbatch("high", GPUS, stamp_command(d / "urgent"), d)
        t_term = wait_for(lambda d=d: read_stamp(d / "term"), 300, what="the victim's SIGTERM")
        t_start = wait_for(lambda d=d: read_stamp(d / "urgent"), 300, what="the urgent job to start")
        to_term.append(t_term - t0)
        to_start.append(t_start - t0)
        clear_slurm()  # the victim was requeued: cancel it before the next trial
    shutil.rmtree(base, ignore_errors=True)
    return {"system": "slurm", "trials": trials, "to_sigterm": summary(to_term), "to_urgent_start": summary(to_start),
            "raw_to_sigterm": to_term, "raw_to_urgent_start": to_start}


def measure_slurm_throughput(n: int = 500) -> dict:
    """n one-GPU jobs (each writes a timestamp and exits) on 8 GPUs: first submit → last exit."""
    start_slurm()
    clear_slurm()
    d = Path(tempfile.mkdtemp(prefix="slurm-tput-"))
    t0 = time.time()
    for i in range(n):
        sbatch("high", 1, stamp_command(d / f"done.{i}"), d)
    t_submitted = time.time()
    wait_for(lambda: len(list(d.glob("done.*[0-9]"))) >= n, 3600, 0.1, f"{n} jobs to finish")
    last = max(read_stamp(p) or 0.0 for p in d.glob("done.*[0-9]"))
    clear_slurm()  # also waits for the last jobs to leave the queue
    shutil.rmtree(d, ignore_errors=True)
    total = last - t0
    return {"system": "slurm", "jobs": n, "seconds": total, "jobs_per_second": n / total if total > 0 else None,
            "submit_seconds": t_submitted - t0}


def measure_xargs_floor(n: int = 500) -> dict:
    """The same n commands through `xargs -P 8`: what running them costs with no scheduler."""
    d = Path(tempfile.mkdtemp(prefix="xargs-floor-"))
    lines = "".join(stamp_command(d / f"done.{i}") + "\n" for i in range(n))
    t0 = time.time()
    # One `sh -c '<command>'` per line, 8 at a time (one per GPU).
    subprocess.run(["xargs", "-P", str(GPUS), "-d", "\n", "-n", "1", "sh", "-c"], input=lines, text=True,
                   check=True)
    t1 = time.time()
    last = max(read_stamp(p) or 0.0 for p in d.glob("done.*[0-9]"))
    shutil.rmtree(d, ignore_errors=True)
    return {"system": "xargs -P 8", "jobs": n, "seconds": t1 - t0, "last_exit_seconds": last - t0,
            "jobs_per_second": n / (t1 - t0)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preemption", action="store_true")
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--floor", action="store_true")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)
    if not (a.preemption or a.throughput or a.floor):
        a.preemption = a.throughput = a.floor = True
    out: dict = {"machine": machine_info()}
    if a.preemption:
        out["preemption"] = measure_slurm_preemption(a.trials)
        p = out["preemption"]
        print(f"slurm preemption ({a.trials} trials): submit → victim SIGTERM p50 {p['to_sigterm']['p50']:.2f}s "
              f"p99 {p['to_sigterm']['p99']:.2f}s; submit → urgent start p50 {p['to_urgent_start']['p50']:.2f}s "
              f"p99 {p['to_urgent_start']['p99']:.2f}s", flush=True)
    if a.throughput:
        out["throughput"] = t = measure_slurm_throughput(a.jobs)
        print(f"slurm throughput: {a.jobs} one-GPU jobs on {GPUS} GPUs in {t['seconds']:.1f}s "
              f"({t['jobs_per_second']:.1f} jobs/s; submitting took {t['submit_seconds']:.1f}s)", flush=True)
    if a.floor:
        out["floor"] = f = measure_xargs_floor(a.jobs)
        print(f"xargs -P {GPUS} floor: {a.jobs} commands in {f['seconds']:.2f}s ({f['jobs_per_second']:.0f}/s)",
              flush=True)
    m = out["machine"]
    print(f"machine: {m['nproc']} CPUs, {m['cpu_model']}, load average {m['loadavg_1m']} when it ended")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
