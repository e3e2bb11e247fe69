"""Issue 43: every route declares what it answers (astraeus.server.answers), and the answers conform to it.

(a) Every operation of /openapi.json has a schema for its success status, and every API route of the app (those
out of the schema too) declares one. (b) Schemathesis, as a library, against the in-process app with seeded
objects (a run placed and running, its worker's log, a drive, a template, a schedule, a replica group, a registry
credential, a pool, a reservation): each GET operation once with the seeded names (a 200 to check), its answer
checked for no 5xx, a status code the operation declares, its content type, and its body against the declared
schema; tests/faults/test_fuzz.py draws generated examples of every operation against the same seeded app. The schema is made strict for the check: an answer model
allows keys it does not name (so none is ever dropped from what users get), here an undeclared key fails."""

from __future__ import annotations

import copy

import pytest
import schemathesis
from fastapi.responses import PlainTextResponse
from fastapi.routing import APIRoute

from astraeus.server import answers
from astraeus.server import loop as sched_loop
from tests.conftest import make_app

CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.content_type_conformance, schemathesis.checks.response_schema_conformance]

WS_API = "/api/v1/o/acme/w/vision"
ORG_API = "/api/v1/o/acme"

# Seeded names, by the path template's parameters (the `{name}` of each resource).
SEEDED = {"runs": "finetune", "templates": "tpl", "schedules": "nightly", "replica-groups": "web",
          "workers": "finetune-0", "drives": "ft-ckpt", "workspaces": "vision", "clusters": "main", "pools": "p1",
          "reservations": "res1", "users": "admin"}


def _h(tok: str) -> dict:
    return {"Authorization": f"Bearer {tok}"}


def _ok(r, status=(200, 201)):
    assert r.status_code in status, (r.request.method, r.request.url, r.status_code, r.text)
    return r.json()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """An app on SQLite with one of everything a GET can show, the run `finetune` running on gpu-01."""
    c, boot, cp, _ = make_app(tmp_path_factory.mktemp("answers"), None, run_loop=False)
    app = c.app
    with c:
        ed, adm = _h(boot["token"]), _h(boot["admin_token"])
        reg = _ok(c.post("/api/v1/agent/register", headers=_h(boot["machine_token"]), json={
            "name": "gpu-01", "gpus": 8, "cpu_cores": 64, "memory_bytes": 1 << 40, "address": "10.0.0.1",
            "nfs": {"server": "10.0.0.1", "client": True},
            "disk": {"path": "/var/lib/astraeus", "free_bytes": 1 << 36, "total_bytes": 1 << 40}}))
        boot["machine_credential"] = reg["credential"]
        _ok(c.post("/api/v1/agent/register", headers=_h(boot["machine_token"]), json={"name": "gpu-02", "gpus": 4}))
        _ok(c.post(ORG_API + "/clusters/main/pools", headers=adm, json={"name": "p1", "machines": ["gpu-01"]}))
        _ok(c.post(ORG_API + "/reservations", headers=adm, json={
            "name": "res1", "cluster": "main", "workspaces": ["vision"], "machines": ["gpu-02"],
            "start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z"}))
        _ok(c.post(WS_API + "/drives", headers=ed, json={"metadata": {"name": "ft-ckpt"}, "spec": {
            "sources": [{"node": "gpu-01", "path": "/data/astraeus/ft-ckpt", "mount_path": "/ckpt",
                         "mode": "ReadWrite"}], "transport": "Auto", "permissions": {"create": True}}}))
        tt = {"image": "python:3.11", "command": "true", "env": {"A": "x", "S": {"value": "s", "secret": True}}}
        _ok(c.post(WS_API + "/templates", headers=ed, json={"metadata": {"name": "tpl"},
                                                            "spec": {"priority": -10, "task_template": tt}}))
        run = {"metadata": {"name": "finetune", "labels": {"tier": "scavenger"}}, "spec": {
            "priority": -100, "task_template": {**tt, "requested_resources": {"gpu_requests": {"count": 1}},
            "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}]}}}
        _ok(c.post(WS_API + "/runs", headers=ed, json=run), (201,))
        _ok(c.post(WS_API + "/runs", headers=ed, json={"metadata": {"name": "fromtpl"}, "spec": {"template": "tpl"}}))
        _ok(c.post(WS_API + "/schedules", headers=ed, json={"metadata": {"name": "nightly"}, "spec": {
            "schedule": "0 2 * * *", "timezone": "Europe/Berlin", "run": {"task_template": tt}}}))
        _ok(c.post(WS_API + "/replica-groups", headers=ed, json={"metadata": {"name": "web"}, "spec": {
            "replicas": 1, "run": {"task_template": tt}}}))
        _ok(c.put(WS_API + "/registries/ghcr.io", headers=ed, json={"username": "u", "password": "p"}))
        _ok(c.put(ORG_API + "/sso", headers=adm, json={  # single sign-on: never contacted by a GET
            "issuer": "http://127.0.0.1:9", "client_id": "console", "client_secret": "s", "cli_client_id": "cli",
            "roles": {"eng": {"vision": "editor"}}}))
        sched_loop.cycle(cp)
        cred = _h(boot["machine_credential"])
        got = _ok(c.get("/api/v1/agent/assignments", headers=cred, params={"machine": "gpu-01", "wait": 0}))
        live = [a for a in got["assignments"] if a["desired"] == "Running"]
        _ok(c.post("/api/v1/agent/report", headers=cred, json={
            "machine": "gpu-01",
            "workers": [{"worker": a["worker"], "attempt": a["attempt"], "state": "Running", "pid": 100} for a in live],
            "lines": [{"worker": a["worker"], "attempt": a["attempt"], "seq": 0, "time": 1.0, "text": "hello"}
                      for a in live]}))
        sched_loop.cycle(cp)
        assert _ok(c.get(WS_API + "/runs/finetune", headers=ed))["status"]["state"] == "Running"
        yield app, boot
    cp.engine.dispose()


def _token_for(path: str, boot: dict) -> str:
    if path.startswith("/api/v1/agent"):
        return boot["machine_token"] if path.endswith("/register") else boot["machine_credential"]
    return boot["token"] if "/w/" in path else boot["admin_token"]


def strict(schema: dict) -> dict:
    """`schema` with every answer model closed (additionalProperties false): a key no model names fails."""
    out = copy.deepcopy(schema)
    names = {n for n, v in vars(answers).items() if isinstance(v, type) and issubclass(v, answers.Out)}
    for name, comp in out["components"]["schemas"].items():
        if name in names:
            comp["additionalProperties"] = False
    return out


def loaded(app) -> schemathesis.schemas.BaseSchema:
    api = schemathesis.openapi.from_dict(strict(app.openapi()))
    api.app = app
    return api


def _success(op: dict) -> dict:
    return {code: r for code, r in op["responses"].items() if code.startswith("2")}


def test_every_operation_documents_its_success_answer(seeded):
    app, _ = seeded
    paths = app.openapi()["paths"]
    ops = [(m.upper(), p, op) for p, methods in paths.items() for m, op in methods.items()]
    assert len(ops) >= 60
    missing = []
    for method, path, op in ops:
        ok = _success(op)
        if not ok:
            missing.append(f"{method} {path}: no 2xx answer")
        for code, r in ok.items():
            content = r.get("content") or {}
            if not content or not all((c.get("schema") or {}).get("$ref") or (c.get("schema") or {}).get("type")
                                      for c in content.values()):
                missing.append(f"{method} {path}: {code} has no schema")
    assert missing == []
    # the agent protocol answers its own models; the workspace's and the organisation's, answers.py's
    refs = {r["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            for _, _, op in ops for r in _success(op).values() if "application/json" in r.get("content", {})}
    assert {"Registered", "Assignments", "Ack", "LogsStored", "RunOut", "WhatIfOut", "RunPage", "WorkerOut",
            "DriveOut", "EventPage", "MachinePage", "TemplateOut", "ScheduleOut", "ReplicaGroupOut", "PoolOut",
            "ReservationOut", "RegistryOut", "OrgWorkspaceOut", "TokenList", "WorkspaceOut"} <= refs
    # every 4xx the routers declare answers {"code", "message"}
    for method, path, op in ops:
        for code in ("401", "404", "422"):
            assert op["responses"][code]["content"]["application/json"]["schema"] == \
                {"$ref": "#/components/schemas/Error"}, (method, path, code)


def test_every_api_route_declares_a_model_and_the_console_is_out_of_the_schema(seeded):
    app, _ = seeded
    undeclared, console_in_schema = [], []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        if route.path.startswith("/api/") or route.path in ("/healthz", "/metrics"):
            models = [r.get("model") for code, r in route.responses.items() if str(code).startswith("2")]
            if route.response_model is None and not any(models) and route.response_class is not PlainTextResponse:
                undeclared.append(f"{sorted(route.methods)} {route.path}")
        elif route.include_in_schema:
            console_in_schema.append(route.path)
    assert undeclared == [] and console_in_schema == []


def _seeded_case(op, boot):
    pp = {}
    for p in op.iter_parameters():
        if p.location != "path":
            continue
        if p.name == "org":
            pp[p.name] = "acme"
        elif p.name == "ws":
            pp[p.name] = "vision"
        elif p.name == "host":
            pp[p.name] = "ghcr.io"
        elif p.name == "cluster":
            pp[p.name] = "main"
        elif p.name == "name":
            parts = op.path.split("/")
            resource = parts[parts.index("{name}") - 1]
            pp[p.name] = SEEDED[resource]
        elif p.name == "token_id":
            pp[p.name] = 1
    query = {"machine": "gpu-01", "wait": 0} if op.path.endswith("/assignments") else None
    return op.Case(path_parameters=pp, query=query)


def test_every_get_answers_its_declared_model_for_seeded_objects(seeded):
    """Each GET with the seeded names: a 200, its body conforming to the (strict) schema."""
    app, boot = seeded
    api = loaded(app)
    gets = [r.ok() for r in api.get_all_operations() if r.ok().method.upper() == "GET"]
    assert len(gets) >= 30
    for op in gets:
        case = _seeded_case(op, boot)
        r = case.call_and_validate(headers=_h(_token_for(case.path, boot)), checks=CHECKS)
        assert r.status_code == 200, (op.label, r.status_code, r.text)
