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

Parts: astraeus.agent.client talks to the control plane (replicas, epochs, the credential, the HTTP calls);
astraeus.agent.reconcile decides what to start, stop, adopt and forget (pure); astraeus.agent.logs reads and ships the
workers' lines. `Agent`, here, owns the threads and applies the reconciler's decisions with the runtime.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
from pydantic import ValidationError

from astraeus import protocol as P
from astraeus.agent import logs
from astraeus.agent.client import Backoff, ControlPlaneClient, NeedsRegister, route_address
from astraeus.agent.client import agent_bases as agent_bases  # tests and tools import it from here
from astraeus.agent.disk import EvictionWatch, disk_of, mark_evicted
from astraeus.agent.exec import ExecSessions
from astraeus.agent.gpus import discover_gpus, mig_profiles, mig_visible, nvml_gpus
from astraeus.agent.health import HealthWatch
from astraeus.agent.logs import LOG_BATCH as LOG_BATCH  # benchmarks/bench_logs.py imports these from here
from astraeus.agent.logs import LOG_POST_BYTES as LOG_POST_BYTES
from astraeus.agent.logs import LogBatch, LogsDeferred, LogShipper
from astraeus.agent.mps import MpsDaemons
from astraeus.agent.reconcile import (
    Actual,
    Adopt,
    Forget,
    ReleaseDrives,
    Report,
    Start,
    Stop,
    StoppedBeforeStart,
    actions,
    adoptions,
    drives_needed,
    state_of,
)
from astraeus.agent.runtime.base import EXITED, START_FAILED, Runtime, StartFailed, WorkerStatus
from astraeus.agent.runtime.images import ImageMap
from astraeus.agent.runtime.progress import mark_progress
from astraeus.settings import AgentSettings

log = logging.getLogger("astraeus.agent")

# Why the agent stops its workers on exit (ASTRAEUS_STOP_REASON_FILE; the other reasons: reconcile.NOT_ASSIGNED, and
# the control plane's, which come with the assignment).
DRAINING = "the machine is draining"


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


class Agent:
    """This machine's agent: owns the threads (poll, reconcile, report, logs, events, exports, disk) and applies what
    the reconciler decides (astraeus.agent.reconcile) with the runtime. It talks to the control plane through
    `control_plane` (astraeus.agent.client) and ships its workers' lines through `shipper` (astraeus.agent.logs).

    Shared between threads, under `lock`: assignments, exports_wanted, synthetic, starting (the reconcile thread
    adds to it, the start pool's threads take their attempt out), reported_final and last_states (the report and
    reconcile threads). The log offsets are the shipper's, the replica, epochs and version the client's."""

    def __init__(self, server: str, token: str, name: str, *, runtime: Runtime | None = None, gpus: int | None = None,
                 cpu_cores: float | None = None, memory_bytes: int | None = None, state_dir: str | None = None,
                 stop_grace: float | None = None, labels: dict[str, str] | None = None,
                 stop_workers_on_exit: bool = False, poll_wait: float = 30.0, image_map: ImageMap | None = None,
                 runtime_kind: str | None = None, address: str | None = None,
                 shared_filesystems: dict[str, str] | None = None, gpu_memory_bytes: int | None = None,
                 nvlink_islands: list[list[int]] | None = None, mig: list[list[str]] | None = None):
        self.name = name
        env = AgentSettings.load() if state_dir is None or stop_grace is None or runtime is None else None
        self.state_dir = os.path.abspath(state_dir or env.state_dir_for(name))
        os.makedirs(self.state_dir, exist_ok=True)
        self.control_plane = ControlPlaneClient(server, token, os.path.join(self.state_dir, "credential"))
        self.stop_grace = env.stop_grace if stop_grace is None else float(stop_grace)
        why = "given"
        if runtime is None:
            runtime, why = build_runtime(runtime_kind or env.runtime, self.state_dir, self.stop_grace, env, image_map)
            runtime.networks = worker_networks(runtime, env, self.control_plane.servers)
        self.runtime = runtime
        self.runtime_name = runtime_label(self.runtime)
        log.info("runtime: %s (%s)", self.runtime_name, why)
        self.gpus = discover_gpus(gpus, gpu_memory_bytes, nvlink_islands, mig)
        self.cpu_cores = float(cpu_cores if cpu_cores is not None else (os.cpu_count() or 1))
        self.memory_bytes = int(memory_bytes if memory_bytes is not None else psutil.virtual_memory().total)
        self.labels = dict(labels or {})
        self.address = address  # None: the source address of the route to the control plane, found at each join
        self.shared_filesystems = dict(shared_filesystems or {})
        self.registered_address: str | None = address  # what the last join declared
        self.stop_workers_on_exit = stop_workers_on_exit
        self.poll_wait = poll_wait

        self.stopping = threading.Event()
        self.wake_reconcile = threading.Event()
        self.wake_report = threading.Event()
        self.wake_logs = threading.Event()
        self.lock = threading.RLock()
        self.assignments: dict[tuple[str, int], P.Assignment] | None = None  # None until the first answer
        self.synthetic: dict[tuple[str, int], WorkerStatus] = {}  # states without a runtime record
        self.starting: set[tuple[str, int]] = set()
        self.reported_final: set[tuple[str, int]] = set()
        self.last_states: dict[tuple[str, int], tuple] = {}
        # The report thread and the log thread both send lines: every POST goes through self._post
        self.shipper = LogShipper(self.runtime, name, self.state_dir,
                                  (env or AgentSettings.load()).log_lines_per_second,
                                  post=lambda *a, **kw: self._post(*a, **kw), reported=self._reported,
                                  wake_report=self.wake_report)
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
        # Issue 46: one CUDA MPS control daemon per shared GPU, while it has tenants (astraeus.agent.mps)
        self.mps = MpsDaemons(os.path.join(self.state_dir, "mps"), dict(enumerate(self.gpus.memory_bytes)))
        # GPU faults from NVML and the site health check (agent/health.py), sent in each report
        hs = env or AgentSettings.load()
        self.health = HealthWatch(self.gpus.count, self.gpus.source == "nvml", hs.health_check_command,
                                  hs.health_check_interval, self.wake_report.set)

    # ------------------------------------------------------------ the parts' state, for tests and tools that reach in
    @property
    def registered(self) -> threading.Event:
        return self.control_plane.registered

    @property
    def credential(self) -> str | None:
        return self.control_plane.credential

    @property
    def epoch(self) -> int:
        return self.control_plane.epoch

    @property
    def epoch_back_after(self) -> float:
        return self.control_plane.epoch_back_after

    @epoch_back_after.setter
    def epoch_back_after(self, seconds: float) -> None:
        self.control_plane.epoch_back_after = seconds

    @property
    def ship_lock(self) -> threading.Lock:
        return self.shipper.lock

    @property
    def quiet_attempts(self) -> set[tuple[str, int]]:
        return self.shipper.quiet_attempts

    @quiet_attempts.setter
    def quiet_attempts(self, keys: set[tuple[str, int]]) -> None:
        self.shipper.quiet_attempts = keys

    @property
    def logs_deferred_until(self) -> float:
        return self.shipper.deferred_until

    @logs_deferred_until.setter
    def logs_deferred_until(self, at: float) -> None:
        self.shipper.deferred_until = at

    def _collect_logs(self, only: set[tuple[str, int]] | None) -> LogBatch:
        return self.shipper.collect(only)

    # ------------------------------------------------------------ http
    def _post(self, client: httpx.Client, path: str, body: P.Body, omit_none: tuple[str, ...] = ()) -> dict:
        """Every report and batch of lines goes out here (tests count them)."""
        return self.control_plane.post(client, path, body, omit_none)

    def register(self, client: httpx.Client) -> None:
        body = P.Register(name=self.name, gpus=self.gpus.count, gpu_models=self.gpus.models,
                          gpu_memory_bytes=self.gpus.memory_bytes, gpu_mig=mig_profiles(self.gpus.mig),
                          nvlink_islands=self.gpus.islands,
                          cpu_cores=self.cpu_cores, memory_bytes=self.memory_bytes,
                          stop_grace_seconds=self.stop_grace, labels=self.labels, runtime=self.runtime_name,
                          address=self.address or route_address(self.control_plane.base),
                          shared_filesystems=self.shared_filesystems, nfs=nfs_ability_or_none(),
                          disk=disk_of(self.state_dir))
        ans = self.control_plane.register(client, body)
        self.registered_address = body.address
        self.control_plane.registered.set()
        log.info("registered %s in cluster %s (%d GPUs, %s; address %s)", self.name, ans.cluster, self.gpus.count,
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
        with self.control_plane.http(timeout=self.poll_wait + 5) as client:
            while not self.stopping.is_set():
                try:
                    if not self.registered.is_set():
                        self.register(client)
                    data = self.control_plane.assignments(client, self.name, self.poll_wait)
                    if data is None:  # made under an older scheduling leader
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
                    if not self.control_plane.failover(e):
                        log.warning("control plane unreachable (%s); retrying", e)
                    if self._sleep(backoff.next()):
                        return

    def set_assignments(self, version: int, items: list[P.Assignment], exports: list[P.Export] | None = None) -> None:
        new = {a.key: a for a in items}
        with self.lock:
            self.control_plane.took(version)
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
            starting = frozenset(self.starting)
        live = {k for k, st in self.statuses().items() if not st.final}
        return drives_needed(assigned, starting, live, self.nfs_mounts.targets)

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

    def _reported(self, key: tuple[str, int]) -> bool:
        with self.lock:
            return key in self.reported_final

    def reconcile(self) -> None:
        """One pass: what the reconciler decides from the assignments and the workers' states, applied."""
        if self.draining:
            return
        with self.lock:
            assigned = None if self.assignments is None else dict(self.assignments)
            # taken before the states: a start that ends after this has its record (runtime or synthetic) in them
            starting = frozenset(self.starting)
        statuses = self.statuses()
        if any([self._adopt(a) for a in adoptions(assigned, statuses)]):
            statuses = self.statuses()
        with self.lock:
            actual = Actual(statuses, starting, frozenset(self.reported_final), dict(self.last_states),
                            drives_mounted=self.nfs_mounts is not None)
        for act in actions(assigned, actual, time.time(), self.stop_grace):
            self._apply(act)

    def _adopt(self, act: Adopt) -> bool:
        if not self.runtime.adopt_as(act.older, act.attempt, act.worker):
            return False
        log.info("adopted %s attempt %s as %s", act.older, act.attempt, act.worker)
        return True

    def _apply(self, act) -> None:
        if isinstance(act, Start):
            with self.lock:
                self.starting.add(act.key)
            self.pool.submit(self._start, act.assignment)
        elif isinstance(act, Stop):
            if act.why is None:
                log.info("stopping %s attempt %s: no longer assigned here", *act.key)
            else:
                log.info("stopping %s attempt %s (%s)", act.worker, act.attempt, act.why)
            self.runtime.stop(act.worker, act.attempt, grace=act.grace, wait=False, reason=act.reason)
        elif isinstance(act, StoppedBeforeStart):
            with self.lock:
                self.synthetic[act.key] = WorkerStatus(act.worker, act.attempt, EXITED,
                                                       message="stopped before it started", finished_at=act.at)
        elif isinstance(act, Forget):
            self._forget(act.key)
        elif isinstance(act, ReleaseDrives):
            self.nfs_mounts.release(self._nfs_needed, self.pool.submit)
        elif isinstance(act, Report):
            with self.lock:
                self.last_states.update(act.states)
            for key, state in act.states:
                if state[0] in (EXITED, START_FAILED):
                    self.mps.release(key)  # a shared GPU's daemon stops with its last tenant
            self.wake_report.set()  # with the last lines of what ended (the log thread keeps its own pace)

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
            a = self.mps.attach(a, type(self.runtime).__name__ == "ContainerRuntime")
            if a.mig_devices:  # issue 46: the worker sees its MIG devices only, by UUID (names when simulated)
                try:
                    visible = mig_visible(self.gpus, a.mig_devices)
                except KeyError as e:
                    raise StartFailed(f"{e.args[0]} is not on this machine (its MIG layout changed?)") from None
                a = a.model_copy(update={"env": {**a.env, "CUDA_VISIBLE_DEVICES": ",".join(visible)}})
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
            with self.lock:
                self.starting.discard(key)
            self.wake_reconcile.set()
            self.wake_report.set()

    def _forget(self, key: tuple[str, int]) -> None:
        """Forget an ended attempt (unassigned and reported) once its logs are shipped."""
        with self.lock:
            synthetic = self.synthetic.pop(key, None)
        if synthetic is not None and self.runtime.status(*key) is None:
            return
        if not self.shipper.all_shipped(key):
            return  # logs not shipped yet
        self.runtime.forget(*key)
        self.shipper.forget(key)
        with self.lock:
            self.reported_final.discard(key)
            self.last_states.pop(key, None)

    def report_loop(self) -> None:
        backoff = Backoff()
        with self.control_plane.http() as client:
            while not self.stopping.is_set():
                if not self.registered.wait(0.5):
                    continue
                self.wake_report.wait(self.control_plane.heartbeat_seconds)
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
                    if not self.control_plane.failover(e):
                        log.warning("report failed (%s); retrying", e)
                    self.wake_report.set()
                    self._sleep(backoff.next())

    def send_report(self, client: httpx.Client) -> None:
        """Every attempt's state. An attempt that ended since the last report has its last lines stored first (its
        end may release it from this machine): sent in the report itself when they fit one request (one round trip
        per exit, not two), else shipped before it (LogShipper.ship_with_report)."""
        statuses = self.statuses()
        with self.lock:
            ended = {k for k, st in statuses.items() if st.final and k not in self.reported_final}
        workers = mark_evicted(self.runtime, [st.report() for st in sorted(statuses.values(), key=lambda s: s.key)])
        workers = mark_progress(self.runtime, workers)

        def report(lines: list | None) -> None:
            disk = disk_of(self.state_dir) if self.control_plane.disk_in_report else None
            self._post(client, "/report", P.Report(machine=self.name, workers=workers, lines=lines, disk=disk,
                                                   gpu_faults=self.health.faults, health_check=self.health.check),
                       omit_none=("lines", "disk", "gpu_faults", "health_check"))

        self.shipper.ship_with_report(client, ended, report,
                                      lambda: self._post(client, "/report", P.Report(machine=self.name,
                                                                                     workers=workers)))
        with self.lock:
            self.reported_final.update(k for k, st in statuses.items() if st.final)
            for key, st in statuses.items():  # sent: a reconcile that finds these states has nothing new to report
                if not st.final or key in self.reported_final:  # (not one reconcile forgot meanwhile)
                    self.last_states[key] = state_of(st)

    def log_loop(self) -> None:
        backoff = Backoff()
        with self.control_plane.http() as client:
            while not self.stopping.is_set():
                self.wake_logs.wait(logs.LOG_EVERY)
                self.wake_logs.clear()
                if not self.registered.is_set():
                    continue
                try:
                    more = self.shipper.ship(client)
                    backoff.reset()
                    if more:
                        self.wake_logs.set()
                except NeedsRegister:
                    self._sleep(backoff.next())
                except LogsDeferred as e:  # the control plane is busy storing others' lines: as long as it says,
                    log.debug("%s", e)  # the quiet attempts' lines alone, at the usual pace
                    self.shipper.defer(e.retry_after)
                except (httpx.HTTPError, ValueError) as e:
                    if not self.control_plane.failover(e):
                        log.warning("log shipping failed (%s); retrying", e)
                    self._sleep(backoff.next())

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
                             (self.exports_loop, "exports"), (ExecSessions(self).loop, "exec")):
            t = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            t.start()
            self.threads.append(t)
        self.threads.append(EvictionWatch(self).start())  # ephemeral storage limits (agent/disk.py)
        if self.health.command or self.health.nvml is not None:
            self.threads.append(self.health.start())

    def shutdown(self) -> None:
        """Stop the loops; with stop_workers_on_exit, stop every worker first and report them."""
        self.draining = True
        self.health.stopping.set()
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
                with self.control_plane.http(timeout=3) as client:
                    while self.shipper.ship(client):
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


def run_agent(server: str, token: str, name: str, gpus: int | None = None, cpu_cores: float | None = None,
              memory_bytes: int | None = None, state_dir: str | None = None, stop_grace: float | None = None,
              labels: dict[str, str] | None = None, stop_workers_on_exit: bool = False,
              poll_wait: float = 30.0, image_map: ImageMap | None = None, runtime: Runtime | None = None,
              runtime_kind: str | None = None, address: str | None = None,
              shared_filesystems: dict[str, str] | None = None, gpu_memory_bytes: int | None = None,
              nvlink_islands: list[list[int]] | None = None, mig: list[list[str]] | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT (see the module docstring). `runtime` (built by the caller, e.g. with
    build_runtime) or `runtime_kind` ("auto", "container", "process"; default $ASTRAEUS_RUNTIME) says how
    workers run."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = Agent(server, token, name, runtime=runtime, gpus=gpus, cpu_cores=cpu_cores, memory_bytes=memory_bytes,
                  state_dir=state_dir, stop_grace=stop_grace, labels=labels,
                  stop_workers_on_exit=stop_workers_on_exit, poll_wait=poll_wait, image_map=image_map,
                  runtime_kind=runtime_kind, address=address, shared_filesystems=shared_filesystems,
                  gpu_memory_bytes=gpu_memory_bytes, nvlink_islands=nvlink_islands, mig=mig)

    def on_signal(signum, _frame):
        log.info("signal %s: exiting%s", signum, " (stopping workers)" if stop_workers_on_exit else
                 " (workers keep running and are adopted at the next start)")
        agent.request_exit()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()

