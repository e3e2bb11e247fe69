"""One implementation per behaviour (issue 43): a submit is answered and stored the same whichever way it comes in,
and so is an agent's report.

Submits: PlainSubmits ahead of FastAPI's routing ("fast"), FastAPI's route to the group commit ("routed": a
Content-Type PlainSubmits leaves), the route on its own transaction ("unbatched": the scope's UNBATCHED), a batch of
several submits at once through the group commit ("batch"), and submits.submit_run_body called directly ("direct").
Reports: PlainReports ("fast"), the agent_report route ("routed"), and agents.report called directly ("direct").
Each compares the status, the JSON answer (but for uids and times) and the rows stored (runs, workers, history,
events). In-process control plane, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
import time

from fastapi.testclient import TestClient
from sqlalchemy import select

from astraeus import protocol as P
from astraeus.server import agents, services, submits
from astraeus.server.db import Event, History, Run, Worker, Workspace
from astraeus.server.routers import runs
from astraeus.server.routers.errors import validation_errors

FASTAPI = "application/json; charset=utf-8"  # a Content-Type the fast entries leave to FastAPI's route
SUBMITS = ("fast", "routed", "unbatched", "batch", "direct")
REPORTS = ("fast", "routed", "direct")
REPORT = "/api/v1/agent/report"


def body(name: str, priority: int = 0, gpus: int = 1, **tt) -> dict:
    return {"metadata": {"name": name, "labels": {"team": "vision"}}, "spec": {"priority": priority, "task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": gpus}}, **tt}}}


def answer_of(status: int, out: dict) -> tuple[int, dict]:
    """An answer without what differs from one submit to the next (the run's uid, job id and creation time)."""
    if isinstance(out, dict) and isinstance(out.get("metadata"), dict):
        out = {**out, "metadata": {k: v for k, v in out["metadata"].items() if k not in ("uid", "job_id", "created_at")}}
    return status, out


def refused(e: Exception) -> tuple[int, dict]:
    """An exception raised below the routers, as errors.install answers it."""
    if isinstance(e, services.InvalidBody):
        message, errors = validation_errors(e.errors)
        return 422, {"code": "INVALID", "message": message, "errors": errors}
    assert isinstance(e, services.ApiError), e
    return e.status, {"code": e.code, "message": e.message}


def unbatched_client(app) -> TestClient:
    """The same app, each request's scope marked UNBATCHED: PlainSubmits leaves it, and create_run submits it in
    its own transaction (as after a batch that could not be written)."""
    inner = app.client.app

    async def marked(scope, receive, send):
        if scope["type"] == "http":
            scope = {**scope, runs.UNBATCHED: True}
        await inner(scope, receive, send)

    return TestClient(marked)


def direct(app, api: str, b, headers: dict) -> tuple[int, dict]:
    """submits.submit_run_body in a transaction of its own, its caller found as the route finds it."""
    org, ws = api.split("/o/")[1].split("/w/")
    with app.cp.sessions() as s:
        try:
            c = services.user_caller(s, headers.get("Authorization"), org, ws)
            with services.tx(s, keep=(c.org, c.workspace)):
                run = submits.submit_run_body(s, c, b, time.time())
                out = services.run_view(run, c.org, c.workspace, run.cluster_row, app.cp.settings.console_base(),
                                        [], {}, c.role)
        except (services.ApiError, services.InvalidBody) as e:
            return refused(e)
    app.cp.notifier.wake_scheduler()
    return 201, json.loads(json.dumps(out))


def batch(app, bodies: list[tuple[str, dict, dict]]) -> list[tuple[int, dict] | None]:
    """Several submits at once through the group commit (routers/runs.batched, as both HTTP entries call it), in one
    event loop; None for a submit it does not take (not a plain run)."""

    async def one(api: str, b, headers: dict):
        org, ws = api.split("/o/")[1].split("/w/")
        try:
            parsed = submits.parse_run_body(b)
        except services.InvalidBody:
            return None
        r = await runs.batched(app.cp, parsed, headers.get("Authorization"), org, ws)
        return None if r is None else (r.status_code, json.loads(r.body))

    async def every():
        return await asyncio.gather(*(one(*x) for x in bodies))

    return asyncio.run(every())


def submit(app, entry: str, api: str, b, headers: dict) -> tuple[int, dict]:
    if entry == "direct":
        return direct(app, api, b, headers)
    if entry == "unbatched":
        r = unbatched_client(app).post(f"{api}/runs", content=json.dumps(b),
                                       headers={**headers, "Content-Type": "application/json"})
    else:
        ct = "application/json" if entry == "fast" else FASTAPI
        r = app.client.post(f"{api}/runs", content=json.dumps(b), headers={**headers, "Content-Type": ct})
    return r.status_code, r.json()


def stored(app, name: str) -> str:
    """The rows a run of that name left (its run, workers, history lines and RunSubmitted event), but for ids, uids,
    times and what the scheduling loop writes later, with its name written NAME."""
    with app.cp.sessions() as s:
        run = s.scalar(select(Run).where(Run.name == name))
        if run is None:
            return ""
        cols = {c.key: getattr(run, c.key) for c in Run.__table__.columns
                if c.key not in ("id", "uid", "created_at", "reason", "queue_reason", "quota_noted")}
        workers = [{c.key: getattr(w, c.key) for c in Worker.__table__.columns
                    if c.key not in ("id", "run_id", "why_not")}
                   for w in s.scalars(select(Worker).where(Worker.run_id == run.id).order_by(Worker.index))]
        history = [(h.state, h.reason) for h in s.scalars(select(History).where(History.run_id == run.id)
                                                          .order_by(History.id))]
        events = [(e.workspace_id, e.kind, e.message) for e in s.scalars(
            select(Event).where(Event.object == name, Event.kind == "RunSubmitted").order_by(Event.id))]
    return json.dumps({"run": cols, "workers": workers, "history": history, "events": events},
                      sort_keys=True, default=str).replace(name, "NAME")


def differences(a, b, at: str = "") -> list[str]:
    """Where two decoded JSON values differ, and how."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys()) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]


def test_a_submit_is_answered_and_stored_the_same_whichever_way_it_comes_in(app):
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    viewer = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                             headers=admin).json()["token"]
    r = app.client.post(f"{app.api}/templates", headers=app.h(), json={
        "metadata": {"name": "tpl", "labels": {"tier": "batch"}}, "spec": {"priority": -10, "task_template": {
            "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 2}}}}})
    assert r.status_code == 201, r.text
    assert app.client.post(f"{app.api}/runs", json=body("taken"), headers=app.h()).status_code == 201
    bad = body("bad")
    bad["spec"]["task_template"]["requested_resources"]["gpu_requests"]["count"] = -1
    huge = body("huge")
    huge["spec"]["task_template"]["requested_resources"]["memory_bytes"] = 2**63
    depends = body("after")
    depends["spec"]["dependency"] = {"type": "afterok", "runs": ["nothing-of-that-name"]}
    elsewhere = body("elsewhere")
    elsewhere["spec"]["cluster"] = "nowhere"
    # (what, body, headers, the path's workspace, status); {entry} in a name: one run per entry
    cases = [("plain run", body("ok-{entry}", gpus=2), app.h(), app.api, 201),
             ("template", {"metadata": {"name": "tpl-{entry}"}, "spec": {"template": "tpl"}}, app.h(), app.api, 201),
             ("invalid body", bad, app.h(), app.api, 422),
             ("not an object", [1, 2], app.h(), app.api, 422),
             ("unknown workspace", body("u"), app.h(), "/api/v1/o/acme/w/nowhere", 404),
             ("no token", body("n"), {}, app.api, 401),
             ("bad token", body("t"), app.h("ast_u_not-a-token"), app.api, 401),
             ("machine token", body("m"), app.h(app.boot["machine_token"]), app.api, 403),
             ("reader", body("v"), app.h(viewer), app.api, 403),
             ("name taken", body("taken"), app.h(), app.api, 409),
             ("priority above the cap", body("high", priority=60), app.h(), app.api, 403),
             ("no such cluster", elsewhere, app.h(), app.api, 404),
             ("no such dependency", depends, app.h(), app.api, 400),
             ("no such drive", body("d", datavolume_refs=[{"name": "none", "mount_path": "/d"}]), app.h(), app.api,
              400),
             ("too much memory", huge, app.h(), app.api, 422)]

    def for_entry(b, entry: str):
        return json.loads(json.dumps(b).replace("{entry}", entry))

    got: dict[str, dict[str, tuple[int, dict]]] = {what: {} for what, *_ in cases}
    for entry in ("fast", "routed", "unbatched", "direct"):
        for what, b, headers, api, _ in cases:
            if entry == "direct" and not isinstance(b, dict):  # what a request's JSON decodes to: FastAPI's 422
                continue
            got[what][entry] = answer_of(*submit(app, entry, api, for_entry(b, entry), headers))
    together = batch(app, [(api, for_entry(b, "batch"), headers) for _, b, headers, api, _ in cases])
    for (what, *_), out in zip(cases, together, strict=True):
        if out is not None:
            got[what]["batch"] = answer_of(*out)
    # the batch takes every plain submit; a template's run, a bad body and what reads more go another way
    assert {what for what in got if "batch" not in got[what]} == {
        "template", "invalid body", "not an object", "no such dependency", "no such drive", "too much memory"}

    for what, _, _, _, status in cases:
        answers = got[what]
        first = next(iter(answers.values()))
        assert first[0] == status, (what, first)
        for entry, a in answers.items():
            if status == 201:  # one run per entry: the same answer, but for its name
                a = json.loads(json.dumps(a).replace(f"-{entry}", "-ENTRY"))
                b = json.loads(json.dumps(first).replace("-fast", "-ENTRY"))
                assert a == b, (what, entry)
            else:
                assert a == first, (what, entry)

    # the rows: each entry's run stored alike, nothing stored for a refusal
    for prefix in ("ok", "tpl"):
        rows = {entry: stored(app, f"{prefix}-{entry}") for entry in SUBMITS if entry != "batch" or prefix == "ok"}
        assert all(rows.values()), rows
        for entry, r in rows.items():
            assert r == rows["fast"], (prefix, entry, differences(json.loads(r), json.loads(rows["fast"])))
    with app.cp.sessions() as s:
        names = set(s.scalars(select(Run.name)))
        submitted = sorted(s.scalars(select(Event.object).where(Event.kind == "RunSubmitted")))
    expected = {"taken"} | {f"ok-{e}" for e in SUBMITS} | {f"tpl-{e}" for e in SUBMITS if e != "batch"}
    assert names == expected
    assert submitted == sorted(expected)


def test_a_batch_judges_each_submit_as_it_would_be_alone(app):
    """The same names twice in one batch: the first is written, the second refused as it would be after it."""
    api, h = app.api, app.h()
    out = batch(app, [(api, body("twice"), h), (api, body("twice", priority=-1), h), (api, body("once"), h)])
    assert [o[0] for o in out] == [201, 409, 201]
    alone = answer_of(*submit(app, "direct", api, body("twice", priority=-1), h))
    assert answer_of(*out[1]) == alone


# ---------------------------------------------------------------------------------------------------- reports


def machine(app, name: str) -> str:
    r = app.client.post("/api/v1/agent/register", headers=app.h(app.boot["machine_token"]),
                        json={"name": name, "gpus": 4, "cpu_cores": 32, "memory_bytes": 1 << 36,
                              "stop_grace_seconds": 1})
    assert r.status_code == 200, r.text
    return r.json()["credential"]


def report(app, entry: str, b, headers: dict) -> tuple[int, dict]:
    if entry == "direct":
        try:
            agents.report(app.cp, headers.get("Authorization"), P.Report.model_validate(b))
        except services.ApiError as e:
            return refused(e)
        return 200, {"ok": True}
    ct = "application/json" if entry == "fast" else FASTAPI
    r = app.client.post(REPORT, content=json.dumps(b), headers={**headers, "Content-Type": ct})
    return r.status_code, r.json()


def placed(app, names: list[str]) -> dict[str, tuple[str, int]]:
    """Each run's worker once the scheduling loop placed it: its identity and attempt."""
    deadline = time.time() + 30
    while True:
        with app.cp.sessions() as s:
            rows = s.execute(select(Workspace.ns, Worker.name, Run.uid, Run.name, Worker.state, Worker.attempt)
                             .join(Run, Worker.run_id == Run.id).join(Workspace, Run.workspace_id == Workspace.id)
                             .where(Run.name.in_(names))).all()
        if len(rows) == len(names) and all(r[4] == "Starting" for r in rows):
            return {run: (P.worker_identity(ns, w, uid), attempt) for ns, w, uid, run, _, attempt in rows}
        assert time.time() < deadline, rows
        time.sleep(0.05)


def test_a_report_is_answered_and_stored_the_same_whichever_way_it_comes_in(app):
    cred = machine(app, "gpu-01")
    names = [f"r-{entry}" for entry in REPORTS]
    for n in names:
        assert app.client.post(f"{app.api}/runs", json=body(n), headers=app.h()).status_code == 201
    ids = placed(app, names)  # all on gpu-01, the only machine yet
    machine(app, "gpu-02")
    ok = {"machine": "gpu-01", "workers": []}
    cases = {"heartbeat": (ok, app.h(cred), 200),
             "join token": (ok, app.h(app.boot["machine_token"]), 403),
             "user token": (ok, app.h(), 403),
             "unknown token": (ok, app.h("ast_m_not-a-token"), 401),
             "no token": (ok, {}, 401),
             "another machine": ({"machine": "gpu-02", "workers": []}, app.h(cred), 403),
             "no such machine": ({"machine": "gpu-99", "workers": []}, app.h(cred), 403)}
    for what, (b, headers, status) in cases.items():
        answers = {entry: report(app, entry, b, headers) for entry in REPORTS}
        assert len({json.dumps(a, sort_keys=True) for a in answers.values()}) == 1, (what, answers)
        assert answers["fast"][0] == status, (what, answers)
    for entry in ("fast", "routed"):  # a body that is no report: FastAPI's 422, either way
        assert report(app, entry, {"workers": []}, app.h(cred))[0] == 422

    # each run's worker reported running, then exited, through one entry each: the same rows
    for entry, n in zip(REPORTS, names, strict=True):
        identity, attempt = ids[n]
        w = {"worker": identity, "attempt": attempt, "state": "Running", "pid": 4242, "started_at": time.time()}
        assert report(app, entry, {"machine": "gpu-01", "workers": [w]}, app.h(cred)) == (200, {"ok": True})
        line = {"worker": identity, "attempt": attempt, "seq": 1, "time": 1.0, "stream": "stdout", "text": "done"}
        end = {**w, "state": "Exited", "exit_code": 0, "finished_at": time.time()}
        assert report(app, entry, {"machine": "gpu-01", "workers": [end], "lines": [line]}, app.h(cred)) == \
            (200, {"ok": True})
    with app.cp.sessions() as s:
        volatile = ("started_at", "finished_at", "placed_at", "machine_id", "gpu_indices", "rendezvous", "deadline")
        rows = {}
        for n in names:
            run = s.scalar(select(Run).where(Run.name == n))
            ws = [{c.key: getattr(w, c.key) for c in Worker.__table__.columns
                   if c.key not in ("id", "run_id", "why_not", *volatile)} for w in run.workers]
            hist = [(h.state, re.sub(r"\d+", "#", h.reason)) for h in s.scalars(select(History).where(History.run_id == run.id)
                                                           .order_by(History.id))]
            rows[n] = json.dumps({"state": run.state, "reason": run.reason, "workers": ws, "history": hist},
                                 sort_keys=True, default=str).replace(n, "NAME")
    assert len(set(rows.values())) == 1, rows
    assert json.loads(rows[names[0]])["state"] == "Completed"
    for n in names:
        r = app.client.get(f"{app.api}/workers/{n}-0/logs", headers=app.h())
        assert r.status_code == 200 and "done" in r.text, (n, r.text)
