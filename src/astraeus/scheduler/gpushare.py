"""Shared GPUs (issue 46): capacity per GPU in thousandths, and where a fractional worker goes.

A GPU holds FULL (1000) thousandths, as the Alibaba trace's `gpu_milli`. A fractional worker asks for part of one
GPU (`WorkerRequest.gpus` 0 < g < 1, e.g. 0.5); it takes room on a GPU that already has tenants, or a GPU with
nothing on it. Whole-GPU workers only take GPUs with nothing on them (`Cluster.free_g` never lists a shared GPU),
so a GPU is never oversubscribed. The per-GPU free capacity of a machine is a tuple of ints (`free_milli`), as the
fragmentation score (`fragments.fgd_share`) reads it; best fit reads the same capacities from the machine's whole
free GPUs and its shared GPUs (`best_fit`: a GPU's room is all it weighs, so no tuple is made per machine).
"""

from __future__ import annotations

from .. import units

FULL = 1000  # thousandths of one GPU

# Who may share a GPU (a cluster setting): tenants of one workspace only, or of any workspace.
SAME_WORKSPACE = "workspace"
ANY_WORKSPACE = "any"
SHARING = (SAME_WORKSPACE, ANY_WORKSPACE)


def is_fraction(gpus: float) -> bool:
    """Does a worker asking for `gpus` share one GPU (0 < gpus < 1)?"""
    return 0 < gpus < 1


def to_milli(gpus: float) -> int:
    """The thousandths of one GPU a fractional request takes (at least 1)."""
    return max(1, min(FULL - 1, round(gpus * FULL)))


def memory_milli(asked: int, gpu_memory: int) -> int | None:
    """The thousandths of one GPU of `gpu_memory` bytes that a request for `asked` bytes of GPU memory takes
    (rounded up, at most FULL - 1); None when the GPU does not hold more than that (a whole GPU is `count`)."""
    if gpu_memory <= 0 or asked >= gpu_memory:
        return None
    return max(1, min(FULL - 1, -(-asked * FULL // gpu_memory)))


def gpu_memory_short(gpu_memory: int, asked: int) -> str:
    """The why-not line of a machine whose GPUs hold no more than the GPU memory a run asks."""
    if gpu_memory <= 0:
        return f"machine reports no GPU memory, {_gib(asked)} of GPU memory asked"
    return f"machine's GPUs have {_gib(gpu_memory)} of memory, {_gib(asked)} asked (less than one GPU's memory)"


def no_gpu_memory(asked: int) -> str:
    """Why a run asking `asked` bytes of GPU memory fits no machine it may use."""
    return f"asks for {_gib(asked)} of GPU memory; no machine it may use has a GPU with more"


def _gib(b: int) -> str:
    return f"{b / (1 << 30):g} GiB" if b % (1 << 20) == 0 else f"{b} bytes"


def from_milli(milli: int) -> float:
    """The GPUs that `milli` thousandths stand for, as quotas and reasons count them (0.5)."""
    return milli / FULL


def free_milli(gpus: int, whole_free: list[int] | tuple[int, ...], shared: dict[int, list], workspace: str,
               sharing: str) -> tuple[int, ...]:
    """Per GPU of a machine, the thousandths a fractional worker of `workspace` may still take: FULL on a GPU with
    nothing on it, FULL less its tenants' share on a shared GPU (0 where the cluster keeps other workspaces off),
    0 on a GPU held whole (or failed). `shared`: gpu -> [used thousandths, {workspace: tenants}]."""
    out = [0] * gpus
    for g in whole_free:
        out[g] = FULL
    for g, (used, tenants) in shared.items():
        if sharing == ANY_WORKSPACE or not tenants or (len(tenants) == 1 and workspace in tenants):
            out[g] = FULL - used
    return tuple(out)


def best_fit(candidates, milli: int, workspace: str, sharing: str) -> tuple[int, int] | None:
    """(machine, gpu) for a fractional worker of `workspace` taking `milli` thousandths: the GPU left with the least
    free room after it (a shared GPU before an empty one), ties by machine then GPU index; None when no GPU has
    room. `candidates`: (machine index, its whole free GPUs in index order, its shared GPUs as `free_milli` reads
    them), in any order: the GPUs `free_milli` gives room, each with that room."""
    best = None
    empty = FULL - milli
    for i, whole, shared in candidates:
        if whole and (best is None or (empty, i, whole[0]) < best):
            best = (empty, i, whole[0])  # every empty GPU is left the same: the first of them
        for g, (used, tenants) in shared.items():
            left = FULL - used - milli
            if left >= 0 and (best is None or (left, i, g) < best) and (
                    sharing == ANY_WORKSPACE or not tenants or (len(tenants) == 1 and workspace in tenants)):
                best = (left, i, g)
    return None if best is None else (best[1], best[2])


def usable_shares(on: dict[int, list], sharing: str) -> dict[str | None, tuple[int, ...]]:
    """Who may take room on a machine's shared GPUs, with the free thousandths each finds there (above 0, sorted):
    None (anyone) when the cluster lets any workspace share, else the one workspace on each GPU (a GPU with
    tenants of two workspaces, as a change of the setting leaves, takes no one). Keys `Cluster`'s share index:
    with the machine's whole free GPUs it is all a placement's score reads of the machine."""
    out: dict[str | None, list[int]] = {}
    for used, tenants in on.values():
        if used >= FULL:
            continue
        if sharing == ANY_WORKSPACE:
            who = None
        elif len(tenants) == 1:
            who = next(iter(tenants))
        else:
            continue
        out.setdefault(who, []).append(FULL - used)
    return {who: tuple(sorted(free)) for who, free in out.items()}


# ------------------------------------------------------------------------------------------------ MIG devices

# MIG profiles and their share of a GPU live in astraeus.units (the spec checks them too), re-exported here.
MIG_PROFILE, MIG_SLICES = units.MIG_PROFILE, units.MIG_SLICES
check_mig_profile, mig_milli = units.check_mig_profile, units.mig_milli


def mig_devices_of(gpu_mig) -> dict[str, list[tuple[int, str, int]]]:
    """A machine's MIG devices by profile: profile -> [(gpu, profile, k)], the k-th device of that profile on that
    GPU, in GPU order. `gpu_mig`: per GPU, (profile, count) pairs (Machine.gpu_mig)."""
    out: dict[str, list[tuple[int, str, int]]] = {}
    for g, profiles in enumerate(gpu_mig):
        for profile, count in profiles:
            out.setdefault(profile, []).extend((g, profile, k) for k in range(count))
    return out


def no_mig_device(profile: str) -> str:
    """The why-not line of a machine without MIG devices of the profile asked."""
    return f"machine has no MIG {profile} devices"


def no_mig_profile(profile: str, profiles: list[str]) -> str:
    """Why a run asking MIG devices of `profile` fits no machine it may use, naming the profiles the cluster has."""
    if not profiles:
        return f"asks for MIG {profile} devices; no machine of the cluster reports MIG devices"
    return f"asks for MIG {profile} devices; the cluster's machines have {', '.join(profiles)}"
