"""Slurm's job dependencies, decided: may a waiting run start, must it wait, or can its dependency no longer be
met? Pure: the control plane gives the states of the runs a dependency names (model.Dependency).

    afterok     start once every named run has completed; a failed or cancelled one: never
    afternotok  start once every named run has ended and none completed; a completed one: never
    afterany    start once every named run has ended, however
    singleton   start once no earlier run of the same job (its job array, or its name) is live
"""

from __future__ import annotations

from .model import Dependency

OK = frozenset({"Completed"})
NOT_OK = frozenset({"Failed", "Cancelled"})
ENDED = OK | NOT_OK

_WAITS_FOR = {"afterok": "complete", "afternotok": "fail", "afterany": "end", "singleton": "end"}
_ENDED_AS = {"Completed": "completed", "Failed": "failed", "Cancelled": "was cancelled"}


def _names(items: list[str]) -> str:
    seen = list(dict.fromkeys(items))
    if len(seen) <= 3:
        return ", ".join(seen)
    return f"{', '.join(seen[:3])} and {len(seen) - 3} more"


def verdict(dep: Dependency) -> tuple[str, str] | None:
    """None when the dependency is met; ("wait", reason) while it may still be; ("fail", reason) when it can no
    longer be."""
    kind = dep.type
    never = OK if kind == "afternotok" else NOT_OK if kind == "afterok" else frozenset()
    for _given, run, state in dep.runs:
        if state in never:
            return "fail", f"{run} {_ENDED_AS[state]}: {kind} can no longer be met"
    live = [run if kind == "singleton" else given for given, run, state in dep.runs if state not in ENDED]
    if live:
        return "wait", f"Waiting for {_names(live)} to {_WAITS_FOR[kind]} ({kind})"
    return None
