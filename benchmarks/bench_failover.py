"""Control-plane failover: how long after the scheduling leader dies (SIGKILL) the next run is placed, over N
trials, and the submit rate with 1 and with 3 replicas, against real `astraeus server` processes on one
PostgreSQL database (the local one, a fresh database each part).

    .venv/bin/python benchmarks/bench_failover.py [--trials 20] [--runs 600] [--clients 8] [--lease SECONDS]

Failover: three replicas; each trial finds the leader (GET /healthz), SIGKILLs it, submits a run through another
replica at once and polls that run's worker until it is placed (`placed_at`); the killed replica is started
again before the next trial. One machine (8 GPUs) is played through the agent protocol by a thread that reports
every second, through whichever replica answers. The lease is the product's default unless --lease is given
(ASTRAEUS_LEADER_LEASE_SECONDS). Submit rate: N runs from C concurrent clients, spread over the replicas.

Prints the figures and the peers' takeover times. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_submit import free_port, read_env  # noqa: E402

BIN = Path(sys.executable).parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"

# The peers' takeover, as their documentation gives it.
PEERS = [
    ("Slurm (backup slurmctld)", 120.0, "SlurmctldTimeout, 120 s by default: the backup takes over after it"),
    ("Kubernetes (leader election)", 15.0, "kube-scheduler/kube-controller-manager --leader-elect-lease-duration "
                                           "15 s by default"),
]


class Replica:
    def __init__(self, home: Path, env: dict[str, str]):
        self.home, self.env, self.port = home, env, free_port()
        self.proc: subprocess.Popen | None = None
        self.vars: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "env").unlink(missing_ok=True)
        log = open(self.home / "server.log", "ab")
        self.proc = subprocess.Popen([str(BIN / "astraeus"), "server", "--home", str(self.home), "--port",
                                      str(self.port)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"astraeus server exited: {(self.home / 'server.log').read_text()[-2000:]}")
            if (self.home / "env").exists() and self.health():
                self.vars = self.vars or read_env(self.home / "env")
                return self
            time.sleep(0.05)
        raise SystemExit("astraeus server did not start: " + (self.home / "server.log").read_text()[-2000:])

    def health(self) -> dict | None:
        try:
            r = httpx.get(self.url + "/healthz", timeout=1)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()


class Plane:
    """n replicas on a fresh PostgreSQL database, and one machine played through the agent protocol."""

    def __init__(self, n: int, lease: float | None):
        self.db = "astraeus_bench_" + uuid.uuid4().hex[:8]
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {self.db}")
        env = dict(os.environ, ASTRAEUS_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.db}")
        if lease is not None:
            env["ASTRAEUS_LEADER_LEASE_SECONDS"] = str(lease)
        tmp = Path(tempfile.mkdtemp(prefix="bench-failover-"))
        self.replicas = [Replica(tmp / f"r{i}", env) for i in range(n)]
        for r in self.replicas:
            r.start()
        self.vars = self.replicas[0].vars
        self.credential: str | None = None
        self.stopping = threading.Event()
        self.agent("/register", {"name": "gpu-01", "gpus": 8, "cpu_cores": 4096, "memory_bytes": 1 << 44})
        self.thread = threading.Thread(target=self._agent_loop, daemon=True)
        self.thread.start()

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.proc and r.proc.poll() is None]

    def agent(self, path: str, body: dict | None = None, params: dict | None = None) -> dict:
        """One agent call through the first replica that answers."""
        token = self.credential or self.vars["ASTRAEUS_MACHINE_TOKEN"]
        for r in self.live():
            try:
                h = {"Authorization": f"Bearer {token}"}
                resp = (httpx.get(r.url + "/api/v1/agent" + path, params=params, headers=h, timeout=5)
                        if params is not None else
                        httpx.post(r.url + "/api/v1/agent" + path, json=body, headers=h, timeout=5))
            except httpx.HTTPError:
                continue
            if resp.status_code < 500:
                out = resp.json()
                if out.get("credential"):
                    self.credential = out["credential"]
                return out
        return {}

    def _agent_loop(self) -> None:
        """The machine's agent: every second, reports what it is asked to run as Running (and the rest ended)."""
        while not self.stopping.wait(1.0):
            got = self.agent("/assignments", params={"machine": "gpu-01", "wait": 0})
            workers = [{"worker": a["worker"], "attempt": a["attempt"], "pid": 1000, "state": "Running"}
                       if a["desired"] == "Running" else
                       {"worker": a["worker"], "attempt": a["attempt"], "state": "Exited", "exit_code": 0}
                       for a in got.get("assignments", [])]
            self.agent("/report", {"machine": "gpu-01", "workers": workers})

    def api(self, r: Replica) -> str:
        return r.url + "/" + self.vars["API"].split("/", 3)[3]

    def leader(self, timeout: float = 60) -> Replica:
        end = time.time() + timeout
        while time.time() < end:
            for r in self.live():
                h = r.health()
                if h and h.get("role") == "leader":
                    return r
            time.sleep(0.05)
        raise SystemExit("no replica leads")

    def close(self) -> None:
        self.stopping.set()
        for r in self.replicas:
            r.stop()
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")


def run_body(name: str, gpus: int = 0) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true",
        "requested_resources": {"cpu_cores": 0.1, "memory_bytes": 1 << 20, "gpu_requests": {"count": gpus}}}}}


def failover(trials: int, lease: float | None) -> list[float]:
    plane = Plane(3, lease)
    token = {"Authorization": f"Bearer {plane.vars['ASTRAEUS_TOKEN']}"}
    times: list[float] = []
    try:
        for i in range(trials):
            for r in plane.replicas:  # the one killed last trial, back as a follower
                if r.proc.poll() is not None:
                    r.start()
            old = plane.leader()
            time.sleep(0.5)
            other = next(r for r in plane.live() if r is not old)
            name = f"t{i}"
            t0 = time.perf_counter()
            old.kill9()
            resp = httpx.post(plane.api(other) + "/runs", json=run_body(name), headers=token, timeout=30)
            if resp.status_code != 201:
                raise SystemExit(f"submit failed: {resp.status_code} {resp.text}")
            while True:
                w = httpx.get(plane.api(other) + f"/workers/{name}-0", headers=token, timeout=30).json()
                if w.get("placed_at"):
                    break
                if time.perf_counter() - t0 > 120:
                    raise SystemExit(f"{name} not placed 120 s after the leader's death")
                time.sleep(0.02)
            dt = time.perf_counter() - t0
            times.append(dt)
            print(f"  trial {i + 1:>2}: leader {old.url} killed, {name} placed {dt:.2f} s later", flush=True)
    finally:
        plane.close()
    return times


def submit_rate(n_replicas: int, runs: int, clients: int, lease: float | None) -> dict:
    plane = Plane(n_replicas, lease)
    token = {"Authorization": f"Bearer {plane.vars['ASTRAEUS_TOKEN']}"}
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(runs))
    try:
        def client(k: int) -> None:
            base = plane.api(plane.replicas[k % n_replicas])
            with httpx.Client(base_url=base, headers=token, timeout=60) as h:
                for i in counter:
                    t0 = time.perf_counter()
                    r = h.post("/runs", json=run_body(f"s{i}", gpus=1 + i % 8))
                    dt = time.perf_counter() - t0
                    if r.status_code != 201:
                        raise SystemExit(f"submit failed: {r.status_code} {r.text}")
                    with lock:
                        latencies.append(dt)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        plane.close()
    lat = sorted(latencies)
    return {"replicas": n_replicas, "runs": len(lat), "rate": len(lat) / wall, "wall_s": wall,
            "p50_ms": statistics.median(lat) * 1000, "p99_ms": lat[max(0, int(len(lat) * 0.99) - 1)] * 1000}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--runs", type=int, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--lease", type=float, default=None,
                    help="ASTRAEUS_LEADER_LEASE_SECONDS for the replicas (default: the product's)")
    a = ap.parse_args()
    lease = f"{a.lease:g} s" if a.lease is not None else "the default"
    print(f"Failover: 3 replicas on PostgreSQL, lease {lease}, {a.trials} trials, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    times = failover(a.trials, a.lease)
    print(f"leader SIGKILL -> next placement: p50 {pct(times, 50):.2f} s, p99 {pct(times, 99):.2f} s, "
          f"min {min(times):.2f} s, max {max(times):.2f} s")
    print(f"Submit rate: {a.runs} runs from {a.clients} concurrent clients", flush=True)
    rates = [submit_rate(n, a.runs, a.clients, a.lease) for n in (1, 3)]
    print(f"{'replicas':<10}{'runs/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'wall s':>10}")
    for r in rates:
        print(f"{r['replicas']:<10}{r['rate']:>10.0f}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}{r['wall_s']:>10.1f}")
    print(f"ratio 3 replicas / 1 runs/s: {rates[1]['rate'] / rates[0]['rate']:.2f}")
    print("Peers, time until a standby takes over:")
    print(f"  {'Astraeus (this run, p99)':<32}{pct(times, 99):>8.2f} s")
    for name, seconds, why in PEERS:
        print(f"  {name:<32}{seconds:>8.0f} s   ({why})")


if __name__ == "__main__":
    main()
