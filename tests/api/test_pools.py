"""Pools (issue 18): an organisation admin groups a cluster's machines by name and/or label
(`$ORG_API/clusters/{cluster}/pools`), limits a workspace's access to some pools, and a run asks for pools. Every
bad input is a 4xx naming the field; membership follows the labels (a machine registering later joins); a workspace
sees only the pools it may use (`GET $API/pools`), and each machine lists its pools (`GET $API/machines`).
In-process control plane (machines registered by the test), SQLite and PostgreSQL."""

from __future__ import annotations

REG = {"gpus": 4, "cpu_cores": 16, "memory_bytes": 1 << 36, "stop_grace_seconds": 1}
ORG = "/api/v1/o/acme"
POOLS = ORG + "/clusters/main/pools"


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _admin(app) -> dict:
    return _h(app.boot["admin_token"])


def _register(app, name: str, **decl) -> None:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": name, **REG, **decl})
    assert r.status_code == 200, r.text


def _machines(app) -> None:
    _register(app, "gpu-1", labels={"gpu": "a100"}, gpu_models=["NVIDIA A100-SXM4-80GB"] * 4)
    _register(app, "gpu-2", labels={"gpu": "a100", "rack": "r2"}, gpu_models=["NVIDIA A100-SXM4-80GB"] * 4)
    _register(app, "gpu-3", labels={"gpu": "h100"}, gpu_models=["NVIDIA H100 80GB HBM3"] * 4)


def _refused(r, status: int, code: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    for w in words:
        assert w in body["message"], body
    return body


def _create(app, body: dict) -> dict:
    r = app.client.post(POOLS, json=body, headers=_admin(app))
    assert r.status_code == 201, r.text
    return r.json()


def _second_workspace(app, name: str = "team-b", clusters: dict | None = None) -> str:
    r = app.client.post(ORG + "/workspaces", json={"name": name, "clusters": clusters or {"main": {}}},
                        headers=_admin(app))
    assert r.status_code == 201, r.text
    r = app.client.post(ORG + "/tokens", json={"kind": "user", "workspace": name, "role": "editor"},
                        headers=_admin(app))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _run(name: str, **selection) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true",
        "requested_resources": {"gpu_requests": {"count": 1}, "node_selection": selection}}}}


def test_pool_crud_by_names_and_labels(app):
    _machines(app)
    p = _create(app, {"name": "a100", "labels": {"gpu": "a100"}})
    assert p["name"] == "a100" and p["cluster"] == "main"
    assert p["selector"] == {"machines": [], "labels": {"gpu": "a100"}}
    assert p["machines"] == ["gpu-1", "gpu-2"] and p["gpus"] == 8 and p["free_gpus"] == 8 and p["created_at"]
    both = _create(app, {"name": "mixed", "machines": ["gpu-3"], "labels": {"rack": "r2"}})
    assert both["machines"] == ["gpu-2", "gpu-3"]  # the union of both
    assert [x["name"] for x in app.client.get(POOLS, headers=_admin(app)).json()["items"]] == ["a100", "mixed"]
    assert app.client.get(POOLS + "/a100", headers=_admin(app)).json()["machines"] == ["gpu-1", "gpu-2"]
    r = app.client.put(POOLS + "/mixed", json={"machines": ["gpu-1"]}, headers=_admin(app))
    assert r.status_code == 200 and r.json()["machines"] == ["gpu-1"], r.text
    assert r.json()["selector"] == {"machines": ["gpu-1"], "labels": {}}
    r = app.client.delete(POOLS + "/mixed", headers=_admin(app))
    assert r.status_code == 200, r.text
    _refused(app.client.get(POOLS + "/mixed", headers=_admin(app)), 404, "NOT_FOUND", "pool mixed not found")


def test_a_machine_registering_later_with_the_labels_joins(app):
    _machines(app)
    _create(app, {"name": "a100", "labels": {"gpu": "a100"}})
    _register(app, "gpu-4", labels={"gpu": "a100"})
    assert app.client.get(POOLS + "/a100", headers=_admin(app)).json()["machines"] == ["gpu-1", "gpu-2", "gpu-4"]


def test_bad_pools_are_refused_naming_the_field(app):
    _machines(app)
    _refused(app.client.post(POOLS, json={"name": "x", "machines": ["nope"]}, headers=_admin(app)), 422, "INVALID",
             "machines: no machine named nope in cluster main")
    _refused(app.client.post(POOLS, json={"name": "x"}, headers=_admin(app)), 422, "INVALID",
             "machines: give machines or labels (or both)")
    _refused(app.client.post(POOLS, json={"name": "x", "machines": [], "labels": {}}, headers=_admin(app)), 422,
             "INVALID", "machines: give machines or labels (or both)")
    _refused(app.client.post(POOLS, json={"name": "Bad_Name", "machines": ["gpu-1"]}, headers=_admin(app)), 422,
             "INVALID", "name:")
    _refused(app.client.post(POOLS, json={"name": "x", "machines": ["gpu-1"], "colour": "red"},
                             headers=_admin(app)), 422, "INVALID", "colour: unknown field")
    _refused(app.client.post(POOLS, json={"name": "x", "machines": "gpu-1"}, headers=_admin(app)), 422, "INVALID",
             "machines")
    _refused(app.client.post(ORG + "/clusters/nope/pools", json={"name": "x", "machines": ["gpu-1"]},
                             headers=_admin(app)), 404, "CLUSTER_NOT_FOUND", "cluster nope")
    _create(app, {"name": "x", "machines": ["gpu-1"]})
    _refused(app.client.post(POOLS, json={"name": "x", "machines": ["gpu-2"]}, headers=_admin(app)), 409,
             "ALREADY_EXISTS", "pool named x")
    _refused(app.client.put(POOLS + "/x", json={"labels": {}}, headers=_admin(app)), 422, "INVALID",
             "machines: give machines or labels (or both)")
    _refused(app.client.put(POOLS + "/x", json={"name": "y", "machines": ["gpu-1"]}, headers=_admin(app)), 422,
             "INVALID", "name:")
    _refused(app.client.put(POOLS + "/nope", json={"machines": ["gpu-1"]}, headers=_admin(app)), 404, "NOT_FOUND",
             "pool nope")
    # workspace users cannot make pools
    _refused(app.client.post(POOLS, json={"name": "z", "machines": ["gpu-1"]}, headers=app.h()), 403, "FORBIDDEN")


def test_access_pools_limit_what_a_workspace_sees_and_asks(app):
    _machines(app)
    _create(app, {"name": "a100", "labels": {"gpu": "a100"}})
    _create(app, {"name": "h100", "labels": {"gpu": "h100"}})
    ws = ORG + "/workspaces/vision"
    # unrestricted: every pool of the cluster; each machine lists its pools
    assert app.client.get(app.api, headers=app.h()).json()["clusters"][0]["pools"] is None
    items = app.client.get(app.api + "/pools", headers=app.h()).json()["items"]
    assert [(p["name"], p["machines"], p["gpus"]) for p in items] == [("a100", ["gpu-1", "gpu-2"], 8),
                                                                       ("h100", ["gpu-3"], 4)]
    assert items[0]["gpu_models"] == ["NVIDIA A100-SXM4-80GB"] and items[0]["cluster"] == "main"
    assert items[0]["free_gpus"] == 8
    machines = {m["name"]: m["pools"] for m in app.client.get(app.api + "/machines", headers=app.h()).json()["items"]}
    assert machines == {"gpu-1": ["a100"], "gpu-2": ["a100"], "gpu-3": ["h100"]}

    _refused(app.client.patch(ws, json={"clusters": {"main": {"pools": ["nope"]}}}, headers=_admin(app)), 422,
             "INVALID", "clusters.main.pools: no pool named nope in cluster main")
    r = app.client.patch(ws, json={"clusters": {"main": {"pools": ["a100"]}}}, headers=_admin(app))
    assert r.status_code == 200 and r.json()["clusters"]["main"]["pools"] == ["a100"], r.text
    assert app.client.get(app.api, headers=app.h()).json()["clusters"][0]["pools"] == ["a100"]
    assert [p["name"] for p in app.client.get(app.api + "/pools", headers=app.h()).json()["items"]] == ["a100"]
    # a run may ask only for its workspace's pools, and only for pools of the cluster
    field = "spec.task_template.requested_resources.node_selection.pools"
    _refused(app.client.post(app.api + "/runs", json=_run("r1", pools=["h100"]), headers=app.h()), 403,
             "POOL_NOT_ALLOWED", f"{field}: pool h100 is not one of workspace vision's pools on cluster main (a100)")
    _refused(app.client.post(app.api + "/runs", json=_run("r1", pools=["nope"]), headers=app.h()), 422,
             "INVALID", f"{field}: no pool named nope in cluster main")
    r = app.client.post(app.api + "/runs", json=_run("r1", pools=["a100"]), headers=app.h())
    assert r.status_code == 201, r.text
    # a pool a workspace's access lists is in use
    _refused(app.client.delete(POOLS + "/a100", headers=_admin(app)), 409, "POOL_IN_USE",
             "workspace vision's access lists it")
    # null: every machine again; the pool may go then
    r = app.client.patch(ws, json={"clusters": {"main": {"pools": None}}}, headers=_admin(app))
    assert r.status_code == 200 and r.json()["clusters"]["main"]["pools"] is None, r.text
    # other access fields leave pools as they are
    app.client.patch(ws, json={"clusters": {"main": {"pools": ["h100"]}}}, headers=_admin(app))
    r = app.client.patch(ws, json={"clusters": {"main": {"weight": 2}}}, headers=_admin(app))
    assert r.json()["clusters"]["main"]["pools"] == ["h100"], r.text


def test_a_pool_reservation_not_ended_keeps_it(app):
    _machines(app)
    _create(app, {"name": "a100", "labels": {"gpu": "a100"}})
    r = app.client.post(ORG + "/reservations", json={"name": "launch", "cluster": "main", "workspaces": ["vision"],
                                                     "pool": "a100", "count": 1}, headers=_admin(app))
    assert r.status_code == 201, r.text
    _refused(app.client.delete(POOLS + "/a100", headers=_admin(app)), 409, "POOL_IN_USE",
             "reservation launch was made from it")
    assert app.client.delete(ORG + "/reservations/launch", headers=_admin(app)).status_code == 200
    assert app.client.delete(POOLS + "/a100", headers=_admin(app)).status_code == 200


def test_another_workspaces_pools_stay_out_of_sight(app):
    _machines(app)
    _create(app, {"name": "a100", "labels": {"gpu": "a100"}})
    _create(app, {"name": "h100", "labels": {"gpu": "h100"}})
    tok = _second_workspace(app, clusters={"main": {"pools": ["h100"]}})
    b_api = "/api/v1/o/acme/w/team-b"
    assert [p["name"] for p in app.client.get(b_api + "/pools", headers=_h(tok)).json()["items"]] == ["h100"]
    assert [p["name"] for p in app.client.get(app.api + "/pools", headers=app.h()).json()["items"]] == ["a100",
                                                                                                        "h100"]
    _refused(app.client.get(app.api + "/pools", headers=_h(tok)), 404, "NOT_FOUND")
