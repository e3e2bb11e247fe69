"""The API's refusals in the pages' words, exactly (the pages are the specification)."""

import pytest

from .test_api import DRIVE, run_body


def _set_max_priority(app, value: int) -> None:
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": value}}},
                         headers=admin)
    assert r.status_code == 200, r.text


# (the workspace's max priority, the priority asked for, the status, the refusal's message or None)
PRIORITY_CASES = [
    pytest.param(0, -100, 201, None, id="scavenger-without-a-grant"),
    pytest.param(0, 0, 201, None, id="default-priority"),
    pytest.param(10, 50, 403, "priority 50 is above namespace {ns}'s maximum of 10", id="page-example"),
    pytest.param(50, 60, 403, "priority 60 is above namespace {ns}'s maximum of 50", id="recipe-example"),
    pytest.param(-50, -10, 201, None, id="negative-is-allowed-under-a-negative-maximum"),
    pytest.param(-50, -1000, 201, None, id="lowest-under-a-negative-maximum"),
    pytest.param(-50, 0, 403, "priority 0 is above namespace {ns}'s maximum of -50", id="zero-above-a-negative-maximum"),
]


@pytest.mark.parametrize("maximum, priority, status, message", PRIORITY_CASES)
def test_negative_priorities_are_always_allowed(app, maximum, priority, status, message):
    """"A workspace may ask for priorities up to its max priority … Negative priorities are always allowed.\""""
    if maximum != 0:
        _set_max_priority(app, maximum)
    r = app.client.post(app.api + "/runs", json=run_body("r", priority=priority), headers=app.h())
    assert r.status_code == status, r.text
    if message is not None:
        ns = app.client.get(app.api, headers=app.h()).json()["id"]
        assert r.json() == {"code": "PRIORITY_NOT_ALLOWED", "message": message.format(ns=ns)}
    else:
        assert r.json()["spec"]["priority"] == priority


def test_host_path_refusal_names_where_an_admin_grants_it(app):
    bad = {**DRIVE, "spec": {**DRIVE["spec"], "sources": [{**DRIVE["spec"]["sources"][0], "path": "/etc/astraeus"}]}}
    r = app.client.post(app.api + "/drives", json=bad, headers=app.h())
    assert r.status_code == 403
    assert r.json() == {
        "code": "HOST_PATH_NOT_GRANTED",
        "message": "spec.sources[0].path /etc/astraeus is outside the host paths granted to workspace vision on "
                   "cluster main (/data/astraeus): use a path under one of them, or ask an organisation admin to "
                   "grant it (Settings → Clusters → Change → Host paths)",
    }
