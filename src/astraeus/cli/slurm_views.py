"""Slurm's views of Astraeus's runs, machines and pools, as pure functions (no HTTP): `sinfo`, `sacct`, `scontrol
show job`, and what `squeue` keeps (its states, users and MinJobAge).

Words: a partition is a pool (a cluster without pools: one partition named after the cluster, the default `*`); a
job is a run, its JobID the run's name, its numeric job id (SLURM_JOB_ID, `sbatch --parsable`) the run's
`metadata.job_id`; a job step is one of its workers (`NAME.INDEX`); the account and the user are
the run's workspace. Times are shown in local time as Slurm shows them (2026-12-06T21:08:57).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from astraeus.cli.errors import ViewError  # noqa: F401 - defined apart for the shared error handler
from astraeus.cli.format import parse_time, terminal_safe

TYPE_CHECKING = False  # typing is not imported to run a command: it costs its start
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

# --- times -------------------------------------------------------------------------------------------------------


def local(value: Any) -> datetime | None:
    t = parse_time(value)
    return t.astimezone() if t else None


def stamp(value: Any, missing: str = "Unknown") -> str:
    """Slurm's time stamp, local time: 2026-12-06T21:08:57; `missing` when there is none."""
    t = local(value)
    return t.strftime("%Y-%m-%dT%H:%M:%S") if t else missing


def duration(seconds: float | None) -> str:
    """sacct's Elapsed and scontrol's RunTime/TimeLimit: HH:MM:SS, D-HH:MM:SS."""
    s = max(0, int(seconds or 0))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def time_limit(seconds: float | None) -> str:
    """A time limit as Slurm shows one; none: UNLIMITED."""
    return duration(seconds) if seconds else "UNLIMITED"


TIME_HELP = ("YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], MMDD[YY], HH:MM[:SS], now[-N[seconds|minutes|hours|days|weeks]], "
             "today, midnight, noon, teatime, tomorrow or yesterday")
_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400, "w": 604800,
          "week": 604800, "weeks": 604800}


def parse_when(text: str, now: datetime, option: str = "--starttime", command: str = "sacct") -> datetime:
    """Slurm's time specifications (`sacct -S/-E`), in local time, as an aware datetime."""
    s = text.strip()
    low = s.lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    words = {"today": midnight, "midnight": midnight, "noon": midnight.replace(hour=12),
             "teatime": midnight.replace(hour=16), "tomorrow": midnight + timedelta(days=1),
             "yesterday": midnight - timedelta(days=1)}
    if low in words:
        return words[low]
    m = re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", low)
    if m:
        if not m.group(1):
            return now
        if m.group(3) not in _UNITS:
            raise _bad_time(text, option, command)
        delta = timedelta(seconds=int(m.group(2)) * _UNITS[m.group(3)])
        return now + delta if m.group(1) == "+" else now - delta
    try:
        return _absolute(s, now)
    except ValueError:
        raise _bad_time(text, option, command) from None


def _bad_time(text: str, option: str, command: str) -> ViewError:
    return ViewError(f"{command}: error: invalid time {option}={text!r}: give {TIME_HELP}")


def _absolute(s: str, now: datetime) -> datetime:
    tz = now.tzinfo
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})(?:T(\d{1,2}):(\d{2})(?::(\d{2}))?)?", s)
    if m:
        y, mo, d, h, mi, se = (int(g) if g else 0 for g in m.groups())
        return datetime(y, mo, d, h, mi, se, tzinfo=tz)
    m = re.fullmatch(r"(\d{1,2})/(\d{1,2})(?:/(\d{2}))?", s) or re.fullmatch(r"(\d{1,2})\.(\d{1,2})(?:\.(\d{2}))?", s)
    if m or re.fullmatch(r"\d{4}(\d{2})?", s):
        mo, d, y = (m.groups() if m else (s[:2], s[2:4], s[4:6] or None))
        return datetime(2000 + int(y) if y else now.year, int(mo), int(d), tzinfo=tz)
    m = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*([ap]m)?", s.lower())
    if m:
        h = int(m.group(1)) % 12 + (12 if m.group(4) == "pm" else 0) if m.group(4) else int(m.group(1))
        return now.replace(hour=h, minute=int(m.group(2)), second=int(m.group(3) or 0), microsecond=0)
    raise ValueError(s)


# --- runs as jobs ------------------------------------------------------------------------------------------------

ENDED = {"Completed", "Failed", "Cancelled"}
# Slurm's long state names (sacct, scontrol) and squeue's codes for them
LONG_STATE = {"Pending": "PENDING", "Starting": "RUNNING", "Running": "RUNNING", "Stopping": "COMPLETING",
              "Completed": "COMPLETED", "Failed": "FAILED", "Cancelled": "CANCELLED"}
CODES = {"PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA",
         "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR", "REQUEUED": "RQ", "OUT_OF_MEMORY": "OOM"}


def _status(run: dict[str, Any]) -> dict[str, Any]:
    return run.get("status") or {}


def _resources(run: dict[str, Any]) -> dict[str, Any]:
    return ((run.get("spec") or {}).get("task_template") or {}).get("requested_resources") or {}


def name_of(run: dict[str, Any]) -> str:
    return str((run.get("metadata") or {}).get("name") or "")


def job_state(run: dict[str, Any]) -> str:
    """Slurm's state of a run: its own, refined by why it ended (TIMEOUT, NODE_FAIL) or waits (REQUEUED after a
    preemption)."""
    status = _status(run)
    state = status.get("state", "")
    reasons = " ".join([status.get("reason") or ""] + [w.get("reason") or "" for w in status.get("workers") or []])
    if state == "Failed" and "time limit" in reasons:
        return "TIMEOUT"
    if state == "Failed" and "machine" in reasons and "lost" in reasons:
        return "NODE_FAIL"
    if state == "Pending" and (status.get("preemptions") or 0) > 0:
        return "REQUEUED"
    return LONG_STATE.get(state, state.upper())


def worker_state(w: dict[str, Any]) -> str:
    state = w.get("state", "")
    if state == "Succeeded":
        return "COMPLETED"
    if state == "Failed" and "time limit" in (w.get("reason") or ""):
        return "TIMEOUT"
    return LONG_STATE.get(state, state.upper())


def exit_code(code: int | None) -> str:
    """ExitCode as code:signal (a worker killed by a signal: its code is -SIG or 128+SIG)."""
    if code is None:
        return "0:0"
    if code < 0:
        return f"0:{-code}"
    if code > 128 and code - 128 < 65:
        return f"0:{code - 128}"
    return f"{code}:0"


def run_exit_code(run: dict[str, Any]) -> str:
    """The run's: its first worker that ended badly, else its first worker's (0:0 before any ended)."""
    codes = [w.get("exit_code") for w in _status(run).get("workers") or [] if w.get("exit_code") is not None]
    bad = [c for c in codes if c != 0]
    return exit_code(bad[0] if bad else (codes[0] if codes else None))


def started(run: dict[str, Any]) -> datetime | None:
    status = _status(run)
    t = parse_time(status.get("started_at"))
    if t:
        return t
    starts = [x for x in (parse_time(w.get("started_at")) for w in status.get("workers") or []) if x]
    return min(starts) if starts else None


def ended(run: dict[str, Any]) -> datetime | None:
    status = _status(run)
    if status.get("state") not in ENDED:
        return None
    t = parse_time(status.get("finished_at"))
    if t:
        return t
    ends = [x for x in (parse_time(w.get("finished_at")) for w in status.get("workers") or []) if x]
    return max(ends) if ends else parse_time((run.get("metadata") or {}).get("created_at"))


def elapsed(run: dict[str, Any], now: datetime) -> float:
    start = started(run)
    if start is None or _status(run).get("state") == "Pending":
        return 0
    return max(0.0, ((ended(run) or now) - start).total_seconds())


def machines_of(run: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for w in _status(run).get("workers") or []:
        if w.get("machine") and w["machine"] not in names:
            names.append(w["machine"])
    return names


def partition_of(run: dict[str, Any]) -> str:
    """The pools the run may use; without any, its cluster (the cluster's own partition)."""
    pools = (_resources(run).get("node_selection") or {}).get("pools") or []
    return ",".join(pools) or str((run.get("metadata") or {}).get("cluster") or (run.get("spec") or {}).get(
        "cluster") or "")


def num_nodes(run: dict[str, Any]) -> int:
    return int(_resources(run).get("machines") or len(_status(run).get("workers") or []) or 1)


def cpus(run: dict[str, Any]) -> int:
    """CPU cores of the whole run: asked, else the sum its workers hold, at least one per node."""
    asked = _resources(run).get("cpu_cores")
    if asked is None:
        asked = sum(w.get("cpu_cores") or 0 for w in _status(run).get("workers") or [])
    return max(int(math.ceil(asked or 0)), num_nodes(run))


def gpus(run: dict[str, Any]) -> int:
    return int((_resources(run).get("gpu_requests") or {}).get("count") or 0)


def memory(run: dict[str, Any]) -> int | None:
    asked = _resources(run).get("memory_bytes")
    if asked is None:
        asked = sum(w.get("memory_bytes") or 0 for w in _status(run).get("workers") or []) or None
    return asked


def mem_text(b: int | None) -> str:
    """Slurm's memory in TRES: 16G, 512M (mebibytes rounded up)."""
    if not b:
        return "0"
    mib = math.ceil(b / 1024**2)
    for unit, size in (("T", 1024**2), ("G", 1024)):
        if mib >= size and mib % size == 0:
            return f"{mib // size}{unit}"
    return f"{mib}M"


def tres(run: dict[str, Any]) -> str:
    """cpu=8,gres/gpu=8,mem=64G,node=1: Slurm's order (by name)."""
    parts = [f"cpu={cpus(run)}"]
    if gpus(run):
        parts.append(f"gres/gpu={gpus(run)}")
    if memory(run):
        parts.append(f"mem={mem_text(memory(run))}")
    parts.append(f"node={num_nodes(run)}")
    return ",".join(parts)


def array_of(run: dict[str, Any]) -> tuple[str | None, int | None]:
    a = (run.get("spec") or {}).get("array") or {}
    return a.get("job"), a.get("index")


def job_name(run: dict[str, Any]) -> str:
    """A job array's runs carry the array's name, as Slurm's tasks do."""
    return str(array_of(run)[0] or name_of(run))


# --- numeric job ids ----------------------------------------------------------------------------------------------
# A JOB given as digits only (`scancel 42`, `--dependency=afterok:42`) is a numeric job id: the run whose
# metadata.job_id it is. A run may be named with digits only too: such a JOB names it only where no run of the
# workspace has that job id (the id comes first, as Slurm users type ids).


def is_job_id(job: str) -> bool:
    return job.isascii() and job.isdigit() and len(job) <= 18


def job_id_of(run: dict[str, Any]) -> int | None:
    v = (run.get("metadata") or {}).get("job_id")
    return v if isinstance(v, int) else None


def runs_with_job_id(runs: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """The run whose numeric job id `job` is ([] where `job` is no number, or no run has it)."""
    if not is_job_id(job):
        return []
    return [r for r in runs if job_id_of(r) == int(job)]


_ARRAY_TASK = re.compile(r"(\d{1,18})_(\d+|\[[^\]]*\])")


def array_task_id(job: str) -> str | None:
    """The array's job id in Slurm's `ID_N` / `ID_[1-3]` (an array's tasks by its job id), else None."""
    m = _ARRAY_TASK.fullmatch(job.strip()) if job.isascii() else None
    return m.group(1) if m else None


def array_task_job(runs: list[dict[str, Any]], job: str) -> str:
    """`ID_N` with the array's name for ID (`train_3`), where ID is the job id of one of `runs` that belongs to a
    job array (`sbatch --parsable --array` prints its first task's id); else `job` as given."""
    jid = array_task_id(job)
    if jid is None:
        return job
    for r in runs_with_job_id(runs, jid):
        array_job, _ = array_of(r)
        if array_job:
            return f"{array_job}{job.strip()[len(jid):]}"
    return job


def held(run: dict[str, Any]) -> bool:
    return bool(_status(run).get("held")) and _status(run).get("state") == "Pending"


# --- squeue: which jobs are shown -------------------------------------------------------------------------------

def state_codes(text: str, command: str = "squeue") -> set[str]:
    """`-t PD,R` or `--states=pending,running` → Slurm's long state names (`all`: every state)."""
    out: set[str] = set()
    short = {v: k for k, v in CODES.items()}
    for part in text.split(","):
        p = part.strip().upper()
        if not p:
            continue
        if p == "ALL":
            return set(CODES)
        if p in CODES:
            out.add(p)
        elif p in short:
            out.add(short[p])
        else:
            raise ViewError(f"{command}: error: invalid job state {part.strip()!r}: give "
                            f"{', '.join(sorted(short))} or {', '.join(CODES)} (or all)")
    return out


def squeue_keep(runs: list[dict[str, Any]], now: datetime, min_job_age: float, states: set[str] | None = None,
                users: set[str] | None = None) -> list[dict[str, Any]]:
    """What squeue shows: live runs, and ended ones for `min_job_age` seconds after they ended (Slurm's MinJobAge);
    `-t` states (an ended run asked for by state stays while it is kept); `-u` workspaces (squeue's USER)."""
    out = []
    for run in runs:
        end = ended(run)
        if end is not None and (now - end).total_seconds() > min_job_age:
            continue
        if states is not None and job_state(run) not in states and LONG_STATE.get(
                _status(run).get("state", "")) not in states:
            continue
        if users is not None and (run.get("metadata") or {}).get("workspace") not in users:
            continue
        out.append(run)
    return out


# --- sacct ---------------------------------------------------------------------------------------------------------


class Row:
    """One line of sacct: a job (a run) or one of its steps (a worker)."""

    def __init__(self, run: dict[str, Any], worker: dict[str, Any] | None, now: datetime):
        self.run, self.worker, self.now = run, worker, now


def _w_time(w: dict[str, Any], key: str) -> str:
    return stamp(w.get(key))


def _w_elapsed(w: dict[str, Any], now: datetime) -> str:
    a = parse_time(w.get("started_at"))
    if a is None:
        return duration(0)
    b = parse_time(w.get("finished_at")) if w.get("state") in ("Succeeded", "Failed", "Cancelled") else None
    return duration(((b or now) - a).total_seconds())


def _job_or_step(job: Callable[[Row], Any], step: Callable[[Row], Any] | None = None) -> Callable[[Row], str]:
    def get(r: Row) -> str:
        if r.worker is None or step is None:
            return str(job(r))
        return str(step(r))
    return get


def _step_blank(job: Callable[[Row], Any]) -> Callable[[Row], str]:
    return _job_or_step(job, lambda r: "")


# Each field: its name as sacct spells it, its default width, and its value for a job row and a step row.
SACCT_FIELDS: dict[str, tuple[int, Callable[[Row], str]]] = {
    "JobID": (12, _job_or_step(lambda r: name_of(r.run), lambda r: f"{name_of(r.run)}.{r.worker.get('index', 0)}")),
    # Slurm's raw id: the numeric job id (the run's name where the API gives none)
    "JobIDRaw": (12, _job_or_step(lambda r: job_id_of(r.run) or name_of(r.run),
                                  lambda r: f"{job_id_of(r.run) or name_of(r.run)}.{r.worker.get('index', 0)}")),
    "JobName": (10, _job_or_step(lambda r: job_name(r.run), lambda r: "batch" if r.worker.get("index", 0) == 0 else "step")),
    "Partition": (10, _step_blank(lambda r: partition_of(r.run))),
    "Account": (10, lambda r: str((r.run.get("metadata") or {}).get("workspace") or "")),
    "User": (9, _step_blank(lambda r: (r.run.get("metadata") or {}).get("created_by")
                            or (r.run.get("metadata") or {}).get("workspace") or "")),
    "Cluster": (10, lambda r: str((r.run.get("metadata") or {}).get("cluster") or "")),
    "AllocCPUS": (10, _job_or_step(lambda r: cpus(r.run) if started(r.run) else 0,
                                   lambda r: int(math.ceil(r.worker.get("cpu_cores") or 0)) or 1)),
    "ReqCPUS": (8, _step_blank(lambda r: cpus(r.run))),
    "AllocNodes": (10, _job_or_step(lambda r: num_nodes(r.run) if started(r.run) else 0, lambda r: 1)),
    "NNodes": (8, _job_or_step(lambda r: num_nodes(r.run), lambda r: 1)),
    "State": (10, _job_or_step(lambda r: job_state(r.run), lambda r: worker_state(r.worker))),
    "ExitCode": (8, _job_or_step(lambda r: run_exit_code(r.run), lambda r: exit_code(r.worker.get("exit_code")))),
    "Elapsed": (10, _job_or_step(lambda r: duration(elapsed(r.run, r.now)), lambda r: _w_elapsed(r.worker, r.now))),
    "ElapsedRaw": (10, _job_or_step(lambda r: int(elapsed(r.run, r.now)))),
    "Submit": (19, lambda r: stamp((r.run.get("metadata") or {}).get("created_at"))),
    "Start": (19, _job_or_step(lambda r: stamp(started(r.run)), lambda r: _w_time(r.worker, "started_at"))),
    "End": (19, _job_or_step(lambda r: stamp(ended(r.run)), lambda r: _w_time(r.worker, "finished_at"))),
    "Timelimit": (10, _step_blank(lambda r: time_limit(((r.run.get("spec") or {}).get("task_template") or {}).get(
        "time_limit_seconds")))),
    "Priority": (10, _step_blank(lambda r: (r.run.get("spec") or {}).get("priority", 0))),
    "NodeList": (15, _job_or_step(lambda r: hostlist(machines_of(r.run)) or "None assigned",
                                  lambda r: r.worker.get("machine") or "")),
    "AllocTRES": (10, _job_or_step(lambda r: tres(r.run) if started(r.run) else "",
                                   lambda r: _step_tres(r.worker))),
    "ReqTRES": (10, _step_blank(lambda r: tres(r.run))),
    "Reason": (20, _step_blank(lambda r: _status(r.run).get("reason") or "None")),
    "Restarts": (8, _job_or_step(lambda r: _status(r.run).get("restarts") or 0, lambda r: r.worker.get("restarts", 0))),
}
SACCT_DEFAULT = ("JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode")
_FIELD_NAMES = {k.lower(): k for k in SACCT_FIELDS}


def _step_tres(w: dict[str, Any]) -> str:
    parts = [f"cpu={int(math.ceil(w.get('cpu_cores') or 0)) or 1}"]
    if w.get("gpu_indices"):
        parts.append(f"gres/gpu={len(w['gpu_indices'])}")
    if w.get("memory_bytes"):
        parts.append(f"mem={mem_text(w['memory_bytes'])}")
    return ",".join(parts + ["node=1"])


def sacct_fields(spec: str | None, command: str = "sacct") -> list[tuple[str, int | None, bool]]:
    """`--format=JobID,JobName%30,State` → (field, width or None for the default, left-aligned?)."""
    if not spec:
        return [(f, None, False) for f in SACCT_DEFAULT]
    out = []
    for part in spec.split(","):
        p = part.strip()
        if not p:
            continue
        name, _, width = p.partition("%")
        key = _FIELD_NAMES.get(name.strip().lower())
        if key is None:
            raise ViewError(f'{command}: error: Invalid field requested: "{name.strip()}" (fields: '
                            f'{", ".join(SACCT_FIELDS)})')
        left = width.startswith("-")
        width = width.lstrip("-")
        if width and not width.isdigit():
            raise ViewError(f"{command}: error: invalid width in {p!r}: write FIELD%N, e.g. JobName%30")
        out.append((key, int(width) if width else None, left))
    return out


def in_window(run: dict[str, Any], start: datetime | None, end: datetime | None) -> bool:
    """Slurm's -S/-E: a job that was eligible, running or ended within the window."""
    since = started(run) or parse_time((run.get("metadata") or {}).get("created_at"))
    until = ended(run)
    if end is not None and since is not None and since > end:
        return False
    return not (start is not None and until is not None and until < start)


def sacct_rows(runs: list[dict[str, Any]], now: datetime, steps: bool = True) -> list[Row]:
    """Oldest first, as sacct lists; each job followed by its steps (its workers that started)."""
    out = []
    for run in sorted(runs, key=lambda r: ((r.get("metadata") or {}).get("created_at") or "", name_of(r))):
        out.append(Row(run, None, now))
        if steps:
            out += [Row(run, w, now) for w in _status(run).get("workers") or [] if w.get("started_at")]
    return out


def sacct_table(rows: list[Row], fields: list[tuple[str, int | None, bool]], parsable: str | None = None,
                header: bool = True) -> str:
    """Slurm's layout: a header, a line of dashes, one line per row; a value longer than its column is cut with
    `+`. `parsable`: `|` between fields (`--parsable2`), or after each (`--parsable`): nothing cut."""
    lines = []
    if parsable is not None:
        end = "|" if parsable == "trailing" else ""
        if header:
            lines.append("|".join(f for f, _, _ in fields) + end)
        for r in rows:
            lines.append("|".join(terminal_safe(SACCT_FIELDS[f][1](r)) for f, _, _ in fields) + end)
        return "".join(line + "\n" for line in lines)

    def cell(text: str, name: str, width: int, left: bool) -> str:
        if len(text) > width:
            text = text[:width - 1] + "+"
        return text.ljust(width) if left or name == "JobID" else text.rjust(width)

    cols = [(f, w or SACCT_FIELDS[f][0], left) for f, w, left in fields]
    if header:
        lines.append(" ".join(cell(f, f, w, left) for f, w, left in cols) + " ")
        lines.append(" ".join("-" * w for _, w, _ in cols) + " ")
    for r in rows:
        lines.append(" ".join(cell(terminal_safe(SACCT_FIELDS[f][1](r)), f, w, left) for f, w, left in cols) + " ")
    return "".join(line + "\n" for line in lines)


# --- scontrol show job -----------------------------------------------------------------------------------------------


def show_job(run: dict[str, Any], now: datetime) -> str:
    """`scontrol show job`: Slurm's key=value lines, values from the run's record."""
    meta, spec, status = run.get("metadata") or {}, run.get("spec") or {}, _status(run)
    tt = spec.get("task_template") or {}
    state = job_state(run)
    reason = "JobHeldUser" if held(run) else (status.get("reason") or "None")
    pending = status.get("state") == "Pending"
    workers = status.get("workers") or []
    limit = tt.get("time_limit_seconds")
    start, end = started(run), ended(run)
    if end is None and start is not None and limit and not pending:
        end = start + timedelta(seconds=limit)
    ws = meta.get("workspace") or ""
    command = " ".join([str(tt.get("command") or "")] + [str(a) for a in tt.get("args") or []]).strip()
    work_dir = tt.get("working_dir") or "(null)"
    stdout = f"astra astraeus logs {name_of(run)}"
    array_job, array_index = array_of(run)
    lines = [
        f"JobId={name_of(run)} JobName={job_name(run)}"
        + (f" JobIdRaw={job_id_of(run)}" if job_id_of(run) is not None else "")
        + (f" ArrayJobId={array_job} ArrayTaskId={array_index}" if array_job else ""),
        f"   UserId={meta.get('created_by') or ws} GroupId={ws} Account={ws} Cluster={meta.get('cluster') or ''}",
        f"   Priority={spec.get('priority', 0)} Nice=0 QOS=(null)",
        f"   JobState={state} Reason={reason if pending else 'None'} Dependency="
        + _dependency(spec.get("dependency")),
        f"   Requeue=1 Restarts={status.get('restarts') or 0} Preemptions={status.get('preemptions') or 0} "
        f"BatchFlag=1 ExitCode={run_exit_code(run)}",
        f"   RunTime={duration(elapsed(run, now))} TimeLimit={time_limit(limit)} TimeMin=N/A",
        f"   SubmitTime={stamp(meta.get('created_at'))} EligibleTime={stamp(meta.get('created_at'))}",
        f"   StartTime={stamp(start)} EndTime={stamp(end)} Deadline=N/A",
        f"   Partition={partition_of(run)} AllocNode:Sid=(null)",
        f"   NodeList={hostlist(machines_of(run)) or '(null)'}",
        f"   NumNodes={num_nodes(run)} NumCPUs={cpus(run)} NumTasks={num_nodes(run)} CPUs/Task="
        f"{max(1, cpus(run) // num_nodes(run))}",
        f"   TRES={tres(run)}",
        f"   Features={_features(tt)} Reservation="
        + str(((tt.get("requested_resources") or {}).get("node_selection") or {}).get("reservation") or "(null)"),
        f"   Command={terminal_safe(command) if command else '(null)'}",
        f"   WorkDir={work_dir}",
        f"   StdErr={stdout}",
        "   StdIn=/dev/null",
        f"   StdOut={stdout}",
        f"   Image={tt.get('image') or '(null)'}",
    ]
    if workers:
        lines.append("   Workers=" + ",".join(f"{w.get('name')}:{w.get('state')}@{w.get('machine') or '-'}"
                                              for w in workers))
    return "\n".join(terminal_safe(line) for line in lines) + "\n\n"


def _dependency(dep: Any) -> str:
    if not dep:
        return "(null)"
    if isinstance(dep, dict):
        kind = dep.get("type") or dep.get("kind") or "after"
        on = dep.get("runs") or dep.get("on") or []
        return f"{kind}:{':'.join(on)}" if on else str(kind)
    return str(dep)


def _features(tt: dict[str, Any]) -> str:
    labels = ((tt.get("requested_resources") or {}).get("node_selection") or {}).get("labels") or {}
    return "&".join(f"{k}={v}" for k, v in labels.items()) or "(null)"


# --- sinfo ---------------------------------------------------------------------------------------------------------

LONG_NODE_STATE = {"idle": "idle", "mix": "mixed", "alloc": "allocated", "drain": "drained", "drng": "draining",
                   "down": "down"}


def node_state(m: dict[str, Any], busy: set[str]) -> str:
    """A machine as Slurm's compact node state: down (lost), drain/drng (takes no new work, e.g. disk pressure;
    drng while work still runs there), alloc (every GPU held, or a GPU-less machine with work), mix, idle."""
    used = int(m.get("gpus_used") or 0)
    total = int(m.get("gpus") or 0)
    working = used > 0 or m.get("name") in busy
    if m.get("state") not in (None, "Ready"):
        return "down"
    if m.get("schedulable") is False:
        return "drng" if working else "drain"
    if not working:
        return "idle"
    if total and used < total:
        return "mix"
    return "alloc"


def gres(m: dict[str, Any]) -> str:
    """gpu:MODEL:N (the model's last word, lower-case, as sites name GRES types: `gpu:a100:8`); gpu:N, (null)."""
    n = int(m.get("gpus") or 0)
    if not n:
        return "(null)"
    models = sorted({str(x) for x in m.get("gpu_models") or [] if x})
    if len(models) == 1:
        word = re.sub(r"[^A-Za-z0-9._-]", "", models[0].split()[-1] if models[0].split() else "")
        short = next((t for t in models[0].replace("-", " ").split() if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", t)),
                     word)
        return f"gpu:{short.lower()}:{n}"
    return f"gpu:{n}"


def partitions(machines: list[dict[str, Any]], pools: list[dict[str, Any]]) -> list[tuple[str, bool, list[dict]]]:
    """(partition, default?, its machines): each pool; each cluster without pools as one partition, the first of
    them the default (`*`)."""
    by_name = {(m.get("cluster"), m.get("name")): m for m in machines}
    out: list[tuple[str, bool, list[dict]]] = []
    with_pools = {p.get("cluster") for p in pools}
    for p in pools:
        members = [by_name[(p.get("cluster"), n)] for n in p.get("machines") or [] if (p.get("cluster"), n) in by_name]
        out.append((str(p.get("name") or ""), False, members))
    clusters: list[str] = []
    for m in machines:
        if m.get("cluster") not in with_pools and m.get("cluster") not in clusters:
            clusters.append(m.get("cluster"))
    for i, cl in enumerate(clusters):
        out.append((str(cl or ""), i == 0, [m for m in machines if m.get("cluster") == cl]))
    return out


# %P %a %l %D %t %T %N %G %c %m %R %C %e: what sinfo -o knows here
SINFO_DEFAULT = "%9P %.5a %.10l %.6D %.6t %N"
SINFO_NODES = "%10N %.6D %.9P %6t"  # -N, as Slurm lays it out
_SPEC = re.compile(r"%(-)?(\.)?(\d+)?([A-Za-z])")
_SINFO_LETTERS = "PaalDtTNGcmRC"


def _node_value(letter: str, part: str, default: bool, m: dict[str, Any], state: str) -> str:
    if letter == "P":
        return part + ("*" if default else "")
    if letter == "a":
        return "up"
    if letter == "l":
        return "infinite"
    if letter == "t":
        return state
    if letter == "T":
        return LONG_NODE_STATE.get(state, state)
    if letter == "G":
        return gres(m)
    if letter == "c":
        return str(int(m.get("cpu_cores") or 0))
    if letter == "m":
        return str(int((m.get("memory_bytes") or 0) // 1024**2))
    if letter == "R":
        return m.get("reason") or ("Machine lost" if state == "down" else "none")
    if letter == "C":
        total = int(m.get("gpus") or 0)
        used = int(m.get("gpus_used") or 0)
        return f"{used}/{max(0, total - used)}/{0 if state in ('idle', 'mix', 'alloc') else total}/{total}"
    raise AssertionError(letter)


def sinfo_table(machines: list[dict[str, Any]], pools: list[dict[str, Any]], busy: Iterable[str] = (),
                fmt: str | None = None, nodes: bool = False, header: bool = True) -> str:
    """sinfo's lines: one per partition and group of machines that show alike (per machine with -N); `fmt` is
    sinfo -o's format (%P %a %l %D %t %T %N %G %c %m %R; %C here: GPUs used/idle/other/total)."""
    spec = fmt or (SINFO_NODES if nodes else SINFO_DEFAULT)
    parts = _SPEC.split(spec)
    for m in _SPEC.finditer(spec):
        if m.group(4) not in _SINFO_LETTERS:
            raise ViewError(f"sinfo: error: unknown format letter %{m.group(4)} in {spec!r}: give "
                            "%P %a %l %D %t %T %N %G %c %m %R %C")
    specs = list(_SPEC.finditer(spec))
    busy = set(busy)
    groups: dict[tuple, list[str]] = {}
    for part, default, members in partitions(machines, pools):
        for m in members:
            state = node_state(m, busy)
            key = tuple(_node_value(s.group(4), part, default, m, state) if s.group(4) not in "ND" else
                        (m.get("name") if nodes else None) for s in specs)
            groups.setdefault((part, *key), []).append(str(m.get("name") or ""))
    rows = []
    for key, names in groups.items():
        values = {i: v for i, v in enumerate(key[1:])}
        row = []
        for i, s in enumerate(specs):
            letter = s.group(4)
            if letter == "N":
                row.append(hostlist(names))
            elif letter == "D":
                row.append(str(len(names)))
            else:
                row.append(str(values[i]))
        rows.append(row)
    lines = []
    titles = {"P": "PARTITION", "a": "AVAIL", "l": "TIMELIMIT", "D": "NODES", "t": "STATE", "T": "STATE",
              "N": "NODELIST", "G": "GRES", "c": "CPUS", "m": "MEMORY", "R": "REASON", "C": "GPUS(A/I/O/T)"}
    if header:
        lines.append(_line(parts, specs, [titles[s.group(4)] for s in specs]))
    lines += [_line(parts, specs, row) for row in rows]
    return "".join(terminal_safe(line) + "\n" for line in lines)


def _line(parts: list[Any], specs: list[re.Match], values: list[str]) -> str:
    """The format's literal text with each %spec replaced by its value, padded as the spec says (`.`: right)."""
    out = []
    literal = parts[0::5]  # re.split with 4 groups: text, g1, g2, g3, g4, text, …
    for i, s in enumerate(specs):
        out.append(literal[i] or "")
        v = values[i]
        width = int(s.group(3)) if s.group(3) else 0
        if width and len(v) > width and s.group(4) != "N":
            v = v[:width]
        out.append(v.rjust(width) if s.group(2) else v.ljust(width))
    out.append(literal[len(specs)] or "")
    return "".join(out)


def hostlist(names: Iterable[str]) -> str:
    """Slurm's compressed host list: gpu-01,gpu-02,gpu-03,cpu → cpu,gpu-[01-03]."""
    plain: list[str] = []
    numbered: dict[tuple[str, int], list[int]] = {}
    for n in names:
        m = re.fullmatch(r"(.*?)(\d+)", n)
        if m:
            numbered.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        elif n not in plain:
            plain.append(n)
    out = list(plain)
    for (prefix, width), nums in numbered.items():
        vals = sorted(set(nums))
        if len(vals) == 1:
            out.append(f"{prefix}{vals[0]:0{width}d}")
            continue
        ranges, i = [], 0
        while i < len(vals):
            j = i
            while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
                j += 1
            a, b = f"{vals[i]:0{width}d}", f"{vals[j]:0{width}d}"
            ranges.append(a if i == j else f"{a}-{b}")
            i = j + 1
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(sorted(out))
