"""Issue 46: runs asking GPU memory (`gpu_requests.memory_bytes`) through the API of an in-process control plane
(machines registered by the test with their GPUs' memory, no agents): the share taken is the placing machine's, a
machine whose GPUs are too small says so in the worker's why-not lines, and bad asks get a 422."""

from __future__ import annotations

import pytest

from tests.api.test_gpu_fractions import frac
from tests.api.test_whatif import _h, counts, placed, submit
from tests.conftest import wait_for

GIB = 1 << 30


def register(app, name: str, gpus: int, gpu_memory_gib: int | None, mig: list | None = None) -> dict:
    body = {"name": name, "gpus": gpus, "cpu_cores": 32, "memory_bytes": 1 << 38, "stop_grace_seconds": 1}
    if gpu_memory_gib is not None:
        body["gpu_memory_bytes"] = [gpu_memory_gib * GIB] * gpus
    if mig is not None:
        body["gpu_mig"] = mig
    return app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json=body)


def test_a_memory_ask_takes_the_placing_machines_share(app):
    assert register(app, "gpu-40", 1, 40).status_code == 200
    assert register(app, "gpu-80", 1, 80).status_code == 200
    submit(app, frac("small", {"count": 1, "memory_bytes": 20 * GIB}))
    w = placed(app, "small-0")
    assert (w["machine"], w["gpu_indices"], w["gpu_fraction"]) == ("gpu-40", [0], 0.5)  # the smallest GPU it fits
    submit(app, frac("big", {"count": 1, "memory_bytes": 60 * GIB}))
    w = placed(app, "big-0")
    assert (w["machine"], w["gpu_fraction"]) == ("gpu-80", 0.75)
    got = app.client.get(app.api + "/runs/big", headers=app.h()).json()
    assert got["spec"]["task_template"]["requested_resources"]["gpu_requests"]["memory_bytes"] == 60 * GIB


def test_a_machine_whose_gpu_is_too_small_says_so(app):
    assert register(app, "gpu-40", 1, 40).status_code == 200
    assert register(app, "old", 1, None).status_code == 200  # an older agent: no GPU memory reported
    submit(app, frac("huge", {"count": 1, "memory_bytes": 48 * GIB}))

    def lines():
        w = app.client.get(app.api + "/workers/huge-0", headers=app.h()).json()
        return {x["machine"]: x["reason"] for x in w.get("why_not") or []} or None

    got = wait_for(lines, 20, what="why-not lines")
    assert got["gpu-40"] == "machine's GPUs have 40 GiB of memory, 48 GiB asked (less than one GPU's memory)"
    assert got["old"] == "machine reports no GPU memory, 48 GiB of GPU memory asked"
    run = app.client.get(app.api + "/runs/huge", headers=app.h()).json()
    assert run["status"]["state"] == "Pending"
    assert "48 GiB of GPU memory; no machine it may use has a GPU with more" in run["status"]["reason"]


@pytest.mark.parametrize("gpu, words", [
    ({"count": 1, "memory_bytes": -1}, "gpu_requests.memory_bytes must be more than 0"),
    ({"count": 1, "memory_bytes": GIB, "fraction": 0.5}, "give one of fraction or memory_bytes"),
    ({"count": 1, "memory_bytes": GIB, "min_per_machine": 1}, "leave out min_per_machine"),
    ({"count": 1, "memory_bytes": "lots"}, "memory_bytes"),
])
def test_bad_memory_asks_are_refused_and_nothing_is_stored(app, gpu, words):
    before = counts(app)
    r = app.client.post(app.api + "/runs", json=frac("bad", gpu), headers=app.h())
    assert r.status_code == 422, r.text
    assert words in r.text, r.text
    assert counts(app) == before


@pytest.mark.parametrize("field, value", [
    ("gpu_memory_bytes", [-1]),
    ("gpu_mig", [{"1g.10gb": -2}]),
    ("gpu_mig", [{"1g.10gb": 65}]),
])
def test_an_agent_reporting_bad_gpu_memory_or_mig_is_refused(app, field, value):
    body = {"name": "gpu-x", "gpus": 1, "cpu_cores": 32, "memory_bytes": 1 << 38, field: value}
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json=body)
    assert r.status_code == 422 and field in r.text, r.text


def test_mig_devices_are_stored_and_a_malformed_profile_is_refused(app):
    assert register(app, "a100", 1, 40, mig=[{"1g.10gb": 7}]).status_code == 200
    with app.cp.sessions() as s:
        from sqlalchemy import select

        from astraeus.server.db import Machine
        m = s.scalar(select(Machine).where(Machine.name == "a100"))
        assert (m.gpu_memory, m.gpu_mig) == ([40 * GIB], [{"1g.10gb": 7}])
    r = app.client.post(app.api + "/runs", json=frac("mig", {"count": 1, "mig": "1g"}), headers=app.h())
    assert r.status_code == 422 and "gpu_requests.mig: '1g' is not a MIG profile" in r.text, r.text
