"""Pure parts of `astra slurm sbatch`: Slurm's option and `#SBATCH` parsing, its time and memory formats, and
the run spec a batch job becomes.

A batch job is one Astraeus run: `-N` machines (one worker, one task each), the script's content mounted as a
config file at /astraeus/slurm/<name>.sbatch and run with `bash`, arguments after the script passed on as they
are. Options that Astraeus cannot honour are accepted with a one-line note saying what it does instead, or refused
by name with what to do; none is silently ignored.
"""

from __future__ import annotations

import re
import shlex
from collections import namedtuple

from astraeus.cli.errors import HelpRequested, SbatchError  # noqa: F401 - defined apart for the shared error handler
from astraeus.units import compress_ints

TYPE_CHECKING = False  # typing, dataclasses, difflib and pathlib cost `sbatch` a large part of its start: not imported
if TYPE_CHECKING:
    from typing import Any

MIB = 1024**2
SCRIPT_DIR = "/astraeus/slurm"


def unsupported(option: str, hint: str | None = None, where: str | None = None) -> SbatchError:
    msg = f"sbatch: option {option} is not supported by astra slurm"
    if hint:
        msg += f": {hint}"
    if where:
        msg += f" ({where})"
    return SbatchError(msg)


# --- Slurm's formats -------------------------------------------------------------------------------------

TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_DAYS = re.compile(r"(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?")


def parse_time(text: str, option: str = "--time") -> int | None:
    """Slurm's time formats → seconds; None for no limit (`0`, `UNLIMITED`, `INFINITE`, as in Slurm).

    `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`.
    """
    s = text.strip()
    if s.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _DAYS.fullmatch(s)
    if m:
        d, h, mi, se = (int(g) if g is not None else 0 for g in m.groups())
        total = d * 86400 + h * 3600 + mi * 60 + se
    else:
        parts = s.split(":")
        if not s or len(parts) > 3 or not all(p.isdigit() for p in parts):
            raise SbatchError(f"sbatch: error: invalid time {option}={text!r}: use {TIME_FORMATS}")
        nums = [int(p) for p in parts]
        if len(nums) == 1:
            total = nums[0] * 60
        elif len(nums) == 2:
            total = nums[0] * 60 + nums[1]
        else:
            total = nums[0] * 3600 + nums[1] * 60 + nums[2]
    return total or None


_MEM = re.compile(r"(\d+)([KMGT]?)B?", re.IGNORECASE)
_MEM_UNITS = {"": MIB, "K": 1024, "M": MIB, "G": 1024**3, "T": 1024**4}


def parse_mem(text: str, option: str = "--mem", allow_zero: bool = False) -> int:
    """Slurm's memory sizes → bytes: `16G`, `500M`, `1T`, `64K`; a plain number is megabytes, as in Slurm.
    `--mem=0` (Slurm: all of a node's memory) is 0 where `allow_zero`: the job then asks for no set amount."""
    m = _MEM.fullmatch(text.strip())
    if not m:
        raise SbatchError(f"sbatch: error: invalid memory {option}={text!r}: use a number of megabytes or a size "
                          "with a unit, e.g. 16G, 500M, 1T")
    value = int(m.group(1)) * _MEM_UNITS[m.group(2).upper()]
    if value == 0 and not allow_zero:
        raise SbatchError(f"sbatch: error: {option}=0 (all the memory of a node) is not supported by astra slurm: "
                          "give an amount, e.g. 64G")
    return value


def _positive_int(text: str, option: str, allow_zero: bool = False) -> int:
    s = text.strip()
    if not s.isdigit() or (int(s) == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "a whole number, 1 or more"
        raise SbatchError(f"sbatch: error: invalid {option}={text!r}: give {least}")
    return int(s)


_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _gpu_type(text: str, option: str, whole: str) -> str:
    if not _GPU_TYPE.fullmatch(text):
        raise SbatchError(f"sbatch: error: invalid {option}={whole!r}: {text!r} is not a GPU type: give a word of "
                          "the machines' GPU model, e.g. a100 or h100")
    return text


# Issue 46: `--gres=shard:N` asks N of a GPU's SHARDS_PER_GPU shards (Slurm's shards are a site's count per GPU;
# here a fixed 8): a fraction N/8 of one GPU (docs/gpu-sharing.md). `--gpus=0.5` asks that fraction directly.
SHARDS_PER_GPU = 8


def _fraction(text: str, option: str) -> float | None:
    """`0.5` (or `TYPE:0.5`'s count) → 0.5 where `option` is --gpus and the count is a fraction, else None."""
    s = text.strip()
    if option != "--gpus" or "." not in s:
        return None
    try:
        f = float(s)
    except ValueError:
        return None
    if not 0 < f < 1:
        raise SbatchError(f"sbatch: error: invalid {option}={text!r}: a part of one GPU is between 0 and 1 (e.g. "
                          "--gpus=0.5); whole GPUs are a whole number (--gpus=2)")
    return f


def _gpu_count(text: str, option: str) -> tuple[int | float, str | None]:
    """`N` or `TYPE:N` → (count, type or None); the type is matched, case-insensitively, as part of the machines'
    GPU model (`a100` matches NVIDIA A100-SXM4-80GB). `--gpus=0.5`: a fraction of one GPU (a float)."""
    parts = text.strip().split(":")
    f = _fraction(parts[-1], option)
    if f is not None and len(parts) <= 2:
        return f, (_gpu_type(parts[0], option, text) if len(parts) == 2 else None)
    if len(parts) == 2:
        return _positive_int(parts[1], option, allow_zero=True), _gpu_type(parts[0], option, text)
    if len(parts) != 1:
        raise SbatchError(f"sbatch: error: invalid {option}={text!r}: give a count of GPUs (N) or a type and a "
                          "count (TYPE:N, e.g. a100:4)")
    return _positive_int(parts[0], option, allow_zero=True), None


def _gres(text: str) -> tuple[int, str | None]:
    """`--gres=gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N` → (count, type or None); other resources are refused."""
    total = 0
    types: set[str] = set()
    first = text.strip().split(":")
    if first[0] in ("shard", "gres/shard"):
        n = first[1] if len(first) == 2 else ""
        if not n.isdigit() or not 0 < int(n) < SHARDS_PER_GPU or "," in text:
            raise SbatchError(f"sbatch: error: invalid --gres={text!r}: give --gres=shard:N with N from 1 to "
                              f"{SHARDS_PER_GPU - 1} (N/{SHARDS_PER_GPU} of one GPU); whole GPUs are --gres=gpu:N")
        return int(n) / SHARDS_PER_GPU, None
    for item in text.split(","):
        parts = item.strip().split(":")
        if parts[0] not in ("gpu", "gres/gpu"):
            raise SbatchError(f"sbatch: error: --gres={text}: astra slurm knows only GPUs (--gres=gpu:N or "
                              "--gres=gpu:TYPE:N)")
        if len(parts) == 1:
            total += 1
        elif len(parts) == 2 and parts[1].isdigit():
            total += int(parts[1])
        elif len(parts) == 2:
            types.add(_gpu_type(parts[1], "--gres", text))
            total += 1
        elif len(parts) == 3 and parts[2].isdigit():
            types.add(_gpu_type(parts[1], "--gres", text))
            total += int(parts[2])
        else:
            raise SbatchError(f"sbatch: error: invalid --gres={text!r}: use --gres=gpu:N or --gres=gpu:TYPE:N")
    if len(types) > 1:
        raise SbatchError(f"sbatch: error: --gres={text}: astra slurm takes one GPU type per job; give one, "
                          f"e.g. --gres=gpu:{sorted(types)[0]}:{total}")
    return total, next(iter(types), None)


def _nodes(text: str) -> int:
    s = text.strip()
    if "-" in s:
        lo, _, hi = s.partition("-")
        if lo.isdigit() and lo == hi:
            s = lo
        else:
            raise SbatchError(f"sbatch: error: --nodes={text}: node ranges are not supported by astra slurm; "
                              "give an exact number of nodes")
    return _positive_int(s, "--nodes")


def _nice(text: str | None) -> int:
    if text is None:
        return 100  # Slurm: --nice without a value is 100
    try:
        return int(text.strip())
    except ValueError:
        raise SbatchError(f"sbatch: error: invalid --nice={text!r}: give a whole number") from None


def _container_image(text: str) -> str:
    """Pyxis' `[docker://][REGISTRY#]IMAGE[:TAG]` → a plain image reference."""
    s = text.strip()
    s = s.removeprefix("docker://")
    if "#" in s:
        registry, _, rest = s.partition("#")
        s = f"{registry}/{rest}"
    if not s:
        raise SbatchError("sbatch: error: --container-image needs an image")
    return s


def _nonempty(text: str, option: str) -> str:
    if not text.strip():
        raise SbatchError(f"sbatch: error: {option} needs a value")
    return text


def _template(text: str) -> str:
    s = _nonempty(text, "--template").strip()
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", s):
        raise SbatchError(f"sbatch: error: invalid --template={text!r}: give a template's name (lowercase letters, "
                          "digits and '-'; astra astraeus templates list shows them)")
    return s


_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def pool_name(partition: str) -> str:
    """A Slurm partition's name as a pool's: Slurm allows `gpu_large` and `A100`, pools are DNS labels, so `_` and
    `.` become `-` and capitals small letters (`gpu_large` → `gpu-large`)."""
    return re.sub(r"[_.]", "-", partition.strip().lower())


def _partition(text: str) -> list[str]:
    """`--partition=a100[,h100]` → pools: the run goes on a machine of one of them."""
    names = [pool_name(p) for p in _nonempty(text, "--partition").split(",")]
    for n in names:
        if not _NAME.fullmatch(n):
            raise SbatchError(f"sbatch: error: invalid --partition={text!r}: {n!r} is not a pool's name (lowercase "
                              "letters, digits and '-'; astra astraeus pools shows them)")
    return list(dict.fromkeys(names))


def _clusters(text: str) -> str:
    s = _nonempty(text, "--clusters").strip()
    if "," in s:
        raise SbatchError(f"sbatch: error: --clusters={text}: astra slurm submits to one cluster; give one")
    if not _NAME.fullmatch(s):
        raise SbatchError(f"sbatch: error: invalid --clusters={text!r}: give a cluster's name")
    return s


_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")


def _constraint(text: str) -> dict[str, str]:
    """`--constraint=gpu=a100&ib` → machine labels the run needs, all of them: `KEY=VALUE`, and a bare feature
    `ib` meaning the label ib=true. Slurm's `|`, brackets, counts and `!` are refused."""
    s = _nonempty(text, "--constraint").strip()
    for bad, what in (("|", "alternatives (|)"), ("[", "brackets"), ("*", "counts (*N)"), ("!", "negation (!)"),
                      (",", "commas")):
        if bad in s:
            raise SbatchError(f"sbatch: error: --constraint={text}: {what} are not supported by astra slurm; give "
                              "features joined by &, each KEY=VALUE or a bare FEATURE (the label FEATURE=true), e.g. "
                              "--constraint=gpu=a100&ib")
    labels: dict[str, str] = {}
    for item in s.split("&"):
        item = item.strip()
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip() if eq else "true"
        if not key or not _LABEL_KEY.fullmatch(key) or (eq and not value) or not _LABEL_VALUE.fullmatch(value):
            raise SbatchError(f"sbatch: error: invalid --constraint={text!r}: {item!r} is not a feature: give KEY=VALUE "
                              "or a bare FEATURE (letters, digits, '.', '_', '-'), joined by &")
        if key in labels and labels[key] != value:
            raise SbatchError(f"sbatch: error: --constraint={text}: {key} is given twice ({labels[key]} and {value})")
        labels[key] = value
    return labels


def _reservation(text: str) -> str:
    s = _nonempty(text, "--reservation").strip()
    if not _NAME.fullmatch(s):
        raise SbatchError(f"sbatch: error: invalid --reservation={text!r}: give a reservation's name (astra "
                          "astraeus reservations shows them)")
    return s


MAX_ARRAY_TASKS = 1000  # Slurm's default MaxArraySize is 1001 (indices 0-1000)
MAX_ARRAY_INDEX = 1_000_000
ARRAY_FORMS = "0-99, 1,3,5-7, 0-15:4, with %N for at most N at once (e.g. 0-99%10)"
_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


class ArrayRange(namedtuple("ArrayRange", "indices max_running", defaults=(None,))):
    """`--array`: the indices (ascending, each once: a tuple) and how many may run at once (None: no limit)."""

    __slots__ = ()

    def shown(self) -> str:
        """`0-19`, `1,3,5-7`: the indices as Slurm writes them."""
        return compress_ints(list(self.indices))


def parse_array(text: str) -> ArrayRange:
    """Slurm's `--array`: `0-99%10`, `1,3,5-7`, `0-15:4` (a step), indices 0 and up, each run once."""
    s = text.strip()
    bad = f"sbatch: error: invalid --array={text!r}: use {ARRAY_FORMS}"
    spec, pct, limit = s.partition("%")
    max_running = None
    if pct:
        if not limit.isdigit() or int(limit) == 0:
            raise SbatchError(f"sbatch: error: invalid --array={text!r}: after % give how many may run at once, "
                              "1 or more (e.g. 0-99%10)")
        max_running = int(limit)
    found: set[int] = set()
    for part in spec.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise SbatchError(bad)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise SbatchError(f"sbatch: error: invalid --array={text!r}: the range {part.strip()} ends before it "
                              f"starts: write {hi}-{lo}")
        if step == 0:
            raise SbatchError(f"sbatch: error: invalid --array={text!r}: a step of 0 in {part.strip()}: give 1 or "
                              "more (e.g. 0-15:4)")
        if hi > MAX_ARRAY_INDEX:
            raise SbatchError(f"sbatch: error: invalid --array={text!r}: indices go up to {MAX_ARRAY_INDEX}")
        if (hi - lo) // step + 1 + len(found) > MAX_ARRAY_TASKS:
            raise SbatchError(f"sbatch: error: --array={text}: more than {MAX_ARRAY_TASKS} tasks: astra slurm submits "
                              f"at most {MAX_ARRAY_TASKS} runs per array; split it into several arrays")
        found.update(range(lo, hi + 1, step))
    return ArrayRange(tuple(sorted(found)), max_running)


DEPENDENCY_FORMS = "afterok:JOB[:JOB…], afterany:JOB…, afternotok:JOB… or singleton"
_JOB = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(_\d+)?")


def parse_dependency(text: str) -> dict[str, Any]:
    """Slurm's `--dependency` → the run spec's `dependency` (one type; its jobs are run names, or job arrays' names:
    all their runs)."""
    s = text.strip()
    if "," in s or "?" in s:
        raise SbatchError(f"sbatch: error: --dependency={text}: astra slurm takes one dependency type with its jobs, "
                          f"e.g. --dependency=afterok:prep:download; give {DEPENDENCY_FORMS}")
    kind, _, rest = s.partition(":")
    if kind == "singleton":
        if rest:
            raise SbatchError(f"sbatch: error: --dependency={text}: singleton names no jobs (it waits for earlier "
                              "runs of the same job name)")
        return {"type": "singleton"}
    if kind not in ("afterok", "afterany", "afternotok"):
        hint = {"after": "use afterany (after the jobs end) or afterok (after they complete)",
                "aftercorr": "give each array task its dependency, or use afterok on the whole array",
                "expand": "not supported: submit a new run instead"}.get(kind, f"give {DEPENDENCY_FORMS}")
        raise SbatchError(f"sbatch: error: --dependency={text}: dependency type {kind!r} is not supported by "
                          f"astra slurm: {hint}")
    jobs = [j for j in rest.split(":")]
    if not rest or any(not j for j in jobs):
        raise SbatchError(f"sbatch: error: --dependency={text}: {kind} needs the jobs it waits for, e.g. "
                          f"--dependency={kind}:prep")
    for j in jobs:
        if "+" in j:
            raise SbatchError(f"sbatch: error: --dependency={text}: delays (+MINUTES) are not supported by astra slurm")
        if not _JOB.fullmatch(j):
            raise SbatchError(f"sbatch: error: --dependency={text}: {j!r} is not a job: give run names (as "
                              "astra slurm squeue shows them) or a job array's name")
    return {"type": kind, "runs": list(dict.fromkeys(jobs))}


_PATTERN = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)_\[([^\]]*)\]")


def job_matcher(arg: str, command: str = "squeue"):
    """What `squeue -j` and `scancel` take for a job: a run's name (`prep`, `train_3`), a job array's name (`train`:
    all its runs), or some of an array's runs (`train_[0-9]`, `train_[1,3,5-7]`). Returns a test of
    (run name, array job or None, array index or None)."""
    m = _PATTERN.fullmatch(arg.strip())
    if m:
        try:
            wanted = set(parse_array(m.group(3)).indices)
        except SbatchError:
            raise SbatchError(f"{command}: error: invalid job {arg!r}: write an array's tasks as JOB_[0-9], "
                              "JOB_[1,3,5-7]") from None
        job = m.group(1)
        return lambda name, array, index: array == job and index in wanted
    name = arg.strip()
    return lambda run, array, index: run == name or array == name


def split_jobs(arg: str) -> list[str]:
    """`a,b,train_[1,3]` → the jobs, commas inside brackets kept."""
    out, depth, cur = [], 0, ""
    for ch in arg:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        cur += ch
    out.append(cur)
    return [j.strip() for j in out if j.strip()]


# --- options -------------------------------------------------------------------------------------------------


_SIGNAL = re.compile(r"(?:([RB]{1,2}):)?([A-Za-z0-9]+)(?:@(\d+))?")
_SIGNALS = {"HUP", "INT", "QUIT", "KILL", "USR1", "USR2", "TERM", "CONT", "STOP", "URG", "ALRM", "XCPU", "PWR"}


def _signal(text: str) -> tuple[str, str, int]:
    """`--signal=[{R|B}:]SIG[@SECS]` → (flags, signal, seconds before the time limit; Slurm's default 60)."""
    m = _SIGNAL.fullmatch(text.strip())
    sig = (m.group(2).upper().removeprefix("SIG") if m else "")
    if not m or not (sig in _SIGNALS or (sig.isdigit() and 0 < int(sig) < 65)):
        raise SbatchError(f"sbatch: error: invalid --signal={text!r}: use [B:]SIG[@SECONDS], e.g. --signal=B:USR1@90")
    return m.group(1) or "", sig, int(m.group(3)) if m.group(3) else 60


def _open_mode(text: str) -> str:
    s = text.strip().lower()
    if s not in ("append", "truncate"):
        raise SbatchError(f"sbatch: error: invalid --open-mode={text!r}: give append or truncate")
    return s


def _chdir(text: str) -> str:
    s = _nonempty(text, "--chdir").strip()
    if "\0" in s:
        raise SbatchError(f"sbatch: error: invalid --chdir={text!r}: give a folder's path")
    return s


def _export(text: str) -> str:
    s = _nonempty(text, "--export").strip()
    if s.upper() not in ("ALL", "NONE", "NIL"):
        raise unsupported("--export", f"the job cannot take this shell's variables ({text}); set them in the script "
                          "(export NAME=VALUE) or in a run template's env (--template=NAME)")
    return s.upper()


# long, short (or None); arg: "required" | "optional" | "none"; slot: options that set the same thing share a slot
# (the last one wins); parse: (value) -> parsed value, tagged with the option's kind where a slot has several;
# cli_only; note: accepted, not honoured: what Astraeus does instead (one line on stderr)
Option = namedtuple("Option", "long short arg slot parse cli_only note", defaults=(False, None))


def _noted(long: str, short: str | None, note: str, arg: str = "required") -> Option:
    return Option(long, short, arg, f"noted:{long}", lambda v: v if v is not None else "", note=note)


NO_MAIL = "Astraeus sends no mail; astra astraeus events RUN shows what happened to the run"
OPTIONS: list[Option] = [
    Option("job-name", "J", "required", "name", lambda v: _nonempty(v, "--job-name")),
    Option("partition", "p", "required", "partition", _partition),
    Option("clusters", "M", "required", "cluster", _clusters),
    Option("constraint", "C", "required", "constraint", _constraint),
    Option("reservation", None, "required", "reservation", _reservation),
    Option("gres", None, "required", "gpus", lambda v: ("per_node", *_gres(v))),
    Option("gpus-per-node", None, "required", "gpus", lambda v: ("per_node", *_gpu_count(v, "--gpus-per-node"))),
    Option("gpus", "G", "required", "gpus", lambda v: ("total", *_gpu_count(v, "--gpus"))),
    Option("gpus-per-task", None, "required", "gpus", lambda v: ("per_task", *_gpu_count(v, "--gpus-per-task"))),
    Option("nodes", "N", "required", "nodes", _nodes),
    Option("cpus-per-task", "c", "required", "cpus", lambda v: ("per_task", _positive_int(v, "--cpus-per-task"))),
    Option("cpus-per-gpu", None, "required", "cpus", lambda v: ("per_gpu", _positive_int(v, "--cpus-per-gpu"))),
    Option("mem", None, "required", "mem", lambda v: ("per_node", parse_mem(v, "--mem", allow_zero=True))),
    Option("mem-per-cpu", None, "required", "mem", lambda v: ("per_cpu", parse_mem(v, "--mem-per-cpu"))),
    Option("mem-per-gpu", None, "required", "mem", lambda v: ("per_gpu", parse_mem(v, "--mem-per-gpu"))),
    Option("time", "t", "required", "time", lambda v: parse_time(v, "--time")),
    Option("container-image", None, "required", "image", _container_image),
    Option("template", None, "required", "template", _template),  # astra's own: a run template (drives, env, …)
    Option("array", "a", "required", "array", parse_array),
    Option("dependency", "d", "required", "dependency", parse_dependency),
    Option("nice", None, "optional", "nice", _nice),
    Option("output", "o", "required", "output", lambda v: v),
    Option("error", "e", "required", "error", lambda v: v),
    Option("open-mode", None, "required", "open_mode", _open_mode),
    Option("chdir", "D", "required", "chdir", _chdir),
    Option("container-workdir", None, "required", "chdir", _chdir),  # pyxis: the same inside the container
    Option("ntasks-per-node", None, "required", "ntasks_per_node",
           lambda v: _positive_int(v, "--ntasks-per-node")),
    Option("tasks-per-node", None, "required", "ntasks_per_node",  # Slurm's other spelling
           lambda v: _positive_int(v, "--tasks-per-node")),
    Option("ntasks", "n", "required", "ntasks", lambda v: _positive_int(v, "--ntasks")),
    Option("ntasks-per-gpu", None, "required", "ntasks_per_gpu", lambda v: _positive_int(v, "--ntasks-per-gpu")),
    Option("exclusive", None, "optional", "exclusive", lambda v: v or "node"),
    Option("requeue", None, "none", "requeue", lambda v: True),  # Astraeus' default: a preempted run is queued again
    Option("no-requeue", None, "none", "requeue", lambda v: False),
    Option("hold", "H", "none", "held", lambda v: True),  # submitted held: scontrol release starts it
    Option("signal", None, "required", "signal", _signal),
    Option("export", None, "required", "export", _export),
    _noted("account", "A", "Astraeus has no accounts: the workspace's quota and weight apply"),
    _noted("qos", "q", "Astraeus has no QOS: the workspace's quota and the run's priority apply (--nice=N)"),
    _noted("mail-type", None, NO_MAIL),
    _noted("mail-user", None, NO_MAIL),
    _noted("hint", None, "Astraeus places processes as the machine gives them; no CPU binding hint is applied"),
    _noted("gpu-bind", None, "each worker sees only its own GPUs (CUDA_VISIBLE_DEVICES); no binding is applied"),
    _noted("cpu-bind", None, "no CPU binding is applied"),
    _noted("mem-bind", None, "no memory binding is applied"),
    _noted("distribution", "m", "one worker per machine runs the script; tasks are laid out by the script"),
    _noted("licenses", "L", "Astraeus counts no licenses"),
    _noted("comment", None, "the comment is not kept (a run's labels can hold notes: the API's metadata.labels)"),
    _noted("wckey", None, "Astraeus keeps no workload keys"),
    _noted("exclude", "x", "Astraeus cannot avoid named machines; drain a bad machine instead (astra astraeus "
           "machines)"),
    _noted("threads-per-core", None, "the run gets whole CPU cores as the machine counts them"),
    _noted("ntasks-per-core", None, "the run gets whole CPU cores as the machine counts them"),
    _noted("sockets-per-node", None, "the run gets CPU cores, not sockets"),
    _noted("cores-per-socket", None, "the run gets CPU cores, not sockets"),
    _noted("gpu-freq", None, "GPU clocks are left as the machine sets them"),
    _noted("cpu-freq", None, "CPU clocks are left as the machine sets them"),
    _noted("kill-on-invalid-dep", None, "a run whose dependency can no longer be met fails at once"),
    _noted("propagate", None, "limits are the container's"),
    _noted("get-user-env", None, "the worker's environment is the run's env", arg="optional"),
    _noted("overcommit", "O", "each worker gets the CPU cores it asked", arg="none"),
    _noted("oversubscribe", "s", "GPUs are never shared between runs", arg="none"),
    _noted("no-kill", "k", "a gang whose machine is lost is started again as a whole", arg="optional"),
    _noted("verbose", "v", "astra slurm sbatch prints what it maps", arg="none"),
    _noted("quiet", "Q", "astra slurm sbatch prints only what it changes", arg="none"),
    _noted("mincpus", None, "ask for CPU cores with --cpus-per-task"),
    _noted("switches", None, "Astraeus places gangs without a switch count"),
    _noted("network", None, "a gang's workers reach each other on the workers' own network"),
    _noted("uid", None, "a run runs as its workspace's user"),
    _noted("gid", None, "a run runs as its workspace's user"),
    _noted("spread-job", None, "one worker per machine runs the script", arg="none"),
    Option("wrap", None, "required", "wrap", lambda v: _nonempty(v, "--wrap"), cli_only=True),
    Option("dry-run", None, "none", "dry_run", lambda v: True, cli_only=True),  # astra's own: print the spec
    Option("test-only", None, "none", "test_only", lambda v: True, cli_only=True),  # what-if: submit nothing
    Option("wait", "W", "none", "wait", lambda v: True, cli_only=True),  # wait for the end, exit with its code
    Option("parsable", None, "none", "parsable", lambda v: True, cli_only=True),  # print the job's name alone
]
_LONG = {o.long: o for o in OPTIONS}
_SHORT = {o.short: o for o in OPTIONS if o.short}

# Options Astraeus refuses, with what to do instead (also for people who carry them over from Slurm).
_HINTS = {
    "--container-mounts": "astra cannot mount a drive; use a template that has it (--template=NAME; astra astraeus "
                          "templates create -f), or the API (datavolume_refs)",
    "--priority": "use --nice=-N, or a priority in the spec",
    "--begin": "submit the job when it should start, or use astra astraeus schedules for a time of day",
    "--nodelist": "name the machines' pool with --partition, or their labels with --constraint",
    "--deadline": "give a --time limit instead",
    "--batch": "name the machines' labels with --constraint",
    "--acctg-freq": "Astraeus measures each worker's use itself",
    "--profile": "Astraeus measures each worker's use itself",
    "--nodefile": "name the machines' pool with --partition, or their labels with --constraint",
    "--container-name": "each run starts from its image; keep state on a drive (--template=NAME)",
    "--container-mount-home": "use a template with a drive (--template=NAME)",
    "--tmp": "ask for ephemeral storage in a run template (--template=NAME)",
    "--input": "read input inside the script",
    "--ntasks-per-socket": "the run gets CPU cores, not sockets",
    "--cluster-constraint": "give one cluster with -M/--clusters",
    "--mcs-label": "Astraeus has no MCS labels",
    "--reboot": "Astraeus does not reboot machines",
    "--delay-boot": "Astraeus does not reboot machines",
    "--power": "Astraeus does not manage power",
    "--thread-spec": "the run gets whole CPU cores",
    "--core-spec": "the run gets whole CPU cores",
    "--bb": "Astraeus has no burst buffers; use a drive (--template=NAME)",
    "--bbf": "Astraeus has no burst buffers; use a drive (--template=NAME)",
    "--tres-per-task": "give --gpus-per-task and --cpus-per-task",
    "--tres-bind": "each worker sees only its own GPUs",
    "--nodes-per-array": "give --nodes",
}
_REFUSED_SHORT = {"w": "--nodelist", "b": "--begin", "F": "--nodefile",
                  "i": "--input", "I": "--immediate", "S": "--core-spec"}
# Every long option a word may abbreviate (as Slurm's getopt does) or be mistaken for.
_KNOWN = sorted({*_LONG, *(h[2:] for h in _HINTS), "immediate", "help", "usage"})


class Options:
    __slots__ = ("values", "given", "written")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}  # slot → parsed value
        self.given: dict[str, str] = {}  # slot → the option as written, for messages
        self.written: dict[str, str] = {}  # slot → the option with its value, for notes


def _long_option(name: str, where: str | None) -> str:
    """A long option's full name: itself, or the one option it abbreviates (Slurm takes `--tim` for `--time` and
    `--err` for `--error`); a misspelt or ambiguous one is refused with what was meant."""
    if name in _LONG or f"--{name}" in _HINTS:
        return name
    at = f" ({where})" if where else ""
    starts = [k for k in _KNOWN if k.startswith(name)] if len(name) >= 2 else []
    if len(starts) == 1:
        return starts[0]
    if len(starts) > 1:
        # an abbreviation of one option and of longer ones that begin with it (`--tim`: time, not time-min)
        shortest = min(starts, key=len)
        if all(k.startswith(shortest) for k in starts):
            return shortest
        shown = ", ".join(f"--{k}" for k in starts[:4])
        raise SbatchError(f"sbatch: error: option --{name} is ambiguous: did you mean {shown}?{at}")
    import difflib  # a misspelt option's only: it costs every `sbatch` its start otherwise

    close = difflib.get_close_matches(name, _KNOWN, n=1, cutoff=0.75)
    if close:
        raise SbatchError(f"sbatch: option --{name} is not supported by astra slurm: did you mean --{close[0]}?{at}")
    return name


def parse_options(args: list[str], *, where: str | None = None, directive: bool = False) -> tuple[Options, list[str]]:
    """Parse sbatch options up to the first argument that is not one; return them and the rest.

    In a `#SBATCH` line (`directive=True`) every word must be an option. `where` names the source in messages.
    """
    opts = Options()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return opts, args[i + 1 :]
        if arg in ("-h", "--help", "--usage") and not directive:
            raise HelpRequested()
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            name = _long_option(name, where)
            if name in ("help", "usage") and not directive:
                raise HelpRequested()  # `--he`: an abbreviation of --help
            opt = _LONG.get(name)
            written = f"--{name}"
            if opt is None or (directive and opt.cli_only):
                raise unsupported(written, _HINTS.get(written), where)
            if opt.arg == "none":
                if eq:
                    raise SbatchError(f"sbatch: error: {written} takes no value")
                val = None
            elif eq:
                val = value
            elif opt.arg == "optional":
                val = None
                if opt.slot == "nice" and i + 1 < len(args) and re.fullmatch(r"[+-]?\d+", args[i + 1]):
                    i += 1  # `--nice -60`: take the number, as people write it
                    val = args[i]
            else:
                if i + 1 >= len(args):
                    raise SbatchError(f"sbatch: error: {written} needs a value"
                                      + (f" ({where})" if where else ""))
                i += 1
                val = args[i]
        elif arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
            letter = arg[1]
            opt = _SHORT.get(letter)
            written = f"-{letter}"
            if opt is None or (directive and opt.cli_only):
                long = _REFUSED_SHORT.get(letter)
                raise unsupported(written, _HINTS.get(long or "") or (f"{long} is not supported" if long else None),
                                  where)
            if opt.arg == "none":
                val = None
                if len(arg) > 2:
                    raise SbatchError(f"sbatch: error: {written} takes no value" + (f" ({where})" if where else ""))
            elif len(arg) > 2:
                val = arg[2:]
            elif opt.arg == "optional":
                val = None
            else:
                if i + 1 >= len(args):
                    raise SbatchError(f"sbatch: error: {written} needs a value" + (f" ({where})" if where else ""))
                i += 1
                val = args[i]
        else:
            if directive:
                raise SbatchError(f"sbatch: error: unexpected word {arg!r} in an #SBATCH line ({where})")
            return opts, args[i:]
        try:
            parsed = opt.parse(val)
        except SbatchError as e:
            if where:
                raise SbatchError(f"{e} ({where})") from None
            raise
        prev = opts.given.get(opt.slot)
        if prev is not None and prev != f"--{opt.long}" and opt.slot in ("mem",):
            raise SbatchError(f"sbatch: error: --{opt.long} and {prev} are mutually exclusive"
                              + (f" ({where})" if where else ""))
        opts.values[opt.slot] = parsed
        opts.given[opt.slot] = f"--{opt.long}"
        opts.written[opt.slot] = f"--{opt.long}" + (f"={val}" if val else "")
        i += 1
    return opts, []


def _is_number(arg: str) -> bool:
    return bool(re.fullmatch(r"-\d+(\.\d+)?", arg))


def _strip_comment(text: str) -> str:
    """Cut a line at the first `#` that starts a word outside quotes (so `nvcr.io#nvidia/pytorch` stays whole)."""
    quote: str | None = None
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i]
    return text


def directives(script: str) -> list[tuple[int, list[str]]]:
    """The `#SBATCH` lines of a script as (line number, words), as Slurm reads them: from the top, up to the
    first line that is not blank and not a comment; later `#SBATCH` lines are ignored."""
    found: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(script.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if line.startswith("#SBATCH"):
            rest = line[len("#SBATCH") :]
            if rest and not rest[0].isspace():
                continue  # "#SBATCHfoo": just a comment
            try:
                words = shlex.split(_strip_comment(rest))
            except ValueError as e:
                raise SbatchError(f"sbatch: error: cannot read #SBATCH line {lineno}: {e}") from None
            found.append((lineno, words))
        elif stripped.startswith("#"):
            continue
        else:
            break
    return found


# --- the job -----------------------------------------------------------------------------------------------------


JOB_NAME_LABEL = "slurm.astraeus.io/job-name"  # the script's own job name, where the run's name had to differ


class SbatchJob:
    def __init__(self, name: str, spec: dict[str, Any], notes: list[str], dry_run: bool = False,
                 array: ArrayRange | None = None, test_only: bool = False, partition: str | None = None,
                 processors: int = 1, job_name: str | None = None, job_id: int | None = None):
        self.name = name
        self.spec = spec
        self.notes = notes
        self.dry_run = dry_run
        self.array = array  # --array: one run per index, `<name>_<index>`
        self.test_only = test_only  # --test-only: ask when and where it would start (POST $API/runs?dry_run=true)
        self.partition = partition  # the pools given (comma-separated), as --test-only names the partition
        self.processors = processors  # CPU cores in all (Slurm's "processors"; 1 per task unless asked)
        self.job_name = job_name  # the job name as the script wrote it (SLURM_JOB_NAME)
        self.job_id = job_id  # once submitted: the run's numeric job id (metadata.job_id; `sbatch --parsable`)

    def renamed(self, name: str) -> SbatchJob:
        """The same job under another run name (a resubmitted script: `llama-train-2`); the script's mount path and
        the job name stay."""
        meta = {**self.spec["metadata"], "name": name}
        labels = dict(meta.get("labels") or {})
        labels.setdefault(JOB_NAME_LABEL, _label_value(self.job_name or self.name))
        meta["labels"] = labels
        return SbatchJob(name, {**self.spec, "metadata": meta}, self.notes, self.dry_run, self.array, self.test_only,
                         self.partition, self.processors, self.job_name)

    def bodies(self) -> list[dict[str, Any]]:
        """The runs to submit: the job's, or one per index of its array (each with `spec.array`)."""
        if self.array is None:
            return [self.spec]
        ix = self.array.indices
        out = []
        for i in ix:
            array = {"job": self.name, "index": i, "count": len(ix), "min_index": ix[0], "max_index": ix[-1]}
            if self.array.max_running is not None:
                array["max_running"] = self.array.max_running
            out.append({"metadata": {**self.spec["metadata"], "name": f"{self.name}_{i}"},
                        "spec": {**self.spec["spec"], "array": array}})
        return out


# options: Options; script: a path, None: read the script from stdin (or --wrap); script_args: list[str]
CommandLine = namedtuple("CommandLine", "options script script_args")


def parse_command_line(argv: list[str]) -> CommandLine:
    opts, rest = parse_options(argv)
    if rest:
        return CommandLine(opts, rest[0], rest[1:])
    return CommandLine(opts, None, [])


def default_name(script: str | None, wrap: bool) -> str:
    """Slurm's default job name, made a valid run name: `finetune.sbatch` → `finetune`, `Train_GPT.sh` →
    `train-gpt`."""
    if wrap:
        return "wrap"
    if script is None or script == "-":
        return "sbatch"
    from pathlib import PurePath

    name = re.sub(r"[^a-z0-9-]+", "-", PurePath(script).stem.lower()).strip("-")[:63].strip("-")
    return name or "sbatch"


def wrap_script(command: str) -> str:
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"




def run_name(job_name: str) -> str:
    """A Slurm job name made a valid run name (a DNS label): `llama_train` → `llama-train`, `GPT.NeoX 20B` →
    `gpt-neox-20b`; the job name itself is kept as SLURM_JOB_NAME."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-")[:63].strip("-")
    return name or "sbatch"


def _label_value(text: str) -> str:
    v = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("._-")
    return v


def _expand(pattern: str, name: str, job_name: str, array: ArrayRange | None) -> str:
    """Slurm's filename pattern with what Astraeus knows at submit: %x the job name, %j/%A the run (or array) name,
    %a the first index, %N the first worker, %% a %."""
    first = array.indices[0] if array is not None else None
    run = f"{name}_{first}" if first is not None else name
    subs = {"x": job_name, "j": run, "A": name, "a": str(first if first is not None else 4294967294),
            "N": f"{run}-0", "u": "$USER", "n": "0", "t": "0", "s": "batch", "%": "%"}
    return re.sub(r"%(\d*)([xjAaNuntsJ%])", lambda m: subs.get(m.group(2), m.group(0)), pattern)


def _tasks(v: dict[str, Any], nodes: int) -> tuple[int, int]:
    """(tasks per node, tasks in all) from --ntasks-per-node, -n/--ntasks and --ntasks-per-gpu."""
    if "ntasks_per_node" in v:
        per_node = v["ntasks_per_node"]
        if "ntasks" in v and v["ntasks"] != per_node * nodes:
            raise SbatchError(f"sbatch: error: --ntasks={v['ntasks']} with --ntasks-per-node={per_node} on {nodes} "
                              f"node(s): give --ntasks={per_node * nodes}, or one of the two options")
        return per_node, per_node * nodes
    if "ntasks" in v:
        n = v["ntasks"]
        if n % nodes:
            raise SbatchError(f"sbatch: error: --ntasks={n} on {nodes} node(s): astra slurm gives every machine as "
                              f"many tasks; give a multiple of {nodes}, or --ntasks-per-node")
        return n // nodes, n
    return 1, nodes


def build_job(cmd: CommandLine, script_text: str, script_label: str = "the script",
              default_image: bool = False) -> SbatchJob:
    """Merge the script's `#SBATCH` lines with the command line (the command line wins) into a run spec.

    `default_image`: the workspace (or its cluster) has a default image, used when the job names none."""
    merged = Options()
    wrap = "wrap" in cmd.options.values
    if wrap:
        script_text = wrap_script(cmd.options.values["wrap"])
    if not wrap:
        for lineno, words in directives(script_text):
            line_opts, _ = parse_options(words, where=f"#SBATCH line {lineno} of {script_label}", directive=True)
            for slot, val in line_opts.values.items():
                if slot == "mem" and merged.given.get("mem") not in (None, line_opts.given[slot]):
                    raise SbatchError(f"sbatch: error: {line_opts.given[slot]} and {merged.given['mem']} are "
                                      f"mutually exclusive (#SBATCH line {lineno} of {script_label})")
                merged.values[slot] = val
                merged.given[slot] = line_opts.given[slot]
                merged.written[slot] = line_opts.written[slot]
    merged.values.update(cmd.options.values)
    merged.given.update(cmd.options.given)
    merged.written.update(cmd.options.written)
    v = merged.values
    notes: list[str] = []

    job_name = v.get("name") or default_name(cmd.script, wrap)
    name = run_name(job_name)
    nodes = v.get("nodes", 1)
    per_node_tasks, ntasks = _tasks(v, nodes)

    resources: dict[str, Any] = {}
    gpu_count = 0
    per_machine: int | None = None
    gpu_model: str | None = None
    if "gpus" in v:
        kind, n, gpu_model = v["gpus"]
        if kind == "per_node":
            gpu_count, per_machine = n * nodes, n
        elif kind == "per_task":  # --gpus-per-task × tasks per node: GPUs per machine
            per_machine = n * per_node_tasks
            gpu_count = per_machine * nodes
        else:
            gpu_count = n
    if "ntasks_per_gpu" in v:
        if not gpu_count:
            raise SbatchError("sbatch: error: --ntasks-per-gpu needs GPUs: add --gpus-per-node=N (or --gres=gpu:N)")
        if "ntasks" not in v and "ntasks_per_node" not in v:
            per_node_tasks = v["ntasks_per_gpu"] * (per_machine or max(gpu_count // nodes, 1))
            ntasks = per_node_tasks * nodes
    cpus_total: int | None = None
    if "cpus" in v:
        kind, n = v["cpus"]
        if kind == "per_task":
            cpus_total = n * ntasks
        else:
            if not gpu_count:
                raise SbatchError("sbatch: error: --cpus-per-gpu needs GPUs (--gres=gpu:N or --gpus=N)")
            cpus_total = n * gpu_count
    if cpus_total is not None:
        resources["cpu_cores"] = cpus_total
    if "mem" in v:
        kind, b = v["mem"]
        if kind == "per_node" and b == 0:
            notes.append(f"sbatch: note: {merged.written['mem']}: the job asks for no set amount of memory (Slurm: "
                         "all of the node's); the machine's memory is shared with other runs on it")
        elif kind == "per_node":
            resources["memory_bytes"] = b * nodes
        elif kind == "per_cpu":
            resources["memory_bytes"] = b * (cpus_total if cpus_total is not None else ntasks)
        else:
            if not gpu_count:
                raise SbatchError("sbatch: error: --mem-per-gpu needs GPUs (--gres=gpu:N or --gpus=N)")
            resources["memory_bytes"] = b * gpu_count
    if gpu_model and not gpu_count:
        raise SbatchError(f"sbatch: error: {merged.given['gpus']}: a GPU type with 0 GPUs: give a count of 1 or more")
    if "exclusive" in v:
        if not gpu_count:
            raise SbatchError(f"sbatch: error: {merged.written['exclusive']}: astra slurm holds a whole machine by "
                              "its GPUs: add --gpus-per-node=N with the machines' GPU count (astra astraeus machines "
                              "shows it)")
        notes.append(f"sbatch: note: {merged.written['exclusive']}: the job holds {per_machine or gpu_count} GPU(s) "
                     "per machine, the machine's GPUs; other runs may still use its spare CPU cores and memory")
    if isinstance(gpu_count, float):
        if nodes != 1:
            raise SbatchError(f"sbatch: error: a part of one GPU ({gpu_count:g}) is for one node: drop --nodes={nodes}")
        gpu_count, per_machine = 1, None
        resources["gpu_requests"] = {"count": 1, "fraction": float(v["gpus"][1])}
        if gpu_model:
            resources["gpu_requests"]["model"] = gpu_model
    elif gpu_count:
        gpu_req: dict[str, Any] = {"count": gpu_count}
        if gpu_model:
            gpu_req["model"] = gpu_model
        if per_machine and nodes > 1:
            gpu_req["min_per_machine"] = per_machine
        resources["gpu_requests"] = gpu_req
    resources["machines"] = nodes
    selection: dict[str, Any] = {"mode": "Labels", "labels": v["constraint"]} if v.get("constraint") else {}
    if v.get("partition"):
        selection["pools"] = v["partition"]
    if v.get("reservation"):
        selection["reservation"] = v["reservation"]
    resources["node_selection"] = {"mode": "Any", **selection}

    # With --template the run template's fields apply wherever no option here says otherwise: its image, drives,
    # env, priority, resources and restart policy (the server merges them: astraeus.templates).
    from_template = v.get("template")
    if from_template:
        if "nodes" not in v:
            del resources["machines"]
        if selection:  # only what the options say; the template's node selection applies to the rest
            resources["node_selection"] = selection
        else:
            del resources["node_selection"]
    if "image" not in v and not from_template and not default_image:
        raise SbatchError("sbatch: error: no container image: add #SBATCH --container-image=IMAGE to the script, "
                          "or give --container-image=IMAGE (every Astraeus run names its image), or "
                          "--template=NAME for a run template that names one; an admin may set the workspace's "
                          "default_image (PATCH $ORG_API/workspaces/NAME)")
    path = f"{SCRIPT_DIR}/{name}.sbatch"
    template: dict[str, Any] = {"image": v["image"]} if "image" in v else {}
    template["command"] = "bash"
    if "chdir" in v:  # -D/--chdir: the script starts in that folder, as Slurm's does (its start fails without it)
        template["args"] = ["-c", 'cd -- "$0" && exec bash "$@"', v["chdir"], path, *cmd.script_args]
    else:
        template["args"] = [path, *cmd.script_args]
    if not from_template:
        template["restart_policy"] = "Never"
    if v.get("time") is not None:
        template["time_limit_seconds"] = v["time"]
    # Slurm's task layout where the script set one, for launchers that read it (each worker gets the rest, and one
    # task per machine otherwise)
    env = {}
    if any(k in v for k in ("ntasks", "ntasks_per_node", "ntasks_per_gpu")):
        env.update(SLURM_NTASKS=str(ntasks), SLURM_NPROCS=str(ntasks), SLURM_NTASKS_PER_NODE=str(per_node_tasks))
    if "cpus" in v and v["cpus"][0] == "per_task":
        env["SLURM_CPUS_PER_TASK"] = str(v["cpus"][1])
    if "gpus" in v and v["gpus"][0] == "per_task":
        env["SLURM_GPUS_PER_TASK"] = str(v["gpus"][1])
    if v.get("partition"):
        env["SLURM_JOB_PARTITION"] = ",".join(v["partition"])
    if env:
        template["env"] = env
    if resources:
        template["requested_resources"] = resources
    template["configs"] = [{"mounts": [path], "value": script_text}]

    spec: dict[str, Any] = {}
    if from_template:
        spec["template"] = from_template
    if "nice" in v:
        spec["priority"] = -v["nice"]
    if not from_template:
        spec["start"] = "Gang"
    if "cluster" in v:
        spec["cluster"] = v["cluster"]
    if "dependency" in v:
        spec["dependency"] = v["dependency"]
    spec["task_template"] = template
    array: ArrayRange | None = v.get("array")
    if array is not None and len(f"{name}_{array.indices[-1]}") > 63:
        raise SbatchError(f"sbatch: error: the job name {job_name} is too long for an array's run names "
                          f"({name}_{array.indices[-1]}, over 63 characters): give a shorter --job-name")

    first = name if array is None else f"{name}_{array.indices[0]}"
    if job_name != name:
        notes.append(f"sbatch: note: job name {job_name}: the run is named {name} (run names are DNS labels); "
                     f"SLURM_JOB_NAME is {job_name}")
    if v.get("partition") and merged.written.get("partition", "").partition("=")[2] not in ("", ",".join(v["partition"])):
        notes.append(f"sbatch: note: {merged.written['partition']}: pools {', '.join(v['partition'])} (pool names are "
                     "DNS labels)")
    if ntasks > nodes:
        notes.append(f"sbatch: note: {ntasks} tasks ({per_node_tasks} per node): the script runs once per machine with "
                     f"SLURM_NTASKS={ntasks}; start the tasks from it (srun, torchrun --nproc-per-node)")
    logs = [s for s in ("output", "error", "open_mode") if s in v]
    if logs:  # the patterns as this job's would read (%x %j %A %a %N), so the user knows which file it meant
        files = [_expand(v[s], name, job_name, array) for s in ("output", "error") if s in v]
        notes.append(f"sbatch: note: {' and '.join(merged.given[s] for s in logs)} ignored"
                     + (f" ({', '.join(files)})" if files else "")
                     + f": Astraeus keeps each worker's output, both streams, from its start; read it with astra "
                       f"astraeus logs {first}-0")
    if "signal" in v:
        flags, sig, secs = v["signal"]
        if template.get("time_limit_seconds"):  # sent by the worker's supervisor SECS before the limit
            template["signal"] = {"name": sig, "seconds_before_limit": secs, "batch_only": "B" in flags}
        else:
            notes.append(f"sbatch: note: {merged.written['signal']}: the job has no time limit, so SIG{sig} is never "
                         "sent; give --time=... for it to come that long before the limit")
    if v.get("requeue") is False:  # a preempted run ends instead of being queued again
        spec["requeue"] = False
    if v.get("held"):  # held in the submit's own transaction: no plan sees it before the hold
        spec["held"] = True
    if "export" in v and v["export"] != "ALL":
        notes.append(f"sbatch: note: {merged.written['export']}: the worker's environment is the run's env and "
                     "Astraeus' own variables; none of this shell's")
    for slot, written in merged.written.items():
        if slot.startswith("noted:"):
            notes.append(f"sbatch: note: {written}: {_LONG[slot[6:]].note}")
    metadata: dict[str, Any] = {"name": name}
    if job_name != name:
        metadata["labels"] = {JOB_NAME_LABEL: _label_value(job_name)}
    return SbatchJob(name=name, spec={"metadata": metadata, "spec": spec}, notes=notes,
                     dry_run=bool(v.get("dry_run")), array=array, test_only=bool(v.get("test_only")),
                     partition=",".join(v["partition"]) if v.get("partition") else None,
                     processors=cpus_total if cpus_total is not None else ntasks, job_name=job_name)
