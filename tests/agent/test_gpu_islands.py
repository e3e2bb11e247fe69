"""Issue 46: the agent reports its NVLink islands at registration: the simulated agent's --nvlink-islands as given
(GPUs not named are islands of their own), none where it gives none and NVML reports none."""

from __future__ import annotations

from astraeus import protocol as P
from astraeus.agent.gpus import discover_gpus
from astraeus.scheduler.topology import parse_islands


def test_simulated_islands_are_reported_as_given():
    inv = discover_gpus(8, None, [list(i) for i in parse_islands("0-3,4-5", 8)])
    assert inv.islands == [[0, 1, 2, 3], [4, 5], [6], [7]]
    body = P.Register(name="gpu-01", gpus=inv.count, nvlink_islands=inv.islands)
    assert body.model_dump()["nvlink_islands"] == [[0, 1, 2, 3], [4, 5], [6], [7]]


def test_simulated_gpus_without_islands_report_none():
    inv = discover_gpus(3)
    if inv.source == "simulated":  # no NVML here (on a GPU machine NVML's islands are reported for its GPUs)
        assert inv.islands == []
