"""What-if (issue 18): `POST $API/runs?dry_run=true` answers what the run would do now, from the same `plan()` the
scheduling loop runs: starts where, preempts whom, is the head and starts by when, waits behind whom, or waits for
quota; refusals are the submit's own; nothing is stored (no run, worker, event or history). In-process control plane
(machines registered by the test, no agents), SQLite and PostgreSQL; and a live cluster where the run, submitted
after the answer, does what the answer said."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from astraeus.server.db import Event, History, Run, Worker
from tests.conftest import wait_for

ORG = "/api/v1/o/acme"


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def register(app, name: str, gpus: int = 4) -> None:
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": name, "gpus": gpus, "cpu_cores": 32, "memory_bytes": 1 << 38,
                              "stop_grace_seconds": 1})
    assert r.status_code == 200, r.text


def body(name: str, gpus: int = 1, priority: int | None = None, time_limit: int | None = None) -> dict:
    tt = {"image": "python:3.11", "command": "sleep", "args": ["600"],
          "requested_resources": {"gpu_requests": {"count": gpus}}}
    if time_limit:
        tt["time_limit_seconds"] = time_limit
    spec: dict = {"task_template": tt}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name}, "spec": spec}


def what_if(app, b: dict, headers: dict | None = None, status: int = 200) -> dict:
    r = app.client.post(app.api + "/runs", params={"dry_run": "true"}, json=b, headers=headers or app.h())
    assert r.status_code == status, r.text
    return r.json()


def submit(app, b: dict, ws: tuple[str, dict] | None = None) -> None:
    api, headers = ws or (app.api, app.h())
    r = app.client.post(api + "/runs", json=b, headers=headers)
    assert r.status_code == 201, r.text


def placed(app, worker: str, ws: tuple[str, dict] | None = None) -> dict:
    api, headers = ws or (app.api, app.h())

    def ok():
        w = app.client.get(f"{api}/workers/{worker}", headers=headers).json()
        return w if w.get("machine") else None

    return wait_for(ok, 20, what=f"{worker} to be placed")


def counts(app) -> tuple[int, int, int, int]:
    with app.cp.sessions() as s:
        return tuple(s.scalar(select(func.count()).select_from(t)) for t in (Run, Worker, Event, History))


def other_workspace(app) -> tuple[str, dict]:
    """Workspace nlp with access to cluster main: its $API and an editor's headers."""
    admin = _h(app.boot["admin_token"])
    assert app.client.post(f"{ORG}/workspaces", json={"name": "nlp", "clusters": {"main": {}}},
                           headers=admin).status_code == 201
    tok = app.client.post(f"{ORG}/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"},
                          headers=admin).json()["token"]
    return f"{ORG}/w/nlp", _h(tok)


def test_starts_now_names_the_machine_and_gpus_and_stores_nothing(app):
    register(app, "gpu-01")
    before = counts(app)
    events = app.client.get(app.api + "/events", headers=app.h()).json()
    a = what_if(app, body("probe", gpus=2))
    assert a["dry_run"] is True and a["name"] == "probe" and a["cluster"] == "main"
    assert a["outcome"] == "Starts", a
    assert a["placements"] == [{"worker": "probe-0", "machine": "gpu-01", "gpu_indices": [0, 1]}]
    assert a["message"] == "Starts now on gpu-01 (GPUs 0,1)"
    assert a["preempts"] == [] and a["starts_by"] is None and a["behind"] is None and a["backfilled"] is False
    # nothing stored: no run, worker, event or history; the name is still free
    assert counts(app) == before
    assert app.client.get(app.api + "/runs", headers=app.h()).json()["items"] == []
    assert app.client.get(app.api + "/events", headers=app.h()).json() == events
    assert app.client.get(app.api + "/runs/probe", headers=app.h()).status_code == 404
    submit(app, body("probe", gpus=2))
    w = placed(app, "probe-0")
    assert (w["machine"], w["gpu_indices"]) == ("gpu-01", [0, 1])


def test_preempts_names_own_victims_and_hides_another_namespaces(app):
    register(app, "gpu-01", gpus=2)
    nlp = other_workspace(app)
    submit(app, body("train", gpus=1, priority=-100))
    submit(app, body("theirs", gpus=1, priority=-100), nlp)
    placed(app, "train-0")
    placed(app, "theirs-0", nlp)
    before = counts(app)
    a = what_if(app, body("urgent", gpus=2, priority=0))
    assert a["outcome"] == "Preempts", a
    assert sorted(a["preempts"]) == ["a job in another namespace", "train-0"]
    assert a["preempts_workers"] == 2 and a["starts_by"] is not None
    assert a["message"].startswith(f"Would preempt 2 worker(s) ({', '.join(a['preempts'])}) and start by ")
    assert a["message"].endswith(" UTC")
    assert "theirs" not in str(a)
    assert counts(app) == before  # nothing stopped, nothing stored
    for w, (api, h) in (("train-0", (app.api, app.h())), ("theirs-0", nlp)):
        worker = app.client.get(f"{api}/workers/{w}", headers=h).json()
        assert worker["state"] != "Stopping" and worker["preemptions"] == 0, worker


def test_head_says_when_it_starts_and_a_lower_one_is_queued_behind_it(app):
    register(app, "gpu-01", gpus=2)
    submit(app, body("long", gpus=2, time_limit=600))
    placed(app, "long-0")
    a = what_if(app, body("next", gpus=2))
    assert a["outcome"] == "Head", a
    assert a["starts_by"] is not None and a["message"].startswith("Would be next to run: starts by ")
    assert a["reason"].startswith("Next to run (priority 0)")
    assert a["placements"] == [] and a["preempts"] == []
    submit(app, body("first", gpus=2))
    a = what_if(app, body("second", gpus=2, priority=-10))
    assert a["outcome"] == "Queued" and a["behind"] == "first", a
    assert a["message"].startswith("Would wait behind first, which starts by ")
    assert a["reason"].startswith("Queued behind first, which ")
    assert a["why_not"]["second-0"] == [{"machine": "gpu-01", "reason": a["why_not"]["second-0"][0]["reason"]}]


def test_queued_behind_another_namespaces_head_does_not_name_it(app):
    register(app, "gpu-01", gpus=2)
    nlp = other_workspace(app)
    submit(app, body("long", gpus=2, time_limit=600))
    placed(app, "long-0")
    submit(app, body("secret-head", gpus=2), nlp)
    a = what_if(app, body("mine", gpus=2, priority=-10))
    assert a["outcome"] == "Queued" and a["behind"] == "a job in another namespace", a
    assert "secret-head" not in str(a)


def test_waits_for_quota(app):
    register(app, "gpu-01")
    r = app.client.patch(f"{ORG}/workspaces/vision", json={"clusters": {"main": {"quota": {"gpus": 2}}}},
                         headers=_h(app.boot["admin_token"]))
    assert r.status_code == 200, r.text
    submit(app, body("small", gpus=1))
    placed(app, "small-0")
    a = what_if(app, body("big", gpus=2))
    assert a["outcome"] == "Waits", a
    assert a["reason"] == a["message"] == "Waits for namespace quota: gpus 1 in use + 2 asked > 2"
    assert a["placements"] == []


def test_refusals_are_the_submits_and_store_nothing(app):
    register(app, "gpu-01")
    before = counts(app)
    for b, status, code_or_text in [
        (body("hi", priority=60), 403, "PRIORITY_NOT_ALLOWED"),
        ({"metadata": {"name": "Bad_Name"}, "spec": body("x")["spec"]}, 422, "metadata.name"),
        (body("nogpu", gpus=-1), 422, "gpu_requests.count"),
        ({**body("far"), "spec": {**body("far")["spec"], "cluster": "nosuch"}}, 404, "CLUSTER_NOT_FOUND"),
    ]:
        dry = app.client.post(app.api + "/runs", params={"dry_run": "true"}, json=b, headers=app.h())
        real = app.client.post(app.api + "/runs", json=b, headers=app.h())
        assert dry.status_code == real.status_code == status, (dry.text, real.text)
        assert dry.json() == real.json() and code_or_text in dry.text
    assert counts(app) == before
    submit(app, body("taken"))
    dry = app.client.post(app.api + "/runs", params={"dry_run": "true"}, json=body("taken"), headers=app.h())
    assert dry.status_code == 409 and dry.json()["code"] == "ALREADY_EXISTS"


def test_openapi_documents_dry_run_and_the_run_body(app):
    spec = app.client.get("/openapi.json").json()
    post = spec["paths"]["/api/v1/o/{org}/w/{ws}/runs"]["post"]
    assert any(p["name"] == "dry_run" and p["in"] == "query" for p in post["parameters"])
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/RunCreate")


# ------------------------------------------------------------------------------------------------------ live


def test_live_the_run_does_what_the_answer_said(cluster):
    """A real control plane and agent (one machine, 8 GPUs): each answer, then the same body submitted."""
    c = cluster
    with c.client() as api:
        def ask(b):
            r = api.post("/runs", params={"dry_run": "true"}, json=b)
            assert r.status_code == 200, r.text
            return r.json()

        def status(name):
            return api.get(f"/runs/{name}").json()["status"]

        def worker(name):
            return api.get(f"/workers/{name}").json()

        low = body("low", gpus=8, priority=-100)
        a = ask(low)
        assert a["outcome"] == "Starts" and a["placements"][0]["machine"] == "gpu-01", a
        assert api.post("/runs", json=low).status_code == 201
        c.wait_for(lambda: status("low")["state"] == "Running", 30, what="low to run")
        w = worker("low-0")
        assert (w["machine"], w["gpu_indices"]) == (a["placements"][0]["machine"], a["placements"][0]["gpu_indices"])

        high = body("high", gpus=8)
        a = ask(high)
        assert a["outcome"] == "Preempts" and a["preempts"] == ["low-0"] and a["preempts_workers"] == 1, a
        assert api.post("/runs", json=high).status_code == 201
        c.wait_for(lambda: "Preempted by higher-priority work (high)" in (status("low")["reason"] or ""), 30,
                   what="low to be preempted by high")
        c.wait_for(lambda: status("high")["state"] == "Running", 30, what="high to run")

        after = body("after", gpus=4, priority=-50)
        a = ask(after)
        assert a["outcome"] in ("Head", "Queued"), a
        assert api.post("/runs", json=after).status_code == 201
        time.sleep(0.5)
        c.wait_for(lambda: status("after")["reason"] == a["reason"], 20,
                   what=f"after's reason to be {a['reason']!r}")


# ------------------------------------------------------------------------------------- pools, GPU models, reservations


def test_a_gpu_model_no_machine_has_and_a_pool_are_answered(app):
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": "gpu-01", "gpus": 4, "gpu_models": ["NVIDIA H100 80GB HBM3"], "cpu_cores": 32,
                              "memory_bytes": 1 << 38, "stop_grace_seconds": 1})
    assert r.status_code == 200, r.text
    b = body("a100-only", gpus=1)
    b["spec"]["task_template"]["requested_resources"]["gpu_requests"]["model"] = "a100"
    a = what_if(app, b)
    assert (a["outcome"], a["reason"]) == ("Waits", "Cannot run on this cluster: no machine has a100 GPUs"), a
    assert a["message"] == a["reason"]
    b["spec"]["task_template"]["requested_resources"]["gpu_requests"]["model"] = "h100"
    a = what_if(app, b)
    assert a["outcome"] == "Starts" and a["placements"][0]["machine"] == "gpu-01", a
    r = app.client.post(f"{ORG}/clusters/main/pools", json={"name": "fast", "machines": ["gpu-01"]},
                        headers=_h(app.boot["admin_token"]))
    assert r.status_code == 201, r.text
    b = body("in-pool", gpus=1)
    b["spec"]["task_template"]["requested_resources"]["node_selection"] = {"pools": ["fast"]}
    assert what_if(app, b)["placements"] == [{"worker": "in-pool-0", "machine": "gpu-01", "gpu_indices": [0]}]
    b["spec"]["task_template"]["requested_resources"]["node_selection"] = {"pools": ["nosuch"]}
    r = app.client.post(app.api + "/runs", params={"dry_run": "true"}, json=b, headers=app.h())
    assert r.status_code == 422 and "node_selection.pools: no pool named nosuch in cluster main" in r.text


def test_a_reservation_before_its_window_holds_its_run_and_keeps_others_untimed_runs_off(app):
    register(app, "gpu-01")
    nlp = other_workspace(app)
    start = time.time() + 3600
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    r = app.client.post(f"{ORG}/reservations", headers=_h(app.boot["admin_token"]),
                        json={"name": "launch", "cluster": "main", "workspaces": ["vision"], "machines": ["gpu-01"],
                              "start": iso})
    assert r.status_code == 201, r.text
    b = body("for-launch", gpus=1)
    b["spec"]["task_template"]["requested_resources"]["node_selection"] = {"reservation": "launch"}
    a = what_if(app, b)
    assert a["outcome"] == "Waits", a
    assert a["reason"].startswith("Waits for reservation launch, which starts at ") and a["reason"].endswith(" UTC")
    # another workspace: an untimed run may not use the machine before the window, a timed one that ends first may
    api, h = nlp
    r = app.client.post(api + "/runs", params={"dry_run": "true"}, json=body("theirs", gpus=1), headers=h)
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["outcome"] != "Starts" and "launch" not in r.text, a
    assert a["why_not"]["theirs-0"][0]["reason"].endswith(
        "UTC: a run without a time limit cannot use it before then"), a
    r = app.client.post(api + "/runs", params={"dry_run": "true"}, json=body("short", gpus=1, time_limit=60),
                        headers=h)
    assert r.json()["outcome"] == "Starts", r.text
