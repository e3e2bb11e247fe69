"""Several control-plane replicas on one PostgreSQL database (issue 16, the server side): the scheduling lease
(taken, renewed, expired by the database's clock), fencing (a replica whose lease was taken applies nothing),
/healthz roles, wake-ups between replicas (LISTEN/NOTIFY), migrations under a lock and the refusal of code older
than the schema, and the refusal of a second replica on SQLite. The replicas are real `astraeus server`
processes where the test is about processes (SIGSTOP, SQLite's lock, the start-up refusal), in-process control
planes on one database elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from astraeus.app import create_app
from astraeus.main import bootstrap
from astraeus.server import leader as L
from astraeus.server import loop as sched_loop
from astraeus.server import state_lock
from astraeus.server.core import ControlPlane
from astraeus.server.state_lock import STATE_IDLE_TIMEOUT_MS
from astraeus.settings import ServerSettings
from tests.conftest import VENV_BIN, drop_postgres, free_port, postgres_url, read_env, wait_for


def _head_revision() -> str:
    """The newest schema revision this code knows (what a fresh database is migrated to)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    import astraeus.server.migrations as migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).resolve().parent))
    return ScriptDirectory.from_config(cfg).get_current_head()


HEAD = _head_revision()

pytestmark = pytest.mark.postgres

REG = {"gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "stop_grace_seconds": 1}


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _run(name: str, gpus: int = 1) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"],
        "requested_resources": {"gpu_requests": {"count": gpus}}}}}


@pytest.fixture
def pg():
    url = postgres_url()
    yield url
    drop_postgres(url)


def _cp(tmp_path: Path, url: str, name: str, lease: float = 2.0) -> ControlPlane:
    return ControlPlane.open(ServerSettings(home=tmp_path / name, database_url=url, leader_lease_seconds=lease,
                                            replica_id=name))


# ------------------------------------------------------------------------------------------ the lease


def test_the_lease_is_taken_renewed_and_expires_by_the_database_clock(pg, tmp_path):
    cp = _cp(tmp_path, pg, "a")
    try:
        with cp.sessions() as s, s.begin():
            a = L.try_lead(s, "replica-a", 1.0)
        assert a.taken and a.term == L.Term("replica-a", 1) and a.previous is None
        with cp.sessions() as s, s.begin():
            b = L.try_lead(s, "replica-b", 1.0)
        assert b.term is None and b.holder == "replica-a" and b.epoch == 1  # another leads: b follows
        with cp.sessions() as s, s.begin():
            again = L.try_lead(s, "replica-a", 1.0)
        assert again.term == L.Term("replica-a", 1) and not again.taken  # a renewal keeps the epoch
        with cp.sessions() as s:
            row = s.get(L.Lease, L.LEASE)
            db_clock = float(s.scalar(L.text("SELECT extract(epoch FROM clock_timestamp())")))
            # expires_at is on the database's clock: a second after the renewal, as PostgreSQL counts
            assert 0 < row.expires_at - db_clock <= 1.0
            wait_for(lambda: L.db_now(s) > row.expires_at, 10, what="the lease to run out by the database's clock")
        with cp.sessions() as s, s.begin():
            b = L.try_lead(s, "replica-b", 1.0)
        assert b.taken and b.term == L.Term("replica-b", 2) and b.previous == "replica-a"  # epoch + 1
        with cp.sessions() as s, s.begin():
            a = L.try_lead(s, "replica-a", 1.0)
        assert a.term is None and a.holder == "replica-b" and a.epoch == 2
        with cp.sessions() as s, s.begin():
            assert L.release(s, "replica-b")  # a clean stop gives it up: the next try takes it at once
        with cp.sessions() as s, s.begin():
            a = L.try_lead(s, "replica-a", 1.0)
        assert a.taken and a.term == L.Term("replica-a", 3)
    finally:
        cp.engine.dispose()


def test_a_replica_whose_lease_was_taken_applies_nothing(pg, tmp_path):
    """Fencing, deterministically: replica A leads at epoch 1, replica B takes the lease (epoch 2); A's cycle in
    its old term places nothing and its fence refuses; B's places the run."""
    # leases long enough that B's own does not run out before its cycle on a loaded machine (A's is released
    # by hand, as if it had run out)
    a = _cp(tmp_path, pg, "a", lease=30.0)
    b = _cp(tmp_path, pg, "b", lease=30.0)
    boot = bootstrap(a, "acme", "vision", "main", ["/data/astraeus"])
    client = TestClient(create_app(a.settings, a, run_loop=False))
    api = "/api/v1/o/acme/w/vision"
    try:
        old = a.leader.tick().term
        assert old == L.Term(a.leader.holder, 1)
        r = client.post("/api/v1/agent/register", headers=_h(boot["machine_token"]), json={"name": "gpu-01", **REG})
        assert r.status_code == 200, r.text
        assert client.post(api + "/runs", headers=_h(boot["token"]), json=_run("train")).status_code == 201
        with a.sessions() as s, s.begin():
            assert L.release(s, a.leader.holder)  # as if A's lease had run out while it was paused
        new = b.leader.tick()
        assert new.taken and new.term.epoch == 2
        assert sched_loop.cycle(a, term=old) == set()  # the stale term: nothing applied
        run = client.get(api + "/runs/train", headers=_h(boot["token"])).json()
        assert run["status"]["state"] == "Pending", run
        with a.sessions() as s, s.begin(), pytest.raises(L.NotLeader, match="epoch 1"):
            L.fence(s, old)
        assert sched_loop.cycle(b, term=new.term)  # the leader's places it
        run = client.get(api + "/runs/train", headers=_h(boot["token"])).json()
        assert run["status"]["state"] in ("Starting", "Running"), run
        assert a.leader.tick().term is None  # A now follows
    finally:
        client.close()
        a.engine.dispose()
        b.engine.dispose()


def test_healthz_names_the_leader_and_a_follower_takes_over_when_it_stops(pg, tmp_path):
    a = _cp(tmp_path, pg, "a", lease=3.0)  # B takes over because A gives the lease up, not by its expiry
    b = _cp(tmp_path, pg, "b", lease=3.0)
    bootstrap(a, "acme", "vision", "main", ["/data/astraeus"])
    ca = TestClient(create_app(a.settings, a))
    cb = TestClient(create_app(b.settings, b))
    try:
        with ca:
            assert ca.get("/healthz").json() == {"role": "leader", "epoch": 1, "database": "ok"}
            with cb:
                assert cb.get("/healthz").json() == {"role": "follower", "epoch": 1, "database": "ok"}
                metrics = ca.get("/metrics").text
                assert "astraeus_leader_epoch" in metrics and "astraeus_lease_renewals_total" in metrics
                assert "astraeus_leader_failovers_total" in metrics
                ca.__exit__(None, None, None)  # A stops cleanly: it gives the lease up
                wait_for(lambda: cb.get("/healthz").json()["role"] == "leader", 15, what="B to lead")
                assert cb.get("/healthz").json() == {"role": "leader", "epoch": 2, "database": "ok"}
                assert "astraeus_leader 1.0" in cb.get("/metrics").text
                ca.__enter__()  # A again: a follower now
                assert ca.get("/healthz").json() == {"role": "follower", "epoch": 2, "database": "ok"}
    finally:
        a.engine.dispose()
        b.engine.dispose()


def test_healthz_answers_503_when_the_database_does_not(pg, tmp_path):
    """/healthz says the database is unreachable (503), and so does any request that needs it (503 UNAVAILABLE,
    not a bare 500: a client or agent tries again or moves to another replica)."""
    cp = _cp(tmp_path, pg, "a")
    boot = bootstrap(cp, "acme", "vision", "main", ["/data/astraeus"])
    client = TestClient(create_app(cp.settings, cp, run_loop=False))
    try:
        assert client.get("/healthz").json() == {"role": "follower", "epoch": 0, "database": "ok"}
        from sqlalchemy import create_engine

        dead = create_engine(cp.engine.url.set(port=free_port()))  # a port nothing listens on
        cp.sessions.configure(bind=dead)
        r = client.get("/healthz")
        assert r.status_code == 503 and r.json()["database"] == "unreachable"
        r = client.post("/api/v1/o/acme/w/vision/runs", headers=_h(boot["token"]), json=_run("train"))
        assert r.status_code == 503 and r.json()["code"] == "UNAVAILABLE", r.text
        assert "the database is not answering" in r.json()["message"]
        dead.dispose()
    finally:
        client.close()
        cp.engine.dispose()


def test_concurrent_changes_through_two_replicas_never_answer_5xx(pg, tmp_path):
    """Submits, deletes and machine registrations of the same names, at once, through two replica processes:
    each answers what one process would (201, 409, 200, 404), never a 5xx, and the GPUs placed never exceed the
    machine's. (Within one process state_lock.STATE_LOCK already serialises; across processes it is the database's
    advisory lock.)"""
    env = _env(tmp_path, ASTRAEUS_DATABASE_URL=pg)
    r1 = Replica(tmp_path, "r1", env)
    replicas = [r1]
    try:
        wait_for(lambda: r1.health().get("role") == "leader", 60, what="r1 to lead")
        r2 = Replica(tmp_path, "r2", env)
        replicas.append(r2)
        wait_for(lambda: r2.health().get("role") == "follower", 60, what="r2 to follow")
        boot = read_env(r1.home / "env")
        api, user, machine = "/api/v1/o/acme/w/vision", _h(boot["ASTRAEUS_TOKEN"]), _h(boot["ASTRAEUS_MACHINE_TOKEN"])
        statuses: list[tuple[str, int, str]] = []

        def work(base: str, seed: int) -> None:
            with httpx.Client(base_url=base, timeout=60) as c:
                for i in range(15):
                    name = f"r{(seed + i) % 4}"
                    r = c.post(api + "/runs", headers=user, json=_run(name, 2))
                    statuses.append(("submit", r.status_code, r.text[:200]))
                    if i % 2 == 1:
                        r = c.delete(api + f"/runs/{name}", headers=user)
                        statuses.append(("delete", r.status_code, r.text[:200]))
                    if i % 5 == 0:
                        r = c.post("/api/v1/agent/register", headers=machine, json={"name": f"gpu-0{seed % 2}", **REG})
                        statuses.append(("register", r.status_code, r.text[:200]))

        threads = [threading.Thread(target=work, args=(r.url, k)) for k, r in enumerate((r1, r2) * 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bad = [s for s in statuses if s[1] not in (200, 201, 404, 409)]
        assert statuses and not bad, bad[:5]
        runs = httpx.get(r2.url + api + "/runs", headers=user).json()["items"]
        names = [r["metadata"]["name"] for r in runs]
        assert len(names) == len(set(names))  # one live run per name
    finally:
        for r in replicas:
            r.stop()


# ------------------------------------------------------------------------------ wake-ups between replicas


def test_a_change_on_one_replica_wakes_the_other(pg, tmp_path):
    """An agent long-polling replica B hears at once of a placement made on replica A (NOTIFY), and B's
    scheduler is woken by a submit accepted on A."""
    a = _cp(tmp_path, pg, "a")
    b = _cp(tmp_path, pg, "b")
    try:
        a.start_bus()
        b.start_bus()
        wait_for(lambda: a.bus.connected.is_set() and b.bus.connected.is_set(), 10, what="both buses to listen")
        after = b.notifier.machine_version(7)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("v", b.notifier.wait_machine(7, after, 20)))
        t.start()
        time.sleep(0.2)
        a.notifier.bump_machines([7])
        t.join()
        assert got["v"] > after  # woken by A's bump, not by the 20 s running out (it would return `after`)
        b.notifier.wait_scheduler(0)  # clear
        a.notifier.wake_scheduler()
        assert b.notifier.wait_scheduler(20)
        logs = b.notifier.logs_version()
        a.notifier.bump_logs()
        assert b.notifier.wait_logs(logs, 20) > logs
    finally:
        a.stop_bus()
        b.stop_bus()
        a.engine.dispose()
        b.engine.dispose()


# ---------------------------------------------------------------------------------------------- migrations


def test_replicas_starting_at_once_migrate_once_and_bootstrap_once(pg, tmp_path):
    errors, cps = [], []

    def start(name):
        try:
            cps.append(_cp(tmp_path, pg, name))
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=start, args=(f"r{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(pg.replace("+psycopg", "")) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
    # and their bootstraps, at once, make the defaults once (each gets fresh tokens of its own)
    boots = []
    threads = [threading.Thread(target=lambda cp=cp: boots.append(bootstrap(cp, "acme", "vision", "main", ["/d"])))
               for cp in cps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(boots) == 3 and len({b["token"] for b in boots}) == 3 and len({b["ns"] for b in boots}) == 1
    with psycopg.connect(pg.replace("+psycopg", "")) as conn:
        assert conn.execute("SELECT count(*) FROM orgs").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM workspaces").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM clusters").fetchone() == (1,)
    for cp in cps:
        cp.engine.dispose()


def _server(home: Path, port: int, env: dict, *extra: str) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([str(VENV_BIN / "astraeus"), "server", "--home", str(home), "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRAEUS_")}
    return {**env, "ASTRAEUS_HOME": str(tmp_path / "home"), **extra}


def test_older_code_refuses_a_newer_schema(pg, tmp_path):
    cp = _cp(tmp_path, pg, "a")
    cp.engine.dispose()
    with psycopg.connect(pg.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")
    p = _server(tmp_path / "r1", free_port(), _env(tmp_path, ASTRAEUS_DATABASE_URL=pg))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert ("astraeus server: the database is at schema revision 0099, newer than this astraeus (knows up to "
            f"{HEAD}): upgrade astraeus") in err
    with psycopg.connect(pg.replace("+psycopg", "")) as conn:  # and it changed nothing
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0099",)]


def test_a_second_server_on_one_sqlite_database_refuses(tmp_path):
    home = tmp_path / "home"
    first = _server(home, free_port(), _env(tmp_path))
    try:
        wait_for(lambda: (home / "env").exists() and "ASTRAEUS_SERVER" in (home / "env").read_text(), 60,
                 what="the first server")
        second = _server(home, free_port(), _env(tmp_path))
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert f"another astraeus server (pid {first.pid}) is serving the SQLite database {home / 'astraeus.db'}" in err
        assert "set ASTRAEUS_DATABASE_URL" in err
        base = read_env(home / "env")["ASTRAEUS_SERVER"]

        def role() -> str | None:
            try:
                return httpx.get(base + "/healthz", timeout=5).json()["role"]
            except httpx.TransportError:  # the env file is written before the port answers: still starting
                return None

        assert wait_for(role, 60, what="the first server's /healthz") == "leader"  # the first one is untouched
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=30)


# ------------------------------------------------------------------------------------ a paused leader


class Replica:
    def __init__(self, tmp_path: Path, name: str, env: dict):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = tmp_path / name
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "server.log", "ab") as log:  # a file, not a pipe nobody reads while it runs
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "astraeus"), "server", "--home", str(self.home), "--port", str(self.port),
                 "--replica-id", name], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def health(self) -> dict:
        try:
            return httpx.get(self.url + "/healthz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.mark.faults
def test_a_leader_paused_past_its_lease_applies_nothing_and_rejoins_as_a_follower(pg, tmp_path):
    lease = 1.5
    env = _env(tmp_path, ASTRAEUS_DATABASE_URL=pg, ASTRAEUS_LEADER_LEASE_SECONDS=str(lease))
    r1 = Replica(tmp_path, "r1", env)
    replicas = [r1]
    try:
        wait_for(lambda: r1.health().get("role") == "leader", 60, what="r1 to lead")
        r2, r3 = Replica(tmp_path, "r2", env), Replica(tmp_path, "r3", env)
        replicas += [r2, r3]
        wait_for(lambda: r2.health().get("role") == "follower" and r3.health().get("role") == "follower", 60,
                 what="r2 and r3 to follow")
        boot = read_env(r1.home / "env")  # each replica's own tokens reach every replica
        user, machine = _h(boot["ASTRAEUS_TOKEN"]), _h(boot["ASTRAEUS_MACHINE_TOKEN"])
        api = "/api/v1/o/acme/w/vision"
        creds = {}
        for name in ("gpu-01", "gpu-02"):
            r = httpx.post(r3.url + "/api/v1/agent/register", headers=machine, json={"name": name, **REG})
            assert r.status_code == 200, r.text
            creds[name] = _h(r.json()["credential"])
        for i in range(6):  # a burst, then the leader is paused in the middle of scheduling it
            assert httpx.post(r2.url + api + "/runs", headers=user, json=_run(f"a{i}", 2)).status_code == 201
        before = r1.health()
        assert before["role"] == "leader"
        os.killpg(r1.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_for(lambda: any(r.health().get("role") == "leader" for r in (r2, r3)), 30, what="a new leader")
        new = next(r for r in (r2, r3) if r.health().get("role") == "leader")
        epoch = new.health()["epoch"]
        assert epoch > before["epoch"]
        # more than fits: the new leader places what fits. A submit may wait for the paused leader's state lock
        # (stopped in the middle of an apply) until PostgreSQL ends its idle transaction: STATE_IDLE_TIMEOUT_MS,
        # longer than httpx's default 5 s (a ReadTimeout here under a full suite's load)
        for i in range(6):
            assert httpx.post(new.url + api + "/runs", headers=user, json=_run(f"b{i}", 2),
                              timeout=STATE_IDLE_TIMEOUT_MS / 1000 + 20).status_code == 201
        time.sleep(max(0.0, 2 * lease - (time.monotonic() - t0)))
        os.killpg(r1.proc.pid, signal.SIGCONT)
        # (under load a renewal the new leader missed may have raised the epoch again: never lowered it)
        wait_for(lambda: (h := r1.health()).get("role") == "follower" and h.get("epoch", -1) >= epoch
                 and h.get("database") == "ok", 30, what="r1 to rejoin as a follower")
        # submits through the old leader reach the new one
        assert httpx.post(r1.url + api + "/runs", headers=user, json=_run("c0", 2)).status_code == 201

        def placed() -> list[dict]:
            out = []
            for name in ("gpu-01", "gpu-02"):
                r = httpx.get(r1.url + "/api/v1/agent/assignments", params={"machine": name}, headers=creds[name])
                assert r.status_code == 200 and r.json()["epoch"] >= epoch
                out += [{**a, "machine": name} for a in r.json()["assignments"]]
            return out

        wait_for(lambda: len(placed()) == 8, 30, what="eight runs of two GPUs on two machines of eight")
        time.sleep(2 * lease)  # long enough for a stale apply of r1's to show, had it written one
        seen = placed()
        assert len(seen) == 8
        for name in ("gpu-01", "gpu-02"):
            gpus = [g for a in seen if a["machine"] == name for g in a["gpu_indices"]]
            assert len(gpus) == len(set(gpus)) <= 8  # no GPU given twice, never more than the machine's
        workers = [a["worker"] for a in seen]
        assert len(workers) == len(set(workers))  # one live placement per worker
        runs = httpx.get(r3.url + api + "/runs", headers=user).json()["items"]
        assert len(runs) == 13 and sum(r["status"]["state"] == "Pending" for r in runs) == 5
        assert all(r.health()["database"] == "ok" for r in replicas)
        wait_for(lambda: sorted(r.health().get("role", "") for r in replicas) == ["follower", "follower", "leader"],
                 30, what="one leader and two followers")
    finally:
        for r in replicas:
            r.stop()


@pytest.mark.faults
def test_replicas_reconnect_when_the_database_drops_every_connection(pg, tmp_path):
    """Every connection of the replicas to their database is terminated (as a PostgreSQL restart does, without
    restarting the server others use): they reconnect, one leads at the same or a new epoch, and work submitted
    afterwards through the follower is placed; nothing acknowledged before is lost."""
    env = _env(tmp_path, ASTRAEUS_DATABASE_URL=pg, ASTRAEUS_LEADER_LEASE_SECONDS="1.5")
    r1 = Replica(tmp_path, "r1", env)
    replicas = [r1]
    try:
        wait_for(lambda: r1.health().get("role") == "leader", 60, what="r1 to lead")
        r2 = Replica(tmp_path, "r2", env)
        replicas.append(r2)
        wait_for(lambda: r2.health().get("role") == "follower", 60, what="r2 to follow")
        boot = read_env(r1.home / "env")
        api, user, machine = "/api/v1/o/acme/w/vision", _h(boot["ASTRAEUS_TOKEN"]), _h(boot["ASTRAEUS_MACHINE_TOKEN"])
        r = httpx.post(r2.url + "/api/v1/agent/register", headers=machine, json={"name": "gpu-01", **REG})
        cred = _h(r.json()["credential"])
        assert httpx.post(r2.url + api + "/runs", headers=user, json=_run("before", 2)).status_code == 201

        def placed(base: str) -> set[str]:
            r = httpx.get(base + "/api/v1/agent/assignments", params={"machine": "gpu-01"}, headers=cred, timeout=10)
            return {a["run"] for a in r.json()["assignments"]} if r.status_code == 200 else set()

        wait_for(lambda: placed(r2.url) == {"before"}, 30, what="the first run placed")
        name = pg.rsplit("/", 1)[1]
        with psycopg.connect(pg.replace("+psycopg", "").rsplit("/", 1)[0] + "/postgres", autocommit=True) as c:
            killed = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                               (name,)).fetchone()[0]
        assert killed >= 4  # each replica's pool, bus listener and publisher at least
        wait_for(lambda: all(r.health().get("database") == "ok" for r in replicas), 30, what="both to reconnect")
        wait_for(lambda: sorted(r.health().get("role", "") for r in replicas) == ["follower", "leader"], 30,
                 what="one leader again")
        assert httpx.post(r2.url + api + "/runs", headers=user, json=_run("after", 2)).status_code == 201
        wait_for(lambda: placed(r1.url) == {"before", "after"}, 30, what="the run submitted after placed")
        runs = {r["metadata"]["name"] for r in httpx.get(r1.url + api + "/runs", headers=user).json()["items"]}
        assert runs == {"before", "after"}
    finally:
        for r in replicas:
            r.stop()


def test_a_state_change_left_idle_does_not_hold_the_other_replicas_writes(pg, tmp_path, monkeypatch):
    """A replica paused in the middle of a state change holds the lock every replica's writes take: PostgreSQL
    ends that transaction once it has been idle STATE_IDLE_TIMEOUT_MS, the others' writes go on, and the paused
    one's writes nothing of its change."""
    from sqlalchemy.exc import DBAPIError

    from astraeus.server.db import Org

    monkeypatch.setitem(state_lock.STATE_LOCK_PARAMS, "state_lock_t", "500")
    a, b = _cp(tmp_path, pg, "a"), _cp(tmp_path, pg, "b")
    try:
        paused = a.sessions()
        paused.begin()
        state_lock.lock_state(paused)
        paused.add(Org(name="from-the-paused-one"))
        paused.flush()  # then nothing more: as if its process were stopped
        with b.sessions() as s, s.begin():
            state_lock.lock_state(s)  # waits until PostgreSQL ends the idle one
            s.add(Org(name="from-the-other"))
        with pytest.raises(DBAPIError):
            paused.commit()
        paused.close()
        with b.sessions() as s:
            assert sorted(o.name for o in s.scalars(L.select(Org))) == ["from-the-other"]
    finally:
        a.engine.dispose()
        b.engine.dispose()


def test_a_holder_stuck_on_the_lease_row_past_its_lease_is_cut_off_and_another_replica_leads(pg, tmp_path):
    """A leader's database session can be stuck where no timeout reaches it (its process stopped while PostgreSQL
    sends it a large result: the backend is *active*, blocked in the send) while it holds the lease row locked: the
    other replicas' tries to lead time out on the row. Once the lease has expired by the database's clock, a
    replica ends that session and takes the lease; while the lease still runs, the holder is never touched."""
    a, b = _cp(tmp_path, pg, "a", lease=3.0), _cp(tmp_path, pg, "b", lease=1.0)
    stuck = None
    try:
        first = a.leader.tick()
        assert first.taken and first.term.epoch == 1
        # a's session, stuck: the row locked in a transaction that no idle timeout ends
        stuck = psycopg.connect(pg.replace("postgresql+psycopg://", "postgresql://"), autocommit=False)
        stuck.execute("SET idle_in_transaction_session_timeout = 0")
        stuck.execute("SELECT holder FROM leases WHERE name = %s FOR UPDATE", (L.LEASE,))
        time.sleep(1.2)  # its transaction is older than b's lease, but a's lease still runs
        with b.sessions() as s, s.begin():
            assert L.break_stale_hold(s, 1.0) is None  # a holder whose lease runs is left alone
        assert stuck.execute("SELECT 1").fetchone() == (1,)
        b.leader.start()  # its tries time out on the row until a's lease expires; then it ends the stuck session
        wait_for(lambda: b.leader.leading, 20, what="b to lead")
        assert b.leader.epoch == 2
        with pytest.raises(psycopg.OperationalError):
            stuck.execute("SELECT 1")
    finally:
        b.leader.stop()
        if stuck is not None:
            stuck.close()
        a.engine.dispose()
        b.engine.dispose()


def test_a_deadlock_or_serialization_failure_is_retried_and_a_lost_database_is_a_503(pg, tmp_path):
    """What app.RetryConflicts retries and what the app answers 503 for, on errors PostgreSQL really raised: a
    deadlock between two transactions is a conflict (tried again), a terminated connection is 'unreachable'."""
    from sqlalchemy import text

    from astraeus.server.app import _conflict, _unreachable

    cp = _cp(tmp_path, pg, "a")
    caught = []
    try:
        c1, c2 = cp.engine.connect(), cp.engine.connect()
        t1, t2 = c1.begin(), c2.begin()
        c1.execute(text("SELECT pg_advisory_xact_lock(1)"))
        c2.execute(text("SELECT pg_advisory_xact_lock(2)"))

        def cross(c, k):
            try:
                c.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": k})
            except Exception as e:  # noqa: BLE001 - one of the two is the deadlock's victim
                caught.append(e)
                (t1 if c is c1 else t2).rollback()

        threads = [threading.Thread(target=cross, args=(c1, 2)), threading.Thread(target=cross, args=(c2, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(caught) == 1 and _conflict(caught[0]) and not _unreachable(caught[0])
        for c in (c1, c2):
            c.close()
        c3 = cp.engine.connect()
        pid = c3.execute(text("SELECT pg_backend_pid()")).scalar()
        with cp.engine.connect() as c4:
            c4.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        with pytest.raises(Exception) as lost:
            c3.execute(text("SELECT 1"))
        assert _unreachable(lost.value) and not _conflict(lost.value)
        c3.close()
    finally:
        cp.engine.dispose()


def test_a_submit_that_meets_a_lock_timeout_is_tried_again_not_answered_5xx(pg, tmp_path):
    """A state change refused by PostgreSQL for a conflict (here: lock_timeout, while another session holds the
    runs table) is run again by the app, and the client gets its 201 — never a 5xx."""
    with psycopg.connect(pg.replace("+psycopg", ""), autocommit=True) as c:
        c.execute(f"ALTER DATABASE {pg.rsplit('/', 1)[1]} SET lock_timeout = '300ms'")
    cp = _cp(tmp_path, pg, "a")
    boot = bootstrap(cp, "acme", "vision", "main", ["/data/astraeus"])
    client = TestClient(create_app(cp.settings, cp, run_loop=False))
    held = threading.Event()

    def hold() -> None:
        with psycopg.connect(pg.replace("+psycopg", "")) as c:
            c.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            held.set()
            time.sleep(0.6)  # longer than one lock_timeout, shorter than the app's tries together

    t = threading.Thread(target=hold)
    try:
        t.start()
        held.wait(10)
        r = client.post("/api/v1/o/acme/w/vision/runs", headers=_h(boot["token"]), json=_run("train"))
        assert r.status_code == 201, r.text
        t.join()
        runs = client.get("/api/v1/o/acme/w/vision/runs", headers=_h(boot["token"])).json()["items"]
        assert [x["metadata"]["name"] for x in runs] == ["train"]
    finally:
        t.join()
        client.close()
        cp.engine.dispose()
