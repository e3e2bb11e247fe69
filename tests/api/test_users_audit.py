"""Users, who made what, per-user limits and the audit log (docs/users.md): a run submitted with alice's token
shows alice in the API, squeue, describe and `runs -o wide`; bob's delete is in the events and the audit log with
his name; a viewer's refused delete is in the audit log as refused; a per-user GPU limit holds with its reason;
bad input is a clear 4xx with nothing stored; no secret ever reaches the audit log."""

from __future__ import annotations

import json

from astraeus.cli.format import describe_run, runs_wide_table, squeue_table
from tests.conftest import wait_for

ORG = "/api/v1/o/acme"


def _h(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def admin(app) -> dict:
    return _h(app.boot["admin_token"])


def user(app, name: str, role: str | None = "editor", **more) -> str:
    """A user with `role` in workspace vision, and a token of theirs there (its secret)."""
    r = app.client.post(f"{ORG}/users", headers=admin(app),
                        json={"name": name, "roles": {"vision": role} if role else {}, **more})
    assert r.status_code == 201, r.text
    r = app.client.post(f"{ORG}/users/{name}/tokens", headers=admin(app), json={"workspace": "vision"})
    assert r.status_code == 201, r.text
    assert r.json()["user"] == name and r.json()["role"] == role
    return r.json()["token"]


def run_body(name: str, gpus: int = 0) -> dict:
    tt = {"image": "python:3.11", "command": "sleep", "args": ["600"]}
    if gpus:
        tt["requested_resources"] = {"gpu_requests": {"count": gpus}}
    return {"metadata": {"name": name}, "spec": {"task_template": tt}}


def submit(app, token: str, name: str, gpus: int = 0) -> dict:
    r = app.client.post(f"{app.api}/runs", headers=_h(token), json=run_body(name, gpus))
    assert r.status_code == 201, r.text
    return r.json()


def audit(app, **params) -> list[dict]:
    r = app.client.get(f"{ORG}/audit", headers=admin(app), params=params)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def test_a_run_submitted_with_alices_token_shows_alice_everywhere(app):
    alice = user(app, "alice", display_name="Alice A.", email="alice@example.org")
    made = submit(app, alice, "train")
    assert made["metadata"]["created_by"] == "alice" and made["metadata"]["updated_by"] == "alice"
    run = app.client.get(f"{app.api}/runs/train", headers=app.h()).json()
    assert run["metadata"]["created_by"] == "alice"
    # what `astra slurm squeue`, `astra astraeus runs -o wide` and `astra astraeus describe` print of it
    header, line = squeue_table([run]).splitlines()[:2]
    assert line.split()[header.split().index("USER")] == "alice"
    header, line = runs_wide_table([run]).splitlines()[:2]
    assert line.split()[header.split().index("USER")] == "alice"
    assert "Created by:" in describe_run(run) and "alice" in describe_run(run).split("Created by:")[1].split("\n")[0]
    page = app.client.get("/o/acme/w/vision/jobs/main/train", headers=app.h())  # the console's run page
    assert page.status_code == 200 and "by <span data-created-by>alice</span>" in page.text
    # a PATCH by bob makes him the one who changed it last
    bob = user(app, "bob")
    assert app.client.patch(f"{app.api}/runs/train", headers=_h(bob), json={"priority": -10}).status_code == 200
    meta = app.client.get(f"{app.api}/runs/train", headers=app.h()).json()["metadata"]
    assert (meta["created_by"], meta["updated_by"]) == ("alice", "bob")


def test_templates_record_who_made_and_changed_them(app):
    alice = user(app, "alice")
    bob = user(app, "bob")
    body = {"metadata": {"name": "tpl"}, "spec": {"task_template": {"image": "python:3.11"}}}
    r = app.client.post(f"{app.api}/templates", headers=_h(alice), json=body)
    assert r.status_code == 201, r.text
    assert r.json()["metadata"]["created_by"] == "alice"
    body["spec"]["task_template"]["image"] = "python:3.12"
    r = app.client.put(f"{app.api}/templates/tpl", headers=_h(bob), json=body)
    assert r.status_code == 200, r.text
    meta = app.client.get(f"{app.api}/templates/tpl", headers=app.h()).json()["metadata"]
    assert (meta["created_by"], meta["updated_by"]) == ("alice", "bob")


def test_bobs_delete_is_in_the_events_and_the_audit_log(app):
    alice, bob = user(app, "alice"), user(app, "bob")
    submit(app, alice, "train")
    r = app.client.delete(f"{app.api}/runs/train", headers=_h(bob))
    assert r.status_code == 200, r.text
    events = app.client.get(f"{app.api}/events", headers=app.h()).json()["items"]
    assert {"kind": "RunDeleted", "object": "train", "message": "Deleted by bob"} in [
        {k: e[k] for k in ("kind", "object", "message")} for e in events]
    deletes = [e for e in audit(app, user="bob") if e["action"] == "delete"]
    assert [(e["user"], e["workspace"], e["object"], e["status"], e["allowed"]) for e in deletes] == [
        ("bob", "vision", "runs/train", 200, True)]
    assert deletes[0]["address"]


def test_a_viewers_refused_delete_is_in_the_audit_log_as_refused(app):
    alice, carol = user(app, "alice"), user(app, "carol", role="viewer")
    submit(app, alice, "train")
    r = app.client.delete(f"{app.api}/runs/train", headers=_h(carol))
    assert r.status_code == 403, r.text
    refused = [e for e in audit(app, user="carol", workspace="vision") if e["action"] == "delete"]
    assert [(e["object"], e["status"], e["allowed"]) for e in refused] == [("runs/train", 403, False)]
    # a request with no valid token is written down too, with no user
    assert app.client.delete(f"{app.api}/runs/train", headers=_h("ast_u_nope")).status_code == 401
    assert [e["status"] for e in audit(app) if e["user"] is None and e["action"] == "delete"] == [401]
    # reads are not audited
    assert all(e["method"] != "GET" for e in audit(app))


def test_the_audit_log_never_holds_a_secret_and_pages(app):
    secret = user(app, "alice")  # two POSTs: the user, then a token whose secret is in the answer only
    r = app.client.put(f"{app.api}/registries/registry.example.org", headers=app.h(),
                       json={"username": "u", "password": "hunter2-pw"})
    assert r.status_code in (200, 201), r.text
    entries = audit(app)
    text = json.dumps(entries)
    assert secret not in text and "hunter2-pw" not in text and app.boot["admin_token"] not in text
    assert ("users/alice/tokens", "admin") in [(e["object"], e["user"]) for e in entries]
    first = app.client.get(f"{ORG}/audit", headers=admin(app), params={"limit": 1}).json()
    assert len(first["items"]) == 1 and first["next_cursor"]
    second = app.client.get(f"{ORG}/audit", headers=admin(app),
                            params={"limit": 1, "cursor": first["next_cursor"]}).json()
    assert second["items"][0]["id"] > first["items"][0]["id"]
    # append-only: no route changes or removes an entry
    assert app.client.delete(f"{ORG}/audit", headers=admin(app)).status_code == 405
    assert app.client.get(f"{ORG}/audit", headers=admin(app), params={"since": "yesterday"}).status_code == 422


def test_a_per_user_gpu_limit_holds_with_its_reason(app):
    r = app.client.patch(f"{ORG}/workspaces/vision", headers=admin(app),
                         json={"clusters": {"main": {"max_gpus_per_user": 8}}})
    assert r.status_code == 200, r.text
    assert r.json()["clusters"]["main"]["max_gpus_per_user"] == 8
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": "gpu-01", "gpus": 16, "cpu_cores": 64, "memory_bytes": 1 << 40,
                              "stop_grace_seconds": 1})
    assert r.status_code == 200, r.text
    alice, bob = user(app, "alice"), user(app, "bob")
    submit(app, alice, "a1", gpus=8)
    wait_for(lambda: app.client.get(f"{app.api}/runs/a1", headers=app.h()).json()["status"]["workers"][0]["machine"],
             what="a1 placed")
    submit(app, alice, "a2", gpus=4)
    submit(app, bob, "b1", gpus=4)
    says = "Waits for alice's limit: gpus 8 in use + 4 asked > 8"
    wait_for(lambda: app.client.get(f"{app.api}/runs/a2", headers=app.h()).json()["status"]["reason"] == says,
             what="a2 waiting for alice's limit")
    wait_for(lambda: app.client.get(f"{app.api}/runs/b1", headers=app.h()).json()["status"]["workers"][0]["machine"],
             what="bob's run placed beside")
    assert app.client.get(f"{app.api}/runs/a2", headers=app.h()).json()["status"]["state"] == "Pending"


def test_bad_input_is_a_clear_4xx_and_nothing_is_stored(app):
    before = app.client.get(f"{ORG}/users", headers=admin(app)).json()["items"]
    r = app.client.post(f"{ORG}/users", headers=admin(app), json={"name": "dave", "roles": {"vision": "owner"}})
    assert r.status_code == 422 and "roles.vision: unknown role 'owner': give viewer, editor or admin" in r.text
    r = app.client.post(f"{ORG}/users", headers=admin(app), json={"name": "Dave!"})
    assert r.status_code == 422 and "name:" in r.json()["message"]
    r = app.client.post(f"{ORG}/users", headers=admin(app), json={"name": "dave", "roles": {"nowhere": "viewer"}})
    assert r.status_code == 422 and "no workspace named 'nowhere'" in r.text
    r = app.client.post(f"{ORG}/users", headers=admin(app), json={"name": "dave", "email": "not-an-address"})
    assert r.status_code == 422 and "email:" in r.text
    assert app.client.get(f"{ORG}/users", headers=admin(app)).json()["items"] == before
    user(app, "erin", role="viewer")
    r = app.client.post(f"{ORG}/users", headers=admin(app), json={"name": "erin"})
    assert r.status_code == 409 and "a user named erin already exists" in r.text
    r = app.client.post(f"{ORG}/users/erin/tokens", headers=admin(app), json={"workspace": "vision", "role": "admin"})
    assert r.status_code == 403 and "above user erin's role in workspace vision (viewer)" in r.text
    r = app.client.post(f"{ORG}/users/nobody/tokens", headers=admin(app), json={"workspace": "vision"})
    assert r.status_code == 404
    # only organisation admins manage users
    assert app.client.post(f"{ORG}/users", headers=app.h(), json={"name": "frank"}).status_code == 403


def test_users_are_updated_and_deleted_and_their_tokens_stop_working(app):
    alice = user(app, "alice", role="viewer")
    r = app.client.patch(f"{ORG}/users/alice", headers=admin(app), json={"roles": {"vision": "admin"},
                                                                          "display_name": "Alice"})
    assert r.status_code == 200 and r.json()["roles"] == {"vision": "admin"} and r.json()["display_name"] == "Alice"
    assert app.client.get(f"{ORG}/users/alice", headers=admin(app)).json()["roles"] == {"vision": "admin"}
    assert app.client.delete(f"{ORG}/users/alice", headers=admin(app)).status_code == 200
    assert app.client.get(f"{app.api}/runs", headers=_h(alice)).status_code == 401
    assert app.client.get(f"{ORG}/users/alice", headers=admin(app)).status_code == 404


def test_start_up_tokens_are_the_admin_users_and_the_token_endpoint_gives_a_service_account(app):
    users = {u["name"]: u for u in app.client.get(f"{ORG}/users", headers=admin(app)).json()["items"]}
    assert users["admin"]["org_admin"] and users["admin"]["roles"] == {"vision": "admin"}
    assert submit(app, app.boot["token"], "by-start-up")["metadata"]["created_by"] == "admin"
    r = app.client.post(f"{ORG}/tokens", headers=admin(app), json={"kind": "user", "workspace": "vision",
                                                                   "role": "editor"})
    assert r.status_code == 201, r.text
    assert submit(app, r.json()["token"], "by-ci")["metadata"]["created_by"] == "service:vision-editor"
