"""The words the scheduler shows: run reasons, per-machine "why not" lines, quota messages.

Every string here is the product's own wording (the "Priorities, preemption and checkpoints" page), word for
word. Another workspace's run is never named: `a job in another namespace` stands in for it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

GIB = 1 << 30
OTHER_NAMESPACE = "a job in another namespace"


def number(x: float) -> str:
    """6 → "6", 4.5 → "4.5", 0.333333 → "0.33"."""
    if x == int(x):
        return str(int(x))
    return f"{round(x, 2):g}"


def gib(b: float) -> str:
    return f"{number(b / GIB)} GiB"


def utc_minute(t: float) -> str:
    """The minute at or after t: a time shown as "starts by" is never earlier than the time itself."""
    return datetime.fromtimestamp(math.ceil(t / 60) * 60, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def shown(run: str, run_workspace: str, viewer_workspace: str) -> str:
    """The name of `run` as a viewer in `viewer_workspace` may see it."""
    return run if run_workspace == viewer_workspace else OTHER_NAMESPACE


# ------------------------------------------------------------------------------------------------- quota

# (field of Quota, the word shown, formatter) in the order the first exceeded one is reported.
QUOTA_RESOURCES: tuple[tuple[str, str, object], ...] = (
    ("gpus", "gpus", number),
    ("cpu_cores", "cpu cores", number),
    ("memory_bytes", "memory", gib),
    ("workers", "workers", number),
)


def quota_in_use(word: str, fmt, in_use: float, asked: float, limit: float) -> str:
    return f"{word} {fmt(in_use)} in use + {fmt(asked)} asked > {fmt(limit)}"


def quota_alone(word: str, fmt, asked: float, limit: float) -> str:
    return f"{word} {fmt(asked)} asked > {fmt(limit)}"


def waits_for_quota(detail: str) -> str:
    return f"Waits for namespace quota: {detail}"


def waits_beyond_quota(detail: str) -> str:
    return f"Waits for more than the namespace's quota allows at all ({detail}): raise the quota or ask for less"


def waits_for_user_limit(user: str, in_use: int, asked: int, limit: int) -> str:
    """A run held by its workspace's max_gpus_per_user (Slurm's QOS MaxTRESPerUser)."""
    return f"Waits for {user}'s limit: gpus {in_use} in use + {asked} asked > {limit}"


def quota_reached(detail: str) -> str:
    return f"Quota reached: {detail}"


# -------------------------------------------------------------------------------------------- run reasons


def cannot_run(detail: str) -> str:
    return f"Cannot run on this cluster: {detail}"


def _when(shadow_time: float | None) -> str:
    return "waits for running work to end" if shadow_time is None else f"starts by {utc_minute(shadow_time)}"


def head_next(priority: int, shadow_time: float | None) -> str:
    ending = "" if shadow_time is None else " as running work ends"
    return f"Next to run (priority {priority}): {_when(shadow_time)}{ending}"


def head_preempting(workers: int, victim: str) -> str:
    return f"Preempting {workers} lower-priority worker(s) of {victim} to start"


def head_waiting_for_victims(workers: int) -> str:
    return f"Starting: waiting for {workers} preempted worker(s) to stop"


def queued_behind(head: str, shadow_time: float | None) -> str:
    return f"Queued behind {head}, which {_when(shadow_time)}"


def preempted_by(head: str) -> str:
    return f"Preempted by higher-priority work ({head})"


# ------------------------------------------------------------------------------- job arrays, dependencies


def array_limit(running: int, array: str, limit: int) -> str:
    return f"Waiting: {running} of array {array} are running (at most {limit} at once)"


# ---------------------------------------------------------------------------------- pools, reservations

RESERVED_NOW = "machine is reserved for another namespace"
NOT_IN_NAMESPACE_POOLS = "machine is not in the namespace's pools"


def not_in_run_pools(pools: tuple[str, ...]) -> str:
    return f"machine is not in the run's pools ({', '.join(pools)})"


def gpu_model_mismatch(machine_model: str, gpus: int, asked: str) -> str:
    if not gpus or not machine_model:
        return f"machine has no GPUs, not {asked}"
    return f"machine's GPUs are {machine_model}, not {asked}"


def reserved_before(start: float, timed: bool) -> str:
    """An outsider's run before another namespace's reservation window (its name is never shown)."""
    if timed:
        return f"{RESERVED_NOW} from {utc_minute(start)}: the run's time limit does not end it by then"
    return f"{RESERVED_NOW} from {utc_minute(start)}: a run without a time limit cannot use it before then"


def not_in_reservation(name: str) -> str:
    return f"machine is not in reservation {name}"


def no_machine_in_pools() -> str:
    return "no machine in its pools"


def no_machine_in_namespace_pools() -> str:
    return "no machine the namespace's pools hold"


def no_machine_with_model(asked: str) -> str:
    return f"no machine has {asked} GPUs"


def waits_for_reservation(name: str, start: float) -> str:
    return f"Waits for reservation {name}, which starts at {utc_minute(start)}"


def reservation_ended(name: str) -> str:
    return f"Reservation {name} has ended"


def reservation_not_for_namespace(name: str) -> str:
    return cannot_run(f"reservation {name} is not for this namespace")


def waits_for_reserved_machines() -> str:
    """A run that fits only on machines another namespace has reserved (never named): it waits, never the head."""
    return "Waits for machines reserved for another namespace"


def stopped_for_reservation(name: str) -> str:
    return f"Stopped for reservation {name}"
