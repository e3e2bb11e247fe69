"""A live schedule (issue 17, 'Done when'): a one-minute schedule on a real control plane (`astraeus server`) and a
real agent; the control plane is killed with kill -9 across a tick, and again right after the next tick was made.
Each tick makes exactly one run <schedule>-<YYYYMMDDHHMM>: the missed tick is caught up after the restart (inside
the starting deadline), and the tick made just before a kill is not made again."""

from __future__ import annotations

import calendar
import time

import httpx
import pytest

from tests.faults.conftest import sleeper_run, wait_for

pytestmark = pytest.mark.faults


def at_of(iso: str) -> float:
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def schedule_runs(srv) -> dict[str, str]:
    with srv.client() as c:
        items = c.get("/runs").json()["items"]
    return {r["metadata"]["name"]: r["status"]["state"] for r in items if r["metadata"]["name"].startswith("minutely-")}


def test_a_one_minute_schedule_makes_one_run_per_tick_across_kill9(fleet):
    srv = fleet.server(env={"ASTRAEUS_LEADER_LEASE_SECONDS": "3"})
    fleet.agent(srv)
    run = sleeper_run("x", gpus=0, code="print('tick', flush=True)", restart="Never")["spec"]
    body = {"metadata": {"name": "minutely"}, "spec": {"schedule": "* * * * *", "timezone": "UTC",
                                                       "concurrency": "Allow", "starting_deadline_seconds": 300,
                                                       "run": run}}
    with srv.client() as c:
        r = c.post("/schedules", json=body)
        assert r.status_code == 201, r.text
        first = r.json()["status"]["next_tick"]
    t1 = at_of(first["at"])
    name1 = f"minutely-{first['tick']}"

    # kill -9 just before the first tick; start again after it
    time.sleep(max(0.0, t1 - time.time() - 2))
    srv.kill9()
    time.sleep(max(0.0, t1 - time.time() + 3))
    srv.start()
    wait_for(lambda: name1 in schedule_runs(srv), timeout=30, what=f"the missed tick's run {name1}")
    wait_for(lambda: schedule_runs(srv).get(name1) == "Completed", timeout=30, what=f"{name1} to complete")

    # the next tick is made on time; kill -9 right after it is made, and start again at once
    with srv.client() as c:
        second = c.get("/schedules/minutely").json()["status"]["next_tick"]
    name2 = f"minutely-{second['tick']}"
    wait_for(lambda: name2 in schedule_runs(srv), timeout=at_of(second["at"]) - time.time() + 30, interval=0.05,
             what=f"the tick's run {name2}")
    srv.kill9()
    srv.start()
    wait_for(lambda: httpx.get(srv.url + "/healthz", timeout=5).json().get("role") == "leader", timeout=30,
             what="the restarted control plane to lead")
    time.sleep(3)  # a few cycles of the new leader

    assert set(schedule_runs(srv)) == {name1, name2}  # one run per tick, never two
    with srv.client() as c:
        sc = c.get("/schedules/minutely").json()
        events = [e for e in c.get("/events").json()["items"] if e["object"] == "minutely"]
    ticks = {t["tick"]: (t["outcome"], t["run"]) for t in sc["status"]["ticks"]}
    assert ticks == {first["tick"]: ("Created", name1), second["tick"]: ("Created", name2)}
    assert sorted(e["message"] for e in events if e["kind"] == "ScheduleTick") == sorted(
        [f"schedule minutely: tick {first['tick']}: run {name1} submitted",
         f"schedule minutely: tick {second['tick']}: run {name2} submitted"])
    assert not [e for e in events if e["kind"] in ("ScheduleTicksMissed", "ScheduleTickSkipped")]


