"""`astra`: the command line for Astraeus.

    astra login --api URL --token TOKEN
    astra astraeus run|runs|logs|describe|delete|events|drives|machines|pools|reservations …
    astra slurm sbatch|squeue|scancel|sinfo|sacct|scontrol …

Every failure is one line on stderr and a non-zero exit; set ASTRA_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from astraeus import envvars
from astraeus.cli import commands
from astraeus.cli import format as fmt
from astraeus.cli import slurm_views as sv
from astraeus.cli.client import ApiError, Client, Config, q, save_config
from astraeus.cli.commands import (  # the hot commands' bodies and the helpers they share: without typer
    SBATCH_HELP,
    VIEW_CONTEXT,
    _items,
    _matching,
    _no_extra,
    _view_errors,
    check_output,
    client,
    every_page,
    handle_errors,
    list_client,
    print_json,
    read_json_file,
    template_run_body,  # noqa: F401  (tests import it from here)
)
from astraeus.cli.slurm import SbatchError, split_jobs
from astraeus.cli.spec import SpecError

commands.Annotated = Annotated  # type: ignore[attr-defined]
commands.typer = typer  # type: ignore[attr-defined]  # the commands' annotations name typer.Option: typer reads them there


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
slurm_app = _app(help="Slurm-style commands over Astraeus: sbatch, srun, salloc, squeue, scancel, sinfo, sacct, scontrol.")
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


from astraeus.cli import interactive  # noqa: E402  exec, shell and port-forward into a running worker

interactive.register(astraeus_app, handle_errors)

from astraeus.cli import usage as usage_cli  # noqa: E402  usage and sreport: GPU-hours from the usage records

usage_cli.register(astraeus_app, slurm_app, handle_errors, _view_errors, VIEW_CONTEXT)
from astraeus.cli import users as users_cli  # noqa: E402  audit and users: who did what (docs/users.md)

users_cli.register(astraeus_app, handle_errors)


def org_client() -> Client:
    """$ORG_API (the workspace API URL without /w/WS) with ASTRAEUS_ADMIN_TOKEN, or the token in use."""
    return Client.org_from_env()


# --- login -------------------------------------------------------------------------------------------------------


@app.command()
@handle_errors()
def login(
    api: Annotated[str, typer.Option("--api", help="The workspace API URL ($API), http://HOST:PORT/api/v1/o/ORG/w/WS; "
                                                   "several control plane replicas: their URLs comma-separated")],
    token: Annotated[str | None, typer.Option("--token", help="An API token (asked for when not given)")] = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check the URL and token first")] = True,
    sso: Annotated[bool, typer.Option("--sso", help="Sign in with the organisation's single sign-on (device flow): "
                                                    "astra gets a token of yours")] = False,
) -> None:
    """Save the API URL and token (in $ASTRAEUS_CONFIG or ~/.config/astraeus/config.json).

    ASTRAEUS_API and ASTRAEUS_TOKEN in the environment win over the saved ones."""
    if sso and token:
        raise SpecError("--sso gets a token by signing in: give --sso or --token, not both")
    who = ""
    if sso:
        from astraeus.cli import sso as sso_cli

        issued = sso_cli.device_login(api, lambda line: typer.echo(line, err=True))
        token, verify = issued["token"], False
        who = f" as {issued['user']} to workspace {issued['workspace']} ({issued['role']})"
    elif token is None:
        token = typer.prompt("Token", hide_input=True)
    config = Config(api=api.rstrip("/"), token=token)
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


astraeus_app.command(context_settings={"allow_interspersed_args": False})(commands.run)


astraeus_app.command()(commands.runs)


astraeus_app.command()(commands.logs)


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
    action: Annotated[str | None, typer.Argument(metavar="[cordon|drain|resume]", help=(
        "cordon: no new work lands on NAME; drain: also stop what runs there (queued again, no restart spent); "
        "resume: it takes work again. Organisation admins (ASTRAEUS_ADMIN_TOKEN).")
    )] = None,
    name: Annotated[str | None, typer.Argument(metavar="[NAME]", help="The machine")] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (needed to cordon or drain): shown with the "
                                                               "machine and on the runs a drain stops")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="NAME's cluster, when two have a machine NAME")]
    = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="json for the API's JSON")] = None,
) -> None:
    """Machines with their GPUs used and free; `machines drain|cordon|resume NAME --reason …` (admins)."""
    as_json = check_output(output)
    if action is not None:
        if action not in ("cordon", "drain", "resume") or not name:
            raise SpecError(f"astra astraeus machines {action} {name or ''}: give cordon, drain or resume, then the "
                            "machine's name, e.g. `astra astraeus machines drain gpu-07 --reason 'new cables'`")
        if action != "resume" and not (reason or "").strip():
            raise SpecError(f"give --reason to {action} {name}: say why (it is shown with the machine)")
        with org_client() as c:
            m = c.post(f"machines/{q(name)}/{action}", {"reason": reason} if reason else {},
                       **({"cluster": cluster} if cluster else {}))
        if as_json:
            print_json(m)
        else:
            word = {"cordon": "cordoned", "drain": "drained", "resume": "resumed"}[action]
            typer.echo(fmt.terminal_safe(f"machine {name} {word}" + (f": {reason}" if reason else "")))
        return
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

from astraeus.cli import slurm_interactive  # noqa: E402  srun, salloc; sbatch's --wait and --parsable

slurm_interactive.register(slurm_app, handle_errors)


slurm_app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False,
                      "help_option_names": []},
    help=SBATCH_HELP,
)(commands.sbatch)


slurm_app.command(context_settings=VIEW_CONTEXT)(commands.squeue)


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
    (a live run's priority, within the workspace's maximum, and time limit: MM, HH:MM:SS, D-HH, UNLIMITED…);
    scontrol hold JOB (a Pending run waits, never placed, until scontrol release JOB). JOB: a run's name or its
    numeric job id."""
    from datetime import UTC, datetime

    from astraeus.cli.commands import run_named

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
                        runs.append(c.get(f"runs/{q(run_named(c, n))}"))
                    except ApiError as e:
                        if e.status == 404:
                            raise sv.ViewError(f"scontrol: error: Invalid job id specified: {n} (no run of that "
                                               "name in this workspace)") from None
                        raise
        now = datetime.now(UTC)
        typer.echo("".join(sv.show_job(r, now) for r in runs), nl=False)
        return
    if verb == "update" and any(a.lower().startswith("nodename=") for a in args[1:]):
        _update_node(args[1:])
        return
    if verb == "update":
        job, body = _update_body(args[1:])
        with client() as c:
            try:
                c.patch(f"runs/{q(run_named(c, job))}", body)
            except ApiError as e:
                if e.status == 404:
                    raise sv.ViewError(f"scontrol: error: Invalid job id specified: {job} (no run of that name in "
                                       "this workspace)") from None
                raise
        return
    if verb in ("hold", "uhold", "release"):
        jobs = [j for arg in args[1:] for j in split_jobs(arg)]
        if not jobs:
            raise sv.ViewError(f"scontrol: error: give the job to {verb}: scontrol {verb} JOB (a run's name or job id)")
        with client() as c:
            for job in jobs:
                try:
                    c.patch(f"runs/{q(run_named(c, job))}", {"held": verb != "release"})
                except ApiError as e:
                    if e.status == 404:
                        raise sv.ViewError(f"scontrol: error: Invalid job id specified: {job} (no run of that name "
                                           "or job id in this workspace)") from None
                    if e.status is not None:
                        raise sv.ViewError(f"scontrol: error: {job}: {e.message}") from None
                    raise
        return
    if verb in ("suspend", "resume", "requeue"):
        raise sv.ViewError(f"scontrol: error: not supported yet: {verb}; instead: scontrol hold JOB keeps a waiting "
                           "job from starting, scancel JOB and sbatch again later")
    raise sv.ViewError(f"scontrol: error: invalid command {args[0]!r}: {SCONTROL_USAGE}")


# Slurm's node states as Astraeus's (docs/health.md): DRAIN lets running work end (a cordon), DOWN stops it (a drain).
NODE_ACTIONS = {"drain": "cordon", "down": "drain", "resume": "resume", "undrain": "resume", "idle": "resume"}


def _update_node(args: list[str]) -> None:
    """`NodeName=gpu-07 State=DRAIN Reason="new cables"`: cordon, drain or resume the machine (organisation admins)."""
    fields: dict[str, str] = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or key.lower() not in ("nodename", "state", "reason"):
            raise sv.ViewError(f"scontrol: error: invalid node update {arg!r}: astra slurm scontrol update "
                               "NodeName=NAME State=DRAIN|DOWN|RESUME Reason=WHY")
        fields[key.lower()] = value
    node, state = fields.get("nodename", ""), fields.get("state", "").lower()
    if not node or state not in NODE_ACTIONS:
        raise sv.ViewError(f"scontrol: error: give NodeName=NAME and State=DRAIN (no new jobs), DOWN (its jobs "
                           f"stopped and requeued) or RESUME; got State={fields.get('state', '')!r}")
    action = NODE_ACTIONS[state]
    reason = fields.get("reason", "").strip()
    if action != "resume" and not reason:
        raise sv.ViewError(f"scontrol: error: You must specify a reason when DRAINING or DOWNING a node: "
                           f"Reason=WHY (scontrol update NodeName={node} State={state.upper()} Reason=...)")
    with org_client() as c:
        try:
            c.post(f"machines/{q(node)}/{action}", {"reason": reason} if reason else {})
        except ApiError as e:
            if e.status is not None:
                raise sv.ViewError(f"scontrol: error: {node}: {e.message}") from None
            raise


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
