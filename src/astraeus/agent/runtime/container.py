"""ContainerRuntime: every worker attempt starts from its image, run by `runc` (what a GPU machine uses).

Built on ProcessRuntime: the same worker folders, the same per-worker shim as supervisor (logs, stop grace,
SIGKILL of the whole tree, exit status, adoption after an agent restart or a wiped state dir), the same cgroups
and the same workspace uid. What differs is how the shim starts the command (astraeus.agent.runtime.
container_shim): the image is pulled into the machine's content-addressed cache (astraeus.agent.runtime.
oci_images), the root filesystem is the image under a fresh copy-on-write layer per attempt, and runc runs the
command in its own PID, mount, IPC and UTS namespaces on the host's network (see oci_spec for what a worker
sees).

Why runc + skopeo + umoci (Debian's packages) rather than podman: the shim must stay the worker's supervisor
(a restarted agent adopts it; it reports the exact exit status), and runc is the piece that does only what the
shim does not: it runs an OCI bundle and leaves. skopeo speaks the registries' protocol (auth, TLS, digests) and
umoci unpacks layers; podman would bring its own supervisor (conmon) and storage, a second owner of each
worker's life.

Files besides the process runtime's: `<state>/containers/<id>/` (the attempt's layer and bundle, removed when it
ends), `<state>/runc/` (runc's records), the image cache (ASTRAEUS_IMAGE_CACHE_DIR, default `<state>/images`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess

from astraeus.agent.gpus import gpu_device_nodes, nvml_minor_numbers
from astraeus.agent.runtime import cgroups, oci_spec
from astraeus.agent.runtime.base import Runtime, StartFailed
from astraeus.agent.runtime.process import ProcessRuntime, _read_json, _scan_env
from astraeus.agent.runtime.progress import files_in as progress_files_in
from astraeus.imageref import ImageRef
from astraeus.protocol import Assignment

log = logging.getLogger(__name__)

TOOLS = {"runc": "runc", "skopeo": "skopeo", "umoci": "umoci"}  # command -> Debian package
DEFAULT_SHM_BYTES = 8 << 30


def container_tools_missing() -> list[str]:
    """The container runtime's tools that are not on PATH (runc, skopeo, umoci)."""
    return [t for t in TOOLS if shutil.which(t) is None]


def runc_version() -> str | None:
    try:
        out = subprocess.run(["runc", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.splitlines()[0] if out else ""
    return first.replace("runc version ", "runc ").strip() or None


class ContainerRuntime(ProcessRuntime):
    requires_command = False  # the image's entrypoint/cmd may be what runs
    SHIM_PRELOAD = ("astraeus.agent.runtime.container_shim",)  # its shims run ContainerShim
    SHIM_MODULE = "astraeus.agent.runtime.container_shim"

    def __init__(self, state_dir: str, stop_grace: float = 30.0, *, image_cache_dir: str | None = None,
                 image_cache_bytes: int = 0, insecure_registries=(), shm_bytes: int | None = None, **kw):
        super().__init__(state_dir, stop_grace=stop_grace, **kw)
        self.containers_dir = os.path.join(self.state_dir, "containers")
        self.runc_root = os.path.join(self.state_dir, "runc")
        for d in (self.containers_dir, self.runc_root):
            os.makedirs(d, mode=0o711, exist_ok=True)
        self.image_cache_dir = os.path.abspath(image_cache_dir or os.path.join(self.state_dir, "images"))
        os.makedirs(self.image_cache_dir, mode=0o711, exist_ok=True)
        self.image_cache_bytes = int(image_cache_bytes or 0)
        self.insecure = [str(r).strip() for r in insecure_registries or () if str(r).strip()]
        self.shm_bytes = shm_bytes
        self.runc = shutil.which("runc") or "runc"

    # ------------------------------------------------------------ what the shim gets
    def build_env(self, assignment: Assignment) -> tuple[dict[str, str], str]:
        """The worker's own variables (the image's Env goes under them in the shim, once it is pulled): never
        the agent's PATH or HOME, which mean nothing inside the image."""
        env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        env.update(assignment.env)
        gpus = [str(i) for i in assignment.gpu_indices]
        # The machine's GPU indices; inside, the worker's GPUs are its only ones, numbered from 0.
        # (the control plane sends the machine's indices in CUDA_VISIBLE_DEVICES: right on the host, wrong in
        # a container, where only the worker's GPUs exist)
        if assignment.mig_devices and assignment.env.get("CUDA_VISIBLE_DEVICES", "").startswith("MIG-"):
            # MIG devices (issue 46): the agent put their UUIDs in CUDA_VISIBLE_DEVICES; NVIDIA's container hook
            # takes the same UUIDs, and inside they keep those names (CUDA reads MIG devices by UUID)
            env["NVIDIA_VISIBLE_DEVICES"] = assignment.env["CUDA_VISIBLE_DEVICES"]
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus) if gpus else "void"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
        env["ASTRAEUS_WORKER_ID"] = self.marker(assignment.worker, assignment.attempt)
        env["ASTRAEUS_STOP_REASON_FILE"] = oci_spec.STOP_REASON_FILE
        env.update(progress_files_in(oci_spec.WORK_DIR))  # <attempt_dir>/work, bound there by the shim
        return env, f"container {assignment.image}"

    def limits(self, assignment: Assignment) -> cgroups.Limits:
        lim = super().limits(assignment)
        lim.deny_devices = []  # runc's device rules: every device denied but the usual ones and its GPUs
        return lim

    def shm_size(self, assignment: Assignment) -> int:
        if self.shm_bytes:
            return int(self.shm_bytes)
        if assignment.memory_bytes:
            return max(64 << 20, int(assignment.memory_bytes) // 2)
        return DEFAULT_SHM_BYTES

    def container_id(self, worker: str, attempt: int) -> str:
        return self.cgroup_name(worker, attempt)

    def extra_spec(self, assignment: Assignment, d: str) -> dict:
        cid = self.container_id(assignment.worker, assignment.attempt)
        minors: list[int] = []
        if assignment.gpu_indices and gpu_device_nodes(self.device_dir):
            if self._gpu_minors is None:
                self._gpu_minors = nvml_minor_numbers() or {}
            minors = [self._gpu_minors.get(i, i) for i in assignment.gpu_indices]
        return {"cwd": None, "container": {
            "id": cid, "runc": self.runc, "runc_root": self.runc_root,
            "layers_dir": os.path.join(self.containers_dir, cid),
            "cache_dir": self.image_cache_dir, "cache_bytes": self.image_cache_bytes, "insecure": self.insecure,
            "shm_bytes": self.shm_size(assignment), "device_dir": self.device_dir, "gpu_minors": minors,
            "gpu_indices": list(assignment.gpu_indices)}}

    def write_secrets(self, assignment: Assignment, d: str) -> None:
        auth = assignment.registry_auth
        if auth is None:
            return
        path = os.path.join(d, "auth.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"username": auth.username, "password": auth.password}, f)

    # ------------------------------------------------------------ start / adopt / forget
    def start(self, assignment: Assignment | dict):
        image = assignment.get("image") if isinstance(assignment, dict) else assignment.image
        try:
            ImageRef.parse(image or "")
        except ValueError as e:
            raise StartFailed(str(e)) from None
        return super().start(assignment)

    def adopt(self):
        out = super().adopt()
        live = set(_scan_env(f"ASTRAEUS_SHIM_OWNER={self.owner}".encode()))
        live_ids = set()
        for pid in live:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    for item in f.read().split(b"\0"):
                        if item.startswith(b"ASTRAEUS_SHIM_ID="):
                            live_ids.add(item.split(b"=", 1)[1].decode())
            except OSError:
                continue
        live_cids = {self._cid_of(sid) for sid in live_ids}
        self._sweep_containers(live_cids)
        try:  # images held by attempts a crash ended may be evicted again
            from astraeus.agent.runtime.oci_images import ImageCache

            # (the cache may be shared by several agents of one host: only this agent's holders are judged)
            others = set()
            holders = os.path.join(self.image_cache_dir, "holders")
            for d in os.listdir(holders) if os.path.isdir(holders) else []:
                others |= {h for h in os.listdir(os.path.join(holders, d)) if not h.startswith(f"{self.owner}-")}
            ImageCache(self.image_cache_dir, self.image_cache_bytes, self.insecure).prune_holders(live_cids | others)
        except Exception:  # noqa: BLE001 - the cache is tidied at the next pull's eviction anyway
            pass
        return out

    def _cid_of(self, shim_id: str) -> str:
        """The container id of the attempt whose folder (the shim's id) is `shim_id` (as cgroup_name makes it)."""
        import hashlib

        name = shim_id if len(shim_id) <= 200 else hashlib.sha1(shim_id.encode()).hexdigest()
        return f"{self.owner}-{name}"

    def _sweep_containers(self, live: set) -> None:
        """runc records and layers no live shim holds (a shim killed while the agent was down)."""
        try:
            listed = subprocess.run([self.runc, "--root", self.runc_root, "list", "-q"], capture_output=True,
                                    text=True, timeout=30).stdout.split()
        except (OSError, subprocess.SubprocessError):
            listed = []
        for cid in listed:
            if cid.startswith(f"{self.owner}-") and cid not in live:
                subprocess.run([self.runc, "--root", self.runc_root, "delete", "--force", cid],
                               capture_output=True, timeout=30)
        for cid in os.listdir(self.containers_dir):
            if cid not in live:
                shutil.rmtree(os.path.join(self.containers_dir, cid), ignore_errors=True)

    def _supervisor_gone(self, worker: str, attempt: int, cg: cgroups.WorkerCgroup | None = None) -> None:
        """Also runc's record of the attempt's container, and with it the cgroups runc made in the hierarchies that
        Astraeus does not manage itself (cpuacct, cpuset, blkio, name=systemd on a cgroup v1 host): the shim deletes
        them when it ends, and a shim killed while the agent runs never does."""
        try:
            subprocess.run([self.runc, "--root", self.runc_root, "delete", "--force",
                            self.container_id(worker, attempt)], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("runc delete %s: %s", self.container_id(worker, attempt), e)
        super()._supervisor_gone(worker, attempt, cg)
        if self.cgroup_root:  # runc's record wiped with the state dir: its cgroups, as the shim named them
            cgroups.remove_everywhere(self.cgroups, self.cgroup_name(worker, attempt))

    def forget(self, worker: str, attempt: int) -> None:
        super().forget(worker, attempt)
        shutil.rmtree(os.path.join(self.containers_dir, self.container_id(worker, attempt)), ignore_errors=True)

    def stop_reason_file(self, d: str) -> str:
        return oci_spec.STOP_REASON_FILE

    def image_digest(self, worker: str, attempt: int) -> str | None:
        """The digest of the image the attempt runs (once it started)."""
        started = _read_json(os.path.join(self.dir(worker, attempt), "started.json")) or {}
        return started.get("image_digest")


def make_runtime(kind: str, state_dir: str, stop_grace: float, *, image_cache_dir: str | None = None,
                 image_cache_bytes: int = 0, insecure_registries=(), shm_bytes: int | None = None,
                 **kw) -> Runtime:
    """The agent's runtime: "container" (runc; needs root and the tools) or "process"."""
    if kind == "process":
        return ProcessRuntime(state_dir, stop_grace=stop_grace, **kw)
    if kind != "container":
        raise ValueError(f"unknown runtime {kind!r}: use container or process")
    missing = container_tools_missing()
    if missing:
        raise ValueError(f"the container runtime needs {', '.join(missing)} on PATH: install the Debian "
                         f"packages {' '.join(TOOLS[m] for m in missing)} (or use --runtime process)")
    if os.geteuid() != 0:
        raise ValueError("the container runtime needs the agent to run as root (or use --runtime process)")
    return ContainerRuntime(state_dir, stop_grace=stop_grace, image_cache_dir=image_cache_dir,
                            image_cache_bytes=image_cache_bytes, insecure_registries=insecure_registries,
                            shm_bytes=shm_bytes, **kw)
