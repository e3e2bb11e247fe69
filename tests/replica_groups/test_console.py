"""The console's replica group pages (in process, a Bearer header), and what a viewer sees of a group's run."""

from tests.conftest import wait_for

RUN = {"task_template": {"image": "python:3.11", "command": "sleep 60", "env": {"TOKEN": "s3cret"}}}


def test_the_replica_group_pages(app):
    body = {"metadata": {"name": "web"}, "spec": {"replicas": 2, "run": RUN}}
    assert app.client.post(app.api + "/replica-groups", json=body, headers=app.h()).status_code == 201
    wait_for(lambda: app.client.get(app.api + "/replica-groups/web", headers=app.h()).json()["status"]["alive"] == 2,
             what="two replicas")
    r = app.client.get("/o/acme/w/vision/replica-groups", headers=app.h())
    assert r.status_code == 200
    assert '<a href="/o/acme/w/vision/replica-groups/web">web</a>' in r.text
    assert "<td>2</td><td>2</td><td>0</td>" in r.text  # wanted, alive, running (no machines here)
    r = app.client.get("/o/acme/w/vision/replica-groups/web", headers=app.h())
    assert r.status_code == 200
    assert "2 of 2 alive, 0 running" in r.text
    assert '<a href="/o/acme/w/vision/jobs/main/web-1">web-1</a>' in r.text
    assert "replica group web: created web-2 (2 of 2)" in r.text
    assert "s3cret" in r.text  # an editor sees env values
    r = app.client.get("/o/acme/w/vision/replica-groups/nope", headers=app.h())
    assert r.status_code == 404 and "replica group nope not found" in r.text


def test_a_viewer_does_not_see_env_values(app):
    body = {"metadata": {"name": "web"}, "spec": {"replicas": 0, "run": RUN}}
    assert app.client.post(app.api + "/replica-groups", json=body, headers=app.h()).status_code == 201
    admin = {"Authorization": f"Bearer {app.boot['admin_token']}"}
    r = app.client.post("/api/v1/o/acme/tokens", json={"kind": "user", "workspace": "vision", "role": "viewer"},
                        headers=admin)
    assert r.status_code == 201, r.text
    viewer = {"Authorization": f"Bearer {r.json()['token']}"}
    shown = app.client.get(app.api + "/replica-groups/web", headers=viewer).json()
    assert shown["spec"]["run"]["task_template"]["env"] == {"TOKEN": "******"}
    page = app.client.get("/o/acme/w/vision/replica-groups/web", headers=viewer)
    assert page.status_code == 200 and "s3cret" not in page.text
    r = app.client.patch(app.api + "/replica-groups/web", json={"spec": {"replicas": 1}}, headers=viewer)
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
