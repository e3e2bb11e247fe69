"""Throughput: n trivial one-GPU runs on 8 GPUs, first submit → last exit; Astraeus, Slurm and the floor
(`xargs -P 8` running the same commands with no scheduler), side by side in one run.

Each run's command takes a timestamp (`date +%s.%N`) and exits; the last of those is the last exit. Slurm's jobs
write it to a file; Astraeus's runs print it (workers see the host read-only with a private /tmp) and it is read
from their logs. For Astraeus it also prints where a worker's time goes (p50 / p90 of each step, from the control
plane's database): placed → started (the agent saw the assignment, started the worker and reported it) → the
command's stamp → finished (the agent reported the exit) → the next worker placed on the same GPU.

    python benchmarks/bench_throughput.py --jobs 200 --old   # also Astraeus without the shim launcher
    python benchmarks/bench_throughput.py --jobs 200 --rounds 3 --python-shim   # also every worker on the Python shim
    python benchmarks/bench_throughput.py --jobs 200 --was /tmp/was   # also the code of another checkout (before)
    python benchmarks/bench_throughput.py --jobs 200 --rounds 5   # Astraeus then Slurm five times: each ratio, the median
    python benchmarks/bench_throughput.py --jobs 200 --rounds 6 --no-slurm --was /tmp/was   # this code and another's, by turns
    python benchmarks/bench_throughput.py --jobs 500 --no-slurm
    python benchmarks/bench_throughput.py --views 10   # only: 8 workers' views built at once, scratch vs prepared
    python benchmarks/bench_throughput.py --runtime-starts 5 --repeat 4 --was /tmp/was   # only: the machine's side
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from astraeus_local import LocalAstraeus
from slurm_peer import GPUS, machine_info, measure_xargs_floor, read_stamp, sbatch, stamp_command, start_slurm


@contextmanager
def open_local():
    """A LocalAstraeus, started again (up to three times) when it could not read its home's env file."""
    for attempt in range(3):
        ax = LocalAstraeus(gpus=GPUS)
        try:
            ax.start()
            break
        except KeyError as e:  # the env file read while `up` was still writing it
            ax.stop()
            if attempt == 2:
                raise RuntimeError(f"astraeus up's env file has no {e}") from None
    try:
        yield ax
    finally:
        ax.stop()


def measure_astraeus_throughput(n: int = 500, launcher: bool = True, src: str | None = None,
                                native: bool = True) -> dict:
    """Workers see the host read-only with a private /tmp (astraeus.agent.runtime.mounts), so each run prints its
    timestamp (`date +%s.%N`, the same command as Slurm's jobs less the file) and the stamps are read from the
    runs' logs once they have all ended. launcher=False: the agent starts each worker's shim with an interpreter
    of its own (ASTRAEUS_SHIM_LAUNCHER=0), as before the pre-started launcher. src: the `src` folder of another
    checkout whose code the control plane, agent and shims run (PYTHONPATH; e.g. a worktree of the code before a
    change), measured in the same run. native=False: every worker gets the Python shim (ASTRAEUS_NATIVE_SHIM=0), not
    the supervisor in C."""
    old = os.environ.get("ASTRAEUS_SHIM_LAUNCHER")
    old_native = os.environ.get("ASTRAEUS_NATIVE_SHIM")
    if not native:
        os.environ["ASTRAEUS_NATIVE_SHIM"] = "0"
    old_path = os.environ.get("PYTHONPATH")
    if not launcher:
        os.environ["ASTRAEUS_SHIM_LAUNCHER"] = "0"
    if src:
        os.environ["PYTHONPATH"] = str(Path(src).resolve()) + (os.pathsep + old_path if old_path else "")
    try:
        with open_local() as ax:
            tag = str(int(time.time()))[-6:]
            procs = control_plane_and_agent(ax)
            cycles0 = scheduling_cycles(ax)
            t0 = time.time()
            busy0 = machine_busy_seconds()
            cpu0 = process_cpu_seconds(procs)
            for i in range(n):
                ax.submit(f"tput-{tag}-{i}", ["sh", "-c", "date +%s.%N"], gpus=1)
            t_submitted = time.time()
            busy1 = machine_busy_seconds()
            cpu1 = process_cpu_seconds(procs)
            # Until every run has ended, read from the control plane's SQLite file (a count, every 0.1 s, as the
            # Slurm side looks at its stamp files): the control plane being measured spends nothing on it (listing
            # the runs through the API each second was ~7 % of its CPU in a run of 400). The figure is the last
            # stamp, not when this loop noticed. The runs' views are read once, at the end.
            deadline = time.time() + 3600
            while finished(ax.home / "astraeus.db", tag) < n:
                time.sleep(0.1)
                if time.time() > deadline:
                    raise TimeoutError(f"{n} runs did not finish in an hour")
            busy2 = machine_busy_seconds()
            busy = busy2 - busy0  # the machine's CPU, all processes, first submit → all ended
            cpu2 = process_cpu_seconds(procs)
            cycles = {k: v - cycles0[k] for k, v in scheduling_cycles(ax).items()}
            split = {phase: {"seconds": t, "machine": (b1 - b0) * 1000 / n,
                             **{k: (c1[k] - c0[k]) * 1000 / n for k in procs}}
                     for phase, t, b0, b1, c0, c1 in (("while submitting", t_submitted - t0, busy0, busy1, cpu0, cpu1),
                                                      ("after the last submit", time.time() - t_submitted, busy1, busy2, cpu1, cpu2))}
            items = ax.get(f"/runs?limit={min(max(n, 1), 1000)}")["items"]
            failed = [r for r in items if r["status"]["state"] != "Completed"]
            stamps_by_run: dict[str, float] = {}
            for i in range(n):
                text = ax.client.get(f"{ax.api}/workers/tput-{tag}-{i}-0/logs").text.strip()
                try:
                    stamps_by_run[f"tput-{tag}-{i}"] = float(text.splitlines()[-1])
                except (ValueError, IndexError):
                    pass
            stamps = list(stamps_by_run.values())
            phases = worker_phases(items)
            steps = worker_steps(ax.home / "astraeus.db", tag, stamps_by_run)
    finally:
        if old is None:
            os.environ.pop("ASTRAEUS_SHIM_LAUNCHER", None)
        else:
            os.environ["ASTRAEUS_SHIM_LAUNCHER"] = old
        if old_native is None:
            os.environ.pop("ASTRAEUS_NATIVE_SHIM", None)
        else:
            os.environ["ASTRAEUS_NATIVE_SHIM"] = old_native
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    last = max(stamps, default=t0)
    total = last - t0
    done = len(stamps)
    system = (f"was:{Path(src).parent.name}" if src else "astraeus-old" if not launcher
              else "astraeus-python-shim" if not native else "astraeus")
    return {"system": system, "jobs": n, "seconds": total,
            "jobs_per_second": done / total if total > 0 else None, "submit_seconds": t_submitted - t0,
            "stamps": done, "failed": len(failed), "phases": phases, "steps": steps,
            "cpu_ms_per_run": busy * 1000 / n, "cpu_split": split, "cycles": cycles,
            "failed_reasons": sorted({r["status"].get("reason", "") for r in failed})}


def scheduling_cycles(ax: LocalAstraeus) -> dict[str, float]:
    """The control plane's scheduling cycles so far and the seconds they took (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"count": 0.0, "seconds": 0.0}
    for family in text_string_to_metric_families(ax.client.get(ax.server + "/metrics").text):
        if family.name == "astraeus_schedule_cycle_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    out["count"] = sample.value
                elif sample.name.endswith("_sum"):
                    out["seconds"] = sample.value
    return out


FINAL = ("Completed", "Failed", "Cancelled")


def finished(db: Path, tag: str) -> int:
    """How many of this measurement's runs have ended, read from the control plane's SQLite file (read-only)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(f"SELECT count(*) FROM runs WHERE name LIKE ? AND state IN ({', '.join('?' * len(FINAL))})",
                           (f"tput-{tag}-%", *FINAL)).fetchone()[0]
    except sqlite3.OperationalError:  # the file not there yet, or busy: look again
        return 0
    finally:
        con.close()


class SlurmDisturbed(RuntimeError):
    pass


def _squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def measure_slurm(n: int) -> dict:
    """slurm_peer.measure_slurm_throughput, on a peer other benchmarks may share: it cancels only its own jobs
    (not `scancel -u root`), and when its jobs leave the queue without writing their stamps (someone else
    cancelled them) it says so instead of waiting an hour."""
    start_slurm()
    d = Path(tempfile.mkdtemp(prefix="slurm-tput-"))
    ids: list[str] = []
    t0 = time.time()
    try:
        for i in range(n):
            ids.append(sbatch("high", 1, stamp_command(d / f"done.{i}"), d))
        t_submitted = time.time()
        deadline = time.time() + 3600
        while len(list(d.glob("done.*[0-9]"))) < n:
            time.sleep(0.1)
            if time.time() > deadline:
                raise TimeoutError(f"{n} Slurm jobs did not finish in an hour")
            if not (_squeue_ids() & set(ids)):
                time.sleep(1.0)  # the last stamps may still be being written
                done = len(list(d.glob("done.*[0-9]")))
                if done < n:
                    raise SlurmDisturbed(f"{n - done} of {n} Slurm jobs left the queue without running (cancelled "
                                         "by another user of the shared peer?)")
        last = max(read_stamp(p) or 0.0 for p in d.glob("done.*[0-9]"))
    finally:
        left = sorted(_squeue_ids() & set(ids))
        if left:
            subprocess.run(["scancel", *left], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
    total = last - t0
    return {"system": "slurm", "jobs": n, "seconds": total, "jobs_per_second": n / total if total > 0 else None,
            "submit_seconds": t_submitted - t0}


def _ts(v: str | None) -> float | None:
    if not v:
        return None
    return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()


def worker_steps(db: Path, tag: str, stamps: dict[str, float]) -> dict:
    """Where a worker's time goes, p50 and p90 of each step, from the control plane's database (float seconds):
    placed (the cycle that placed it) → started (the control plane has the agent's report that it runs) → the
    command's stamp (it ran and is ending) → finished (the control plane has the agent's report of its exit) →
    the next worker placed on the same GPU (the cycle that reuses the GPU)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute("SELECT r.name, r.created_at, w.placed_at, w.started_at, w.finished_at, w.gpu_indices "
                       "FROM workers w JOIN runs r ON r.id = w.run_id WHERE r.name LIKE ?", (f"tput-{tag}-%",)).fetchall()
    con.close()
    out: dict[str, list[float]] = {"placed→started": [], "started→stamp": [], "stamp→finished": [],
                                   "finished→next placed on its GPU": []}
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for name, _created, placed, started, finished, gpus in rows:
        stamp = stamps.get(name)
        if placed and started:
            out["placed→started"].append(started - placed)
        if started and stamp:
            out["started→stamp"].append(stamp - started)
        if stamp and finished:
            out["stamp→finished"].append(finished - stamp)
        g = json.loads(gpus) if isinstance(gpus, str) else gpus
        if g and placed and finished:
            by_gpu.setdefault(g[0], []).append((placed, finished))
    for seq in by_gpu.values():
        seq.sort()
        for (_p, f), (p2, _f2) in zip(seq, seq[1:], strict=False):
            out["finished→next placed on its GPU"].append(p2 - f)

    def q(v: list[float], f: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(f * len(v)))]

    return {k: {"p50": q(v, 0.5), "p90": q(v, 0.9)} for k, v in out.items() if v}


def worker_phases(items: list[dict]) -> dict:
    """p50 of each step of a worker's life, from the API's timestamps (whole seconds where it gives no more)."""
    steps: dict[str, list[float]] = {"created→placed": [], "placed→started": [], "started→finished": []}
    for r in items:
        created = _ts(r["metadata"].get("created_at"))
        for w in r["status"].get("workers") or []:
            placed, started, finished = (_ts(w.get(k)) for k in ("placed_at", "started_at", "finished_at"))
            for name, a, b in (("created→placed", created, placed), ("placed→started", placed, started),
                               ("started→finished", started, finished)):
                if a is not None and b is not None:
                    steps[name].append(b - a)
    return {k: statistics.median(v) for k, v in steps.items() if v}


def measure_views(rounds: int, at_once: int = 8) -> dict:
    """The worker's view alone (astraeus.agent.runtime.mounts.WorkerView, as a worker's PID 1 builds it: its own
    PID namespace, a working folder bound in, sealed), `at_once` built concurrently per round: from scratch (a new
    root, pivot_root, every host mount remounted read-only, the host's tree unmounted) and from the view the
    launcher prepares once (mounts.prepare_template). Milliseconds per view, p50 / p90. As root."""
    from astraeus.agent.runtime import mounts

    base = Path(tempfile.mkdtemp(prefix="astraeus-views-"))
    (base / "work").mkdir()
    out: dict[str, dict] = {}
    try:
        for mode in ("scratch", "prepared"):
            times = base / f"{mode}.txt"
            times.write_text("")
            template = mounts.prepare_template() if mode == "prepared" else None
            for _ in range(rounds):
                kids = []
                for _ in range(at_once):
                    pid = os.fork()
                    if pid == 0:
                        try:
                            _one_view(base, template, times)
                        finally:
                            os._exit(0)
                    kids.append(pid)
                for pid in kids:
                    os.waitpid(pid, 0)
            if template is not None:
                os.close(template[0])
            v = sorted(float(x) for x in times.read_text().split())
            out[mode] = {"views": len(v), "p50_ms": v[len(v) // 2], "p90_ms": v[int(len(v) * 0.9)]}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def _one_view(base: Path, template: tuple[int, str] | None, times: Path) -> None:
    from astraeus.agent.runtime import mounts

    mounts.unshare_pid_namespace()
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    fd = os.open(times, os.O_WRONLY | os.O_APPEND)  # opened on the host: the view hides this folder
    t0 = time.perf_counter()
    view = mounts.WorkerView(str(base / f"root-{os.getpid()}"), [str(base / "hidden")], template)
    view.private()
    work = view.source(os.open(base / "work", os.O_PATH | os.O_DIRECTORY))
    view.enter()
    view.bind(work, str(base / "work"), True, False, "working folder")
    view.seal()
    os.write(fd, f"{(time.perf_counter() - t0) * 1000:.3f}\n".encode())
    os._exit(0)


def measure_runtime_starts(rounds: int, at_once: int = 8) -> dict:
    """The machine's side alone, no control plane or agent: ProcessRuntime (as root: the worker's PID namespace,
    view and user, as the agent runs it) starts `at_once` workers of `sh -c 'date +%s.%N'` at once, `rounds`
    times; per worker, start() called → the shim's exit.json (its finished_at), p50 / p90 ms, and the shim's
    started.json → finished_at (the command's run, end and reaping)."""
    from astraeus.agent.runtime.process import ProcessRuntime

    base = Path(tempfile.mkdtemp(prefix="astraeus-starts-"))
    os.chmod(base, 0o777)
    rt = ProcessRuntime(str(base / "state"), stop_grace=2)
    share = {"host_path": str(base), "mount_path": str(base), "read_only": False, "create": False,
             "granted_root": str(base)}
    total: list[float] = []
    ran: list[float] = []
    t_all = time.time()
    busy0 = machine_busy_seconds()
    try:
        for r in range(rounds):
            t0: dict[int, float] = {}

            def one(i: int, r: int = r, t0: dict = t0) -> None:
                t0[i] = time.time()
                rt.start({"worker": f"w-{r}-{i}", "attempt": 1, "run": "w", "desired": "Running", "image": "x",
                          "command": "sh", "args": ["-c", "date +%s.%N"],
                          "env": {"PATH": "/usr/local/bin:/usr/bin:/bin"}, "gpu_indices": [], "mounts": [share],
                          "configs": []})

            threads = [threading.Thread(target=one, args=(i,)) for i in range(at_once)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i in range(at_once):
                while not (st := rt.status(f"w-{r}-{i}", 1)).final:
                    time.sleep(0.002)
                total.append((st.finished_at - t0[i]) * 1000)
                if st.started_at:
                    ran.append((st.finished_at - st.started_at) * 1000)
                rt.forget(f"w-{r}-{i}", 1)
        wall = time.time() - t_all
        busy = machine_busy_seconds() - busy0
    finally:
        rt.close()
        shutil.rmtree(base, ignore_errors=True)

    def q(v: list[float], f: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(f * len(v)))] if v else float("nan")

    return {"workers": len(total), "wall_s": wall, "p50_ms": q(total, 0.5), "p90_ms": q(total, 0.9),
            "ran_p50_ms": q(ran, 0.5), "ran_p90_ms": q(ran, 0.9), "loadavg_1m": os.getloadavg()[0],
            "cpu_ms_per_worker": busy * 1000 / max(1, len(total))}


def control_plane_and_agent(ax: LocalAstraeus) -> dict:
    """The processes whose CPU is shown apart: `astraeus up` (the control plane: API, scheduling loop) and its agent."""
    import psutil

    cp = psutil.Process(ax.proc.pid)
    agents = [p for p in cp.children() if "agent" in p.cmdline()]
    return {"control plane": cp, **({"agent": agents[0]} if agents else {})}


def process_cpu_seconds(procs: dict) -> dict[str, float]:
    out = {}
    for name, p in procs.items():
        try:
            t = p.cpu_times()
            out[name] = t.user + t.system
        except Exception:  # noqa: BLE001 (gone: counted as nothing more)
            out[name] = 0.0
    return out


def machine_busy_seconds() -> float:
    """The machine's CPU time spent busy since boot, all cores (psutil's /proc/stat: every state but idle and
    iowait; guest time is already in user)."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def label(r: dict) -> str:
    """A result's name as printed: its system, and its round with --rounds."""
    return f"{r['system']} ({r['round']})" if r.get("round") else r["system"]


def spread(xs: list[float], fmt: str = ".2f") -> str:
    """Median (min-max) of a figure over the rounds."""
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def print_side_by_side(results: list[dict]) -> None:
    """The table; with rounds (--rounds), each row is compared with the Slurm of its own round."""
    floor = next((r for r in results if r["system"].startswith("xargs")), None)
    slurms = {r.get("round"): r for r in results if r["system"] == "slurm"}
    first = next(iter(slurms.values()), None)
    print(f"{'system':<18}{'jobs':>6}{'seconds':>10}{'jobs/s':>9}{'vs Slurm':>10}{'vs floor':>10}")
    for r in results:
        slurm = slurms.get(r.get("round"), first)
        vs_s = f"{r['seconds'] / slurm['seconds']:.2f}x" if slurm else "-"
        vs_f = f"{r['seconds'] / floor['seconds']:.1f}x" if floor else "-"
        jps = f"{r['jobs_per_second']:>9.1f}" if r.get("jobs_per_second") else f"{'-':>9}"
        print(f"{label(r):<18}{r['jobs']:>6}{r['seconds']:>10.2f}{jps}{vs_s:>10}{vs_f:>10}")


def round_ratios(results: list[dict]) -> list[float]:
    """Slurm's time over Astraeus's (this code's), round by round (--rounds): how many times faster."""
    by_round: dict[int, dict[str, float]] = {}
    for r in results:
        if r.get("round") and r["system"] in ("astraeus", "slurm"):
            by_round.setdefault(r["round"], {})[r["system"]] = r["seconds"]
    return [t["slurm"] / t["astraeus"] for _, t in sorted(by_round.items())
            if t.get("astraeus") and t.get("slurm")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--no-slurm", action="store_true")
    ap.add_argument("--no-astraeus", action="store_true")
    ap.add_argument("--old", action="store_true",
                    help="also measure Astraeus without the shim launcher (ASTRAEUS_SHIM_LAUNCHER=0: one Python "
                         "interpreter start per worker, as before), in the same run")
    ap.add_argument("--python-shim", action="store_true",
                    help="also measure Astraeus with every worker on the Python shim (ASTRAEUS_NATIVE_SHIM=0) instead "
                         "of the supervisor in C, after Slurm, in the same run")
    ap.add_argument("--was", metavar="CHECKOUT", action="append", default=[],
                    help="also measure Astraeus as the code in CHECKOUT/src is (e.g. `git worktree add --detach "
                         "/tmp/was HEAD` before a change), after Slurm, in the same run; may be given more than once "
                         "(measured in that order; named was:<CHECKOUT's folder name>)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--views", type=int, metavar="ROUNDS",
                    help="only measure the worker's view: ROUNDS rounds of 8 built at once, from scratch and from "
                         "the prepared one (as root)")
    ap.add_argument("--runtime-starts", type=int, metavar="ROUNDS",
                    help="only measure the machine's side (as root): ROUNDS rounds of 8 workers started at once "
                         "through ProcessRuntime, start() → exit known; with --was, this code and each CHECKOUT's "
                         "alternately, --repeat times")
    ap.add_argument("--repeat", type=int, default=1, help="with --runtime-starts: how many alternations")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure Astraeus then Slurm (then --old, then each --was) this many times, one after "
                         "the other, and print each round's ratio and the medians: the same code's time moves by a "
                         "third from one run to the next on a small machine, so one round is one sample")
    ap.add_argument("--runtime-starts-here", type=int, help=argparse.SUPPRESS)  # one measurement, in this process
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds: give a number of rounds >= 1")
    if a.runtime_starts_here:
        print(json.dumps(measure_runtime_starts(a.runtime_starts_here)))
        return
    if a.runtime_starts:
        here = Path(__file__).resolve().parent.parent
        for _ in range(a.repeat):
            for tree in [here, *map(Path, a.was)]:
                env = dict(os.environ, PYTHONPATH=str(tree.resolve() / "src"))
                out = subprocess.run([sys.executable, __file__, "--runtime-starts-here", str(a.runtime_starts)],
                                     env=env, capture_output=True, text=True, check=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                name = "astraeus" if tree == here else f"was:{tree.name}"
                print(f"{name}: {r['workers']} workers, 8 at once: start() → exit known {r['p50_ms']:.0f} / "
                      f"{r['p90_ms']:.0f} ms p50 / p90, the command's run → exit known {r['ran_p50_ms']:.0f} / "
                      f"{r['ran_p90_ms']:.0f} ms, {r['wall_s']:.2f} s in all, machine CPU {r['cpu_ms_per_worker']:.1f} ms "
                      f"per worker (load average {r['loadavg_1m']:.1f})",
                      flush=True)
        return
    if a.views:
        for mode, r in measure_views(a.views).items():
            print(f"{mode}: {r['views']} views, 8 at once: {r['p50_ms']:.1f} / {r['p90_ms']:.1f} ms p50 / p90 "
                  f"(load average {os.getloadavg()[0]:.1f})")
        return
    results = []

    def keep(r: dict) -> None:  # printed at once: a later failure does not lose it
        r["loadavg_1m"] = os.getloadavg()[0]  # the machine's load as it ended: figures under load are inflated
        results.append(r)
        cpu = f", machine CPU {r['cpu_ms_per_run']:.1f} ms per run" if r.get("cpu_ms_per_run") else ""
        print(f"{r['system']}: {r['seconds']:.2f} s for {r['jobs']} runs{cpu} (load average {r['loadavg_1m']:.1f})",
              flush=True)
    for i in range(1, a.rounds + 1):
        if a.rounds > 1:
            print(f"round {i} of {a.rounds}", flush=True)
        tag = {"round": i} if a.rounds > 1 else {}
        if not a.no_astraeus:
            keep(measure_astraeus_throughput(a.jobs) | tag)
        if not a.no_slurm:
            for attempt in range(3):
                try:
                    keep(measure_slurm(a.jobs) | tag)
                    break
                except SlurmDisturbed as e:
                    print(f"Slurm, try {attempt + 1}: {e}")
        if not a.no_astraeus and a.old:  # after Slurm, so that Slurm's figure lies between the two as the load drifts
            keep(measure_astraeus_throughput(a.jobs, launcher=False) | tag)
        if not a.no_astraeus and a.python_shim:
            keep(measure_astraeus_throughput(a.jobs, native=False) | tag)
        for was in [] if a.no_astraeus else a.was:  # each round: this code, Slurm, then each other checkout's
            keep(measure_astraeus_throughput(a.jobs, src=str(Path(was) / "src")) | tag)
    keep(measure_xargs_floor(a.jobs))
    info = machine_info()
    print(f"{a.jobs} one-GPU runs on {GPUS} GPUs, first submit → last exit; machine: {info['nproc']} CPUs, "
          f"{info['cpu_model']}, load average {info['loadavg_1m']}")
    print_side_by_side(results)
    ratios = round_ratios(results)
    if len(ratios) > 1:
        print(f"astraeus vs Slurm, round by round: {', '.join(f'{x:.1f}x' for x in ratios)}; median (range) "
              f"{spread(ratios, '.1f')} times faster")
    by_system: dict[str, list[dict]] = {}
    for r in results:
        if r.get("round"):
            by_system.setdefault(r["system"], []).append(r)
    for system, rs in by_system.items():
        cpu = [r["cpu_ms_per_run"] for r in rs if r.get("cpu_ms_per_run")]
        print(f"{system}: median (range) of {len(rs)} rounds {spread([r['seconds'] for r in rs])} s"
              + (f", machine CPU {spread(cpu, '.1f')} ms per run" if cpu else ""))
    for r in results:
        name = label(r)
        if r.get("steps"):
            print(f"{name}: per worker, p50 / p90 (the control plane's times): "
                  + ", ".join(f"{k} {v['p50'] * 1000:.0f} / {v['p90'] * 1000:.0f} ms" for k, v in r["steps"].items()))
        for phase, c in (r.get("cpu_split") or {}).items():
            print(f"{name}: CPU per run {phase} ({c['seconds']:.2f} s): machine {c['machine']:.1f} ms, "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in c.items() if k not in ("seconds", "machine")))
        if r.get("cycles"):
            cy = r["cycles"]
            print(f"{name}: scheduling cycles {cy['count']:.0f} ({cy['count'] / r['jobs']:.2f} per run), "
                  f"{cy['seconds'] * 1000 / max(1, cy['count']):.1f} ms each, {cy['seconds'] * 1000 / r['jobs']:.1f} ms "
                  "per run in all")
        if r.get("failed"):
            print(f"{name}: {r['failed']} of {r['jobs']} runs FAILED (not counted in jobs/s): "
                  f"{r['failed_reasons']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
