"""A fleet's agents against one control plane: N lightweight agents (asyncio + httpx, many per process) speak the
real agent protocol to one `astraeus server` on the local PostgreSQL (a fresh database), and the benchmark
measures what they cost the control plane and how fast they hear of their work.

    .venv/bin/python benchmarks/bench_agents.py --agents 100 [--idle 60] [--heartbeat 5] [--poll-wait 30]
    .venv/bin/python benchmarks/bench_agents.py --quick          # 50 agents, short phases: well under 2 minutes
    .venv/bin/python benchmarks/bench_agents.py --agents 400 --src /tmp/was/src   # the server of another checkout
    .venv/bin/python benchmarks/bench_agents.py --agents 1000 --procs 4           # the agents in 4 processes

The agents run in --procs child processes (default: at most 250 agents in each), each on its own asyncio loop,
driven over a pipe by this process, which starts the server, runs the phases, submits, probes the API and reads
the database; with --procs 1 they run on this process's own loop (one process alone cannot drive 1,000 agents).

Each agent is what `astraeus agent` does on the wire, minus running anything: it registers with the join token
(and keeps the machine credential the answer gives), long-polls GET /api/v1/agent/assignments with `after` = the
version it last saw and `wait` = --poll-wait, and POSTs /api/v1/agent/report at least every heartbeat and at once
when its assignments change: a new Running assignment is reported Running (pid given), a Stopped one Exited.

Phases:
1. register: N machines (8 GPUs each) join, 50 at a time;
2. idle: every agent long-polls and heartbeats for --idle seconds; the control plane's CPU time (psutil, the
   server process and its children; separately the PostgreSQL backends serving its database) over that window,
   per agent per minute; a probe (GET $API/events?limit=1, a user's API call) every 0.5 s times the API meanwhile;
3. placement: N one-worker runs of 8 GPUs are submitted (8 concurrent clients), each fits one machine; for every
   worker, the time from its placement (workers.placed_at, read from the database: the API shows whole seconds)
   to the moment its agent's long-poll answer held the assignment, p50/p99/max; and the same CPU and probe figures.

What breaks first is printed as seen: requests that failed or timed out, by endpoint; long-polls answered late
(after wait + 5 s, when a real agent gives up on the replica); reports slower than a heartbeat; machines the
control plane marked Lost; the probe's p99. It is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import PG_ADMIN, Replica, read_env  # noqa: E402

GPUS = 8


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


class Stats:
    """What the agents and the probe saw, by endpoint."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.late_polls = 0
        self.slow_reports = 0
        self.seen: dict[str, float] = {}  # worker name -> when its agent's answer held it

    def error(self, what: str, why: str) -> None:
        self.errors[what][why] += 1

    def reset(self) -> None:
        self.latency.clear()
        self.errors.clear()
        self.late_polls = self.slow_reports = 0

    def snapshot(self) -> dict:
        """Plain data, to send over a pipe."""
        return {"latency": dict(self.latency), "errors": {k: dict(v) for k, v in self.errors.items()},
                "late_polls": self.late_polls, "slow_reports": self.slow_reports, "seen": dict(self.seen)}

    def add(self, snap: dict) -> None:
        """Add what another process's agents saw."""
        for what, xs in snap["latency"].items():
            self.latency[what] += xs
        for what, whys in snap["errors"].items():
            for why, n in whys.items():
                self.errors[what][why] += n
        self.late_polls += snap["late_polls"]
        self.slow_reports += snap["slow_reports"]
        self.seen.update(snap["seen"])


class Agent:
    """One machine's agent on the wire: long-poll, report on change and every heartbeat."""

    def __init__(self, group: Agents, name: str, index: int):
        self.group, self.name, self.index = group, name, index
        self.credential: str | None = None
        self.version = 0
        self.heartbeat = group.heartbeat
        self.states: dict[tuple[str, int], str] = {}
        self.changed = asyncio.Event()

    def h(self) -> dict:
        return {"Authorization": f"Bearer {self.credential or self.group.join_token}"}

    async def register(self, client: httpx.AsyncClient) -> None:
        t0 = time.perf_counter()
        r = await client.post("/api/v1/agent/register", headers=self.h(), json={
            "name": self.name, "gpus": GPUS, "gpu_models": ["NVIDIA H100 80GB HBM3"], "cpu_cores": 128,
            "memory_bytes": 1 << 40, "stop_grace_seconds": 1, "runtime": "process",
            "address": f"10.{self.index // 250}.{self.index % 250}.1"})
        self.group.stats.latency["register"].append(time.perf_counter() - t0)
        r.raise_for_status()
        ans = r.json()
        self.credential = ans["credential"] or self.credential
        self.heartbeat = ans["heartbeat_seconds"]

    async def poll_loop(self) -> None:
        async with self.group.client() as client:
            await self._poll(client)

    async def report_loop(self) -> None:
        async with self.group.client() as client:
            await self._report(client)

    async def _poll(self, client: httpx.AsyncClient) -> None:
        g, wait = self.group, self.group.poll_wait
        while not g.stopping:
            t0 = time.perf_counter()
            try:
                r = await client.get("/api/v1/agent/assignments", headers=self.h(), timeout=wait + 5,
                                     params={"machine": self.name, "after": self.version, "wait": wait})
            except httpx.TimeoutException:
                g.stats.error("assignments", "timeout (no answer within wait + 5 s)")
                g.stats.late_polls += 1
                continue
            except httpx.HTTPError as e:
                g.stats.error("assignments", type(e).__name__)
                await asyncio.sleep(1)
                continue
            seen = time.time()
            if r.status_code != 200:
                g.stats.error("assignments", str(r.status_code))
                await asyncio.sleep(1)
                continue
            data = r.json()
            self.version = data["version"]
            assigned = set()
            for a in data["assignments"]:
                key = (a["worker"], a["attempt"])
                assigned.add(key)
                if a["desired"] == "Running" and key not in self.states:
                    self.states[key] = "Running"
                    g.stats.seen.setdefault(a["name"], seen)
                    self.changed.set()
                elif a["desired"] == "Stopped" and self.states.get(key) != "Exited":
                    self.states[key] = "Exited"
                    self.changed.set()
            for key in set(self.states) - assigned:
                del self.states[key]
            if time.perf_counter() - t0 > wait + 5:
                g.stats.late_polls += 1

    async def _report(self, client: httpx.AsyncClient) -> None:
        g = self.group
        # Real machines' heartbeats are spread over the period (they started at different times): so here.
        await asyncio.sleep(random.uniform(0, self.heartbeat))
        self.changed.set()
        while not g.stopping:
            try:
                await asyncio.wait_for(self.changed.wait(), self.heartbeat)
            except TimeoutError:
                pass
            self.changed.clear()
            if g.stopping:
                return
            workers = [{"worker": w, "attempt": att, "state": st, "pid": 1000 + att,
                        **({"exit_code": 0} if st == "Exited" else {})} for (w, att), st in self.states.items()]
            t0 = time.perf_counter()
            try:
                r = await client.post("/api/v1/agent/report", headers=self.h(), timeout=30,
                                      json={"machine": self.name, "workers": workers})
            except httpx.HTTPError as e:
                g.stats.error("report", type(e).__name__)
                self.changed.set()
                await asyncio.sleep(1)
                continue
            dt = time.perf_counter() - t0
            g.stats.latency["report"].append(dt)
            if dt > self.heartbeat:
                g.stats.slow_reports += 1
            if r.status_code != 200:
                g.stats.error("report", str(r.status_code))


class Agents:
    """Some of the fleet's agents, on one asyncio loop (this process's or a child process's), and what they saw."""

    def __init__(self, base: str, join_token: str, first: int, n: int, heartbeat: float, poll_wait: float,
                 joining: int):
        self.base, self.join_token, self.heartbeat, self.poll_wait = base, join_token, heartbeat, poll_wait
        self.joining = joining  # how many of these agents register at a time
        self.stats = Stats()
        self.stopping = False
        self.ssl = ssl.create_default_context()
        self.agents = [Agent(self, f"m{i:05d}", i) for i in range(first, first + n)]
        self.tasks: list[asyncio.Task] = []

    def client(self) -> httpx.AsyncClient:
        """An HTTP client of its own for each agent's loop, as `astraeus agent` has (one connection pool shared by
        thousands of requests costs httpcore time quadratic in them, and the load generator becomes the limit)."""
        return httpx.AsyncClient(base_url=self.base, timeout=60, verify=self.ssl)  # one TLS context for all

    async def register(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        sem = asyncio.Semaphore(self.joining)
        async with httpx.AsyncClient(base_url=self.base, limits=limits, timeout=60, verify=self.ssl) as client:

            async def join(ag: Agent) -> None:
                async with sem:
                    for _ in range(5):  # a refused or reset connection is counted, and tried again
                        try:
                            await ag.register(client)
                            return
                        except httpx.HTTPError as e:
                            self.stats.error("register", type(e).__name__)
                            await asyncio.sleep(1)

            await asyncio.gather(*(join(ag) for ag in self.agents))

    def start(self) -> None:
        self.tasks = [asyncio.create_task(ag.poll_loop()) for ag in self.agents]
        self.tasks += [asyncio.create_task(ag.report_loop()) for ag in self.agents]

    async def stop(self) -> None:
        self.stopping = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def handle(agents: Agents, command: str):
    """What the main process asks of a group of agents; the answer goes back to it."""
    if command == "register":
        await agents.register()
    elif command == "start":
        agents.start()
    elif command == "reset":
        agents.stats.reset()
    elif command == "stats":
        return agents.stats.snapshot()
    elif command == "seen":
        return dict(agents.stats.seen)
    elif command == "stop":
        await agents.stop()
    else:
        raise ValueError(f"unknown command {command!r}")
    return None


def agent_process(conn, group: dict) -> None:
    """A child process: its agents on its own loop, each command from the pipe answered on it, until "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle: it stops us

    async def serve() -> None:
        agents = Agents(**group)
        while True:
            command = await asyncio.to_thread(conn.recv)
            conn.send(await handle(agents, command))
            if command == "stop":
                return

    asyncio.run(serve())


class Here:
    """A group of agents on this process's loop (--procs 1)."""

    def __init__(self, group: dict):
        self.agents = Agents(**group)
        self.pid = os.getpid()

    async def ask(self, command: str):
        return await handle(self.agents, command)

    def close(self) -> None:
        pass


class Child:
    """A group of agents in a child process, driven over a pipe."""

    def __init__(self, group: dict):
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=agent_process, args=(theirs, group), daemon=True)
        self.proc.start()
        theirs.close()
        self.pid = self.proc.pid

    async def ask(self, command: str):
        self.conn.send(command)
        return await asyncio.to_thread(self.conn.recv)

    def close(self) -> None:
        self.proc.join(timeout=5)  # after "stop" it ends by itself; after an interruption it is ended here
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


class Servers(Replica):
    """`astraeus server --processes N` (N > 1: N replicas on the one port; their CPU is counted together)."""

    def __init__(self, home: Path, env: dict[str, str], processes: int = 1):
        super().__init__(home, env)
        self.processes = processes

    def start(self) -> Replica:
        if self.processes == 1:
            return super().start()
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "env").unlink(missing_ok=True)
        log = open(self.home / "server.log", "ab")
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "astraeus"), "server", "--home",
                                      str(self.home), "--port", str(self.port), "--processes", str(self.processes)],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"astraeus server exited: {(self.home / 'server.log').read_text()[-2000:]}")
            if (self.home / "env").exists() and self.health():
                self.vars = self.vars or read_env(self.home / "env")
                return self
            time.sleep(0.05)
        raise SystemExit("astraeus server did not start: " + (self.home / "server.log").read_text()[-2000:])


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.n, self.heartbeat, self.poll_wait, self.procs = a.agents, a.heartbeat, a.poll_wait, a.procs
        self.stats = Stats()  # this process's own: the API probe and the submits
        self.groups: list[Here | Child] = []
        self.db = "astraeus_bench_" + uuid.uuid4().hex[:8]
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {self.db}")
        self.db_url = f"postgresql://postgres@127.0.0.1:5432/{self.db}"
        env = dict(os.environ, ASTRAEUS_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.db}",
                   ASTRAEUS_HEARTBEAT=str(a.heartbeat))
        if a.src:
            env["PYTHONPATH"] = a.src  # ahead of the editable install: the server runs that checkout's code
        self.server = Servers(Path(tempfile.mkdtemp(prefix="bench-agents-")), env, a.server_processes).start()
        self.base = self.server.url
        self.join_token = self.server.vars["ASTRAEUS_MACHINE_TOKEN"]
        self.api = self.server.vars["API"].split("/", 3)[3]
        self.user = {"Authorization": f"Bearer {self.server.vars['ASTRAEUS_TOKEN']}"}
        self.ssl = ssl.create_default_context()
        # the agents, split evenly over the processes (m00000 … in order); 50 register at a time in all
        sizes = [self.n // self.procs + (i < self.n % self.procs) for i in range(self.procs)]
        firsts = [sum(sizes[:i]) for i in range(self.procs)]
        groups = [{"base": self.base, "join_token": self.join_token, "first": first, "n": size,
                   "heartbeat": self.heartbeat, "poll_wait": self.poll_wait, "joining": math.ceil(50 / self.procs)}
                  for first, size in zip(firsts, sizes, strict=True)]
        self.groups = [Here(groups[0])] if self.procs == 1 else [Child(g) for g in groups]

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, timeout=60, verify=self.ssl)

    async def ask(self, command: str) -> list:
        """The same command to every group of agents at once; their answers."""
        return await asyncio.gather(*(g.ask(command) for g in self.groups))

    async def agent_stats(self) -> Stats:
        """What every agent saw since the last reset, and this process's own figures, together."""
        st = Stats()
        st.add(self.stats.snapshot())
        for snap in await self.ask("stats"):
            st.add(snap)
        return st

    async def seen(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in await self.ask("seen"):
            out.update(s)
        return out

    async def reset(self) -> None:
        self.stats.reset()
        await self.ask("reset")

    # ---------------------------------------------------------------------------------------- measuring
    def cpu(self) -> tuple[float, dict[int, float]]:
        """CPU seconds so far: the server process (and children), and the PostgreSQL backends of its database."""
        p = psutil.Process(self.server.proc.pid)
        procs = [p, *p.children(recursive=True)]
        server = 0.0
        for q in procs:
            try:
                t = q.cpu_times()
                server += t.user + t.system
            except psutil.Error:
                pass
        return server, self.pg_cpu()

    def agents_cpu(self) -> float:
        """CPU seconds so far of this process and the agents' processes."""
        pids = {os.getpid(), *(g.pid for g in self.groups)}
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)

    def pg_cpu(self) -> dict[int, float]:
        """CPU seconds of each PostgreSQL backend serving the benchmark's database now, by pid."""
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            pids = [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.db,))]
        out = {}
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
                out[pid] = t.user + t.system
            except psutil.Error:
                pass
        return out

    @staticmethod
    def pg_delta(before: dict[int, float], after: dict[int, float]) -> float:
        """The backends' CPU between two looks (a backend that ended meanwhile is not counted: the pool keeps
        its connections, so few do)."""
        return sum(t - before.get(pid, 0.0) for pid, t in after.items())

    def sql(self, query: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.db_url, autocommit=True) as c:
            return list(c.execute(query))

    async def probe(self, client: httpx.AsyncClient, until: asyncio.Event) -> None:
        """A user's cheap API call every 0.5 s: how long the API answers while the agents talk."""
        while not until.is_set():
            t0 = time.perf_counter()
            try:
                r = await client.get(f"/{self.api}/events", params={"limit": 1}, headers=self.user, timeout=60)
                if r.status_code != 200:
                    self.stats.error("probe (GET $API/events)", str(r.status_code))
            except httpx.HTTPError as e:
                self.stats.error("probe (GET $API/events)", type(e).__name__)
            self.stats.latency["probe"].append(time.perf_counter() - t0)
            try:
                await asyncio.wait_for(until.wait(), 0.5)
            except TimeoutError:
                pass

    # ------------------------------------------------------------------------------------------- phases
    async def main(self, idle: float, settle_timeout: float) -> dict:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        out: dict = {}
        async with (httpx.AsyncClient(base_url=self.base, limits=limits, timeout=60) as client,
                    self.client() as probe_client):
            await self.ask("reset")  # (every agents' process is up and answering)
            t0 = time.perf_counter()
            await self.ask("register")
            reg = time.perf_counter() - t0
            st = await self.agent_stats()
            out["register_errors"] = {k: dict(v) for k, v in st.errors.items()}
            if out["register_errors"]:
                print(f"  register: errors {out['register_errors']}", flush=True)
            out["register"] = {"wall_s": reg, "rate": self.n / reg, "p99_ms": pct(st.latency["register"], 99)
                               * 1000}
            print(f"  registered {self.n} machines in {reg:.1f} s ({self.n / reg:.0f}/s, p99 "
                  f"{out['register']['p99_ms']:.0f} ms)", flush=True)

            await self.ask("start")
            await asyncio.sleep(min(10.0, 2 + self.n / 100))  # every agent's first answer and report
            await self.reset()

            # idle: long-polls and heartbeats only
            out["idle"] = await self.window(probe_client, idle, "idle", None)

            # placement: N one-machine runs, one per machine
            await self.reset()
            out["placement"] = await self.window(probe_client, None, "placement", (client, settle_timeout))

            await self.ask("stop")
        out["lost"] = self.sql("SELECT count(*) FROM machines WHERE state <> 'Ready'")[0][0]
        return out

    async def window(self, probe_client: httpx.AsyncClient, seconds: float | None, label: str,
                     placement: tuple[httpx.AsyncClient, float] | None) -> dict:
        done = asyncio.Event()
        probe = asyncio.create_task(self.probe(probe_client, done))
        c_me0 = self.agents_cpu()
        s0, pg0 = self.cpu()
        t0 = time.perf_counter()
        res: dict = {}
        if placement is None:
            await asyncio.sleep(seconds)
        else:
            res.update(await self.place(*placement))
        wall = time.perf_counter() - t0
        s1, pg1 = self.cpu()
        pg = self.pg_delta(pg0, pg1)
        c_me1 = self.agents_cpu()
        done.set()
        await probe
        st = await self.agent_stats()
        res["not_ready"] = self.sql("SELECT count(*) FROM machines WHERE state <> 'Ready'")[0][0]
        res.update({
            "wall_s": wall, "server_cpu_s": s1 - s0, "pg_cpu_s": pg, "bench_cpu_s": c_me1 - c_me0,
            "server_cpu_ms_per_agent_min": (s1 - s0) * 1000 / self.n / (wall / 60),
            "pg_cpu_ms_per_agent_min": pg * 1000 / self.n / (wall / 60),
            "server_cores": (s1 - s0) / wall,
            "report_p50_ms": pct(st.latency["report"], 50) * 1000,
            "report_p99_ms": pct(st.latency["report"], 99) * 1000,
            "reports_per_s": len(st.latency["report"]) / wall,
            "probe_p50_ms": pct(st.latency["probe"], 50) * 1000, "probe_p99_ms": pct(st.latency["probe"], 99) * 1000,
            "probe_max_ms": max(st.latency["probe"] or [float("nan")]) * 1000,
            "late_polls": st.late_polls, "slow_reports": st.slow_reports,
            "errors": {k: dict(v) for k, v in st.errors.items()},
        })
        print(f"  {label}: {wall:.1f} s, control plane {res['server_cores']:.2f} cores "
              f"({res['server_cpu_ms_per_agent_min']:.1f} ms CPU per agent per minute; PostgreSQL backends "
              f"{res['pg_cpu_ms_per_agent_min']:.1f}), reports {res['reports_per_s']:.0f}/s p99 "
              f"{res['report_p99_ms']:.0f} ms, API probe p50 {res['probe_p50_ms']:.0f} / p99 "
              f"{res['probe_p99_ms']:.0f} ms, late long-polls {st.late_polls}, errors {res['errors'] or 'none'}; the "
              f"agents' own process{'es' if self.procs > 1 else ''} {res['bench_cpu_s'] / wall:.2f} cores, load {os.getloadavg()[0]:.1f}; machines not "
              f"Ready {res['not_ready']}",
              flush=True)
        return res

    async def place(self, client: httpx.AsyncClient, settle_timeout: float) -> dict:
        names = [f"p{i:05d}" for i in range(self.n)]
        it = iter(names)
        submit_lat: list[float] = []
        submitted_names: list[str] = []
        deadline = time.perf_counter() + settle_timeout  # submitting and seeing together: a phase that never ends
        # (the control plane too slow to take the runs) still ends, with what was seen by then

        async def submitter() -> None:
            for name in it:
                if time.perf_counter() > deadline:
                    return
                body = {"metadata": {"name": name}, "spec": {"task_template": {
                    "image": "python:3.11", "command": "sleep", "args": ["3600"],
                    "requested_resources": {"gpu_requests": {"count": GPUS}}}}}
                for _ in range(3):  # a connection error is retried (409: the first try went in)
                    t0 = time.perf_counter()
                    try:
                        r = await client.post(f"/{self.api}/runs", json=body, headers=self.user, timeout=60)
                    except httpx.HTTPError as e:
                        self.stats.error("submit", type(e).__name__)
                        continue
                    submit_lat.append(time.perf_counter() - t0)
                    if r.status_code not in (201, 409):
                        self.stats.error("submit", str(r.status_code))
                    else:
                        submitted_names.append(name)
                    break

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(8)))
        submitted = time.perf_counter() - t0
        workers = {f"{n}-0" for n in submitted_names}
        seen = await self.seen()
        while time.perf_counter() < deadline and not workers <= seen.keys():
            await asyncio.sleep(0.2)
            seen = await self.seen()
        all_seen = time.perf_counter() - t0
        placed = dict(self.sql("SELECT name, placed_at FROM workers WHERE placed_at IS NOT NULL"))
        lat = [seen[w] - placed[w] for w in workers if w in placed and w in seen]
        res = {"runs": self.n, "submitted": len(submitted_names), "submit_s": submitted, "submit_p99_ms": pct(submit_lat, 99) * 1000,
               "placed": sum(w in placed for w in workers), "seen": len(lat), "all_seen_s": all_seen,
               "seen_p50_ms": pct(lat, 50) * 1000, "seen_p99_ms": pct(lat, 99) * 1000,
               "seen_max_ms": max(lat or [float("nan")]) * 1000}
        print(f"  placement: {len(submitted_names)}/{self.n} runs submitted in {submitted:.1f} s; {res['placed']} placed, {res['seen']} seen "
              f"by their agents {all_seen:.1f} s after the first submit; placement -> agent sees it: p50 "
              f"{res['seen_p50_ms']:.0f} ms, p99 {res['seen_p99_ms']:.0f} ms, max {res['seen_max_ms']:.0f} ms",
              flush=True)
        return res

    def close(self) -> None:
        for g in self.groups:
            g.close()
        self.server.stop()
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=100, help="how many agents (machines); e.g. 100, 300, 1000")
    ap.add_argument("--idle", type=float, default=60.0, help="seconds of the idle window")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="ASTRAEUS_HEARTBEAT for the server (default 5 s)")
    ap.add_argument("--poll-wait", type=float, default=30.0, help="the agents' long-poll wait (the agent's: 30 s)")
    ap.add_argument("--settle", type=float, default=180.0,
                    help="the longest the placement phase lasts (submitting, and waiting for every worker to be seen)")
    ap.add_argument("--procs", type=int, help="processes running the agents (default: at most 250 agents in each; "
                                              "1: the agents on this process's own loop)")
    ap.add_argument("--server-processes", type=int, default=1,
                    help="`astraeus server --processes N`: N replicas of the control plane on its one port")
    ap.add_argument("--quick", action="store_true", help="50 agents, a 15 s idle window")
    ap.add_argument("--src", help="start the server from this checkout's src (e.g. a git worktree of an earlier "
                                  "commit), for a before/after")
    a = ap.parse_args()
    if a.quick:
        a.agents, a.idle, a.settle = 50, 15.0, 60.0
    a.procs = max(1, min(a.procs or math.ceil(a.agents / 250), a.agents))
    procs = "one process" if a.procs == 1 else f"{a.procs} processes"
    servers = f" ({a.server_processes} server processes)" if a.server_processes > 1 else ""
    print(f"{a.agents} agents ({procs}) against one control plane{servers} on PostgreSQL"
          f"{' from ' + a.src if a.src else ''}; "
          f"heartbeat {a.heartbeat:g} s, long-poll wait {a.poll_wait:g} s; {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    bench = Bench(a)
    # SIGTERM (e.g. `timeout`) ends the run like Ctrl-C: the server stopped and its database dropped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        out = asyncio.run(bench.main(a.idle, a.settle))
    finally:
        bench.close()
    idle, pl = out["idle"], out["placement"]
    print(f"\nagents {a.agents}: idle {idle['server_cpu_ms_per_agent_min']:.1f} ms server CPU per agent per minute "
          f"(+{idle['pg_cpu_ms_per_agent_min']:.1f} PostgreSQL), {idle['server_cores']:.2f} cores; placement -> seen "
          f"p99 {pl['seen_p99_ms']:.0f} ms ({pl['seen']}/{pl['runs']} seen, {pl['submitted']} submitted); API probe p99 idle "
          f"{idle['probe_p99_ms']:.0f} ms, placing {pl['probe_p99_ms']:.0f} ms; machines not Ready at the end: "
          f"{out['lost']}")
    broke = [f"{k} (registering): {v}" for k, v in out["register_errors"].items()]
    broke += [f"{k}: {v}" for ph in ("idle", "placement") for k, v in out[ph]["errors"].items()]
    broke += [f"{ph}: {out[ph]['late_polls']} long-polls answered later than wait + 5 s"
              for ph in ("idle", "placement") if out[ph]["late_polls"]]
    broke += [f"{ph}: {out[ph]['slow_reports']} reports slower than a heartbeat"
              for ph in ("idle", "placement") if out[ph]["slow_reports"]]
    if out["lost"]:
        broke.append(f"{out['lost']} machines not Ready (lost: heartbeats late)")
    if pl["submitted"] < pl["runs"]:
        broke.append(f"only {pl['submitted']} of {pl['runs']} runs submitted within {a.settle:g} s")
    if pl["seen"] < pl["submitted"]:
        broke.append(f"{pl['submitted'] - pl['seen']} submitted runs' workers not seen by their agents within "
                     f"{a.settle:g} s")
    print("what broke: " + ("; ".join(broke) if broke else "nothing"))


if __name__ == "__main__":
    main()
