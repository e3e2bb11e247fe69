"""Make the database fixtures of tests/migrations from a released commit of this repository.

    .venv/bin/python tests/migrations/make_fixture.py            # both fixtures below
    .venv/bin/python tests/migrations/make_fixture.py 5a64dc1 release_5a64dc1

For a commit it extracts that commit's `src/` with `git archive` (the repository itself, nothing else) and,
with that code first on PYTHONPATH and this checkout's virtual environment:
  1. records the DDL its models' `create_all` emits on SQLite and PostgreSQL -> fixtures/<name>.ddl.json;
  2. runs its `astraeus up` (control plane and two agents with 2 simulated GPUs each), and through its API
     creates a drive, a second workspace with a quota, tokens (one revoked), runs that complete, fail, restart,
     wait, and one deleted, whose workers write log lines;
  3. stops it, and keeps its SQLite database, compacted (VACUUM, 1 KiB pages, rollback journal) ->
     fixtures/<name>.db;
  4. opens a copy with that same code, in process, and records what its API shows for every object, and the
     tokens' secrets (test-only) -> fixtures/<name>.json. The upgrade tests compare the new code's API to it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURES = HERE / "fixtures"
DEFAULT = [("5a64dc1", "release_5a64dc1"),  # the first release, stamped 0001, with workers.deadline
           ("bc54b02", "before_0eafa08")]  # before 0eafa08 added workers.deadline: stamped 0001 without it

DDL = r"""
import json, sys
from sqlalchemy import create_mock_engine
from astraeus.server import db

out = {}
for dialect, url in (("sqlite", "sqlite://"), ("postgresql", "postgresql+psycopg://")):
    stmts = []
    eng = create_mock_engine(url, lambda sql, *a, **k: stmts.append(str(sql.compile(dialect=eng.dialect)).strip()))
    db.Base.metadata.create_all(eng, checkfirst=False)
    out[dialect] = stmts
json.dump(out, sys.stdout, indent=1)
"""

SHOW = r"""
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from astraeus.app import create_app
from astraeus.server.core import ControlPlane
from astraeus.settings import ServerSettings

home, facts = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
settings = ServerSettings(home=home, database_url=None)
cp = ControlPlane.open(settings)
c = TestClient(create_app(settings, cp, run_loop=False))  # no `with`: the scheduling loop never starts
api, org = facts["api"], facts["org_api"]
h = {"Authorization": "Bearer " + facts["tokens"]["editor"]}
ha = {"Authorization": "Bearer " + facts["tokens"]["admin"]}
shown = {"runs": c.get(api + "/runs", headers=h).json()["items"], "run": {}, "logs": {},
         "workers": c.get(api + "/workers", headers=h).json()["items"],
         "drives": c.get(api + "/drives", headers=h).json()["items"],
         "events": c.get(api + "/events", params={"limit": 1000}, headers=h).json()["items"],
         "machines": c.get(api + "/machines", headers=h).json()["items"],
         "workspaces": c.get(org + "/workspaces", headers=ha).json()["items"],
         "tokens": c.get(org + "/tokens", headers=ha).json()["items"]}
for r in shown["runs"]:
    shown["run"][r["metadata"]["name"]] = c.get(api + "/runs/" + r["metadata"]["name"], headers=h).json()
for w in shown["workers"]:
    shown["logs"][w["name"]] = c.get(api + "/workers/" + w["name"] + "/logs", headers=h).text
json.dump(shown, sys.stdout, indent=1, sort_keys=True)
cp.engine.dispose()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def extract(commit: str, dest: Path) -> Path:
    """`src/` of `commit`, from this repository's own history."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src"


def released_env(src: Path) -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=str(src), ASTRAEUS_STOP_GRACE="1", ASTRAEUS_HEARTBEAT="1")
    e.pop("ASTRAEUS_DATABASE_URL", None)
    return e


def wait_for(what: str, predicate, timeout: float = 60.0, show=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"make_fixture: timed out waiting for {what} {show()})")


def scenario(httpx, api: str, org_api: str, editor: str, admin: str, data: Path) -> dict:
    """Objects of every kind, through the released API. Returns what a test needs besides the API: secrets."""
    u = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {editor}"}, timeout=30)
    a = httpx.Client(base_url=org_api, headers={"Authorization": f"Bearer {admin}"}, timeout=30)

    def ok(r, status=201):
        assert r.status_code == status, (r.request.url, r.status_code, r.text)
        return r.json()

    ok(u.post("/drives", json={"metadata": {"name": "ckpt"}, "spec": {
        "sources": [{"node": "gpu-01", "path": str(data / "ckpt"), "mount_path": "/ckpt", "mode": "ReadWrite"}],
        "permissions": {"create": True}}}))
    ok(a.post("/workspaces", json={"name": "nlp", "clusters": {"main": {
        "max_priority": 10, "weight": 2, "quota": {"gpus": 2, "workers": 3}, "host_paths": [str(data)]}}}))
    viewer = ok(a.post("/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"}))
    revoked = ok(a.post("/tokens", json={"kind": "user", "workspace": "nlp", "role": "editor"}))
    ok(a.delete(f"/tokens/{revoked['id']}"), 200)

    def run(name: str, script: str, **extra):
        tt = {"image": "python:3.11", "command": "sh", "args": ["-c", script]}
        tt.update(extra.pop("tt", {}))
        body = {"metadata": {"name": name, "labels": extra.pop("labels", {})},
                "spec": {"task_template": tt, **extra}}
        return ok(u.post("/runs", json=body))

    run("hello", 'echo "hello from $ASTRAEUS_WORKER_ID"; echo "to stderr" >&2; echo done',
        labels={"team": "vision"}, priority=-5,
        tt={"time_limit_seconds": 600, "requested_resources": {"gpu_requests": {"count": 2}, "machines": 2}})
    run("saves", "echo step > /ckpt/step && cat /ckpt/step",
        tt={"datavolume_refs": [{"name": "ckpt", "mount_path": "/ckpt"}], "restart_policy": "Never"})
    run("fails", "echo going; exit 3", tt={"restart_policy": "Never"})
    run("retries", 'echo "this is $ASTRAEUS_WORKER_ID"; exit 4', tt={"restart_policy": "OnFailure", "max_restarts": 1})
    run("waits", "true", tt={"requested_resources": {"gpu_requests": {"count": 64}}})
    run("gone", "true", tt={"requested_resources": {"gpu_requests": {"count": 64}}})
    ok(u.delete("/runs/gone"), 200)

    def state(name: str) -> str:
        return u.get(f"/runs/{name}").json()["status"]["state"]

    for name, want in (("hello", "Completed"), ("saves", "Completed"), ("fails", "Failed"), ("retries", "Failed")):
        wait_for(f"run {name} {want}", lambda n=name, w=want: state(n) == w, show=lambda n=name: u.get(f"/runs/{n}").text)
    wait_for("run waits to have a queue reason", lambda: any(
        u.get("/runs/waits").json()["status"].get(k) for k in ("reason", "queue_reason")))
    wait_for("the logs of every worker", lambda: all(
        u.get(f"/workers/{w['name']}/logs").text for w in u.get("/workers").json()["items"]
        if w["name"].split("-")[0] in ("hello", "saves", "fails", "retries")))
    return {"viewer": viewer["token"], "revoked": revoked["token"]}


def compact(db: Path, dest: Path) -> None:
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("PRAGMA page_size=1024")
    con.execute("VACUUM")
    con.close()
    shutil.copyfile(db, dest)


def make(commit: str, name: str) -> None:
    import httpx

    work = Path(tempfile.mkdtemp(prefix="astraeus-fixture-"))
    try:
        src = extract(commit, work / "checkout")
        env = released_env(src)
        ddl = subprocess.run([sys.executable, "-c", DDL], env=env, check=True, capture_output=True, text=True)
        (FIXTURES / f"{name}.ddl.json").write_text(ddl.stdout + "\n")

        home, data, port = work / "home", work / "data", free_port()
        data.mkdir()
        log = open(work / "up.log", "wb")
        up = subprocess.Popen([sys.executable, "-m", "astraeus.main", "up", "--home", str(home), "--port", str(port),
                               "--gpus", "2", "--machines", "2", "--host-path", str(data)],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            envf = home / "env"
            wait_for("astraeus up", lambda: envf.exists() and "ASTRAEUS_SERVER" in envf.read_text())
            v = dict(line[len("export "):].split("=", 1) for line in envf.read_text().splitlines())
            org_api = v["ASTRAEUS_SERVER"] + "/api/v1/o/acme"
            secrets = scenario(httpx, v["API"], org_api, v["ASTRAEUS_TOKEN"], v["ASTRAEUS_ADMIN_TOKEN"], data)
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=60)
        print((work / "up.log").read_text()[-2000:], file=sys.stderr)

        dest = FIXTURES / f"{name}.db"
        compact(home / "astraeus.db", dest)
        facts = {"commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", commit], check=True,
                                          capture_output=True, text=True).stdout.strip(),
                 "api": "/api/v1/o/acme/w/vision", "org_api": "/api/v1/o/acme",
                 "tokens": {"editor": v["ASTRAEUS_TOKEN"], "admin": v["ASTRAEUS_ADMIN_TOKEN"],
                            "machine": v["ASTRAEUS_MACHINE_TOKEN"], **secrets}}
        (work / "facts.json").write_text(json.dumps(facts))
        copy = work / "copy"
        copy.mkdir()
        shutil.copyfile(dest, copy / "astraeus.db")
        shown = subprocess.run([sys.executable, "-c", SHOW, str(copy), str(work / "facts.json")], env=env,
                               check=True, capture_output=True, text=True)
        facts["shown"] = json.loads(shown.stdout)
        (FIXTURES / f"{name}.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
        print(f"{dest}: {dest.stat().st_size} bytes", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    FIXTURES.mkdir(exist_ok=True)
    for commit, name in ([tuple(sys.argv[1:3])] if len(sys.argv) > 2 else DEFAULT):
        make(commit, name)
