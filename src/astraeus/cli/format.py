"""Pure text formatting for the CLI: tables (runs, squeue, events, drives, machines) and `describe`."""

from __future__ import annotations

import re

from astraeus.units import (  # sizes and durations live in astraeus.units  # noqa: F401 - GPUs as the views show them: the console shows them alike
    compress_ints,
    gpus_asked,
    human_bytes,
    human_duration,
    machine_mig,
    machine_shared,
    mig_shown,
    worker_gpus,
)

TYPE_CHECKING = False  # typing and datetime are imported where used: a command that needs neither starts sooner
if TYPE_CHECKING:
    from datetime import datetime
    from typing import Any

# --- terminal safety -----------------------------------------------------------------------------------------------
#
# Text from the server (log lines, names, labels, reasons, args, events, …) is written by other people: shown as it
# is, an escape sequence in it would clear the reader's screen, set their window title, plant an OSC 8 link, hide
# or reorder text (carriage return, backspace, bidi overrides) — or, through some terminals, do worse. Everything
# the CLI prints that it did not make itself goes through terminal_safe(), as kubectl and git escape such text.

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
# DEL, C1 controls, the bidi marks, embeddings, overrides and isolates, and lone surrogates (which a JSON string may
# hold and no terminal encoding can write); with the C0 controls, all of them in table cells and messages, all but
# tab and newline in log output.
_OTHER_CONTROLS = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(rf"[\x00-\x1f{_OTHER_CONTROLS}]")
_UNSAFE_IN_LOGS = re.compile(rf"[\x00-\x08\x0b-\x1f{_OTHER_CONTROLS}]")


def _escaped(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: Any, *, lines: bool = False) -> str:
    """`text` with every character that a terminal would act on instead of showing written out as an escape:
    ESC as `\\x1b`, BEL as `\\x07`, CR as `\\r`, C1 controls as `\\x9b`, bidi controls as `\\u202e`. Printable text,
    other Unicode and backslashes are kept as they are.

    `lines=True` (log output) keeps tab and newline, so a log's lines stay lines; otherwise (table cells, fields,
    messages) they are escaped too, so that a value cannot break its table or forge a line. Not str: str() of it;
    None: ""."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    pattern = _UNSAFE_IN_LOGS if lines else _UNSAFE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escaped, text)

# `astra astraeus runs`: the page's columns, widths 30, 14, 12, then the reason.
RUNS_COLUMNS = (("NAME", 30), ("CLUSTER", 14), ("STATE", 12))


def _cell(text: str, width: int) -> str:
    """Left-aligned in `width`, with at least one space after it when it is longer."""
    return text.ljust(width - 1) + " " if len(text) < width else text + " "


def runs_table(runs: list[dict[str, Any]]) -> str:
    lines = ["".join(_cell(h, w) for h, w in RUNS_COLUMNS) + "REASON"]
    for run in runs:
        meta, status = run.get("metadata") or {}, run.get("status") or {}
        cluster = meta.get("cluster") or (run.get("spec") or {}).get("cluster") or ""
        cells = (terminal_safe(meta.get("name", "")), terminal_safe(cluster), terminal_safe(status.get("state", "")))
        line = "".join(_cell(c, w) for c, (_, w) in zip(cells, RUNS_COLUMNS, strict=True)) + terminal_safe(
            status.get("reason") or "")
        lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


RUN_STATES = ("Pending", "Starting", "Running", "Stopping", "Completed", "Failed", "Cancelled")  # the API's


def runs_wide_table(runs: list[dict[str, Any]], now: datetime | None = None) -> str:
    """`astra astraeus runs -o wide`: the table's columns with PRIORITY, GPUS (in all), USER (who submitted it,
    else its workspace, as squeue's USER) and AGE (since it was submitted)."""
    from datetime import UTC, datetime

    now = now or datetime.now(UTC)
    rows = []
    for run in runs:
        meta, spec, status = run.get("metadata") or {}, run.get("spec") or {}, run.get("status") or {}
        resources = (spec.get("task_template") or {}).get("requested_resources") or {}
        gpus = gpus_asked(resources)
        created = parse_time(meta.get("created_at"))
        age = human_duration(max(0.0, (now - created).total_seconds())) if created else ""
        priority = spec.get("priority")
        rows.append([meta.get("name", ""), meta.get("cluster") or spec.get("cluster") or "", status.get("state", ""),
                     "" if priority is None else priority, gpus,
                     meta.get("created_by") or meta.get("user") or meta.get("workspace") or "", age,
                     status.get("reason") or ""])
    return table(["NAME", "CLUSTER", "STATE", "PRIORITY", "GPUS", "USER", "AGE", "REASON"], rows)


def to_yaml(data: Any) -> str:
    """`-o yaml`: the API's JSON as YAML, keys in the API's order (PyYAML is imported only here)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def table(headers: list[str], rows: list[list[Any]], gap: int = 2) -> str:
    """A plain left-aligned table, each column as wide as its widest cell plus `gap`; every cell terminal-safe (a
    control character, a tab or a newline in it is written out as an escape)."""
    cells = [[terminal_safe(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out = []
    for row in [headers, *cells]:
        parts = [c.ljust(widths[i] + gap) if i < len(row) - 1 else c for i, c in enumerate(row)]
        out.append("".join(parts).rstrip())
    return "\n".join(out) + "\n"


# --- sizes, times ---------------------------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    """An API time (RFC 3339 text or epoch seconds) → an aware datetime."""
    from datetime import UTC, datetime

    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def show_time(value: Any) -> str:
    from datetime import UTC

    t = parse_time(value)
    if t is None:
        return "" if value is None else str(value)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def slurm_elapsed(seconds: int | float) -> str:
    """Slurm's TIME column: M:SS, H:MM:SS, D-HH:MM:SS."""
    s = max(0, int(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


# --- squeue ----------------------------------------------------------------------------------------------------

SLURM_STATE = {
    "Pending": "PD",
    "Starting": "R",
    "Running": "R",
    "Stopping": "CG",
    "Completed": "CD",
    "Failed": "F",
    "Cancelled": "CA",
}
TERMINAL = {"Completed", "Failed", "Cancelled"}

# Slurm's default `%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R`; the job id is the run's name and is never cut.
SQUEUE_FIELDS = (("JOBID", 18), ("PARTITION", 9), ("NAME", 8), ("USER", 8), ("ST", 2), ("TIME", 10),
                 ("NODES", 6))


def run_elapsed(run: dict[str, Any], now: datetime) -> float:
    status = run.get("status") or {}
    state = status.get("state")
    if state == "Pending":
        return 0
    workers = status.get("workers") or []
    starts = [t for t in (parse_time(w.get("started_at")) for w in workers) if t]
    start = parse_time(status.get("started_at")) or (min(starts) if starts else None)
    if start is None:
        return 0
    end = now
    if state in TERMINAL:
        ends = [t for t in (parse_time(w.get("finished_at")) for w in workers) if t]
        end = parse_time(status.get("finished_at")) or (max(ends) if ends else now)
    return max(0.0, (end - start).total_seconds())


def _machines_of(run: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for w in (run.get("status") or {}).get("workers") or []:
        m = w.get("machine")
        if m and m not in names:
            names.append(m)
    return names


def squeue_table(runs: list[dict[str, Any]], now: datetime | None = None) -> str:
    from datetime import UTC, datetime

    now = now or datetime.now(UTC)
    header = " ".join(h.rjust(w) for h, w in SQUEUE_FIELDS) + " NODELIST(REASON)"
    lines = [header]
    for run in runs:
        meta, spec, status = run.get("metadata") or {}, run.get("spec") or {}, run.get("status") or {}
        state = status.get("state", "")
        st = SLURM_STATE.get(state, state[:2].upper())
        resources = (spec.get("task_template") or {}).get("requested_resources") or {}
        nodes = resources.get("machines") or len(status.get("workers") or []) or 1
        machines = _machines_of(run)
        reason = terminal_safe(status.get("reason") or "")
        if status.get("held") and state == "Pending":
            reason = "JobHeldUser"  # scontrol hold, in Slurm's word
        if st == "PD" or not machines:
            where = f"({reason})" if reason else "(None)"
        else:
            where = terminal_safe(",".join(machines))
        name = terminal_safe(meta.get("name", ""))
        job = terminal_safe((spec.get("array") or {}).get("job") or name)  # a job array's runs: JOBID job_3, NAME job
        values = (name, terminal_safe(meta.get("cluster") or spec.get("cluster") or ""), job,
                  terminal_safe(meta.get("created_by") or meta.get("workspace") or ""), terminal_safe(st),
                  slurm_elapsed(run_elapsed(run, now)),
                  terminal_safe(nodes))
        cells = [v.rjust(w) if i == 0 else v[:w].rjust(w) for i, (v, (_, w)) in enumerate(
            zip(values, SQUEUE_FIELDS, strict=True))]
        lines.append(" ".join(cells) + " " + where)
    return "\n".join(lines) + "\n"


# --- other tables ------------------------------------------------------------------------------------------------


def events_table(events: list[dict[str, Any]]) -> str:
    rows = [[show_time(e.get("time")), e.get("kind", ""), e.get("object", ""), e.get("message", "")] for e in events]
    return table(["TIME", "KIND", "OBJECT", "MESSAGE"], rows)


def machines_table(machines: list[dict[str, Any]]) -> str:
    """Machines; a POOLS column (the pools each is in) when the API says which (control planes since pools), a MIG
    column (each MIG GPU's devices free: `machine_mig`) when a machine has MIG devices, a SHARED column (each GPU that
    fractional workers share, with the part of it free: `machine_shared`) when one has such a GPU."""
    pools = any("pools" in m for m in machines)
    mig = any(m.get("gpu_mig") for m in machines)
    shared = [machine_shared(m) for m in machines]
    rows = []
    for m in machines:
        state = m.get("state", "") + (f" ({m['reason']})" if m.get("reason") else "")  # e.g. disk pressure
        row = [m.get("name", ""), m.get("cluster", ""), state, m.get("gpus", 0),
               m.get("gpus_used", 0), m.get("gpus_free", 0), _num(m.get("cpu_cores")),
               human_bytes(m.get("memory_bytes")), m.get("runtime") or "", m.get("address") or "",
               ",".join(sorted(m.get("shared_filesystems") or {}))]
        if pools:
            row.insert(3, ",".join(m.get("pools") or []) or "-")
        if mig:  # after GPUS FREE
            row.insert(6 + pools, machine_mig(m) or "-")
        if any(shared):  # after GPUS FREE and MIG
            row.insert(6 + pools + mig, shared[len(rows)] or "-")
        rows.append(row)
    headers = ["NAME", "CLUSTER", "STATE", "GPUS", "GPUS USED", "GPUS FREE", "CPUS", "MEMORY", "RUNTIME", "ADDRESS",
               "SHARED FS"]
    if pools:
        headers.insert(3, "POOLS")
    if mig:
        headers.insert(6 + pools, "MIG")
    if any(shared):
        headers.insert(6 + pools + mig, "SHARED")
    return table(headers, rows)


def pools_table(items: list[dict[str, Any]]) -> str:
    """`astra astraeus pools`: the pools the workspace may use."""
    rows = [[p.get("name", ""), p.get("cluster", ""), ",".join(p.get("machines") or []) or "-", p.get("gpus", 0),
             p.get("free_gpus", 0)] for p in items]
    return table(["NAME", "CLUSTER", "MACHINES", "GPUS", "FREE GPUS"], rows)


def reservations_table(items: list[dict[str, Any]]) -> str:
    """`astra astraeus reservations`: times in UTC; no end: `-`."""
    rows = [[r.get("name", ""), r.get("cluster", ""), ",".join(r.get("machines") or []), show_time(r.get("start")),
             show_time(r.get("end")) if r.get("end") else "-", r.get("state", "")] for r in items]
    return table(["NAME", "CLUSTER", "MACHINES", "START", "END", "STATE"], rows)


def _on(p: dict[str, Any]) -> str:
    gpus = p.get("gpu_indices") or []
    return f"{p.get('machine', '')} (GPUs {','.join(str(i) for i in gpus)})" if gpus else str(p.get("machine", ""))


def what_if(answer: dict[str, Any]) -> str:
    """`astra astraeus run --what-if`: the answer's sentence, then where each worker would go, whom it would
    preempt, and why each waiting worker is not placed on each machine."""
    lines = [str(answer.get("message") or answer.get("reason") or answer.get("outcome") or "")]
    if answer.get("outcome") != "Starts" and answer.get("reason") and answer.get("reason") != lines[0]:
        lines.append(f"Reason: {answer['reason']}")
    for p in answer.get("placements") or []:
        lines.append(f"  {p.get('worker', '')} on {_on(p)}")
    if answer.get("preempts"):
        lines.append(f"Would preempt: {', '.join(answer['preempts'])}")
    why = answer.get("why_not") or {}
    if why:
        lines.append("Why not:")
        for worker, items in why.items():
            for item in items:
                lines.append(f"  {worker} {item.get('machine', '')}: {item.get('reason', '')}")
    return "\n".join(terminal_safe(line) for line in lines) + "\n"


def slurm_time(value: Any) -> str:
    """Slurm's `YYYY-MM-DDTHH:MM:SS` (UTC here)."""
    from datetime import UTC, datetime

    t = parse_time(value) or datetime.now(UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def sbatch_test_only(answer: dict[str, Any], name: str, processors: int, partition: str | None) -> tuple[str, bool]:
    """`astra slurm sbatch --test-only`, as Slurm prints it: (the line, whether the job would start)."""
    outcome = answer.get("outcome")
    if outcome == "Starts":
        when = slurm_time(None)
    elif outcome in ("Preempts", "Head", "Queued") and answer.get("starts_by"):
        when = slurm_time(answer["starts_by"])
    else:
        why = terminal_safe(answer.get("reason") or answer.get("message") or outcome)
        return f"sbatch: Job {name} would not start: {why}", False
    nodes = list(dict.fromkeys(p.get("machine", "") for p in answer.get("placements") or []))
    on = f" on nodes {','.join(nodes)}" if nodes else ""
    where = partition or answer.get("cluster") or ""
    return terminal_safe(f"sbatch: Job {name} to start at {when} using {processors} processors{on} in partition "
                         f"{where}"), True


def registries_table(items: list[dict[str, Any]]) -> str:
    """A workspace's registry credentials: never a password (the API never gives one)."""
    rows = [[r.get("registry", ""), r.get("username", ""), r.get("updated_at") or ""] for r in items]
    return table(["REGISTRY", "USERNAME", "UPDATED"], rows)


def drives_table(drives: list[dict[str, Any]]) -> str:
    rows = []
    for d in drives:
        meta, spec, status = d.get("metadata") or {}, d.get("spec") or {}, d.get("status") or {}
        sources = spec.get("sources") or []
        where = ", ".join(f"{s.get('node')}:{s.get('path')}" if s.get("node") else
                          f"{s.get('filesystem')}:{s.get('path')} (shared)" if s.get("filesystem") else
                          str(s.get("path", "")) for s in sources)
        mounts = sorted({s.get("mount_path", "") for s in sources if s.get("mount_path")})
        modes = sorted({s.get("mode", "") for s in sources if s.get("mode")})
        rows.append([meta.get("name", ""), ", ".join(mounts), ", ".join(modes), spec.get("transport", ""),
                     status.get("state", ""), where])
    return table(["NAME", "MOUNT", "MODE", "TRANSPORT", "STATE", "SOURCES"], rows)


def templates_table(items: list[dict[str, Any]]) -> str:
    """A workspace's run templates: what each gives a run (its priority, image and drives at their mounts)."""
    rows = []
    for t in items:
        meta, spec = t.get("metadata") or {}, t.get("spec") or {}
        tt = spec.get("task_template") or {}
        drives = ", ".join(f"{d.get('name')}:{d.get('mount_path')}" for d in tt.get("datavolume_refs") or [])
        rows.append([meta.get("name", ""), _num(meta.get("version")), _num(spec.get("priority")),
                     tt.get("image", ""), drives, meta.get("updated_at") or ""])
    return table(["NAME", "VERSION", "PRIORITY", "IMAGE", "DRIVES", "UPDATED"], rows)


def schedules_table(items: list[dict[str, Any]]) -> str:
    """A workspace's schedules: when each ticks, its last tick's outcome, its next tick and its runs not ended."""
    rows = []
    for s in items:
        meta, spec, st = s.get("metadata") or {}, s.get("spec") or {}, s.get("status") or {}
        last = st.get("last_tick") or {}
        nxt = st.get("next_tick") or {}
        rows.append([meta.get("name", ""), spec.get("schedule", ""), spec.get("timezone", ""),
                     spec.get("concurrency", ""), f"{last.get('tick')} {last.get('outcome')}" if last else "",
                     "suspended" if st.get("suspended") else (nxt.get("at") or ""),
                     ", ".join(st.get("active") or [])])
    return table(["NAME", "SCHEDULE", "TIMEZONE", "CONCURRENCY", "LAST TICK", "NEXT TICK", "ACTIVE"], rows)

def _num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


# --- describe ----------------------------------------------------------------------------------------------------


def resources_summary(resources: dict[str, Any]) -> str:
    parts = []
    gpus = (resources.get("gpu_requests") or {}).get("count")
    fraction = (resources.get("gpu_requests") or {}).get("fraction")
    mig = (resources.get("gpu_requests") or {}).get("mig")
    if mig:
        parts.append(mig_shown(gpus or 0, mig))
    elif fraction:
        parts.append(f"{fraction:g} of one GPU (shared)")
    elif gpus:
        parts.append(f"{gpus} GPU{'s' if gpus != 1 else ''}")
        per_machine = (resources.get("gpu_requests") or {}).get("min_per_machine")
        if per_machine:
            parts[-1] += f" ({per_machine} per machine)"
    if resources.get("cpu_cores") is not None:
        parts.append(f"{_num(resources['cpu_cores'])} CPU cores")
    if resources.get("memory_bytes") is not None:
        parts.append(f"{human_bytes(resources['memory_bytes'])} memory")
    per_gpu = resources.get("per_gpu") or {}
    if per_gpu:
        each = []
        if per_gpu.get("cpu_cores") is not None:
            each.append(f"{_num(per_gpu['cpu_cores'])} CPU cores")
        if per_gpu.get("memory_bytes") is not None:
            each.append(f"{human_bytes(per_gpu['memory_bytes'])} memory")
        parts.append(" and ".join(each) + " per GPU")
    machines = resources.get("machines")
    if machines:
        parts.append(f"{machines} machine{'s' if machines != 1 else ''}")
    sel = resources.get("node_selection") or {}
    if sel and sel.get("mode") not in (None, "Any"):
        parts.append(f"machines: {sel.get('mode')} {sel.get('names') or sel.get('labels') or ''}".rstrip())
    return ", ".join(parts) if parts else "defaults"


def describe_run(run: dict[str, Any]) -> str:
    meta, spec, status = run.get("metadata") or {}, run.get("spec") or {}, run.get("status") or {}
    tt = spec.get("task_template") or {}
    workers = status.get("workers") or []
    fields: list[tuple[str, Any]] = [("Name", meta.get("name"))]
    ws = meta.get("workspace")
    if ws or meta.get("namespace"):
        fields.append(("Workspace", f"{ws} ({meta['namespace']})" if ws and meta.get("namespace") else ws or
                       meta.get("namespace")))
    fields += [
        ("Cluster", meta.get("cluster") or spec.get("cluster")),
        ("Labels", ", ".join(f"{k}={v}" for k, v in (meta.get("labels") or {}).items()) or None),
        ("Template", f"{meta['template'].get('name')} (version {meta['template'].get('version')})"
         if isinstance(meta.get("template"), dict) else None),
        ("Created", show_time(meta.get("created_at")) or None),
        ("Created by", meta.get("created_by")),
        ("Changed by", meta.get("updated_by") if meta.get("updated_by") != meta.get("created_by") else None),
        ("State", status.get("state")),
        ("Reason", status.get("reason")),
        ("Console", status.get("console_url")),
        ("Priority", spec.get("priority", 0)),
        ("Start", spec.get("start")),
        ("Image", tt.get("image")),
    ]
    environments = sorted({w.get("environment") for w in workers if w.get("environment")})
    if environments:
        fields.append(("Environment", ", ".join(environments) + " (where the image runs on this cluster)"))
    command = [tt.get("command")] + list(tt.get("args") or []) if tt.get("command") else list(tt.get("args") or [])
    fields += [
        ("Command", _shell_words(command) if command else None),
        ("Resources", resources_summary(tt.get("requested_resources") or {})),
        ("Time limit", human_duration(tt.get("time_limit_seconds")) or "none"),
        ("Restart policy", tt.get("restart_policy")),
    ]
    env = tt.get("env") or {}
    if env:
        fields.append(("Env", ", ".join(f"{k}={v.get('value') if isinstance(v, dict) else v}"
                                        + (" (secret)" if isinstance(v, dict) and v.get("secret") else "")
                                        for k, v in env.items())))
    drives = tt.get("datavolume_refs") or []
    if drives:
        fields.append(("Drives", ", ".join(f"{d.get('name')} at {d.get('mount_path')} ({d.get('mode', 'ReadWrite')})"
                                           for d in drives)))
    configs = tt.get("configs") or []
    if configs:
        fields.append(("Configs", ", ".join(m + (" (secret)" if c.get("secret") else "") for c in configs
                                            for m in (c.get("mounts") or []))))
    if status.get("preemptions"):
        fields.append(("Preemptions", status["preemptions"]))

    width = max(len(k) for k, _ in fields) + 2
    out = [f"{(k + ':').ljust(width)}{terminal_safe(v)}" for k, v in fields if v is not None and v != ""]

    out.append("")
    out.append("Workers:")
    if workers:
        rows = []
        for w in workers:
            gpus = worker_gpus(w)
            rows.append([w.get("name", ""), w.get("state", ""), w.get("restarts", 0), w.get("preemptions", 0),
                         w.get("machine") or "-", gpus or "-", w.get("reason") or ""])
        out += ["  " + line for line in table(["NAME", "STATE", "RESTARTS", "PREEMPTIONS", "MACHINE", "GPUS",
                                               "REASON"], rows).splitlines()]
    else:
        out.append("  (none yet)")

    history = status.get("history") or []
    out.append("")
    out.append("History:")
    if history:
        rows = [[show_time(h.get("time")), h.get("state", ""), h.get("reason") or ""] for h in history]
        out += ["  " + line for line in table(["TIME", "STATE", "REASON"], rows).splitlines()]
    else:
        out.append("  (none)")

    for w in workers:
        why = w.get("why_not") or []
        if w.get("state") in ("Pending", "Starting") and why:
            out.append("")
            out.append(terminal_safe(f"Why it is not running yet ({w.get('name')}):"))
            for item in why:
                out.append(terminal_safe(f"  {item.get('machine', '?')}: {item.get('reason', '')}"))
    return "\n".join(out) + "\n"


def replica_groups_table(items: list[dict[str, Any]]) -> str:
    """A workspace's replica groups: replicas wanted, alive and running, and why some are missing."""
    rows = []
    for g in items:
        meta, spec, st = g.get("metadata") or {}, g.get("spec") or {}, g.get("status") or {}
        run = spec.get("run") or {}
        note = f"waiting until {st['retry_at']}" if st.get("retry_at") else ""
        rows.append([meta.get("name", ""), _num(spec.get("replicas")), _num(st.get("alive")), _num(st.get("running")),
                     _num(run.get("priority", 0)), run.get("template") or "", note])
    return table(["NAME", "REPLICAS", "ALIVE", "RUNNING", "PRIORITY", "TEMPLATE", "NOTE"], rows)


def _shell_words(command: list) -> str:
    import shlex  # describe's alone: not on every command's start

    return shlex.join(str(c) for c in command)
