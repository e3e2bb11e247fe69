"""The API's submit rate beside Slurm's `sbatch`, measured the same way in the same run: N submits from C
concurrent clients, each client sending its next as soon as its last is answered; runs accepted per second and
the latency of each submit (p50/p99).

- Astraeus: a real `astraeus server` (its scheduling loop running, one 8-GPU machine registered through the agent
  API, so that the runs queue on a real cluster) takes `POST $API/runs` (one run, 1-8 GPUs, per request) on SQLite
  and on PostgreSQL; the clients are threads of this process with one keep-alive connection each (httpx).
- Slurm: the peer of benchmarks/slurm_peer.py (shared/peers/slurm/start.sh: root) takes `sbatch --hold` (held
  jobs: queued, never started, as the runs here wait behind a full machine) from C concurrent clients, each a
  thread that runs one sbatch process after another, as a person's script would; the jobs are cancelled after.
- `--was SRC`: the same Astraeus measurement with the server started from another checkout's `src` (e.g. a git
  worktree of an earlier commit), in the same run, for a before/after ratio: was, now, now, was on each database
  (the machine's load drifts; each pair's mean sees the same drift), each line printed, the pairs' means tabled.
- The server's CPU time per submit (psutil: user + system of the server process over the measured submits) is
  printed beside the rate: what a submit costs, whatever else shares the cores.

- `--processes N`: PostgreSQL also measured with `astraeus server --processes N` (SO_REUSEPORT replicas; the CPU
  is that of all N).

    .venv/bin/python benchmarks/bench_submit.py [--runs 1000] [--clients 8] [--slurm-jobs 500] [--was SRC]
                                                [--processes N] [--rounds N]

Prints a table and the ratios to Slurm. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_env(path: Path) -> dict[str, str]:
    return {k.removeprefix("export "): v for k, _, v in
            (line.partition("=") for line in path.read_text().splitlines() if line.startswith("export "))}


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[max(0, -(-len(s) * 99 // 100) - 1)]  # nearest rank


def figures(system: str, latencies: list[float], wall: float, cpu_s: float | None = None) -> dict:
    return {"system": system, "n": len(latencies), "wall_s": wall, "rate": len(latencies) / wall,
            "p50_ms": statistics.median(latencies) * 1000, "p99_ms": p99(latencies) * 1000,
            "cpu_ms": None if cpu_s is None else cpu_s * 1000 / max(1, len(latencies))}


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its children so far (user + system; `--processes`: the server's other processes):
    what it costs, whatever else shares the machine's cores."""
    import psutil

    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def hammer(n: int, clients: int, submit_factory) -> tuple[list[float], float]:
    """n submits from `clients` threads; submit_factory() gives each thread its submit(i) (and a close())."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(n))
    errors: list[str] = []
    ready = threading.Barrier(clients + 1)

    def client() -> None:
        submit, close = submit_factory()
        try:
            ready.wait()
            for i in counter:
                t0 = time.perf_counter()
                err = submit(i)
                dt = time.perf_counter() - t0
                if err:
                    errors.append(err)
                    return
                with lock:
                    latencies.append(dt)
        finally:
            close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"submit failed: {errors[0]}")
    return latencies, wall


# ------------------------------------------------------------------------------------------------ Astraeus


def start_server(home: Path, database_url: str | None, src: str | None,
                 processes: int = 1) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ)
    if database_url:
        env["ASTRAEUS_DATABASE_URL"] = database_url
    if src:
        env["PYTHONPATH"] = src  # ahead of the editable install: the server runs that checkout's code
        if "uvloop" not in (Path(src).parent / "pyproject.toml").read_text():
            # a checkout from before uvloop and httptools were dependencies: its server runs as it did then
            # (uvicorn's "auto" would pick them up from this virtualenv), on asyncio's loop and h11
            env["PYTHONPATH"] = f"{_without_uvloop()}{os.pathsep}{src}"
    port = free_port()
    more = ["--processes", str(processes)] if processes > 1 else []
    proc = subprocess.Popen([str(BIN / "astraeus"), "server", "--home", str(home), "--port", str(port), *more], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "a"))
    deadline = time.time() + 60
    while time.time() < deadline:
        if (home / "env").exists():
            vars_ = read_env(home / "env")
            if "ASTRAEUS_SERVER" not in vars_:  # the file is being written
                time.sleep(0.1)
                continue
            try:
                if httpx.get(vars_["ASTRAEUS_SERVER"] + "/healthz", timeout=1).status_code == 200:
                    return proc, vars_
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def _without_uvloop() -> str:
    """A folder whose uvloop and httptools fail to import (uvicorn then falls back to asyncio and h11)."""
    d = Path(tempfile.gettempdir()) / "bench-submit-without-uvloop"
    d.mkdir(exist_ok=True)
    for name in ("uvloop", "httptools"):
        (d / f"{name}.py").write_text(f"raise ImportError('{name}: not a dependency of this checkout')\n")
    return str(d)


def measure_astraeus(database: str, runs: int, clients: int, src: str | None = None, label: str = "",
                     processes: int = 1) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"bench-submit-{database}-"))
    url = None
    if database == "postgresql":
        import psycopg

        name = "astraeus_bench_" + uuid.uuid4().hex[:8]
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    proc, v = start_server(home, url, src, processes if database == "postgresql" else 1)
    try:
        # One machine joins (through the agent API, as an agent would), so runs queue on a real cluster.
        httpx.post(v["ASTRAEUS_SERVER"] + "/api/v1/agent/register", timeout=10,
                   headers={"Authorization": f"Bearer {v['ASTRAEUS_MACHINE_TOKEN']}"},
                   json={"name": "gpu-01", "gpus": 8, "cpu_cores": 64, "memory_bytes": 512 << 30})

        def factory():
            h = httpx.Client(base_url=v["API"], headers={"Authorization": f"Bearer {v['ASTRAEUS_TOKEN']}"},
                             timeout=60)

            def submit(i: int) -> str | None:
                body = {"metadata": {"name": f"r{i}"}, "spec": {"priority": -(i % 3) * 10, "task_template": {
                    "image": "python:3.11", "command": "true",
                    "requested_resources": {"gpu_requests": {"count": 1 + i % 8}}}}}
                r = h.post("/runs", json=body)
                return None if r.status_code == 201 else f"{r.status_code} {r.text}"

            return submit, h.close

        hammer(min(50, runs), clients, factory)  # warm-up: connections, the first cycles (not counted)
        c0 = cpu_seconds(proc.pid)
        lat, wall = hammer(runs, clients, lambda: _offset(factory, 1_000_000))
        return figures(f"Astraeus {database}{label}", lat, wall, cpu_seconds(proc.pid) - c0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
        if url:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


def mean_of(a: dict, b: dict) -> dict:
    """Two measurements of one system as one row (the mean of each figure; n and wall summed)."""
    return {"system": a["system"] + " (2)", "n": a["n"] + b["n"], "wall_s": a["wall_s"] + b["wall_s"],
            **{k: (a[k] + b[k]) / 2 for k in ("rate", "p50_ms", "p99_ms", "cpu_ms")}}


def _offset(factory, k: int):
    submit, close = factory()
    return (lambda i: submit(i + k)), close


# --------------------------------------------------------------------------------------------------- Slurm


def measure_slurm(jobs: int, clients: int) -> dict:
    sys.path.insert(0, str(HERE))
    from slurm_peer import clear_slurm, start_slurm

    start_slurm()
    clear_slurm()
    d = Path(tempfile.mkdtemp(prefix="slurm-submit-"))
    cmd = ["sbatch", "--hold", "--parsable", "-p", "high", "--gres=gpu:1", "-o", "/dev/null", "-e", "/dev/null",
           "-D", str(d), "--wrap", "true"]

    def factory():
        def submit(i: int) -> str | None:
            r = subprocess.run(cmd, capture_output=True, text=True)
            return None if r.returncode == 0 else f"sbatch: {r.stderr.strip()}"

        return submit, lambda: None

    try:
        hammer(min(20, jobs), clients, factory)  # warm-up (not counted)
        lat, wall = hammer(jobs, clients, factory)
    finally:
        clear_slurm()
        shutil.rmtree(d, ignore_errors=True)
    return figures("Slurm sbatch --hold", lat, wall)


def one_round(a, dbs: list[str]) -> tuple[list[dict], float | None]:
    """Slurm, each database (with --was: was, now, now, was), Slurm again; prints the table and the ratios.
    Returns (every row, Slurm's mean rate: None without Slurm)."""
    results: list[dict] = []
    slurm = []
    if a.slurm_jobs:
        slurm.append(measure_slurm(a.slurm_jobs, a.clients))
        results.append(slurm[-1])
    for db in dbs:
        if a.was:  # was, now, now, was: the machine's load drifts, and each pair's mean sees the same drift
            pair = [measure_astraeus(db, a.runs, a.clients, a.was, " (was)"), measure_astraeus(db, a.runs, a.clients),
                    measure_astraeus(db, a.runs, a.clients), measure_astraeus(db, a.runs, a.clients, a.was, " (was)")]
            for r in pair:
                print(f"  {r['system']}: {r['rate']:.0f}/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                      f"server CPU {r['cpu_ms']:.1f} ms per submit, load {os.getloadavg()[0]:.1f}", flush=True)
            results += [mean_of(pair[0], pair[3]), mean_of(pair[1], pair[2])]
        else:
            results.append(measure_astraeus(db, a.runs, a.clients))
        if db == "postgresql" and a.processes > 1:
            results.append(measure_astraeus(db, a.runs, a.clients, label=f" ({a.processes} processes)",
                                            processes=a.processes))
    if a.slurm_jobs:  # again at the end: the load on a shared machine drifts
        slurm.append(measure_slurm(a.slurm_jobs, a.clients))
        results.append(slurm[-1])
    print(f"{'system':<30}{'n':>6}{'per s':>9}{'p50 ms':>9}{'p99 ms':>9}{'wall s':>8}{'CPU ms/submit':>15}")
    for r in results:
        cpu = "" if r.get("cpu_ms") is None else f"{r['cpu_ms']:.1f}"
        print(f"{r['system']:<30}{r['n']:>6}{r['rate']:>9.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
              f"{r['wall_s']:>8.1f}{cpu:>15}")
    ref = statistics.mean(s["rate"] for s in slurm) if slurm else None
    if ref:
        print(f"ratio to Slurm's sbatch ({ref:.0f}/s, the mean of its two measurements):")
        for r in results:
            if not r["system"].startswith("Slurm"):
                print(f"  {r['system']:<28}{r['rate'] / ref:>6.2f}x")
    print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    return results, ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--slurm-jobs", type=int, default=500, help="0: no Slurm (e.g. not root)")
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--was", help="also measure a server started from this checkout's src (before/after)")
    ap.add_argument("--processes", type=int, default=1,
                    help="PostgreSQL: also measure `astraeus server --processes N` (this checkout), after the rest")
    ap.add_argument("--rounds", type=int, default=1,
                    help="the whole measurement N times, one after the other; then each system's ratio to sbatch "
                         "(its round's) and p99, median and range over the rounds (this machine's speed moves)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds: give a number of rounds >= 1")
    load = os.getloadavg()[0]
    print(f"Submit rate: {a.runs} runs (Slurm: {a.slurm_jobs} held jobs) from {a.clients} concurrent clients, "
          f"{os.cpu_count()} cores, load average {load:.1f} at the start", flush=True)
    dbs = [d for d in a.databases.split(",") if d]
    ratios: dict[str, list[float]] = {}
    p99s: dict[str, list[float]] = {}
    for k in range(a.rounds):
        if a.rounds > 1:
            print(f"-- round {k + 1} of {a.rounds}", flush=True)
        results, ref = one_round(a, dbs)
        for r in results:
            if not r["system"].startswith("Slurm"):
                p99s.setdefault(r["system"], []).append(r["p99_ms"])
                if ref:
                    ratios.setdefault(r["system"], []).append(r["rate"] / ref)
    if a.rounds > 1:
        print(f"over {a.rounds} rounds, median (range): ratio to its round's sbatch; p99 ms")
        for system, ps in p99s.items():
            rs = ratios.get(system, [])
            ratio = f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"
            print(f"  {system:<28} {ratio:<22} {statistics.median(ps):.1f} ({min(ps):.1f}-{max(ps):.1f})")


if __name__ == "__main__":
    main()
