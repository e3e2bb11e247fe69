"""How a container worker gets its GPUs (stdlib, PyYAML when present; the shim imports it).

On a machine with the NVIDIA Container Toolkit, its CDI specification (`nvidia-ctk cdi generate`, in /etc/cdi or
/var/run/cdi) says exactly what a container needs for each GPU (`nvidia.com/gpu=<index|uuid>`): device nodes,
the driver's libraries and binaries to mount, environment, and hooks (update-ldcache, create-symlinks). The
worker gets the edits of its own GPUs and the spec's common edits, nothing for the others.

Without CDI: the assigned `/dev/nvidia<N>` nodes plus the driver's control nodes (nvidiactl, nvidia-uvm,
nvidia-uvm-tools, nvidia-modeset), and the driver's user-space libraries (found with `ldconfig -p`) and
nvidia-smi, read-only under /usr/local/nvidia/{lib64,bin} — the folders CUDA images (pytorch/pytorch, NGC)
already have on LD_LIBRARY_PATH and PATH (added if the image does not).

`plan_*` functions are pure (tested with made-up inputs); `load_cdi_specs`, `ldconfig_libraries` and
`device_node` read the machine.
"""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
from dataclasses import dataclass, field

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_KIND = "nvidia.com/gpu"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
LIB_PREFIXES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
                "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-allocator.so", "libnvidia-cfg.so",
                "libnvidia-gpucomp.so")
LIB_DIR = "/usr/local/nvidia/lib64"
BIN_DIR = "/usr/local/nvidia/bin"
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")


@dataclass
class GpuEdits:
    devices: list[dict] = field(default_factory=list)  # {"path" (in the container), "host_path"}
    binds: list[tuple[str, str, bool]] = field(default_factory=list)  # (host, container, read-only)
    env: dict[str, str] = field(default_factory=dict)
    path_prepend: dict[str, str] = field(default_factory=dict)  # variable -> folder put in front of it
    hooks: dict[str, list[dict]] = field(default_factory=dict)  # OCI hook kind -> [{"path", "args", "env"}]
    source: str = "none"  # "cdi", "device nodes" or "none"


# ----------------------------------------------------------------------------------------------- CDI
def _apply(edits: GpuEdits, ce: dict) -> None:
    for item in ce.get("env") or []:
        k, sep, v = str(item).partition("=")
        if sep and k:
            edits.env[k] = v
    for d in ce.get("deviceNodes") or []:
        if d.get("path"):
            edits.devices.append({"path": d["path"], "host_path": d.get("hostPath") or d["path"]})
    for m in ce.get("mounts") or []:
        if m.get("hostPath") and m.get("containerPath"):
            opts = m.get("options") or []
            edits.binds.append((m["hostPath"], m["containerPath"], "rw" not in opts))
    for h in ce.get("hooks") or []:
        if h.get("path") and h.get("hookName"):
            edits.hooks.setdefault(h["hookName"], []).append(
                {"path": h["path"], "args": list(h.get("args") or []), "env": list(h.get("env") or [])})


def plan_cdi(specs: list[dict], indices: list[int], uuids: dict[int, str] | None = None) -> GpuEdits | None:
    """The edits for GPUs `indices` from the machine's CDI specs, or None when no spec of kind nvidia.com/gpu
    names every one of them (then the device-node way is used)."""
    uuids = uuids or {}
    for spec in specs:
        if spec.get("kind") != CDI_KIND:
            continue
        by_name = {str(d.get("name")): d for d in spec.get("devices") or []}
        chosen = []
        for i in indices:
            d = by_name.get(str(i)) or by_name.get(uuids.get(i, "\0"))
            if d is None:
                break
            chosen.append(d)
        else:
            edits = GpuEdits(source="cdi")
            _apply(edits, spec.get("containerEdits") or {})
            for d in chosen:
                _apply(edits, d.get("containerEdits") or {})
            return edits
    return None


def load_cdi_specs(dirs: tuple[str, ...] = CDI_DIRS) -> list[dict]:
    """Every CDI spec on the machine (JSON; YAML when PyYAML is installed)."""
    out = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json")) + glob.glob(os.path.join(d, "*.yaml"))):
            try:
                with open(path) as f:
                    text = f.read()
                if path.endswith(".json"):
                    out.append(json.loads(text))
                else:
                    import yaml

                    out.append(yaml.safe_load(text))
            except Exception:  # noqa: BLE001 - an unreadable spec is skipped, the device-node way remains
                continue
    return [s for s in out if isinstance(s, dict)]


# ----------------------------------------------------------------------------------------- without CDI
def plan_device_nodes(minors: list[int], existing: set[str], libraries: list[tuple[str, str]],
                      binaries: dict[str, str]) -> GpuEdits:
    """The assigned GPUs' nodes (`/dev/nvidia<minor>`) and the control nodes that exist, the driver's
    libraries ((soname, host file)) and binaries (name -> host file) under /usr/local/nvidia."""
    edits = GpuEdits(source="device nodes")
    names = [f"nvidia{m}" for m in minors] + list(CONTROL_NODES)
    for n in names:
        if f"/dev/{n}" in existing:
            edits.devices.append({"path": f"/dev/{n}", "host_path": f"/dev/{n}"})
    seen = set()
    for soname, host in libraries:
        if soname not in seen:
            seen.add(soname)
            edits.binds.append((host, f"{LIB_DIR}/{soname}", True))
    for name, host in binaries.items():
        edits.binds.append((host, f"{BIN_DIR}/{name}", True))
    if libraries:
        edits.path_prepend["LD_LIBRARY_PATH"] = LIB_DIR
    if binaries:
        edits.path_prepend["PATH"] = BIN_DIR
    return edits


def parse_ldconfig(text: str, arch: str = "x86-64") -> list[tuple[str, str]]:
    """(soname, host file) of the NVIDIA driver's libraries in `ldconfig -p` output (64-bit only)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        name, sep, rest = line.partition(" (")
        if not sep or "=>" not in rest or not name.startswith(LIB_PREFIXES):
            continue
        flags, _, path = rest.partition("=>")
        if arch not in flags and "64" not in flags:
            continue
        out.append((name.strip(), path.strip()))
    return out


def ldconfig_libraries() -> list[tuple[str, str]]:
    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [(n, os.path.realpath(p)) for n, p in parse_ldconfig(text) if os.path.exists(p)]


def driver_binaries() -> dict[str, str]:
    out = {}
    for name in BINARIES:
        for d in ("/usr/bin", "/usr/local/bin", "/usr/sbin"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                out[name] = os.path.realpath(p)
                break
    return out


def device_node(path: str) -> dict | None:
    """{"type", "major", "minor"} of a character or block device, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return {"type": kind, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)}


def gpu_edits(indices: list[int], minors: list[int], device_dir: str = "/dev") -> GpuEdits:
    """What the worker needs for its real GPUs on this machine: CDI when the toolkit's spec is there, else the
    device nodes and driver files."""
    if not minors:
        return GpuEdits()
    cdi = plan_cdi(load_cdi_specs(), indices)
    if cdi is not None:
        return cdi
    existing = {f"/dev/{n}" for n in os.listdir(device_dir) if n.startswith("nvidia")} \
        if os.path.isdir(device_dir) else set()
    edits = plan_device_nodes(minors, existing, ldconfig_libraries(), driver_binaries())
    for d in edits.devices:  # a device_dir other than /dev (tests) is where the nodes really are
        d["host_path"] = os.path.join(device_dir, os.path.basename(d["path"]))
    return edits
