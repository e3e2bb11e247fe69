"""The scheduling loop's full read: `astraeus.server.loop.build_snapshot(session, cluster, at)` of a cluster with N
waiting runs, on SQLite and on PostgreSQL, CPU time per read (the loop reads everything this way every cycle that
is not only new submits: an exit, a report, a delete, the schedule interval).

    .venv/bin/python benchmarks/bench_snapshot.py [--runs 10000] [--reads 7] [--databases sqlite,postgresql]
    .venv/bin/python benchmarks/bench_snapshot.py --against /tmp/was/src   # another checkout's loop, alternately
    .venv/bin/python benchmarks/bench_snapshot.py --queue-reasons [--against /tmp/was/src]  # the apply's reasons

The database: one organisation, workspace and cluster, one 8-GPU machine, N one-worker runs waiting (the spec a
fine-tune would have: image, command, args, env, resources, a time limit), written once with Core INSERTs. Each
measurement runs in a process of its own (this checkout's `src`, or --against's): the first read, then `--reads`
more, CPU p50 of those (the loop keeps what it may from one read to the next). It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
SPEC = {"priority": 0, "cluster": "main", "task_template": {
    "image": "python:3.11", "command": "python", "args": ["train.py", "--epochs", "3"],
    "env": {"WANDB_MODE": "offline", "SEED": "1"},
    "requested_resources": {"gpu_requests": {"count": 1}, "cpu_cores": 8, "memory_bytes": 64 << 30},
    "time_limit_seconds": 3600}}


def fill(url: str, runs: int) -> None:
    """The schema (the models' own, as the migrations make it) and N waiting runs with their workers."""
    from sqlalchemy import create_engine, insert, select
    from sqlalchemy.orm import Session

    from astraeus.server.db import Access, Base, Cluster, Machine, Org, Run, Worker, Workspace

    engine = create_engine(url)
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        org = Org(name="acme")
        s.add(org)
        s.flush()
        ws = Workspace(org_id=org.id, name="vision", ns="ws-0123456789ab")
        cluster = Cluster(org_id=org.id, name="main")
        s.add_all([ws, cluster])
        s.flush()
        s.add(Access(workspace_id=ws.id, cluster_id=cluster.id, host_paths=[]))
        s.add(Machine(cluster_id=cluster.id, name="gpu-01", gpus=8, cpu_cores=64, memory_bytes=512 << 30,
                      state="Ready"))
        s.commit()
        ws_id, cluster_id = ws.id, cluster.id
    with engine.begin() as conn:
        conn.execute(insert(Run.__table__), [
            {"uid": uuid.uuid4().hex, "workspace_id": ws_id, "cluster_id": cluster_id, "name": f"r{i}", "live_key": "",
             "labels": {}, "spec": SPEC, "priority": 0, "state": "Pending", "reason": "Waiting for the scheduler",
             "queue_reason": "", "created_at": 1.79e9 + i, "preemptions": 0, "quota_noted": True,
             "deleting": False} for i in range(runs)])
        ids = [r[0] for r in conn.execute(select(Run.id))]
        conn.execute(insert(Worker.__table__), [
            {"run_id": rid, "name": f"r{k}-0", "index": 0, "state": "Pending", "reason": "Waiting to be placed",
             "restarts": 0, "preemptions": 0, "attempt": 0, "gpus": 1, "gpu_indices": [], "cpu_cores": 8.0,
             "memory_bytes": 64 << 30, "why_not": [], "crash_streak": 0} for k, rid in enumerate(ids)])
    engine.dispose()


def measure(url: str, reads: int) -> dict:
    """In this process (whose `astraeus` is the checkout measured): the first read and `reads` more, CPU ms."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from astraeus.server import loop
    from astraeus.server.db import Cluster

    engine = create_engine(url)
    times = []
    waiting = 0
    with Session(engine) as s:
        cluster = s.scalar(select(Cluster))
        for _ in range(reads + 1):
            t = time.process_time()
            snap, _ = loop.build_snapshot(s, cluster, 2e9)
            times.append((time.process_time() - t) * 1e3)
            waiting = len(snap.waiting)
            s.rollback()
    engine.dispose()
    return {"first_ms": times[0], "p50_ms": statistics.median(times[1:]), "waiting": waiting}


def measure_reasons(url: str, writes: int) -> dict:
    """In this process: the apply's write of the queue's word on every waiting run when the head changes (a new
    "Queued behind …" for each run, new why-not lines for each worker: lifecycle.set_queue_reasons, committed),
    `writes` + 1 times; wall ms (on PostgreSQL most of it is the server's), the first and the p50 of the rest."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from astraeus.server import lifecycle
    from astraeus.server.db import Worker

    engine = create_engine(url)
    times = []
    with Session(engine) as s:
        pairs = list(s.execute(select(Worker.run_id, Worker.id)))
        s.rollback()
        for k in range(writes + 1):
            t = time.perf_counter()
            lifecycle.set_queue_reasons(
                s, {rid: f"Queued behind r{k}, which waits for running work to end" for rid, _ in pairs},
                {wid: [["gpu-01", f"{k % 8} GPUs free, needs 8"]] for _, wid in pairs}, 2e9)
            s.commit()
            times.append((time.perf_counter() - t) * 1e3)
    engine.dispose()
    return {"first_ms": times[0], "p50_ms": statistics.median(times[1:]), "waiting": len(pairs)}


def new_database(db: str, tmp: str) -> str:
    if db == "sqlite":
        return f"sqlite:///{tmp}/astraeus-{uuid.uuid4().hex[:8]}.db"
    import psycopg

    name = "astraeus_bench_snapshot_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def drop_database(url: str) -> None:
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


def fill_in(src: Path, url: str, runs: int) -> None:
    """fill() by that checkout's models (its tables' storage parameters too), in a process of its own."""
    subprocess.run([sys.executable, __file__, "--fill-here", url, "--runs", str(runs)],
                   env=dict(os.environ, PYTHONPATH=str(src)), check=True)


def run_in(src: Path, url: str, reads: int, reasons: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, __file__, "--measure-here", url, "--reads", str(reads)]
                         + (["--queue-reasons"] if reasons else []), env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000, help="waiting runs in the cluster")
    ap.add_argument("--reads", type=int, default=7, help="timed reads after the first")
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--against", metavar="SRC", help="another checkout's src/ folder, measured alternately (twice)")
    ap.add_argument("--queue-reasons", action="store_true",
                    help="time the apply's write of a new head's reasons and why-not lines to every waiting run "
                         "(lifecycle.set_queue_reasons, wall ms), --reads times, instead of the read")
    ap.add_argument("--measure-here", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--fill-here", metavar="URL", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.runs < 1 or a.reads < 1:
        ap.error("--runs and --reads: give numbers >= 1")
    if a.fill_here:
        fill(a.fill_here, a.runs)
        return
    if a.measure_here:
        print(json.dumps(measure_reasons(a.measure_here, a.reads) if a.queue_reasons else measure(a.measure_here, a.reads)))
        return
    here = HERE.parent / "src"
    trees = [(here, "this checkout")]
    if a.against:
        trees = [(Path(a.against).resolve(), "against"), (here, "this checkout")] * 2
    what = ("a new head's reasons and why-not lines written to every waiting run, wall ms per write"
            if a.queue_reasons else "build_snapshot of the waiting runs, CPU per read")
    print(f"{a.runs:,} waiting runs: {what} (first, then p50 of {a.reads}); load {os.getloadavg()[0]:.1f}")
    for db in a.databases.split(","):
        if db not in ("sqlite", "postgresql"):
            ap.error(f"--databases: {db!r} is neither sqlite nor postgresql")
        tmp = tempfile.mkdtemp(prefix="bench-snapshot-")
        try:
            if a.queue_reasons:
                # each turn on a new database made by the checkout measured (its migrations may set the tables'
                # storage, e.g. revision 0012's fillfactor): a turn never meets the last one's dead rows either
                for src, label in trees:
                    url = new_database(db, tmp)
                    try:
                        fill_in(src, url, a.runs)
                        report(db, label, run_in(src, url, a.reads, True))
                    finally:
                        drop_database(url)
                continue
            url = new_database(db, tmp)
            try:
                fill(url, a.runs)
                for src, label in trees:
                    report(db, label, run_in(src, url, a.reads))
            finally:
                drop_database(url)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def report(db: str, label: str, r: dict) -> None:
    print(f"  {db:<10} {label:<14} first {r['first_ms']:7.0f} ms   p50 {r['p50_ms']:7.0f} ms   "
          f"({r['waiting']:,} waiting)", flush=True)


if __name__ == "__main__":
    main()
