"""Lists at scale: `GET $API/runs`, `astra astraeus runs` and the console's runs page with 100,000 runs in the
workspace, on SQLite and on PostgreSQL.

- A real `astraeus server` (its scheduling loop running, one 8-GPU machine registered through the agent API) on a
  SQLite file and on the local PostgreSQL; 100,000 finished runs (Completed, Failed, Cancelled; labels team=t0..t9
  and exp=e0..e999) with one worker each are put straight into its database through the models (bulk insert).
- Timed, each request `--reps` times over one keep-alive connection, p50/p99: the first page (the default 100),
  a page filtered by state (Failed, 15%), by a label held by 10% (team=t3), by a rare label (exp=e7, 0.1%: the
  filter reads the whole workspace's index), both state and label (Failed, team=t7: 5%), a deep page (the cursor of the 90,000th run),
  1000 runs in one page; `astra astraeus runs` end to end (a process each: Python's start, the HTTP call, the
  table; beside it `astra --help`, the process start alone, and `astra astraeus drives list` on no drives; the
  CPU time of each process too, which the machine's load hardly changes); the console's runs page (HTML) first page and filtered.
- The same-run baseline: the first page and the state page again after dropping revision 0010's indexes (the
  list then sorts the workspace's runs for every page), as a ratio.

    .venv/bin/python benchmarks/bench_lists.py [--runs 100000] [--reps 30] [--databases sqlite,postgresql]

Prints a table per database. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import create_engine, func, insert, select, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_submit import BIN, PG_ADMIN, p99, start_server  # noqa: E402

from astraeus.server.db import Cluster, Run, Worker, Workspace  # noqa: E402
from astraeus.server.routers.events import encode_cursor  # noqa: E402

STATES = ["Completed"] * 16 + ["Failed"] * 3 + ["Cancelled"]  # 80%, 15%, 5%
WORKER_STATE = {"Completed": "Succeeded", "Failed": "Failed", "Cancelled": "Cancelled"}


def fill(url: str, n: int) -> tuple[float, str]:
    """`n` finished runs of one worker each in the first workspace; the seconds it took and a deep cursor."""
    engine = create_engine(url)
    t0 = time.perf_counter()
    with engine.begin() as c:
        ws = c.scalar(select(Workspace.id).order_by(Workspace.id))
        cl = c.scalar(select(Cluster.id).order_by(Cluster.id))
        base = (c.scalar(select(func.max(Run.id))) or 0) + 1
        wbase = (c.scalar(select(func.max(Worker.id))) or 0) + 1
        start = time.time() - n  # one a second, up to now
        tt = {"image": "python:3.11", "command": "python", "args": ["train.py"],
              "requested_resources": {"gpu_requests": {"count": 1}}}
        for lo in range(0, n, 10_000):
            runs, workers = [], []
            for i in range(lo, min(n, lo + 10_000)):
                st = STATES[i % len(STATES)]
                at = start + i
                runs.append({"id": base + i, "uid": uuid.uuid4().hex, "workspace_id": ws, "cluster_id": cl,
                             "name": f"run-{i:06d}", "live_key": "", "labels": {"team": f"t{i % 10}",
                                                                               "exp": f"e{i % 1000}"},
                             "spec": {"task_template": tt, "priority": 0}, "priority": 0, "state": st,
                             "reason": f"{st} after 10s", "queue_reason": "", "created_at": at, "started_at": at + 1,
                             "finished_at": at + 11, "preemptions": 0, "quota_noted": True, "deleting": False})
                workers.append({"id": wbase + i, "run_id": base + i, "name": f"run-{i:06d}-0", "index": 0,
                                "state": WORKER_STATE[st], "reason": "", "restarts": 0, "preemptions": 0,
                                "exit_code": 0 if st == "Completed" else 1, "attempt": 1, "gpus": 1,
                                "gpu_indices": [], "cpu_cores": 1.0, "memory_bytes": 0, "why_not": [],
                                "crash_streak": 0, "started_at": at + 1, "finished_at": at + 11})
            c.execute(insert(Run), runs)
            c.execute(insert(Worker), workers)
        if engine.dialect.name == "postgresql":
            c.execute(text("ANALYZE runs"))
            c.execute(text("ANALYZE workers"))
        deep = c.execute(select(Run.created_at, Run.id).where(Run.workspace_id == ws)
                         .order_by(Run.created_at.desc(), Run.id.desc()).offset(n * 9 // 10).limit(1)).first()
    engine.dispose()
    return time.perf_counter() - t0, encode_cursor((deep[0], deep[1])) if deep else ""


def timed(reps: int, call) -> tuple[float, float, int]:
    call()  # warm (not counted)
    lat = []
    size = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        size = call()
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1000, p99(lat) * 1000, size


def inproc(db_url: str, reps: int, cpus: list[tuple[str, float]]) -> None:
    """The API's work for a page without HTTP or the server's other threads, in this process: the keyset query,
    the run views and the JSON, as the CPU time of this thread (SQLite's work included; PostgreSQL's is its own)."""
    import json

    from sqlalchemy.orm import Session

    from astraeus.server import services
    from astraeus.server.db import Org

    engine = create_engine(db_url)
    with Session(engine) as s:
        ws = s.scalar(select(Workspace).order_by(Workspace.id))
        caller = services.Caller(token=None, org=s.get(Org, ws.org_id), workspace=ws, role="viewer")
        cl = s.scalar(select(Cluster).order_by(Cluster.id))
        for what, state, labels in (("first page", None, {}), ("state=Failed", "Failed", {}),
                                    ("label team=t3", None, {"team": "t3"}),
                                    ("label exp=e7 (0.1%)", None, {"exp": "e7"})):
            spent = []
            for _ in range(reps):
                s.expire_all()
                t0 = time.thread_time()
                runs = services.list_runs(s, caller, state, labels, None, 101)
                json.dumps([services.run_view(r, caller.org, ws, cl, "http://x", None, {}, "viewer")
                            for r in runs[:100]])
                spent.append(time.thread_time() - t0)
            cpus.append((f"in-process page: {what}", statistics.median(spent) * 1000))
    engine.dispose()


def measure(database: str, n: int, reps: int, cpus: list[tuple[str, float]]) -> list[tuple[str, float, float, int]]:
    home = Path(tempfile.mkdtemp(prefix=f"bench-lists-{database}-"))
    url = None
    if database == "postgresql":
        import psycopg

        name = "astraeus_bench_" + uuid.uuid4().hex[:8]
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    proc, v = start_server(home, url, None)
    rows: list[tuple[str, float, float, int]] = []
    try:
        httpx.post(v["ASTRAEUS_SERVER"] + "/api/v1/agent/register", timeout=10,
                   headers={"Authorization": f"Bearer {v['ASTRAEUS_MACHINE_TOKEN']}"},
                   json={"name": "gpu-01", "gpus": 8, "cpu_cores": 64, "memory_bytes": 512 << 30})
        db_url = (url.replace("postgresql://", "postgresql+psycopg://") if url
                  else f"sqlite:///{home / 'astraeus.db'}")
        took, deep = fill(db_url, n)
        print(f"{database}: {n} runs and their workers inserted in {took:.1f} s", flush=True)
        h = httpx.Client(base_url=v["API"], headers={"Authorization": f"Bearer {v['ASTRAEUS_TOKEN']}"}, timeout=120)

        def api(**params):
            def call() -> int:
                r = h.get("/runs", params=params)
                assert r.status_code == 200, r.text
                return len(r.json()["items"])
            return call

        cases = [("API first page (100)", {}), ("API state=Failed", {"state": "Failed"}),
                 ("API label team=t3", {"label": "team=t3"}), ("API label exp=e7 (0.1%)", {"label": "exp=e7"}),
                 ("API state+label", {"state": "Failed", "label": "team=t7"}),
                 ("API deep page (cursor at 90%)", {"cursor": deep}), ("API limit=1000", {"limit": 1000})]
        for what, params in cases:
            rows.append((what, *timed(reps, api(**params))))
        env = {**os.environ, "ASTRAEUS_API": v["API"], "ASTRAEUS_TOKEN": v["ASTRAEUS_TOKEN"]}

        def cli(*args: str):
            """One `astra ...` process; its CPU time (user + sys, which the machine's load hardly changes) kept."""
            cpu: list[float] = []

            def call() -> int:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                r = subprocess.run([str(BIN / "astra"), *args], env=env, capture_output=True, text=True, timeout=120)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                assert r.returncode == 0, r.stderr
                return max(0, r.stdout.count("\n") - 1)
            call.cpu = cpu
            return call

        for what, args in (("astra --help (the process start alone)", ["--help"]),
                           ("astra astraeus drives list (an empty list)", ["astraeus", "drives", "list"]),
                           ("astra astraeus runs", ["astraeus", "runs"]),
                           ("astra ... runs -l team=t7 --state Failed",
                            ["astraeus", "runs", "-l", "team=t7", "--state", "Failed"])):
            call = cli(*args)
            rows.append((what, *timed(max(5, reps // 3), call)))
            cpus.append((what, statistics.median(call.cpu[1:]) * 1000))
        page_url = v["API"].replace("/api/v1/o/", "/o/").rstrip("/") + "/runs"  # the console's runs page

        def console(**params):
            def call() -> int:
                r = h.get(page_url, params=params)
                assert r.status_code == 200, r.text[:300]
                return r.text.count("<tr data-run=")
            return call

        rows.append(("console runs page", *timed(reps, console())))
        rows.append(("console state+label", *timed(reps, console(state="Failed", label="team=t7"))))
        inproc(db_url, reps, cpus)
        # the same-run baseline: without revision 0010's indexes
        engine = create_engine(db_url)
        with engine.begin() as c:
            c.execute(text("DROP INDEX ix_runs_list"))
            c.execute(text("DROP INDEX ix_runs_list_state"))
        engine.dispose()
        rows.append(("no 0010 indexes: first page", *timed(max(5, reps // 3), api())))
        rows.append(("no 0010 indexes: state=Failed", *timed(max(5, reps // 3), api(state="Failed"))))
        h.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
        if url:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--databases", default="sqlite,postgresql")
    a = ap.parse_args()
    print(f"Lists: {a.runs} runs in one workspace, {a.reps} requests each, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    for db in [d for d in a.databases.split(",") if d]:
        cpus: list[tuple[str, float]] = []
        rows = measure(db, a.runs, a.reps, cpus)
        print(f"\n{db}\n{'what':<44}{'p50 ms':>9}{'p99 ms':>9}{'items':>7}")
        for what, p50, p99_, size in rows:
            print(f"{what:<44}{p50:>9.1f}{p99_:>9.1f}{size:>7}")
        by = {r[0]: r for r in rows}
        for a_, b_ in (("API first page (100)", "no 0010 indexes: first page"),
                       ("API state=Failed", "no 0010 indexes: state=Failed")):
            print(f"  {b_} / with them (p50): {by[b_][1] / by[a_][1]:.1f}x")
        print("CPU time (p50; the machine's load hardly changes it): one astra process (user + sys), and the API's "
              "work for one page in process (this thread):")
        for what, ms in cpus:
            print(f"  {what:<42}{ms:>8.0f} ms")
        print(flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
