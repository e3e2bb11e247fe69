"""The scheduling leader's tick duty (astraeus.server.schedules.make_ticks) with an injected clock: one run
<schedule>-<YYYYMMDDHHMM> per tick, never two; each concurrency policy; missed ticks inside and outside the starting
deadline; time zones and DST; suspend; a lowered maximum priority refuses the tick with an event; a replica that no
longer leads writes nothing. What is checked is what the API shows (runs, the schedule's ticks, events)."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from astraeus.server import schedules, services
from astraeus.server.db import Workspace
from astraeus.server.leader import NotLeader, Term
from tests.conftest import drop_postgres, make_app, postgres_url

RUN = {"task_template": {"image": "python:3.11", "command": "true"}}


def utc(s: str) -> float:
    return dt.datetime.fromisoformat(s).replace(tzinfo=dt.UTC).timestamp()


class Plane:
    def __init__(self, client, boot, cp):
        self.client, self.boot, self.cp = client, boot, cp
        self.api = f"/api/v1/o/{boot['org']}/w/{boot['workspace']}"
        self.h = {"Authorization": f"Bearer {boot['token']}"}

    def create(self, name: str, at: float, **spec):
        """The schedule as POST /schedules makes it, at the injected time `at`."""
        b = {"metadata": {"name": name}, "spec": {"schedule": "0 2 * * *", "timezone": "Europe/Berlin", "run": RUN}}
        b["spec"].update(spec)
        self._as_editor(lambda s, c: schedules.create(s, c, schedules.ScheduleBody.model_validate(b), at))

    def replace(self, name: str, at: float, **spec):
        b = {"metadata": {"name": name}, "spec": {**self.show(name)["spec"], **spec}}
        self._as_editor(lambda s, c: schedules.replace(s, c, name, schedules.ScheduleBody.model_validate(b), at))

    def _as_editor(self, fn):
        with self.cp.sessions() as s, services.tx(s):
            ws = s.query(Workspace).filter_by(name=self.boot["workspace"]).one()
            fn(s, services.system_caller(s, ws))

    def tick(self, at: float, term: Term | None = None) -> None:
        schedules.make_ticks(self.cp, term or self.cp.leader.current(), self.cp.settings.leader_lease_seconds, at)

    def show(self, name: str) -> dict:
        r = self.client.get(f"{self.api}/schedules/{name}", headers=self.h)
        assert r.status_code == 200, r.text
        return r.json()

    def runs(self) -> dict[str, str]:
        items = self.client.get(f"{self.api}/runs", headers=self.h).json()["items"]
        return {r["metadata"]["name"]: r["status"]["state"] for r in items}

    def events(self, kind: str) -> list[str]:
        items = self.client.get(f"{self.api}/events", headers=self.h).json()["items"]
        return [e["message"] for e in items if e["kind"] == kind]

    def delete_run(self, name: str) -> None:
        assert self.client.delete(f"{self.api}/runs/{name}", headers=self.h).status_code == 200


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def plane(request, tmp_path):
    """The control plane in process without its loop (the test calls the tick duty with its own clock), on SQLite
    and on PostgreSQL."""
    url = postgres_url() if request.param == "postgresql" else None
    client, boot, cp, _ = make_app(tmp_path, url, run_loop=False)
    with client:
        yield Plane(client, boot, cp)
    cp.engine.dispose()
    if url:
        drop_postgres(url)


T0 = utc("2026-01-10T00:00")  # 01:00 in Berlin; "0 2 * * *" ticks at 01:00 UTC (winter)


def test_allow_one_run_per_tick_never_two(plane):
    plane.create("nightly", T0)
    plane.tick(T0 + 1800)
    assert plane.runs() == {}
    plane.tick(utc("2026-01-10T01:00:02"))
    plane.tick(utc("2026-01-10T01:00:03"))  # the same tick again: nothing more
    plane.tick(utc("2026-01-10T01:00:02"))
    assert plane.runs() == {"nightly-202601100200": "Pending"}
    sc = plane.show("nightly")
    assert sc["status"]["last_tick"]["outcome"] == "Created"
    assert sc["status"]["last_tick"]["run"] == "nightly-202601100200"
    assert sc["status"]["next_tick"] == {"tick": "202601110200", "at": "2026-01-11T01:00:00Z"}
    plane.tick(utc("2026-01-11T01:00:01"))  # Allow: the first is still Pending, a second is made
    assert plane.runs() == {"nightly-202601100200": "Pending", "nightly-202601110200": "Pending"}
    sc = plane.show("nightly")
    assert [r["name"] for r in sc["status"]["runs"]] == ["nightly-202601110200", "nightly-202601100200"]
    assert sorted(sc["status"]["active"]) == ["nightly-202601100200", "nightly-202601110200"]
    assert plane.events("ScheduleTick") == ["schedule nightly: tick 202601110200: run nightly-202601110200 submitted",
                                            "schedule nightly: tick 202601100200: run nightly-202601100200 submitted"]
    run = plane.client.get(f"{plane.api}/runs/nightly-202601100200", headers=plane.h).json()
    assert run["metadata"]["created_at"] == "2026-01-10T01:00:02Z"


def test_forbid_skips_while_the_previous_run_has_not_ended(plane):
    plane.create("nightly", T0, concurrency="Forbid")
    plane.tick(utc("2026-01-10T01:00:01"))
    plane.tick(utc("2026-01-11T01:00:01"))
    assert plane.runs() == {"nightly-202601100200": "Pending"}
    sc = plane.show("nightly")
    assert sc["status"]["last_tick"]["outcome"] == "Skipped"
    assert plane.events("ScheduleTickSkipped") == [
        "schedule nightly: tick 202601110200 skipped: nightly-202601100200 is still Pending (concurrency Forbid)"]
    plane.delete_run("nightly-202601100200")  # it ends
    plane.tick(utc("2026-01-12T01:00:01"))
    assert plane.runs() == {"nightly-202601120200": "Pending"}


def test_replace_deletes_the_previous_run(plane):
    plane.create("nightly", T0, concurrency="Replace")
    plane.tick(utc("2026-01-10T01:00:01"))
    plane.tick(utc("2026-01-11T01:00:01"))
    assert plane.runs() == {"nightly-202601110200": "Pending"}
    assert plane.client.get(f"{plane.api}/runs/nightly-202601100200", headers=plane.h).status_code == 404
    assert plane.events("ScheduleRunReplaced") == [
        "schedule nightly: tick 202601110200 deleted nightly-202601100200 (still Pending; concurrency Replace)"]
    assert plane.events("RunDeleted") == ["nightly-202601100200 deleted"]


def test_missed_ticks_inside_the_deadline_are_caught_up_outside_skipped_with_an_event(plane):
    start = utc("2026-01-10T10:00:30")
    plane.create("every-minute", start, schedule="* * * * *", timezone="UTC", starting_deadline_seconds=180)
    # the control plane was down from 10:00:30 to 10:10:05: ticks 10:01-10:07 are older than 180 s
    plane.tick(utc("2026-01-10T10:10:05"))
    assert sorted(plane.runs()) == [f"every-minute-2026011010{m:02d}" for m in (8, 9, 10)]
    assert plane.events("ScheduleTicksMissed") == [
        "schedule every-minute: 7 ticks (202601101001 to 202601101007) missed by more than the starting deadline of "
        "180s (the control plane was down or no replica led): skipped, no run made"]
    ticks = {t["tick"]: t["outcome"] for t in plane.show("every-minute")["status"]["ticks"]}
    assert ticks == {"202601101007": "Skipped", "202601101008": "Created", "202601101009": "Created",
                     "202601101010": "Created"}
    plane.tick(utc("2026-01-10T10:11:00"))  # on time again
    assert len(plane.runs()) == 4 and "every-minute-202601101011" in plane.runs()


def test_a_skipped_dst_hour_ticks_once_at_the_shift_and_a_repeated_hour_once(plane):
    plane.create("spring", utc("2026-03-28T12:00"), schedule="30 2 * * *")
    plane.tick(utc("2026-03-29T00:59:59"))
    assert plane.runs() == {}
    plane.tick(utc("2026-03-29T01:00:01"))  # 03:00 CEST: 02:30 did not exist
    plane.tick(utc("2026-03-30T00:30:01"))  # 02:30 CEST the next night
    assert sorted(plane.runs()) == ["spring-202603290300", "spring-202603300230"]

    plane.create("autumn", utc("2026-10-24T12:00"), schedule="30 2 * * *")
    plane.tick(utc("2026-10-25T00:30:01"))  # 02:30 CEST, first pass
    plane.tick(utc("2026-10-25T01:30:01"))  # 02:30 CET, the second pass: no tick
    assert sorted(n for n in plane.runs() if n.startswith("autumn")) == ["autumn-202610250230"]
    assert plane.show("autumn")["status"]["next_tick"] == {"tick": "202610260230", "at": "2026-10-26T01:30:00Z"}


def test_changing_the_time_zone_moves_the_next_tick(plane):
    plane.create("nightly", T0)
    plane.tick(utc("2026-01-10T01:00:01"))
    plane.replace("nightly", utc("2026-01-10T12:00"), timezone="America/New_York")
    assert plane.show("nightly")["status"]["next_tick"] == {"tick": "202601110200", "at": "2026-01-11T07:00:00Z"}
    plane.tick(utc("2026-01-11T01:00:01"))  # Berlin's 02:00 is no longer a tick
    plane.tick(utc("2026-01-11T07:00:01"))
    assert sorted(plane.runs()) == ["nightly-202601100200", "nightly-202601110200"]
    run = plane.client.get(f"{plane.api}/runs/nightly-202601110200", headers=plane.h).json()
    assert run["metadata"]["created_at"] == "2026-01-11T07:00:01Z"


def test_suspended_ticks_make_nothing_and_are_not_caught_up(plane):
    plane.create("nightly", T0, suspend=True)
    assert plane.show("nightly")["status"]["next_tick"] is None
    plane.tick(utc("2026-01-10T01:00:01"))
    plane.replace("nightly", utc("2026-01-10T01:05"), suspend=False)
    plane.tick(utc("2026-01-10T01:05:01"))
    assert plane.runs() == {}
    plane.tick(utc("2026-01-11T01:00:01"))
    assert plane.runs() == {"nightly-202601110200": "Pending"}


def test_a_lowered_maximum_refuses_the_tick_with_an_event_never_a_lower_priority(plane):
    admin = {"Authorization": f"Bearer {plane.boot['admin_token']}"}

    def set_max(v):
        r = plane.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": v}}},
                               headers=admin)
        assert r.status_code == 200, r.text

    set_max(10)
    plane.create("nightly", T0, run={**RUN, "priority": 10})
    set_max(0)
    plane.tick(utc("2026-01-10T01:00:01"))
    assert plane.runs() == {}
    [msg] = plane.events("ScheduleTickRefused")
    assert msg.startswith("schedule nightly: tick 202601100200 refused: PRIORITY_NOT_ALLOWED priority 10 is above "
                          f"namespace {plane.boot['ns']}'s maximum of 0")
    assert "never submitted at a lower priority" in msg
    last = plane.show("nightly")["status"]["last_tick"]
    assert last["outcome"] == "Refused" and "maximum of 0" in last["message"]
    set_max(10)
    plane.tick(utc("2026-01-11T01:00:01"))
    assert plane.runs() == {"nightly-202601110200": "Pending"}
    run = plane.client.get(f"{plane.api}/runs/nightly-202601110200", headers=plane.h).json()
    assert run["spec"]["priority"] == 10


def test_a_replica_that_no_longer_leads_writes_nothing(plane):
    plane.create("nightly", T0)
    with pytest.raises(NotLeader):
        plane.tick(utc("2026-01-10T01:00:01"), term=Term(holder="someone-else", epoch=999))
    assert plane.runs() == {}
    assert plane.show("nightly")["status"]["last_tick"] is None
    plane.tick(utc("2026-01-10T01:00:01"))
    assert plane.runs() == {"nightly-202601100200": "Pending"}


def test_a_run_name_already_taken_refuses_the_tick(plane):
    plane.create("nightly", T0)
    body = {"metadata": {"name": "nightly-202601100200"}, "spec": copy.deepcopy(RUN)}
    assert plane.client.post(f"{plane.api}/runs", json=body, headers=plane.h).status_code == 201
    plane.tick(utc("2026-01-10T01:00:01"))
    [msg] = plane.events("ScheduleTickRefused")
    assert "ALREADY_EXISTS" in msg and "nightly-202601100200 already exists" in msg


def test_a_tick_already_recorded_is_not_made_again_after_a_time_zone_change(plane):
    plane.create("nightly", T0)
    plane.tick(utc("2026-01-10T01:00:01"))  # 02:00 in Berlin: nightly-202601100200
    plane.replace("nightly", utc("2026-01-10T01:30"), timezone="UTC")
    assert plane.show("nightly")["status"]["next_tick"] == {"tick": "202601100200", "at": "2026-01-10T02:00:00Z"}
    plane.tick(utc("2026-01-10T02:00:01"))  # the same tick name: handled already, nothing more
    assert plane.runs() == {"nightly-202601100200": "Pending"}
    assert plane.show("nightly")["status"]["next_tick"] == {"tick": "202601110200", "at": "2026-01-11T02:00:00Z"}
    assert not plane.events("ScheduleTickRefused")
