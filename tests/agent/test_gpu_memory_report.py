"""Issue 46: what an agent reports of its GPUs' memory and MIG devices, and a GPU-memory tenant's MPS limit."""

from __future__ import annotations

from astraeus import protocol as P
from astraeus.agent.gpus import SIMULATED_GPU_MEMORY, discover_gpus, mig_profiles
from astraeus.agent.mps import MpsDaemons, share_env

GIB = 1 << 30


def test_simulated_gpus_report_the_memory_given_or_80_gib():
    assert discover_gpus(2, 24 * GIB).memory_bytes == [24 * GIB, 24 * GIB]
    inv = discover_gpus(3)
    if inv.source == "simulated":  # no NVML here: the default
        assert inv.memory_bytes == [SIMULATED_GPU_MEMORY] * 3 == [80 * GIB] * 3
    assert len(inv.memory_bytes) == 3


def test_mig_devices_are_counted_by_profile_from_their_nvml_names():
    names = [["NVIDIA A100-SXM4-40GB MIG 1g.5gb"] * 3 + ["NVIDIA A100-SXM4-40GB MIG 2g.10gb"], []]
    assert mig_profiles(names) == [{"1g.5gb": 3, "2g.10gb": 1}, {}]


def test_a_tenant_that_asked_gpu_memory_is_limited_to_the_bytes_asked(tmp_path):
    d = MpsDaemons(str(tmp_path / "mps"), {0: 80 * GIB}, control="")
    a = P.Assignment(worker="ns.m-0", name="m-0", attempt=0, command="true", gpu_indices=[0],
                     gpu_fraction=0.25, gpu_memory_bytes=20 * GIB)
    got = d.attach(a, in_container=False)
    assert got.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert got.env["ASTRAEUS_GPU_FRACTION"] == "0.25"
    assert share_env(1, 0, 0.5, 80 * GIB, "/p", "/l", 3 * GIB)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
