"""`astra astraeus schedules list|show|create -f FILE|delete NAME` as a subprocess against a real local cluster."""

from __future__ import annotations

import json

from tests.cli.test_commands import astra, ok, one_line_error

NIGHTLY = {"metadata": {"name": "cli-nightly"},
           "spec": {"schedule": "0 2 * * *", "timezone": "Europe/Berlin", "concurrency": "Forbid",
                    "run": {"task_template": {"image": "python:3.11", "command": "true"}}}}


def test_schedules_from_the_cli(shared_cluster, tmp_path):
    c = shared_cluster
    (tmp_path / "nightly.json").write_text(json.dumps(NIGHTLY))
    bad = json.loads(json.dumps(NIGHTLY))
    bad["spec"]["schedule"] = "0 25 * * *"
    (tmp_path / "bad.json").write_text(json.dumps(bad))

    out = ok(astra(c, "astraeus", "schedules", "create", "-f", "nightly.json", cwd=tmp_path))
    assert out.startswith("schedule cli-nightly created; next tick ") and "0200 (" in out
    rows = ok(astra(c, "astraeus", "schedules", "list")).splitlines()
    assert rows[0].split() == ["NAME", "SCHEDULE", "TIMEZONE", "CONCURRENCY", "LAST", "TICK", "NEXT", "TICK",
                               "ACTIVE"]
    assert rows[1].split()[:7] == ["cli-nightly", "0", "2", "*", "*", "*", "Europe/Berlin"]
    assert "Forbid" in rows[1]
    shown = json.loads(ok(astra(c, "astraeus", "schedules", "show", "cli-nightly")))
    assert shown["spec"]["timezone"] == "Europe/Berlin" and shown["status"]["next_tick"]["tick"].endswith("0200")

    err = one_line_error(astra(c, "astraeus", "schedules", "create", "-f", "bad.json", cwd=tmp_path))
    assert "422" in err and "spec.schedule: '0 25 * * *' is not a valid cron line" in err
    err = one_line_error(astra(c, "astraeus", "schedules", "create", "-f", "nightly.json", cwd=tmp_path))
    assert "409" in err and "a schedule named cli-nightly already exists" in err

    assert ok(astra(c, "astraeus", "schedules", "delete", "cli-nightly")) == "schedule cli-nightly deleted\n"
    err = one_line_error(astra(c, "astraeus", "schedules", "show", "cli-nightly"))
    assert "404" in err and "schedule cli-nightly not found" in err
