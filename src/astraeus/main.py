"""`astraeus`: the control plane (`server`), a machine's agent (`agent`), a local cluster (`up`), the simulator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from astraeus import heap

app = typer.Typer(help="Astraeus: a GPU cluster workload manager.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)

HOME_HELP = "Where the SQLite database, env and agents' state live (default: $ASTRAEUS_HOME or ~/.astraeus)"


def _environment(command: str, *models):
    """Read and check the ASTRAEUS_* variables (astraeus.settings) that `command` uses: on a bad one, say
    which and what it must be, in one line, and exit 2."""
    from astraeus.settings import SettingsError

    try:
        return [m.load() for m in models]
    except SettingsError as e:
        for line in str(e).splitlines():
            typer.echo(f"astraeus {command}: {line}", err=True)
        raise typer.Exit(2) from None


def _settings(command: str, home: Path | None, host: str, port: int):
    """The control plane's settings (astraeus.settings.ServerSettings): the environment's, with the options."""
    from astraeus.settings import ServerSettings, SettingsError

    try:
        return ServerSettings.load(home=home.expanduser() if home else None, host=host, port=port)
    except SettingsError as e:
        for line in str(e).splitlines():
            typer.echo(f"astraeus {command}: {line}", err=True)
        raise typer.Exit(2) from None


def bootstrap(cp, org: str, workspace: str, cluster: str, host_paths: list[str], lost_after: float | None = None,
              max_priority: int | None = None) -> dict:
    """The defaults a fresh control plane needs, and fresh tokens to reach it (secrets are kept only hashed)."""
    from astraeus.server import services
    from astraeus.server.state_lock import lock_state

    with cp.sessions() as s, s.begin():
        lock_state(s)  # several replicas starting at once: one makes the defaults, the others find them
        o = services.ensure_org(s, org)
        c = services.ensure_cluster(s, o, cluster, lost_after=lost_after)
        ws = services.ensure_workspace(s, o, workspace)
        acc = services.set_access(s, ws, c, max_priority=max_priority)
        for p in host_paths:
            if p not in (acc.host_paths or []):
                acc.host_paths = list(acc.host_paths or []) + [p]
        from astraeus.server.services.users import ensure_user  # both tokens are the user `admin`'s (issue 45)

        owner = ensure_user(s, o, "admin", org_admin=True, display_name="Organisation admin", roles={ws: "admin"})
        _, admin = services.create_token(s, o, "org_admin", user=owner)
        _, editor = services.create_token(s, o, "user", ws, "editor", user=owner)
        _, machine = services.create_token(s, o, "machine", cluster=c)
        return {"org": org, "workspace": workspace, "ns": ws.ns, "cluster": cluster, "admin_token": admin,
                "token": editor, "machine_token": machine}


def write_env(home: Path, base: str, boot: dict) -> str:
    api = f"{base}/api/v1/o/{boot['org']}/w/{boot['workspace']}"
    lines = [
        f"export API={api}",
        f"export ASTRAEUS_TOKEN={boot['token']}",
        f"export ASTRAEUS_API={api}",
        f"export ASTRAEUS_ADMIN_TOKEN={boot['admin_token']}",
        f"export ASTRAEUS_MACHINE_TOKEN={boot['machine_token']}",
        f"export ASTRAEUS_SERVER={base}",
    ]
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)
    envf = home / "env"
    tmp = home / "env.tmp"  # written whole, then renamed: a reader never sees half of it
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # 0600 from the start
        f.write("\n".join(lines) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, envf)
    return "\n".join(lines)


def shown(text: str, home: Path) -> str:
    """The env lines as printed: whole on a terminal (a person copies them), with token values cut to their
    kind prefix anywhere else, so that no secret lands in a captured log (they are in <home>/env, mode 0600)."""
    return text if sys.stdout.isatty() else redacted(text, home)


def redacted(text: str, home: Path) -> str:
    out = []
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k.endswith("TOKEN") and v:
            line = f"{k}={v[:6]}…  # secret: source {home / 'env'}"
        out.append(line)
    return "\n".join(out)


def _shared_socket(host: str, port: int):
    """A listening socket for one of several server processes on one port (SO_REUSEPORT: the kernel spreads the
    new connections over the processes)."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _die_with_parent() -> None:  # a child server process: SIGTERM when the process that started it dies
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _serve(settings, cp, on_ready=None, on_signal=None, reuse_port: bool = False) -> None:
    """Serve the API until SIGINT/SIGTERM. uvicorn runs in a thread so that this thread handles the signal:
    `on_signal` runs first (a local cluster stops its agents while the API still answers them), then the
    waiting long-polls are released and the server stops."""
    import uvicorn

    from astraeus.app import create_app

    fastapi_app = create_app(settings, cp)
    # timeout_keep_alive: longer than a client (httpx) keeps an idle connection, so that the client, not the
    # server, closes it: with equal timeouts both sides closed at about the same moment, and an agent's heartbeat
    # now and then went out on a connection the server was closing (RemoteProtocolError / ReadError).
    # loop/http: libuv's event loop and llhttp's parser (uvloop, httptools), not asyncio's pure-Python loop and h11,
    # whose HTTP side was a large share of the server's CPU per submit (benchmarks/README.md, API submit rate).
    config = uvicorn.Config(fastapi_app, host=settings.host, port=settings.port, log_level="warning",
                            timeout_graceful_shutdown=5, timeout_keep_alive=75, loop="uvloop", http="httptools")
    server = uvicorn.Server(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sockets = [_shared_socket(settings.host, settings.port)] if reuse_port else None
    t = threading.Thread(target=server.run, kwargs={"sockets": sockets}, name="api", daemon=True)
    t.start()
    while not server.started and t.is_alive():
        time.sleep(0.02)
    if not t.is_alive():
        raise typer.Exit(1)
    heap.settle()  # started: what it holds now is left out of the garbage collector's walks
    if on_ready:
        threading.Thread(target=on_ready, args=(server,), daemon=True).start()
    while not stop.wait(0.5):
        if not t.is_alive():
            break
    try:
        if on_signal:
            on_signal()
    finally:
        cp.notifier.close()
        server.should_exit = True
        t.join(timeout=15)


@app.command()
def server(
    home: Annotated[Path | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8420,
    org: Annotated[str, typer.Option()] = "acme",
    workspace: Annotated[str, typer.Option()] = "vision",
    cluster: Annotated[str, typer.Option()] = "main",
    host_path: Annotated[list[str], typer.Option(help="Host path granted to the default workspace")] = None,
    replica_id: Annotated[str | None, typer.Option(
        help="This replica's name in the scheduling lease and /healthz (default: $ASTRAEUS_REPLICA_ID or "
             "host:port)", show_default=False)] = None,
    processes: Annotated[int, typer.Option(
        min=1, help="Server processes on this host and port (PostgreSQL only): each a replica serving the API and "
                    "the agents, one of them leading the scheduling; the port is shared (SO_REUSEPORT), so a larger "
                    "fleet's requests use more than one core")] = 1,
    process_of: Annotated[str | None, typer.Option(hidden=True)] = None,  # internal: another of --processes, its id
):
    """The control plane: API, console, scheduling loop. PostgreSQL through ASTRAEUS_DATABASE_URL
    (every variable: docs/configuration.md); on PostgreSQL, start several on other machines or ports for a
    control plane with no single point of failure: one of them leads the scheduling at a time, or several on
    one machine with --processes N."""
    from astraeus.server.core import ControlPlane
    from astraeus.server.db import AlreadyServing, SchemaTooNew

    settings = _settings("server", home, host, port)
    if replica_id:
        settings.replica_id = replica_id
    home = settings.home
    if processes > 1 and not settings.url().startswith("postgresql"):
        typer.echo("astraeus server: --processes needs PostgreSQL (ASTRAEUS_DATABASE_URL): on SQLite one process "
                   "serves the database", err=True)
        raise typer.Exit(2)
    if processes > 1 or process_of:  # each process its own name in the scheduling lease and its logs: <base>/<i>
        settings.replica_id = process_of or f"{settings.replica_id or f'{settings.host}:{settings.port}'}/0"
    try:
        cp = ControlPlane.open(settings, exclusive=True, share=processes)  # N processes: a pool of 1/N each
    except (SchemaTooNew, AlreadyServing) as e:  # a newer schema, or SQLite served by another process
        typer.echo(f"astraeus server: {e}", err=True)
        raise typer.Exit(1) from None
    except Exception as e:  # an unreachable database: refuse to start, change nothing
        typer.echo(f"astraeus server: cannot open the database ({type(e).__name__}: {str(e).splitlines()[0]})",
                   err=True)
        raise typer.Exit(1) from None
    if process_of:  # the first process bootstrapped and wrote the env file
        _serve(settings, cp, reuse_port=True)
        return
    boot = bootstrap(cp, org, workspace, cluster, host_path or ["/data/astraeus"])
    text = write_env(home, settings.console_base(), boot)
    typer.echo(shown(text, home))
    typer.echo(f"astraeus server: listening on {settings.console_base()} (docs at /docs)"
               + (f", {processes} processes" if processes > 1 else ""))
    others = []
    base = settings.replica_id.rsplit("/", 1)[0] if processes > 1 else ""
    for i in range(1, processes):
        others.append(subprocess.Popen(
            [sys.executable, "-m", "astraeus.main", "server", "--home", str(home), "--host", settings.host,
             "--port", str(settings.port), "--processes", str(processes), "--process-of", f"{base}/{i}"],
            preexec_fn=_die_with_parent))

    def stop_others() -> None:
        for p in others:
            p.terminate()
        for p in others:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    try:
        _serve(settings, cp, on_signal=stop_others if others else None, reuse_port=processes > 1)
    finally:
        stop_others()


@app.command()
def agent(
    server: Annotated[str | None, typer.Option(
        help="The control plane's URL, or several replicas' URLs comma-separated (http://cp1:8420,http://cp2:8420): "
             "the agent moves to the next when one stops answering (default: $ASTRAEUS_SERVER)",
        show_default=False)] = None,
    token: Annotated[str | None, typer.Option(
        help="A join token, exchanged for this machine's own credential when it first registers "
             "(default: $ASTRAEUS_MACHINE_TOKEN)", show_default=False)] = None,
    name: Annotated[str, typer.Option(help="This machine's name")] = os.uname().nodename.split(".")[0],
    gpus: Annotated[int | None, typer.Option(help="Simulated GPU count (default: found through NVML)")] = None,
    cpus: Annotated[float | None, typer.Option(help="CPU cores to declare")] = None,
    memory_gib: Annotated[float | None, typer.Option(help="Memory to declare, GiB")] = None,
    gpu_memory_gib: Annotated[float | None, typer.Option(
        help="Memory of each simulated GPU, GiB (with --gpus; default: NVML's where the GPUs are real, else 80)",
        show_default=False)] = None,
    nvlink_islands: Annotated[str | None, typer.Option(
        help="The GPUs joined by NVLink, one island per comma: 0-3,4-7 (a worker's GPUs lie in one island; GPUs "
             "not named are islands of their own; default: NVML's, else one island)", show_default=False)] = None,
    mig: Annotated[str | None, typer.Option(
        help="Simulated MIG devices, GPU:profile*count, comma-separated: 0:1g.10gb*7,1:3g.40gb*2 (a GPU with MIG "
             "devices takes MIG workers only; default: NVML's)", show_default=False)] = None,
    state_dir: Annotated[Path | None, typer.Option(
        help="Where the agent records its workers (default: $ASTRAEUS_STATE_DIR or $ASTRAEUS_HOME/agents/NAME)",
        show_default=False)] = None,
    stop_workers_on_exit: Annotated[bool, typer.Option(help="Stop workers when the agent stops")] = False,
    runtime: Annotated[str | None, typer.Option(
        help="How workers run: container (each in its image, by runc), process (on the host), or auto: container "
             "on a machine with NVIDIA GPUs and runc, skopeo and umoci installed (default: $ASTRAEUS_RUNTIME or "
             "auto)", show_default=False)] = None,
    address: Annotated[str | None, typer.Option(
        help="The address other machines and the control plane reach this machine at (default: $ASTRAEUS_ADDRESS, "
             "or the source address of the route to the control plane)", show_default=False)] = None,
    shared_fs: Annotated[list[str] | None, typer.Option(
        "--shared-fs", help="A shared filesystem this machine has mounted, NAME=/mnt/path (repeatable; added to "
                            "$ASTRAEUS_SHARED_FS): drives on filesystem NAME can be used here", show_default=False)] = None,
):
    """A machine's agent: joins the cluster, runs and stops workers (every variable: docs/configuration.md)."""
    from astraeus.agent.agent import RUNTIMES, RuntimeChoiceError, run_agent
    from astraeus.settings import AgentSettings

    (env,) = _environment("agent", AgentSettings)
    server = server or env.server
    token = token or env.machine_token
    if not server or not token:
        missing = "--server (or ASTRAEUS_SERVER)" if not server else "--token (or ASTRAEUS_MACHINE_TOKEN)"
        typer.echo(f"astraeus agent: missing {missing}: the control plane's URL and a machine token", err=True)
        raise typer.Exit(2)
    from astraeus.settings import http_urls

    try:
        server = http_urls(server)
    except ValueError as e:
        typer.echo(f"astraeus agent: --server: {e}: give the control plane's URL, or several comma-separated",
                   err=True)
        raise typer.Exit(2) from None
    asked = runtime or env.runtime
    if asked not in RUNTIMES:
        typer.echo(f"astraeus agent: --runtime {asked}: use auto, container or process", err=True)
        raise typer.Exit(2)
    from astraeus.spec import check_address, parse_shared_filesystems

    option = "--address"
    try:
        address = check_address(address) if address is not None else None
        option = "--shared-fs"
        shared = dict(env.shared_fs, **parse_shared_filesystems(shared_fs or []))
    except ValueError as e:
        typer.echo(f"astraeus agent: {option}: {e}", err=True)
        raise typer.Exit(2) from None
    if gpu_memory_gib is not None and not 0 < gpu_memory_gib <= 1 << 20:
        typer.echo(f"astraeus agent: --gpu-memory-gib {gpu_memory_gib:g}: give each GPU's memory in GiB, more than 0 "
                   "(e.g. 80)", err=True)
        raise typer.Exit(2)
    islands, mig_profiles = _gpu_layout("astraeus agent", gpus, nvlink_islands, mig)
    heap.settle()  # what it imported is left out of the garbage collector's walks
    try:
        run_agent(server=server, token=token, name=name, gpus=gpus, cpu_cores=cpus,
                  gpu_memory_bytes=int(gpu_memory_gib * (1 << 30)) if gpu_memory_gib else None,
                  nvlink_islands=islands, mig=mig_profiles, memory_bytes=int(memory_gib * (1 << 30)) if memory_gib else None,
                  state_dir=str(state_dir or env.state_dir_for(name)), stop_grace=env.stop_grace,
                  stop_workers_on_exit=stop_workers_on_exit, image_map=env.images(), runtime_kind=asked,
                  address=address or env.address, shared_filesystems=shared)
    except RuntimeChoiceError as e:  # raised while the agent is built, before it starts anything
        typer.echo(f"astraeus agent: {e}", err=True)
        raise typer.Exit(2) from None


@app.command()
def up(
    home: Annotated[Path | None, typer.Option(help=HOME_HELP, show_default=False)] = None,
    port: Annotated[int, typer.Option()] = 8420,
    gpus: Annotated[int, typer.Option(help="Simulated GPUs per machine")] = 8,
    machines: Annotated[int, typer.Option(help="Local machines (gpu-01, gpu-02, …)")] = 1,
    cpus: Annotated[float, typer.Option(help="CPU cores each machine declares")] = 64,
    memory_gib: Annotated[float, typer.Option(help="Memory each machine declares, GiB")] = 512,
    gpu_memory_gib: Annotated[float, typer.Option(help="Memory of each simulated GPU, GiB")] = 80,
    nvlink_islands: Annotated[str | None, typer.Option(
        help="Each machine's NVLink islands, 0-3,4-7 (passed to each agent; see `astraeus agent --help`)",
        show_default=False)] = None,
    mig: Annotated[str | None, typer.Option(
        help="Each machine's simulated MIG devices, 0:1g.10gb*7 (passed to each agent; see `astraeus agent --help`)",
        show_default=False)] = None,
    org: Annotated[str, typer.Option()] = "acme",
    workspace: Annotated[str, typer.Option()] = "vision",
    cluster: Annotated[str, typer.Option()] = "main",
    host_path: Annotated[list[str], typer.Option(help="Host paths granted to the workspace")] = None,
    max_priority: Annotated[int | None, typer.Option(help="The workspace's max priority")] = None,
    lost_after: Annotated[float | None, typer.Option(help="Seconds without heartbeat before a machine is lost")] = None,
    runtime: Annotated[str | None, typer.Option(
        help="How the agents run workers: auto, container or process (see `astraeus agent --help`; default: "
             "$ASTRAEUS_RUNTIME or auto)", show_default=False)] = None,
    netns: Annotated[bool, typer.Option(
        "--netns", help="Each machine in its own network namespace with its own address on a bridge, reaching the "
                        "control plane at the bridge's address (root and iproute2; removed on exit)")] = False,
    shared_fs: Annotated[list[str], typer.Option(
        "--shared-fs", help="NAME=/path: a shared filesystem every machine has mounted there (repeatable; passed "
                            "to each agent)", show_default=False)] = None,
):
    """A local cluster in the foreground: a control plane and N agents with simulated GPUs. Ctrl-C stops it."""
    from astraeus.agent.agent import RUNTIMES, RuntimeChoiceError, choose_runtime
    from astraeus.settings import AgentSettings

    settings = _settings("up", home, "127.0.0.1", port)
    # The agents it starts read these: refuse a bad one now, not in their logs.
    (agent_env,) = _environment("up", AgentSettings)
    asked = runtime or agent_env.runtime
    if asked not in RUNTIMES:
        typer.echo(f"astraeus up: --runtime {asked}: use auto, container or process", err=True)
        raise typer.Exit(2)
    if asked == "container":  # say what is missing here, not in each agent's log
        from astraeus.agent.runtime.container import container_tools_missing

        try:
            choose_runtime(asked, container_tools_missing(), 0, os.geteuid() == 0)
        except RuntimeChoiceError as e:
            typer.echo(f"astraeus up: {e}", err=True)
            raise typer.Exit(2) from None
    if not 0 < gpu_memory_gib <= 1 << 20:
        typer.echo(f"astraeus up: --gpu-memory-gib {gpu_memory_gib:g}: give each GPU's memory in GiB, more than 0 "
                   "(e.g. 80)", err=True)
        raise typer.Exit(2)
    _gpu_layout("astraeus up", gpus, nvlink_islands, mig)  # checked here; each agent is given them as written
    shared = _up_shared_fs(shared_fs or [])
    names = [f"gpu-{i + 1:02d}" for i in range(machines)]
    home = settings.home
    layout = _up_network(home, names, netns)  # before the control plane: it listens on the bridge's address
    try:
        _up(settings, cp_args=(org, workspace, cluster, host_path, lost_after, max_priority), names=names,
            gpus=gpus, cpus=cpus, memory_gib=memory_gib, runtime=asked, shared=shared, layout=layout,
            gpu_memory_gib=gpu_memory_gib, nvlink_islands=nvlink_islands, mig=mig)
    finally:
        if layout is not None:
            from astraeus.fleet import netns as fleet_netns

            fleet_netns.destroy(layout)
            fleet_netns.record_path(home).unlink(missing_ok=True)


def _up_shared_fs(items: list[str]) -> dict[str, str]:
    """`up --shared-fs NAME=/path` entries, checked here rather than in each agent's log."""
    from astraeus.spec import parse_shared_filesystems

    try:
        return parse_shared_filesystems(items)
    except ValueError as e:
        typer.echo(f"astraeus up: --shared-fs {e}", err=True)
        raise typer.Exit(2) from None


def _up_network(home: Path, names: list[str], netns: bool):
    """With --netns: remove what an earlier `up` in this home left (a crash), then make a bridge and a network
    namespace per machine (astraeus.fleet.netns) and return their layout; without it, only remove leftovers."""
    from astraeus.fleet import netns as fleet_netns

    why = fleet_netns.unavailable()
    if netns and why:
        typer.echo(f"astraeus up: --netns {why}", err=True)
        raise typer.Exit(2)
    if why:  # no --netns: nothing to make, and nothing this user could have made
        return None
    recorded = fleet_netns.load(home)
    other = fleet_netns.owner_alive(recorded)
    if other:
        typer.echo(f"astraeus up: another `astraeus up` (pid {other}) runs in {home}: stop it, or use another --home",
                   err=True)
        raise typer.Exit(2)
    removed = fleet_netns.remove_leftovers(home)
    if removed:
        typer.echo(f"astraeus up: removed what an earlier `astraeus up` in {home} left: {', '.join(removed)}",
                   err=True)
    if not netns:
        return None
    try:
        layout = fleet_netns.plan(home, names, fleet_netns.networks_taken(), owner_pid=os.getpid())
    except ValueError as e:
        typer.echo(f"astraeus up: --netns: {e}", err=True)
        raise typer.Exit(2) from None
    fleet_netns.save(home, layout)  # recorded before anything is made: a crash from here on leaves a record
    signal.signal(signal.SIGTERM, _interrupted)  # until the control plane serves: stop cleanly, removing it all
    try:
        fleet_netns.create(layout)
    except (fleet_netns.NetnsError, KeyboardInterrupt) as e:
        fleet_netns.destroy(layout)
        fleet_netns.record_path(home).unlink(missing_ok=True)
        if isinstance(e, KeyboardInterrupt):
            raise typer.Exit(130) from None
        typer.echo(f"astraeus up: --netns: cannot make the machines' network: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"astraeus up: {len(names)} machine(s) in network namespaces on {layout.bridge} {layout.subnet}: "
               + ", ".join(f"{m.name} {m.address}" for m in layout.machines), err=True)
    return layout


def _interrupted(*_) -> None:
    raise KeyboardInterrupt


def _gpu_layout(command: str, gpus: int | None, nvlink_islands: str | None, mig: str | None
                ) -> tuple[list[list[int]] | None, list[list[str]] | None]:
    """--nvlink-islands and --mig read against the machine's GPU count (found through NVML once, when --gpus is not
    given): (islands, MIG profiles per GPU), None where not given; a bad value exits 2 saying what to change."""
    if nvlink_islands is None and mig is None:
        return None, None
    from astraeus.agent.gpus import discover_gpus, parse_mig
    from astraeus.scheduler.topology import parse_islands

    count = gpus if gpus is not None else discover_gpus().count
    option, value = "--nvlink-islands", nvlink_islands
    try:
        islands = None if nvlink_islands is None else [list(i) for i in parse_islands(nvlink_islands, count)]
        option, value = "--mig", mig
        profiles = None if mig is None else parse_mig(mig, count)
    except ValueError as e:
        typer.echo(f"{command}: {option} {value}: {e}", err=True)
        raise typer.Exit(2) from None
    return islands, profiles


def _up(settings, *, cp_args, names, gpus, cpus, memory_gib, runtime, shared, layout, gpu_memory_gib=80,
        nvlink_islands: str | None = None, mig: str | None = None) -> None:
    from astraeus.server.core import ControlPlane
    from astraeus.settings import environment

    org, workspace, cluster, host_path, lost_after, max_priority = cp_args
    asked = runtime
    machines = len(names)
    home = settings.home
    if layout is not None:
        settings.host = layout.gateway  # the agents reach it over the bridge; the host has that address too
    # The agents' logs and state live in the home even when the database is elsewhere (ASTRAEUS_DATABASE_URL)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        cp = ControlPlane.open(settings, exclusive=True)  # SQLite: one serving process (db.hold_sqlite)
    except Exception as e:
        typer.echo(f"astraeus up: cannot open the database ({type(e).__name__}: {str(e).splitlines()[0]})", err=True)
        raise typer.Exit(1) from None
    boot = bootstrap(cp, org, workspace, cluster, host_path or ["/data/astraeus"], lost_after, max_priority)
    # With --netns the agents and the env file use the bridge's address, even with ASTRAEUS_PUBLIC_URL set.
    base = f"http://{layout.gateway}:{settings.port}" if layout is not None else settings.console_base()
    procs: list[subprocess.Popen] = []

    def start_agents(server) -> None:
        for name in names:
            cmd = [sys.executable, "-m", "astraeus.main", "agent", "--server", base,
                   "--name", name, "--gpus", str(gpus), "--cpus", str(cpus), "--memory-gib", str(memory_gib),
                   "--gpu-memory-gib", str(gpu_memory_gib),
                   "--state-dir", str(home / "agents" / name), "--stop-workers-on-exit", "--runtime", asked]
            for fs, path in shared.items():
                cmd += ["--shared-fs", f"{fs}={path}"]
            if nvlink_islands is not None:
                cmd += ["--nvlink-islands", nvlink_islands]
            if mig is not None:
                cmd += ["--mig", mig]
            if layout is not None:
                from astraeus.fleet.netns import exec_argv

                cmd = exec_argv(layout.machine(name).netns, cmd)
            log = open(home / f"agent-{name}.log", "ab")
            # The join token goes in the environment, not the command line, where `ps` would show it; each
            # agent exchanges it for its machine's own credential, kept in its state dir.
            env = environment(ASTRAEUS_MACHINE_TOKEN=boot["machine_token"])
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        # Ready when every machine has joined.
        from sqlalchemy import func, select

        from astraeus.server.db import Machine

        deadline = time.time() + 60
        while time.time() < deadline:
            with cp.sessions() as s:
                n = s.scalar(select(func.count(Machine.id)).where(Machine.state == "Ready"))
            if n >= machines:
                break
            time.sleep(0.05)
        with cp.sessions() as s:
            used = sorted({r or "unknown" for r in s.scalars(select(Machine.runtime).where(Machine.state == "Ready"))})
        text = write_env(home, base, boot)
        print(shown(text, home), flush=True)
        print(f"astraeus up: {machines} machine(s) × {gpus} GPUs ready (runtime: {', '.join(used) or asked}); "
              f"console {base}/o/{org}/w/{workspace}", flush=True)

    def stop_agents() -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()

    try:
        _serve(settings, cp, on_ready=start_agents, on_signal=stop_agents)
    finally:
        stop_agents()
        (home / "env").unlink(missing_ok=True)


def _register_simulate() -> None:
    try:
        from astraeus.sim.cli import simulate_command
    except ImportError:
        return
    app.command("simulate")(simulate_command)


_register_simulate()

if __name__ == "__main__":
    app()
