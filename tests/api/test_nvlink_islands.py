"""Issue 46: an agent's NVLink islands through the API of an in-process control plane (machines registered by the
test): stored on the machine, used when a worker's GPUs are chosen, and a report naming GPUs the machine does not
have (or one GPU in two islands) gets a 422 that names the field."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from astraeus.server.db import Machine
from tests.api.test_whatif import _h, placed, submit


def register(app, name: str, gpus: int, islands: list | None) -> object:
    body = {"name": name, "gpus": gpus, "cpu_cores": 32, "memory_bytes": 1 << 38, "stop_grace_seconds": 1}
    if islands is not None:
        body["nvlink_islands"] = islands
    return app.client.post("/api/v1/agent/register", headers=_h(app.boot["machine_token"]), json=body)


def whole(name: str, gpus: int) -> dict:
    return {"metadata": {"name": name}, "spec": {"task_template": {
        "image": "python:3.11", "command": "true",
        "requested_resources": {"gpu_requests": {"count": gpus}, "cpu_cores": 1, "memory_bytes": 1 << 30}}}}


def test_islands_are_stored_and_a_worker_gets_one_island(app):
    assert register(app, "gpu-01", 8, [[0, 1, 2, 3], [4, 5, 6, 7]]).status_code == 200
    with app.cp.sessions() as s:
        assert s.scalar(select(Machine).where(Machine.name == "gpu-01")).nvlink_islands == [[0, 1, 2, 3],
                                                                                            [4, 5, 6, 7]]
    submit(app, whole("one", 1))
    assert placed(app, "one-0")["gpu_indices"] == [0]
    submit(app, whole("four", 4))
    assert placed(app, "four-0")["gpu_indices"] == [4, 5, 6, 7]


def test_a_machine_reporting_no_islands_is_one_island(app):
    assert register(app, "gpu-01", 8, None).status_code == 200
    with app.cp.sessions() as s:
        assert s.scalar(select(Machine).where(Machine.name == "gpu-01")).nvlink_islands is None
    submit(app, whole("one", 1))
    assert placed(app, "one-0")["gpu_indices"] == [0]
    submit(app, whole("four", 4))
    assert placed(app, "four-0")["gpu_indices"] == [1, 2, 3, 4]


@pytest.mark.parametrize("islands, words", [
    ([[0, 1, 2, 3], [4, 5, 6, 8]], "nvlink_islands: GPU 8 is not one of the machine's 8 GPUs (indices 0-7)"),
    ([[0, 1, 2, 3], [3, 4, 5, 6, 7]], "nvlink_islands: GPU 3 is in two islands; a GPU is in one island at most"),
    ([[-1]], "nvlink_islands"),
])
def test_an_agent_reporting_bad_islands_is_refused(app, islands, words):
    r = register(app, "gpu-x", 8, islands)
    assert r.status_code == 422 and words in r.text, r.text
