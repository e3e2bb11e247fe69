"""The API on SQLite and PostgreSQL: the pages' objects, bad input refused with a clear message and nothing
stored, tokens and roles, and nothing lost on restart."""

import copy
import json
from pathlib import Path

import pytest

from astraeus.main import bootstrap

ROOT = Path(__file__).resolve().parents[2]
FT = {
    "metadata": {"name": "finetune-r50", "labels": {"tier": "scavenger"}},
    "spec": {
        "priority": -100,
        "task_template": {
            "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime",
            "command": "python",
            "args": ["/app/finetune.py"],
            "env": {"CKPT_DIR": "/ckpt", "EPOCHS": "20", "SAVE_EVERY": "200", "TORCH_HOME": "/ckpt/torch"},
            "restart_policy": "OnFailure",
            "requested_resources": {"cpu_cores": 8, "memory_bytes": 34359738368, "gpu_requests": {"count": 1},
                                    "node_selection": {"mode": "Any"}},
            "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}],
            "configs": [],
        },
    },
}
DRIVE = {
    "metadata": {"name": "ft-ckpt"},
    "spec": {"sources": [{"node": "gpu-01", "path": "/data/astraeus/ft-ckpt", "mount_path": "/ckpt",
                          "mode": "ReadWrite"}], "transport": "Auto", "permissions": {"create": True}},
}


def run_body(name="r1", **spec):
    body = {"metadata": {"name": name}, "spec": {"task_template": {"image": "python:3.11", "command": "true"}}}
    body["spec"].update(spec)
    return body


def count_runs(app) -> int:
    return len(app.client.get(app.api + "/runs", headers=app.h()).json()["items"])


def refused(app, body, status, *needles, path="/runs"):
    before = count_runs(app)
    r = app.client.post(app.api + path, json=body, headers=app.h())
    assert r.status_code == status, r.text
    msg = r.json()["message"]
    for n in needles:
        assert n in msg, msg
    assert count_runs(app) == before  # nothing stored
    return msg


def test_pages_drive_and_finetune_post_and_print_their_names(app):
    r = app.client.post(app.api + "/drives", json=DRIVE, headers=app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "ft-ckpt"
    body = copy.deepcopy(FT)
    body["spec"]["task_template"]["configs"] = [{"mounts": ["/app/finetune.py"], "value": "print('hi')\n"}]
    r = app.client.post(app.api + "/runs", json=body, headers=app.h())
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["metadata"]["name"] == "finetune-r50"
    assert run["spec"]["priority"] == -100
    assert run["status"]["state"] == "Pending"
    assert [w["name"] for w in run["status"]["workers"]] == ["finetune-r50-0"]
    assert run["status"]["console_url"].endswith("/o/acme/w/vision/jobs/main/finetune-r50")


def test_priority_out_of_range_is_422_naming_the_field(app):
    msg = refused(app, run_body(priority=1001), 422, "spec.priority")
    assert "1000" in msg
    refused(app, run_body(priority=-1001), 422, "spec.priority")


def test_priority_above_the_workspace_maximum_is_403(app):
    r = app.client.post(app.api + "/runs", json=run_body(priority=60), headers=app.h())
    assert r.status_code == 403
    ns = app.client.get(app.api, headers=app.h()).json()["id"]
    assert r.json() == {"code": "PRIORITY_NOT_ALLOWED", "message": f"priority 60 is above namespace {ns}'s maximum of 0"}
    # an organisation admin raises the maximum to 50: 50 is accepted, 60 still refused with the page's words
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    r = app.client.patch("/api/v1/o/acme/workspaces/vision", json={"clusters": {"main": {"max_priority": 50}}},
                         headers=admin)
    assert r.status_code == 200
    assert app.client.post(app.api + "/runs", json=run_body("ok50", priority=50), headers=app.h()).status_code == 201
    r = app.client.post(app.api + "/runs", json=run_body("no60", priority=60), headers=app.h())
    assert r.json()["message"] == f"priority 60 is above namespace {ns}'s maximum of 50"


def test_negative_priority_is_always_allowed(app):
    assert app.client.post(app.api + "/runs", json=run_body(priority=-1000), headers=app.h()).status_code == 201


def test_unknown_field_is_refused_by_name(app):
    body = run_body()
    body["spec"]["task_template"]["restart_polcy"] = "Never"
    refused(app, body, 422, "spec.task_template.restart_polcy", "unknown field")


def test_wrong_type_is_refused(app):
    body = run_body()
    body["spec"]["task_template"]["requested_resources"] = {"gpu_requests": {"count": "eight"}}
    refused(app, body, 422, "spec.task_template.requested_resources.gpu_requests.count")


def test_name_that_is_not_a_dns_label_is_refused(app):
    refused(app, run_body("Urgent_Eval"), 422, "metadata.name", "DNS label")


def test_duplicate_name_is_409(app):
    assert app.client.post(app.api + "/runs", json=run_body("dup"), headers=app.h()).status_code == 201
    refused(app, run_body("dup"), 409, "a run named dup already exists")


def test_missing_task_template_is_refused(app):
    refused(app, {"metadata": {"name": "x"}, "spec": {"priority": 0}}, 422, "spec.task_template", "field required")


def test_oversized_configs_are_refused(app):
    body = run_body()
    body["spec"]["task_template"]["configs"] = [{"mounts": ["/app/big.bin"], "value": "x" * (1024 * 1024 + 1)}]
    refused(app, body, 422, "over the limit", "1 MiB")


def test_oversized_env_is_refused(app):
    body = run_body()
    body["spec"]["task_template"]["env"] = {"BIG": "x" * (32 * 1024 + 1)}
    refused(app, body, 422, "env BIG is larger than 32 KiB")
    body["spec"]["task_template"]["env"] = {f"V{i}": "1" for i in range(300)}
    refused(app, body, 422, "at most 256 env entries")


def test_drive_outside_granted_host_paths_is_refused(app):
    bad = copy.deepcopy(DRIVE)
    bad["spec"]["sources"][0]["path"] = "/etc/astraeus"
    r = app.client.post(app.api + "/drives", json=bad, headers=app.h())
    assert r.status_code == 403
    assert "outside the host paths granted" in r.json()["message"] and "/data/astraeus" in r.json()["message"]
    assert app.client.get(app.api + "/drives", headers=app.h()).json()["items"] == []


@pytest.mark.parametrize("path", ["/data/astraeus/../../etc", "/data/astraeus/a/../b", "data/astraeus/x",
                                  "/data/astraeus//x", "/data/astraeus/./x", "/data/astraeus/x/",
                                  "/data/astraeus-evil", "/data/astraeus/x\x00y"])
def test_drive_paths_are_checked_lexically(app, path):
    bad = copy.deepcopy(DRIVE)
    bad["spec"]["sources"][0]["path"] = path
    r = app.client.post(app.api + "/drives", json=bad, headers=app.h())
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["message"]
    assert app.client.get(app.api + "/drives", headers=app.h()).json()["items"] == []


def test_run_with_a_missing_drive_is_refused(app):
    refused(app, FT, 400, "drive ft-ckpt does not exist")


def test_no_token_or_a_wrong_one_is_401(app):
    assert app.client.get(app.api + "/runs").status_code == 401
    r = app.client.get(app.api + "/runs", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and "not valid" in r.json()["message"]


def test_a_viewer_that_submits_is_403(app):
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    tok = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                          headers=admin).json()["token"]
    r = app.client.post(app.api + "/runs", json=run_body("v1"), headers=app.h(tok))
    assert r.status_code == 403 and "editor role" in r.json()["message"]
    assert app.client.get(app.api + "/runs", headers=app.h(tok)).status_code == 200


def test_another_workspace_is_invisible(app):
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    assert app.client.post("/api/v1/o/acme/workspaces", json={"name": "nlp", "clusters": {"main": {}}},
                           headers=admin).status_code == 201
    other = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"},
                            headers=admin).json()["token"]
    assert app.client.post(app.api + "/runs", json=run_body("secret-run"), headers=app.h()).status_code == 201
    for method, path in [("get", "/runs"), ("get", "/runs/secret-run"), ("delete", "/runs/secret-run"),
                         ("get", "/workers/secret-run-0"), ("get", "/workers/secret-run-0/logs"),
                         ("get", "/events"), ("get", "/drives")]:
        r = getattr(app.client, method)(app.api + path, headers=app.h(other))
        assert r.status_code == 404, (path, r.status_code)
        assert "secret-run" not in r.text
    # the machine token cannot call user endpoints, nor a user token agent endpoints
    assert app.client.get(app.api + "/runs", headers=app.h(app.boot["machine_token"])).status_code == 403
    assert app.client.post("/api/v1/agent/register", json={"name": "gpu-09"}, headers=app.h()).status_code == 403


def test_revoked_token_is_refused(app):
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    made = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "editor"},
                           headers=admin).json()
    assert app.client.get(app.api + "/runs", headers=app.h(made["token"])).status_code == 200
    assert app.client.delete(f"/api/v1/o/acme/tokens/{made['id']}", headers=admin).status_code == 200
    assert app.client.get(app.api + "/runs", headers=app.h(made["token"])).status_code == 401


def test_tokens_are_stored_as_digests(app):
    from sqlalchemy import text

    with app.cp.engine.connect() as conn:
        digests = [r[0] for r in conn.execute(text("select digest from tokens"))]
    assert digests and app.boot["token"] not in digests and all(len(d) == 64 for d in digests)


def test_restart_loses_nothing(app, tmp_path):
    from fastapi.testclient import TestClient

    from astraeus.app import create_app
    from astraeus.server.core import ControlPlane
    from astraeus.settings import ServerSettings

    app.client.post(app.api + "/drives", json=DRIVE, headers=app.h())
    app.client.post(app.api + "/runs", json=FT, headers=app.h())
    app.client.__exit__(None, None, None)
    cp2 = ControlPlane.open(ServerSettings(home=tmp_path / "home", database_url=app.url))
    with TestClient(create_app(ServerSettings(home=tmp_path / "home", database_url=app.url), cp2)) as c2:
        runs = c2.get(app.api + "/runs", headers=app.h()).json()["items"]
        assert [r["metadata"]["name"] for r in runs] == ["finetune-r50"]
        assert c2.get(app.api + "/drives/ft-ckpt", headers=app.h()).json()["spec"]["sources"][0]["node"] == "gpu-01"
    cp2.engine.dispose()
    app.client.__enter__()


def test_openapi_and_health(app):
    assert app.client.get("/healthz").json() == {"role": "leader", "epoch": 1, "database": "ok"}
    assert "/api/v1/o/{org}/w/{ws}/runs" in app.client.get("/openapi.json").json()["paths"]
    assert "astraeus_schedule_cycle_seconds" in app.client.get("/metrics").text


def test_bootstrap_twice_keeps_one_workspace(app):
    boot = bootstrap(app.cp, "acme", "vision", "main", ["/data/astraeus"])
    assert boot["ns"] == app.boot["ns"]
    assert json.dumps(boot)


def test_nul_characters_are_refused_anywhere(app):
    body = run_body("nul")
    body["metadata"]["labels"] = {"team": "a\x00b"}
    refused(app, body, 422, "metadata.labels.team contains a NUL character")
    body = run_body("nul")
    body["spec"]["task_template"]["image"] = "python\x00:3.11"
    refused(app, body, 422, "NUL")
