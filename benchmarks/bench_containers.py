"""Container runtime vs process runtime on this machine: start latency and image pull time.

What it measures (real parts only: Debian's `docker-registry` on 127.0.0.1, `skopeo`, `umoci`, `runc`):

- start latency: N worker attempts of a trivial command (`sleep 60`) per runtime, each timed from the call
  to `runtime.start(assignment)` until `runtime.status()` says Running (the shim has the command started:
  for a container, the image looked up in the cache, the overlay mounted, the bundle written and `runc run`
  done). The image is already in the machine's cache (pulled once before timing), so no pull is counted.
  Each attempt is stopped (grace 0) and forgotten before the next one; only the start is timed.
  The process runtime runs the same assignment on the host (the image maps to the host's environment).
- submit → Running (with --api-starts N, default 20): the same trivial run submitted through the API of a
  local cluster (`astraeus up`, ASTRAEUS_RUNTIME=container or process, one machine with 8 simulated GPUs),
  timed from POST $API/runs until GET $API/workers/<run>-0 says Running (polled every 10 ms): the scheduler,
  the agent's long poll and its report included. The image is pulled by the first (untimed) run. Each run is
  deleted and its GPU freed before the next.
- pull time: `ImageCache.pull()` of an image not in the cache (a fresh cache folder each time) from the local
  registry: resolve the digest, copy the blobs, unpack the root filesystem. The busybox test image (one
  ~1 MiB layer) and the python test image (Debian bookworm minbase + python3); "disk MiB" is what the cache holds
  for it (root filesystem + blobs). The
  process runtime pulls nothing (0 s), shown for the side-by-side.

Needs root (runc) and the tools of tests/oci.py. Prints a table; asserts nothing.

    .venv/bin/python benchmarks/bench_containers.py            # 30 starts per runtime, 3 pulls per image
    .venv/bin/python benchmarks/bench_containers.py --starts 100 --pulls 5
    .venv/bin/python benchmarks/bench_containers.py --quick    # 5 starts, 1 pull (smoke)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.oci: the test images and the local registry
sys.path.insert(0, str(ROOT / "src"))

from tests import oci  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from astraeus_local import LocalAstraeus  # noqa: E402

from astraeus.agent.runtime.base import RUNNING  # noqa: E402
from astraeus.agent.runtime.container import ContainerRuntime, container_tools_missing, runc_version  # noqa: E402
from astraeus.agent.runtime.oci_images import ImageCache  # noqa: E402
from astraeus.agent.runtime.process import ProcessRuntime  # noqa: E402


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of the values."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def assignment(image: str, i: int) -> dict:
    return {"worker": f"bench.start-{i}", "attempt": 1, "run": "start", "desired": "Running", "image": image,
            "command": "sleep", "args": ["60"], "env": {"ASTRAEUS_JOB_NAME": "bench.start"},
            "workspace_number": 7}


def time_starts(rt, image: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        a = assignment(image, i)
        t0 = time.perf_counter()
        rt.start(a)
        while True:
            st = rt.status(a["worker"], 1)
            if st is not None and st.state == RUNNING:
                break
            if st is not None and st.final:
                raise RuntimeError(f"start {i} ended: {st.state} {st.message}")
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"start {i} not Running after 60 s: {st}")
            time.sleep(0.002)
        out.append(time.perf_counter() - t0)
        rt.stop(a["worker"], 1, grace=0, wait=True)
        rt.forget(a["worker"], 1)
    return out


def api_run(image: str, name: str) -> dict:
    return {"metadata": {"name": name},
            "spec": {"task_template": {"image": image, "command": "sleep", "args": ["60"], "restart_policy": "Never",
                                       "requested_resources": {"gpu_requests": {"count": 1}, "cpu_cores": 0.1,
                                                               "memory_bytes": 256 << 20}}}}


def time_api_starts(runtime: str, image: str, insecure: str, n: int) -> list[float]:
    """Submit → the worker Running, through a local cluster whose machine uses `runtime`."""
    saved = {k: os.environ.get(k) for k in ("ASTRAEUS_RUNTIME", "ASTRAEUS_INSECURE_REGISTRIES")}
    os.environ["ASTRAEUS_RUNTIME"] = runtime
    os.environ["ASTRAEUS_INSECURE_REGISTRIES"] = insecure
    out = []
    try:
        with LocalAstraeus(gpus=8, stop_grace=0) as ax:
            used = ax.get("/machines")["items"][0].get("runtime")
            if used and not str(used).startswith(runtime):
                raise RuntimeError(f"asked for the {runtime} runtime, the machine uses {used}")
            for i in range(n + 1):  # the first one pulls the image (container) and is not timed
                name = f"start-{i}"
                t0 = time.perf_counter()
                r = ax.client.post(ax.api + "/runs", json=api_run(image, name))
                if r.status_code != 201:
                    raise RuntimeError(f"POST /runs {name}: {r.status_code} {r.text}")
                while True:
                    w = ax.get(f"/workers/{name}-0")
                    if w["state"] == "Running":
                        break
                    if w["state"] in ("Failed", "Succeeded", "Completed") or time.perf_counter() - t0 > 120:
                        raise RuntimeError(f"{name}: {w['state']} {w.get('reason')}")
                    time.sleep(0.01)
                if i:
                    out.append(time.perf_counter() - t0)
                ax.delete(name)
                ax.wait_idle()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def time_pulls(ref: str, insecure: str, n: int, work: str) -> tuple[list[float], int]:
    out, size = [], 0
    for _ in range(n):
        root = tempfile.mkdtemp(prefix="pull-", dir=work)
        cache = ImageCache(root, insecure=[insecure])
        t0 = time.perf_counter()
        img = cache.pull(ref)
        out.append(time.perf_counter() - t0)
        size = img.size
        shutil.rmtree(root, ignore_errors=True)
    return out, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=30, help="timed starts per runtime (default 30)")
    ap.add_argument("--pulls", type=int, default=3, help="uncached pulls per image (default 3)")
    ap.add_argument("--api-starts", type=int, default=20,
                    help="runs submitted through a local cluster per runtime, submit → Running (default 20; 0: none)")
    ap.add_argument("--quick", action="store_true", help="5 starts, 1 pull, 5 API starts")
    args = ap.parse_args()
    if args.quick:
        args.starts, args.pulls, args.api_starts = 5, 1, 5
    missing = container_tools_missing() + oci.tools_missing()
    if missing:
        print(f"needs {', '.join(sorted(set(missing)))} (make system-deps installs them)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("the container runtime needs root: run this as root", file=sys.stderr)
        return 2

    work = tempfile.mkdtemp(prefix="bench-containers-")
    reg = oci.Registry()
    try:
        t0 = time.perf_counter()
        busybox = oci.push(oci.build_busybox_image(os.path.join(work, "busybox")), reg, "bench/busybox:1")
        python = oci.push(oci.build_python_image(os.path.join(work, "python")), reg, "bench/python:3.11")
        print(f"registry {reg.host}; images built and pushed in {time.perf_counter() - t0:.1f} s "
              f"({runc_version() or 'runc'}; {os.cpu_count()} CPUs; load average "
              f"{os.getloadavg()[0]:.1f})")

        # ---- pulls of an uncached image
        pulls = {}
        for name, ref in (("busybox", busybox), ("python", python)):
            times, size = time_pulls(ref, reg.host, args.pulls, work)
            pulls[name] = (times, size)

        # ---- starts with the image cached
        cache_dir = os.path.join(work, "images")
        ImageCache(cache_dir, insecure=[reg.host]).pull(busybox)
        crt = ContainerRuntime(os.path.join(work, "state-container"), stop_grace=0, image_cache_dir=cache_dir,
                               insecure_registries=[reg.host])
        prt = ProcessRuntime(os.path.join(work, "state-process"), stop_grace=0)
        time_starts(crt, busybox, 1)  # warm-up (page cache, the shim's imports), not counted
        time_starts(prt, busybox, 1)
        starts = {"container": time_starts(crt, busybox, args.starts),
                  "process": time_starts(prt, busybox, args.starts)}
        api = {}
        if args.api_starts > 0:
            api = {rt: time_api_starts(rt, busybox, reg.host, args.api_starts) for rt in ("container", "process")}
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"start latency, runtime.start() → Running, image cached, {args.starts} starts of `sleep 60` each")
    print(f"{'runtime':<12}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}{'max ms':>10}")
    for name, t in starts.items():
        ms = [x * 1000 for x in t]
        print(f"{name:<12}{pct(ms, 50):>10.0f}{pct(ms, 99):>10.0f}{statistics.mean(ms):>10.0f}{max(ms):>10.0f}")
    if api:
        print()
        print(f"submit → Running through a local cluster's API, image cached, {args.api_starts} runs of "
              "`sleep 60` each")
        print(f"{'runtime':<12}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}{'max ms':>10}")
        for name, t in api.items():
            ms = [x * 1000 for x in t]
            print(f"{name:<12}{pct(ms, 50):>10.0f}{pct(ms, 99):>10.0f}{statistics.mean(ms):>10.0f}{max(ms):>10.0f}")
    print()
    print(f"pull of an uncached image from the local registry (ImageCache.pull: resolve, copy, unpack), "
          f"{args.pulls} pulls each into a fresh cache")
    print(f"{'image':<12}{'disk MiB':>10}{'median s':>10}{'min s':>10}{'max s':>10}   process runtime")
    for name, (t, size) in pulls.items():
        print(f"{name:<12}{size / 2**20:>10.1f}{statistics.median(t):>10.2f}{min(t):>10.2f}{max(t):>10.2f}"
              f"   0 (runs on the host's environment)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
