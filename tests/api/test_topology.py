"""Topology (issue 46) through the API: `node_selection.topology` is validated at submit (nothing stored when
bad), and a gang that must have one network block but cannot waits with the reason saying why."""

from __future__ import annotations

from tests.conftest import wait_for

REG = {"gpus": 8, "cpu_cores": 16, "memory_bytes": 1 << 36, "stop_grace_seconds": 1}
BLOCK = "topology.astraeus.io/block"
FIELD = "spec.task_template.requested_resources.node_selection.topology"


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _register(app, name: str, block: str) -> None:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": name, **REG, "labels": {BLOCK: block}})
    assert r.status_code == 200, r.text


def _gang(name: str, topology) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true",
        "requested_resources": {"gpu_requests": {"count": 8}, "machines": 2,
                                "node_selection": {"topology": topology}}}}}


def test_bad_topology_is_refused_naming_the_field_and_nothing_is_stored(app):
    for topology, words in [({"same": "row"}, '"same" must be "block" or "rack", not \'row\''),
                            ({"near": "block"}, "unknown key 'near': the one key is \"same\"")]:
        r = app.client.post(app.api + "/runs", json=_gang("g", topology), headers=app.h())
        assert r.status_code == 422, r.text
        assert FIELD in r.json()["message"] and words in r.json()["message"], r.json()
    assert app.client.get(app.api + "/runs", headers=app.h()).json()["items"] == []


def test_a_gang_that_needs_one_block_waits_with_the_reason(app):
    _register(app, "gpu-1", "blk-a")
    _register(app, "gpu-2", "blk-b")
    r = app.client.post(app.api + "/runs", json=_gang("train", {"same": "block"}), headers=app.h())
    assert r.status_code == 201, r.text

    def reason() -> str:
        return app.client.get(app.api + "/runs/train", headers=app.h()).json()["status"].get("reason") or ""

    wait_for(lambda: "one network block" in reason(), what="the gang's reason")
    assert reason() == ("Cannot run on this cluster: needs 2 machines in one network block "
                        "(topology.astraeus.io/block); the largest block it may use, blk-a, has 1")
