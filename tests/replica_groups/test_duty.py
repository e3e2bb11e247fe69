"""The leader's duty for replica groups with an injected clock (keep_replicas(session, at)), on the real database
rows of an in-process control plane whose scheduling loop does not run: the runs' workers are moved the way the
loop and agent reports move them (server/lifecycle.py). Replacement, backoff timing, the streak reset, and the
refusal after a lowered maximum, then the replica made once it is raised again."""

import pytest
from sqlalchemy import select

from astraeus.server import lifecycle as L
from astraeus.server import loop
from astraeus.server import replica_groups as G
from astraeus.server.db import Cluster, Event, Machine, ReplicaGroup, Run
from tests.conftest import make_app

T = 2_000_000_000.0
BASE = 10.0


@pytest.fixture
def plane(tmp_path):
    client, boot, cp, _ = make_app(tmp_path, None, run_loop=False)
    with client:
        yield client, boot, cp
    cp.engine.dispose()


def api(boot) -> str:
    return f"/api/v1/o/{boot['org']}/w/{boot['workspace']}"


def keep(cp, at):
    with cp.sessions() as s:
        G.keep_replicas(s, at, base=BASE)
        s.commit()


def live(cp) -> dict[str, str]:
    with cp.sessions() as s:
        return {r.name: r.state for r in s.scalars(select(Run).where(Run.live_key == "").order_by(Run.id))}


def fail(cp, name, started, ended):
    """The run's only worker is placed and runs at `started`, and exits with code 1 at `ended`."""
    with cp.sessions() as s:
        run = s.scalar(select(Run).where(Run.name == name, Run.live_key == ""))
        cluster = s.get(Cluster, run.cluster_id)
        m = s.scalar(select(Machine).where(Machine.name == "gpu-01"))
        if m is None:
            m, _ = L.machine_registered(s, None, cluster, "gpu-01", started)
            m.gpus = 8
            s.flush()
        w = run.workers[0]
        L.place(s, run, w, m.id, [0], 1.0, 0, started, m.name)
        L.running(s, run, w, 4242, None, started)
        L.ended(s, run, w, 1, None, None, ended)
        s.commit()


def events(cp, kind) -> list[str]:
    with cp.sessions() as s:
        return [e.message for e in s.scalars(select(Event).where(Event.kind == kind).order_by(Event.id))]


def group_row(cp) -> tuple:
    with cp.sessions() as s:
        g = s.scalar(select(ReplicaGroup))
        return g.failures, g.retry_at


def test_replacement_backoff_and_its_reset(plane):
    client, boot, cp = plane
    body = {"metadata": {"name": "g"}, "spec": {"replicas": 1, "run": {"task_template": {
        "image": "python:3.11", "command": "true", "max_restarts": 0}}}}
    assert client.post(api(boot) + "/replica-groups", json=body, headers={
        "Authorization": f"Bearer {boot['token']}"}).status_code == 201
    keep(cp, T)
    assert live(cp) == {"g-1": "Pending"}
    keep(cp, T + 1)
    assert live(cp) == {"g-1": "Pending"}  # alive: nothing to do

    fail(cp, "g-1", T + 1, T + 10)
    keep(cp, T + 10)  # the first failure: replaced at once
    assert live(cp) == {"g-1": "Failed", "g-2": "Pending"}
    assert events(cp, "ReplicaReplaced")[-1] == ("replica group g: g-1 is gone (Failed: Failed (exit code 1); "
                                                 "restart budget spent); created g-2 in its place")

    fail(cp, "g-2", T + 10, T + 11)
    keep(cp, T + 11)  # two in a row: the replacement waits BASE seconds from the last failure
    assert "g-3" not in live(cp)
    assert group_row(cp) == (2, T + 21)
    assert events(cp, "ReplicaBackoff") == [
        "replica group g: 2 replicas failed in a row; 1 replacement(s) wait 10s (until 2033-05-18T03:33:41Z)"]
    with cp.sessions() as s:
        assert loop.next_due_at(s, T + 11) == T + 21  # the loop wakes then
    keep(cp, T + 20)
    assert "g-3" not in live(cp) and len(events(cp, "ReplicaBackoff")) == 1  # said once
    keep(cp, T + 21)
    assert live(cp)["g-3"] == "Pending" and group_row(cp) == (2, None)

    fail(cp, "g-3", T + 22, T + 30)
    keep(cp, T + 30)  # three in a row: twice BASE
    assert group_row(cp) == (3, T + 50)
    keep(cp, T + 50)
    assert live(cp)["g-4"] == "Pending"

    fail(cp, "g-4", T + 100, T + 100 + 600)  # ran 10 minutes: the count starts again, replaced at once
    keep(cp, T + 700)
    assert live(cp)["g-5"] == "Pending" and group_row(cp)[0] == 1


def test_a_lowered_maximum_refuses_the_replica_until_it_is_raised(plane):
    client, boot, cp = plane
    h = {"Authorization": f"Bearer {boot['token']}"}
    admin = {"Authorization": f"Bearer {boot['admin_token']}"}

    def set_max(v):
        r = client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": v}}},
                         headers=admin)
        assert r.status_code == 200, r.text

    set_max(10)
    body = {"metadata": {"name": "g"}, "spec": {"replicas": 1, "run": {"priority": 10, "task_template": {
        "image": "python:3.11", "command": "true"}}}}
    assert client.post(api(boot) + "/replica-groups", json=body, headers=h).status_code == 201
    set_max(0)
    keep(cp, T)
    assert live(cp) == {}
    [msg] = events(cp, "ReplicaRefused")
    assert msg.startswith("replica group g: 1 replica(s) missing, none created: priority 10 is above namespace ")
    assert msg.endswith("'s maximum of 0: lower the group's priority (PATCH spec.run) or ask an organisation admin "
                        "to raise the workspace's maximum; tried again in 30s")
    keep(cp, T + 29)
    assert len(events(cp, "ReplicaRefused")) == 1 and live(cp) == {}
    keep(cp, T + 30)  # tried again: refused again, said again
    assert len(events(cp, "ReplicaRefused")) == 2 and live(cp) == {}
    set_max(10)
    keep(cp, T + 60)
    assert live(cp) == {"g-1": "Pending"}
    with cp.sessions() as s:
        assert s.scalar(select(Run.priority).where(Run.name == "g-1")) == 10  # never another priority
