"""The shape of the HTTP layer: one module-level router per resource, the ControlPlane read from app.state, the
console above the server (astraeus.app adds it), and every URL under its OpenAPI tag."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

import pytest
from fastapi import APIRouter

ROUTERS = ("workspace", "runs", "templates", "workers", "drives", "registries", "events", "machines", "admin", "agent", "health",
           "schedules", "replica_groups", "pools", "reservations", "usage")


@pytest.mark.parametrize("name", ROUTERS)
def test_each_resource_is_a_module_level_router(name):
    assert isinstance(import_module(f"astraeus.server.routers.{name}").router, APIRouter)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_server_never_imports_the_console():
    imports = "; ".join(f"import astraeus.server.routers.{n}" for n in ROUTERS)
    r = _python(f"import sys, astraeus.server.app; {imports}; "
                "print(sorted(m for m in sys.modules if m.startswith('astraeus.console')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_console_imports_the_server_without_a_cycle():
    r = _python("import astraeus.console.site, astraeus.app, astraeus.server.app; print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_units_import_nothing_of_astraeus():
    r = _python("import sys, astraeus.units; print(sorted(m for m in sys.modules if m.startswith('astraeus.')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['astraeus.units']"


def test_every_url_keeps_its_tag(app):
    paths = app.client.get("/openapi.json").json()["paths"]
    tags = {}
    for path, ops in paths.items():
        for method, op in ops.items():
            tags[f"{method.upper()} {path}"] = op["tags"]
    ws, org = "/api/v1/o/{org}/w/{ws}", "/api/v1/o/{org}"
    assert tags == {
        f"GET {ws}": ["workspace"],
        f"POST {ws}/runs": ["workspace"], f"GET {ws}/runs": ["workspace"],
        f"GET {ws}/runs/{{name}}": ["workspace"], f"DELETE {ws}/runs/{{name}}": ["workspace"],
        f"PATCH {ws}/runs/{{name}}": ["workspace"],
        f"POST {ws}/templates": ["workspace"], f"GET {ws}/templates": ["workspace"],
        f"GET {ws}/templates/{{name}}": ["workspace"], f"PUT {ws}/templates/{{name}}": ["workspace"],
        f"DELETE {ws}/templates/{{name}}": ["workspace"],
        f"POST {ws}/schedules": ["workspace"], f"GET {ws}/schedules": ["workspace"],
        f"GET {ws}/schedules/{{name}}": ["workspace"], f"PUT {ws}/schedules/{{name}}": ["workspace"],
        f"DELETE {ws}/schedules/{{name}}": ["workspace"],
        f"POST {ws}/replica-groups": ["workspace"], f"GET {ws}/replica-groups": ["workspace"],
        f"GET {ws}/replica-groups/{{name}}": ["workspace"], f"PATCH {ws}/replica-groups/{{name}}": ["workspace"],
        f"DELETE {ws}/replica-groups/{{name}}": ["workspace"],
        f"GET {ws}/pools": ["workspace"], f"GET {ws}/reservations": ["workspace"],
        f"GET {org}/clusters/{{cluster}}/pools": ["organisation"], f"POST {org}/clusters/{{cluster}}/pools": ["organisation"],
        f"GET {org}/clusters/{{cluster}}/pools/{{name}}": ["organisation"],
        f"PUT {org}/clusters/{{cluster}}/pools/{{name}}": ["organisation"],
        f"DELETE {org}/clusters/{{cluster}}/pools/{{name}}": ["organisation"],
        f"GET {org}/reservations": ["organisation"], f"POST {org}/reservations": ["organisation"],
        f"GET {org}/reservations/{{name}}": ["organisation"], f"DELETE {org}/reservations/{{name}}": ["organisation"],
        f"GET {ws}/workers": ["workspace"], f"GET {ws}/workers/{{name}}": ["workspace"],
        f"GET {ws}/workers/{{name}}/logs": ["workspace"],
        f"POST {ws}/drives": ["workspace"], f"GET {ws}/drives": ["workspace"],
        f"GET {ws}/drives/{{name}}": ["workspace"], f"DELETE {ws}/drives/{{name}}": ["workspace"],
        f"PUT {ws}/registries/{{host}}": ["workspace"], f"GET {ws}/registries": ["workspace"],
        f"GET {ws}/registries/{{host}}": ["workspace"], f"DELETE {ws}/registries/{{host}}": ["workspace"],
        f"GET {ws}/events": ["workspace"], f"GET {ws}/machines": ["workspace"],
        f"GET {ws}/usage": ["workspace"], f"GET {ws}/usage/records": ["workspace"], f"GET {org}/usage": ["organisation"],
        f"GET {org}/sso": ["organisation"], f"PUT {org}/sso": ["organisation"], f"DELETE {org}/sso": ["organisation"],
        f"GET {org}/sso/cli": ["organisation"], f"POST {org}/sso/token": ["organisation"],
        f"GET {org}/users": ["organisation"], f"POST {org}/users": ["organisation"],
        f"GET {org}/users/{{name}}": ["organisation"], f"PATCH {org}/users/{{name}}": ["organisation"],
        f"DELETE {org}/users/{{name}}": ["organisation"], f"POST {org}/users/{{name}}/tokens": ["organisation"],
        f"GET {org}/audit": ["organisation"],
        f"GET {org}/workspaces": ["organisation"], f"POST {org}/workspaces": ["organisation"],
        f"GET {org}/workspaces/{{name}}": ["organisation"], f"PATCH {org}/workspaces/{{name}}": ["organisation"],
        f"GET {org}/clusters": ["organisation"], f"POST {org}/clusters": ["organisation"],
        f"GET {org}/clusters/{{name}}": ["organisation"], f"PATCH {org}/clusters/{{name}}": ["organisation"],
        f"GET {org}/clusters/{{name}}/machines": ["organisation"],
        f"POST {org}/machines/{{name}}/{{action}}": ["organisation"],
        f"POST {org}/machines/{{name}}/gpus/{{index}}/fault": ["organisation"],
        f"DELETE {org}/machines/{{name}}/gpus/{{index}}/fault": ["organisation"],
        f"POST {org}/tokens": ["organisation"], f"GET {org}/tokens": ["organisation"],
        f"DELETE {org}/tokens/{{token_id}}": ["organisation"],
        "POST /api/v1/agent/register": ["agent"], "GET /api/v1/agent/assignments": ["agent"],
        "POST /api/v1/agent/report": ["agent"], "POST /api/v1/agent/logs": ["agent"],
    }
    # Created objects answer 201; the console's pages and the plumbing are not in the schema.
    assert set(paths[f"{ws}/runs"]["post"]["responses"]) >= {"201", "422"}
    assert app.client.get("/healthz").json() == {"role": "leader", "epoch": 1, "database": "ok"}
    assert app.client.get("/o/acme/w/vision/runs", follow_redirects=False).status_code == 303
