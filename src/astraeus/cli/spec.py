"""Pure parts of `astra astraeus run`: the duration and memory parsers, and the run spec it submits.

No I/O here, so everything is unit-tested without a server.
"""

from __future__ import annotations

import re

# Sizes and durations live in astraeus.units (shared with the console and the server); SpecError is its error
# class, so a size or duration the user must rewrite is refused like any other option.
from astraeus.units import GIB, KIB, MIB, TIB, format_cpus, parse_duration, parse_memory  # noqa: F401
from astraeus.units import UnitError as SpecError

TYPE_CHECKING = False  # typing is not imported to run a command: it costs its start
if TYPE_CHECKING:
    from typing import Any


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
