"""How fast `astra` answers: each common command's wall time against a local control plane, beside Slurm's.

    python benchmarks/bench_cli.py                  # 20 times each; Slurm's sbatch/squeue too when it can start
    python benchmarks/bench_cli.py -n 50 --no-slurm
    python benchmarks/bench_cli.py --astra /tmp/before/astra --astra .venv/bin/astra   # side by side

Several --astra are timed by turns, run for run, so that a machine's load weighs on each alike.

A local cluster (`astraeus up`, benchmarks/astraeus_local.py) answers; each command runs as a fresh process, as
from a shell, with bytecode cached as an installed package has it (a private PYTHONPYCACHEPREFIX, filled by one
warm-up run of each command). Printed: wall p50/p90 per command in ms, then a 200-job `sbatch` shell loop of
`astra slurm sbatch` beside Slurm's own `sbatch` (benchmarks/slurm_peer.py starts Slurm: root and slurm-wlm;
without them the Slurm columns say why they are missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from astraeus_local import REPO, LocalAstraeus, read_env  # noqa: E402

ASTRA = REPO / ".venv" / "bin" / "astra"


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def timed(argvs: list, env: dict[str, str], n: int) -> list[dict[str, float]]:
    """Wall ms of each command line (a list, or a function of the run's number giving one), n runs each by
    turns after one warm-up run each; p50 and p90 of each. Each run must succeed."""
    xs: list[list[float]] = [[] for _ in argvs]
    for i in range(n + 1):
        for k, argv in enumerate(argvs):
            cmd = argv(i) if callable(argv) else argv
            t = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            dt = (time.perf_counter() - t) * 1000
            if r.returncode != 0:
                raise RuntimeError(f"{cmd} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
            if i:
                xs[k].append(dt)
    return [{"p50": percentile(x, 50), "p90": percentile(x, 90), "n": n} for x in xs]


def slurm_env() -> tuple[bool, str]:
    """Whether Slurm's sbatch/squeue can be timed here, or why not."""
    import slurm_peer

    if not shutil.which("sbatch") and not slurm_peer.START_SH.exists():
        return False, "slurm-wlm is not installed (and no shared/peers/slurm/start.sh beside the checkout to install it)"

    try:
        slurm_peer.start_slurm()
    except Exception as e:  # noqa: BLE001 - any reason it cannot start is reported, not raised
        return False, f"Slurm did not start: {e}"
    return True, ""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="runs of each command")
    ap.add_argument("--loop", type=int, default=200, help="jobs in the sbatch shell loop")
    ap.add_argument("--astra", action="append", help="an astra to time (repeatable; default: this checkout's)")
    ap.add_argument("--no-slurm", action="store_true", help="leave Slurm out")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    a = ap.parse_args(argv)
    astras = a.astra or [str(ASTRA)]
    astra = astras[-1]
    pyc = tempfile.mkdtemp(prefix="astra-bench-pyc-")
    out: dict[str, dict] = {}
    with LocalAstraeus(gpus=8) as ax:
        v = read_env(ax.home / "env")
        env = {k: val for k, val in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
        env.update(ASTRAEUS_API=v["API"], ASTRAEUS_TOKEN=v["ASTRAEUS_TOKEN"], PYTHONPYCACHEPREFIX=pyc,
                   ASTRAEUS_CONFIG=str(ax.home / "no-config.json"))
        # a finished run whose worker's output `logs` prints
        subprocess.run([astra, "astraeus", "run", "--name", "bench-logs", "--image", "python:3.11", "--", "python3",
                        "-c", "print('\\n'.join(map(str, range(100))))"], env=env, check=True, capture_output=True)
        deadline = time.time() + 60
        while ax.get("/runs/bench-logs")["status"]["state"] != "Completed" and time.time() < deadline:
            time.sleep(0.2)
        script = ax.home / "job.sh"
        script.write_text("#!/bin/sh\n#SBATCH --time=5\n#SBATCH --container-image=python:3.11\ntrue\n")
        out["python -c pass (floor)"] = timed([[sys.executable, "-c", "pass"]], env, a.n)[0]
        commands = {
            "astra --help": lambda x, k: lambda i: [x, "--help"],
            "astra astraeus run": lambda x, k: lambda i: [x, "astraeus", "run", "--name", f"bench-run-{k}-{i}",
                                                          "--image", "python:3.11", "--", "true"],
            "astra astraeus runs": lambda x, k: lambda i: [x, "astraeus", "runs"],
            "astra astraeus logs": lambda x, k: lambda i: [x, "astraeus", "logs", "bench-logs"],
            "astra slurm sbatch": lambda x, k: lambda i: [x, "slurm", "sbatch", f"--job-name=bench-sb-{k}-{i}",
                                                          str(script)],
            "astra slurm squeue": lambda x, k: lambda i: [x, "slurm", "squeue"],
        }
        for label, make in commands.items():
            for k, f in enumerate(timed([make(x, k) for k, x in enumerate(astras)], env, a.n)):
                out[label + (f" [{astras[k]}]" if len(astras) > 1 else "")] = f
        for k, x in enumerate(astras):
            loop = (f"for i in $(seq {a.loop}); do {x} slurm sbatch --job-name=loop-{k}-$i {script} >/dev/null "
                    "|| exit 1; done")
            t = time.perf_counter()
            subprocess.run(["bash", "-c", loop], env=env, check=True)
            out[f"{a.loop} x astra slurm sbatch (shell loop)" + (f" [{x}]" if len(astras) > 1 else "")] = {
                "total_s": time.perf_counter() - t}
    shutil.rmtree(pyc, ignore_errors=True)

    slurm_note = "left out (--no-slurm)"
    if not a.no_slurm:
        ok, why = slurm_env()
        slurm_note = why
        if ok:
            import slurm_peer

            senv = dict(os.environ)
            with tempfile.TemporaryDirectory() as d:
                sb = ["sbatch", "-o", "/dev/null", "-e", "/dev/null", "-D", d, "--wrap", "true"]
                out["slurm sbatch"] = timed([sb], senv, a.n)[0]
                out["slurm squeue"] = timed([["squeue"]], senv, a.n)[0]
                t = time.perf_counter()
                subprocess.run(["bash", "-c", f"for i in $(seq {a.loop}); do sbatch -o /dev/null -e /dev/null -D {d} "
                                              "--wrap true >/dev/null || exit 1; done"], check=True)
                out[f"{a.loop} x slurm sbatch (shell loop)"] = {"total_s": time.perf_counter() - t}
            slurm_peer.clear_slurm()

    print(f"astra: {', '.join(astras)}   runs of each: {a.n}   cpus: {os.cpu_count()}   load: {os.getloadavg()[0]:.2f}")
    width = max(len(k) for k in out) + 1
    print(f"{'command':{width}} {'p50 ms':>8} {'p90 ms':>8}")
    for label, f in out.items():
        if "total_s" in f:
            print(f"{label:{width}} {f['total_s']:>8.2f} s in all ({f['total_s'] / a.loop * 1000:.1f} ms a job)")
        else:
            print(f"{label:{width}} {f['p50']:>8.1f} {f['p90']:>8.1f}")
    if slurm_note:
        print(f"Slurm: {slurm_note}")
    if a.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
