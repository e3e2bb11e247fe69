"""Logs at scale: a flood of worker log lines against one `astraeus server` (SQLite, then PostgreSQL), and what it
does to the API, to scheduling, to the control plane's memory and to `logs -f`.

    .venv/bin/python benchmarks/bench_logs.py                       # 100 workers x 1,000 lines/s, 60 s, both dbs
    .venv/bin/python benchmarks/bench_logs.py --quick               # 24 workers, 20 s: about 2 minutes
    .venv/bin/python benchmarks/bench_logs.py --db sqlite --src /tmp/was/src   # another checkout's server
    .venv/bin/python benchmarks/bench_logs.py --db postgresql --stores-at-once 2   # the server's settings
    .venv/bin/python benchmarks/bench_logs.py --db sqlite --store-share 1

The machines are played over the real agent protocol (asyncio + httpx; the flood's machines and the marker's in a
process of their own, as real agents run on machines of their own): each registers with the
join token, long-polls its assignments, reports its workers Running (a probe run's worker Exited 0.2 s later),
and ships its workers' lines the way `astraeus agent` does (astraeus.agent.agent): every 0.5 s, or at once while
it is behind, one round of at most LOG_BATCH lines (each worker its share, then those with more the rest), posted to
POST /api/v1/agent/logs in parts of about LOG_POST_BYTES. A flood worker "prints" --rate lines a second (a line's
time is when it was printed; what the agent has not shipped yet waits: the backlog is printed); nothing is dropped
on the agent (its log_rate is 1,000 lines/s: the flood is at most that).

Two phases, each with the same probes: a quiet one (--quiet-seconds, the flood workers Running but silent) and the
flood (--seconds). Probes:
- submit: --clients clients each POST $API/runs (one one-GPU run) about 3 times a second: latency p50/p99;
- scheduling: for each of those runs, submit -> its machine's agent holding the assignment (the long-poll answer),
  p50/p99 (the agent reports it Running at once);
- memory: the RSS of the server's processes (psutil, every 0.5 s; on PostgreSQL its log store's process too): at
  the start, peak and end of each phase;
- `logs -f`: a follower streams GET $API/workers/<marker>/logs?follow=true of a quiet worker that prints
  "MARK <time>" twice a second on a flooded machine; from print to the follower reading it, p50/p99;
- retention: the server runs with ASTRAEUS_LOG_MAX_LINES_PER_WORKER = --max-lines (default 20,000, so a minute's
  flood passes it): rows kept per worker at the end (max), and the "… N earlier lines dropped" line.
It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import PG_ADMIN, Replica  # noqa: E402
from bench_submit import cpu_seconds  # noqa: E402

from astraeus.agent.agent import LOG_BATCH, LOG_POST_BYTES  # noqa: E402

GPUS = 8
ASTRA = Path(sys.executable).parent / "astra"


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


class Worker:
    """One worker's printed lines: `rate` a second from `since` (a flood), or markers twice a second."""

    def __init__(self, identity: str, name: str, rate: float, line_bytes: int):
        self.identity, self.name, self.rate = identity, name, rate
        self.since: float | None = None  # when it started printing
        self.shipped = 0  # the agent's offset: lines stored (the next seq to ship)
        self.pad = "x" * max(0, line_bytes - 30)

    def printed(self, now: float) -> int:
        return 0 if self.since is None else int((now - self.since) * self.rate)

    def lines(self, now: float, start: int, limit: int) -> list[dict]:
        """Up to `limit` printed lines from seq `start` (the offset does not move until they are stored)."""
        n = max(0, min(self.printed(now) - start, limit))
        out = []
        for seq in range(start, start + n):
            t = self.since + seq / self.rate
            text = f"MARK {t:.6f}" if self.name.startswith("marker") else f"{seq} {t:.3f} {self.pad}"
            out.append({"worker": self.identity, "attempt": 0, "seq": seq, "time": t, "stream": "stdout",
                        "text": text})
        return out


class Batch:
    """As agent.LogBatch: one round's lines, the offsets they move to once stored, whether more wait, and the
    workers that were quiet (all their new lines fitted their share)."""

    def __init__(self, ws: list[Worker], now: float):
        self.lines: list[dict] = []
        self.offsets: dict[str, int] = {}
        read = 0
        by_id = {w.identity: w for w in ws}

        def take(w: Worker, want: int) -> bool:
            nonlocal read
            got = w.lines(now, self.offsets.get(w.identity, w.shipped), want)
            self.lines += got
            read += len(got)
            self.offsets[w.identity] = self.offsets.get(w.identity, w.shipped) + len(got)
            return len(got) >= want

        share = max(1, LOG_BATCH // max(1, len(ws)))  # as astraeus.agent.logs.LogShipper: each its share, then the rest
        behind = [w for w in ws if take(w, share)]
        self.more = False
        for w in behind:
            if read >= LOG_BATCH:
                self.more = True
                break
            self.more = take(w, LOG_BATCH - read) or self.more
        self.quiet = set(by_id) - {w.identity for w in behind}
        self.by_id = by_id

    def stored(self, keys: set[str] | None = None) -> int:
        """As Agent._logs_stored: the offsets move (all, or those of `keys`); how many lines they passed."""
        moved = 0
        for k, off in self.offsets.items():
            w = self.by_id[k]
            if (keys is None or k in keys) and off > w.shipped:
                moved, w.shipped = moved + off - w.shipped, off
        return moved


class Machine:
    def __init__(self, bench: Bench, name: str, gpus: int = GPUS):
        self.bench, self.name, self.gpus = bench, name, gpus
        self.done: set[tuple[str, int]] = set()  # attempts reported Exited
        self.credential: str | None = None
        self.version = 0
        self.states: dict[tuple[str, int], str] = {}
        self.workers: dict[str, Worker] = {}
        self.changed = asyncio.Event()

    def h(self) -> dict:
        return {"Authorization": f"Bearer {self.credential or self.bench.join_token}"}

    async def register(self, client: httpx.AsyncClient) -> None:
        r = await client.post("/api/v1/agent/register", headers=self.h(), timeout=60,
                              json={"name": self.name, "gpus": self.gpus, "cpu_cores": 64, "memory_bytes": 512 << 30})
        r.raise_for_status()
        self.credential = r.json().get("credential") or self.credential

    async def poll(self) -> None:
        b = self.bench
        async with b.client() as client:
            while not b.stopping:
                try:
                    r = await client.get("/api/v1/agent/assignments", headers=self.h(), timeout=40,
                                         params={"machine": self.name, "after": self.version, "wait": 30})
                except httpx.HTTPError:
                    await asyncio.sleep(0.5)
                    continue
                seen = time.time()
                if r.status_code != 200:
                    await asyncio.sleep(0.5)
                    continue
                data = r.json()
                self.version = data["version"]
                for a in data["assignments"]:
                    key = (a["worker"], a["attempt"])
                    if a["desired"] == "Running" and key not in self.states and key not in self.done:
                        self.states[key] = "Running"
                        b.seen.setdefault(a["name"].rsplit("-", 1)[0], seen)
                        b.placed[a["name"]] = (self, a["worker"])
                        if a["name"].startswith("probe"):
                            asyncio.get_running_loop().call_later(0.2, self.exit, key)
                        self.changed.set()
                    elif a["desired"] == "Stopped" and self.states.get(key) != "Exited":
                        self.exit(key)

    def exit(self, key) -> None:
        self.states[key] = "Exited"
        self.done.add(key)
        self.changed.set()

    async def report(self) -> None:
        b = self.bench
        async with b.client() as client:
            while not b.stopping:
                try:
                    await asyncio.wait_for(self.changed.wait(), 5)
                except TimeoutError:
                    pass
                self.changed.clear()
                workers = [{"worker": w, "attempt": att, "state": st, "pid": 1000,
                            **({"exit_code": 0} if st == "Exited" else {})} for (w, att), st in self.states.items()]
                try:
                    r = await client.post("/api/v1/agent/report", headers=self.h(), timeout=60,
                                          json={"machine": self.name, "workers": workers})
                except httpx.HTTPError as e:
                    r = e
                if not isinstance(r, httpx.Response) or r.status_code != 200:  # as the agent: all again, soon
                    b.report_errors.append(repr(r) if not isinstance(r, httpx.Response)
                                           else f"{r.status_code} {r.text[:200]}")
                    self.changed.set()
                    await asyncio.sleep(0.5)
                    continue
                for w in workers:  # forgotten once an end was sent (not one that came while the report was out)
                    if w["state"] == "Exited":
                        self.states.pop((w["worker"], w["attempt"]), None)

    async def ship(self) -> None:
        """As the agent's LogShipper (astraeus.agent.logs): a round of at most LOG_BATCH lines from each worker's offset, every 0.5 s
        or at once if behind; the quiet workers' lines (all that was new fitted their share) posted first, on their
        own; after a 429, until its Retry-After, only the lines of the workers quiet in the last round that are
        still quiet, every 0.5 s. A refused post's lines are read again from the offsets, which move only once
        stored."""
        b = self.bench
        quiet: set[str] = set()  # identities quiet in the last full round
        deferred_until = 0.0
        async with b.client() as client:
            while not b.stopping:
                ws = list(self.workers.values())
                now = time.time()
                if time.monotonic() < deferred_until:
                    if quiet:
                        batch = Batch([w for w in ws if w.identity in quiet], now)
                        quiet = batch.quiet
                        wait = await self._post_batch(client, batch, quiet_only=True)
                        if wait is not None:
                            deferred_until = time.monotonic() + wait
                    await asyncio.sleep(0.5)
                    continue
                batch = Batch(ws, now)
                quiet = batch.quiet
                wait = await self._post_batch(client, batch)
                if wait is not None:
                    deferred_until = time.monotonic() + wait
                    await asyncio.sleep(0.5)
                elif not batch.more:
                    await asyncio.sleep(0.5)

    async def _post_batch(self, client: httpx.AsyncClient, batch: Batch, quiet_only: bool = False) -> float | None:
        """As Agent._post_logs: the quiet workers' lines first in posts of their own, their offsets moved once
        stored, then the rest (none of it with `quiet_only`); the Retry-After of a 429, or None."""
        first = [ln for ln in batch.lines if ln["worker"] in batch.quiet]
        if quiet_only or (first and len(first) < len(batch.lines)):
            wait = await self._post_parts(client, first)
            if wait is not None:
                return wait
            self.bench.stored += batch.stored(batch.quiet)
            if quiet_only:
                return None
            rest = [ln for ln in batch.lines if ln["worker"] not in batch.quiet]
        else:
            rest = batch.lines
        wait = await self._post_parts(client, rest)
        if wait is None:
            self.bench.stored += batch.stored()
        return wait

    async def _post_parts(self, client: httpx.AsyncClient, lines: list[dict]) -> float | None:
        """As Agent._post_log_parts: posts of about LOG_POST_BYTES; at a 429, its Retry-After (the parts stored
        before it are sent again with the rest: the server stores a line once)."""
        part: list[dict] = []
        size = 0
        for i, ln in enumerate(lines):
            part.append(ln)
            size += len(ln["text"]) + 100
            if size >= LOG_POST_BYTES or i == len(lines) - 1:
                wait = await self._post(client, part)
                if wait is not None:
                    return wait
                part, size = [], 0
        return None

    async def _post(self, client: httpx.AsyncClient, part: list[dict]) -> float | None:
        """One POST; None once stored, or the Retry-After of a 429 (the server's admission, routers/agent.py)."""
        body = json.dumps({"machine": self.name, "lines": part})
        t0 = time.perf_counter()
        while not self.bench.stopping:
            try:
                r = await client.post("/api/v1/agent/logs", headers={**self.h(), "content-type": "application/json"},
                                      content=body, timeout=60)
                if r.status_code == 200:
                    done = time.time()
                    for ln in part:
                        if ln["text"].startswith("MARK "):
                            self.bench.mark_stored.setdefault(ln["text"], done)
                    self.bench.log_posts.append(time.perf_counter() - t0)
                    return None
                if r.status_code == 429:
                    self.bench.deferred += 1
                    return float(r.headers.get("retry-after", "1"))
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        return None


class Played:
    """What the played machines share: the server, and what they count. The flood's machines (and the marker's) are
    played in a process of their own (played_main), as real agents run on machines of their own: building and
    encoding a flood's 100,000 lines a second in the probes' event loop held up the probes' own requests and
    answers, which the benchmark then counted as the server's."""

    def __init__(self, base: str, join_token: str):
        self.base, self.join_token = base, join_token
        self.stopping = False
        self.seen: dict[str, float] = {}
        self.placed: dict[str, tuple[Machine, str]] = {}
        self.stored = 0
        self.deferred = 0  # log posts answered 429 (sent again after Retry-After)
        self.mark_stored: dict[str, float] = {}  # a marker line -> when the POST that carried it was answered
        self.log_posts: list[float] = []
        self.report_errors: list[str] = []  # reports not answered 200 (sent again)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, limits=httpx.Limits(max_connections=50))


def played_main(conn, base: str, join_token: str, names: list[tuple[str, int]]) -> None:
    """The flood's machines, in a process of their own: registered, long-polling, reporting and shipping as in
    the benchmark's process before; told by the benchmark over `conn` when a phase starts and ends."""
    asyncio.run(_played(conn, Played(base, join_token), names))


async def _played(conn, p: Played, names: list[tuple[str, int]]) -> None:
    machines: list[Machine] = []
    tasks: list[asyncio.Task] = []

    async def add(name: str, gpus: int) -> None:
        m = Machine(p, name, gpus)
        async with p.client() as c:
            await m.register(c)
        machines.append(m)
        tasks.extend(asyncio.create_task(f()) for f in (m.poll, m.report, m.ship))

    for name, gpus in names:
        await add(name, gpus)
    conn.send(("ready",))
    loop = asyncio.get_running_loop()
    flood: list[Worker] = []
    at0: dict = {}
    while True:
        cmd, *args = await loop.run_in_executor(None, conn.recv)
        if cmd == "add":
            await add(*args)
            conn.send(("added",))
        elif cmd == "wait_placed":
            want, timeout = args
            deadline = time.time() + timeout
            while not all(any(k.startswith(n + "-") for k in p.placed) for n in want) and time.time() < deadline:
                await asyncio.sleep(0.2)
            conn.send(("placed", [n for n in want if not any(k.startswith(n + "-") for k in p.placed)]))
        elif cmd == "workers":
            rate, line_bytes = args
            for name, (m, ident) in p.placed.items():
                if name.startswith("flood-"):
                    w = m.workers[ident] = Worker(ident, name, rate, line_bytes)
                    flood.append(w)
            mm, ident = p.placed[next(k for k in p.placed if k.startswith("marker"))]
            marker = mm.workers[ident] = Worker(ident, "marker-0", 2, 0)
            marker.since = time.time()
            conn.send(("workers", [w.name for w in flood], mm.name))
        elif cmd == "phase":
            label, now = args
            for w in flood:
                w.since = now if label == "flood" else None
            at0 = {"stored": p.stored, "deferred": p.deferred, "posts": len(p.log_posts),
                   "printed": sum(w.printed(now) for w in flood)}
            conn.send(("phase",))
        elif cmd == "end":
            label, now = args
            conn.send(("end", {"stored": p.stored - at0["stored"], "deferred": p.deferred - at0["deferred"],
                               "log_posts": p.log_posts[at0["posts"]:], "mark_stored": dict(p.mark_stored),
                               "printed": sum(w.printed(now) for w in flood) - at0["printed"],
                               "report_errors": list(p.report_errors)}))
            if label == "flood":
                for w in flood:
                    w.since = None  # stops printing; what it printed and has not shipped is dropped from the count
        elif cmd == "stop":
            p.stopping = True
            for t in tasks:
                t.cancel()
            conn.send(("stopped",))
            return


class Bench(Played):
    def __init__(self, db: str, a: argparse.Namespace):
        self.a, self.dbkind = a, db
        self.db = None
        env = dict(os.environ, ASTRAEUS_LOG_MAX_LINES_PER_WORKER=str(a.max_lines))
        if a.stores_at_once:
            env["ASTRAEUS_LOG_STORES_AT_ONCE"] = str(a.stores_at_once)
        if a.store_share:
            env["ASTRAEUS_LOG_STORE_SHARE"] = str(a.store_share)
        if a.src:
            env["PYTHONPATH"] = a.src
        if db == "postgresql":
            import psycopg

            self.db = "astraeus_bench_" + uuid.uuid4().hex[:8]
            with psycopg.connect(PG_ADMIN, autocommit=True) as c:
                c.execute(f"CREATE DATABASE {self.db}")
            env["ASTRAEUS_DATABASE_URL"] = f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.db}"
        self.home = Path(tempfile.mkdtemp(prefix="bench-logs-"))
        self.server = Replica(self.home, env).start()
        super().__init__(self.server.url, self.server.vars["ASTRAEUS_MACHINE_TOKEN"])
        self.api = self.server.vars["API"].split("/", 3)[3]
        self.user = {"Authorization": f"Bearer {self.server.vars['ASTRAEUS_TOKEN']}"}
        self.played = None  # the flood machines' process (played_main), and its end of the pipe
        self.conn = None

    async def ask(self, *msg) -> tuple:
        """A command to the flood machines' process, and its answer (waited for off the event loop)."""
        if msg:
            self.conn.send(msg)
        return await asyncio.to_thread(self.conn.recv)

    def server_processes(self) -> list[psutil.Process]:
        """The server's process and its children (on PostgreSQL, the log store's process)."""
        p = psutil.Process(self.server.proc.pid)
        try:
            return [p, *p.children(recursive=True)]
        except psutil.Error:
            return [p]

    def cpu(self) -> float:
        """CPU seconds the server's processes have used (load-independent, unlike the latencies); a child that
        ended meanwhile is missed."""
        return cpu_seconds(self.server.proc.pid)

    def others_cpu(self) -> dict[str, float]:
        """CPU seconds used so far by the whole machine (busy, all cores), by this benchmark's own processes (its
        played agents and clients, the flood machines' process, and its waited-for children: the `logs -f`
        followers) and by PostgreSQL's processes (those alive now: a backend that ended meanwhile is missed): who
        else had the machine's cores."""
        t = psutil.cpu_times()
        me = psutil.Process().cpu_times()
        played = 0.0
        if self.played is not None:
            try:
                pt = psutil.Process(self.played.pid).cpu_times()
                played = pt.user + pt.system
            except psutil.Error:
                pass
        pg = 0.0
        for p in psutil.process_iter(["name", "cpu_times"]):
            if (p.info["name"] or "").startswith("postgres") and p.info["cpu_times"]:
                pg += p.info["cpu_times"].user + p.info["cpu_times"].system
        return {"machine": sum(t) - t.idle - getattr(t, "iowait", 0.0),
                "bench": me.user + me.system + me.children_user + me.children_system + played, "pg": pg}

    def rss(self) -> int:
        """The resident memory of the server's processes together."""
        total = 0
        for p in self.server_processes():
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    async def submit(self, client: httpx.AsyncClient, name: str) -> float:
        body = {"metadata": {"name": name}, "spec": {"task_template": {
            "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 1}}}}}
        t0 = time.perf_counter()
        r = await client.post(f"/{self.api}/runs", json=body, headers=self.user, timeout=60)
        if r.status_code != 201:
            raise SystemExit(f"submit {name}: {r.status_code} {r.text}")
        return time.perf_counter() - t0

    async def phase(self, label: str, seconds: float) -> dict:
        sub_lat: list[float] = []
        sched: list[float] = []
        mark_lat: list[float] = []
        mark_srv: list[float] = []  # from its POST answered to the follower reading it
        timeouts: list[str] = []
        slow: list[tuple[str, float]] = []  # probes held more than 2 s after their submit: (name, submitted)
        waiting: list[asyncio.Task] = []  # each submitted run, until its machine's agent holds it (or 30 s after)
        marks: list[tuple[str, float]] = []  # (a marker line, when the follower read it)
        rss: list[int] = [self.rss()]
        cpu0 = self.cpu()
        others0, t_cpu0 = self.others_cpu(), time.time()
        await self.ask("phase", label, time.time())
        end = time.time() + seconds

        async def submitter(k: int) -> None:
            async with self.client() as c:
                i = 0
                while time.time() < end:
                    name = f"probe-{label}-{k}-{i}"
                    t0 = time.time()
                    try:
                        sub_lat.append(await self.submit(c, name))
                    except httpx.TimeoutException:
                        sub_lat.append(60.0)  # no answer within 60 s: counted as 60 s
                        timeouts.append(name)
                        continue
                    i += 1
                    async def placed(name=name, t0=t0):
                        while name not in self.seen and time.time() < end + 30:
                            await asyncio.sleep(0.01)
                        if name not in self.seen:
                            return name
                        sched.append(self.seen[name] - t0)
                        if self.seen[name] - t0 > 2:
                            slow.append((name, t0))
                        return True
                    waiting.append(asyncio.get_running_loop().create_task(placed()))
                    await asyncio.sleep(max(0.0, 0.33 - (time.time() - t0)))

        async def follower() -> None:
            # the real `astra logs -f`, in a process of its own; a thread here reads its lines as they come
            env = dict(os.environ, ASTRAEUS_API=self.server.vars["API"], ASTRAEUS_TOKEN=self.server.vars["ASTRAEUS_TOKEN"],
                       PYTHONUNBUFFERED="1")
            proc = subprocess.Popen([str(ASTRA), "astraeus", "logs", "-f", "--tail", "0", "marker-0"], env=env,
                                    stdout=subprocess.PIPE, stderr=open(self.home / "follow.err", "a"), text=True)

            def read() -> None:
                for line in proc.stdout:
                    if line.startswith("MARK "):
                        now = time.time()
                        line = line.rstrip("\n")
                        mark_lat.append(now - float(line.split()[1]))
                        marks.append((line, now))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            while time.time() < end:
                await asyncio.sleep(0.2)
            proc.terminate()
            proc.wait(10)
            if not mark_lat:
                print("  astra logs -f saw no marker:", (self.home / "follow.err").read_text()[-500:])

        async def sampler() -> None:
            while time.time() < end:
                rss.append(self.rss())
                await asyncio.sleep(0.5)

        await asyncio.wait_for(asyncio.gather(sampler(), follower(), *(submitter(k) for k in range(self.a.clients))),
                               seconds + 60)
        _, played = await self.ask("end", label, time.time())
        self.report_errors = played["report_errors"]
        mark_srv += [at - played["mark_stored"][line] for line, at in marks if line in played["mark_stored"]]
        await asyncio.gather(*waiting)
        if slow:  # where their time went: to being placed (the scheduler) or from placed to held (the long-poll)
            async with self.client() as c:
                parts = []
                for name, t0 in sorted(slow, key=lambda x: self.seen[x[0]] - x[1], reverse=True)[:5]:
                    w = (await c.get(f"/{self.api}/workers/{name}-0", headers=self.user, timeout=60)).json()
                    placed = datetime.fromisoformat(w["placed_at"].replace("Z", "+00:00")).timestamp() \
                        if w.get("placed_at") else float("nan")
                    parts.append(f"{name} submit->placed {placed - t0:.2f} s, placed->held {self.seen[name] - placed:.2f} s")
            print(f"  {label}: {len(slow)} probes held over 2 s after submit; the slowest: " + "; ".join(parts))
        late = [t.result() for t in waiting if t.result() is not True]
        unplaced = len(late)
        if late:  # where they are: not placed (the scheduler), or placed but not yet in their machine's answer
            async with self.client() as c:
                states: dict[str, int] = {}
                first = []
                for name in late:
                    r = await c.get(f"/{self.api}/workers/{name}-0", headers=self.user, timeout=60)
                    w = r.json() if r.status_code == 200 else {}
                    key = f"{w.get('state', r.status_code)} on {w.get('machine')}"
                    states[key] = states.get(key, 0) + 1
                    if len(first) < 2:
                        first.append(f"{name}: {w.get('reason')!r} why_not {w.get('why_not')}")
                r = await c.get(f"/{self.api}/machines", headers=self.user, timeout=60)
                quiet = [m for m in (r.json().get("items", []) if r.status_code == 200 else [])
                         if m.get("name") == "quiet-002"]
                on: dict[str, int] = {}  # the probes' machine's workers that hold GPUs, by state
                holding = []
                cursor = None
                while True:
                    r = await c.get(f"/{self.api}/workers", headers=self.user, timeout=60,
                                    params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
                    page = r.json()
                    for w in page["items"]:
                        if w["machine"] == "quiet-002" and w["state"] in ("Starting", "Running", "Stopping"):
                            on[w["state"]] = on.get(w["state"], 0) + 1
                            if len(holding) < 3:
                                mm, ident = self.placed.get(w["name"], (None, None))  # (the probes' machine's)
                                holding.append(f"{w['name']} {w['state']} placed {w['placed_at']} started "
                                               f"{w['started_at']}; the machine saw it "
                                               f"{ident is not None}, its state there "
                                               f"{mm.states.get((ident, w['attempt'])) if mm else None}, done "
                                               f"{(ident, w['attempt']) in mm.done if mm else None}")
                    cursor = page.get("next_cursor")
                    if not cursor:
                        break
            print(f"  {label}: not held by an agent 30 s after the phase: {states}; {'; '.join(first[:1])}; "
                  f"the probes' machine: {[(m['gpus_used'], m['last_heartbeat']) for m in quiet]}, its workers "
                  f"not ended: {on}: {holding}")
        printed = played["printed"]
        cpu = self.cpu() - cpu0
        others = {k: v - others0[k] for k, v in self.others_cpu().items()}
        shipped = played["stored"]
        res = {"submit_p50_ms": pct(sub_lat, 50) * 1e3, "submit_p99_ms": pct(sub_lat, 99) * 1e3, "submits": len(sub_lat),
               "submit_timeouts": len(timeouts),
               "sched_p50_ms": pct(sched, 50) * 1e3, "unplaced": unplaced, "sched_p99_ms": pct(sched, 99) * 1e3,
               "follow_p50_ms": pct(mark_lat, 50) * 1e3, "follow_p99_ms": pct(mark_lat, 99) * 1e3,
               "marks": len(mark_lat), "follow_srv_p50_ms": pct(mark_srv, 50) * 1e3,
               "follow_srv_p99_ms": pct(mark_srv, 99) * 1e3, "rss_start_mib": rss[0] / 2**20, "rss_peak_mib": max(rss) / 2**20,
               "rss_end_mib": rss[-1] / 2**20, "printed": printed, "stored": shipped,
               "stored_per_s": shipped / seconds, "server_cpu_s": cpu,
               "machine_busy": others["machine"] / ((time.time() - t_cpu0) * (os.cpu_count() or 1)), "bench_cpu_s": others["bench"],
               "pg_cpu_s": others["pg"] if self.db else float("nan"),
               "cpu_us_per_line": cpu / shipped * 1e6 if shipped > 100 else float("nan"), "log_post_p99_ms": pct(played["log_posts"], 99) * 1e3,
               "deferred": played["deferred"]}
        return res

    async def main(self) -> dict:
        a = self.a
        n_flood_machines = -(-a.workers // GPUS)
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        # no GPU left free on them once the flood and the marker are placed: every probe goes to the probes' machine
        last = a.workers - GPUS * (n_flood_machines - 1) + (a.workers % GPUS != 0)
        self.played = ctx.Process(target=played_main, daemon=True, args=(
            theirs, self.base, self.join_token,
            [(f"flood-{i:03d}", GPUS if i < n_flood_machines - 1 else last) for i in range(n_flood_machines)]))
        self.played.start()
        await self.ask()  # ready: registered
        async with self.client() as c:
            for i in range(a.workers):
                await self.submit(c, f"flood-{i:03d}")
            await self.wait_played([f"flood-{i:03d}" for i in range(a.workers)])
            # the marker: a quiet worker on the last flood machine (one GPU left there, or a new machine's)
            if a.workers % GPUS == 0:
                await self.ask("add", "quiet-001", 1)
            await self.submit(c, "marker")
            await self.wait_played(["marker"])
            quiet = Machine(self, "quiet-002", gpus=64)  # the probes' machine: room for ~9 submits a second
            await quiet.register(c)
            tasks = [asyncio.create_task(f()) for f in (quiet.poll, quiet.report, quiet.ship)]
        _, flood, marker_on = await self.ask("workers", a.rate, a.line_bytes)
        print(f"  {len(flood)} flood workers on {n_flood_machines} machines (a process of their own); marker "
              f"marker-0 on {marker_on}")
        out = {"quiet": await self.phase("quiet", a.quiet_seconds)}
        self._show("quiet", out["quiet"])
        out["flood"] = await self.phase("flood", a.seconds)
        self._show("flood", out["flood"])
        out["retention"] = await self.retention(flood[0])
        self.stopping = True
        for t in tasks:
            t.cancel()
        await self.ask("stop")
        self.played.join(10)
        return out

    async def wait_played(self, names: list[str], timeout: float = 120) -> None:
        _, missing = await self.ask("wait_placed", names, timeout)
        if missing:
            raise SystemExit(f"not placed within {timeout:.0f} s: {missing[:5]}")

    async def retention(self, name: str) -> dict:
        async with self.client() as c:
            r = await c.get(f"/{self.api}/workers/{name}/logs", headers=self.user, timeout=120)
            lines = r.text.splitlines()
        kept = self.kept()
        res = {"kept_max": max(kept) if kept else 0, "kept_workers": len(kept), "shown": len(lines),
               "first_line": lines[0][:100] if lines else ""}
        print(f"  retention (limit {self.a.max_lines} lines): at most {res['kept_max']} rows kept per worker "
              f"({res['kept_workers']} workers); {name}'s log shows {res['shown']} lines, first: "
              f"{res['first_line']!r}")
        return res

    def kept(self) -> list[int]:
        q = "SELECT count(*) FROM log_lines WHERE attempt >= 0 GROUP BY worker_id"
        if self.db:
            import psycopg

            with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{self.db}") as c:
                return [r[0] for r in c.execute(q)]
        import sqlite3

        with sqlite3.connect(self.home / "astraeus.db", timeout=60) as c:
            return [r[0] for r in c.execute(q)]

    @staticmethod
    def _show(label: str, r: dict) -> None:
        print(f"  {label:5}: submit p50/p99 {r['submit_p50_ms']:.0f}/{r['submit_p99_ms']:.0f} ms ({r['submits']}, {r['submit_timeouts']} over 60 s), "
              f"scheduling p50/p99 {r['sched_p50_ms']:.0f}/{r['sched_p99_ms']:.0f} ms ({r['unplaced']} not held by "
              f"an agent 30 s after the phase), logs -f p50/p99 "
              f"{r['follow_p50_ms']:.0f}/{r['follow_p99_ms']:.0f} ms ({r['marks']} marks; from stored "
              f"{r['follow_srv_p50_ms']:.0f}/{r['follow_srv_p99_ms']:.0f} ms), RSS "
              f"{r['rss_start_mib']:.0f} -> peak {r['rss_peak_mib']:.0f} -> {r['rss_end_mib']:.0f} MiB; lines "
              f"printed {r['printed']:,}, stored {r['stored']:,} ({r['stored_per_s']:,.0f}/s), server CPU "
              f"{r['server_cpu_s']:.1f} s ({r['cpu_us_per_line']:.0f} µs per line stored), log POST p99 "
              f"{r['log_post_p99_ms']:.0f} ms, {r['deferred']} log posts answered 429; the machine's "
              f"{os.cpu_count()} cores {r['machine_busy']:.0%} busy (this benchmark's played agents and clients "
              f"{r['bench_cpu_s']:.1f} s" + (f", PostgreSQL {r['pg_cpu_s']:.1f} s" if r['pg_cpu_s'] == r['pg_cpu_s'] else "") + ")")

    def close(self) -> None:
        if self.played is not None and self.played.is_alive():
            self.played.kill()
        self.server.stop()
        shutil.rmtree(self.home, ignore_errors=True)
        if self.db:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--workers", type=int, default=100, help="flood workers (default 100)")
    ap.add_argument("--rate", type=float, default=1000, help="lines a second each flood worker prints (1,000)")
    ap.add_argument("--seconds", type=float, default=60, help="the flood's length (60 s)")
    ap.add_argument("--quiet-seconds", type=float, default=15, help="the quiet phase's length (15 s)")
    ap.add_argument("--line-bytes", type=int, default=80, help="a flood line's length (80 bytes)")
    ap.add_argument("--clients", type=int, default=3, help="submitting clients (3)")
    ap.add_argument("--max-lines", type=int, default=20_000, help="ASTRAEUS_LOG_MAX_LINES_PER_WORKER (20,000)")
    ap.add_argument("--stores-at-once", type=int, help="ASTRAEUS_LOG_STORES_AT_ONCE (unset: the server's default)")
    ap.add_argument("--store-share", type=float, help="ASTRAEUS_LOG_STORE_SHARE (unset: the server's default)")
    ap.add_argument("--src", help="run the server from this checkout's src/ (PYTHONPATH), e.g. the code before")
    ap.add_argument("--quick", action="store_true", help="24 workers, 20 s flood, 10 s quiet")
    a = ap.parse_args()
    if a.quick:
        a.workers, a.seconds, a.quiet_seconds = 24, 20, 10
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    for db in (["sqlite", "postgresql"] if a.db == "both" else [a.db]):
        print(f"{db}: {a.workers} workers x {a.rate:g} lines/s for {a.seconds:g} s (quiet {a.quiet_seconds:g} s), "
              f"{a.clients} submitting clients; load {os.getloadavg()[0]:.1f}" + (f"; server from {a.src}" if a.src
                                                                                 else "")
              + (f"; ASTRAEUS_LOG_STORES_AT_ONCE={a.stores_at_once}" if a.stores_at_once else "")
              + (f"; ASTRAEUS_LOG_STORE_SHARE={a.store_share:g}" if a.store_share else ""))
        b = Bench(db, a)
        try:
            asyncio.run(b.main())
        finally:
            b.close()
        errors = b.report_errors
        if errors:
            print(f"  reports not answered 200 (sent again): {len(errors)}; the first: {errors[:3]}")
        print(f"  load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
