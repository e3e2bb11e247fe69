"""POST /api/v1/agent/report answered by routers/agent.PlainReports, ahead of FastAPI's routing, dependencies and
response model, answers exactly as agent_report does: the same status and body for a report taken and for every
refusal; what it passes on (a query, another content type, a body that is not a report) goes to agent_report."""

from __future__ import annotations

import json

FASTAPI = "application/json; charset=utf-8"  # not PlainReports' content type: agent_report answers it
REPORT = "/api/v1/agent/report"


def post(app, b, headers: dict, content_type: str = "application/json", path: str = REPORT):
    raw = b if isinstance(b, bytes) else json.dumps(b).encode()
    return app.client.post(path, content=raw, headers={**headers, "Content-Type": content_type})


def machine(app, name: str) -> str:
    """A machine registered with the bootstrap's join token; its own credential."""
    r = app.client.post("/api/v1/agent/register", headers=app.h(app.boot["machine_token"]),
                        json={"name": name, "gpus": 2, "cpu_cores": 8, "memory_bytes": 1 << 34, "stop_grace_seconds": 1})
    assert r.status_code == 200, r.text
    return r.json()["credential"]


def heartbeat(app, name: str) -> float:
    from sqlalchemy import select

    from astraeus.server.db import Machine

    with app.cp.sessions() as s:
        return s.scalar(select(Machine.last_heartbeat).where(Machine.name == name))


def test_a_report_is_taken_and_answered_as_agent_report_answers_it(app):
    cred = machine(app, "gpu-07")
    before = heartbeat(app, "gpu-07")
    fast = post(app, {"machine": "gpu-07", "workers": []}, app.h(cred))
    assert heartbeat(app, "gpu-07") > before  # the heartbeat was written
    slow = post(app, {"machine": "gpu-07", "workers": []}, app.h(cred), FASTAPI)
    assert (fast.status_code, fast.json()) == (slow.status_code, slow.json()) == (200, {"ok": True})
    assert fast.headers["content-type"] == slow.headers["content-type"] == "application/json"
    assert fast.content == slow.content
    # with lines: the locked way (stored with the report), the same answer
    line = {"worker": "ws-0123456789ab.x-0", "attempt": 1, "seq": 1, "time": 1.0, "stream": "stdout", "text": "hi"}
    fast = post(app, {"machine": "gpu-07", "workers": [], "lines": [line]}, app.h(cred))
    assert (fast.status_code, fast.json()) == (200, {"ok": True})


def test_every_refusal_is_answered_as_agent_report_answers_it(app):
    cred = machine(app, "gpu-07")
    machine(app, "gpu-08")
    ok = {"machine": "gpu-07", "workers": []}
    cases = {"join token": (ok, app.h(app.boot["machine_token"]), 403),
             "user token": (ok, app.h(), 403),
             "admin token": (ok, app.h(app.boot["admin_token"]), 403),
             "unknown token": (ok, app.h("ast_m_not-a-token"), 401),
             "no token": (ok, {}, 401),
             "another machine": ({"machine": "gpu-08", "workers": []}, app.h(cred), 403),
             "no such machine": ({"machine": "gpu-99", "workers": []}, app.h(cred), 403),
             "no machine named": ({"workers": []}, app.h(cred), 422),
             "a bad worker": ({"machine": "gpu-07", "workers": [{"worker": "x"}]}, app.h(cred), 422),
             "not an object": ([1, 2], app.h(cred), 422),
             "not JSON": (b"{not json", app.h(cred), 422),
             "bad body, bad token": ({"workers": []}, app.h("ast_m_not-a-token"), 422)}
    for what, (b, headers, status) in cases.items():
        fast = post(app, b, headers)
        slow = post(app, b, headers, FASTAPI)
        assert (fast.status_code, fast.json()) == (slow.status_code, slow.json()), what
        assert fast.status_code == status, (what, fast.json())


def test_what_it_passes_on_is_agent_reports(app):
    cred = machine(app, "gpu-07")
    r = post(app, {"machine": "gpu-07", "workers": []}, app.h(cred), path=REPORT + "?x=1")
    assert (r.status_code, r.json()) == (200, {"ok": True})
    r = app.client.get(REPORT, headers=app.h(cred))
    assert r.status_code == 405
    r = post(app, b"", app.h(cred))
    assert r.status_code == 422


def test_a_plain_report_does_not_reach_fastapis_routing(app, monkeypatch):
    from fastapi.routing import APIRoute

    cred = machine(app, "gpu-07")
    routed = []
    handle = APIRoute.handle

    async def counted(self, scope, receive, send):
        routed.append(self.path)
        return await handle(self, scope, receive, send)

    monkeypatch.setattr(APIRoute, "handle", counted)
    assert post(app, {"machine": "gpu-07", "workers": []}, app.h(cred)).status_code == 200
    assert REPORT not in routed
    assert post(app, {"machine": "gpu-07", "workers": []}, app.h(cred), FASTAPI).status_code == 200
    assert REPORT in routed  # the other way, for the comparisons above
