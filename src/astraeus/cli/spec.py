"""Pure parts of `astra astraeus run`: the duration and memory parsers, and the run spec it submits.

No I/O here, so everything is unit-tested without a server.
"""

from __future__ import annotations

import re
from typing import Any

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4


class SpecError(ValueError):
    """A user-facing problem with the options: the message says what to change."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str, option: str = "--time") -> int:
    """`20m`, `2h`, `1h30m`, `1d12h`, `90s`, `1.5h` → seconds. A unit is required."""
    s = text.strip().lower()
    pos, total, seen = 0, 0.0, False
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos, seen = m.end(), True
    if not seen or pos != len(s):
        raise SpecError(f"{option} {text!r}: give a duration with a unit, e.g. 20m, 2h, 1h30m, 1d12h or 90s")
    seconds = int(round(total))
    if seconds <= 0:
        raise SpecError(f"{option} {text!r}: the time limit must be more than 0 seconds")
    return seconds


_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt])(i?b?)$", re.IGNORECASE)
_MEM_UNITS = {"k": KIB, "m": MIB, "g": GIB, "t": TIB}


def parse_memory(text: str, option: str = "--mem") -> int:
    """`16G`, `500M`, `1T`, `512Mi`, `16GiB`, `16GB` → bytes (binary units: 16G is 16 GiB). A unit is required."""
    m = _MEM.match(text.strip())
    if not m:
        raise SpecError(f"{option} {text!r}: give an amount with a unit, e.g. 16G, 500M or 1T")
    value = int(round(float(m.group(1)) * _MEM_UNITS[m.group(2).lower()]))
    if value <= 0:
        raise SpecError(f"{option} {text!r}: the amount must be more than 0")
    return value


def parse_env(items: list[str]) -> dict[str, str]:
    """`K=V` pairs (repeatable `--env`) → a dict; the value may contain `=`."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--env {item!r}: give KEY=VALUE")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise SpecError(f"--env {item!r}: {key!r} is not a valid environment variable name")
        env[key] = value
    return env


def format_cpus(value: float) -> int | float:
    """Whole core counts as ints in the JSON (32, not 32.0)."""
    return int(value) if float(value).is_integer() else value


def build_run_spec(
    *,
    name: str,
    command: list[str],
    image: str | None = None,
    gpus: int | None = None,
    machines: int | None = None,
    cpus: float | None = None,
    mem: str | None = None,
    time: str | None = None,
    env: list[str] | None = None,
    cluster: str | None = None,
    start: str = "Independent",
) -> dict[str, Any]:
    """The spec `astra astraeus run` submits (the page's urgent.json for its example).

    With GPUs, `cpus` and `mem` are per GPU: `--gpus 8 --cpus 4 --mem 16G` asks for 32 cores and 128 GiB in all.
    Without GPUs they are the totals. `command` is passed exactly: the first word is the command, the rest its
    arguments, spaces and quotes kept.
    """
    if not name:
        raise SpecError("give the run a name with --name")
    if not image:
        raise SpecError("give the container image with --image, e.g. --image pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime")
    if not command:
        raise SpecError("give the command to run after --, e.g. astra astraeus run --name N -- python train.py")
    if gpus is not None and gpus < 0:
        raise SpecError(f"--gpus {gpus}: must be 0 or more")
    if machines is not None and machines < 1:
        raise SpecError(f"--machines {machines}: must be 1 or more")
    if cpus is not None and cpus <= 0:
        raise SpecError(f"--cpus {cpus:g}: must be more than 0")
    if start not in ("Independent", "Gang"):
        raise SpecError(f"--start {start}: use Independent or Gang")

    per = gpus if gpus else 1  # with GPUs, cpus and mem are per GPU
    resources: dict[str, Any] = {}
    if cpus is not None:
        resources["cpu_cores"] = format_cpus(cpus * per)
    if mem is not None:
        resources["memory_bytes"] = parse_memory(mem) * per
    if gpus:
        resources["gpu_requests"] = {"count": gpus}
    if machines is not None:
        resources["machines"] = machines
    resources["node_selection"] = {"mode": "Any"}

    template: dict[str, Any] = {"image": image, "command": command[0]}
    template["args"] = list(command[1:])
    if env:
        template["env"] = parse_env(env)
    template["restart_policy"] = "Never"
    if time is not None:
        template["time_limit_seconds"] = parse_duration(time)
    template["requested_resources"] = resources

    spec: dict[str, Any] = {"start": start}
    if cluster:
        spec["cluster"] = cluster
    spec["task_template"] = template
    return {"metadata": {"name": name}, "spec": spec}
