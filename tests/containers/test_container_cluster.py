"""Containers through the whole product: `astraeus up --runtime container`, runs submitted to the API, images
from real local registries (one plain, one with a password), the reasons a user reads.

- an unknown image, an unreachable registry and a refused credential each end the worker with a clear start
  failure (never a 5xx, never stuck Starting), handled by the restart policy;
- registry credentials set in the workspace (PUT $API/registries/<host>) are what the machine pulls with;
- a preempted worker reads who preempted it in $ASTRAEUS_STOP_REASON_FILE before its SIGTERM arrives.
"""

from __future__ import annotations

import json

import pytest

from tests import oci
from tests.conftest import start_cluster

pytestmark = pytest.mark.skipif(bool(oci.tools_missing()), reason="container tools missing")


@pytest.fixture(scope="module")
def private_registry(busybox_layout):
    reg = oci.Registry(auth=("team-bot", "pw-" + __import__("secrets").token_hex(8)))
    image = oci.push(busybox_layout, reg, "team/private:1")
    reg.image = image
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def ccluster(tmp_path_factory, registry, private_registry, busybox_image):
    c = start_cluster(tmp_path_factory.mktemp("ccluster") / "home", extra_args=["--runtime", "container"],
                      env={"ASTRAEUS_INSECURE_REGISTRIES": f"{registry.host},{private_registry.host}"})
    yield c
    c.stop()


def run_spec(name: str, image: str, script: str, gpus: int = 1, priority: int = 0, **tt) -> dict:
    template = {"image": image, "command": "sh", "args": ["-c", script],
                "requested_resources": {"gpu_requests": {"count": gpus}}}
    template.update(tt)
    return {"metadata": {"name": name}, "spec": {"priority": priority, "task_template": template}}


def submit(c, spec: dict) -> None:
    with c.client() as h:
        r = h.post("/runs", json=spec)
    assert r.status_code in (200, 201), r.text


def ended(c, name: str, timeout: float = 60) -> dict:
    return c.wait_for(lambda: (r := c.run(name))["status"]["state"] in ("Completed", "Failed") and r, timeout,
                      what=f"{name} to end")


def test_pull_failures_are_start_failures_with_clear_reasons(ccluster, registry, private_registry):
    cases = {
        "pull-unknown": (f"{registry.host}/no/such-image:1", f"image {registry.host}/no/such-image:1 not found"),
        "pull-unreachable": ("127.0.0.1:1/team/eval:1", "registry 127.0.0.1:1 unreachable"),
        "pull-nocreds": (private_registry.image, f"no credentials for {private_registry.host}"),
    }
    for name, (image, _) in cases.items():
        submit(ccluster, run_spec(name, image, "true", restart_policy="Never"))
    for name, (_image, words) in cases.items():
        run = ended(ccluster, name)
        w = ccluster.worker(f"{name}-0")
        assert run["status"]["state"] == "Failed" and w["state"] == "Failed", (run, w)
        assert "(failed to start: image " in w["reason"] and words in w["reason"], w["reason"]
    # OnFailure: a start failure spends a restart, with backoff, like any failure
    submit(ccluster, run_spec("pull-retry", f"{registry.host}/no/such-image:1", "true", max_restarts=1))
    w = ccluster.wait_for(lambda: (x := ccluster.worker("pull-retry-0"))["reason"].startswith("Restarting")
                          and x, 60, what="a restart")
    assert "failed to start: image" in w["reason"] and "restart 1 of 1" in w["reason"]
    # the module's cluster is shared: a run left waiting to restart (priority 0) would preempt the next test's
    # low-priority run itself, and that worker would read "pull-retry", not the run the test submitted
    with ccluster.client() as h:
        assert h.delete("/runs/pull-retry").json()["deleted"] is True


def test_the_workspaces_registry_credentials_are_what_the_machine_pulls_with(ccluster, private_registry):
    host = private_registry.host
    with ccluster.client() as h:
        assert h.put(f"/registries/{host}", json={"username": private_registry.username,
                                                   "password": "wrong"}).status_code in (200, 201)
    submit(ccluster, run_spec("priv-wrong", private_registry.image, "true", restart_policy="Never"))
    run = ended(ccluster, "priv-wrong")
    reason = ccluster.worker("priv-wrong-0")["reason"]
    assert run["status"]["state"] == "Failed" and f"the workspace's credentials for {host} were refused" in reason
    with ccluster.client() as h:
        assert h.put(f"/registries/{host}", json={"username": private_registry.username,
                                                   "password": private_registry.password}).status_code in (200, 201)
        listed = h.get("/registries").text
    assert private_registry.password not in listed and "wrong" not in listed
    submit(ccluster, run_spec("priv-right", private_registry.image, "cat /etc/astraeus-test-image",
                              restart_policy="Never"))
    assert ended(ccluster, "priv-right")["status"]["state"] == "Completed"
    assert "busybox test image" in ccluster.logs("priv-right-0")
    # the password is in no log the control plane or the machine wrote
    for log in ccluster.home.rglob("*.log"):
        assert private_registry.password not in log.read_text(errors="replace"), log


def test_a_preempted_worker_reads_who_preempted_it_before_sigterm(ccluster, busybox_image):
    script = ("trap 'echo got-TERM; cat $ASTRAEUS_STOP_REASON_FILE; echo; exit 0' TERM; "
              "echo ready; while true; do sleep 0.1; done")
    submit(ccluster, run_spec("lowprio", busybox_image, script, gpus=8, priority=-100))
    ccluster.wait_for(lambda: "ready" in ccluster.logs("lowprio-0"), 60, what="lowprio running")
    submit(ccluster, run_spec("urgent-eval", busybox_image, "echo urgent-ran", gpus=8, priority=0))
    ccluster.wait_for(lambda: ccluster.run("urgent-eval")["status"]["state"] == "Completed", 60,
                      what="urgent-eval to run")
    logs = ccluster.logs("lowprio-0")
    assert "got-TERM" in logs
    reason = _json_line(logs)
    assert "Preempted" in reason["reason"] and "urgent-eval" in reason["reason"], reason
    assert reason["grace_seconds"] > 0
    w = ccluster.worker("lowprio-0")
    assert w["restarts"] == 0 and w["preemptions"] >= 1, w
    with ccluster.client() as h:
        h.delete("/runs/lowprio")


def _json_line(logs: str) -> dict:
    for line in logs.splitlines():
        i = line.find('{"reason"')
        if i >= 0:
            return json.loads(line[i:])
    raise AssertionError(f"no stop reason in the worker's log: {logs}")
