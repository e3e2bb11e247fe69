"""The scheduling loop after a burst of plain submits (server/loop.py, Kept): cycles woken only by submits plan on
the snapshot kept from the last cycle plus the new runs. What a user sees is what a snapshot read afresh gives: every
waiting run's reason is the plan's on the whole queue read again, anything else that changes (a machine joining)
is planned on everything, and a run submitted to a cluster with room starts at once."""

from __future__ import annotations

import threading
import time

from astraeus import scheduler as sched
from astraeus.server import loop


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def register(app, name: str, gpus: int) -> None:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": name, "gpus": gpus, "cpu_cores": 32, "memory_bytes": 1 << 38,
                              "stop_grace_seconds": 1})
    assert r.status_code == 200, r.text


def body(name: str, gpus: int = 1, priority: int = 0) -> dict:
    return {"metadata": {"name": name}, "spec": {"priority": priority, "task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"],
        "requested_resources": {"gpu_requests": {"count": gpus}}}}}


def runs(app) -> dict[str, dict]:
    items = app.client.get(f"{app.api}/runs", params={"limit": 1000}, headers=app.h()).json()["items"]
    return {r["metadata"]["name"]: r["status"] for r in items}


def until(check, what: str, seconds: float = 30.0):
    deadline = time.time() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.time() < deadline, what
        time.sleep(0.05)


def fresh_reasons(app) -> dict[str, str]:
    """Every waiting run's reason in a plan made now on the whole queue read afresh."""
    from astraeus.server.db import Cluster

    with app.cp.sessions() as s:
        cluster = s.query(Cluster).one()
        snap, _ = loop.build_snapshot(s, cluster)
    return sched.plan(snap, time.time()).reasons


def test_a_burst_of_submits_gets_the_reasons_of_a_plan_on_the_whole_queue(app, monkeypatch):
    extended = []
    extend = loop.Kept.extend
    monkeypatch.setattr(loop.Kept, "extend", lambda self, *a: extended.append(1) or extend(self, *a))
    register(app, "gpu-01", gpus=2)
    assert app.client.post(f"{app.api}/runs", json=body("first", gpus=2), headers=app.h()).status_code == 201
    until(lambda: runs(app)["first"]["state"] in ("Starting", "Running"), "a run on an idle cluster starts")
    # One run waits, and the loop keeps the snapshot its plan changed nothing on (the cycle that started "first" kept
    # none), with nothing owed to a later full cycle: the burst's first cycle is one woken only by submits, even
    # where the whole burst lands before it reads (a fast machine).
    assert app.client.post(f"{app.api}/runs", json=body("warm", gpus=2, priority=-100), headers=app.h()).status_code == 201
    scheduling = app.client.app.state.loop
    until(lambda: scheduling.kept and not scheduling._owed and runs(app)["warm"]["queue_reason"],
          "the loop keeps the snapshot of a plan that changed nothing")

    names = [f"b{i}" for i in range(40)]

    def client(k: int) -> None:
        for n in names[k::4]:
            r = app.client.post(f"{app.api}/runs", json=body(n, gpus=1 + len(n) % 2, priority=-(len(n) % 3) * 10),
                                headers=app.h())
            assert r.status_code == 201, r.text

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def settled():
        shown = runs(app)
        want = fresh_reasons(app)
        waiting = {n: s["queue_reason"] for n, s in shown.items() if s["state"] == "Pending"}
        queue = names + ["warm"]
        return waiting if set(waiting) == set(queue) and waiting == {n: want[n] for n in queue} else None

    waiting = until(settled, "every waiting run says what a plan on the whole queue says")
    assert all(r.startswith("Queued behind") or r.startswith("Next to run") for r in waiting.values()), waiting
    assert extended  # the burst was planned on the kept snapshot (what this test is about)

    # Anything else wakes a cycle that reads everything: a machine joins, and the queue's first runs start on it.
    register(app, "gpu-02", gpus=2)
    until(lambda: any(s["state"] in ("Starting", "Running") for n, s in runs(app).items() if n in names),
          "a machine joining starts the first waiting runs")
    until(lambda: {n: s["queue_reason"] for n, s in runs(app).items() if s["state"] == "Pending"}
          == {n: r for n, r in fresh_reasons(app).items() if n in names or n == "warm"}, "the reasons follow")


def test_a_submit_after_a_burst_starts_at_once_where_there_is_room(app):
    register(app, "gpu-01", gpus=1)
    for i in range(5):
        assert app.client.post(f"{app.api}/runs", json=body(f"r{i}"), headers=app.h()).status_code == 201
    until(lambda: sum(s["state"] == "Pending" for s in runs(app).values()) == 4, "one starts, four wait")
    register(app, "gpu-02", gpus=5)  # room for every waiting run and one more (its join wakes a full cycle)
    until(lambda: all(s["state"] in ("Starting", "Running") for s in runs(app).values()), "the four start")
    assert app.client.post(f"{app.api}/runs", json=body("late"), headers=app.h()).status_code == 201
    until(lambda: runs(app)["late"]["state"] in ("Starting", "Running"), "a submit where there is room starts")
