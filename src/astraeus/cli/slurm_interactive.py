"""Interactive Slurm commands over Astraeus: `astra slurm srun`, `salloc`, and `sbatch --wait/--parsable`.

    srun [OPTIONS] CMD…        a one-off run of CMD; its output streamed here; exits with its exit code
    srun [OPTIONS] --pty CMD   a run holding the allocation, CMD on a terminal inside it (astra astraeus shell)
    salloc [OPTIONS] [CMD…]    a run holding the allocation; a local shell (or CMD) with SLURM_JOB_ID set, in which
                               `astra slurm srun CMD` runs CMD in the allocation's workers (astra astraeus exec)

The options are sbatch's (astraeus.cli.slurm.parse_options). The runs that srun and salloc make are deleted when
they end: their output was shown here, and the names stay free for the next one.
"""

from __future__ import annotations

import shlex
import sys
import time

from astraeus import envvars
from astraeus.cli import format as fmt
from astraeus.cli.client import ApiError, Client, q
from astraeus.cli.slurm import (
    CommandLine,
    HelpRequested,
    SbatchError,
    SbatchJob,
    build_job,
    parse_options,
    parse_time,
)

# srun/salloc's own (contextlib, signal, subprocess, threading, pathlib) are imported where used: sbatch imports
# this module for its output and --wait, and would pay their import at every start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import typer


def echo(message: str, err: bool = False) -> None:
    """A line on stdout or stderr (no typer here: sbatch's fast path imports this module)."""
    out = sys.stderr if err else sys.stdout
    out.write(message + "\n")
    out.flush()

# The command of a run that only holds its allocation: it sleeps until deleted or its time limit ends it.
HOLD = "while :; do sleep 3600; done"
# sbatch's options that make no sense for a one-off interactive run.
_NOT_HERE = {"array": "--array", "wrap": "--wrap", "test_only": "--test-only", "dependency": "--dependency"}
POLL_S = 0.5

SRUN_HELP = """Run a command as a one-off job: astra slurm srun [OPTIONS] [--pty] CMD [ARGS]…

The options are astra slurm sbatch's (-N, -G/--gpus, --gpus-per-node, -c, --mem, -t, -p, -J, --container-image,
--template, …: astra slurm sbatch --help). CMD's output is streamed here and srun exits with its exit code; Ctrl-C
deletes the run. The run is deleted when it ends.
  --pty        CMD on a terminal inside the job (e.g. srun --pty bash): the job holds its allocation until CMD ends
  --idle-timeout=TIME  with --pty: the job ends once no shell or exec session has been attached for TIME (Slurm's
               time formats: 30 is 30 minutes, 0:30 is 30 seconds); its reason says so
Inside `astra slurm salloc` (SLURM_JOB_ID set), srun runs CMD in the allocation's workers instead (-N: the first N).
"""

SALLOC_HELP = """Hold an allocation and work in it: astra slurm salloc [OPTIONS] [CMD [ARGS]…]

The options are astra slurm sbatch's. salloc submits a run that holds the allocation, waits until it runs, then
starts your shell (or CMD) here with SLURM_JOB_ID, SLURM_JOB_NAME and SLURM_NNODES set: in it, astra slurm srun CMD
runs CMD in the allocation. The allocation is deleted when the shell (or CMD) exits; salloc exits with its code.
  --idle-timeout=TIME  the allocation ends once no srun or shell session has run in it for TIME (Slurm's time
               formats: 30 is 30 minutes, 0:30 is 30 seconds); its reason says so
"""


# --- sbatch --wait / --parsable -----------------------------------------------------------------------------------

def exit_code_of(run: dict[str, Any]) -> int:
    """A run's exit code as Slurm reports a job's: 0 when Completed, else its workers' highest exit code (1 when
    none reported one, e.g. cancelled before it started)."""
    status = run.get("status") or {}
    codes = [w.get("exit_code") for w in status.get("workers") or [] if isinstance(w.get("exit_code"), int)]
    worst = max((abs(x) for x in codes if x), default=0)
    if status.get("state") == "Completed":
        return 0
    return min(worst, 255) or 1


def default_image(cluster: str | None) -> str | None:
    """The workspace's default image on the cluster (GET $API: clusters[].default_image), None where it has none."""
    with Client.from_env() as c:
        try:
            ws = c.get("")
        except ApiError:
            return None
    clusters = [a for a in (ws or {}).get("clusters") or [] if isinstance(a, dict)]
    if cluster is not None:
        clusters = [a for a in clusters if a.get("name") == cluster]
    return (clusters[0].get("default_image") or None) if clusters else None


def wait_for_end(c: Client, names: list[str]) -> int:
    """Wait until every run in `names` ended; the highest exit code among them (Slurm's, for a job array)."""
    worst = 0
    for name in names:
        while True:
            run = c.get(f"runs/{q(name)}") or {}
            if ((run.get("status") or {}).get("state")) in fmt.TERMINAL:
                worst = max(worst, exit_code_of(run))
                break
            time.sleep(POLL_S)
    return worst


def submitted(name: str, notes: list[str], values: dict[str, Any], runs: list[str] | None = None,
              job_id: int | None = None) -> None:
    """What sbatch says once the job is submitted: `Submitted batch job NAME` (with --parsable: its numeric job id
    alone, as Slurm prints it; a job array, which has no one id: its name), its notes; with --wait, it waits for
    the job (each run of an array) to end and exits with its exit code."""
    parsable = str(job_id) if job_id is not None else name
    echo(fmt.terminal_safe(parsable if values.get("parsable") else f"Submitted batch job {name}"))
    for note in notes:  # after the outcome, so that a refusal stays one line
        echo(note, err=True)
    if values.get("wait"):
        with Client.from_env() as c:
            code = wait_for_end(c, runs or [name])
        raise SystemExit(code)


# --- shared -------------------------------------------------------------------------------------------------------

def _renamed_error(e: SbatchError, command: str) -> SbatchError:
    return SbatchError(str(e).replace("sbatch:", f"{command}:", 1))


def split_flags(argv: list[str], flags: set[str]) -> tuple[list[str], set[str]]:
    """Take out of the options part of `argv` the command's own flags (srun's --pty); one written after CMD
    belongs to CMD. The options themselves are parsed by sbatch's parser."""
    found: set[str] = set()
    while True:
        at = next((i for i, a in enumerate(argv) if a in flags), None)
        if at is None or "--" in argv[:at]:
            return argv, found
        _, rest = parse_options(argv[:at])
        if rest:  # the flag comes after CMD
            return argv, found
        found.add(argv[at])
        argv = argv[:at] + argv[at + 1 :]


IDLE = "--idle-timeout"


def take_idle_timeout(argv: list[str], command: str) -> tuple[list[str], int | None]:
    """Take `--idle-timeout=TIME` (or `--idle-timeout TIME`) out of the options part of `argv`: seconds, or None."""
    for i, a in enumerate(argv):
        if a == "--" or not a.startswith("-"):
            break
        if a == IDLE or a.startswith(IDLE + "="):
            value = a.partition("=")[2] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            rest = argv[:i] + argv[i + (1 if "=" in a else 2):]
            try:
                seconds = parse_time(value, IDLE) if value.strip() else None
            except SbatchError:
                seconds = None
            if not seconds:
                raise SbatchError(f"{command}: error: invalid {IDLE}={value!r}: give how long the job may wait with "
                                  "no session attached, e.g. --idle-timeout=30 (minutes) or --idle-timeout=0:30 "
                                  "(seconds)")
            return rest, seconds
    return argv, None


def with_idle_timeout(job: SbatchJob, seconds: int | None) -> SbatchJob:
    if seconds:
        job.spec["spec"]["interactive"] = {"idle_timeout_seconds": seconds}
    return job


def parse(argv: list[str], command: str, flags: set[str] = frozenset()) -> tuple[CommandLine, list[str], set[str]]:
    """(options, CMD, flags) of an srun/salloc command line; sbatch-only options are refused."""
    try:
        argv, found = split_flags(list(argv), set(flags))
        opts, rest = parse_options(argv)
    except SbatchError as e:
        raise _renamed_error(e, command) from None
    for slot, shown in _NOT_HERE.items():
        if slot in opts.values:
            raise SbatchError(f"{command}: error: {shown} is not supported by astra slurm {command}: use astra slurm "
                              "sbatch for it")
    return CommandLine(opts, None, []), rest, found


def build(cmd: CommandLine, command: list[str], default_name: str, what: str) -> SbatchJob:
    """The run spec, as sbatch would make it for a script running `command` (a shell line)."""
    cmd.options.values.setdefault("name", default_name)
    cmd.options.values["wrap"] = command
    try:
        try:
            job = build_job(cmd, "", "--wrap")
        except SbatchError as e:
            if "no container image" not in str(e):
                raise
            image = default_image(cmd.options.values.get("cluster"))  # the workspace's, as sbatch uses it
            if image is None:
                raise
            job = build_job(cmd, "", "--wrap", default_image=True)
            job.spec["spec"]["task_template"]["image"] = image
    except SbatchError as e:
        raise _renamed_error(e, what) from None
    job.notes = [n.replace("sbatch:", f"{what}:", 1) for n in job.notes]
    return job


def submit(c: Client, job: SbatchJob, what: str, refused: str = "Unable to allocate resources: {}") -> SbatchJob:
    """POST the run; a name in use gets -2, -3, … as Slurm allows many jobs of one name (sbatch, srun and salloc
    alike). The job under the name it got; a refusal is `what: error: ` + `refused` with the API's message."""
    base = job.name
    for attempt in range(2, 102):
        try:
            answer = c.post("runs", job.spec)
            job.job_id = (answer.get("metadata") or {}).get("job_id") if isinstance(answer, dict) else None
            return job
        except ApiError as e:
            if e.code == "ALREADY_EXISTS" and attempt < 101:
                job = job.renamed(f"{base[:63 - len(str(attempt)) - 1].rstrip('-')}-{attempt}")
                continue
            if e.status is not None:
                raise SbatchError(f"{what}: error: " + refused.format(e.message)) from None
            raise
    raise AssertionError("unreachable")


def delete(c: Client, name: str) -> None:
    import contextlib

    with contextlib.suppress(ApiError):
        c.delete(f"runs/{q(name)}")


def wait_running(c: Client, name: str, what: str) -> dict[str, Any]:
    """Wait until every worker of the run runs (exec needs a Running worker); its view. One line while it waits."""
    said = False
    while True:
        run = c.get(f"runs/{q(name)}") or {}
        status = run.get("status") or {}
        workers = status.get("workers") or []
        if status.get("state") == "Running" and workers and all(w.get("state") == "Running" for w in workers):
            return run
        if status.get("state") in fmt.TERMINAL:
            raise SbatchError(f"{what}: error: job {name} ended ({status.get('state')}: "
                              f"{fmt.terminal_safe(status.get('reason') or '')}) before it started")
        if not said and status.get("state") == "Pending":
            why = fmt.terminal_safe(status.get("reason") or "Pending")
            echo(f"{what}: job {name} queued and waiting for resources ({why})", err=True)
            said = True
        time.sleep(POLL_S)


def _stream(c: Client, worker: str) -> None:
    for chunk in c.stream(f"workers/{q(worker)}/logs", follow=True):
        sys.stdout.write(chunk)
        sys.stdout.flush()


def _command_name(command: list[str]) -> str:
    from pathlib import PurePath

    return PurePath(command[0]).name or "srun"


# --- srun ---------------------------------------------------------------------------------------------------------

def srun(argv: list[str]) -> int:
    argv, idle = take_idle_timeout(list(argv), "srun")
    cmd, command, flags = parse(argv, "srun", {"--pty"})
    if idle and "--pty" not in flags:
        raise SbatchError(f"srun: error: {IDLE} is for an interactive job: add --pty (srun --pty {IDLE}=30 bash), "
                          "or use astra slurm salloc")
    if not command:
        raise SbatchError("srun: error: give a command: astra slurm srun [OPTIONS] CMD [ARGS]")
    if envvars.get("SLURM_JOB_ID"):
        return _srun_in_allocation(envvars.get("SLURM_JOB_ID"), cmd, command, "--pty" in flags)
    if "--pty" in flags:
        return _srun_pty(cmd, command, idle)
    job = build(cmd, shlex.join(command), _command_name(command), "srun")
    with Client.from_env() as c:
        job = submit(c, job, "srun")
        try:
            for note in job.notes:
                echo(note, err=True)
            return _follow(c, job.name, "srun")
        except KeyboardInterrupt:
            echo(f"srun: interrupted: deleting job {job.name}", err=True)
            return 130
        finally:
            delete(c, job.name)  # Ctrl-C cancels it, as Slurm's srun cancels its step; an ended one is done with


def _follow(c: Client, name: str, what: str) -> int:
    """Stream each worker's output as it comes (worker 0 here, the others in threads); the run's exit code."""
    import threading

    said = False
    while True:
        run = c.get(f"runs/{q(name)}") or {}
        status = run.get("status") or {}
        workers = [w["name"] for w in status.get("workers") or [] if w.get("name")]
        if workers or status.get("state") in fmt.TERMINAL:  # a worker's logs with follow wait for its start
            break
        if not said and status.get("state") == "Pending":
            why = fmt.terminal_safe(status.get("reason") or "Pending")
            echo(f"{what}: job {name} queued and waiting for resources ({why})", err=True)
            said = True
        time.sleep(POLL_S)
    others = []
    for w in workers[1:]:
        t = threading.Thread(target=lambda w=w: _stream(Client.from_env(), w), daemon=True)
        t.start()
        others.append(t)
    if workers:
        _stream(c, workers[0])
    for t in others:
        t.join()
    return wait_for_end(c, [name])


def _srun_pty(cmd: CommandLine, command: list[str], idle: int | None = None) -> int:
    """`srun --pty CMD`: a run that holds the allocation, CMD on a terminal inside its first worker; the run is
    deleted when CMD ends."""
    from astraeus.cli import interactive

    job = with_idle_timeout(build(cmd, HOLD, _command_name(command), "srun"), idle)
    with Client.from_env() as c:
        job = submit(c, job, "srun")
        try:
            for note in job.notes:
                echo(note, err=True)
            wait_running(c, job.name, "srun")
            return interactive._session(job.name, 0, command, True)
        finally:
            delete(c, job.name)


def _srun_in_allocation(alloc: str, cmd: CommandLine, command: list[str], pty: bool) -> int:
    """srun inside salloc: CMD in the allocation's workers (each of them, or the first -N), through exec; the
    highest exit code. Only worker 0 reads this terminal's input, as Slurm gives stdin to task 0."""
    from astraeus.cli import interactive

    ignored = sorted(g for s, g in cmd.options.given.items() if s not in ("nodes", "name"))
    if ignored:
        echo(f"srun: note: {', '.join(ignored)} ignored: the step runs in allocation {alloc}'s workers with "
                   "what they hold", err=True)
    if pty:
        return interactive._session(alloc, 0, command, True)
    with Client.from_env() as c:
        run = c.get(f"runs/{q(alloc)}") or {}
    workers = (run.get("status") or {}).get("workers") or []
    n = cmd.options.values.get("nodes", len(workers) or 1)
    if n > max(len(workers), 1):
        raise SbatchError(f"srun: error: -N {n}: allocation {alloc} has {len(workers)} node(s)")
    import threading

    codes = [0] * n
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            codes[i] = interactive._session(alloc, i, command, False, stdin=(i == 0))
        except ApiError as e:
            errors.append(e.message)
            codes[i] = 1

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(1, n)]
    for t in threads:
        t.start()
    one(0)
    for t in threads:
        t.join()
    for e in errors:
        echo(fmt.terminal_safe(f"srun: error: {e}"), err=True)
    return max(codes)


# --- salloc -------------------------------------------------------------------------------------------------------

def salloc(argv: list[str]) -> int:
    import signal
    import subprocess

    argv, idle = take_idle_timeout(list(argv), "salloc")
    cmd, command, _ = parse(argv, "salloc")
    job = with_idle_timeout(build(cmd, HOLD, _command_name(command) if command else "interactive", "salloc"), idle)
    with Client.from_env() as c:
        job = submit(c, job, "salloc")
        try:
            for note in job.notes:
                echo(note, err=True)
            echo(f"salloc: Pending job allocation {job.name}", err=True)
            run = wait_running(c, job.name, "salloc")
            workers = (run.get("status") or {}).get("workers") or []
            machines = sorted({w.get("machine") for w in workers if w.get("machine")})
            echo(f"salloc: Granted job allocation {job.name}", err=True)
            env = envvars.copy(SLURM_JOB_ID=job.name, SLURM_JOBID=job.name,
                                SLURM_JOB_NAME=job.job_name or job.name, SLURM_NNODES=str(len(workers) or 1),
                                SLURM_JOB_NUM_NODES=str(len(workers) or 1), SLURM_JOB_NODELIST=",".join(machines))
            shell = command or [envvars.get("SHELL") or "/bin/sh"]
            # Ctrl-C belongs to the shell inside, not to salloc (as Slurm's salloc ignores it)
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                code = subprocess.call(shell, env=env)
            except OSError as e:
                raise SbatchError(f"salloc: error: cannot run {shell[0]}: {e.strerror or e}") from None
            finally:
                signal.signal(signal.SIGINT, old)
            return 128 - code if code < 0 else code
        finally:
            delete(c, job.name)
            echo(f"salloc: Relinquishing job allocation {job.name}", err=True)


# --- registration -------------------------------------------------------------------------------------------------

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False,
           "help_option_names": []}


def register(app: typer.Typer, guard) -> None:
    """Add srun and salloc to `astra slurm` (`guard`: astra's one-line error handling)."""
    global typer  # the commands' annotations (typer.Context) are read from this module's globals
    import typer

    @app.command("srun", context_settings=CONTEXT, help=SRUN_HELP)
    @guard(prefix="srun: error: ")
    def srun_(ctx: typer.Context) -> None:
        try:
            code = srun(list(ctx.args))
        except HelpRequested:
            sys.stdout.write(SRUN_HELP)
            return
        raise SystemExit(code)

    @app.command("salloc", context_settings=CONTEXT, help=SALLOC_HELP)
    @guard(prefix="salloc: error: ")
    def salloc_(ctx: typer.Context) -> None:
        try:
            code = salloc(list(ctx.args))
        except HelpRequested:
            sys.stdout.write(SALLOC_HELP)
            return
        raise SystemExit(code)
