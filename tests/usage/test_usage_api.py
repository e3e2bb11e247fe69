"""GET $API/usage and $ORG_API/usage on SQLite and PostgreSQL: who may read it, and bad input refused with what to
change (the sums themselves: test_usage_live.py, with real agents)."""

import pytest


def viewer(app) -> str:
    r = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                        headers=app.h(app.boot["admin_token"]))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def test_an_empty_workspace_has_no_usage_and_a_viewer_may_read_it(app):
    r = app.client.get(f"{app.api}/usage", params={"group_by": "user"}, headers=app.h(viewer(app)))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["group_by"] == ["user"] and body["items"] == []
    assert body["total"] == {"gpu_hours": 0, "gpu_seconds": 0, "cpu_core_hours": 0, "attempts": 0, "preemptions": 0,
                             "queue_wait_seconds": 0}
    assert body["since"] < body["until"]


@pytest.mark.parametrize("params, says", [
    ({"group_by": "bogus"}, "group_by='bogus' is not a grouping: use one or more of cluster, workspace, user, run, "
                            "gpu_model, day"),
    ({"group_by": "user,bogus"}, "group_by='bogus' is not a grouping"),
    ({"since": "yesterdayish"}, "since='yesterdayish' is not a time: give a duration back from now (7d, 12h, 30m), "
                                "an ISO 8601 date or time in UTC (2030-01-01, 2030-01-01T12:00:00Z)"),
    ({"until": "soon"}, "until='soon' is not a time"),
    ({"since": "1d", "until": "2d"}, "since=1d is not before until=2d: give a since earlier than until"),
])
def test_bad_input_is_422_saying_what_to_change(app, params, says):
    for path, token in ((f"{app.api}/usage", app.boot["token"]), ("/api/v1/o/acme/usage", app.boot["admin_token"])):
        r = app.client.get(path, params=params, headers=app.h(token))
        assert r.status_code == 422, r.text
        assert says in r.json()["message"]
    r = app.client.get(f"{app.api}/usage/records", params={"since": "yesterdayish"}, headers=app.h())
    assert r.status_code == 422 and "since='yesterdayish' is not a time" in r.json()["message"]


def test_the_organisation_report_is_for_organisation_admins(app):
    assert app.client.get("/api/v1/o/acme/usage", headers=app.h()).status_code == 403
    r = app.client.get("/api/v1/o/acme/usage", params=[("group_by", "workspace"), ("group_by", "day")],
                       headers=app.h(app.boot["admin_token"]))
    assert r.status_code == 200 and r.json()["group_by"] == ["workspace", "day"]
