"""Issue 46: runs asking MIG devices (`gpu_requests.mig`) through the API of an in-process control plane (machines
registered by the test with their MIG devices, no agents): two runs take distinct devices and count 1/7 of a GPU
each, a third waits with its reason, a profile no machine has names the cluster's, and bad asks get a 422 that says
what a profile looks like."""

from __future__ import annotations

import pytest

from tests.api.test_whatif import _h, counts, placed, submit
from tests.conftest import wait_for


def register(app, name: str, gpus: int, mig: list) -> object:
    body = {"name": name, "gpus": gpus, "cpu_cores": 32, "memory_bytes": 1 << 38, "stop_grace_seconds": 1,
            "gpu_mig": mig}
    return app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json=body)


def mig(name: str, gpu: dict, machines: int | None = None) -> dict:
    rr = {"gpu_requests": gpu, "cpu_cores": 1, "memory_bytes": 1 << 30}
    if machines is not None:
        rr["machines"] = machines
    return {"metadata": {"name": name}, "spec": {"task_template": {"image": "python:3.11", "command": "true",
                                                                   "requested_resources": rr}}}


def reason(app, run: str):
    return (app.client.get(app.api + f"/runs/{run}", headers=app.h()).json().get("status") or {}).get("reason")


def test_two_mig_runs_take_distinct_devices_and_a_third_waits(app):
    assert register(app, "a100", 2, [{"1g.10gb": 2}, {}]).status_code == 200
    submit(app, mig("m1", {"count": 1, "mig": "1g.10gb"}))
    submit(app, mig("m2", {"count": 1, "mig": "1g.10gb"}))
    a, b = placed(app, "m1-0"), placed(app, "m2-0")
    assert a["gpu_indices"] == b["gpu_indices"] == [0]
    with app.cp.sessions() as s:
        from sqlalchemy import select

        from astraeus.server.db import Worker
        devs = {w.name: w.mig_devices for w in s.scalars(select(Worker).where(Worker.name.in_(["m1-0", "m2-0"])))}
    assert sorted(d for v in devs.values() for d in v) == [[0, "1g.10gb", 0], [0, "1g.10gb", 1]]
    submit(app, mig("m3", {"count": 1, "mig": "1g.10gb"}))
    # the head, as a run of whole GPUs would be: m1 and m2 have no time limit, so when a device frees is not known
    assert wait_for(lambda: reason(app, "m3") == "Next to run (priority 0): waits for running work to end" or None,
                    20, what="m3's reason")


def test_a_profile_no_machine_has_says_which_the_cluster_has(app):
    assert register(app, "a100", 1, [{"3g.40gb": 2}]).status_code == 200
    submit(app, mig("m", {"count": 1, "mig": "1g.10gb"}))
    want = "Cannot run on this cluster: asks for MIG 1g.10gb devices; the cluster's machines have 3g.40gb"
    assert wait_for(lambda: reason(app, "m") == want or None, 20, what="m's reason")


@pytest.mark.parametrize("gpu, machines, words", [
    ({"count": 1, "mig": "1g"}, None,
     "gpu_requests.mig: '1g' is not a MIG profile: give it as NVML names it, <slices>g.<memory>gb such as"),
    ({"count": 1, "mig": "9g.10gb"}, None, "'9g.10gb' is not a MIG profile"),
    ({"count": 0, "mig": "1g.10gb"}, None, "gpu_requests.mig: set count to how many MIG devices"),
    ({"count": 2, "mig": "1g.10gb", "min_per_machine": 1}, None, "leave out min_per_machine"),
    ({"count": 1, "mig": "1g.10gb", "fraction": 0.5}, None, "give one of fraction or mig"),
    ({"count": 1, "mig": "1g.10gb"}, 2, "gpu_requests.mig devices are for one worker on one machine; leave out "
                                        "machines (it is 2)"),
])
def test_bad_mig_asks_are_refused_and_nothing_is_stored(app, gpu, machines, words):
    before = counts(app)
    r = app.client.post(app.api + "/runs", json=mig("bad", gpu, machines), headers=app.h())
    assert r.status_code == 422, r.text
    assert words in r.text, r.text
    assert counts(app) == before
