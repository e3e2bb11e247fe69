"""`astra astraeus replica-groups list|show|create -f|scale|delete` as a subprocess against a real local cluster
(one machine gpu-01 with 8 GPUs, the process runtime)."""

import json

import pytest

from tests.cli.test_commands import astra, ok, one_line_error
from tests.conftest import start_cluster

GROUP = {"metadata": {"name": "evals"}, "spec": {"replicas": 2, "run": {"priority": -5, "task_template": {
    "image": "python:3.11", "command": "sleep", "args": ["600"], "requested_resources": {"gpu_requests": {"count": 1}}}}}}


@pytest.fixture
def cluster(tmp_path):
    c = start_cluster(tmp_path / "home", env={"ASTRAEUS_SCHEDULE_INTERVAL": "1"})
    yield c
    c.stop()


def test_create_list_show_scale_delete(cluster, tmp_path):
    c = cluster
    f = tmp_path / "evals.json"
    f.write_text(json.dumps(GROUP))
    assert ok(astra(c, "astraeus", "replica-groups", "create", "-f", str(f))) == \
        "replica group evals created: 2 replica(s)\n"

    def running(n):
        shown = json.loads(ok(astra(c, "astraeus", "replica-groups", "show", "evals")))
        return shown["status"]["running"] == n and shown
    shown = c.wait_for(lambda: running(2), 60, what="two replicas running")
    assert sorted(r["name"] for r in shown["status"]["runs"]) == ["evals-1", "evals-2"]
    lines = ok(astra(c, "astraeus", "replica-groups", "list")).splitlines()
    assert lines[0].split() == ["NAME", "REPLICAS", "ALIVE", "RUNNING", "PRIORITY", "TEMPLATE", "NOTE"]
    assert lines[1].split() == ["evals", "2", "2", "2", "-5"]

    assert ok(astra(c, "astraeus", "replica-groups", "scale", "evals", "3")) == \
        "replica group evals scaled from 2 to 3\n"
    c.wait_for(lambda: running(3), 60, what="three replicas running")

    err = one_line_error(astra(c, "astraeus", "replica-groups", "scale", "evals", "--", "-1"))
    assert err == "error: 422 INVALID: spec.replicas: Input should be greater than or equal to 0", err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**GROUP, "spec": {**GROUP["spec"], "replica": 1}}))
    err = one_line_error(astra(c, "astraeus", "replica-groups", "create", "-f", str(bad)))
    assert err.endswith("spec.replica: unknown field: remove it or check its spelling"), err
    err = one_line_error(astra(c, "astraeus", "replica-groups", "show", "nope"))
    assert "replica group nope not found" in err

    assert ok(astra(c, "astraeus", "replica-groups", "delete", "evals")) == "replica group evals deleted, and its runs\n"
    assert ok(astra(c, "astraeus", "replica-groups", "list")).splitlines()[1:] == []
    with c.client() as h:
        c.wait_for(lambda: h.get("/runs").json()["items"] == [], 30, what="its runs deleted")
