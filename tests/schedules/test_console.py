"""The console's schedule pages (in process, a Bearer header): the list, and one schedule with its last and next
ticks, its runs (linked to their pages) and its latest ticks; env values hidden from a viewer as on a run's page."""

from __future__ import annotations

import pytest

from tests.conftest import make_app
from tests.schedules.test_ticks_made import T0, Plane, utc


@pytest.fixture
def plane(tmp_path):
    client, boot, cp, _ = make_app(tmp_path, None, run_loop=False)
    with client:
        yield Plane(client, boot, cp)
    cp.engine.dispose()


def test_the_schedules_pages(plane):
    run = {"task_template": {"image": "python:3.11", "command": "true", "env": {"TOKEN": "s3cret"}}}
    plane.create("nightly", T0, concurrency="Forbid", run=run)
    plane.tick(utc("2026-01-10T01:00:01"))
    plane.tick(utc("2026-01-11T01:00:01"))
    h = plane.h
    r = plane.client.get("/o/acme/w/vision/schedules", headers=h)
    assert r.status_code == 200
    assert 'href="/o/acme/w/vision/schedules/nightly"' in r.text
    assert "202601110200 Skipped" in r.text and "2026-01-12T01:00:00Z" in r.text and "nightly-202601100200" in r.text
    r = plane.client.get("/o/acme/w/vision/schedules/nightly", headers=h)
    assert r.status_code == 200
    assert "<code>0 2 * * *</code> in Europe/Berlin" in r.text
    assert "202601110200 (2026-01-11T01:00:00Z): Skipped — tick 202601110200 skipped: nightly-202601100200 is " \
           "still Pending (concurrency Forbid)" in r.text
    assert "202601120200 (2026-01-12T01:00:00Z)" in r.text
    assert '<a href="/o/acme/w/vision/jobs/main/nightly-202601100200">nightly-202601100200</a>' in r.text
    assert "s3cret" in r.text  # an editor sees env values
    r = plane.client.get("/o/acme/w/vision/schedules/nope", headers=h)
    assert r.status_code == 404 and "schedule nope not found" in r.text


def test_a_viewer_does_not_see_env_values(plane):
    plane.create("nightly", T0, run={"task_template": {"image": "python:3.11", "command": "true",
                                                       "env": {"TOKEN": "s3cret"}}})
    admin = {"Authorization": f"Bearer {plane.boot['admin_token']}"}
    r = plane.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                          headers=admin)
    assert r.status_code == 201, r.text
    viewer = {"Authorization": f"Bearer {r.json()['token']}"}
    page = plane.client.get("/o/acme/w/vision/schedules/nightly", headers=viewer)
    assert page.status_code == 200 and "s3cret" not in page.text and "******" in page.text
    shown = plane.client.get(f"{plane.api}/schedules/nightly", headers=viewer).json()
    assert shown["spec"]["run"]["task_template"]["env"] == {"TOKEN": "******"}
