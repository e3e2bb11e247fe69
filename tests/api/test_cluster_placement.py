"""Issue 46: a cluster's placement (`fgd`, `bestfit` or `spread`) is a stored setting of the organisation API,
and the scheduler places by it: FGD puts a quarter GPU on an empty GPU where best fit squeezes it beside a half
(tests/scheduler/test_fragments.py's case, through an in-process control plane with registered machines)."""

from __future__ import annotations

import pytest

from astraeus.scheduler import fragments
from astraeus.scheduler.gpushare import best_fit
from tests.api.test_whatif import ORG, _h, placed, register, submit


def frac(name: str, fraction: float) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "sleep", "args": ["600"],
        "requested_resources": {"gpu_requests": {"count": 1, "fraction": fraction}}}}}


def cluster(app) -> dict:
    r = app.client.get(f"{ORG}/clusters", headers=_h(app.boot["admin_token"]))
    return next(c for c in r.json()["items"] if c["name"] == "main")


def test_the_table_case_differs_between_fgd_and_bestfit():
    """A half on GPU 0 of gpu-01, gpu-02 empty, a quarter and a half in the workload: best fit takes the half
    GPU (a quarter left, too small for a half); FGD the empty one (three quarters left, room for a half)."""
    cands = [(0, (500,)), (1, (1000,))]
    sizes = fragments.sizes_of_gpus({0.5: 1, 0.25: 1})
    assert fragments.fgd_share(cands, 250, sizes) == (1, 0)
    ws = "ws-000000000001"
    assert best_fit([(0, [], {0: [500, {ws: 1}]}), (1, [0], {})], 250, ws, "workspace") == (0, 0)


@pytest.mark.parametrize("placement, machine", [("fgd", "gpu-02"), ("bestfit", "gpu-01")])
def test_a_cluster_set_to_fgd_places_by_fgds_choice(app, placement, machine):
    r = app.client.patch(f"{ORG}/clusters/main", json={"placement": placement}, headers=_h(app.boot["admin_token"]))
    assert r.status_code == 200, r.text
    assert r.json()["placement"] == placement
    assert cluster(app)["placement"] == placement
    register(app, "gpu-01", gpus=1)
    register(app, "gpu-02", gpus=1)
    submit(app, frac("half", 0.5))
    assert placed(app, "half-0")["machine"] == "gpu-01"  # both empty: the first by name, under either placement
    submit(app, frac("quarter", 0.25))
    assert placed(app, "quarter-0")["machine"] == machine


def test_a_new_cluster_places_by_best_fit_unless_told(app):
    admin = _h(app.boot["admin_token"])
    assert cluster(app)["placement"] == "bestfit"
    r = app.client.post(f"{ORG}/clusters", json={"name": "spready", "placement": "spread"}, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["placement"] == "spread"


@pytest.mark.parametrize("value", ["first-fit", "FGD", "", 3])
def test_an_unknown_placement_is_refused_and_nothing_is_stored(app, value):
    admin = _h(app.boot["admin_token"])
    before = cluster(app)
    r = app.client.patch(f"{ORG}/clusters/main", json={"placement": value}, headers=admin)
    assert r.status_code == 422, r.text
    assert "placement" in r.text and "fgd" in r.text and "bestfit" in r.text and "spread" in r.text, r.text
    assert cluster(app) == before
    r = app.client.post(f"{ORG}/clusters", json={"name": "other", "placement": value}, headers=admin)
    assert r.status_code == 422, r.text
    names = [c["name"] for c in app.client.get(f"{ORG}/clusters", headers=admin).json()["items"]]
    assert "other" not in names
