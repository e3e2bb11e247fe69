"""Units in one neutral place: byte sizes (16G, 512Mi, 1.5 GiB), durations (20m, 1h30m, 2d) and CPU counts.

Parsers and formatters shared by the CLI, the console, the control plane and the scheduler's messages. Pure
functions with no imports from the rest of Astraeus, so anything may import this module.
"""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4


class UnitError(ValueError):
    """A size or a duration that cannot be read; the message says what to write instead."""


# --- durations ----------------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str, option: str = "--time") -> int:
    """`20m`, `2h`, `1h30m`, `1d12h`, `90s`, `1.5h` → seconds. A unit is required."""
    s = text.strip().lower()
    pos, total, seen = 0, 0.0, False
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos, seen = m.end(), True
    if not seen or pos != len(s):
        raise UnitError(f"{option} {text!r}: give a duration with a unit, e.g. 20m, 2h, 1h30m, 1d12h or 90s")
    seconds = int(round(total))
    if seconds <= 0:
        raise UnitError(f"{option} {text!r}: the time limit must be more than 0 seconds")
    return seconds


def human_duration(seconds: int | float | None) -> str:
    """1200 → 20m, 5400 → 1h30m, 172800 → 2d; None → ""."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts)


def fmt_duration(seconds: float) -> str:
    """One unit, as reasons show a time limit: 172800 → 48h, 1200 → 20m, 90 → 90s."""
    s = int(seconds)
    if s % 3600 == 0 and s >= 3600:
        return f"{s // 3600}h"
    if s % 60 == 0 and s >= 60:
        return f"{s // 60}m"
    return f"{s}s"


# --- byte sizes ---------------------------------------------------------------------------------------------

_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt])(i?b?)$", re.IGNORECASE)
_MEM_UNITS = {"k": KIB, "m": MIB, "g": GIB, "t": TIB}


def parse_memory(text: str, option: str = "--mem") -> int:
    """`16G`, `500M`, `1T`, `512Mi`, `16GiB`, `16GB` → bytes (binary units: 16G is 16 GiB). A unit is required."""
    m = _MEM.match(text.strip())
    if not m:
        raise UnitError(f"{option} {text!r}: give an amount with a unit, e.g. 16G, 500M or 1T")
    value = int(round(float(m.group(1)) * _MEM_UNITS[m.group(2).lower()]))
    if value <= 0:
        raise UnitError(f"{option} {text!r}: the amount must be more than 0")
    return value


def human_bytes(n: int | float | None) -> str:
    """137438953472 → 128 GiB, 1610612736 → 1.5 GiB; None → ""."""
    if n is None:
        return ""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if float(v).is_integer() else f"{v:.1f} {unit}"
    return f"{int(n)} B"


# --- numbers ------------------------------------------------------------------------------------------------


def format_cpus(value: float) -> int | float:
    """Whole core counts as ints in the JSON (32, not 32.0)."""
    return int(value) if float(value).is_integer() else value


# --- MIG profiles (issue 46) ----------------------------------------------------------------------------------

# A MIG profile as NVML names it: <slices>g.<memory>gb, e.g. 1g.10gb, 3g.40gb, 1g.20gb+me (with media engines).
MIG_PROFILE = re.compile(r"^([1-7])g\.([0-9]+)gb(\+me)?$")
MIG_SLICES = 7  # compute slices of an A100/H100/H200 GPU: a profile "Ng.*" is N/7 of the GPU


def check_mig_profile(profile: str) -> str:
    """The profile, or ValueError that says what one looks like."""
    if not MIG_PROFILE.match(profile or ""):
        raise ValueError(f"{profile!r} is not a MIG profile: give it as NVML names it, <slices>g.<memory>gb such as "
                         "\"1g.10gb\", \"3g.40gb\" or \"1g.20gb+me\"")
    return profile


def mig_slices(profile: str) -> int:
    """A MIG device's compute slices of its GPU's seven: N for a profile "Ng.*" (all seven for a name unknown)."""
    m = MIG_PROFILE.match(profile)
    return int(m.group(1)) if m else MIG_SLICES


def mig_milli(profile: str, count: int = 1) -> int:
    """The thousandths of a GPU `count` MIG devices of `profile` count for in quotas and usage: N/7 of a GPU each
    for a profile "Ng.*" (its compute slices of the GPU's seven)."""
    return max(1, round(count * mig_slices(profile) * 1000 / MIG_SLICES))


# --- GPUs as the views show them (astra and the console alike) ---------------------------------------------------


def compress_ints(values: list[int]) -> str:
    """[0,1,2,3,5] → 0-3,5."""
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def gpus_asked(resources: dict) -> int | float | str:
    """The GPUs a run asks for in all: its count, its fraction of one GPU (issue 46: GPUS 0.5), or its MIG devices
    (`2 × MIG 1g.10gb`)."""
    gr = resources.get("gpu_requests") or {}
    if gr.get("mig"):
        return mig_shown(gr.get("count") or 0, gr["mig"])
    return gr.get("fraction") or gr.get("count") or 0


def mig_shown(count: int, profile: str) -> str:
    """Issue 46: MIG devices as the views show them: `2 × MIG 1g.10gb`."""
    return f"{count} × MIG {profile}"


def worker_gpus(w: dict) -> str:
    """A worker's GPUs as describe and the console's run page show them: its GPU indices (`0-3`), or its MIG devices
    and the GPUs they are on (`2 × MIG 1g.10gb on GPU 0`)."""
    devices = w.get("mig_devices") or []
    if not devices:
        return compress_ints(w.get("gpu_indices") or [])
    by: dict[str, int] = {}
    for _, profile, _ in devices:
        by[profile] = by.get(profile, 0) + 1
    return ", ".join(mig_shown(n, p) for p, n in by.items()) + f" on GPU {compress_ints([d[0] for d in devices])}"


def machine_shared(m: dict) -> str:
    """Issue 46: a machine's GPUs shared by fractional workers, each with the part of it still free (`GPU 0: 0.25
    free`; a GPU of MIG devices is `machine_mig`'s); "" without."""
    mig = m.get("gpu_mig") or []
    parts = []
    for g, held in enumerate(m.get("gpu_allocated") or []):
        if 0 < held < 1 and not (g < len(mig) and mig[g]):
            parts.append(f"GPU {g}: {round(1 - held, 3):g} free")
    return "; ".join(parts)


def machine_mig(m: dict) -> str:
    """Issue 46: a machine's MIG devices free, per MIG GPU and profile (`GPU 0: 1g.10gb 5/7 free`); "" without."""
    used = m.get("gpu_mig_used") or []
    parts = []
    for g, profiles in enumerate(m.get("gpu_mig") or []):
        if profiles:
            held = used[g] if g < len(used) else {}
            parts.append(f"GPU {g}: " + ", ".join(f"{p} {n - held.get(p, 0)}/{n} free"
                                                  for p, n in sorted(profiles.items())))
    return "; ".join(parts)
