"""A local Astraeus for benchmarks: `astraeus up` in a temporary home, and a small client for its API.

    with LocalAstraeus(gpus=8, stop_grace=2) as ax:
        ax.submit("victim-0", ["python3", "victim.py", "/tmp/x"], gpus=8, priority=-100)

The cluster is `astraeus up --home DIR --port P --gpus 8 --machines 1` with ASTRAEUS_STOP_GRACE set in its
environment; once it is ready it writes DIR/env (`export API=...`, `export ASTRAEUS_TOKEN=...`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
ASTRAEUS = REPO / ".venv" / "bin" / "astraeus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            env[k.strip()] = shlex.split(v)[0] if v.strip() else ""
    return env


class LocalAstraeus:
    def __init__(self, gpus: int = 8, machines: int = 1, stop_grace: float = 2.0, startup_timeout: float = 120.0):
        self.gpus, self.machines, self.stop_grace = gpus, machines, stop_grace
        self.startup_timeout = startup_timeout
        self.home = Path(tempfile.mkdtemp(prefix="astraeus-bench-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.api = ""
        self.server = ""  # the control plane's base URL (its /metrics, /healthz)
        self.client: httpx.Client | None = None
        self.log = self.home / "up.log"

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> LocalAstraeus:
        if not ASTRAEUS.exists():
            raise RuntimeError(f"{ASTRAEUS} not found: install the project (make install)")
        env = dict(os.environ, ASTRAEUS_STOP_GRACE=f"{self.stop_grace:g}")
        self.proc = subprocess.Popen(
            [str(ASTRAEUS), "up", "--home", str(self.home), "--port", str(self.port), "--gpus", str(self.gpus),
             "--machines", str(self.machines)],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        deadline = time.time() + self.startup_timeout
        envf = self.home / "env"
        while not envf.exists():
            self._check_alive()
            if time.time() > deadline:
                raise TimeoutError(f"astraeus up wrote no {envf} in {self.startup_timeout:.0f}s; see {self.log}")
            time.sleep(0.1)
        env_vars = read_env(envf)
        self.api = env_vars["API"]
        self.server = env_vars["ASTRAEUS_SERVER"]
        self.client = httpx.Client(headers={"Authorization": f"Bearer {env_vars['ASTRAEUS_TOKEN']}"}, timeout=30)
        # Ready when the machines have registered with all their GPUs free.
        while True:
            self._check_alive()
            try:
                items = self.get("/machines")["items"]
                if len(items) >= self.machines and all(m.get("gpus") == self.gpus for m in items):
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"machines did not register in {self.startup_timeout:.0f}s; see {self.log}")
            time.sleep(0.1)
        return self

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"astraeus up exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: `up` stops its agents and server
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> LocalAstraeus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ API

    def get(self, path: str) -> dict:
        assert self.client is not None
        r = self.client.get(self.api + path)
        r.raise_for_status()
        return r.json()

    def submit(self, name: str, argv: list[str], gpus: int, priority: int = 0) -> dict:
        """POST $API/runs: one worker running `argv` on `gpus` GPUs (a tenth of a core, 256 MiB: small enough
        that eight of them fit beside each other on any machine)."""
        assert self.client is not None
        body = {
            "metadata": {"name": name},
            "spec": {
                "priority": priority,
                "task_template": {
                    "image": "local",
                    "command": argv[0],
                    "args": argv[1:],
                    "restart_policy": "Never",
                    "requested_resources": {
                        "gpu_requests": {"count": gpus},
                        "cpu_cores": 0.1,
                        "memory_bytes": 256 << 20,
                    },
                },
            },
        }
        r = self.client.post(self.api + "/runs", json=body)
        if r.status_code != 201:
            raise RuntimeError(f"POST /runs {name}: {r.status_code} {r.text}")
        return r.json()

    def delete(self, name: str) -> None:
        assert self.client is not None
        r = self.client.delete(f"{self.api}/runs/{name}")
        if r.status_code not in (200, 404):
            raise RuntimeError(f"DELETE /runs/{name}: {r.status_code} {r.text}")

    def failed_runs(self) -> list[dict]:
        """Runs that ended Failed (e.g. a worker that failed to start), with their reasons."""
        return self.get("/runs?state=Failed")["items"]

    def gpus_used(self) -> int:
        return sum(m.get("gpus_used", 0) for m in self.get("/machines")["items"])

    def wait_idle(self, timeout: float = 120.0) -> None:
        """Until no GPU is held (stopped workers gone)."""
        deadline = time.time() + timeout
        while self.gpus_used():
            if time.time() > deadline:
                raise TimeoutError("GPUs still held")
            time.sleep(0.05)


def python() -> str:
    """The interpreter workers run: the system's python3 (as in the Slurm jobs), else this one."""
    return shutil.which("python3") or sys.executable
