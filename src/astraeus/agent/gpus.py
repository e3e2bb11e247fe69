"""GPU discovery: NVML (pynvml, from nvidia-ml-py) when it is present, else a simulated count."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field


@dataclass
class GpuInventory:
    count: int
    models: list[str] = field(default_factory=list)
    source: str = "none"  # "nvml", "simulated" or "none"
    driver: str | None = None
    # Issue 46: per GPU, its memory (bytes; an MPS tenant's limit is its share of it) and its MIG devices' names
    memory_bytes: list[int] = field(default_factory=list)
    mig: list[list[str]] = field(default_factory=list)
    # Issue 46: its NVLink/NVSwitch islands (GPU indices; `nvlink_islands`), [] none reported: one island
    islands: list[list[int]] = field(default_factory=list)
    # Issue 46: per GPU its MIG devices' UUIDs, beside `mig`'s names (a MIG worker's CUDA_VISIBLE_DEVICES)
    mig_uuids: list[list[str]] = field(default_factory=list)


def nvml_gpus() -> GpuInventory | None:
    """The GPUs NVML sees, or None when NVML (the driver or the library) is not available."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        models = []
        for i in range(n):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            models.append(name.decode() if isinstance(name, bytes) else str(name))
        memory, mig, uuids, handles = [], [], [], []
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            memory.append(int(pynvml.nvmlDeviceGetMemoryInfo(h).total))
            devices = mig_device_list(pynvml, h)
            mig.append([name for name, _ in devices])
            uuids.append([uuid for _, uuid in devices])
        try:
            islands = nvlink_islands(pynvml, handles) if n > 1 else []
        except Exception:  # noqa: BLE001 - a driver without the NVLink queries: reported as one island
            islands = []
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            drv = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:  # noqa: BLE001
            drv = None
        return GpuInventory(n, models, "nvml", drv, memory, mig, islands, uuids)
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def mig_devices(pynvml, h) -> list[str]:
    """The names of a GPU's MIG devices ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"); [] when MIG is off or unsupported."""
    return [name for name, _ in mig_device_list(pynvml, h)]


def mig_device_list(pynvml, h) -> list[tuple[str, str]]:
    """(name, UUID) of each of a GPU's MIG devices, in NVML's order; [] when MIG is off or unsupported."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(h)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                d = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except pynvml.NVMLError:
                continue  # no MIG device at this slot
            name = pynvml.nvmlDeviceGetName(d)
            uuid = pynvml.nvmlDeviceGetUUID(d)
            out.append((name.decode() if isinstance(name, bytes) else str(name),
                        uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
        return out
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported on GPUs without MIG
        return []


SIMULATED_GPU_MEMORY = 80 << 30  # a simulated GPU's memory unless the agent is given --gpu-memory-gib


def mig_profiles(mig: list[list[str]]) -> list[dict[str, int]]:
    """Per GPU, its MIG devices counted by profile ({"1g.10gb": 7}), from their NVML names ("… MIG 1g.10gb")."""
    out = []
    for names in mig:
        counts: dict[str, int] = {}
        for n in names:
            profile = n.rsplit("MIG ", 1)[-1].strip()
            counts[profile] = counts.get(profile, 0) + 1
        out.append(counts)
    return out


def discover_gpus(simulated: int | None = None, simulated_memory: int | None = None,
                  simulated_islands: list[list[int]] | None = None,
                  simulated_mig: list[list[str]] | None = None) -> GpuInventory:
    """With `simulated` (the agent's --gpus N), report N GPUs (named after the real ones where NVML has
    them, for development and local clusters) of `simulated_memory` bytes each (NVML's where the GPUs are
    real and it is not given, else SIMULATED_GPU_MEMORY) in `simulated_islands` (--nvlink-islands; NVML's
    where all N GPUs are real and it is not given), with the MIG devices of `simulated_mig` (--mig, `parse_mig`);
    otherwise what NVML finds, or none."""
    found = nvml_gpus()
    if simulated is None:
        inv = found if found is not None else GpuInventory(0, [], "none")
        if simulated_islands is not None:
            inv.islands = [list(i) for i in simulated_islands]
        if simulated_mig is not None:
            inv.mig, inv.mig_uuids = simulated_mig_devices(simulated_mig)
        return inv
    n = max(0, int(simulated))
    real = found.models if found else []
    models = [real[i] if i < len(real) else "simulated" for i in range(n)]
    real_memory = found.memory_bytes[:n] if found and n <= found.count and len(found.memory_bytes) >= n else None
    memory = [simulated_memory] * n if simulated_memory else real_memory or [SIMULATED_GPU_MEMORY] * n
    islands = ([list(i) for i in simulated_islands] if simulated_islands is not None else
               found.islands if found and n == found.count else [])
    inv = GpuInventory(n, models, "nvml" if found and n <= found.count else "simulated", found.driver if found else None,
                       memory, islands=islands)
    if simulated_mig is not None:
        inv.mig, inv.mig_uuids = simulated_mig_devices(simulated_mig)
    return inv


NVIDIA_NODE = re.compile(r"^nvidia(\d+)$")


def nvml_minor_numbers() -> dict[int, int] | None:
    """GPU index -> the minor number of its /dev/nvidia<minor> node, from NVML; None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        return {i: int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(pynvml.nvmlDeviceGetCount())}
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def gpu_device_nodes(dev_dir: str = "/dev") -> dict[int, tuple[int, int]]:
    """The per-GPU device nodes (`/dev/nvidia<N>`, character devices): N -> (major, minor). Empty without
    real NVIDIA nodes (no GPU, or simulated GPUs), where nothing is to be blocked."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return out
    for name in names:
        m = NVIDIA_NODE.match(name)
        if not m:
            continue
        try:
            st = os.stat(os.path.join(dev_dir, name))
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out[int(m.group(1))] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


def gpu_deny_rules(assigned: list[int], dev_dir: str = "/dev", minors: dict[int, int] | None = None) -> list[str]:
    """cgroup device rules ("c <major>:<minor>") for every GPU node except those of the `assigned` GPU indices.

    A GPU's index maps to its node by NVML's minor number (`minors`; the index itself where NVML is absent).
    The shared nodes (nvidiactl, nvidia-uvm, nvidia-modeset) stay reachable: CUDA needs them and they give no
    access to another GPU's memory."""
    nodes = gpu_device_nodes(dev_dir)
    if not nodes:
        return []
    allowed = {(minors or {}).get(i, i) for i in assigned}
    return [f"c {major}:{minor}" for n, (major, minor) in sorted(nodes.items()) if n not in allowed]


def nvlink_islands(pynvml, handles: list) -> list[list[int]]:
    """The machine's NVLink/NVSwitch islands (GPU indices joined by active NVLinks, `scheduler.topology`), from
    an initialised pynvml and the GPUs' handles in index order. [] when no GPU has an active NVLink: the
    machine is one island (PCIe only) and a worker's GPUs may be any of them."""
    bus = {}
    for i, h in enumerate(handles):
        bus[_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)] = i
    parent = list(range(len(handles)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    linked, switched = False, []
    for i, h in enumerate(handles):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link).busId)
            except pynvml.NVMLError:
                continue  # no such link on this GPU
            linked = True
            j = bus.get(remote)
            if j is not None:  # a peer GPU; an NVSwitch's bus id joins nothing directly
                parent[root(i)] = root(j)
            else:  # an NVSwitch: every GPU linked to the machine's switches is one island
                switched.append(i)
    if not linked:
        return []
    for i in switched[1:]:
        parent[root(i)] = root(switched[0])
    islands: dict[int, list[int]] = {}
    for i in range(len(handles)):
        islands.setdefault(root(i), []).append(i)
    return sorted(islands.values())


def _bus_id(raw) -> str:
    s = raw.decode() if isinstance(raw, bytes) else str(raw)
    return s.lower().lstrip("0")


def parse_mig(text: str, gpus: int) -> list[list[str]]:
    """`--mig 0:1g.10gb*7,1:3g.40gb*2` (GPU:profile*count, comma-separated; a GPU may be named more than once) as
    per GPU the profiles of its simulated MIG devices, checked: a GPU of the machine, a profile as NVML names it,
    at most 7 compute slices per GPU. ValueError says what to change."""
    from astraeus.units import MIG_SLICES, check_mig_profile

    out: list[list[str]] = [[] for _ in range(gpus)]
    for part in (p.strip() for p in text.split(",")):
        gpu, colon, rest = part.partition(":")
        profile, star, count = rest.partition("*")
        try:
            g, n = int(gpu), int(count) if star else 1
        except ValueError:
            raise ValueError(f"{part!r}: give GPU:profile*count, e.g. 0:1g.10gb*7") from None
        if not colon or n < 1:
            raise ValueError(f"{part!r}: give GPU:profile*count with a count of 1 or more, e.g. 0:1g.10gb*7")
        if not 0 <= g < gpus:
            raise ValueError(f"{part!r} names GPU {g}, and the machine has {gpus} GPUs" +
                             (f" (indices 0-{gpus - 1})" if gpus else " (give --gpus N)"))
        check_mig_profile(profile)
        out[g].extend([profile] * n)
    for g, profiles in enumerate(out):
        slices = sum(int(p.split("g.", 1)[0]) for p in profiles)
        if slices > MIG_SLICES:
            raise ValueError(f"GPU {g} has {slices} compute slices of MIG devices ({', '.join(sorted(set(profiles)))})"
                             f": a GPU has {MIG_SLICES}")
    return out


def simulated_mig_devices(profiles: list[list[str]]) -> tuple[list[list[str]], list[list[str]]]:
    """The names and UUIDs of simulated MIG devices (per GPU, from `parse_mig`): `simulated MIG 1g.10gb`,
    `MIG-sim-<gpu>-<slot>`."""
    names = [[f"simulated MIG {p}" for p in ps] for ps in profiles]
    uuids = [[f"MIG-sim-{g}-{k}" for k in range(len(ps))] for g, ps in enumerate(profiles)]
    return names, uuids


def mig_visible(inv: GpuInventory, devices) -> list[str]:
    """The UUIDs of a worker's MIG devices, (gpu, profile, k) each: the k-th device of that profile on that GPU in
    the inventory's order. KeyError names a device the inventory does not have."""
    out = []
    for g, profile, k in devices:
        names = inv.mig[g] if 0 <= g < len(inv.mig) else []
        uuids = inv.mig_uuids[g] if 0 <= g < len(inv.mig_uuids) else []
        of = [u for n, u in zip(names, uuids, strict=False) if n.rsplit("MIG ", 1)[-1].strip() == profile]
        if k >= len(of):
            raise KeyError(f"MIG device {k} of profile {profile} on GPU {g}")
        out.append(of[k])
    return out
