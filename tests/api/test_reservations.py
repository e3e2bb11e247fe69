"""Reservations (issue 18): an organisation admin keeps machines of a cluster for some workspaces from a start to an
end (`$ORG_API/reservations`). Every bad input is a 4xx naming the field; overlaps are refused naming the other;
`count` machines of a pool are chosen in name order among those free in the window; a workspace sees only its own
reservations; a run may name one (checked at submit); the leader writes ReservationStarted / ReservationEnded once
each; and work of another workspace on a reserved machine is stopped when the window opens (no restart spent).
In-process control plane (machines registered and reported for by the test), SQLite and PostgreSQL."""

from __future__ import annotations

import time

from astraeus.server import loop as sched_loop
from astraeus.server import services
from tests.conftest import wait_for

from .test_pools import ORG, POOLS, _admin, _h, _refused, _register, _run, _second_workspace

RES = ORG + "/reservations"
FAR = "2099-12-01T10:00:00Z"
FAR_END = "2099-12-02T10:00:00Z"


def _machines(app, n: int = 3) -> None:
    for i in range(1, n + 1):
        _register(app, f"gpu-{i}", labels={"gpu": "a100"}, gpu_models=["NVIDIA A100-SXM4-80GB"] * 4)


def _reserve(app, **body) -> dict:
    r = app.client.post(RES, json={"cluster": "main", "workspaces": ["vision"], **body}, headers=_admin(app))
    assert r.status_code == 201, r.text
    return r.json()


def _bad(app, status: int, code: str, words: str, **body) -> None:
    full = {"name": "bad", "cluster": "main", "workspaces": ["vision"], "machines": ["gpu-1"], **body}
    for k in [k for k, v in body.items() if v is ...]:
        del full[k]
    _refused(app.client.post(RES, json=full, headers=_admin(app)), status, code, words)


def _events(app, token: str | None = None, api: str | None = None) -> list[tuple[str, str, str]]:
    items = app.client.get((api or app.api) + "/events", headers=app.h(token)).json()["items"]
    return [(e["kind"], e["object"], e["message"]) for e in items]


def test_reserve_machines_by_name_list_get_and_end(app):
    _machines(app)
    v = _reserve(app, name="launch", machines=["gpu-2", "gpu-1"], start=FAR, end=FAR_END)
    assert v == {"name": "launch", "cluster": "main", "workspaces": ["vision"], "machines": ["gpu-2", "gpu-1"],
                 "pool": None, "count": None, "start": FAR, "end": FAR_END, "state": "Scheduled",
                 "created_at": v["created_at"], "created_by": "admin", "updated_by": "admin"}
    now = _reserve(app, name="now", machines=["gpu-3"])  # start: now; no end
    assert now["state"] == "Active" and now["end"] is None
    assert [x["name"] for x in app.client.get(RES, headers=_admin(app)).json()["items"]] == ["now", "launch"]
    assert app.client.get(RES + "/launch", headers=_admin(app)).json()["machines"] == ["gpu-2", "gpu-1"]
    assert app.client.get(app.api + "/reservations", headers=app.h()).json()["items"][1]["name"] == "launch"
    r = app.client.delete(RES + "/now", headers=_admin(app))
    assert r.status_code == 200 and r.json()["state"] == "Ended", r.text
    _refused(app.client.get(RES + "/nope", headers=_admin(app)), 404, "NOT_FOUND", "reservation nope")
    # an ended reservation's name may be used again
    assert _reserve(app, name="now", machines=["gpu-3"], start=FAR, end=FAR_END)["state"] == "Scheduled"
    # workspace users cannot reserve
    _refused(app.client.post(RES, json={"name": "x", "cluster": "main", "workspaces": ["vision"],
                                        "machines": ["gpu-1"]}, headers=app.h()), 403, "FORBIDDEN")


def test_bad_reservations_are_refused_naming_the_field(app):
    _machines(app, 2)
    r = app.client.post(POOLS, json={"name": "a100", "machines": ["gpu-1", "gpu-2"]}, headers=_admin(app))
    assert r.status_code == 201, r.text
    _bad(app, 422, "INVALID", "end: must be after start (2099-12-01T10:00:00Z)", start=FAR, end=FAR)
    _bad(app, 422, "INVALID", "end: 2020-01-01T00:00:00Z is in the past", end="2020-01-01T00:00:00Z")
    _bad(app, 422, "INVALID", "start: 'tomorrow' is not an ISO 8601 time", start="tomorrow")
    _bad(app, 422, "INVALID", "end: 'soon' is not an ISO 8601 time", end="soon")
    _bad(app, 422, "INVALID", "machines: no machine named gpu-9 in cluster main", machines=["gpu-9"])
    _bad(app, 422, "INVALID", "pool: no pool named nope in cluster main", machines=..., pool="nope", count=1)
    _bad(app, 422, "INVALID", "count: pool a100 has 2 machines, 3 asked", machines=..., pool="a100", count=3)
    _bad(app, 422, "INVALID", "machines: give machines, or pool and count", machines=...)
    _bad(app, 422, "INVALID", "machines: give machines, or pool and count", pool="a100", count=1)
    _bad(app, 422, "INVALID", "count:", machines=..., pool="a100")
    _bad(app, 422, "INVALID", "count:", machines=..., pool="a100", count=0)
    _bad(app, 422, "INVALID", "workspaces: no workspace named ghost", workspaces=["ghost"])
    _bad(app, 422, "INVALID", "workspaces:", workspaces=[])
    _bad(app, 422, "INVALID", "workspaces:", workspaces=...)
    _bad(app, 422, "INVALID", "name:", name="Not_A_Label")
    _bad(app, 422, "INVALID", "colour: unknown field", colour="red")
    _bad(app, 404, "CLUSTER_NOT_FOUND", "cluster nope", cluster="nope")
    r = app.client.post(ORG + "/clusters", json={"name": "other"}, headers=_admin(app))
    assert r.status_code == 201, r.text
    _second_workspace(app, "elsewhere", clusters={"other": {}})
    _bad(app, 422, "INVALID", "workspaces: workspace elsewhere has no access to cluster main",
         workspaces=["vision", "elsewhere"])
    _reserve(app, name="first", machines=["gpu-1"], start=FAR, end=FAR_END)
    _bad(app, 409, "ALREADY_EXISTS", "reservation named first", name="first", machines=["gpu-2"])
    assert [x["name"] for x in app.client.get(RES, headers=_admin(app)).json()["items"]] == ["first"]


def test_overlaps_are_refused_naming_the_other(app):
    _machines(app, 2)
    _reserve(app, name="first", machines=["gpu-1"], start=FAR, end=FAR_END)
    msg = "machine gpu-1 is already reserved by first from 2099-12-01T10:00:00Z to 2099-12-02T10:00:00Z"
    _bad(app, 409, "RESERVATION_CONFLICT", msg, machines=["gpu-2", "gpu-1"], start="2099-12-01T12:00:00Z",
         end="2099-12-03T00:00:00Z")
    _bad(app, 409, "RESERVATION_CONFLICT", msg, machines=["gpu-1"])  # from now, no end: overlaps too
    # back to back is no overlap
    _reserve(app, name="before", machines=["gpu-1"], start="2099-11-30T10:00:00Z", end=FAR)
    _reserve(app, name="after", machines=["gpu-1"], start=FAR_END)
    _bad(app, 409, "RESERVATION_CONFLICT", "machine gpu-1 is already reserved by after from 2099-12-02T10:00:00Z "
         "to no end", machines=["gpu-1"], start="2100-01-01T00:00:00Z")


def test_pool_and_count_choose_free_machines_in_name_order(app):
    _machines(app, 3)
    r = app.client.post(POOLS, json={"name": "a100", "labels": {"gpu": "a100"}}, headers=_admin(app))
    assert r.status_code == 201, r.text
    _reserve(app, name="first", machines=["gpu-1"], start=FAR, end=FAR_END)
    v = _reserve(app, name="two", pool="a100", count=2, start=FAR, end=FAR_END)
    assert v["machines"] == ["gpu-2", "gpu-3"] and v["pool"] == "a100" and v["count"] == 2
    _bad(app, 409, "RESERVATION_CONFLICT", "machine gpu-1 is already reserved by first", machines=...,
         pool="a100", count=1, start=FAR, end=FAR_END)
    # outside those windows the whole pool is free
    assert _reserve(app, name="later", pool="a100", count=3, start="2100-01-01T00:00:00Z")["machines"] == [
        "gpu-1", "gpu-2", "gpu-3"]


def test_a_workspace_sees_only_its_reservations_and_runs_name_only_those(app):
    _machines(app, 2)
    tok = _second_workspace(app)
    b_api = "/api/v1/o/acme/w/team-b"
    _reserve(app, name="mine", machines=["gpu-1"], start=FAR, end=FAR_END)
    _reserve(app, name="theirs", workspaces=["team-b"], machines=["gpu-2"], start=FAR, end=FAR_END)
    assert [x["name"] for x in app.client.get(app.api + "/reservations", headers=app.h()).json()["items"]] == ["mine"]
    assert [x["name"] for x in app.client.get(b_api + "/reservations", headers=_h(tok)).json()["items"]] == [
        "theirs"]
    field = "spec.task_template.requested_resources.node_selection.reservation"
    _refused(app.client.post(app.api + "/runs", json=_run("r1", reservation="theirs"), headers=app.h()), 422,
             "INVALID", f"{field}: no reservation named theirs for workspace vision on cluster main")
    _refused(app.client.post(app.api + "/runs", json=_run("r1", reservation="ghost"), headers=app.h()), 422,
             "INVALID", f"{field}: no reservation named ghost for workspace vision on cluster main")
    r = app.client.post(app.api + "/runs", json=_run("r1", reservation="mine"), headers=app.h())
    assert r.status_code == 201, r.text
    ended = app.client.delete(RES + "/mine", headers=_admin(app)).json()["end"]
    _refused(app.client.post(app.api + "/runs", json=_run("r2", reservation="mine"), headers=app.h()), 422,
             "INVALID", f"{field}: reservation mine ended at {ended}")


def _leads(app) -> None:
    wait_for(lambda: app.cp.leader is None or app.cp.leader.current() is not None, what="the loop leads")


def test_window_events_are_written_once_to_each_reserved_workspace(app):
    _machines(app, 1)
    tok = _second_workspace(app)
    b_api = "/api/v1/o/acme/w/team-b"
    start, end = time.time() + 3600, time.time() + 7200
    _reserve(app, name="launch", workspaces=["vision", "team-b"], machines=["gpu-1"],
             start=services.iso(start), end=services.iso(end))
    _leads(app)
    sched_loop.cycle(app.cp, at=start + 1)
    sched_loop.cycle(app.cp, at=start + 2)
    started = ("ReservationStarted", "launch",
               f"Reservation launch started: gpu-1 reserved for this workspace until {services.iso(end)}")
    assert _events(app).count(started) == 1
    assert _events(app, tok, b_api).count(started) == 1
    sched_loop.cycle(app.cp, at=end + 1)
    sched_loop.cycle(app.cp, at=end + 2)
    ended = ("ReservationEnded", "launch", "Reservation launch ended: gpu-1 no longer reserved for this workspace")
    assert _events(app).count(ended) == 1 and _events(app, tok, b_api).count(ended) == 1
    with app.cp.sessions() as s:
        assert sched_loop.next_due_at(s, time.time()) is None  # nothing left to wake for


def test_the_loop_wakes_at_the_next_start_or_end(app):
    _machines(app, 1)
    start = time.time() + 3600
    _reserve(app, name="launch", machines=["gpu-1"], start=services.iso(start))
    with app.cp.sessions() as s:
        assert abs(sched_loop.next_due_at(s, time.time()) - start) < 1
    _reserve(app, name="soon", machines=["gpu-1"], start=services.iso(start - 1800), end=services.iso(start - 60))
    with app.cp.sessions() as s:
        assert abs(sched_loop.next_due_at(s, time.time() + 1) - (start - 1800)) < 1
        # the loop's one read of what is due next: the earliest opening, then once it opened the earliest end
        assert abs(sched_loop.next_due_at(s, time.time()) - (start - 1800)) < 1
        assert abs(sched_loop.next_due_at(s, start - 1700) - (start - 60)) < 1
        assert sched_loop.timers_due(s, time.time()) == (False, False, False, False)  # nothing due yet
        assert sched_loop.timers_due(s, start - 1799)[3]  # the window's opening is


def test_ending_an_open_reservation_writes_its_end_at_once(app):
    _machines(app, 1)
    _reserve(app, name="launch", machines=["gpu-1"])
    _leads(app)
    wait_for(lambda: any(k == "ReservationStarted" for k, _, _ in _events(app)), what="the window opens")
    assert app.client.delete(RES + "/launch", headers=_admin(app)).status_code == 200
    assert [k for k, o, _ in _events(app) if o == "launch"] == ["ReservationEnded", "ReservationStarted"]
    sched_loop.cycle(app.cp)
    assert [k for k, o, _ in _events(app) if o == "launch"] == ["ReservationEnded", "ReservationStarted"]


def test_the_snapshot_carries_pools_reservations_and_gpu_models(app):
    _machines(app, 2)
    _register(app, "cpu-1")
    app.client.post(POOLS, json={"name": "a100", "labels": {"gpu": "a100"}}, headers=_admin(app))
    app.client.patch(ORG + "/workspaces/vision", json={"clusters": {"main": {"pools": ["a100"]}}},
                     headers=_admin(app))
    _reserve(app, name="launch", machines=["gpu-2"], start=FAR)
    body = _run("r1", pools=["a100"], reservation="launch")
    body["spec"]["task_template"]["requested_resources"]["gpu_requests"]["model"] = "a100"
    assert app.client.post(app.api + "/runs", json=body, headers=app.h()).status_code == 201
    with app.cp.sessions() as s:
        from sqlalchemy import select

        from astraeus.server.db import Cluster

        snap, _ = sched_loop.build_snapshot(s, s.scalar(select(Cluster)), time.time())
    assert {m.name: m.gpu_model for m in snap.machines} == {"cpu-1": "", "gpu-1": "NVIDIA A100-SXM4-80GB",
                                                          "gpu-2": "NVIDIA A100-SXM4-80GB"}
    assert [(p.name, p.machines) for p in snap.pools] == [("a100", ("gpu-1", "gpu-2"))]
    (r,) = snap.reservations
    assert (r.name, r.machines, r.workspaces, r.end) == ("launch", ("gpu-2",), (app.boot["ns"],), None)
    assert [w.pools for w in snap.workspaces] == [("a100",)]
    sel = snap.waiting[0].node_selection
    assert (sel.pools, sel.gpu_model, sel.reservation) == (("a100",), "a100", "launch")


def test_others_work_on_a_reserved_machine_is_stopped_when_the_window_opens(app):
    """A run of vision holds gpu-1 (the only machine); team-b reserves it from now: vision's run is stopped like a
    preemption (no restart spent, not "paused for higher-priority work"), its history and events say why, and it
    waits while the window is open."""
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": "gpu-1", "gpus": 4, "cpu_cores": 16, "memory_bytes": 1 << 36,
                              "stop_grace_seconds": 1})
    cred = r.json()["credential"]
    _second_workspace(app)
    assert app.client.post(app.api + "/runs", json=_run("train"), headers=app.h()).status_code == 201

    def assignments() -> list[dict]:
        return app.client.get("/api/v1/agent/assignments", params={"machine": "gpu-1"},
                              headers=_h(cred)).json()["assignments"]

    def report(state: str, **extra) -> None:
        items = [{"worker": a["worker"], "attempt": a["attempt"], "state": state, "pid": 42, **extra}
                 for a in assignments()]
        r = app.client.post("/api/v1/agent/report", headers=_h(cred), json={"machine": "gpu-1", "workers": items})
        assert r.status_code == 200, r.text

    def worker() -> dict:
        return app.client.get(app.api + "/workers/train-0", headers=app.h()).json()

    wait_for(lambda: worker()["state"] == "Starting", what="train placed")
    report("Running")
    _reserve(app, name="launch", workspaces=["team-b"], machines=["gpu-1"])
    wait_for(lambda: worker()["state"] == "Stopping", what="train stopped for the reservation")
    assert worker()["reason"] == "Stopped for reservation launch"
    report("Exited", exit_code=143)
    wait_for(lambda: worker()["state"] == "Pending", what="train queued again")
    run = app.client.get(app.api + "/runs/train", headers=app.h()).json()["status"]
    assert run["restarts"] == 0 and run["preemptions"] == 1 and "console_reason" not in run
    assert "higher-priority" not in run["reason"]
    history = [(h["state"], h["reason"]) for h in run["history"]]
    assert ("Stopping", "Stopped for reservation launch") in history
    assert ("Pending", "Stopped for reservation launch; queued again") in history
    assert ("Preempted", "train", "Stopped for reservation launch") in _events(app)
    wait_for(lambda: any("reserved for another namespace" in x["reason"] for x in worker()["why_not"]),
             what="why-not line for gpu-1")
    assert all("launch" not in x["reason"] for x in worker()["why_not"])
    assert assignments() == []
