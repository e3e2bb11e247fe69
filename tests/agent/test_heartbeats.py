"""Bare heartbeats (server/heartbeats.py): a report that changes no worker only moves the machine's last heartbeat,
written without the state lock; anything else, and a lost machine's return, goes the usual way. SQLite and
PostgreSQL."""

from __future__ import annotations

import time
from datetime import datetime
from types import SimpleNamespace

import pytest
from sqlalchemy import select, update

from astraeus import protocol as P
from astraeus.server.db import Event, Machine
from astraeus.server.heartbeats import changes_nothing

from .conftest import wait_for

ID = "ws-0123456789ab.train-0"


def rec(state="Running", attempt=1, pid=42, environment="process", reason="Running"):
    return {ID: SimpleNamespace(state=state, attempt=attempt, pid=pid, environment=environment, reason=reason)}


def rep(state="Running", attempt=1, pid=42, environment=None, message=None):
    return [P.WorkerReport(worker=ID, attempt=attempt, state=state, pid=pid, environment=environment,
                           message=message)]


@pytest.mark.parametrize(("recorded", "reports", "nothing"), [
    (rec(), rep(), True),  # running, as known
    (rec(), [], True),
    (rec(), rep(pid=None), True),
    (rec(), rep(environment="process"), True),
    (rec(), rep(attempt=2), True),  # another attempt: report() skips it too
    ({}, rep(), True),  # not placed here: skipped
    (rec(state="Stopping"), rep(), True),
    (rec(state="Starting", reason="Pulling image x"), rep(state="Starting", message="Pulling  image x"), True),
    (rec(state="Starting"), rep(state="Starting"), True),
    (rec(), rep(pid=43), False),  # a new pid
    (rec(), rep(environment="container"), False),
    (rec(state="Starting"), rep(), False),  # now running
    (rec(state="Starting", reason="Pulling image x"), rep(state="Starting", message="Unpacking"), False),
    (rec(), rep(state="Exited"), False),
    (rec(), rep(state="StartFailed", message="no such image"), False),
])
def test_what_changes_nothing(recorded, reports, nothing):
    assert changes_nothing(recorded, reports) is nothing


def _register(app, name: str) -> dict:
    r = app.client.post("/api/v1/agent/register", json={"name": name, "gpus": 1},
                        headers={"Authorization": f"Bearer {app.boot['machine_token']}"})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['credential']}"}


def _shown(app, name: str) -> dict:
    r = app.client.get("/api/v1/o/acme/clusters/main/machines", params={"limit": 1000},
                       headers={"Authorization": f"Bearer {app.boot['admin_token']}"})
    assert r.status_code == 200, r.text
    return next(m for m in r.json()["items"] if m["name"] == name)


def _heard_at(m: dict) -> float:
    return datetime.fromisoformat(m["last_heartbeat"].replace("Z", "+00:00")).timestamp()


def _silent_since(app, name: str, seconds: float) -> None:
    with app.cp.sessions() as s:
        s.execute(update(Machine).where(Machine.name == name).values(last_heartbeat=time.time() - seconds))
        s.commit()


def test_a_bare_heartbeat_moves_the_last_heartbeat(app):
    h = _register(app, "gpu-07")
    _silent_since(app, "gpu-07", 30)
    assert _heard_at(_shown(app, "gpu-07")) < time.time() - 25
    r = app.client.post("/api/v1/agent/report", json={"machine": "gpu-07", "workers": []}, headers=h)
    assert r.status_code == 200, r.text
    m = _shown(app, "gpu-07")
    assert m["state"] == "Ready" and _heard_at(m) > time.time() - 5


def test_a_lost_machine_that_heartbeats_returns(app):
    h = _register(app, "gpu-08")
    _silent_since(app, "gpu-08", 3600)  # the loop loses it at its next check (lost after 60 s)
    wait_for(lambda: _shown(app, "gpu-08")["state"] == "Lost", 10, what="gpu-08 lost")
    r = app.client.post("/api/v1/agent/report", json={"machine": "gpu-08", "workers": []}, headers=h)
    assert r.status_code == 200, r.text
    assert _shown(app, "gpu-08")["state"] == "Ready"
    with app.cp.sessions() as s:
        kinds = list(s.scalars(select(Event.kind).where(Event.object == "gpu-08").order_by(Event.id)))
    assert kinds[-2:] == ["MachineLost", "MachineReturned"]


def test_a_report_for_another_machine_is_refused(app):
    h = _register(app, "gpu-09")
    r = app.client.post("/api/v1/agent/report", json={"machine": "gpu-10", "workers": []}, headers=h)
    assert r.status_code == 403 and "gpu-09" in r.json()["message"], r.text
