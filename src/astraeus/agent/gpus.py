"""GPU discovery: NVML (pynvml, from nvidia-ml-py) when it is present, else a simulated count."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuInventory:
    count: int
    models: list[str] = field(default_factory=list)
    source: str = "none"  # "nvml", "simulated" or "none"
    driver: str | None = None


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
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            drv = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:  # noqa: BLE001
            drv = None
        return GpuInventory(n, models, "nvml", drv)
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def discover_gpus(simulated: int | None = None) -> GpuInventory:
    """With `simulated` (the agent's --gpus N), report N GPUs (named after the real ones where NVML has
    them, for development and local clusters); otherwise what NVML finds, or none."""
    found = nvml_gpus()
    if simulated is None:
        return found if found is not None else GpuInventory(0, [], "none")
    n = max(0, int(simulated))
    real = found.models if found else []
    models = [real[i] if i < len(real) else "simulated" for i in range(n)]
    return GpuInventory(n, models, "nvml" if found and n <= found.count else "simulated", found.driver if found else None)
