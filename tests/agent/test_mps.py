"""Issue 46: the agent's MPS control daemons (astraeus.agent.mps): one per shared GPU, started with its first tenant
and stopped with its last, each tenant with its share's variables. The control program here is a real script that
records how it was called (nvidia-cuda-mps-control's arguments, CUDA_VISIBLE_DEVICES, its pipe folder, its stdin)."""

from __future__ import annotations

import stat

from astraeus import protocol as P
from astraeus.agent.mps import MpsDaemons, share_env


def control(tmp_path):
    calls = tmp_path / "calls"
    script = tmp_path / "nvidia-cuda-mps-control"
    script.write_text(f'#!/bin/sh\nin=$(cat)\necho "$* gpu=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY '
                      f'in=$in" >> {calls}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), calls


def tenant(name: str, gpu: int, fraction: float | None = 0.5) -> P.Assignment:
    return P.Assignment(worker=f"ns.{name}", name=name, attempt=0, command="sleep", gpu_indices=[gpu],
                        gpu_fraction=fraction)


def test_one_daemon_per_shared_gpu_from_first_tenant_to_last(tmp_path):
    prog, calls = control(tmp_path)
    d = MpsDaemons(str(tmp_path / "mps"), {3: 80 << 30}, control=prog)
    a = d.attach(tenant("a", 3), in_container=False)
    b = d.attach(tenant("b", 3), in_container=False)
    lines = calls.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("-d gpu=3 pipe=") and lines[0].endswith("/mps/gpu3/pipe in=")
    assert a.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "3=40960M"
    assert a.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert a.env["ASTRAEUS_GPU_FRACTION"] == "0.5"
    assert a.mounts[-1].host_path == a.env["CUDA_MPS_PIPE_DIRECTORY"] == b.env["CUDA_MPS_PIPE_DIRECTORY"]
    d.release(a.key)
    assert len(calls.read_text().splitlines()) == 1  # b still shares GPU 3
    d.release(b.key)
    last = calls.read_text().splitlines()[-1]
    assert last.startswith(" gpu= pipe=") and last.endswith("/mps/gpu3/pipe in=quit")


def test_a_container_tenant_sees_its_gpu_as_device_0_and_whole_gpu_workers_are_left_alone(tmp_path):
    prog, _ = control(tmp_path)
    d = MpsDaemons(str(tmp_path / "mps"), {5: 16 << 30}, control=prog)
    c = d.attach(tenant("c", 5, 0.25), in_container=True)
    assert c.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    whole = tenant("w", 1, None)
    assert d.attach(whole, in_container=False) is whole


def test_simulated_gpus_get_the_variables_without_a_daemon(tmp_path, caplog):
    d = MpsDaemons(str(tmp_path / "mps"), {}, control="")
    with caplog.at_level("INFO"):
        a = d.attach(tenant("a", 0, 0.3), in_container=False)
    assert a.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in a.env  # the GPU's memory is not known
    assert "nvidia-cuda-mps-control not found (simulated GPUs)" in caplog.text
    assert share_env(2, 2, 0.5, 1 << 30, "/p", "/l")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "2=512M"
