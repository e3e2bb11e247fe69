"""Several `astraeus server` replicas on one fresh PostgreSQL database, and agents given all their URLs.

`replicas` (fixture): a Replicas of three replicas on 127.0.0.1 ports, each with its own --home, a short scheduling
lease (ASTRAEUS_LEADER_LEASE_SECONDS=2), and helpers to find the leader, SIGKILL, SIGSTOP/SIGCONT and restart a
replica. Its agents (process runtime, 1 s stop grace, ASTRAEUS_HEARTBEAT=1) get `--server URL1,URL2,URL3`.
`Replicas(tmp, machines=[...])`: each of those machines' agents in its own network namespace on a bridge
(tests/faults Fleet.network), the replicas listening on the bridge's address (host networking where namespaces
cannot be made).
Built on tests/faults/conftest.py's Server, AgentProc and Fleet; everything is stopped, every worker killed and
the database dropped at the end."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import drop_postgres, postgres_url
from tests.faults.conftest import AgentProc, Fleet, Server, wait_for

LEASE_SECONDS = 2.0


def health(s: Server) -> dict | None:
    """A replica's /healthz answer, or None when it does not answer."""
    try:
        r = httpx.get(s.url + "/healthz", timeout=2)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


class Replicas:
    def __init__(self, tmp: Path, n: int = 3, lease: float = LEASE_SECONDS, env: dict | None = None,
                 machines: list[str] | None = None):
        self.tmp = tmp
        self.db = postgres_url()
        self.fleet = Fleet(tmp)
        self.net = None  # astraeus.fleet.netns.Layout when the agents run in namespaces
        host = "127.0.0.1"
        self.stopped: set[int] = set()  # indexes of replicas under SIGSTOP
        self.env = {"ASTRAEUS_DATABASE_URL": self.db, "ASTRAEUS_LEADER_LEASE_SECONDS": str(lease),
                    "ASTRAEUS_HEARTBEAT": "1", "ASTRAEUS_SCHEDULE_INTERVAL": "2", **(env or {})}
        try:
            if machines:
                from astraeus.fleet import netns

                if netns.unavailable() is None:
                    self.net = self.fleet.network(machines)
                    host = self.net.gateway
            for _ in range(n):
                self.fleet.server(env=self.env, host=host)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ replicas
    @property
    def servers(self) -> list[Server]:
        return self.fleet.servers

    @property
    def urls(self) -> str:
        """Every replica's URL, comma-separated: what agents get as --server."""
        return ",".join(s.url for s in self.servers)

    def api(self) -> str:
        """ASTRAEUS_API for `astra` (astraeus.cli.client): every replica's workspace URL, comma-separated."""
        path = self.servers[0].api.split("/", 3)[3]
        return ",".join(f"{s.url}/{path}" for s in self.servers)

    @property
    def vars(self) -> dict[str, str]:
        return self.servers[0].vars

    def leader(self, timeout: float = 30.0, among: list[int] | None = None) -> int:
        """The index of the replica that says it leads (waiting for one)."""
        among = list(range(len(self.servers))) if among is None else among

        def find():
            for i in among:
                if i in self.stopped:
                    continue
                h = health(self.servers[i])
                if h and h.get("role") == "leader":
                    return i + 1
            return None

        return wait_for(find, timeout, 0.1, what="a replica to lead") - 1

    def epoch(self, i: int) -> int:
        h = health(self.servers[i])
        assert h is not None, f"replica {i} does not answer /healthz"
        return int(h["epoch"])

    def kill9(self, i: int) -> None:
        self.servers[i].kill9()

    def sigstop(self, i: int) -> None:
        os.killpg(self.servers[i].proc.pid, signal.SIGSTOP)
        self.stopped.add(i)

    def sigcont(self, i: int) -> None:
        self.stopped.discard(i)
        os.killpg(self.servers[i].proc.pid, signal.SIGCONT)

    def restart(self, i: int, graceful: bool = True) -> Server:
        """Stop replica i (SIGTERM, or SIGKILL) and start it again on the same home, port and database."""
        s = self.servers[i]
        if i in self.stopped:
            self.sigcont(i)
        s.stop() if graceful else s.kill9()
        return s.start()

    def client(self, i: int = 0) -> httpx.Client:
        return self.servers[i].client(self.vars["ASTRAEUS_TOKEN"])

    # ------------------------------------------------------------------ agents
    def agent(self, name: str, gpus: int = 4, stop_grace: float = 1.0, urls: str | None = None) -> AgentProc:
        """An agent (process runtime) given every replica's URL."""
        a = AgentProc(urls or self.urls, self.vars["ASTRAEUS_MACHINE_TOKEN"], name, self.tmp / f"agent-{name}",
                      self.tmp / f"agent-{name}.log", gpus=gpus, stop_grace=stop_grace,
                      env={"ASTRAEUS_RUNTIME": "process", "ASTRAEUS_HEARTBEAT": "1"},
                      netns=self.net.machine(name).netns if self.net else None)
        self.fleet.agents.append(a)
        return a.start()

    def agent_log(self, name: str) -> str:
        return (self.tmp / f"agent-{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for i in list(self.stopped):
            try:
                self.sigcont(i)
            except OSError:
                pass
        self.fleet.close()
        drop_postgres(self.db)


@pytest.fixture
def replicas(tmp_path):
    r = Replicas(tmp_path)
    yield r
    r.close()


@pytest.fixture
def replicas_netns(tmp_path):
    """Three replicas on a bridge's address, machines gpu-a and gpu-b in their own network namespaces."""
    r = Replicas(tmp_path, machines=["gpu-a", "gpu-b"])
    yield r
    r.close()


def in_threads(fn, args: list, n: int = 4) -> list:
    """fn(arg) for each arg on n threads; the results in order."""
    out: list = [None] * len(args)
    it = iter(enumerate(args))
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                try:
                    i, a = next(it)
                except StopIteration:
                    return
            out[i] = fn(a)

    ts = [threading.Thread(target=work) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out
