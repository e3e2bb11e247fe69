"""Each request's database session (routers/deps.py, opened and closed on the event loop, used in the route's
thread): whatever the request's end, its connection goes back to the pool."""

from __future__ import annotations


def body(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 1}}}}}


def test_requests_refused_after_reading_hand_their_connection_back(app):
    # More requests than the pool holds (20 + 40 overflow), each refused after a read (its transaction still open):
    # a connection kept by any of them would make a later one wait out the pool's timeout and fail.
    for i in range(80):
        r = app.client.get(f"{app.api}/runs/missing-{i}", headers=app.h())
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"
    for _ in range(5):  # refused before any read: a bad body, a bad token
        assert app.client.post(f"{app.api}/runs", json={"metadata": {}}, headers=app.h()).status_code == 422
        assert app.client.post(f"{app.api}/runs", json=body("x"),
                               headers={"Authorization": "Bearer nope"}).status_code == 401
    r = app.client.post(f"{app.api}/runs", json=body("after-refusals"), headers=app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "after-refusals"
    assert app.client.get(f"{app.api}/runs/after-refusals", headers=app.h()).json()["metadata"]["name"] == \
        "after-refusals"


def test_a_dry_run_and_a_template_submit_answer_as_before(app):
    t = {"metadata": {"name": "tpl"}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 1}}}}}
    assert app.client.post(f"{app.api}/templates", json=t, headers=app.h()).status_code == 201
    r = app.client.post(f"{app.api}/runs?dry_run=true", json=body("maybe"), headers=app.h())
    assert r.status_code == 200
    assert app.client.get(f"{app.api}/runs/maybe", headers=app.h()).status_code == 404  # nothing stored
    r = app.client.post(f"{app.api}/runs", json={"metadata": {"name": "from-tpl"}, "spec": {"template": "tpl"}},
                        headers=app.h())
    assert r.status_code == 201 and r.json()["metadata"]["name"] == "from-tpl"


def test_every_refusal_of_a_workspace_caller_says_what_is_wrong(app):
    """The token, the organisation and the workspace are read in one statement (services.user_caller): each wrong
    part still gets its own answer, the same for a read and for a submit (the group-commit writer)."""
    adm = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    r = app.client.post("/api/v1/o/acme/workspaces", headers=adm, json={"name": "nlp", "clusters": {"main": {}}})
    assert r.status_code == 201, r.text
    nlp_tok = app.client.post("/api/v1/o/acme/tokens", headers=adm,
                              json={"kind": "user", "workspace": "nlp", "role": "editor"}).json()["token"]
    missing = "missing bearer token: send 'Authorization: Bearer $ASTRAEUS_TOKEN'"
    unknown = "the token is not valid (unknown or revoked): ask for a new one"
    cases = {  # (path, headers) -> (status, code, message)
        (app.api, ()): (401, "UNAUTHENTICATED", missing),
        (app.api, (("Authorization", f"Basic {app.boot['token']}"),)): (401, "UNAUTHENTICATED", missing),
        (app.api, (("Authorization", "Bearer ast_u_nope"),)): (401, "UNAUTHENTICATED", unknown),
        (app.api, (("Authorization", f"Bearer {app.boot['machine_token']}"),)):
            (403, "FORBIDDEN", "a machine token cannot call user endpoints"),
        ("/api/v1/o/acme/w/nlp", tuple(app.h().items())):
            (404, "NOT_FOUND", "workspace acme/nlp not found (or this token has no access)"),
        ("/api/v1/o/acme/w/nope", tuple(app.h().items())):
            (404, "NOT_FOUND", "workspace acme/nope not found (or this token has no access)"),
        ("/api/v1/o/nope/w/vision", tuple(app.h().items())):
            (404, "NOT_FOUND", "workspace nope/vision not found (or this token has no access)"),
        ("/api/v1/o/nope/w/vision", tuple(adm.items())):
            (404, "NOT_FOUND", "workspace nope/vision not found (or this token has no access)"),
        (app.api, (("Authorization", f"Bearer {nlp_tok}"),)):
            (404, "NOT_FOUND", "workspace acme/vision not found (or this token has no access)"),
    }
    for (base, headers), (status, code, message) in cases.items():
        for method, body_ in (("GET", None), ("POST", body("refused"))):
            r = app.client.request(method, base + "/runs", headers=dict(headers), json=body_)
            assert (r.status_code, r.json()["code"], r.json()["message"]) == (status, code, message), (base, method)
    # and each right caller is let in: the workspace's own token, another's in its own, an organisation admin
    assert app.client.get(app.api + "/runs", headers=app.h()).status_code == 200
    assert app.client.get("/api/v1/o/acme/w/nlp/runs", headers={"Authorization": f"Bearer {nlp_tok}"}).status_code \
        == 200
    r = app.client.post("/api/v1/o/acme/w/nlp/runs", headers=adm, json=body("by-admin"))
    assert r.status_code == 201, r.text
    assert app.client.get(app.api + "/runs/refused", headers=app.h()).status_code == 404  # nothing was stored
