"""The console's forms → the API's JSON bodies. Pure functions: no database, no HTTP.

The bodies are validated afterwards by the API's own models (`spec.RunCreate`, `spec.DriveCreate`), so a bad
value gets the API's message. Only what the API has no field for (sizes such as 16G, durations such as 20m,
the drives shorthand) is parsed here, with the CLI's parsers.
"""

from __future__ import annotations

import re
from typing import Any

from astraeus.cli.spec import SpecError, format_cpus, parse_duration, parse_memory

RUN_FIELDS = ("name", "image", "command", "args", "gpus", "machines", "cpus", "memory", "drives", "time_limit",
              "restart_policy", "priority", "start")
RUN_DEFAULTS = {"restart_policy": "OnFailure", "priority": "0", "start": "Independent", "gpus": "0",
                "machines": "1"}
DRIVE_FIELDS = ("name", "kind", "machine", "path", "mount_path", "mode", "transport", "create")


class FormError(ValueError):
    """A value the form could not turn into the API's JSON; the message says what to change."""


def _number(text: str, integer: bool = True) -> Any:
    """A number when it is one; else the text as given, so that the API's model says what is wrong with it."""
    s = (text or "").strip()
    try:
        return int(s) if integer else format_cpus(float(s))
    except ValueError:
        return s


def split_args(text: str) -> list[str]:
    """The Arguments field splits on spaces; quotes are not understood (Edit as JSON for those)."""
    return (text or "").split()


def parse_drives(text: str) -> list[dict[str, str]]:
    """`ft-ckpt:/ckpt data:/data:ro` → datavolume_refs."""
    refs = []
    for item in re.split(r"[\s,]+", (text or "").strip()):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1] or (len(parts) == 3 and parts[2] not in
                                                                         ("ro", "rw")):
            raise FormError(f"Drives {item!r}: write NAME:/mount/path, or NAME:/mount/path:ro for read-only")
        mode = "ReadOnly" if len(parts) == 3 and parts[2] == "ro" else "ReadWrite"
        refs.append({"name": parts[0], "mount_path": parts[1], "mode": mode})
    return refs


def run_body(form: dict[str, str]) -> dict[str, Any]:
    """The run form → the body of POST $API/runs. With GPUs, CPU cores and memory are per GPU (as the CLI)."""
    f = {k: (form.get(k) or "").strip() for k in RUN_FIELDS}
    args = split_args(form.get("args") or "")
    gpus = _number(f["gpus"] or "0")
    per = gpus if isinstance(gpus, int) and gpus > 0 else 1
    resources: dict[str, Any] = {}
    if f["cpus"]:
        cpus = _number(f["cpus"], integer=False)
        resources["cpu_cores"] = format_cpus(cpus * per) if isinstance(cpus, int | float) else cpus
    if f["memory"]:
        try:
            resources["memory_bytes"] = parse_memory(f["memory"], "Memory") * per
        except SpecError as e:
            raise FormError(str(e)) from None
    resources["gpu_requests"] = {"count": gpus}
    if f["machines"]:
        resources["machines"] = _number(f["machines"])
    resources["node_selection"] = {"mode": "Any"}
    template: dict[str, Any] = {"image": f["image"], "command": f["command"], "args": args,
                                "restart_policy": f["restart_policy"] or "OnFailure"}
    if f["time_limit"]:
        try:
            template["time_limit_seconds"] = (int(f["time_limit"]) if f["time_limit"].isdigit()
                                              else parse_duration(f["time_limit"], "Time limit"))
        except SpecError as e:
            raise FormError(str(e)) from None
    template["requested_resources"] = resources
    template["datavolume_refs"] = parse_drives(f["drives"])
    spec: dict[str, Any] = {"priority": _number(f["priority"] or "0"), "start": f["start"] or "Independent",
                            "task_template": template}
    return {"metadata": {"name": f["name"]}, "spec": spec}


def drive_body(form: dict[str, str]) -> dict[str, Any]:
    """The new-drive form → the body of POST $API/drives."""
    f = {k: (form.get(k) or "").strip() for k in DRIVE_FIELDS}
    if f["kind"] not in ("", "one-machine"):
        raise FormError(f"Kind {f['kind']!r}: only On one machine is offered here; use the API for others")
    return {
        "metadata": {"name": f["name"]},
        "spec": {
            "sources": [{"node": f["machine"], "path": f["path"], "mount_path": f["mount_path"],
                         "mode": f["mode"] or "ReadWrite"}],
            "transport": f["transport"] or "Auto",
            "permissions": {"create": bool(f["create"])},
        },
    }
