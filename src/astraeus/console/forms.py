"""The console's forms → the API's JSON bodies. Pure functions: no database, no HTTP.

The bodies are validated afterwards by the API's own models (`spec.RunCreate`, `spec.DriveCreate`,
`bodies.WorkspacePatch`), so a bad value gets the API's message and the form refuses exactly what the API
refuses. A value is passed on as typed, never checked or clamped here; only what the API has no field for
(sizes such as 16G, durations such as 20m, the drives shorthand, memory quotas in GiB) is converted, with the
parsers of `astraeus.units` that the CLI uses too.
"""

from __future__ import annotations

import re
from typing import Any

from astraeus.units import GIB, UnitError, format_cpus, parse_duration, parse_memory

RUN_FIELDS = ("name", "image", "command", "args", "gpus", "machines", "cpus", "memory", "drives", "time_limit",
              "restart_policy", "priority", "start", "template", "pools")
RUN_DEFAULTS = {"restart_policy": "OnFailure", "priority": "0", "start": "Independent", "gpus": "0",
                "machines": "1"}
DRIVE_FIELDS = ("name", "kind", "machine", "filesystem", "path", "mount_path", "mode", "transport", "create")
RESERVATION_FIELDS = ("name", "cluster", "workspaces", "machines", "pool", "count", "start", "end")
ACCESS_FIELDS = ("host_paths", "max_priority", "weight", "quota_gpus", "quota_cpu_cores", "quota_memory_gib",
                 "quota_workers", "pools")


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


def names(text: str) -> list[str]:
    """A list field (pools, machines, workspaces): names separated by commas or spaces."""
    return [x for x in re.split(r"[\s,]+", (text or "").strip()) if x]


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
        except UnitError as e:
            raise FormError(str(e)) from None
    resources["gpu_requests"] = {"count": gpus}
    if f["machines"]:
        resources["machines"] = _number(f["machines"])
    resources["node_selection"] = {"mode": "Any"}
    if names(f["pools"]):
        resources["node_selection"]["pools"] = names(f["pools"])
    template: dict[str, Any] = {"image": f["image"], "command": f["command"], "args": args,
                                "restart_policy": f["restart_policy"] or "OnFailure"}
    if f["time_limit"]:
        try:
            template["time_limit_seconds"] = (int(f["time_limit"]) if f["time_limit"].isdigit()
                                              else parse_duration(f["time_limit"], "Time limit"))
        except UnitError as e:
            raise FormError(str(e)) from None
    template["requested_resources"] = resources
    template["datavolume_refs"] = parse_drives(f["drives"])
    spec: dict[str, Any] = {"priority": _number(f["priority"] or "0"), "start": f["start"] or "Independent",
                            "task_template": template}
    if f["template"]:  # New run → from a template: what the form does not show (env, configs, labels) comes from it,
        spec = {"template": f["template"], **spec}  # and so do the image, command and arguments left empty
        for k in ("image", "command", "args"):
            if not template[k]:
                del template[k]
    return {"metadata": {"name": f["name"]}, "spec": spec}


def _size(n: Any) -> str:
    """Bytes → the form's Memory text (64G, 1536M), exact."""
    if not isinstance(n, int) or n <= 0:
        return ""
    for unit, size in (("T", 1024**4), ("G", GIB), ("M", 1024**2), ("K", 1024)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return f"{n / 1024:g}K"


def template_values(spec: dict[str, Any]) -> dict[str, str]:
    """A run template's spec → the run form's values (New run → from a template), per GPU where GPUs are set as the
    form reads them; what the form has no field for stays in the template and reaches the run through it."""
    tt = spec.get("task_template") or {}
    rr = tt.get("requested_resources") or {}
    per_gpu = rr.get("per_gpu") or {}
    gpus = (rr.get("gpu_requests") or {}).get("count") or 0
    per = gpus if gpus > 0 else 1
    cpus = per_gpu.get("cpu_cores") if gpus and per_gpu.get("cpu_cores") else (
        rr["cpu_cores"] / per if rr.get("cpu_cores") else None)
    memory = per_gpu.get("memory_bytes") if gpus and per_gpu.get("memory_bytes") else (
        rr["memory_bytes"] // per if rr.get("memory_bytes") else None)
    drives = " ".join(f"{d.get('name')}:{d.get('mount_path')}" + (":ro" if d.get("mode") == "ReadOnly" else "")
                      for d in tt.get("datavolume_refs") or [])
    args = tt.get("args") or []
    if any(re.search(r"\s", a) or not a for a in args):
        args = []  # the form would split them: left empty, the run gets the template's own
    values = {"image": tt.get("image", ""), "command": tt.get("command", ""), "args": " ".join(args),
              "gpus": str(gpus), "machines": str(rr.get("machines", 1)),
              "cpus": f"{format_cpus(cpus)}" if cpus else "", "memory": _size(memory), "drives": drives,
              "time_limit": str(tt["time_limit_seconds"]) if tt.get("time_limit_seconds") else "",
              "restart_policy": tt.get("restart_policy", "OnFailure"), "priority": str(spec.get("priority", 0)),
              "start": spec.get("start", "Independent"),
              "pools": ", ".join((rr.get("node_selection") or {}).get("pools") or [])}
    return values


def drive_body(form: dict[str, str]) -> dict[str, Any]:
    """The new-drive form → the body of POST $API/drives."""
    f = {k: (form.get(k) or "").strip() for k in DRIVE_FIELDS}
    if f["kind"] not in ("", "one-machine", "shared-filesystem"):
        raise FormError(f"Kind {f['kind']!r}: choose On one machine or On a shared filesystem")
    if f["kind"] == "shared-filesystem":
        if not f["filesystem"]:
            raise FormError("Shared filesystem: give its name, as the machines declare it (astraeus agent "
                            "--shared-fs NAME=/mnt/path)")
        where = {"filesystem": f["filesystem"]}
    else:
        where = {"node": f["machine"]}
    return {
        "metadata": {"name": f["name"]},
        "spec": {
            "sources": [{**where, "path": f["path"], "mount_path": f["mount_path"], "mode": f["mode"] or "ReadWrite"}],
            "transport": f["transport"] or "Auto",
            "permissions": {"create": bool(f["create"])},
        },
    }


def _gib(text: str) -> Any:
    """Memory quota in GiB (or a size with a unit, 512G) → bytes; anything else as typed, for the API to refuse."""
    try:
        return int(float(text) * GIB)
    except (ValueError, OverflowError):
        pass
    try:
        return parse_memory(text, "Memory quota")
    except UnitError:
        return text


def access_body(form: dict[str, str], cluster: str) -> dict[str, Any]:
    """Settings → Clusters → Change → the body of PATCH $ORG_API/workspaces/{name} for this one cluster.

    An empty Max priority or Weight leaves it as it is; an empty quota field means no limit (null); empty Pools
    means every machine of the cluster (null)."""
    f = {k: (form.get(k) or "").strip() for k in ACCESS_FIELDS}
    conf: dict[str, Any] = {}
    if f["max_priority"]:
        conf["max_priority"] = f["max_priority"]
    if f["weight"]:
        conf["weight"] = f["weight"]
    conf["host_paths"] = [x.strip() for x in f["host_paths"].replace(",", "\n").splitlines() if x.strip()]
    conf["quota"] = {"gpus": f["quota_gpus"] or None, "cpu_cores": f["quota_cpu_cores"] or None,
                     "memory_bytes": _gib(f["quota_memory_gib"]) if f["quota_memory_gib"] else None,
                     "workers": f["quota_workers"] or None}
    conf["pools"] = names(f["pools"]) or None
    return {"clusters": {cluster: conf}}


def reservation_body(form: dict[str, str]) -> dict[str, Any]:
    """Settings → Reservations → New reservation → the body of POST $ORG_API/reservations. Machines by name, or a
    pool and a count; an empty Start means now, an empty End no end. Times go on as typed (ISO 8601), for the
    API to read or refuse."""
    f = {k: (form.get(k) or "").strip() for k in RESERVATION_FIELDS}
    body: dict[str, Any] = {"name": f["name"], "cluster": f["cluster"], "workspaces": names(f["workspaces"])}
    if f["machines"]:
        body["machines"] = names(f["machines"])
    if f["pool"]:
        body["pool"] = f["pool"]
    if f["count"]:
        body["count"] = _number(f["count"])
    if f["start"]:
        body["start"] = f["start"]
    body["end"] = f["end"] or None
    return body
