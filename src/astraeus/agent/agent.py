"""The machine agent.

Entry point for `astraeus agent` (src/astraeus/main.py wires typer to it):

    run_agent(server: str, token: str, name: str, gpus: int | None = None, cpu_cores: float | None = None,
              memory_bytes: int | None = None, state_dir: str | None = None, stop_grace: float | None = None,
              labels: dict[str, str] | None = None, stop_workers_on_exit: bool = False,
              poll_wait: float = 30.0, image_map: ImageMap | None = None) -> None

blocks until SIGTERM/SIGINT. `server` is the control plane's base URL (http://127.0.0.1:8420; a URL that already
ends in /api/v1/agent works too), or several replicas' URLs, comma-separated; `token` a join token (an admin's machine token) or this machine's
credential. gpus=None → NVML's count (0 without NVML); gpus=N → N simulated GPUs. cpu_cores/memory_bytes
default to the machine's. state_dir, stop_grace and image_map default to the environment's (astraeus.settings.AgentSettings: $ASTRAEUS_STATE_DIR or $ASTRAEUS_HOME/agents/<name>,
$ASTRAEUS_STOP_GRACE or 30 s, $ASTRAEUS_IMAGE_MAP).

Runtime: `runtime_kind` ("auto", "container", "process"; `astraeus agent --runtime`, default $ASTRAEUS_RUNTIME or
auto) says how workers run; auto is container (each worker in its image, run by runc) on a machine with NVIDIA GPUs,
runc, skopeo and umoci installed and the agent running as root, else process (`choose_runtime`, pure; the facts are
found by `build_runtime`). The agent logs which it uses ("runtime: container (runc 1.1.5) (auto: …)") and
registers it, so the machine shows it. Asking for container where it cannot run raises RuntimeChoiceError, which
says what to install (`astraeus agent` exits 2 with it). A worker's registry credential comes with its assignment
(`registry_auth`) and goes to the runtime only; it is never logged.

Stop reasons: the agent passes the runtime why it stops a worker, which the worker reads from
ASTRAEUS_STOP_REASON_FILE before SIGTERM: the control plane's `stop_reason` (preempted, time limit, deleted, gang),
"no longer assigned to this machine", or "the machine is draining" (stop_workers_on_exit).

On exit the agent leaves its workers running (their shims keep supervising them; the next agent started with
the same state dir adopts them), unless stop_workers_on_exit (`--stop-workers-on-exit`, used by `astraeus up`
for local clusters): then every worker is stopped (SIGTERM, grace, SIGKILL) before it returns.

Credential: the agent registers with `token`; a join token is answered with the machine's own credential, which
the agent keeps in `<state_dir>/credential` (0600) and uses for everything after, and for registering again
(after a restart too). When the control plane does not know that credential (a new database), the agent joins
again with `token`; when an admin revoked it, the agent stays out (the machine goes Lost) until the file is
deleted. Workers are keyed by their identity (`Assignment.worker`, `<workspace ns>.<name>.<run uid>`), never by name
alone: a run deleted and submitted again under its name is another worker here, even while the old one stops.

Protocol: docs/api.md, "Agent API"; the bodies are the models of astraeus.protocol. The agent registers,
long-polls /assignments, reconciles, reports every worker's state on each change and at least every
heartbeat_seconds (POST /report), and ships log lines (POST /logs, batched, retried; the server dedups by
(worker, attempt, seq)). While the control plane is down it retries with backoff and keeps its workers as they
were last assigned.

Replicas: the agent talks to one replica at a time and moves to the next (logging "control plane URL not answering
(why); using URL") when a request to it fails with a connection error, a timeout or a 5xx. A failover restarts no
worker and does not register again (the replicas share one database); the next poll asks the new replica for the
whole desired state. Each answer to /assignments carries the scheduling leader's epoch: the agent records the
highest it has seen and ignores (with a log line) an answer made under an older one, unless every answer has been
older for EPOCH_BACK_AFTER seconds (the database went back): then it takes the older epoch, and says so.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import httpx
import psutil
from pydantic import ValidationError

from astraeus import protocol as P
from astraeus.agent.disk import EvictionWatch, disk_of, mark_evicted
from astraeus.agent.gpus import discover_gpus, nvml_gpus
from astraeus.agent.runtime.base import EXITED, START_FAILED, Runtime, StartFailed, WorkerStatus
from astraeus.agent.runtime.images import ImageMap
from astraeus.settings import AgentSettings

log = logging.getLogger("astraeus.agent")

# Why the agent itself stops a worker (ASTRAEUS_STOP_REASON_FILE); the control plane's reasons come with the
# assignment (Assignment.stop_reason).
NOT_ASSIGNED = "no longer assigned to this machine"
DRAINING = "the machine is draining"

LOG_BATCH = 2000
LOG_EVERY = 0.5  # a running worker's new lines are shipped within this many seconds (sooner when a batch is full)
# An older leader epoch than one seen is ignored; answered only that for this long, the agent takes it (the
# control plane's database went back: restored from a backup, or a standby that lagged promoted).
EPOCH_BACK_AFTER = 60.0
LOG_POST_BYTES = 1 << 20  # one POST /logs carries at most about this much text


def route_address(url: str) -> str | None:
    """The source address of this machine's route to the control plane at `url`: the address the control plane and
    the other machines reach it at, when no --address says otherwise. No packet is sent (a UDP connect only picks
    the route). None when the name does not resolve or there is no route."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect(sockaddr)
                return sock.getsockname()[0]
        except OSError:
            continue
    return None


def interface_of(address: str | None, interfaces: dict[str, list[str]]) -> str | None:
    """The network interface holding `address` ({interface: [its addresses]}), or None (pure)."""
    if not address:
        return None
    return next((name for name, addrs in sorted(interfaces.items()) if address in addrs), None)


def with_gang_interface(a: P.Assignment, address: str | None, own_network: bool = False) -> P.Assignment:
    """A gang's worker (its env has a rendezvous) talks to its peers over the interface holding this machine's
    registered address, or, with a network of its own (`own_network`), its only one (`eth0`, astraeus.agent.network):
    gloo and NCCL otherwise pick theirs from the hostname, which may resolve to loopback (or to an interface the
    other machines cannot reach), and hang. A run that sets GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME itself keeps its
    own."""
    if "ASTRAEUS_NODE_ADDRS" not in a.env:
        return a
    found = "eth0" if own_network else interface_of(address, {n: [x.address for x in xs]
                                                              for n, xs in psutil.net_if_addrs().items()})
    if found is None:
        return a
    env = dict(a.env)
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.setdefault(k, found)
    return a.model_copy(update={"env": env})


def nfs_ability_or_none() -> P.NfsAbility | None:
    """What this machine can do for drives across machines (astraeus.agent.nfs), or None if it cannot tell."""
    try:
        from astraeus.agent.nfs import nfs_ability
    except ImportError:
        return None
    try:
        return nfs_ability()
    except OSError as e:
        log.warning("cannot tell what NFS this machine has: %s", e)
        return None


class NeedsRegister(Exception):
    pass


class LogBatch(NamedTuple):
    """What Agent._collect_logs read: the lines, the log offsets and rate limits they move to once stored (by log
    key), whether more are waiting, and the attempts that were quiet (all their new lines fitted their share)."""

    lines: list[P.WorkerLogLine]
    offsets: dict[str, int]
    limits: dict[str, list]
    more: bool
    quiet: set[tuple[str, int]]


class LogsDeferred(httpx.HTTPStatusError):
    """The control plane refused a batch of log lines for now (429: too many being stored): none of it was stored,
    the lines stay unshipped (their offsets did not move), and they go again after `retry_after` seconds."""

    def __init__(self, response: httpx.Response):
        try:
            self.retry_after = min(60.0, max(0.1, float(response.headers.get("retry-after", "1"))))
        except ValueError:
            self.retry_after = 1.0
        super().__init__(f"log lines deferred by the control plane for {self.retry_after:g} s",
                         request=response.request, response=response)


RUNTIMES = ("auto", "container", "process")
CONTAINER_PACKAGES = {"runc": "runc", "skopeo": "skopeo", "umoci": "umoci"}  # tool -> Debian package


class RuntimeChoiceError(ValueError):
    """The runtime asked for cannot run here; str(e) says why and what to change."""


def choose_runtime(asked: str, tools_missing: list[str], nvidia_gpus: int, root: bool) -> tuple[str, str]:
    """Which runtime the agent uses, and why (pure: the caller finds the facts). `auto` is container when the
    container tools are installed, the machine has NVIDIA GPUs (NVML finds some) and the agent runs as root
    (runc needs it); else process. `container` asked for where it cannot run is an error naming what to do."""
    if asked not in RUNTIMES:
        raise RuntimeChoiceError(f"unknown runtime {asked!r}: use auto, container or process")
    if asked == "process":
        return "process", "asked for"
    if asked == "container":
        if tools_missing:
            pkgs = " ".join(CONTAINER_PACKAGES.get(t, t) for t in tools_missing)
            raise RuntimeChoiceError(
                f"the container runtime needs {', '.join(tools_missing)}, not found on PATH: install them "
                f"(Debian/Ubuntu: apt-get install {pkgs}), or use --runtime process")
        if not root:
            raise RuntimeChoiceError("the container runtime needs the agent to run as root (runc makes each "
                                     "worker's namespaces and mounts): start it as root, or use --runtime process")
        return "container", "asked for"
    if tools_missing:
        return "process", f"auto: {', '.join(tools_missing)} not installed"
    if nvidia_gpus <= 0:
        return "process", "auto: no NVIDIA GPU found"
    if not root:
        return "process", "auto: the agent does not run as root"
    return "container", f"auto: {nvidia_gpus} NVIDIA GPU(s) and the container tools found"


def worker_networks(runtime: Runtime, env: AgentSettings, servers: list[str]):
    """Each worker's own network (astraeus.agent.network), or None with the reason logged: the machine's network is
    asked for (ASTRAEUS_WORKER_NETWORK=host), the runtime makes no networks, or this machine cannot (not root, no
    iproute2 or nftables). Workers never reach the control plane's addresses."""
    from astraeus.agent import network

    if env.worker_network == "host" or not hasattr(runtime, "networks"):
        return None
    why = network.unavailable()
    if why:
        log.warning("workers share the machine's network: %s", why)
        return None
    blocked = set()
    for base in servers:
        host = urllib.parse.urlsplit(base).hostname or ""
        try:
            blocked |= {i[4][0] for i in socket.getaddrinfo(host, None, socket.AF_INET)}
        except OSError:
            pass
    policy = network.Policy(egress=env.worker_egress, blocked=tuple(sorted(blocked)),
                            allowed=tuple(env.worker_egress_allow))
    return network.WorkerNetworks(runtime.owner, policy)


def runtime_label(runtime: Runtime) -> str:
    """What the machine says it runs workers with: "container (runc 1.1.5)" or "process"."""
    if type(runtime).__name__ == "ContainerRuntime":
        from astraeus.agent.runtime.container import runc_version

        version = runc_version()
        return f"container ({version})" if version else "container"
    return "process"


def build_runtime(asked: str, state_dir: str, stop_grace: float, env: AgentSettings,
                  image_map: ImageMap | None = None) -> tuple[Runtime, str]:
    """The runtime `asked` ("auto", "container", "process") resolves to here, and why; RuntimeChoiceError when
    it cannot run."""
    from astraeus.agent.runtime.container import container_tools_missing, make_runtime

    missing = container_tools_missing()
    gpus = 0
    if asked == "auto" and not missing:
        found = nvml_gpus()
        gpus = found.count if found else 0
    kind, why = choose_runtime(asked, missing, gpus, os.geteuid() == 0)
    kw = {}
    if kind == "container":
        kw = {"image_cache_dir": str(env.image_cache_dir) if env.image_cache_dir else None,
              "image_cache_bytes": env.image_cache_bytes, "insecure_registries": list(env.insecure_registries),
              "shm_bytes": env.worker_shm_bytes}
    try:
        rt = make_runtime(kind, state_dir, stop_grace, image_map=image_map or env.images(), **kw)
    except ValueError as e:
        raise RuntimeChoiceError(str(e)) from None
    return rt, why


class Backoff:
    def __init__(self, first: float = 0.2, cap: float = 10.0):
        self.first, self.cap, self.n = first, cap, 0

    def reset(self) -> None:
        self.n = 0

    def next(self) -> float:
        d = min(self.cap, self.first * (2 ** self.n))
        self.n = min(self.n + 1, 20)
        return d * (0.75 + random.random() / 2)


class Agent:
    def __init__(self, server: str, token: str, name: str, *, runtime: Runtime | None = None, gpus: int | None = None,
                 cpu_cores: float | None = None, memory_bytes: int | None = None, state_dir: str | None = None,
                 stop_grace: float | None = None, labels: dict[str, str] | None = None,
                 stop_workers_on_exit: bool = False, poll_wait: float = 30.0, image_map: ImageMap | None = None,
                 runtime_kind: str | None = None, address: str | None = None,
                 shared_filesystems: dict[str, str] | None = None):
        self.servers = agent_bases(server)  # the control plane's replicas: one is used at a time
        self.server_lock = threading.Lock()
        self.current = 0  # index in self.servers of the replica in use
        self.epoch = 0  # the highest scheduling leader epoch seen in an answer
        self.older_since: float | None = None  # since when every answer's epoch has been below self.epoch
        self.epoch_back_after = EPOCH_BACK_AFTER
        self.failovers = 0
        self.token = token  # the join token (or this machine's credential, given as is)
        self.name = name
        env = AgentSettings.load() if state_dir is None or stop_grace is None or runtime is None else None
        self.state_dir = os.path.abspath(state_dir or env.state_dir_for(name))
        os.makedirs(self.state_dir, exist_ok=True)
        self.credential_path = os.path.join(self.state_dir, "credential")
        self.credential: str | None = self._load_credential()
        self.ship_lock = threading.Lock()  # the log and report threads both ship lines
        self.stop_grace = env.stop_grace if stop_grace is None else float(stop_grace)
        self.log_rate = (env or AgentSettings.load()).log_lines_per_second  # per worker: the rest are dropped
        self.log_limits: dict[str, list] = {}  # attempt's log key -> [second, shipped in it, dropped, seq, time]
        self.lines_in_report = True  # an ended attempt's last lines go in its report (False: an older control plane)
        self.disk_in_report = True  # its state dir's filesystem goes in each report (False: an older control plane)
        # The control plane refused a batch (429) until this time (monotonic): meanwhile only the attempts that were
        # quiet in the last round (all their new lines fitted their share) ship, each LOG_EVERY, in small batches
        # it admits while busy storing floods (routers/agent.py: the small lane)
        self.logs_deferred_until = 0.0
        self.quiet_attempts: set[tuple[str, int]] = set()
        why = "given"
        if runtime is None:
            runtime, why = build_runtime(runtime_kind or env.runtime, self.state_dir, self.stop_grace, env, image_map)
            runtime.networks = worker_networks(runtime, env, self.servers)
        self.runtime = runtime
        self.runtime_name = runtime_label(self.runtime)
        log.info("runtime: %s (%s)", self.runtime_name, why)
        self.gpus = discover_gpus(gpus)
        self.cpu_cores = float(cpu_cores if cpu_cores is not None else (os.cpu_count() or 1))
        self.memory_bytes = int(memory_bytes if memory_bytes is not None else psutil.virtual_memory().total)
        self.labels = dict(labels or {})
        self.address = address  # None: the source address of the route to the control plane, found at each join
        self.shared_filesystems = dict(shared_filesystems or {})
        self.registered_address: str | None = address  # what the last join declared
        self.stop_workers_on_exit = stop_workers_on_exit
        self.poll_wait = poll_wait

        self.heartbeat_seconds = 5.0
        self.cluster: str | None = None
        self.registered = threading.Event()
        self.stopping = threading.Event()
        self.wake_reconcile = threading.Event()
        self.wake_report = threading.Event()
        self.wake_logs = threading.Event()
        self.lock = threading.RLock()
        self.version = 0
        self.assignments: dict[tuple[str, int], P.Assignment] | None = None  # None until the first answer
        self.synthetic: dict[tuple[str, int], WorkerStatus] = {}  # states without a runtime record
        self.starting: set[tuple[str, int]] = set()
        self.reported_final: set[tuple[str, int]] = set()
        self.last_states: dict[tuple[str, int], tuple] = {}
        self.offsets_path = os.path.join(self.state_dir, "log-offsets.json")
        self.log_offsets: dict[str, int] = self._load_offsets()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agent-start")
        self.threads: list[threading.Thread] = []
        self.exit_requested = threading.Event()
        self.draining = False  # set on shutdown: start nothing new
        # Drives across machines (astraeus.agent.nfs): the exports the control plane last gave (None: none yet),
        # applied by the exports thread; the drives mounted from other machines for this machine's workers.
        self.exports_wanted: list[P.Export] | None = None
        self.wake_exports = threading.Event()
        self.exporter = None  # astraeus.agent.nfs.Exports, made by the exports thread
        self.nfs_mounts = None  # astraeus.agent.nfs.NfsMounts, made at the first worker with an NFS drive

    # ------------------------------------------------------------ http
    @property
    def base(self) -> str:
        """The agent API of the replica in use (http://cp-host:8420/api/v1/agent)."""
        return self.servers[self.current]

    def failover(self, e: Exception) -> bool:
        """A request failed with `e`: when it says the replica it went to is not answering (a connection error, a
        timeout, a 5xx) and that replica is still the one in use, move to the next replica; True when moved.
        Nothing else changes: the machine stays registered (every replica shares the database) and its workers
        run on; the next poll asks the new replica for the whole desired state."""
        if len(self.servers) < 2 or not not_answering(e):
            return False
        failed = self._replica_of(e)
        with self.server_lock:
            if failed != self.servers[self.current]:
                return False  # another thread moved already
            self.current = (self.current + 1) % len(self.servers)
            self.failovers += 1
            now = self.servers[self.current]
        with self.lock:
            self.version = 0
        log.warning("control plane %s not answering (%s); using %s", root_url(failed), why_not(e), root_url(now))
        return True

    def _replica_of(self, e: Exception) -> str:
        try:
            url = str(e.request.url)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            return self.base
        return next((b for b in self.servers if url.startswith(b + "/") or url == b), self.base)

    def take_epoch(self, epoch: int | None) -> bool:
        """Whether to use an answer made under scheduling leader `epoch`: not when a newer epoch was seen (a
        replica that lost the lead, or an answer read before the new leader took it). Records the highest."""
        if epoch is None:
            return True
        with self.server_lock:
            seen = self.epoch
            if epoch < seen:
                now = time.monotonic()
                self.older_since = self.older_since or now
                if now - self.older_since < self.epoch_back_after:
                    log.warning("ignoring assignments from %s made under leader epoch %d: epoch %d was seen already",
                                root_url(self.base), epoch, seen)
                    return False
                # Not a stale replica: the database itself went back (restored, or a lagging standby promoted).
                log.warning("the control plane's leader epoch has been %d, below the %d seen, for %.0f s: taking it "
                            "(was its database restored, or a standby promoted?)", epoch, seen, now - self.older_since)
            self.epoch = epoch
            self.older_since = None
        if seen and epoch > seen:
            log.info("scheduling leader epoch %d (was %d)", epoch, seen)
        return True

    def _client(self, timeout: float = 15.0) -> httpx.Client:
        return httpx.Client(auth=self._auth, timeout=timeout)

    def _auth(self, request: httpx.Request) -> httpx.Request:
        """Every call but a join carries the machine's credential (the one current when it is sent)."""
        if "Authorization" not in request.headers:
            request.headers["Authorization"] = f"Bearer {self.credential or self.token}"
        return request

    def _load_credential(self) -> str | None:
        try:
            with open(self.credential_path) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def _save_credential(self, secret: str | None) -> None:
        if secret is None:
            try:
                os.unlink(self.credential_path)
            except FileNotFoundError:
                pass
        else:
            tmp = self.credential_path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
            os.replace(tmp, self.credential_path)
        self.credential = secret

    def _post(self, client: httpx.Client, path: str, body: P.Body, omit_none: tuple[str, ...] = ()) -> dict:
        """POST `body`; the fields in `omit_none` are left out when None (a control plane older than them takes the
        body without them)."""
        payload = body.model_dump(mode="json")
        for k in omit_none:
            if payload.get(k) is None:
                payload.pop(k, None)
        r = client.post(self.base + path, json=payload)
        if r.status_code in (401, 403, 404, 409):
            if path != "/register":
                self.registered.clear()
                raise NeedsRegister(f"{path}: {r.status_code} {r.text[:200]}")
        r.raise_for_status()
        return r.json() if r.content else {}

    def register(self, client: httpx.Client) -> None:
        body = P.Register(name=self.name, gpus=self.gpus.count, gpu_models=self.gpus.models,
                          cpu_cores=self.cpu_cores, memory_bytes=self.memory_bytes,
                          stop_grace_seconds=self.stop_grace, labels=self.labels, runtime=self.runtime_name,
                          address=self.address or route_address(self.base),
                          shared_filesystems=self.shared_filesystems, nfs=nfs_ability_or_none(),
                          disk=disk_of(self.state_dir))
        self.credential = self._load_credential()  # deleting the file is how an operator makes it join again
        payload = body.model_dump(mode="json")
        r = client.post(self.base + "/register", json=payload)
        if r.status_code == 422:  # a control plane older than these fields (0005, 0006): they are left out
            newer = ("runtime", "address", "shared_filesystems", "nfs", "disk")
            if any(k in r.text for k in newer):
                for k in newer:
                    payload.pop(k, None)
                self.disk_in_report = False  # nor in its reports (agent/disk.py)
                r = client.post(self.base + "/register", json=payload)
        if self.credential and r.status_code in (401, 403):
            if _code(r) == "CREDENTIAL_REVOKED":
                log.error("this machine's credential was revoked (%s); delete %s to join again", _message(r),
                          self.credential_path)
                raise NeedsRegister(f"/register: {r.status_code} {_message(r)}")
            log.warning("the control plane does not take this machine's credential (%s); joining again with the "
                        "join token", _message(r))
            self._save_credential(None)
            r = client.post(self.base + "/register", json=payload)
        if r.status_code in (401, 403, 409):
            log.error("registering %s refused: %s %s", self.name, r.status_code, _message(r))
            raise NeedsRegister(f"/register: {r.status_code} {_message(r)}")
        r.raise_for_status()
        ans = P.Registered.model_validate(r.json())
        self.registered_address = body.address
        if ans.credential:
            self._save_credential(ans.credential)
        self.heartbeat_seconds = ans.heartbeat_seconds
        self.cluster = ans.cluster
        with self.lock:
            self.version = 0  # ask for the whole desired state at once
        self.registered.set()
        log.info("registered %s in cluster %s (%d GPUs, %s; address %s)", self.name, self.cluster, self.gpus.count,
                 self.gpus.source, body.address or "unknown")
        self.wake_report.set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the agent is stopping; True when it is."""
        return self.stopping.wait(seconds)

    # ------------------------------------------------------------ threads
    def poll_loop(self) -> None:
        backoff = Backoff()
        # A long-poll is answered after at most poll_wait: 5 s more without an answer is a replica not answering
        # (paused, or cut off), and the agent moves on.
        with self._client(timeout=self.poll_wait + 5) as client:
            while not self.stopping.is_set():
                try:
                    if not self.registered.is_set():
                        credential = self.credential
                        self.register(client)
                        if self.credential != credential:  # joined afresh (a new database?): its epochs start anew
                            with self.server_lock:
                                self.epoch = 0
                    with self.lock:
                        after = self.version
                    r = client.get(self.base + "/assignments",
                                   params={"machine": self.name, "after": after, "wait": self.poll_wait})
                    if r.status_code in (401, 403, 404, 409):
                        self.registered.clear()
                        raise NeedsRegister(f"/assignments: {r.status_code}")
                    r.raise_for_status()
                    data = P.Assignments.model_validate(r.json())
                    if not self.take_epoch(data.epoch):
                        if self._sleep(backoff.next()):
                            return
                        continue
                    self.set_assignments(data.version, data.assignments, data.exports)
                    backoff.reset()
                except NeedsRegister as e:
                    log.warning("control plane does not know this machine (%s); registering again", e)
                    if self._sleep(backoff.next()):
                        return
                except ValidationError as e:  # before ValueError, which it is
                    # Where and what only: pydantic's own text quotes the input, which may hold a registry password.
                    where = "; ".join(f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
                                      for err in e.errors()[:5])
                    log.error("the control plane's answer does not fit this agent's protocol (%s); is one of them "
                              "a different version? retrying", where)
                    if self._sleep(backoff.next()):
                        return
                except (httpx.HTTPError, ValueError) as e:
                    if not self.failover(e):
                        log.warning("control plane unreachable (%s); retrying", e)
                    if self._sleep(backoff.next()):
                        return

    def set_assignments(self, version: int, items: list[P.Assignment], exports: list[P.Export] | None = None) -> None:
        new = {a.key: a for a in items}
        with self.lock:
            self.version = version
            self.assignments = new
            if exports is not None:
                self.exports_wanted = list(exports)
        self.wake_reconcile.set()
        if exports is not None:
            self.wake_exports.set()

    def exports_loop(self) -> None:
        """Make this machine's NFS exports what the control plane last said (in this thread: a slow NFS server
        never holds up polling or reconciling); retried with backoff when it fails."""
        from astraeus.agent.nfs import ExportError, Exports

        applied = None
        backoff = Backoff(first=1.0, cap=30.0)
        try:
            self.exporter = Exports(self.state_dir)  # stops a server a crashed agent left behind
        except (OSError, ValueError) as e:
            log.error("drives kept here cannot be exported: %s", e)
        while not self.stopping.is_set():
            self.wake_exports.wait(1.0)
            self.wake_exports.clear()
            with self.lock:
                wanted = self.exports_wanted
            if wanted is None or self.stopping.is_set() or self.exporter is None:
                continue
            if applied and not self.exporter.running():
                log.warning("the NFS server exited; starting it again")
                applied = None
            sig = [e.model_dump(mode="json") for e in wanted]
            if sig == applied:
                continue
            try:
                problems = self.exporter.apply(wanted)
                applied = sig
                backoff.reset()
                for drive, why in problems.items():
                    log.warning("drive %s is not exported: %s", drive, why)
            except (ExportError, OSError) as e:
                log.warning("cannot apply this machine's NFS exports (%s); retrying", e)
                if self._sleep(backoff.next()):
                    return
                self.wake_exports.set()

    def _nfs_needed(self) -> set[str]:
        """The drives mounted from other machines that a worker here still needs (starting or not ended)."""
        with self.lock:
            assigned = dict(self.assignments or {})
        starting = set(self.starting)
        live = {k for k, st in self.statuses().items() if not st.final}
        return {t for k, a in assigned.items() if k in starting or k in live for t in self.nfs_mounts.targets(a)}

    def reconcile_loop(self) -> None:
        while not self.stopping.is_set():
            self.wake_reconcile.wait(0.5)
            self.wake_reconcile.clear()
            if self.stopping.is_set():
                return
            try:
                self.reconcile()
            except Exception:  # noqa: BLE001
                log.exception("reconcile failed")

    def event_loop(self) -> None:
        """A worker started or ended: report it (with its last lines) and reconcile now, not at the next poll.
        The report thread is woken here, not by the reconcile that finds the change (one thread hop less between
        a worker's exit and the control plane knowing it); a report marks what it sent as seen, so that reconcile
        does not send the same states again. The poll stays as the fallback. The log thread is not woken: an ended
        attempt's last lines go with its report, and a running one's lines are shipped at the log thread's own
        pace (LOG_EVERY); waking it at each start and exit sent the lines of quick workers in a request of their
        own (a third of an agent's requests for 200 trivial runs)."""
        while not self.stopping.is_set():
            try:
                if self.runtime.wait_event(1.0):
                    self.wake_report.set()
                    self.wake_reconcile.set()
            except OSError:
                log.exception("waiting for worker events failed; relying on the poll")
                self._sleep(5)

    def statuses(self) -> dict[tuple[str, int], WorkerStatus]:
        out = {st.key: st for st in self.runtime.list()}
        with self.lock:
            for k, st in self.synthetic.items():
                out.setdefault(k, st)
        return out

    def reconcile(self) -> None:
        if self.draining:
            return
        with self.lock:
            assigned = None if self.assignments is None else dict(self.assignments)
        statuses = self.statuses()
        if assigned is not None and self._adopt_older(assigned, statuses):
            statuses = self.statuses()
        if assigned is not None:
            live_workers = {k[0] for k, st in statuses.items() if not st.final}
            for key, a in assigned.items():
                st = statuses.get(key)
                if a.desired == "Running":
                    if st is None and key not in self.starting:
                        if key[0] in live_workers:
                            continue  # another attempt of this worker is still stopping: one at a time
                        self.starting.add(key)
                        live_workers.add(key[0])
                        self.pool.submit(self._start, a)
                else:
                    if st is None and key not in self.starting:
                        with self.lock:
                            self.synthetic[key] = WorkerStatus(key[0], key[1], EXITED,
                                                               message="stopped before it started",
                                                               finished_at=time.time())
                    elif st is not None and not st.final and not st.stopping:
                        log.info("stopping %s attempt %s (%s)", key[0], key[1], a.stop_reason or "desired Stopped")
                        self.runtime.stop(key[0], key[1], grace=self.stop_grace, wait=False,
                                          reason=a.stop_reason or "stopped by the control plane")
            for key, st in statuses.items():
                if key not in assigned and not st.final and not st.stopping and key not in self.starting:
                    log.info("stopping %s attempt %s: no longer assigned here", *key)
                    self.runtime.stop(key[0], key[1], grace=self.stop_grace, wait=False,
                                      reason=NOT_ASSIGNED)
            self._collect_garbage(assigned, statuses)
            if self.nfs_mounts is not None:
                self.nfs_mounts.release(self._nfs_needed, self.pool.submit)
        changed = False
        for key, st in statuses.items():
            sig = (st.state, st.pid, st.exit_code, st.signal, st.message)
            if self.last_states.get(key) != sig:
                self.last_states[key] = sig
                changed = True
        if changed:
            self.wake_report.set()  # with the last lines of what ended (the log thread keeps its own pace)

    def _adopt_older(self, assigned: dict, statuses: dict) -> bool:
        """An attempt an older agent started under its older identity (`<ns>.<name>`) is the assigned attempt of
        that ns, name and attempt: adopted under the assigned identity instead of being stopped and started again.
        One asked to stop is not (it belongs to a deleted run the same name was submitted again as)."""
        adopted = False
        for key in assigned:
            old = (P.older_identity(key[0]), key[1])
            st = statuses.get(old)
            if old == key or key in statuses or st is None or st.stopping:
                continue
            if self.runtime.adopt_as(old[0], old[1], key[0]):
                log.info("adopted %s attempt %s as %s", old[0], old[1], key[0])
                adopted = True
        return adopted

    def _start(self, a: P.Assignment) -> None:
        key = a.key
        try:
            if any(m.nfs is not None for m in a.mounts):  # drives kept on other machines: mounted here first
                from astraeus.agent.nfs import NfsMountError, NfsMounts

                with self.lock:
                    if self.nfs_mounts is None:
                        self.nfs_mounts = NfsMounts(self.state_dir)
                try:
                    a = self.nfs_mounts.local(a)
                except NfsMountError as e:
                    raise StartFailed(str(e)) from None
            own = a.network == "isolated" and getattr(self.runtime, "networks", None) is not None
            a = with_gang_interface(a, self.registered_address, own)
            st = self.runtime.start(a)
            log.info("started %s attempt %s: pid %s in %s", key[0], key[1], st.pid, st.environment)
        except StartFailed as e:
            log.warning("could not start %s attempt %s: %s", key[0], key[1], e)
            if self.runtime.status(*key) is None:
                with self.lock:
                    self.synthetic[key] = WorkerStatus(key[0], key[1], START_FAILED, message=str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("could not start %s attempt %s", *key)
            with self.lock:
                self.synthetic[key] = WorkerStatus(key[0], key[1], START_FAILED, message=f"agent error: {e}")
        finally:
            self.starting.discard(key)
            self.wake_reconcile.set()
            self.wake_report.set()

    def _collect_garbage(self, assigned: dict, statuses: dict) -> None:
        """Forget ended attempts once they are unassigned, reported and their logs shipped."""
        for key, st in statuses.items():
            if key in assigned or not st.final or key not in self.reported_final:
                continue
            with self.lock:
                synthetic = self.synthetic.pop(key, None)
            if synthetic is not None and self.runtime.status(*key) is None:
                continue
            lk = self._log_key(key)
            pending, _ = self.runtime.read_logs(key[0], key[1], self.log_offsets.get(lk, 0), limit=1)
            if pending:
                continue  # logs not shipped yet
            self.runtime.forget(*key)
            self.log_offsets.pop(lk, None)
            self.log_limits.pop(lk, None)
            self.reported_final.discard(key)
            self.last_states.pop(key, None)

    def report_loop(self) -> None:
        backoff = Backoff()
        with self._client() as client:
            while not self.stopping.is_set():
                if not self.registered.wait(0.5):
                    continue
                self.wake_report.wait(self.heartbeat_seconds)
                self.wake_report.clear()
                if self.stopping.is_set():
                    return
                time.sleep(0.01)  # debounce bursts
                try:
                    self.send_report(client)
                    backoff.reset()
                except NeedsRegister:
                    self._sleep(backoff.next())
                except (httpx.HTTPError, ValueError) as e:
                    if not self.failover(e):
                        log.warning("report failed (%s); retrying", e)
                    self.wake_report.set()
                    self._sleep(backoff.next())

    def send_report(self, client: httpx.Client) -> None:
        """Every attempt's state. An attempt that ended since the last report has its last lines stored first (its
        end may release it from this machine): sent in the report itself when they fit one request (one round trip
        per exit, not two), else shipped before it; a control plane that takes no lines in a report (older than
        the field: 422) gets them shipped before it too."""
        statuses = self.statuses()
        ended = {k for k, st in statuses.items() if st.final and k not in self.reported_final}
        workers = mark_evicted(self.runtime, [st.report() for st in sorted(statuses.values(), key=lambda s: s.key)])
        with self.ship_lock:
            tail = None  # the ended attempts' last lines, and the offsets they move to once stored
            for _ in range(10):
                if not ended:
                    break
                tail = self._collect_logs(ended)
                lines, more = tail.lines, tail.more
                if not more and (not lines or self.lines_in_report and
                                 sum(len(ln.text) + 100 for ln in lines) < LOG_POST_BYTES):
                    break
                self._post_logs(client, tail)  # too many for one request: ahead of the report, as they come
                tail = None
                if not more:
                    break
            body = P.Report(machine=self.name, workers=workers, lines=tail.lines if tail is not None and tail.lines else None,
                            disk=disk_of(self.state_dir) if self.disk_in_report else None)
            try:
                self._post(client, "/report", body, omit_none=("lines", "disk"))
            except httpx.HTTPStatusError as e:
                if body.lines is None or e.response.status_code != 422 or "lines" not in e.response.text:
                    raise
                self.lines_in_report = False  # an older control plane: ship them first, from now on
                log.info("the control plane takes no log lines in a report; shipping them before it")
                self._post_logs(client, tail)
                self._post(client, "/report", P.Report(machine=self.name, workers=workers))
            else:
                if tail is not None:
                    self._logs_stored(tail)
        self.reported_final.update(k for k, st in statuses.items() if st.final)
        for key, st in statuses.items():  # sent: a reconcile that finds these states has nothing new to report
            if not st.final or key in self.reported_final:  # (not one reconcile forgot meanwhile)
                self.last_states[key] = (st.state, st.pid, st.exit_code, st.signal, st.message)

    def log_loop(self) -> None:
        backoff = Backoff()
        with self._client() as client:
            while not self.stopping.is_set():
                self.wake_logs.wait(LOG_EVERY)
                self.wake_logs.clear()
                if not self.registered.is_set():
                    continue
                try:
                    more = self.ship_logs(client)
                    backoff.reset()
                    if more:
                        self.wake_logs.set()
                except NeedsRegister:
                    self._sleep(backoff.next())
                except LogsDeferred as e:  # the control plane is busy storing others' lines: as long as it says,
                    log.debug("%s", e)  # the quiet attempts' lines alone, at the usual pace
                    self.logs_deferred_until = time.monotonic() + e.retry_after
                except (httpx.HTTPError, ValueError) as e:
                    if not self.failover(e):
                        log.warning("log shipping failed (%s); retrying", e)
                    self._sleep(backoff.next())

    @staticmethod
    def _log_key(key: tuple[str, int]) -> str:
        return f"{key[0]}.{key[1]}"

    def _load_offsets(self) -> dict[str, int]:
        try:
            with open(self.offsets_path) as f:
                return {str(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save_offsets(self) -> None:
        tmp = self.offsets_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.log_offsets, f)
        os.replace(tmp, self.offsets_path)

    def ship_logs(self, client: httpx.Client, only: set[tuple[str, int]] | None = None) -> bool:
        """Send one batch of new lines from every attempt (or those in `only`); True when more are waiting."""
        with self.ship_lock:
            return self._ship_logs(client, only)

    def _ship_logs(self, client: httpx.Client, only: set[tuple[str, int]] | None) -> bool:
        if only is None and time.monotonic() < self.logs_deferred_until:
            if not self.quiet_attempts:
                return False
            # a batch was refused: the quiet ones alone, those still quiet (one that floods now waits with the rest)
            batch = self._collect_logs(set(self.quiet_attempts))
            self.quiet_attempts = batch.quiet
            self._post_logs(client, batch, quiet_only=True)
            return False  # the rest waits for the refusal's Retry-After
        batch = self._collect_logs(only)
        if only is None:
            self.quiet_attempts = batch.quiet
        self._post_logs(client, batch)
        return batch.more

    def _collect_logs(self, only: set[tuple[str, int]] | None) -> LogBatch:
        """One batch of new lines from every attempt (or those in `only`): the lines, the log offsets and rate
        limits once they are stored, whether more are waiting, and the attempts that were quiet (all their new
        lines fitted their share). Without `only`, an attempt that ended and is not reported yet is left to the
        report, which carries its last lines (send_report). Each attempt first gets its share of the batch
        (LOG_BATCH / attempts), then those with more take what is left, in turn: a quiet worker's lines never
        wait behind a flooding neighbour's backlog."""
        lines: list[P.WorkerLogLine] = []
        new_offsets: dict[str, int] = {}
        new_limits: dict[str, list] = {}
        read = 0
        attempts = []
        for st in self.runtime.list():
            if only is not None and st.key not in only:
                continue
            if only is None and st.final and st.key not in self.reported_final and self.lines_in_report:
                self.wake_report.set()
                continue
            attempts.append(st)

        def take(st, want: int) -> bool:
            """Up to `want` lines of one attempt; True when it has more."""
            nonlocal lines, read
            lk = self._log_key(st.key)
            start = new_offsets.get(lk, self.log_offsets.get(lk, 0))
            batch, end = self.runtime.read_logs(st.worker, st.attempt, start, limit=want)
            limit = new_limits.get(lk) or self.log_limits.get(lk, [0, 0, 0, 0, 0.0])
            if batch or end != start or limit[2]:
                read += len(batch)
                new_limits[lk] = list(limit)
                lines += self._rate_limited(st.worker, st.attempt, batch, new_limits[lk], at_end=len(batch) < want)
                new_offsets[lk] = end
            return len(batch) >= want

        share = max(1, LOG_BATCH // max(1, len(attempts)))
        behind = [st for st in attempts if take(st, share)]
        more = False
        for st in behind:
            if read >= LOG_BATCH:
                more = True
                break
            more = take(st, LOG_BATCH - read) or more
        late = {st.key for st in behind}
        return LogBatch(lines, new_offsets, new_limits, more, {st.key for st in attempts if st.key not in late})

    def _post_logs(self, client: httpx.Client, batch: LogBatch, quiet_only: bool = False) -> None:
        """POST /logs a batch of _collect_logs, then note its offsets. The quiet attempts' lines go first, in
        posts of their own (small ones, which the control plane admits while it is busy storing a flood: a worker
        that prints a little is not held up by a neighbour that floods), their offsets noted once stored. With
        `quiet_only` (while deferred), only those: the others' offsets stay, their lines are read again later."""
        quiet = {self._log_key(k) for k in batch.quiet}
        first = [ln for ln in batch.lines if self._log_key((ln.worker, ln.attempt)) in quiet]
        rest = batch.lines
        if quiet_only or (first and len(first) < len(batch.lines)):
            if first:
                self._post_log_parts(client, first)
            self._logs_stored(batch, quiet)
            if quiet_only:
                return
            rest = [ln for ln in batch.lines if self._log_key((ln.worker, ln.attempt)) not in quiet]
        self._post_log_parts(client, rest)
        self._logs_stored(batch)

    def _post_log_parts(self, client: httpx.Client, lines: list[P.WorkerLogLine]) -> None:
        part: list[P.WorkerLogLine] = []
        size = 0
        for ln in lines:  # bounded posts: a flood of long lines is several, each about LOG_POST_BYTES
            part.append(ln)
            size += len(ln.text) + 100
            if size >= LOG_POST_BYTES:
                self._post_log_part(client, part)
                part, size = [], 0
        if part:
            self._post_log_part(client, part)

    def _post_log_part(self, client: httpx.Client, part: list[P.WorkerLogLine]) -> None:
        """POST /logs one part of a batch; a 429 raises LogsDeferred. A part stored before a later one was refused
        is sent again with the rest: the control plane stores a line once (worker, attempt, seq)."""
        try:
            self._post(client, "/logs", P.Logs(machine=self.name, lines=part))
        except httpx.HTTPStatusError as e:
            if e.response.status_code == 429:
                raise LogsDeferred(e.response) from None
            raise

    def _logs_stored(self, batch: LogBatch, keys: set[str] | None = None) -> None:
        """Note the offsets (and rate limits) a stored batch moves to: all of them, or those of the log keys in
        `keys`."""
        offsets = batch.offsets if keys is None else {k: v for k, v in batch.offsets.items() if k in keys}
        if offsets:
            self.log_offsets.update(offsets)
            self.log_limits.update(batch.limits if keys is None else
                                   {k: v for k, v in batch.limits.items() if k in keys})
            self._save_offsets()

    def _rate_limited(self, worker: str, attempt: int, batch, state: list, at_end: bool) -> list[P.WorkerLogLine]:
        """The lines of one attempt's batch to ship: at most log_rate per second of the lines' own times. The
        rest are dropped, and one line says how many, at the next second's first line or at the end of what
        the worker has written so far (so a flood adds at most one such line a second)."""

        def dropped() -> P.WorkerLogLine:
            n, state[2] = state[2], 0
            return P.WorkerLogLine(worker=worker, attempt=attempt, seq=state[3], time=state[4],
                                   stream="stderr", text=f"… {n} lines dropped (over {self.log_rate} lines/s)")

        out = []
        for ln in batch:
            second = int(ln.time)
            if second != state[0]:
                state[0], state[1] = second, 0
            if state[1] < self.log_rate:
                if state[2]:
                    out.append(dropped())
                state[1] += 1
                out.append(ln.shipped())
            else:
                state[2], state[3], state[4] = state[2] + 1, ln.seq, ln.time  # the marker takes a dropped seq
        if state[2] and at_end:
            out.append(dropped())
        return out

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if getattr(self.runtime, "networks", None) is not None:
            self.runtime.networks.setup_machine()  # before adopting: the sweep of networks left behind needs it
        adopted = self.runtime.adopt()
        live = [st for st in adopted if not st.final]
        if adopted:
            log.info("adopted %d worker attempt(s), %d still running", len(adopted), len(live))
        for target, name in ((self.poll_loop, "poll"), (self.reconcile_loop, "reconcile"),
                             (self.report_loop, "report"), (self.log_loop, "logs"), (self.event_loop, "events"),
                             (self.exports_loop, "exports")):
            t = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            t.start()
            self.threads.append(t)
        self.threads.append(EvictionWatch(self).start())  # ephemeral storage limits (agent/disk.py)

    def shutdown(self) -> None:
        """Stop the loops; with stop_workers_on_exit, stop every worker first and report them."""
        self.draining = True
        if self.stop_workers_on_exit:
            live = [st for st in self.runtime.list() if not st.final]
            if live:
                log.info("stopping %d worker(s) before exiting", len(live))
            for st in live:
                self.runtime.stop(st.worker, st.attempt, grace=self.stop_grace, wait=False, reason=DRAINING)
            for st in live:
                self.runtime.stop(st.worker, st.attempt, grace=self.stop_grace, wait=True, reason=DRAINING)
        self.stopping.set()
        self.wake_reconcile.set()
        self.wake_report.set()
        self.wake_logs.set()
        self.wake_exports.set()
        for t in self.threads:
            t.join(timeout=0.2 if t.name == "agent-poll" else 5)  # a long-poll may hold the poll thread
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.runtime.close()  # e.g. the process runtime's shim launcher (an idle interpreter; the shims run on)
        if self.exporter is not None:  # nothing is exported by an agent that is not running
            try:
                self.exporter.stop()
            except OSError as e:
                log.warning("stopping the NFS server: %s", e)
        if self.stop_workers_on_exit and self.nfs_mounts is not None:
            self.nfs_mounts.unmount_all()
        networks = getattr(self.runtime, "networks", None)
        if self.stop_workers_on_exit and networks is not None:  # the machine keeps nothing of this agent's
            try:
                for name in networks.existing():
                    networks.discard(name)
                networks.close_machine()
            except (OSError, RuntimeError) as e:
                log.warning("removing the workers' networks: %s", e)
        if self.registered.is_set():  # last words: states and logs, best effort
            try:
                with self._client(timeout=3) as client:
                    while self.ship_logs(client):
                        pass
                    self.send_report(client)
            except (httpx.HTTPError, NeedsRegister, ValueError):
                pass

    def run(self) -> None:
        """Start, block until request_exit() (run_agent calls it on SIGTERM/SIGINT), then shut down."""
        self.start()
        try:
            while not self.exit_requested.wait(0.5):
                pass
        finally:
            self.shutdown()

    def request_exit(self) -> None:
        self.exit_requested.set()


def agent_bases(server: str | list[str]) -> list[str]:
    """The agent API base of each control plane replica in `server`: one URL or several, comma-separated (or a
    list); a URL that already ends in /api/v1/agent is kept as is. ValueError when none is given."""
    urls = server.split(",") if isinstance(server, str) else list(server)
    out: list[str] = []
    for url in urls:
        url = url.strip().rstrip("/")
        if not url:
            continue
        base = url if url.endswith("/api/v1/agent") else url + "/api/v1/agent"
        if base not in out:
            out.append(base)
    if not out:
        raise ValueError("no control plane URL given")
    return out


def root_url(base: str) -> str:
    """http://cp-host:8420 of an agent API base."""
    return base[: -len("/api/v1/agent")] if base.endswith("/api/v1/agent") else base


def not_answering(e: Exception) -> bool:
    """Whether a failed request says its replica is not answering: a connection error or timeout, or a 5xx."""
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code >= 500
    return isinstance(e, httpx.TransportError)


def why_not(e: Exception) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        return f"{e.response.status_code} {e.response.reason_phrase}".rstrip()
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json().get("message") or r.text[:200])
    except ValueError:
        return r.text[:200]


def _code(r: httpx.Response) -> str | None:
    try:
        return r.json().get("code")
    except ValueError:
        return None


def run_agent(server: str, token: str, name: str, gpus: int | None = None, cpu_cores: float | None = None,
              memory_bytes: int | None = None, state_dir: str | None = None, stop_grace: float | None = None,
              labels: dict[str, str] | None = None, stop_workers_on_exit: bool = False,
              poll_wait: float = 30.0, image_map: ImageMap | None = None, runtime: Runtime | None = None,
              runtime_kind: str | None = None, address: str | None = None,
              shared_filesystems: dict[str, str] | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT (see the module docstring). `runtime` (built by the caller, e.g. with
    build_runtime) or `runtime_kind` ("auto", "container", "process"; default $ASTRAEUS_RUNTIME) says how
    workers run."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = Agent(server, token, name, runtime=runtime, gpus=gpus, cpu_cores=cpu_cores, memory_bytes=memory_bytes,
                  state_dir=state_dir, stop_grace=stop_grace, labels=labels,
                  stop_workers_on_exit=stop_workers_on_exit, poll_wait=poll_wait, image_map=image_map,
                  runtime_kind=runtime_kind, address=address, shared_filesystems=shared_filesystems)

    def on_signal(signum, _frame):
        log.info("signal %s: exiting%s", signum, " (stopping workers)" if stop_workers_on_exit else
                 " (workers keep running and are adopted at the next start)")
        agent.request_exit()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()

