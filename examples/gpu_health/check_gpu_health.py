"""Read this machine's real GPU health from NVML, as the Astraeus agent does (astraeus.agent.health), and print it.

    .venv/bin/python examples/gpu_health/check_gpu_health.py [--watch SECONDS] [--json]

One line per GPU (its index, name, and its faults or `ok`), after watching XID events for --watch seconds (default
5). Exits 0 when no GPU has a fatal fault, 1 when one has (so it also serves as ASTRAEUS_HEALTH_CHECK_COMMAND: its
first line of output is then the drain's reason), 2 when there is no NVML here (no driver, no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from astraeus.agent.health import NvmlHealth


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--watch", type=float, default=5.0, help="seconds to wait for XID events (default 5)")
    ap.add_argument("--json", action="store_true", help="print the faults as JSON")
    args = ap.parse_args()
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:  # noqa: BLE001 - whatever stops NVML, said plainly
        print(f"no NVML here: {e}")
        return 2
    health = NvmlHealth(pynvml, count)
    end = time.monotonic() + args.watch
    while time.monotonic() < end:
        health.wait_xids(int(min(1.0, max(0.0, end - time.monotonic())) * 1000))
    faults = health.faults()
    fatal = [f for f in faults if f.fatal]
    if args.json:
        print(json.dumps([f.model_dump() for f in faults]))
    else:
        for f in fatal:  # first: a failed health check's first line is the drain's reason
            print(f"GPU {f.index} failed ({f.what})")
        for i in range(count):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            mine = [f"{f.what}{'' if f.fatal else ' (not fatal)'}" for f in faults if f.index == i]
            print(f"GPU {i} {name}: {'; '.join(mine) or 'ok'}")
        print(f"{count} GPU(s), {len(fatal)} with a fatal fault; XIDs watched for {args.watch:g}s "
              f"({'supported' if health.events is not None else 'not supported here'})")
    pynvml.nvmlShutdown()
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
