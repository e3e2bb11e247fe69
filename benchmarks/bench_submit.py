"""The API's submit rate: runs accepted per second and the latency of each POST $API/runs, on SQLite and on
PostgreSQL, against a real `astraeus server` (its scheduling loop running, one machine registered so that
the runs queue on a real cluster).

    .venv/bin/python benchmarks/bench_submit.py [--runs 2000] [--clients 8]

Prints the figures for both databases and the ratio. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_env(path: Path) -> dict[str, str]:
    return {k.removeprefix("export "): v for k, _, v in
            (line.partition("=") for line in path.read_text().splitlines() if line.startswith("export "))}


def start_server(home: Path, database_url: str | None) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ)
    if database_url:
        env["ASTRAEUS_DATABASE_URL"] = database_url
    port = free_port()
    proc = subprocess.Popen([str(BIN / "astraeus"), "server", "--home", str(home), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        if (home / "env").exists():
            vars_ = read_env(home / "env")
            try:
                if httpx.get(vars_["ASTRAEUS_SERVER"] + "/healthz", timeout=1).status_code == 200:
                    return proc, vars_
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def measure(database: str, runs: int, clients: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"bench-submit-{database}-"))
    url = None
    if database == "postgresql":
        import psycopg

        name = "astraeus_bench_" + uuid.uuid4().hex[:8]
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    proc, v = start_server(home, url)
    try:
        # One machine joins (through the agent API, as an agent would), so runs queue on a real cluster.
        httpx.post(v["ASTRAEUS_SERVER"] + "/api/v1/agent/register", timeout=10,
                   headers={"Authorization": f"Bearer {v['ASTRAEUS_MACHINE_TOKEN']}"},
                   json={"name": "gpu-01", "gpus": 8, "cpu_cores": 64, "memory_bytes": 512 << 30})
        latencies: list[float] = []
        lock = threading.Lock()
        counter = iter(range(runs))

        def client() -> None:
            with httpx.Client(base_url=v["API"], headers={"Authorization": f"Bearer {v['ASTRAEUS_TOKEN']}"},
                              timeout=60) as h:
                for i in counter:
                    body = {"metadata": {"name": f"r{i}"}, "spec": {"priority": -(i % 3) * 10, "task_template": {
                        "image": "python:3.11", "command": "true",
                        "requested_resources": {"gpu_requests": {"count": 1 + i % 8}}}}}
                    t0 = time.perf_counter()
                    r = h.post("/runs", json=body)
                    dt = time.perf_counter() - t0
                    if r.status_code != 201:
                        raise SystemExit(f"submit failed: {r.status_code} {r.text}")
                    with lock:
                        latencies.append(dt)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        lat = sorted(latencies)
        return {"database": database, "runs": len(lat), "wall_s": wall, "rate": len(lat) / wall,
                "p50_ms": statistics.median(lat) * 1000, "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1000}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if url:
            import psycopg

            with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    print(f"API submit rate: {a.runs} runs from {a.clients} concurrent clients, {os.cpu_count()} cores")
    results = [measure(db, a.runs, a.clients) for db in ("sqlite", "postgresql")]
    print(f"{'database':<12}{'runs/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'wall s':>10}")
    for r in results:
        print(f"{r['database']:<12}{r['rate']:>10.0f}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}{r['wall_s']:>10.1f}")
    print(f"ratio postgresql/sqlite runs/s: {results[1]['rate'] / results[0]['rate']:.2f}")


if __name__ == "__main__":
    main()
