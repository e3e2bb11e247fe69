"""How a run template's spec and a run's spec combine (astraeus.templates, pure), and a run made through the API from
a template (the template row written directly here; the templates API has its own tests): the run's fields win,
env and labels merge by key, drives and configs by mount path, and the run records the template and its version."""

from __future__ import annotations

from astraeus import templates
from tests.conftest import make_app

TEMPLATE = {
    "priority": -100,
    "task_template": {
        "image": "pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime", "command": "python", "args": ["/app/ft.py"],
        "env": {"CKPT_DIR": "/ckpt", "EPOCHS": "20"},
        "requested_resources": {"cpu_cores": 8, "gpu_requests": {"count": 1}},
        "datavolume_refs": [{"name": "ft-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"},
                            {"name": "data", "mount_path": "/data", "mode": "ReadOnly"}],
        "configs": [{"mounts": ["/etc/app.yaml"], "value": "a: 1"}],
    },
}


def test_the_runs_fields_win_env_merges_by_name_and_drives_by_mount_path():
    run = {"template": "ft", "task_template": {
        "args": ["/app/ft.py", "--fast"], "env": {"EPOCHS": "3", "SEED": "1"},
        "requested_resources": {"gpu_requests": {"count": 2}},
        "datavolume_refs": [{"name": "other-ckpt", "mount_path": "/ckpt", "mode": "ReadWrite"}],
        "configs": [{"mounts": ["/etc/extra.yaml"], "value": "b: 2"}]}}
    out = templates.merge(TEMPLATE, run)
    tt = out["task_template"]
    assert out["priority"] == -100 and out["template"] == "ft"
    assert tt["image"].startswith("pytorch/") and tt["command"] == "python"
    assert tt["args"] == ["/app/ft.py", "--fast"]  # a list the run gives is the run's
    assert tt["env"] == {"CKPT_DIR": "/ckpt", "EPOCHS": "3", "SEED": "1"}
    assert tt["requested_resources"] == {"cpu_cores": 8, "gpu_requests": {"count": 2}}
    assert [(d["name"], d["mount_path"]) for d in tt["datavolume_refs"]] == [("data", "/data"),
                                                                              ("other-ckpt", "/ckpt")]
    assert [c["mounts"] for c in tt["configs"]] == [["/etc/app.yaml"], ["/etc/extra.yaml"]]
    assert TEMPLATE["task_template"]["env"] == {"CKPT_DIR": "/ckpt", "EPOCHS": "20"}  # the template is unchanged
    assert templates.merge_labels({"team": "cv", "tier": "a"}, {"tier": "b"}) == {"team": "cv", "tier": "b"}
    assert templates.checkable({"task_template": {"command": "bash"}})["task_template"] == {
        "image": templates.PLACEHOLDER_TASK["image"], "command": "bash"}


def test_a_run_made_from_a_template_records_it_and_a_missing_one_is_refused(tmp_path):
    from astraeus.server.db import Template, Workspace

    client, boot, cp, _ = make_app(tmp_path, None, run_loop=False)
    h = {"Authorization": f"Bearer {boot['token']}"}
    api = "/api/v1/o/acme/w/vision"
    with client:
        spec = {"task_template": {"image": "python:3.11", "command": "python", "args": ["-c", "print(1)"],
                                  "env": {"A": "1", "B": "2"}}}
        with cp.sessions() as s, s.begin():
            ws = s.query(Workspace).filter_by(name="vision").one()
            s.add(Template(workspace_id=ws.id, name="py", labels={"team": "cv"}, spec=spec, version=3,
                           created_at=0, updated_at=0))
        r = client.post(api + "/runs", headers=h, json={"metadata": {"name": "r1", "labels": {"x": "y"}},
                                                        "spec": {"template": "py", "task_template": {"env": {"B": "3"}}}})
        assert r.status_code == 201, r.text
        run = r.json()
        assert run["spec"]["template"] == "py" and run["spec"]["task_template"]["command"] == "python"
        assert run["spec"]["task_template"]["env"] == {"A": "1", "B": "3"}
        assert run["metadata"]["labels"] == {"team": "cv", "x": "y"}
        from astraeus.server.db import Run

        with cp.sessions() as s:
            row = s.query(Run).filter_by(name="r1").one()
            assert (row.template, row.template_version) == ("py", 3)
        # a template that does not exist, or a merged spec that is still incomplete: refused, nothing stored
        r = client.post(api + "/runs", headers=h, json={"metadata": {"name": "r2"}, "spec": {"template": "nope"}})
        assert r.status_code == 404 and r.json()["message"].startswith("spec.template: template nope does not exist")
        r = client.post(api + "/runs", headers=h, json={"metadata": {"name": "r3"}, "spec": {"task_template": {
            "image": "python:3.11"}}})
        assert r.status_code == 422 and r.json()["message"] == "spec.task_template.command: field required"
        names = [x["metadata"]["name"] for x in client.get(api + "/runs", headers=h).json()["items"]]
        assert names == ["r1"]
    cp.engine.dispose()
