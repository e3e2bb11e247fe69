"""Issue 46: fractional GPUs through the API of an in-process control plane (machines registered by the test, no
agents): bad gpu_requests get a 422 that says what to change and store nothing; a fraction is placed on a share of one
GPU, shown as such; the cluster setting decides whether workspaces share a GPU."""

from __future__ import annotations

import re
from html import unescape

import pytest

from astraeus.cli import format as fmt
from tests.api.test_whatif import ORG, _h, counts, other_workspace, placed, register, submit
from tests.conftest import wait_for


def frac(name: str, gpu: dict) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"], "requested_resources": {"gpu_requests": gpu}}}}


@pytest.mark.parametrize("gpu, words", [
    ({"count": 1, "fraction": 1.5}, "gpu_requests.fraction must be between 0 and 1"),
    ({"count": 1, "fraction": 0}, "gpu_requests.fraction must be between 0 and 1"),
    ({"count": 1, "fraction": -0.25}, "gpu_requests.fraction must be between 0 and 1"),
    ({"count": 2, "fraction": 0.5}, "set count to 1 (it is 2)"),
    ({"fraction": 0.5}, "set count to 1 (it is 0)"),
    ({"count": 1, "fraction": 0.0001}, "under a thousandth"),
    ({"count": 1, "fraction": 0.5, "min_per_machine": 1}, "leave out min_per_machine"),
    ({"count": 1, "fraction": 0.5, "mig": "1g.10gb"}, "give one of fraction or mig"),
    ({"count": 1, "mig": "1g.10gb MIG"}, "gpu_requests.mig: '1g.10gb MIG' is not a MIG profile"),
    ({"count": 1, "memory_bytes": 0}, "gpu_requests.memory_bytes must be more than 0"),
    ({"count": 2, "memory_bytes": 1 << 34}, "set count to 1 (it is 2)"),
])
def test_bad_fractions_are_refused_and_nothing_is_stored(app, gpu, words):
    before = counts(app)
    r = app.client.post(app.api + "/runs", json=frac("bad", gpu), headers=app.h())
    assert r.status_code == 422, r.text
    assert words in r.text, r.text
    assert counts(app) == before


def test_fraction_with_several_machines_is_refused(app):
    b = frac("bad", {"count": 1, "fraction": 0.5})
    b["spec"]["task_template"]["requested_resources"]["machines"] = 2
    r = app.client.post(app.api + "/runs", json=b, headers=app.h())
    assert r.status_code == 422 and "leave out machines" in r.text, r.text


def test_two_halves_share_one_gpu_and_a_whole_gpu_run_takes_another(app):
    register(app, "gpu-01", gpus=2)
    submit(app, frac("half-a", {"count": 1, "fraction": 0.5}))
    submit(app, frac("half-b", {"count": 1, "fraction": 0.5}))
    a, b = placed(app, "half-a-0"), placed(app, "half-b-0")
    assert a["gpu_indices"] == b["gpu_indices"] == [0]
    assert a["gpu_fraction"] == b["gpu_fraction"] == 0.5
    submit(app, frac("whole", {"count": 1}))
    assert placed(app, "whole-0")["gpu_indices"] == [1]
    machines = app.client.get(app.api + "/machines", headers=app.h()).json()["items"]
    assert [(m["name"], m["gpus_used"]) for m in machines] == [("gpu-01", 2)]  # the shared GPU counts once
    got = app.client.get(app.api + "/runs/half-a", headers=app.h()).json()
    assert got["spec"]["task_template"]["requested_resources"]["gpu_requests"]["fraction"] == 0.5


def test_other_workspaces_share_a_gpu_only_where_the_cluster_allows(app):
    register(app, "gpu-01", gpus=1)
    submit(app, frac("mine", {"count": 1, "fraction": 0.5}))
    placed(app, "mine-0")
    nlp = other_workspace(app)
    submit(app, frac("theirs", {"count": 1, "fraction": 0.5}), ws=nlp)

    def reason():
        r = app.client.get(f"{nlp[0]}/runs/theirs", headers=nlp[1]).json()
        return r["status"]["reason"] if r["status"]["state"] == "Pending" and r["status"].get("reason") else None

    assert wait_for(reason, 20, what="a reason")
    r = app.client.patch(f"{ORG}/clusters/main", json={"gpu_sharing": "any"}, headers=_h(app.boot["admin_token"]))
    assert r.status_code == 200, r.text
    assert r.json()["gpu_sharing"] == "any"
    assert placed(app, "theirs-0", ws=nlp)["gpu_indices"] == [0]


def test_a_machines_view_shows_each_gpus_part_held_and_its_memory_in_the_api_the_cli_and_the_console(app):
    """gpu_allocated / gpus_allocated count a shared GPU by its tenants' shares (gpus_used counts it once);
    gpu_memory_bytes is what the agent reported; `astra machines` has a SHARED column and the console a line
    naming the part of each shared GPU still free."""
    r = app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]),
                        json={"name": "gpu-01", "gpus": 3, "cpu_cores": 32, "memory_bytes": 1 << 38,
                              "stop_grace_seconds": 1, "gpu_memory_bytes": [80 << 30] * 3})
    assert r.status_code == 200, r.text
    submit(app, frac("quarter", {"count": 1, "fraction": 0.25}))
    placed(app, "quarter-0")
    submit(app, frac("whole", {"count": 1}))
    placed(app, "whole-0")
    (m,) = app.client.get(app.api + "/machines", headers=app.h()).json()["items"]
    assert (m["gpus_used"], m["gpus_free"]) == (2, 1)
    assert (m["gpu_allocated"], m["gpus_allocated"]) == ([0.25, 1, 0], 1.25)
    assert m["gpu_memory_bytes"] == [80 << 30] * 3
    assert fmt.machine_shared(m) == "GPU 0: 0.75 free"
    table = fmt.machines_table([m]).splitlines()
    assert re.search(r"GPUS FREE +SHARED +CPUS", table[0]), table[0]  # the column after GPUS FREE
    assert "GPU 0: 0.75 free" in table[1]
    org, ws = app.boot["org"], app.boot["workspace"]
    page = app.client.get(f"/o/{org}/w/{ws}/machines", headers=app.h())
    assert page.status_code == 200
    text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", page.text)))
    assert "GPU 0: 0.75 free" in text and "80 GiB" in text, text
    assert 'title="2 of 3 used (1.25 held: shared GPUs count by their share)"' in page.text


def test_a_machine_with_no_gpu_shared_shows_no_shared_column(app):
    register(app, "gpu-02", gpus=2)
    submit(app, frac("whole", {"count": 1}))
    placed(app, "whole-0")
    (m,) = app.client.get(app.api + "/machines", headers=app.h()).json()["items"]
    assert (m["gpu_allocated"], m["gpus_allocated"], m["gpu_memory_bytes"]) == ([1, 0], 1, [])
    assert fmt.machine_shared(m) == ""
    assert re.search(r"GPUS FREE +CPUS", fmt.machines_table([m]).splitlines()[0])  # no SHARED column between
