"""The bodies of `astra`'s most used commands (astraeus run|runs|logs, slurm sbatch|squeue) and the helpers they
share with the rest: importable without typer, so that astraeus.cli.main runs them without loading typer, click
or pydantic. astraeus.cli.astra registers these same functions as typer's commands.

Their parameters keep typer's annotations (Annotated[T, typer.Option(...)]), as strings that only typer reads:
astraeus.cli.astra puts `typer` and `Annotated` in this module's namespace before it registers them (typing and
pathlib are not imported to run a command: they cost its start).
"""

from __future__ import annotations

import functools
import json
import sys
import time

from astraeus import envvars
from astraeus.cli import format as fmt
from astraeus.cli.client import ApiError, Client, q
from astraeus.cli.errors import HelpRequested, SbatchError, ViewError
from astraeus.units import UnitError as SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Annotated, Any, TypeVar

    import typer

    from astraeus.cli.slurm import SbatchJob

    F = TypeVar("F", bound=Callable[..., Any])

# The Slurm translation (astraeus.cli.slurm), the Slurm views and the spec builder are imported by the commands that
# use them: each command line pays only for its own.


def echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    """typer.echo for text: a line (or not, nl=False) on stdout or stderr, flushed."""
    out = sys.stderr if err else sys.stdout
    out.write(message + "\n" if nl else message)
    out.flush()


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def fail(message: str, code: int = 1) -> SystemExit:
    """`message` as one terminal-safe line on stderr (an error may quote what the server holds); the Exit to raise."""
    echo(fmt.terminal_safe(message), err=True)
    return SystemExit(code)


def handle_errors(prefix: str = "error: ") -> Callable[[F], F]:
    """Turn ApiError/SpecError/SbatchError into one line on stderr and exit 1; Ctrl-C into exit 130."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ApiError as e:
                raise fail(f"{prefix}{e.message}", e.exit_code) from None
            except SbatchError as e:
                raise fail(str(e), 1) from None
            except SpecError as e:
                raise fail(f"{prefix}{e}", 1) from None
            except KeyboardInterrupt:
                raise SystemExit(130) from None

        return wrapper  # type: ignore[return-value]

    return deco


def client() -> Client:
    return Client.from_env()


def read_json_file(path: str, what: str = "spec") -> Any:
    """A spec file: JSON, or YAML when it is named .yaml/.yml (stdin, `-`: JSON, else YAML)."""
    try:
        text = sys.stdin.read() if path == "-" else _read_text(path)
    except OSError as e:
        raise SpecError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not a text file: give a JSON or YAML {what}") from None
    is_yaml = path.lower().endswith((".yaml", ".yml"))
    if not is_yaml:
        try:
            return json.loads(text)
        except ValueError as e:
            if path != "-":
                raise SpecError(f"{path} is not valid JSON: {e} (a YAML spec: name it .yaml or .yml)") from None
    import yaml  # only for a YAML spec: it costs a command's start otherwise

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = f" at line {e.problem_mark.line + 1}" if getattr(e, "problem_mark", None) else ""
        shown = "stdin is valid neither as JSON nor as YAML" if path == "-" else f"{path} is not valid YAML"
        raise SpecError(f"{shown}{where}: {getattr(e, 'problem', None) or e}") from None


def print_json(data: Any) -> None:
    echo(json.dumps(data, indent=2))


def check_output(output: str | None) -> bool:
    """`-o json` → True; the table otherwise."""
    if output in (None, "", "table"):
        return False
    if output == "json":
        return True
    raise SpecError(f"-o {output}: use -o json (or leave it out for the table)")


@handle_errors()
def run(
    command: Annotated[list[str] | None, typer.Argument(help="The command and its arguments, after --")] = None,
    name: Annotated[str | None, typer.Option("--name", help="The run's name")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Container image")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs in all")] = None,
    machines: Annotated[int | None, typer.Option("--machines", help="Machines (one worker each)")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", help="CPU cores; per GPU when --gpus is given")] = None,
    mem: Annotated[str | None, typer.Option("--mem", help="Memory, e.g. 16G; per GPU when --gpus is given")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="Time limit, e.g. 20m, 2h, 1d12h")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE, repeatable")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster (default: the workspace's)")] = None,
    start: Annotated[str | None, typer.Option("--start", help="Independent (the default) or Gang")] = None,
    file: Annotated[str | None, typer.Option("-f", "--file", help="Submit a whole spec (a JSON file, or YAML "
                                                                   "named .yaml/.yml; - for stdin)")] = None,
    template: Annotated[str | None, typer.Option("--template", help="A run template (astra astraeus templates "
                                                                    "list): its fields apply where no option here "
                                                                    "gives one")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the spec; submit nothing")] = False,
    what_if: Annotated[bool, typer.Option("--what-if", help="Ask what the run would do now (start where, preempt "
                                                            "whom, start by when, wait behind whom); submit "
                                                            "nothing")] = False,
) -> None:
    """Submit a run: astra astraeus run --name N --image I --gpus G -- CMD ARGS…

    With GPUs, --cpus and --mem are per GPU. There is no priority flag and no drive: put those in a template
    and name it (--template NAME; the image and command may come from it too), or set them in a spec (console or
    API) and submit it with -f spec.json."""
    if file is not None:
        given = [opt for opt, val in (("--name", name), ("--image", image), ("--gpus", gpus),
                                      ("--machines", machines), ("--cpus", cpus), ("--mem", mem),
                                      ("--time", time_limit), ("--env", env), ("--cluster", cluster)) if val]
        if given or command:
            raise SpecError(f"-f submits the spec as it is: leave out {', '.join(given) or 'the command'}, "
                            "or put them in the spec")
        body = read_json_file(file)
        if not isinstance(body, dict):
            raise SpecError(f"{file}: a run spec is a JSON object with metadata and spec")
        if template:
            if not isinstance(body.get("spec", {}), dict):
                raise SpecError(f"{file}: spec must be a JSON object")
            body["spec"] = {"template": template, **body.get("spec", {})}
    elif template:
        body = template_run_body(template, name=name or "", command=list(command or []), image=image, gpus=gpus,
                                 machines=machines, cpus=cpus, mem=mem, time=time_limit, env=env, cluster=cluster,
                                 start=start)
    else:
        from astraeus.cli.spec import build_run_spec

        body = build_run_spec(name=name or "", command=list(command or []), image=image, gpus=gpus,
                              machines=machines, cpus=cpus, mem=mem, time=time_limit, env=env, cluster=cluster,
                              start=start or "Independent")
    if dry_run:
        print_json(body)
        return
    with client() as c:
        if what_if:
            echo(fmt.what_if(c.post("runs", body, dry_run=True)), nl=False)
            return
        created = c.post("runs", body)
    echo(submitted_line(created, body))


def template_run_body(template: str, *, name: str, command: list[str], image: str | None, gpus: int | None,
                      machines: int | None, cpus: float | None, mem: str | None, time: str | None,
                      env: list[str] | None, cluster: str | None, start: str | None) -> dict[str, Any]:
    """The body of `astra astraeus run --template T`: only what the options give, so that the template's fields
    apply everywhere else (the server merges them; env by name). Options mean what they mean without a
    template."""
    from astraeus.cli.spec import build_run_spec

    full = build_run_spec(name=name, command=command or ["-"], image=image or "-", gpus=gpus, machines=machines,
                          cpus=cpus, mem=mem, time=time, env=env, cluster=cluster, start=start or "Independent")
    tt = full["spec"]["task_template"]
    given = {"image": image, "command": command, "args": command, "env": env, "time_limit_seconds": time}
    task = {k: v for k, v in tt.items() if given.get(k)}  # a command given brings its arguments, even none
    resources = {k: v for k, v in tt["requested_resources"].items() if k != "node_selection"}
    if resources:
        task["requested_resources"] = resources
    spec: dict[str, Any] = {"template": template}
    if start:
        spec["start"] = start
    if cluster:
        spec["cluster"] = cluster
    spec["task_template"] = task
    return {"metadata": {"name": name}, "spec": spec}


def submitted_line(created: Any, body: dict[str, Any]) -> str:
    created = created if isinstance(created, dict) else {}
    meta = created.get("metadata") or {}
    name = meta.get("name") or (body.get("metadata") or {}).get("name", "")
    cluster = meta.get("cluster") or (created.get("spec") or {}).get("cluster") or (body.get("spec") or {}).get(
        "cluster")
    url = (created.get("status") or {}).get("console_url")
    line = f"{name} submitted"
    if cluster:
        line += f" to {cluster}"
    if url:
        line += f": {url}"
    return fmt.terminal_safe(line)


RUNS_SHOWN = 100  # what `astra astraeus runs` shows without --limit: the API's default page


def list_client() -> Client:
    """As client(): the client sets up TLS only for an https:// replica it connects to."""
    return client()


@handle_errors()
def runs(
    output: Annotated[str | None, typer.Option("-o", "--output", help="wide (with PRIORITY, GPUS, USER, AGE), "
                                                                      "json or yaml (the API's)")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C")] = False,
    state: Annotated[str | None, typer.Option("--state", help="Only runs in this state: Pending, Starting, Running, "
                                                              "Stopping, Completed, Failed or Cancelled")] = None,
    label: Annotated[list[str] | None, typer.Option(
        "-l", "--label", help="Only runs with this label, key=value (repeat it, or separate with commas: all must "
                              "match)")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show at most this many, newest first")] = RUNS_SHOWN,
    every: Annotated[bool, typer.Option("--all", help="Every run (follows the pages to the last)")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch")] = 2.0,
) -> None:
    """List runs, newest first: NAME, CLUSTER, STATE, REASON (the newest 100 unless --limit or --all)."""
    if output not in (None, "", "table", "wide", "json", "yaml"):
        raise SpecError(f"-o {output}: use -o wide, -o json or -o yaml (or leave it out for the table)")
    if watch and output in ("json", "yaml"):
        raise SpecError(f"--watch shows the table; leave out -o {output}")
    as_json = output == "json"
    if state is not None:
        known = {s.lower(): s for s in fmt.RUN_STATES}
        if state.lower() not in known:
            raise SpecError(f"--state {state}: use one of {', '.join(fmt.RUN_STATES)}")
        state = known[state.lower()]
    table = fmt.runs_wide_table if output == "wide" else fmt.runs_table
    with list_client() as c:
        if not watch:
            items, more = newest_runs(c, None if every else limit, state, label)
            if as_json:
                print_json({"items": items})
            elif output == "yaml":
                echo(fmt.to_yaml({"items": items}), nl=False)
            else:
                echo(table(items), nl=False)
            if more:
                shown = " ".join(["astra astraeus runs", *(["--state", state] if state else []),
                                  *(f"-l {x}" for x in label or [])])
                bigger = f"{shown} --limit {max(1000, limit * 10)}, or " if limit < 1000 else ""
                echo(f"… more runs than these {len(items)}: {bigger}{shown} --all", err=True)
            return
        watch_table(lambda: table(newest_runs(c, None if every else limit, state, label)[0]), interval)


def newest_runs(c: Client, limit: int | None, state: str | None = None, label: list[str] | None = None
                ) -> tuple[list[dict[str, Any]], bool]:
    """The newest `limit` runs (None: all), in pages of at most 1000, and whether there are more."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        want = 1000 if limit is None else min(1000, limit - len(items))
        page = c.get("runs", state=state, label=label or None, limit=want, cursor=cursor)
        items += _items(page)
        cursor = page.get("next_cursor") if isinstance(page, dict) else None
        if not cursor:
            return items, False
        if limit is not None and len(items) >= limit:
            return items, True


def watch_table(render: Callable[[], str], interval: float) -> None:
    """Redraw `render()` in place on a terminal (a new copy when it changes otherwise) until Ctrl-C."""
    try:
        _watch(render, interval)
    except KeyboardInterrupt:
        return


def _watch(render: Callable[[], str], interval: float) -> None:
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console()
        # Text, not markup: the table (already terminal-safe) is shown as it is, a `[bold]` in a reason included.
        with Live(Text(render(), no_wrap=True, overflow="ellipsis"), console=console, auto_refresh=False,
                  transient=False) as live:
            while True:
                time.sleep(interval)
                live.update(Text(render(), no_wrap=True, overflow="ellipsis"), refresh=True)
    last = None
    while True:
        text = render()
        if text != last:
            if last is not None:
                echo("")
            echo(text, nl=False)
            sys.stdout.flush()
            last = text
        time.sleep(interval)


def every_page(c: Client, path: str) -> list[dict[str, Any]]:
    """Every item of a paginated list (`limit` + `cursor`, the API's `next_cursor`)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = c.get(f"{path}?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        items += _items(page)
        cursor = page.get("next_cursor") if isinstance(page, dict) else None
        if not cursor:
            return items


def _items(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, dict):
        return list(data.get("items") or [])
    if isinstance(data, list):
        return data
    return []


@handle_errors()
def logs(
    worker: Annotated[str, typer.Argument(help="The worker, e.g. finetune-r50-0 (a one-worker run's name works too)")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Stream lines as they arrive")] = False,
    tail: Annotated[int | None, typer.Option("--tail", help="Only the last N lines")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="Prefix each line with its time")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Write the output exactly as the worker wrote it, escape sequences "
                                                    "and all, also to a terminal (to a pipe or a file it always "
                                                    "is)")] = False,
) -> None:
    """Print a worker's output, as it wrote it. On a terminal, control characters (escape sequences, carriage
    returns, bidi overrides) are shown escaped (`\\x1b`) unless --raw; to a pipe or a file the bytes are kept."""
    if tail is not None and tail < 0:
        raise SpecError(f"--tail {tail}: give 0 or more")
    exact = raw or not sys.stdout.isatty()

    def show(text: str) -> str:
        return text if exact else fmt.terminal_safe(text, lines=True)

    with client() as c:
        name, view = _worker_for_logs(c, worker, follow)
        if name is None:
            return
        # A worker never started yet has no output: say so on stderr (stdout stays the worker's alone).
        waiting = view.get("state") == "Pending" and not view.get("started_at")
        why = fmt.terminal_safe(view.get("reason") or "Pending")
        path = f"workers/{q(name)}/logs"
        if follow:
            if waiting:
                echo(f"{name} has not started yet ({why}): waiting for it to start…", err=True)
            for chunk in c.stream(path, tail=tail, follow=True, timestamps=timestamps):
                sys.stdout.write(show(chunk))
                sys.stdout.flush()
        else:
            text = c.get(path, tail=tail, timestamps=timestamps)
            if text:
                text = text if isinstance(text, str) else json.dumps(text)
                sys.stdout.write(show(text if text.endswith("\n") else text + "\n"))
            elif waiting:
                echo(f"{name} has not started yet ({why}): no output yet; astra astraeus logs -f {worker} "
                           "waits for it", err=True)


def _may_be_worker(name: str) -> bool:
    """Could `name` be a worker's? Workers are named RUN-INDEX; any other name can only be a run's."""
    base, dash, index = name.rpartition("-")
    return bool(base and dash and index.isdigit())


def _worker_for_logs(c: Client, name: str, follow: bool) -> tuple[str | None, dict[str, Any]]:
    """The worker `name` stands for (as resolve_worker) and its view; a run with no worker yet: (None, {}) after
    saying so, or with `follow` once a worker appears. A name that cannot be a worker's asks only for the run."""
    if _may_be_worker(name):
        try:
            view = c.get(f"workers/{q(name)}")
            return name, view if isinstance(view, dict) else {}
        except ApiError as e:
            if e.status != 404:
                raise
    said = False
    while True:
        try:
            run_obj = c.get(f"runs/{q(name)}")
        except ApiError as e:
            if e.status == 404:
                resolve_worker(c, name)  # its error: no such worker or run
            raise
        status = (run_obj or {}).get("status") or {}
        if status.get("workers"):
            workers = [w for w in status["workers"] if isinstance(w, dict)]
            if len(workers) == 1:  # a run's name stands for its only worker, as resolve_worker has it
                return workers[0].get("name"), workers[0]
            return resolve_worker(c, name), {}  # its error names the workers
        why = fmt.terminal_safe(status.get("reason") or status.get("state") or "Pending")
        if status.get("state") in fmt.TERMINAL:
            raise ApiError(f"{name} ended ({status.get('state')}) without starting a worker: no output")
        if not follow:
            echo(f"{name} has not started yet ({why}): no output yet; astra astraeus logs -f {name} waits for "
                       "it", err=True)
            return None, {}
        if not said:
            echo(f"{name} has not started yet ({why}): waiting for it to start…", err=True)
            said = True
        time.sleep(1)


def resolve_worker(c: Client, name: str) -> str:
    """A worker's name; a run's name stands for its only worker."""
    try:
        c.get(f"workers/{q(name)}")
        return name
    except ApiError as e:
        if e.status != 404:
            raise
        try:
            run_obj = c.get(f"runs/{q(name)}")
        except ApiError:
            raise e from None
        workers = [w.get("name") for w in ((run_obj or {}).get("status") or {}).get("workers") or []]
        if len(workers) == 1:
            return workers[0]
        raise ApiError(f"{name} is a run; name one of its workers: {', '.join(workers) or '(none yet)'}") from None


SBATCH_HELP = """Submit a batch script: astra slurm sbatch [OPTIONS] SCRIPT [ARGS]…

Options (also read from the script's #SBATCH lines; the command line wins):
  -J, --job-name=NAME        the run's name (default: the script's file name without its extension)
  -p, --partition=POOL[,POOL…]  the pools the job may run in (astra astraeus pools)
  -M, --clusters=CLUSTER     the cluster (default: the workspace's)
  -C, --constraint=FEATURES  machine labels the job needs, joined by &: KEY=VALUE, or a bare FEATURE for the
                             label FEATURE=true (e.g. --constraint=gpu=a100&ib)
  --reservation=NAME         run in this reservation of your workspace (astra astraeus reservations); it waits
                             for the reservation's start
  --nice[=N]                 priority -N (default 100)
  --gres=gpu:[TYPE:]N, --gpus-per-node=[TYPE:]N   GPUs per node;  -G, --gpus=[TYPE:]N   GPUs in all
                             (TYPE: a word of the machines' GPU model, e.g. a100, matched case-insensitively)
  -N, --nodes=N              machines (the script runs on each)
  -c, --cpus-per-task=N      CPU cores per node;  --cpus-per-gpu=N
  --mem=SIZE                 memory per node (16G, 500M, 1T; a plain number is MB);  --mem-per-cpu, --mem-per-gpu
  -t, --time=TIME            MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
  --container-image=IMAGE    the container image
  --template=NAME            a run template (astra astraeus templates): its drives, env, priority, image,
                             resources and restart policy apply where no option here gives one
  -a, --array=INDICES        one run per index, named JOB_INDEX: 0-99, 1,3,5-7, 0-15:4; %N: at most N at once
                             (each gets SLURM_ARRAY_TASK_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_COUNT, …)
  -d, --dependency=TYPE:JOB[:JOB…]  afterok, afterany, afternotok, or singleton: wait for those runs (a job
                             array's name: all its runs); fails when it can no longer be met
  -o, --output / -e, --error / --open-mode   noted: Astraeus keeps each worker's output (astra astraeus logs)
  --ntasks-per-node=N, -n/--ntasks=N, --ntasks-per-gpu=N   tasks (SLURM_NTASKS); the script runs once per node
  --gpus-per-task=[TYPE:]N   GPUs per task: times the tasks per node, GPUs per node
  --exclusive                with GPUs: the node's GPUs, as many as asked per node
  -D, --chdir=DIR            the folder the script starts in
  -A/--account, -q/--qos, --signal, --no-requeue, --mail-type, --mail-user, --hint, --gpu-bind, -L, --comment,
  --exclude, …               accepted with a note saying what Astraeus does instead
  (the image: the workspace's default_image where the script names none; long options may be abbreviated)
  --wrap=COMMAND             a one-line script
  --test-only                when and where the job would start now, as Slurm says it; submit nothing
  --dry-run                  print the run spec; submit nothing (astra's own)
  -W, --wait                 wait for the job (each run of an array) to end; exit with its exit code
  --parsable                 print only the job's name
Other options are refused by name.
"""


@handle_errors(prefix="sbatch: error: ")
def sbatch(ctx: typer.Context) -> None:
    from astraeus.cli.slurm import build_job, parse_command_line

    try:
        cmd = parse_command_line(list(ctx.args))
    except HelpRequested:
        echo(SBATCH_HELP, nl=False)
        return
    wrap = cmd.options.values.get("wrap")
    if wrap is not None:
        if cmd.script is not None:
            raise SbatchError("sbatch: error: give either --wrap or a script, not both")
        text, label = "", "--wrap"
    elif cmd.script is None or cmd.script == "-":
        if sys.stdin.isatty():
            raise SbatchError("sbatch: error: give a batch script: astra slurm sbatch [OPTIONS] SCRIPT [ARGS]")
        text, label = sys.stdin.read(), "stdin"
    else:
        try:
            text = _read_text(cmd.script)
        except OSError as e:
            raise SbatchError(f"sbatch: error: Unable to open file {cmd.script}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise SbatchError(f"sbatch: error: {cmd.script} is not a text file") from None
        label = cmd.script
    try:
        job = build_job(cmd, text, label)
    except SbatchError as e:
        # A script that names no image runs with the workspace's default image on its cluster, where a site set one
        from astraeus.cli.slurm_interactive import default_image

        image = default_image(cmd.options.values.get("cluster")) if "no container image" in str(e) else None
        if image is None:
            raise
        job = build_job(cmd, text, label, default_image=True)
        job.spec["spec"]["task_template"]["image"] = image
    if job.dry_run:
        print_json(job.spec if job.array is None else job.bodies())
        for note in job.notes:
            echo(note, err=True)
        return
    if job.test_only:
        _test_only(job)
        return
    with client() as c:
        resolve_dependency(c, job.spec)  # afterok:42, a numeric job id: the run's name
        if job.array is not None:
            _submit_array(c, job, cmd.options.values)
            return
        from astraeus.cli import slurm_interactive

        try:  # a resubmitted script gets NAME-2, …
            job = slurm_interactive.submit(c, job, "sbatch", "Batch job submission failed: {}")
        except SbatchError as e:
            raise SbatchError(_hint(str(e))) from None
    name = job.name
    from astraeus.cli import slurm_interactive  # the line (or --parsable's name), the notes; --wait

    slurm_interactive.submitted(name, job.notes, cmd.options.values, job_id=job.job_id)


def _hint(message: str) -> str:
    """A partition that is no pool: scripts written before pools named the cluster with -p."""
    if "node_selection.pools: no pool named" in message:
        return message + " (-p/--partition names pools: astra astraeus pools; give a cluster with -M/--clusters=NAME)"
    return message


def _test_only(job: SbatchJob) -> None:
    """`sbatch --test-only`: what the job would do now (POST $API/runs?dry_run=true), as Slurm prints it; exit 1
    when it would not start. A job array: its first run."""
    with client() as c:
        resolve_dependency(c, job.spec)
        body = job.bodies()[0]
        name = body["metadata"]["name"]
        try:
            answer = c.post("runs", body, dry_run=True)
        except ApiError as e:
            if e.status is not None:
                raise SbatchError(f"sbatch: error: Batch job submission failed: {_hint(e.message)}") from None
            raise
    line, starts = fmt.sbatch_test_only(answer if isinstance(answer, dict) else {}, name, job.processors,
                                        job.partition)
    echo(line, err=True)  # Slurm writes it to stderr too
    if not starts:
        raise SystemExit(1)


def _submit_array(c: Client, job: SbatchJob, values: dict[str, Any] | None = None) -> None:
    """One run per index of the job array (POST /runs each, with spec.array); on a refusal, the runs of the array
    already submitted are deleted again, so that an array is submitted whole or not at all. A resubmitted array
    (its first run's name taken) gets a new name, NAME-2, NAME-3, … as a single job does."""
    done: list[str] = []
    base, attempt = job.name, 1
    bodies = job.bodies()
    while len(done) < len(bodies):
        body = bodies[len(done)]
        name = body["metadata"]["name"]
        try:
            c.post("runs", body)
        except (ApiError, KeyboardInterrupt) as e:
            if isinstance(e, ApiError) and e.code == "ALREADY_EXISTS" and not done and attempt < 100:
                attempt += 1
                job = job.renamed(f"{base[:63 - len(str(attempt)) - 1].rstrip('-')}-{attempt}")
                bodies = job.bodies()
                continue
            for n in done:
                try:
                    c.delete(f"runs/{q(n)}")
                except ApiError:
                    pass
            undone = f"; the {len(done)} run(s) of the array already submitted were deleted" if done else ""
            if isinstance(e, ApiError) and e.status is not None:
                raise SbatchError(f"sbatch: error: Batch job submission failed: {_hint(e.message)} ({name}{undone})") from None
            raise
        done.append(name)
    assert job.array is not None
    from astraeus.cli import slurm_interactive

    at_once = f", at most {job.array.max_running} at once" if job.array.max_running else ""
    said = (f"sbatch: note: job array {job.name}: {len(done)} runs {job.name}_[{job.array.shown()}]{at_once}; "
            f"astra slurm squeue -j {job.name} shows them, astra slurm scancel {job.name} cancels them")
    slurm_interactive.submitted(job.name, [said, *job.notes], values or {}, runs=done)  # --wait: all of them


def _array_of(run: dict) -> tuple[str | None, int | None]:
    a = (run.get("spec") or {}).get("array") or {}
    return a.get("job"), a.get("index")


def _matching(items: list[dict], jobs: list[str], command: str) -> list[tuple[str, list[dict]]]:
    """For each job given (a numeric job id, a run, a job array's name, or `JOB_[0-9]`): the runs it stands for
    (digits: the run of that job id, else the run of that name: slurm_views' rule)."""
    from astraeus.cli import slurm_views as sv
    from astraeus.cli.slurm import job_matcher

    out = []
    for job in jobs:
        by_id = sv.runs_with_job_id(items, job)
        if by_id:
            out.append((job, by_id))
            continue
        test = job_matcher(sv.array_task_job(items, job), command)  # `ID_N`: the array's task by its job id
        out.append((job, [r for r in items if test((r.get("metadata") or {}).get("name"), *_array_of(r))]))
    return out


def run_named(c: Client, job: str) -> str:
    """The name of the run a JOB stands for: a numeric job id (GET runs?job_id=N, the workspace's runs only)
    where a run has it, else JOB itself, a run's name (slurm_views' rule)."""
    from astraeus.cli import slurm_views as sv

    if sv.is_job_id(job):
        found = _items(c.get("runs", job_id=job, limit=1))
        if found:
            return str((found[0].get("metadata") or {}).get("name") or job)
    jid = sv.array_task_id(job)
    if jid is not None:  # `ID_N`: task N of the array whose job id ID is
        return sv.array_task_job(_items(c.get("runs", job_id=jid, limit=1)), job)
    return job


def resolve_dependency(c: Client, spec: dict[str, Any]) -> None:
    """`--dependency=afterok:42`: each numeric job id in the run spec's dependency becomes the run's name."""
    dep = (spec.get("spec") or {}).get("dependency")
    if not isinstance(dep, dict) or not dep.get("runs"):
        return  # no dependency: the Slurm views' import is not paid
    from astraeus.cli import slurm_views as sv

    if any(sv.is_job_id(str(j)) for j in dep.get("runs") or []):
        dep["runs"] = list(dict.fromkeys(run_named(c, str(j)) for j in dep["runs"]))


VIEW_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}  # an unknown option: exit 1, Slurm's


def _no_extra(ctx: typer.Context, command: str) -> None:
    """Slurm's refusal of an option it does not know (exit 1, where click's would be 2)."""
    if ctx.args:
        raise ViewError(f"{command}: error: unrecognized option or argument {ctx.args[0]!r} (astra slurm {command} "
                        "--help lists the options)")


def _view_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ViewError as e:
            raise fail(str(e), 1) from None

    return wrapper  # type: ignore[return-value]


@handle_errors(prefix="squeue: error: ")
@_view_errors
def squeue(
    ctx: typer.Context,
    name: Annotated[list[str] | None, typer.Option("-j", "--jobs", "-n", "--name", help="Only these jobs")] = None,
    states: Annotated[str | None, typer.Option("-t", "--states", help="Only these states, e.g. PD,R or "
                                                                      "pending,running (all: every state)")] = None,
    users: Annotated[str | None, typer.Option("-u", "--user", help="Only these users (workspaces), comma-separated")]
    = None,
    me: Annotated[bool, typer.Option("--me", help="Only your own jobs (your workspace's)")] = False,
) -> None:
    """Runs in Slurm's squeue layout: JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON). USER is the
    workspace; an ended job is shown for ASTRAEUS_SQUEUE_MIN_JOB_AGE seconds (300) after it ended, as Slurm's
    MinJobAge (one named with -j: always)."""
    from datetime import UTC, datetime

    from astraeus.cli import slurm_views as sv
    from astraeus.cli.slurm import split_jobs

    _no_extra(ctx, "squeue")
    min_age = envvars.SQUEUE_MIN_JOB_AGE
    if envvars.get("ASTRAEUS_SQUEUE_MIN_JOB_AGE") is not None:  # checked by the settings' model (pydantic: slower)
        from astraeus.settings import CliSettings, SettingsError

        try:
            min_age = CliSettings.load().squeue_min_job_age
        except SettingsError as e:
            raise sv.ViewError(f"squeue: error: {e}") from None
    wanted_states = sv.state_codes(states) if states else None
    wanted_users = {u.strip() for u in (users or "").split(",") if u.strip()} or None
    with client() as c:
        if me:
            mine = (c.get("") or {}).get("name")
            wanted_users = (wanted_users or set()) | {mine}
        items = every_page(c, "runs")  # every run: the API answers a page at a time
    wanted = [n for arg in name or [] for n in split_jobs(arg) if n]
    if wanted:
        keep = {id(r) for _, runs in _matching(items, wanted, "squeue") for r in runs}
        items = [r for r in items if id(r) in keep]
    # a job named with -j is shown however long ago it ended (astra's own: Slurm forgets it after MinJobAge)
    items = sv.squeue_keep(items, datetime.now(UTC), float("inf") if wanted else min_age, wanted_states, wanted_users)
    echo(fmt.squeue_table(items), nl=False)
