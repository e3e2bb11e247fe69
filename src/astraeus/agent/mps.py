"""Shared GPUs enforced by CUDA MPS (issue 46): one MPS control daemon per shared GPU, and each tenant's limits.

A worker that shares a GPU (its assignment's `gpu_fraction`) runs as an MPS client of its GPU's daemon with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its compute share) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (its memory share):
an allocation past that limit fails inside its own process, never another tenant's. The agent starts the
daemon (`nvidia-cuda-mps-control -d`, with CUDA_VISIBLE_DEVICES of that GPU and a pipe folder of its own) when
the GPU's first tenant starts and stops it (`echo quit | nvidia-cuda-mps-control`) when the last ends. Where
nvidia-cuda-mps-control is missing (simulated GPUs) the tenants get the same variables and the agent log says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading

from astraeus import envvars
from astraeus import protocol as P

log = logging.getLogger("astraeus.agent.mps")

CONTROL = "nvidia-cuda-mps-control"


def share_env(gpu: int, visible_index: int, fraction: float, gpu_memory_bytes: int | None,
              pipe_dir: str, log_dir: str, asked_bytes: int | None = None) -> dict[str, str]:
    """The variables of a tenant with `fraction` of GPU `gpu` (seen by the worker as `visible_index`); its memory
    limit is `asked_bytes` where the run asked GPU memory, else that fraction of the GPU's memory."""
    env = {
        "ASTRAEUS_GPU_FRACTION": f"{fraction:g}",
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": log_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{max(1, round(fraction * 100))}",
    }
    if asked_bytes:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{visible_index}={max(1, int(asked_bytes) >> 20)}M"
    elif gpu_memory_bytes:
        # MPS reads the limit per device as the client sees it ("0=20480M"), in MiB.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{visible_index}={int(gpu_memory_bytes * fraction) >> 20}M"
    return env


class MpsDaemons:
    """The machine's MPS control daemons, one per shared GPU, counted by tenant (thread-safe)."""

    def __init__(self, root: str, gpu_memory: dict[int, int] | None = None, control: str | None = None):
        self.root = root
        self.gpu_memory = gpu_memory or {}
        self.control = control if control is not None else shutil.which(CONTROL)
        self.lock = threading.Lock()
        self.tenants: dict[int, set] = {}  # gpu -> the attempts (worker, attempt) sharing it
        self.held: dict[tuple, int] = {}  # attempt -> its gpu

    def dirs(self, gpu: int) -> tuple[str, str]:
        return os.path.join(self.root, f"gpu{gpu}", "pipe"), os.path.join(self.root, f"gpu{gpu}", "log")

    def attach(self, a: P.Assignment, in_container: bool) -> P.Assignment:
        """The assignment of a sharing worker with its MPS variables and the pipe folder bound in; its GPU's
        daemon started if it is the first tenant. Others are returned as they are."""
        if not a.gpu_fraction or not a.gpu_indices:
            return a
        gpu = a.gpu_indices[0]
        pipe, logs = self.dirs(gpu)
        with self.lock:
            first = not self.tenants.get(gpu)
            self.tenants.setdefault(gpu, set()).add(a.key)
            self.held[a.key] = gpu
            if first:
                self._start(gpu, pipe, logs)
        env = dict(a.env)
        env.update(share_env(gpu, 0 if in_container else gpu, a.gpu_fraction, self.gpu_memory.get(gpu), pipe, logs,
                             a.gpu_memory_bytes))
        mounts = list(a.mounts) + [P.Mount(host_path=pipe, mount_path=pipe, granted_root=self.root)]
        return a.model_copy(update={"env": env, "mounts": mounts})

    def release(self, key: tuple) -> None:
        """An attempt that shared a GPU has ended: its GPU's daemon stops with its last tenant."""
        with self.lock:
            gpu = self.held.pop(key, None)
            if gpu is None:
                return
            left = self.tenants.get(gpu, set())
            left.discard(key)
            if not left:
                self.tenants.pop(gpu, None)
                self._stop(gpu)

    def _start(self, gpu: int, pipe: str, logs: str) -> None:
        os.makedirs(pipe, exist_ok=True)
        os.makedirs(logs, exist_ok=True)
        os.chmod(pipe, 0o777)  # workers run as their workspace's user: they open the daemon's pipes
        if not self.control:
            log.info("GPU %d is shared: %s not found (simulated GPUs), tenants get the MPS variables only", gpu,
                     CONTROL)
            return
        env = envvars.copy(CUDA_VISIBLE_DEVICES=str(gpu), CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs)
        r = subprocess.run([self.control, "-d"], env=env, capture_output=True, text=True, timeout=30, check=False)
        log.info("GPU %d is shared: MPS control daemon started (pipe %s, exit %d %s)", gpu, pipe, r.returncode,
                 r.stderr.strip())

    def _stop(self, gpu: int) -> None:
        pipe, logs = self.dirs(gpu)
        if not self.control:
            log.info("GPU %d has no tenants left", gpu)
            return
        env = envvars.copy(CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs)
        r = subprocess.run([self.control], input="quit\n", env=env, capture_output=True, text=True, timeout=30,
                           check=False)
        log.info("GPU %d has no tenants left: MPS control daemon stopped (exit %d)", gpu, r.returncode)
