"""Agents and clients across control-plane replicas (issue 16): three `astraeus server` replicas on one PostgreSQL
database (tests/replicas/conftest.py), agents given every replica's URL, `astra`'s client given every replica's
workspace URL.

- the leader SIGKILLed during a burst of submits while workers run: every acknowledged run exists once, no
  running worker is restarted, the agents move to another replica (and say so), pending work is placed by the
  new leader;
- a rolling restart of every replica restarts no worker and registers no machine again;
- a hypothesis state machine drives submits, deletes and agent reports through the replicas: no 5xx, GPUs and the
  quota never exceeded, one state per worker;
- PostgreSQL itself restarted under load (last: it briefly cuts every test using the local PostgreSQL);
- and the agent's --server / ASTRAEUS_SERVER list, checked before it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from astraeus.agent.agent import agent_bases
from astraeus.cli.client import ApiError, Client, Config
from tests.faults.conftest import pid_alive, wait_for
from tests.replicas.conftest import Replicas, health

VENV_BIN = Path(sys.executable).parent
FIELDS = ("pid", "attempt", "restarts", "preemptions", "machine", "gpu_indices", "started_at", "placed_at", "state")


def sleep_run(name: str, gpus: int = 1, names: list[str] | None = None) -> dict:
    """A worker that only sleeps (`sleep 600`: the lightest process there is)."""
    rr: dict = {"cpu_cores": 0.1, "memory_bytes": 1 << 26, "gpu_requests": {"count": gpus}}
    if names:
        rr["node_selection"] = {"mode": "Names", "names": names}
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"], "requested_resources": rr}}}


def worker_fields(c: httpx.Client, name: str) -> dict:
    w = c.get(f"/workers/{name}").json()
    return {k: w.get(k) for k in FIELDS}


def start_keepers(rep: Replicas, n: int) -> dict[str, dict]:
    """n one-GPU runs k0..k(n-1), Running; their workers' fields."""
    with rep.client() as c:
        for i in range(n):
            assert c.post("/runs", json=sleep_run(f"k{i}")).status_code == 201
        for i in range(n):
            wait_for(lambda i=i: c.get(f"/workers/k{i}-0").json()["state"] == "Running", 90, what=f"k{i} Running")
        return {f"k{i}-0": worker_fields(c, f"k{i}-0") for i in range(n)}


def assert_unchanged(rep: Replicas, before: dict[str, dict], via: int) -> None:
    with rep.client(via) as c:
        for name, fields in before.items():
            assert worker_fields(c, name) == fields, f"{name} was restarted or changed"
            assert pid_alive(fields["pid"]), f"{name}'s process died"


def all_runs(c: httpx.Client) -> list[str]:
    return [r["metadata"]["name"] for r in c.get("/runs", params={"limit": 1000}).json()["items"]]


def burst(api: str, token: str, prefix: str, acked: list[str], stop: threading.Event, most: int,
          errors: list[str]) -> None:
    """Submit runs through astra's client (every replica's URL) until `stop` or `most`; the names acknowledged."""
    with Client(Config(api, token), timeout=20) as c:
        for i in range(most):
            if stop.is_set():
                return
            name = f"{prefix}-{i}"
            try:
                c.post("runs", sleep_run(name, gpus=0))
                acked.append(name)
            except ApiError as e:  # in flight when a replica died: may or may not exist; never 5xx otherwise
                errors.append(e.message)


# ------------------------------------------------------------------------------------ the agent's URL list


def test_agent_takes_a_comma_separated_list_of_replicas():
    assert agent_bases("http://cp1:8420, http://cp2:8420/,http://cp1:8420") == [
        "http://cp1:8420/api/v1/agent", "http://cp2:8420/api/v1/agent"]
    assert agent_bases("http://cp1:8420/api/v1/agent") == ["http://cp1:8420/api/v1/agent"]


@pytest.mark.parametrize("how, value, line", [
    ("--server", "http://cp1:8420,,http://cp2:8420",
     "astraeus agent: --server: an empty URL in the list (two commas in a row, or one at an end): give the control "
     "plane's URL, or several comma-separated"),
    ("--server", "http://cp1:8420,cp2:8420",
     "astraeus agent: --server: 'cp2:8420' is not an http:// or https:// URL: give the control plane's URL, or "
     "several comma-separated"),
    ("ASTRAEUS_SERVER", "http://cp1:8420,http://cp2:port",
     'astraeus agent: ASTRAEUS_SERVER: must be an http:// or https:// URL, or several comma-separated, got '
     '"http://cp1:8420,http://cp2:port"'),
])
def test_a_bad_replica_url_stops_the_agent_with_one_line(tmp_path, how, value, line):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
    env["HOME"] = str(tmp_path)
    argv = [str(VENV_BIN / "astraeus"), "agent", "--token", "x", "--runtime", "process"]
    if how == "--server":
        argv += ["--server", value]
    else:
        env[how] = value
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.splitlines() == [line]


# ------------------------------------------------------------------------------------ failover


@pytest.mark.faults
@pytest.mark.postgres
def test_leader_sigkill_during_a_burst_of_submits(replicas_netns):
    rep = replicas_netns
    old = rep.leader()
    # the agents start on the leader, so that its death makes them move
    order = [old] + [i for i in range(3) if i != old]
    urls = ",".join(rep.servers[i].url for i in order)
    for name in ("gpu-a", "gpu-b"):
        rep.agent(name, gpus=4, urls=urls)
    before = start_keepers(rep, 3)
    if rep.net:  # each agent in its own namespace, reaching the replicas over its veth
        with rep.client() as c:
            got = {m["name"]: m.get("address") for m in c.get("/machines").json()["items"]}
        assert got == {n: rep.net.machine(n).address for n in ("gpu-a", "gpu-b")}, got
    epoch = rep.epoch(old)

    acked: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    token = rep.vars["ASTRAEUS_TOKEN"]
    apis = rep.api().split(",")
    threads = []
    for t in range(3):  # each thread starts on another replica
        api = ",".join(apis[t:] + apis[:t])
        threads.append(threading.Thread(target=burst, args=(api, token, f"b{t}", acked, stop, 8, errors)))
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) >= 6, 60, 0.01, what="submits acknowledged")
    rep.kill9(old)
    for t in threads:
        t.join(timeout=120)
    assert not any(e.startswith("5") for e in errors), errors

    others = [i for i in range(3) if i != old]
    new = rep.leader(timeout=30, among=others)
    assert rep.epoch(new) > epoch
    with rep.client(new) as c:
        names = all_runs(c)
        twice = [n for n, k in Counter(names).items() if k > 1]
        assert not twice, f"runs listed twice: {twice}"
        missing = set(acked) - set(names)
        assert not missing, f"acknowledged runs lost: {sorted(missing)}"
        # pending work is placed (by the new leader: the old one is dead), and started by the agents
        assert c.post("/runs", json=sleep_run("after-the-kill")).status_code == 201
        for name in [*acked, "after-the-kill"]:
            wait_for(lambda name=name: c.get(f"/workers/{name}-0").json()["state"] == "Running", 90,
                     what=f"{name} Running")
    assert_unchanged(rep, before, via=new)
    dead = rep.servers[old].url
    for name in ("gpu-a", "gpu-b"):
        log = rep.agent_log(name)
        assert f"control plane {dead} not answering (" in log, log[-3000:]
        assert log.count(f"registered {name} in cluster") == 1, "the agent registered again after a failover"


@pytest.mark.faults
@pytest.mark.postgres
def test_a_rolling_restart_of_every_replica_restarts_no_worker(replicas):
    rep = replicas
    rep.agent("gpu-a", gpus=4)
    before = start_keepers(rep, 2)
    for i in range(3):
        rep.restart(i)
        rep.leader(timeout=30)
        time.sleep(1)  # a heartbeat or two through the others
    lead = rep.leader()
    with rep.client(lead) as c:
        assert c.post("/runs", json=sleep_run("after-the-restarts")).status_code == 201
        wait_for(lambda: c.get("/workers/after-the-restarts-0").json()["state"] == "Running", 90,
                 what="a run placed after the restarts")
    time.sleep(2)
    assert_unchanged(rep, before, via=(lead + 1) % 3)
    log = rep.agent_log("gpu-a")
    assert "not answering (" in log
    assert log.count("registered gpu-a in cluster") == 1, "the agent registered again"
    assert "stopping k" not in log


@pytest.mark.faults
@pytest.mark.postgres
def test_the_leader_paused_with_sigstop_while_the_agents_use_it(replicas):
    """SIGSTOP the leader, which the agent uses: another replica leads and places, the agent moves on when its
    requests time out (nothing restarted), and the old leader, continued, applies nothing and follows."""
    rep = replicas
    old = rep.leader()
    order = [old] + [i for i in range(3) if i != old]
    rep.agent("gpu-a", gpus=4, urls=",".join(rep.servers[i].url for i in order))
    before = start_keepers(rep, 2)
    epoch = rep.epoch(old)
    rep.sigstop(old)
    others = [i for i in range(3) if i != old]
    new = rep.leader(timeout=30, among=others)
    with rep.client(new) as c:
        assert c.post("/runs", json=sleep_run("while-paused")).status_code == 201
        wait_for(lambda: c.get("/workers/while-paused-0").json()["state"] == "Running", 120,
                 what="a run placed by the new leader and started by the agent")
    assert rep.epoch(new) > epoch
    assert f"control plane {rep.servers[old].url} not answering (" in rep.agent_log("gpu-a")
    rep.sigcont(old)
    wait_for(lambda: (health(rep.servers[old]) or {}).get("role") == "follower", 30,
             what="the old leader to rejoin as a follower")
    time.sleep(3)  # its stale loop had its chance to apply
    with rep.client(old) as c:
        ws = c.get("/workers").json()["items"]
        live = [w for w in ws if w["state"] in ACTIVE]
        gpus = [g for w in live for g in w["gpu_indices"]]
        assert len(gpus) == len(set(gpus)) and len(gpus) <= 4, f"GPUs placed twice: {sorted(gpus)}"
        assert Counter(w["name"] for w in ws)["while-paused-0"] == 1
    assert_unchanged(rep, before, via=old)
    assert rep.agent_log("gpu-a").count("registered gpu-a in cluster") == 1


# ------------------------------------------------------------------------------------ leader epochs


def _lease(rep: Replicas, sql: str) -> None:
    import psycopg

    with psycopg.connect(rep.db.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(sql)


@pytest.mark.faults
@pytest.mark.postgres
def test_the_agent_ignores_an_older_epoch_and_keeps_its_workers(tmp_path, caplog):
    """The agent (in this process, to shorten how long it waits for a database that went back) records the
    highest epoch; when the database's lease goes back to an older epoch (a backup restored, a lagging standby
    promoted), it ignores those answers, keeping its workers, and takes the older epoch only once every answer
    has said it for epoch_back_after seconds."""
    import logging

    from astraeus.agent.agent import Agent
    from tests.faults.conftest import reap

    caplog.set_level(logging.INFO, logger="astraeus.agent")
    rep = Replicas(tmp_path, n=2)
    agent = Agent(rep.urls, rep.vars["ASTRAEUS_MACHINE_TOKEN"], "gpu-e", gpus=2, cpu_cores=8, memory_bytes=8 << 30,
                  state_dir=str(tmp_path / "agent-gpu-e"), stop_grace=1, poll_wait=2, runtime_kind="process")
    agent.epoch_back_after = 4.0
    try:
        agent.start()
        before = start_keepers(rep, 1)
        for _ in range(3):  # the lease taken anew three times: epoch 4 or more
            seen = rep.epoch(0)
            _lease(rep, "UPDATE leases SET expires_at = 0")
            wait_for(lambda seen=seen: agent.epoch > seen, 30, what="the agent to see a newer epoch")
        high = agent.epoch
        assert high >= 4
        _lease(rep, "UPDATE leases SET epoch = 1, holder = NULL, expires_at = 0")  # the database went back
        wait_for(lambda: f"made under leader epoch 2: epoch {high} was seen already" in caplog.text, 30,
                 what="the agent to ignore the older epoch")
        assert agent.epoch == high
        assert_unchanged(rep, before, via=0)  # ignoring answers stops nothing
        wait_for(lambda: agent.epoch == 2, 60, what="the agent to take the older epoch after a while")
        assert f"the control plane's leader epoch has been 2, below the {high} seen, for " in caplog.text
        with rep.client() as c:  # and follows the control plane again
            assert c.post("/runs", json=sleep_run("after-the-restore")).status_code == 201
            wait_for(lambda: c.get("/workers/after-the-restore-0").json()["state"] == "Running", 60,
                     what="a run placed after the restore")
        assert_unchanged(rep, before, via=1)
    finally:
        agent.shutdown()
        reap(tmp_path / "agent-gpu-e")
        rep.close()


# ------------------------------------------------------------------------------------ the state machine

MACHINE_GPUS = 4
QUOTA = 6
ACTIVE = {"Starting", "Running", "Stopping"}


class ReplicaMachine(RuleBasedStateMachine):
    """Submits (one at a time, or the same name on two replicas at once), deletes and agent reports (one at a time,
    or a delete and a report at once), each through a replica hypothesis picks; the leader schedules in the background. Each example has its own workspace
    (quota QUOTA GPUs) and two machines of its own (its runs select them by name), played through the agent
    protocol."""

    rep: Replicas  # set by the test
    example = 0

    @initialize()
    def setup(self):
        ReplicaMachine.example += 1
        self.x = ReplicaMachine.example
        self.ws = f"hyp{self.x}"
        self.machines = [f"hyp{self.x}-a", f"hyp{self.x}-b"]
        v = self.rep.vars
        adm = {"Authorization": f"Bearer {v['ASTRAEUS_ADMIN_TOKEN']}"}
        base = self.rep.servers[0].url
        self.ok(httpx.post(f"{base}/api/v1/o/acme/workspaces", headers=adm, timeout=30, json={
            "name": self.ws, "clusters": {"main": {"quota": {"gpus": QUOTA}}}}))
        self.token = self.ok(httpx.post(f"{base}/api/v1/o/acme/tokens", headers=adm, timeout=30, json={
            "kind": "user", "workspace": self.ws, "role": "editor"}))["token"]
        self.admin = v["ASTRAEUS_ADMIN_TOKEN"]
        self.creds: dict[str, str] = {}
        self.n = 0
        self.names: list[str] = []
        for m in self.machines:
            self.agent(0, "/register", {"name": m, "gpus": MACHINE_GPUS, "cpu_cores": 64, "memory_bytes": 1 << 40})

    def teardown(self):
        if not hasattr(self, "token"):
            return
        for name in self.names:
            httpx.delete(self.url(0, f"/runs/{name}"), headers=self.h(self.token), timeout=30)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def h(tok):
        return {"Authorization": f"Bearer {tok}"}

    @staticmethod
    def ok(r, allowed=(200, 201)):
        assert r.status_code < 500, (r.status_code, r.text)
        assert r.status_code in allowed, (r.status_code, r.text)
        return r.json()

    def url(self, i: int, path: str) -> str:
        return f"{self.rep.servers[i].url}/api/v1/o/acme/w/{self.ws}{path}"

    def agent(self, i: int, path: str, body: dict, params: dict | None = None) -> dict:
        machine = body.get("name") or body.get("machine") or params["machine"]
        token = self.creds.get(machine) or self.rep.vars["ASTRAEUS_MACHINE_TOKEN"]
        url = f"{self.rep.servers[i].url}/api/v1/agent{path}"
        r = (httpx.get(url, params=params, headers=self.h(token), timeout=30) if params is not None else
             httpx.post(url, json=body, headers=self.h(token), timeout=30))
        out = self.ok(r)
        if out.get("credential"):
            self.creds[machine] = out["credential"]
        return out

    def workers(self, i: int) -> list[dict]:
        return self.ok(httpx.get(self.url(i, "/workers"), params={"limit": 1000}, headers=self.h(self.token),
                                 timeout=30))["items"]

    # ------------------------------------------------------------------ rules
    @rule(i=st.integers(0, 2), gpus=st.sampled_from([1, 2, 3]))
    def submit(self, i, gpus):
        self.n += 1
        name = f"r{self.n}"
        self.ok(httpx.post(self.url(i, "/runs"), json=sleep_run(name, gpus, self.machines), timeout=30,
                           headers=self.h(self.token)), (201,))
        self.names.append(name)

    @rule(i=st.integers(0, 2), j=st.integers(0, 2), gpus=st.sampled_from([1, 2]))
    def submit_on_two_at_once(self, i, j, gpus):
        """The same name on two replicas at the same time: one 201, the other 409."""
        self.n += 1
        name = f"r{self.n}"
        codes: list[int] = []

        def post(k):
            codes.append(httpx.post(self.url(k, "/runs"), json=sleep_run(name, gpus, self.machines), timeout=30,
                                    headers=self.h(self.token)).status_code)

        ts = [threading.Thread(target=post, args=(k,)) for k in (i, j)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(codes) == [201, 409], codes
        self.names.append(name)

    @rule(i=st.integers(0, 2), pick=st.integers(0, 20))
    def delete(self, i, pick):
        if not self.names:
            return
        name = self.names[pick % len(self.names)]
        self.ok(httpx.delete(self.url(i, f"/runs/{name}"), headers=self.h(self.token), timeout=30), (200, 404))

    @rule(i=st.integers(0, 2), m=st.integers(0, 1), exits=st.booleans())
    def agent_reports(self, i, m, exits):
        """The machine's agent, through replica i: starts what it is asked to run (or it exits at once) and stops
        what it is asked to stop."""
        machine = self.machines[m]
        got = self.agent(i, "/assignments", {}, params={"machine": machine, "wait": 0})
        workers = []
        for a in got["assignments"]:
            if a["desired"] == "Running" and not exits:
                workers.append({"worker": a["worker"], "attempt": a["attempt"], "state": "Running", "pid": 1000})
            else:
                workers.append({"worker": a["worker"], "attempt": a["attempt"], "state": "Exited", "exit_code": 0})
        self.agent(i, "/report", {"machine": machine, "workers": workers})

    @rule(i=st.integers(0, 2), j=st.integers(0, 2), pick=st.integers(0, 20), m=st.integers(0, 1))
    def delete_and_report_at_once(self, i, j, pick, m):
        """A delete through replica i while the machine reports through replica j: both answered, no 5xx."""
        if not self.names:
            return
        errors: list[BaseException] = []

        def guarded(fn, *a):
            try:
                fn(*a)
            except BaseException as e:  # noqa: BLE001 -- re-raised below, in the test's thread
                errors.append(e)

        ts = [threading.Thread(target=guarded, args=(self.delete, i, pick)),
              threading.Thread(target=guarded, args=(self.agent_reports, j, m, False))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]

    @rule()
    def let_the_leader_schedule(self):
        time.sleep(0.5)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def gpus_and_quota_within_bounds_and_one_state_each(self):
        if not hasattr(self, "token"):
            return
        ws = self.workers(self.n % 3)
        names = [w["name"] for w in ws]
        assert len(names) == len(set(names)), "a worker listed twice"
        used: dict[str, list[int]] = {m: [] for m in self.machines}
        for w in ws:
            if w["state"] in ACTIVE:
                assert w["machine"] in used, w
                used[w["machine"]] += w["gpu_indices"]
        for m, idx in used.items():
            assert len(idx) == len(set(idx)), f"a GPU of {m} given twice: {idx}"
            assert len(idx) <= MACHINE_GPUS, (m, idx)
        assert sum(len(i) for i in used.values()) <= QUOTA, f"{self.ws} over its quota of {QUOTA}: {used}"


@pytest.mark.faults
@pytest.mark.postgres
def test_state_machine_through_the_replicas(replicas):
    ReplicaMachine.rep = replicas
    ReplicaMachine.TestCase.settings = settings(max_examples=4, stateful_step_count=15, deadline=None,
                                                suppress_health_check=list(HealthCheck), database=None)
    ReplicaMachine.TestCase().runTest()
    for s in replicas.servers:  # every replica still serving
        assert (health(s) or {}).get("database") == "ok"


# ------------------------------------------------------------------------------------ PostgreSQL restarted
# Last in this file, and short: `pg_ctlcluster 15 main restart` cuts every connection to the local PostgreSQL,
# other tests' too: marked `serial`, run by `make test` alone after the others.


def _pg_restart() -> subprocess.CompletedProcess:
    return subprocess.run(["pg_ctlcluster", "15", "main", "restart"], capture_output=True, text=True, timeout=120)


@pytest.mark.faults
@pytest.mark.postgres
@pytest.mark.serial
def test_postgresql_restarted_under_load(replicas):
    if subprocess.run(["which", "pg_ctlcluster"], capture_output=True).returncode:
        pytest.skip("pg_ctlcluster not installed: PostgreSQL is not the local Debian cluster")
    rep = replicas
    rep.agent("gpu-a", gpus=4)
    before = start_keepers(rep, 2)
    acked: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    t = threading.Thread(target=burst, args=(rep.api(), rep.vars["ASTRAEUS_TOKEN"], "p", acked, stop, 40, errors))
    t.start()
    wait_for(lambda: len(acked) >= 3, 60, 0.01, what="submits acknowledged")
    p = _pg_restart()
    assert p.returncode == 0, p.stderr
    time.sleep(2)
    stop.set()
    t.join(timeout=120)
    # every replica reconnects
    for s in rep.servers:
        wait_for(lambda s=s: (health(s) or {}).get("database") == "ok", 60, what=f"{s.url} reconnected")
    lead = rep.leader(timeout=60)
    with rep.client(lead) as c:
        names = all_runs(c)
        assert len(names) == len(set(names)), "a run exists twice"
        missing = set(acked) - set(names)
        assert not missing, f"acknowledged runs lost: {sorted(missing)}"
        assert c.post("/runs", json=sleep_run("after-pg", gpus=1)).status_code == 201
        for name in [*acked, "after-pg"]:
            wait_for(lambda name=name: c.get(f"/workers/{name}-0").json()["state"] == "Running", 90,
                     what=f"{name} Running")
        ws = c.get("/workers", params={"limit": 1000}).json()["items"]
        gpus = [g for w in ws if w["state"] in ACTIVE for g in w["gpu_indices"]]
        assert len(gpus) == len(set(gpus)) <= 4, f"a GPU placed twice: {sorted(gpus)}"
    assert_unchanged(rep, before, via=lead)
