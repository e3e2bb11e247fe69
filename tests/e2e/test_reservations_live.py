"""A reservation on a real local cluster (`astraeus up`, two machines of 2 GPUs, a 1 s stop grace): workspace
team-a reserves gpu-01 from a few seconds ahead. Before the window the other workspace's untimed run is kept off
gpu-01 (its why-not line says so) while a timed run that ends in time runs there; team-a's run naming the
reservation waits for it. When the window opens the other workspace's run still on gpu-01 is stopped ("Stopped for
reservation launch", no restart spent) and waits, team-a's run starts on gpu-01, and team-a hears of it."""

from __future__ import annotations

import math
import time

import httpx

from astraeus.scheduler.reasons import utc_minute
from astraeus.server.services import iso
from tests.conftest import start_cluster


def _run(name: str, gpus: int = 1, seconds: int = 600, limit: int | None = None, **selection) -> dict:
    tt = {"image": "python:3.11", "command": "sleep", "args": [str(seconds)],
          "requested_resources": {"gpu_requests": {"count": gpus}, "node_selection": selection}}
    if limit is not None:
        tt["time_limit_seconds"] = limit
    return {"metadata": {"name": name}, "spec": {"task_template": tt}}


def _post(client, path: str, body: dict) -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_a_reservation_keeps_others_off_then_stops_their_work(tmp_path):
    c = start_cluster(tmp_path / "home", gpus=2, machines=2, stop_grace=1.0)
    try:
        _live(c)
    finally:
        c.stop()


def _live(c) -> None:
    admin, b = c.admin(), c.client()
    cluster = admin.get("/clusters").json()["items"][0]["name"]
    _post(admin, "/workspaces", {"name": "team-a", "clusters": {cluster: {}}})
    a_token = _post(admin, "/tokens", {"kind": "user", "workspace": "team-a", "role": "editor"})["token"]
    a = httpx.Client(base_url=c.api.rsplit("/w/", 1)[0] + "/w/team-a", timeout=30,
                     headers={"Authorization": f"Bearer {a_token}"})

    def worker(client, name: str) -> dict:
        return client.get(f"/workers/{name}").json()

    # another workspace's untimed run on gpu-01 before anything is reserved
    _post(b, "/runs", _run("squatter", mode="Names", names=["gpu-01"]))
    c.wait_for(lambda: worker(b, "squatter-0")["state"] == "Running", 30, what="squatter running on gpu-01")

    start = math.ceil(time.time()) + 15
    _post(admin, "/reservations", {"name": "launch", "cluster": cluster, "workspaces": ["team-a"],
                                   "machines": ["gpu-01"], "start": iso(start)})
    when = utc_minute(start)
    # team-a's run naming the reservation waits for its window
    _post(a, "/runs", _run("a-run", reservation="launch"))
    c.wait_for(lambda: a.get("/runs/a-run").json()["status"]["reason"]
               == f"Waits for reservation launch, which starts at {when}", 10, what="a-run waits for the window")
    # an untimed run of the other workspace is kept off gpu-01 (not in the window yet)
    _post(b, "/runs", _run("untimed", mode="Names", names=["gpu-01"]))
    line = c.wait_for(lambda: next((x["reason"] for x in worker(b, "untimed-0")["why_not"]
                                    if x["machine"] == "gpu-01"), None), 10, what="untimed's why-not line")
    assert line == (f"machine is reserved for another namespace from {when}: a run without a time limit cannot "
                    "use it before then"), line
    assert "launch" not in line  # another workspace's reservation is never named to it
    assert b.delete("/runs/untimed").status_code in (200, 202)
    # a timed run that ends before the window may use gpu-01 meanwhile
    _post(b, "/runs", _run("early", seconds=1, limit=3, mode="Names", names=["gpu-01"]))
    c.wait_for(lambda: b.get("/runs/early").json()["status"]["state"] == "Completed", 10, what="early completes")
    assert worker(b, "early-0")["machine"] == "gpu-01"
    assert time.time() < start  # all of that happened before the window

    # the window opens: the squatter is stopped (no restart spent) and waits; team-a's run starts on gpu-01
    c.wait_for(lambda: worker(b, "squatter-0")["reason"].startswith("Stopped for reservation launch"), 25,
               what="squatter stopped for the reservation")
    c.wait_for(lambda: worker(b, "squatter-0")["state"] == "Pending", 10, what="squatter queued again")
    sq = b.get("/runs/squatter").json()["status"]
    assert sq["restarts"] == 0 and sq["preemptions"] == 1 and "console_reason" not in sq
    assert ("Stopping", "Stopped for reservation launch") in [(h["state"], h["reason"]) for h in sq["history"]]
    c.wait_for(lambda: any(x["machine"] == "gpu-01" and x["reason"] == "machine is reserved for another namespace"
                           for x in worker(b, "squatter-0")["why_not"]), 10, what="squatter's why-not line")
    c.wait_for(lambda: worker(a, "a-run-0")["state"] == "Running", 15, what="a-run running in the window")
    assert worker(a, "a-run-0")["machine"] == "gpu-01"
    kinds = [e["kind"] for e in a.get("/events").json()["items"]]
    assert "ReservationStarted" in kinds
    assert "ReservationStarted" not in [e["kind"] for e in b.get("/events").json()["items"]]
