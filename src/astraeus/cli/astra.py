"""`astra`: the command line for Astraeus.

    astra login --api URL --token TOKEN
    astra astraeus run|runs|logs|describe|delete|events|drives|machines|pools|reservations …
    astra slurm sbatch|squeue|scancel|sinfo|sacct|scontrol …

Every failure is one line on stderr and a non-zero exit; set ASTRA_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from astraeus import envvars
from astraeus.cli import format as fmt
from astraeus.cli import slurm_views as sv
from astraeus.cli.client import ApiError, Client, Config, q, save_config
from astraeus.cli.slurm import (
    HelpRequested,
    SbatchError,
    SbatchJob,
    build_job,
    job_matcher,
    parse_command_line,
    split_jobs,
)
from astraeus.cli.spec import SpecError, build_run_spec


class _App(typer.Typer):
    """Typer, but an unexpected exception is one line too (ASTRA_DEBUG=1 shows the traceback)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            # The most used commands skip click's parsing (and the pydantic it brings): astraeus.cli.fastargs.
            if self is app and not args and not kwargs and not envvars.get("ASTRA_NO_FASTARGS"):
                from astraeus.cli import fastargs

                try:
                    if fastargs.run(self, sys.argv[1:]):
                        return None
                except typer.Exit as e:
                    sys.exit(e.exit_code)
            return super().__call__(*args, **kwargs)
        except SystemExit:
            raise
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - the last line of defence against tracebacks
            if envvars.get("ASTRA_DEBUG"):
                raise
            typer.echo(fmt.terminal_safe(f"error: {type(e).__name__}: {e} (set ASTRA_DEBUG=1 for details)"), err=True)
            sys.exit(1)


def _app(**kw: Any) -> typer.Typer:
    return _App(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, **kw)


# The root alone offers --install-completion/--show-completion (bash, zsh, fish, PowerShell).
app = _App(no_args_is_help=True, pretty_exceptions_enable=False,
           help="The Astraeus command line: runs, logs, drives and machines, and Slurm-style batch jobs.")
astraeus_app = _app(help="Runs, workers' logs, events, drives and machines of your workspace.")
drives_app = _app(help="Drives: storage that workers mount.")
registries_app = _app(help="Image registry credentials of your workspace (used to pull its runs' images).")
templates_app = _app(help="Run templates: any part of a run's spec under a name (drives, env, priority, image…); "
                          "a run names one with --template.")
schedules_app = _app(help="Schedules: a cron line and a run to make at each tick (one run <name>-<YYYYMMDDHHMM> "
                          "per tick).")
groups_app = _app(help="Replica groups: keep N runs of one spec alive (evaluation workers, inference servers); "
                       "an ended or deleted replica is replaced.")
slurm_app = _app(help="Slurm-style commands over Astraeus: sbatch, squeue, scancel, sinfo, sacct, scontrol.")
pools_app = _App(pretty_exceptions_enable=False, add_completion=False, invoke_without_command=True,
                 help="Pools: named groups of a cluster's machines. Without a command: the pools your workspace may "
                      "use. create/delete: organisation admins (ASTRAEUS_ADMIN_TOKEN, or an admin's token).")
reservations_app = _App(pretty_exceptions_enable=False, add_completion=False, invoke_without_command=True,
                        help="Reservations: machines kept for workspaces from a start to an end. Without a command: "
                             "your workspace's. create/delete/list --all: organisation admins "
                             "(ASTRAEUS_ADMIN_TOKEN, or an admin's token).")
app.add_typer(astraeus_app, name="astraeus")
app.add_typer(slurm_app, name="slurm")
astraeus_app.add_typer(drives_app, name="drives")
astraeus_app.add_typer(registries_app, name="registries")
astraeus_app.add_typer(templates_app, name="templates")
astraeus_app.add_typer(groups_app, name="replica-groups")
astraeus_app.add_typer(schedules_app, name="schedules")
astraeus_app.add_typer(pools_app, name="pools")
astraeus_app.add_typer(reservations_app, name="reservations")



def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            shown = version("astraeus")
        except PackageNotFoundError:  # run from a source tree that was never installed
            shown = "unknown (not installed)"
        typer.echo(f"astra {shown}")
        raise typer.Exit()


@app.callback()
def _root(
    _show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print astra's version and exit")] = False,
) -> None:
    """The Astraeus command line: runs, logs, drives and machines, and Slurm-style batch jobs."""


F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> typer.Exit:
    """`message` as one terminal-safe line on stderr (an error may quote what the server holds); the Exit to raise."""
    typer.echo(fmt.terminal_safe(message), err=True)
    return typer.Exit(code)


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
                raise typer.Exit(130) from None

        return wrapper  # type: ignore[return-value]

    return deco


def client() -> Client:
    return Client.from_env()


from astraeus.cli import interactive  # noqa: E402  exec, shell and port-forward into a running worker

interactive.register(astraeus_app, handle_errors)


def org_client() -> Client:
    """$ORG_API (the workspace API URL without /w/WS) with ASTRAEUS_ADMIN_TOKEN, or the token in use."""
    return Client.org_from_env()


def read_json_file(path: str, what: str = "spec") -> Any:
    """A spec file: JSON, or YAML when it is named .yaml/.yml (stdin, `-`: JSON, else YAML)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
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
    typer.echo(json.dumps(data, indent=2))


def check_output(output: str | None) -> bool:
    """`-o json` → True; the table otherwise."""
    if output in (None, "", "table"):
        return False
    if output == "json":
        return True
    raise SpecError(f"-o {output}: use -o json (or leave it out for the table)")


# --- login -------------------------------------------------------------------------------------------------------


@app.command()
@handle_errors()
def login(
    api: Annotated[str, typer.Option("--api", help="The workspace API URL ($API), http://HOST:PORT/api/v1/o/ORG/w/WS; "
                                                   "several control plane replicas: their URLs comma-separated")],
    token: Annotated[str, typer.Option("--token", help="An API token", prompt=True, hide_input=True)],
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check the URL and token first")] = True,
) -> None:
    """Save the API URL and token (in $ASTRAEUS_CONFIG or ~/.config/astraeus/config.json).

    ASTRAEUS_API and ASTRAEUS_TOKEN in the environment win over the saved ones."""
    config = Config(api=api.rstrip("/"), token=token)
    who = ""
    if verify:
        with Client(config) as c:
            ws = c.get("")
        if isinstance(ws, dict) and ws.get("name"):
            who = f" to workspace {ws['name']}" + (f" ({ws['org']})" if ws.get("org") else "")
            if ws.get("role"):
                who += f" as {ws['role']}"
    path = save_config(config.api, config.token)
    typer.echo(f"Logged in{fmt.terminal_safe(who)} at {config.api}; saved to {path}")
    for var in ("ASTRAEUS_API", "ASTRAEUS_TOKEN"):
        if envvars.get(var):
            typer.echo(f"note: {var} is set in the environment and wins over the saved value", err=True)


COMPLETION_SHELLS = ("bash", "zsh", "fish")


@app.command()
@handle_errors()
def completion(shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish")]) -> None:
    """Print the shell completion script: eval "$(astra completion bash)" in ~/.bashrc; zsh: the same in
    ~/.zshrc; fish: astra completion fish > ~/.config/fish/completions/astra.fish."""
    if shell not in COMPLETION_SHELLS:
        raise SpecError(f"completion {shell}: give one of {', '.join(COMPLETION_SHELLS)}")
    from typer._completion_shared import get_completion_script

    typer.echo(get_completion_script(prog_name="astra", complete_var="_ASTRA_COMPLETE", shell=shell))


# --- astra astraeus ------------------------------------------------------------------------------------------------


@astraeus_app.command(context_settings={"allow_interspersed_args": False})
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
        body = build_run_spec(name=name or "", command=list(command or []), image=image, gpus=gpus,
                              machines=machines, cpus=cpus, mem=mem, time=time_limit, env=env, cluster=cluster,
                              start=start or "Independent")
    if dry_run:
        print_json(body)
        return
    with client() as c:
        if what_if:
            typer.echo(fmt.what_if(c.post("runs", body, dry_run=True)), nl=False)
            return
        created = c.post("runs", body)
    typer.echo(submitted_line(created, body))


def template_run_body(template: str, *, name: str, command: list[str], image: str | None, gpus: int | None,
                      machines: int | None, cpus: float | None, mem: str | None, time: str | None,
                      env: list[str] | None, cluster: str | None, start: str | None) -> dict[str, Any]:
    """The body of `astra astraeus run --template T`: only what the options give, so that the template's fields
    apply everywhere else (the server merges them; env by name). Options mean what they mean without a
    template."""
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


@astraeus_app.command()
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
                typer.echo(fmt.to_yaml({"items": items}), nl=False)
            else:
                typer.echo(table(items), nl=False)
            if more:
                shown = " ".join(["astra astraeus runs", *(["--state", state] if state else []),
                                  *(f"-l {x}" for x in label or [])])
                bigger = f"{shown} --limit {max(1000, limit * 10)}, or " if limit < 1000 else ""
                typer.echo(f"… more runs than these {len(items)}: {bigger}{shown} --all", err=True)
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
                typer.echo("")
            typer.echo(text, nl=False)
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


@astraeus_app.command()
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
                typer.echo(f"{name} has not started yet ({why}): waiting for it to start…", err=True)
            for chunk in c.stream(path, tail=tail, follow=True, timestamps=timestamps):
                sys.stdout.write(show(chunk))
                sys.stdout.flush()
        else:
            text = c.get(path, tail=tail, timestamps=timestamps)
            if text:
                text = text if isinstance(text, str) else json.dumps(text)
                sys.stdout.write(show(text if text.endswith("\n") else text + "\n"))
            elif waiting:
                typer.echo(f"{name} has not started yet ({why}): no output yet; astra astraeus logs -f {worker} "
                           "waits for it", err=True)


def _worker_for_logs(c: Client, name: str, follow: bool) -> tuple[str | None, dict[str, Any]]:
    """The worker `name` stands for (as resolve_worker) and its view; a run with no worker yet: (None, {}) after
    saying so, or with `follow` once a worker appears."""
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
            wname = resolve_worker(c, name)
            return wname, next((w for w in status["workers"] if w.get("name") == wname), {})
        why = fmt.terminal_safe(status.get("reason") or status.get("state") or "Pending")
        if status.get("state") in fmt.TERMINAL:
            raise ApiError(f"{name} ended ({status.get('state')}) without starting a worker: no output")
        if not follow:
            typer.echo(f"{name} has not started yet ({why}): no output yet; astra astraeus logs -f {name} waits for "
                       "it", err=True)
            return None, {}
        if not said:
            typer.echo(f"{name} has not started yet ({why}): waiting for it to start…", err=True)
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


@astraeus_app.command()
@handle_errors()
def describe(run_name: Annotated[str, typer.Argument(metavar="RUN", help="The run's name")]) -> None:
    """A run: its spec, workers, history, and why a waiting worker is not running yet."""
    with client() as c:
        data = c.get(f"runs/{q(run_name)}")
    typer.echo(fmt.describe_run(data), nl=False)


@astraeus_app.command()
@handle_errors()
def delete(run_names: Annotated[list[str], typer.Argument(metavar="RUN...", help="Runs to delete")]) -> None:
    """Stop a run's workers (SIGTERM, stop grace, SIGKILL) and remove it."""
    with client() as c:
        for name in run_names:
            c.delete(f"runs/{q(name)}")
            typer.echo(f"{name} deleted")


@astraeus_app.command()
@handle_errors()
def events(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """The workspace's events, newest first (the newest 200)."""
    as_json = check_output(output)
    with client() as c:
        data = c.get("events?limit=200")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.events_table(_items(data)), nl=False)


@astraeus_app.command()
@handle_errors()
def machines(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """Machines with their GPUs used and free."""
    as_json = check_output(output)
    with list_client() as c:
        data = {"items": every_page(c, "machines")}
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.machines_table(_items(data)), nl=False)


@drives_app.command("create")
@handle_errors()
def drives_create(
    file: Annotated[str, typer.Option("-f", "--file", help="The drive's JSON (e.g. drive.json; - for stdin)")],
) -> None:
    """Create a drive from a JSON file."""
    body = read_json_file(file, "drive")
    with client() as c:
        created = c.post("drives", body)
    name = ((created if isinstance(created, dict) else {}).get("metadata") or {}).get("name") or (
        (body.get("metadata") or {}).get("name") if isinstance(body, dict) else "")
    typer.echo(fmt.terminal_safe(f"{name} created"))


@drives_app.command("list")
@handle_errors()
def drives_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """List drives."""
    as_json = check_output(output)
    with client() as c:
        data = {"items": every_page(c, "drives")}
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.drives_table(_items(data)), nl=False)


@drives_app.command("delete")
@handle_errors()
def drives_delete(names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Drives to delete")]) -> None:
    """Remove drives; their files stay where they are."""
    with client() as c:
        for name in names:
            c.delete(f"drives/{q(name)}")
            typer.echo(f"{name} deleted")


@templates_app.command("list")
@handle_errors()
def templates_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """List the workspace's run templates: NAME, VERSION, PRIORITY, IMAGE, DRIVES, UPDATED."""
    as_json = check_output(output)
    with client() as c:
        data = c.get("templates")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.templates_table(_items(data)), nl=False)


@templates_app.command("show")
@handle_errors()
def templates_show(name: Annotated[str, typer.Argument(metavar="NAME", help="The template")]) -> None:
    """A template as JSON (what `create -f` takes, with its version and times)."""
    with client() as c:
        print_json(c.get(f"templates/{q(name)}"))


def _template_file(file: str) -> dict[str, Any]:
    body = read_json_file(file, "template")
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
        raise SpecError(f"{file}: a template is a JSON object {{\"metadata\": {{\"name\": ...}}, \"spec\": {{...}}}}")
    return body


@templates_app.command("create")
@handle_errors()
def templates_create(
    file: Annotated[str, typer.Option("-f", "--file", help="The template's JSON ({metadata: {name}, spec: {…any "
                                                           "part of a run's spec…}}; - for stdin)")],
) -> None:
    """Create a run template from a JSON file."""
    body = _template_file(file)
    with client() as c:
        out = c.post("templates", body)
    meta = (out if isinstance(out, dict) else {}).get("metadata") or {}
    typer.echo(fmt.terminal_safe(f"template {meta.get('name') or body['metadata'].get('name')} created "
                                 f"(version {meta.get('version', 1)})"))


@templates_app.command("replace")
@handle_errors()
def templates_replace(
    file: Annotated[str, typer.Option("-f", "--file", help="The template's new JSON (- for stdin)")],
) -> None:
    """Replace a template with a JSON file (same metadata.name); its version grows by one."""
    body = _template_file(file)
    name = str(body["metadata"].get("name") or "")
    if not name:
        raise SpecError(f"{file}: metadata.name: give the template's name")
    with client() as c:
        out = c.put(f"templates/{q(name)}", body)
    meta = (out if isinstance(out, dict) else {}).get("metadata") or {}
    typer.echo(fmt.terminal_safe(f"template {name} replaced (version {meta.get('version')})"))


@templates_app.command("delete")
@handle_errors()
def templates_delete(names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Templates to delete")]) -> None:
    """Delete run templates (runs made from them stay)."""
    with client() as c:
        for name in names:
            c.delete(f"templates/{q(name)}")
            typer.echo(f"template {name} deleted")


@schedules_app.command("list")
@handle_errors()
def schedules_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """List the workspace's schedules: NAME, SCHEDULE, TIMEZONE, CONCURRENCY, LAST TICK, NEXT TICK, ACTIVE."""
    as_json = check_output(output)
    with client() as c:
        data = c.get("schedules")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.schedules_table(_items(data)), nl=False)


@schedules_app.command("show")
@handle_errors()
def schedules_show(name: Annotated[str, typer.Argument(metavar="NAME", help="The schedule")]) -> None:
    """A schedule as JSON: its spec, last and next ticks, its runs and latest ticks."""
    with client() as c:
        print_json(c.get(f"schedules/{q(name)}"))


@schedules_app.command("create")
@handle_errors()
def schedules_create(
    file: Annotated[str, typer.Option("-f", "--file", help="The schedule's JSON ({metadata: {name}, spec: {schedule, "
                                                           "timezone, concurrency, starting_deadline_seconds, suspend, "
                                                           "run}}; - for stdin)")],
) -> None:
    """Create a schedule from a JSON file."""
    body = read_json_file(file, "schedule")
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
        raise SpecError(f"{file}: a schedule is a JSON object {{\"metadata\": {{\"name\": ...}}, \"spec\": "
                        "{\"schedule\": \"0 2 * * *\", \"run\": {...}}}")
    with client() as c:
        out = c.post("schedules", body)
    status = (out if isinstance(out, dict) else {}).get("status") or {}
    nxt = status.get("next_tick") or {}
    when = f"; next tick {nxt.get('tick')} ({nxt.get('at')})" if nxt else " (suspended)"
    typer.echo(fmt.terminal_safe(f"schedule {body['metadata'].get('name')} created{when}"))


@schedules_app.command("delete")
@handle_errors()
def schedules_delete(names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Schedules to delete")]) -> None:
    """Delete schedules (the runs they made stay)."""
    with client() as c:
        for name in names:
            c.delete(f"schedules/{q(name)}")
            typer.echo(f"schedule {name} deleted")


@registries_app.command("set")
@handle_errors()
def registries_set(
    registry: Annotated[str, typer.Argument(metavar="HOST[:PORT]", help="The registry, as image names give it "
                                                                         "(nvcr.io, 127.0.0.1:5000, docker.io)")],
    username: Annotated[str, typer.Option("-u", "--username", help="The registry user")],
    password_stdin: Annotated[bool, typer.Option("--password-stdin",
                                                 help="Read the password (or token) from stdin")] = False,
) -> None:
    """Set the workspace's credential for a registry (the password is read from stdin or a prompt, never an
    argument, and never shown back)."""
    if password_stdin:
        password = sys.stdin.read().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = typer.prompt("Password", hide_input=True)
    else:
        raise SpecError("no password: pipe it with --password-stdin (e.g. `cat token | astra astraeus registries "
                        f"set {registry} -u {username} --password-stdin`) or run this in a terminal to be asked")
    if not password:
        raise SpecError("the password is empty: give the registry password or access token")
    with client() as c:
        out = c.put(f"registries/{q(registry)}", {"username": username, "password": password})
    shown = out.get("registry", registry) if isinstance(out, dict) else registry
    typer.echo(fmt.terminal_safe(f"credential for {shown} set (user {username})"))


@registries_app.command("list")
@handle_errors()
def registries_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """List the workspace's registry credentials (registry and user; never a password)."""
    as_json = check_output(output)
    with client() as c:
        data = c.get("registries")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.registries_table(_items(data)), nl=False)


@registries_app.command("delete")
@handle_errors()
def registries_delete(registries: Annotated[list[str], typer.Argument(metavar="HOST[:PORT]...",
                                                                     help="Registries to forget")]) -> None:
    """Delete the workspace's credential for these registries."""
    with client() as c:
        for registry in registries:
            out = c.delete(f"registries/{q(registry)}")
            shown = out.get("registry", registry) if isinstance(out, dict) else registry
            typer.echo(fmt.terminal_safe(f"credential for {shown} deleted"))


# --- pools and reservations -----------------------------------------------------------------------------------


@pools_app.callback()
@handle_errors()
def pools(
    ctx: typer.Context,
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """The pools your workspace may use: NAME, CLUSTER, MACHINES, GPUS, FREE GPUS."""
    if ctx.invoked_subcommand is not None:
        return
    _pools_list(output)


@pools_app.command("list")
@handle_errors()
def pools_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """The pools your workspace may use (the same as `astra astraeus pools`)."""
    _pools_list(output)


def _pools_list(output: str | None) -> None:
    as_json = check_output(output)
    with client() as c:
        data = c.get("pools")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.pools_table(_items(data)), nl=False)


def parse_labels(labels: list[str] | None, option: str = "--label") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in labels or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"{option} {item}: give KEY=VALUE, e.g. {option} gpu=a100")
        out[key.strip()] = value.strip()
    return out


@pools_app.command("create")
@handle_errors()
def pools_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The pool's name")],
    cluster: Annotated[str, typer.Option("--cluster", help="The cluster whose machines it groups")],
    machine: Annotated[list[str] | None, typer.Option("--machine", help="A machine by name; repeatable")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="KEY=VALUE: every machine with all these labels "
                                                                   "(now or later); repeatable")] = None,
) -> None:
    """Create a pool (organisation admins): machines by name and/or every machine with the labels."""
    body = {"name": name, "machines": list(machine or []), "labels": parse_labels(label)}
    if not body["machines"] and not body["labels"]:
        raise SpecError("give the pool's machines (--machine NAME) or labels (--label KEY=VALUE), or both")
    with org_client() as c:
        out = c.post(f"clusters/{q(cluster)}/pools", body)
    members = (out if isinstance(out, dict) else {}).get("machines") or []
    typer.echo(fmt.terminal_safe(f"pool {name} created in cluster {cluster}: {len(members)} machine(s)"
                                 + (f" ({', '.join(members)})" if members else "")))


@pools_app.command("delete")
@handle_errors()
def pools_delete(
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Pools to delete")],
    cluster: Annotated[str, typer.Option("--cluster", help="Their cluster")],
) -> None:
    """Delete pools (organisation admins); refused while a workspace's access or a reservation uses one."""
    with org_client() as c:
        for name in names:
            c.delete(f"clusters/{q(cluster)}/pools/{q(name)}")
            typer.echo(f"pool {name} deleted")


@reservations_app.callback()
@handle_errors()
def reservations(
    ctx: typer.Context,
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """Your workspace's reservations: NAME, CLUSTER, MACHINES, START, END, STATE."""
    if ctx.invoked_subcommand is not None:
        return
    _reservations_list(output, False)


@reservations_app.command("list")
@handle_errors()
def reservations_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every reservation of the organisation (organisation "
                                                     "admins)")] = False,
) -> None:
    """Your workspace's reservations (with --all: the organisation's)."""
    _reservations_list(output, all_)


def _reservations_list(output: str | None, everyone: bool) -> None:
    as_json = check_output(output)
    with (org_client() if everyone else client()) as c:
        data = c.get("reservations")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.reservations_table(_items(data)), nl=False)


@reservations_app.command("create")
@handle_errors()
def reservations_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The reservation's name")],
    cluster: Annotated[str, typer.Option("--cluster", help="The cluster of its machines")],
    workspace: Annotated[list[str], typer.Option("--workspace", help="A workspace it is for; repeatable")],
    machine: Annotated[list[str] | None, typer.Option("--machine", help="A machine by name; repeatable")] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Reserve --count machines of this pool")] = None,
    count: Annotated[int | None, typer.Option("--count", help="How many machines of --pool")] = None,
    start: Annotated[str | None, typer.Option("--start", help="ISO 8601, e.g. 2026-12-01T10:00:00Z (default: "
                                                              "now)")] = None,
    end: Annotated[str | None, typer.Option("--end", help="ISO 8601 (default: no end)")] = None,
) -> None:
    """Reserve machines for workspaces (organisation admins): --machine M… or --pool P --count N."""
    if machine and (pool or count is not None):
        raise SpecError("give machines (--machine), or a pool and a count (--pool P --count N), not both")
    if not machine and (pool is None or count is None):
        raise SpecError("give machines (--machine NAME, repeatable), or a pool and a count (--pool P --count N)")
    body: dict[str, Any] = {"name": name, "cluster": cluster, "workspaces": list(workspace)}
    if machine:
        body["machines"] = list(machine)
    else:
        body["pool"], body["count"] = pool, count
    if start is not None:
        body["start"] = start
    if end is not None:
        body["end"] = end
    with org_client() as c:
        out = c.post("reservations", body)
    r = out if isinstance(out, dict) else {}
    until = fmt.show_time(r["end"]) if r.get("end") else "no end"
    typer.echo(fmt.terminal_safe(
        f"reservation {name} created: {', '.join(r.get('machines') or [])} for "
        f"{', '.join(r.get('workspaces') or workspace)} from {fmt.show_time(r.get('start'))} to {until} "
        f"({r.get('state', '')})"))


@reservations_app.command("delete")
@handle_errors()
def reservations_delete(
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Reservations to end now")],
) -> None:
    """End reservations now (organisation admins); they stay listed as Ended."""
    with org_client() as c:
        for name in names:
            c.delete(f"reservations/{q(name)}")
            typer.echo(f"reservation {name} ended")


# --- astra slurm ---------------------------------------------------------------------------------------------------

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
Other options are refused by name.
"""


@slurm_app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False,
                      "help_option_names": []},
    help=SBATCH_HELP,
)
@handle_errors(prefix="sbatch: error: ")
def sbatch(ctx: typer.Context) -> None:
    try:
        cmd = parse_command_line(list(ctx.args))
    except HelpRequested:
        typer.echo(SBATCH_HELP, nl=False)
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
            text = Path(cmd.script).read_text()
        except OSError as e:
            raise SbatchError(f"sbatch: error: Unable to open file {cmd.script}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise SbatchError(f"sbatch: error: {cmd.script} is not a text file") from None
        label = cmd.script
    try:
        job = build_job(cmd, text, label)
    except SbatchError as e:
        # A script that names no image runs with the workspace's default image on its cluster, where a site set one
        image = _default_image(cmd.options.values.get("cluster")) if "no container image" in str(e) else None
        if image is None:
            raise
        job = build_job(cmd, text, label, default_image=True)
        job.spec["spec"]["task_template"]["image"] = image
    if job.dry_run:
        print_json(job.spec if job.array is None else job.bodies())
        for note in job.notes:
            typer.echo(note, err=True)
        return
    if job.test_only:
        _test_only(job)
        return
    with client() as c:
        if job.array is not None:
            _submit_array(c, job)
            return
        base = job.name
        for attempt in range(2, 102):  # Slurm allows many jobs of one name: a resubmitted script gets NAME-2, …
            try:
                created = c.post("runs", job.spec)
                break
            except ApiError as e:
                if e.code == "ALREADY_EXISTS" and attempt < 101:
                    job = job.renamed(f"{base[:63 - len(str(attempt)) - 1].rstrip('-')}-{attempt}")
                    continue
                if e.status is not None:
                    raise SbatchError(f"sbatch: error: Batch job submission failed: {_hint(e.message)}") from None
                raise
    name = ((created if isinstance(created, dict) else {}).get("metadata") or {}).get("name") or job.name
    typer.echo(fmt.terminal_safe(f"Submitted batch job {name}"))
    for note in job.notes:  # after the outcome, so that a refusal stays one line
        typer.echo(note, err=True)


def _default_image(cluster: str | None) -> str | None:
    """The workspace's default image on the cluster (GET $API: clusters[].default_image), None where it has none."""
    with client() as c:
        try:
            ws = c.get("")
        except ApiError:
            return None
    clusters = [a for a in (ws or {}).get("clusters") or [] if isinstance(a, dict)]
    if cluster is not None:
        clusters = [a for a in clusters if a.get("name") == cluster]
    return (clusters[0].get("default_image") or None) if clusters else None


def _hint(message: str) -> str:
    """A partition that is no pool: scripts written before pools named the cluster with -p."""
    if "node_selection.pools: no pool named" in message:
        return message + " (-p/--partition names pools: astra astraeus pools; give a cluster with -M/--clusters=NAME)"
    return message


def _test_only(job: SbatchJob) -> None:
    """`sbatch --test-only`: what the job would do now (POST $API/runs?dry_run=true), as Slurm prints it; exit 1
    when it would not start. A job array: its first run."""
    body = job.bodies()[0]
    name = body["metadata"]["name"]
    with client() as c:
        try:
            answer = c.post("runs", body, dry_run=True)
        except ApiError as e:
            if e.status is not None:
                raise SbatchError(f"sbatch: error: Batch job submission failed: {_hint(e.message)}") from None
            raise
    line, starts = fmt.sbatch_test_only(answer if isinstance(answer, dict) else {}, name, job.processors,
                                        job.partition)
    typer.echo(line, err=True)  # Slurm writes it to stderr too
    if not starts:
        raise typer.Exit(1)


def _submit_array(c: Client, job: SbatchJob) -> None:
    """One run per index of the job array (POST /runs each, with spec.array); on a refusal, the runs of the array
    already submitted are deleted again, so that an array is submitted whole or not at all."""
    done: list[str] = []
    for body in job.bodies():
        name = body["metadata"]["name"]
        try:
            c.post("runs", body)
        except (ApiError, KeyboardInterrupt) as e:
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
    typer.echo(f"Submitted batch job {job.name}")
    at_once = f", at most {job.array.max_running} at once" if job.array.max_running else ""
    typer.echo(f"sbatch: note: job array {job.name}: {len(done)} runs {job.name}_[{job.array.shown()}]{at_once}; "
               f"astra slurm squeue -j {job.name} shows them, astra slurm scancel {job.name} cancels them", err=True)
    for note in job.notes:
        typer.echo(note, err=True)


def _array_of(run: dict) -> tuple[str | None, int | None]:
    a = (run.get("spec") or {}).get("array") or {}
    return a.get("job"), a.get("index")


def _matching(items: list[dict], jobs: list[str], command: str) -> list[tuple[str, list[dict]]]:
    """For each job given (a run, a job array's name, or `JOB_[0-9]`): the runs it stands for."""
    out = []
    for job in jobs:
        test = job_matcher(job, command)
        out.append((job, [r for r in items if test((r.get("metadata") or {}).get("name"), *_array_of(r))]))
    return out


VIEW_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}  # an unknown option: exit 1, Slurm's


def _no_extra(ctx: typer.Context, command: str) -> None:
    """Slurm's refusal of an option it does not know (exit 1, where click's would be 2)."""
    if ctx.args:
        raise sv.ViewError(f"{command}: error: unrecognized option or argument {ctx.args[0]!r} (astra slurm {command} "
                        "--help lists the options)")


def _view_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except sv.ViewError as e:
            raise fail(str(e), 1) from None

    return wrapper  # type: ignore[return-value]


@slurm_app.command(context_settings=VIEW_CONTEXT)
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
    typer.echo(fmt.squeue_table(items), nl=False)


@slurm_app.command()
@handle_errors(prefix="scancel: error: ")
def scancel(jobs: Annotated[list[str], typer.Argument(
        metavar="JOB...", help="Run names; a job array's name (all its runs), or some of its runs: JOB_[0-9]")]) -> None:
    """Cancel jobs: deletes the runs (their workers get SIGTERM, then SIGKILL after the stop grace)."""
    with client() as c:
        items = every_page(c, "runs")  # every run: the API answers a page at a time
        for job, runs in _matching(items, jobs, "scancel"):
            if not runs:
                raise ApiError(f"Kill job error on job id {job}: Invalid job id specified")
            for r in runs:
                rname = (r.get("metadata") or {}).get("name")
                try:
                    c.delete(f"runs/{q(rname)}")
                except ApiError as e:
                    if e.status == 404:
                        continue  # gone meanwhile
                    raise


@slurm_app.command(context_settings=VIEW_CONTEXT)
@handle_errors(prefix="sinfo: error: ")
@_view_errors
def sinfo(
    ctx: typer.Context,
    nodes: Annotated[bool, typer.Option("-N", "--Node", help="One line per machine (and partition)")] = False,
    format_: Annotated[str | None, typer.Option("-o", "--format", help="Slurm's format letters: %P %a %l %D %t %T "
                                                                       "%N %G %c %m %R, %C (GPUs used/idle/other/"
                                                                       "total); %.6D right-aligns")] = None,
    partition: Annotated[str | None, typer.Option("-p", "--partition", help="Only these partitions")] = None,
    noheader: Annotated[bool, typer.Option("-h", "--noheader", help="No header line")] = False,
) -> None:
    """Pools as partitions (a cluster without pools: one partition named after it, the default *), their machines
    by state: idle, mix (some GPUs held), alloc (all held), drain/drng (take no new work), down (lost)."""
    _no_extra(ctx, "sinfo")
    with client() as c:
        machines = every_page(c, "machines")
        pools = _items(c.get("pools"))
        busy = {w.get("machine") for st in ("Starting", "Running", "Stopping")
                for r in _items(c.get("runs", state=st, limit=1000))
                for w in (r.get("status") or {}).get("workers") or []
                if w.get("machine") and w.get("state") in ("Starting", "Running", "Stopping")}
    if partition:
        wanted = {p.strip() for p in partition.split(",") if p.strip()}
        known = {name for name, _, _ in sv.partitions(machines, pools)}
        if wanted - known:
            raise sv.ViewError(f"sinfo: error: no partition named {', '.join(sorted(wanted - known))}: the "
                               f"partitions are {', '.join(sorted(known)) or 'none'}")
        pools = [p for p in pools if p.get("name") in wanted]
        machines = [m for m in machines if m.get("cluster") in wanted or any(
            m.get("name") in (p.get("machines") or []) for p in pools)]
    typer.echo(sv.sinfo_table(machines, pools, busy, format_, nodes, not noheader), nl=False)


@slurm_app.command(context_settings=VIEW_CONTEXT)
@handle_errors(prefix="sacct: error: ")
@_view_errors
def sacct(
    ctx: typer.Context,
    jobs: Annotated[list[str] | None, typer.Option("-j", "--jobs", help="Only these jobs (comma-separated)")] = None,
    start: Annotated[str | None, typer.Option("-S", "--starttime", help="Jobs in any state after this time "
                                                                        "(default: midnight; with -j: any time)")]
    = None,
    end: Annotated[str | None, typer.Option("-E", "--endtime", help="… and before this one (default: now)")] = None,
    format_: Annotated[str | None, typer.Option("-o", "--format", help="Fields, e.g. JobID,JobName%30,State,"
                                                                       "Elapsed,Start,End,AllocTRES")] = None,
    allocations: Annotated[bool, typer.Option("-X", "--allocations", help="Jobs only, not their steps (workers)")]
    = False,
    parsable2: Annotated[bool, typer.Option("-P", "--parsable2", help="Fields separated by |")] = False,
    parsable: Annotated[bool, typer.Option("-p", "--parsable", help="Fields each followed by |")] = False,
    noheader: Annotated[bool, typer.Option("-n", "--noheader", help="No header lines")] = False,
    states: Annotated[str | None, typer.Option("-s", "--state", help="Only these states, e.g. CD,F,CA")] = None,
) -> None:
    """Jobs (runs) and their steps (NAME.INDEX: their workers) in Slurm's sacct layout; Account is the
    workspace, ExitCode code:signal, AllocTRES cpu=…,gres/gpu=…,mem=…,node=…."""
    from datetime import datetime

    _no_extra(ctx, "sacct")
    fields = sv.sacct_fields(format_)
    now = datetime.now().astimezone()
    since = sv.parse_when(start, now, "--starttime") if start else None
    until = sv.parse_when(end, now, "--endtime") if end else None
    wanted_states = sv.state_codes(states, "sacct") if states else None
    wanted = [n for arg in jobs or [] for n in split_jobs(arg) if n]
    if since is None and not wanted:
        since = now.replace(hour=0, minute=0, second=0, microsecond=0)
    with client() as c:
        items = every_page(c, "runs")
    if wanted:
        matched = _matching(items, wanted, "sacct")
        unknown = [job for job, runs in matched if not runs]
        if unknown:
            raise sv.ViewError(f"sacct: error: no job {', '.join(unknown)} in this workspace (astra slurm sacct "
                               "-S 2020-01-01 lists them all)")
        keep = {id(r) for _, runs in matched for r in runs}
        items = [r for r in items if id(r) in keep]
    items = [r for r in items if sv.in_window(r, since, until)]
    if wanted_states is not None:
        items = [r for r in items if sv.job_state(r) in wanted_states]
    rows = sv.sacct_rows(items, now, steps=not allocations)
    mode = "trailing" if parsable else ("plain" if parsable2 else None)
    typer.echo(sv.sacct_table(rows, fields, mode, not noheader), nl=False)


SCONTROL_USAGE = ("scontrol show job JOB | scontrol update JobId=JOB [Priority=N] [TimeLimit=TIME] | "
                  "scontrol hold|release JOB")


@slurm_app.command(context_settings={**VIEW_CONTEXT, "help_option_names": ["--help"]})
@handle_errors(prefix="scontrol: error: ")
@_view_errors
def scontrol(ctx: typer.Context) -> None:
    """scontrol show job JOB (Slurm's key=value lines); scontrol update JobId=JOB Priority=N TimeLimit=TIME
    (a live run's priority, within the workspace's maximum, and time limit: MM, HH:MM:SS, D-HH, UNLIMITED…)."""
    from datetime import UTC, datetime

    args = list(ctx.args)
    if not args:
        raise sv.ViewError(f"scontrol: error: give a command: {SCONTROL_USAGE}")
    verb = args[0].lower()
    if verb == "show":
        if len(args) < 2 or args[1].lower() not in ("job", "jobs", "jobid"):
            raise sv.ViewError("scontrol: error: astra slurm scontrol shows jobs only: scontrol show job JOB "
                               "(machines: astra slurm sinfo -N, astra astraeus machines)")
        names = args[2:]
        with client() as c:
            if not names:
                runs = every_page(c, "runs")
                runs = sv.squeue_keep(runs, datetime.now(UTC), float("inf"))
            else:
                runs = []
                for n in names:
                    try:
                        runs.append(c.get(f"runs/{q(n)}"))
                    except ApiError as e:
                        if e.status == 404:
                            raise sv.ViewError(f"scontrol: error: Invalid job id specified: {n} (no run of that "
                                               "name in this workspace)") from None
                        raise
        now = datetime.now(UTC)
        typer.echo("".join(sv.show_job(r, now) for r in runs), nl=False)
        return
    if verb == "update":
        job, body = _update_body(args[1:])
        with client() as c:
            try:
                c.patch(f"runs/{q(job)}", body)
            except ApiError as e:
                if e.status == 404:
                    raise sv.ViewError(f"scontrol: error: Invalid job id specified: {job} (no run of that name in "
                                       "this workspace)") from None
                raise
        return
    if verb in ("hold", "release", "uhold", "suspend", "resume", "requeue"):
        raise sv.ViewError(f"scontrol: error: not supported yet: {verb} (a held run needs a state the control "
                           "plane does not have); instead: scontrol update JobId=JOB Priority=-N lets other work go "
                           "first, scancel JOB and sbatch again later")
    raise sv.ViewError(f"scontrol: error: invalid command {args[0]!r}: {SCONTROL_USAGE}")


def _update_body(args: list[str]) -> tuple[str, dict[str, Any]]:
    """`JobId=train Priority=10 TimeLimit=2:00:00` → (train, the PATCH body)."""
    from astraeus.cli.slurm import parse_time

    job: str | None = None
    body: dict[str, Any] = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        k = key.lower()
        if not eq or not value:
            raise sv.ViewError(f"scontrol: error: invalid update {arg!r}: write KEY=VALUE, e.g. JobId=train "
                               "Priority=10 TimeLimit=2:00:00")
        if k in ("jobid", "job", "jobname"):
            job = value
        elif k == "priority":
            try:
                body["priority"] = int(value)
            except ValueError:
                raise sv.ViewError(f"scontrol: error: invalid Priority={value!r}: give a whole number") from None
        elif k == "nice":
            try:
                body["priority"] = -int(value)
            except ValueError:
                raise sv.ViewError(f"scontrol: error: invalid Nice={value!r}: give a whole number") from None
        elif k == "timelimit":
            try:
                body["time_limit_seconds"] = parse_time(value, "TimeLimit")
            except SbatchError:
                raise sv.ViewError(f"scontrol: error: invalid TimeLimit={value!r}: give MM, MM:SS, HH:MM:SS, D-HH, "
                                   "D-HH:MM, D-HH:MM:SS or UNLIMITED") from None
        else:
            raise sv.ViewError(f"scontrol: error: update {key} is not supported: astra slurm scontrol update "
                               "changes Priority, Nice and TimeLimit")
    if job is None:
        raise sv.ViewError("scontrol: error: give the job: scontrol update JobId=JOB Priority=N TimeLimit=TIME")
    if not body:
        raise sv.ViewError("scontrol: error: nothing to update: give Priority=N, Nice=N and/or TimeLimit=TIME")
    return job, body


# ------------------------------------------------------------------------------------------ replica groups


@groups_app.command("list")
@handle_errors()
def groups_list(
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """List the workspace's replica groups: NAME, REPLICAS, ALIVE, RUNNING, PRIORITY, TEMPLATE, NOTE."""
    as_json = check_output(output)
    with client() as c:
        data = c.get("replica-groups")
    if as_json:
        print_json(data)
    else:
        typer.echo(fmt.replica_groups_table(_items(data)), nl=False)


@groups_app.command("show")
@handle_errors()
def groups_show(name: Annotated[str, typer.Argument(metavar="NAME", help="The replica group")]) -> None:
    """A replica group as JSON: its spec, and its status (replicas wanted and alive, its runs)."""
    with client() as c:
        print_json(c.get(f"replica-groups/{q(name)}"))


@groups_app.command("create")
@handle_errors()
def groups_create(
    file: Annotated[str, typer.Option("-f", "--file", help="The group's JSON ({metadata: {name}, spec: {replicas: N, "
                                                           "run: {…a run's spec, may name template…}}}; - for stdin)")],
) -> None:
    """Create a replica group from a JSON file."""
    body = read_json_file(file, "replica group")
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
        raise SpecError(f"{file}: a replica group is a JSON object {{\"metadata\": {{\"name\": ...}}, \"spec\": "
                        "{\"replicas\": N, \"run\": {...}}}")
    with client() as c:
        out = c.post("replica-groups", body)
    meta = (out if isinstance(out, dict) else {}).get("metadata") or {}
    spec = (out if isinstance(out, dict) else {}).get("spec") or {}
    typer.echo(fmt.terminal_safe(f"replica group {meta.get('name')} created: {spec.get('replicas')} replica(s)"))


@groups_app.command("scale")
@handle_errors()
def groups_scale(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The replica group")],
    replicas: Annotated[int, typer.Argument(metavar="N", help="How many replicas to keep alive")],
) -> None:
    """Keep N replicas: more are created; fewer removes waiting ones first, then the most recently started."""
    with client() as c:
        before = c.get(f"replica-groups/{q(name)}")
        c.patch(f"replica-groups/{q(name)}", {"spec": {"replicas": replicas}})
    typer.echo(fmt.terminal_safe(f"replica group {name} scaled from {(before.get('spec') or {}).get('replicas')} to "
                                 f"{replicas}"))


@groups_app.command("delete")
@handle_errors()
def groups_delete(names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Groups to delete")]) -> None:
    """Delete replica groups and their runs."""
    with client() as c:
        for name in names:
            c.delete(f"replica-groups/{q(name)}")
            typer.echo(f"replica group {name} deleted, and its runs")
