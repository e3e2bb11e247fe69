"""Helpers for the fault and attack tests: a control plane (`astraeus server`) and agents (`astraeus agent`) as
separate processes the test kills and restarts, a TCP proxy that can cut an agent off, and process checks."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, read_env, wait_for  # noqa: F401 (used by the fault tests)

VENV_BIN = Path(sys.executable).parent


# Where workers' cgroups are: every hierarchy's `astraeus` folder (runc makes a container's in all of them, also in
# those Astraeus does not manage: cpuacct, cpuset, blkio, name=systemd on a cgroup v1 host)
CGROUP_ROOTS = ("/sys/fs/cgroup/astraeus", "/sys/fs/cgroup/*/astraeus")


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def owner_of(state_dir: Path) -> str:
    """The runtime's owner tag for a state dir (astraeus.agent.runtime.process.ProcessRuntime.owner)."""
    return hashlib.sha1(os.path.realpath(state_dir).encode()).hexdigest()[:12]


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def marked(prefix: str) -> dict[int, str]:
    """Live pid -> value of every process with an environment entry starting with `prefix`."""
    want = prefix.encode()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        for item in _environ(int(name)):
            if item.startswith(want) and pid_alive(int(name)):
                out[int(name)] = item[len(want):].decode(errors="replace")
                break
    return out


def worker_procs(state_dir: Path) -> dict[int, str]:
    """pid -> "<worker>.<attempt>" for every live worker process of the agent with this state dir."""
    return marked(f"ASTRAEUS_WORKER_ID={owner_of(state_dir)}:")


def shim_procs(state_dir: Path) -> dict[int, str]:
    return marked(f"ASTRAEUS_SHIM_OWNER={owner_of(state_dir)}")


def reap(state_dir: Path) -> None:
    """Kill everything an agent with this state dir left running (shims first, then workers)."""
    for _ in range(3):
        for pid in list(shim_procs(state_dir)) + list(worker_procs(state_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
    # containers: runc's records, and with them the cgroups runc made in hierarchies Astraeus does not manage
    # (what the shims would have deleted at their end, and an agent's restart sweeps)
    runc_root = state_dir / "runc"
    if runc_root.is_dir() and shutil.which("runc"):
        listed = subprocess.run(["runc", "--root", str(runc_root), "list", "-q"], capture_output=True, text=True)
        for cid in listed.stdout.split():
            subprocess.run(["runc", "--root", str(runc_root), "delete", "--force", cid], capture_output=True)
    owner = owner_of(state_dir)
    _remove_networks(owner)
    end = time.time() + 5  # a killed process leaves its cgroup only once it has exited: retry until then
    while True:
        left = 0
        for root in [r for pattern in CGROUP_ROOTS for r in glob.glob(pattern)]:
            try:
                for d in os.listdir(root):
                    if d.startswith(owner + "-"):
                        try:
                            os.rmdir(os.path.join(root, d))
                        except OSError:
                            left += 1
            except OSError:
                pass
        if not left or time.time() > end:
            break
        time.sleep(0.1)


def _remove_networks(owner: str) -> None:
    """The workers' networks and the nftables table of a killed agent (what its next start or a clean exit removes)."""
    from astraeus.agent import network

    if network.unavailable() is not None:
        return
    nets = network.WorkerNetworks(owner)
    for name in nets.existing():
        try:
            nets.discard(name)
        except (OSError, network.NetworkError):
            pass
    try:
        nets.close_machine()
    except (OSError, network.NetworkError):
        pass


# ------------------------------------------------------------------------------------ processes


@dataclass
class Server:
    """`astraeus server` as a process the test may kill -9 and start again on the same home, port and database."""

    home: Path
    port: int
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    vars: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"  # a fleet network's gateway: agents in its namespaces reach the server there

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api(self) -> str:
        return self.vars["API"]

    def start(self, timeout: float = 60) -> Server:
        self.home.mkdir(parents=True, exist_ok=True)
        envf = self.home / "env"
        envf.unlink(missing_ok=True)
        log = open(self.home / "server.log", "ab")
        self.proc = subprocess.Popen([str(VENV_BIN / "astraeus"), "server", "--home", str(self.home), "--port",
                                      str(self.port), "--host", self.host], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"astraeus server exited {self.proc.returncode}: "
                                   f"{(self.home / 'server.log').read_text()[-3000:]}")
            if envf.exists() and "ASTRAEUS_SERVER" in envf.read_text():
                try:
                    if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                        new = read_env(envf)
                        # tokens of the first start stay valid: keep them, so clients and agents need no change
                        self.vars = {**new, **self.vars} if self.vars else new
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("astraeus server did not start: " + (self.home / "server.log").read_text()[-3000:])

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.api, headers={"Authorization": f"Bearer {token or self.vars['ASTRAEUS_TOKEN']}"},
                            timeout=30)

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=f"{self.url}/api/v1/o/acme",
                            headers={"Authorization": f"Bearer {self.vars['ASTRAEUS_ADMIN_TOKEN']}"}, timeout=30)


@dataclass
class AgentProc:
    """`astraeus agent` as a process the test may kill -9 and start again (same state dir: adoption)."""

    server_url: str
    token: str
    name: str
    state_dir: Path
    log_path: Path
    gpus: int = 8
    stop_grace: float = 2.0
    env: dict[str, str] = field(default_factory=dict)  # e.g. the runtime: tests.conftest.RuntimeChoice.env
    proc: subprocess.Popen | None = None
    netns: str | None = None  # the network namespace it runs in (Fleet.network), or the host's

    def start(self) -> AgentProc:
        env = dict(os.environ)
        env["ASTRAEUS_STOP_GRACE"] = str(self.stop_grace)
        env.update(self.env)
        log = open(self.log_path, "ab")
        argv = [str(VENV_BIN / "astraeus"), "agent", "--server", self.server_url, "--token", self.token, "--name",
                self.name, "--gpus", str(self.gpus), "--cpus", "256", "--memory-gib", "2048", "--state-dir",
                str(self.state_dir)]
        if self.netns:
            from astraeus.fleet.netns import exec_argv

            argv = exec_argv(self.netns, argv)  # nsenter execs the agent: self.proc.pid is the agent's
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # the agent alone: its workers' shims are in their own sessions
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()


class Fleet:
    """Servers and agents a test started; all stopped (and their workers killed) at the end."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.servers: list[Server] = []
        self.agents: list[AgentProc] = []
        self.networks: list = []  # astraeus.fleet.netns.Layout

    def network(self, machines: list[str]):
        """A bridge and one network namespace per machine, each with its own address (astraeus.fleet.netns):
        start the server with `host=layout.gateway` and each agent with `netns=layout.machine(name).netns`.
        Skips the test where namespaces cannot be made (not root, no iproute2)."""
        from astraeus.fleet import netns

        why = netns.unavailable()
        if why:
            pytest.skip(f"network namespaces: {why}")
        home = self.tmp / f"net{len(self.networks)}"
        netns.remove_leftovers(home)
        layout = netns.plan(home, machines, netns.networks_taken())
        self.networks.append(layout)
        netns.save(home, layout)
        netns.create(layout)
        return layout

    def server(self, env: dict | None = None, home: Path | None = None, host: str = "127.0.0.1") -> Server:
        e = dict(os.environ)
        e.update({"ASTRAEUS_HEARTBEAT": "1", "ASTRAEUS_SCHEDULE_INTERVAL": "2"})
        e.pop("ASTRAEUS_DATABASE_URL", None)
        e.update(env or {})
        s = Server(home=home or self.tmp / f"home{len(self.servers)}", port=free_port(), env=e, host=host)
        self.servers.append(s)
        return s.start()

    def agent(self, server: Server, name: str = "gpu-01", gpus: int = 8, stop_grace: float = 2.0,
              url: str | None = None, env: dict | None = None, netns: str | None = None) -> AgentProc:
        """An agent on `server`; `env` adds to its environment (default: the process runtime, whatever the machine
        would choose: these tests' runs name images no registry here serves); `netns`: run it in that network
        namespace (Fleet.network)."""
        a = AgentProc(url or server.url, server.vars["ASTRAEUS_MACHINE_TOKEN"], name, self.tmp / f"agent-{name}",
                      self.tmp / f"agent-{name}.log", gpus=gpus, stop_grace=stop_grace,
                      env=dict(env if env is not None else {"ASTRAEUS_RUNTIME": "process"}), netns=netns)
        self.agents.append(a)
        return a.start()

    def close(self) -> None:
        for a in self.agents:
            a.kill9()
        for a in self.agents:
            reap(a.state_dir)
        for s in self.servers:
            s.stop()
        if self.networks:
            from astraeus.fleet import netns

            for layout in self.networks:
                netns.destroy(layout)


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


# ---------------------------------------------------------------------------------------- a proxy


class Proxy:
    """A TCP proxy on 127.0.0.1 between an agent and the control plane. `cut()` closes every connection and
    refuses new ones (the agent sees the control plane unreachable); `heal()` lets traffic through again."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.open = True
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if not self.open:
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns |= {c, u}
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data or not self.open:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self.lock:
            self.conns -= {a, b}

    def cut(self) -> None:
        self.open = False
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def heal(self) -> None:
        self.open = True

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.sock.close()


# ------------------------------------------------------------------------------------------ runs


@contextlib.contextmanager
def cluster_on(runtime, prefix: str = "astraeus-", **kw):
    """A real `astraeus up` whose machine runs workers with the test's runtime (checked), its home NOT under /tmp
    (so that hiding it is what keeps it from the worker, not its private /tmp); `kw` goes to start_cluster."""
    import tempfile

    from tests.conftest import start_cluster

    top = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    c = start_cluster(top / "home", env=runtime.env, **kw)
    c.image = runtime.image
    try:
        with c.client() as cl:
            machines_run(cl, runtime.kind)
        yield c
    finally:
        c.stop()
        shutil.rmtree(top, ignore_errors=True)


def machines_run(client: httpx.Client, kind: str, n: int = 1) -> list[dict]:
    """Wait until `n` machines are listed and check that each runs workers with the runtime asked for ("process",
    or "container (runc …)"): a container variant of a test must not pass on the process runtime."""
    ms = wait_for(lambda: (items := client.get("/machines").json()["items"]) and len(items) >= n and items,
                  timeout=60, what=f"{n} machine(s) registered")
    assert all((m.get("runtime") or "").split(" ")[0] == kind for m in ms), [m.get("runtime") for m in ms]
    return ms


def sleeper_run(name: str, *, gpus: int = 1, priority: int = 0, restart: str = "OnFailure", code: str | None = None,
                max_restarts: int = 10, env: dict | None = None, names: list[str] | None = None,
                image: str = "python:3.11") -> dict:
    """A light worker: a python process printing a counter every half second (or `code`). `image`: what the
    container runtime runs it from (tests.conftest.RuntimeChoice.image); the process runtime runs `python` on the
    host whatever the image."""
    code = code or ("import time\ni = 0\nwhile True:\n    print(i, flush=True)\n    i += 1\n    time.sleep(0.5)\n")
    rr: dict = {"cpu_cores": 1, "memory_bytes": 1 << 28, "gpu_requests": {"count": gpus}}
    if names:
        rr["node_selection"] = {"mode": "Names", "names": names}
    return {"metadata": {"name": name}, "spec": {"priority": priority, "task_template": {
        "image": image, "command": "python", "args": ["-c", code], "env": env or {},
        "restart_policy": restart, "max_restarts": max_restarts, "requested_resources": rr}}}


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def postgres_url() -> str:
    """A fresh database on the local PostgreSQL (dropped with drop_postgres)."""
    import uuid

    import psycopg

    name = "astraeus_faults_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def drop_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
