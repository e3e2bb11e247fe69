"""What the agent does to make this machine's workers what the control plane wants, decided without acting: no I/O,
no clock, no threads. The agent (astraeus.agent.agent) reads the desired assignments and its workers' states, asks
`adoptions` (applied first: they change the states), then `actions`, and applies those in order with the runtime.

Workers are keyed by (identity, attempt). One attempt of a worker runs at a time: a new attempt waits while an older
one is still stopping. An attempt not assigned here any more is stopped (NOT_ASSIGNED); one the control plane wants
stopped is stopped with its reason; one stopped before it started is said to have ended so. An ended attempt no
longer assigned, whose end was reported, is forgotten (once its lines are shipped)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from astraeus import protocol as P
from astraeus.agent.runtime.base import WorkerStatus

Key = tuple[str, int]  # (worker identity, attempt)

# Why the agent itself stops a worker (ASTRAEUS_STOP_REASON_FILE); the control plane's reasons come with the
# assignment (Assignment.stop_reason).
NOT_ASSIGNED = "no longer assigned to this machine"


@dataclass(frozen=True)
class Adopt:
    """Take over an attempt an older agent started under its older identity (`<ns>.<name>`) as `worker`, instead of
    stopping it and starting it again."""

    older: str
    attempt: int
    worker: str


@dataclass(frozen=True)
class Start:
    """Start an attempt (its drives from other machines mounted first)."""

    assignment: P.Assignment

    @property
    def key(self) -> Key:
        return self.assignment.key


@dataclass(frozen=True)
class Stop:
    """Stop a running attempt: SIGTERM, then SIGKILL after `grace` seconds. `reason` is what the worker reads;
    `why` what the agent's log says (None: it is no longer assigned here)."""

    worker: str
    attempt: int
    grace: float
    reason: str
    why: str | None = None

    @property
    def key(self) -> Key:
        return (self.worker, self.attempt)


@dataclass(frozen=True)
class StoppedBeforeStart:
    """An attempt the control plane wants stopped that never started here: it ended, at `at`."""

    worker: str
    attempt: int
    at: float

    @property
    def key(self) -> Key:
        return (self.worker, self.attempt)


@dataclass(frozen=True)
class Forget:
    """An ended attempt, no longer assigned and its end reported: forgotten (its folder, its log offset) once all its
    lines are shipped."""

    worker: str
    attempt: int

    @property
    def key(self) -> Key:
        return (self.worker, self.attempt)


@dataclass(frozen=True)
class ReleaseDrives:
    """Unmount the drives mounted from other machines that no worker here needs any more."""


@dataclass(frozen=True)
class Report:
    """Attempts whose state changed since the last report (state_of each): the report thread sends them now."""

    states: tuple[tuple[Key, tuple], ...]


Action = Start | Stop | StoppedBeforeStart | Forget | ReleaseDrives | Report


@dataclass(frozen=True)
class Actual:
    """What the agent knows of this machine's workers."""

    workers: Mapping[Key, WorkerStatus]  # every attempt's state: the runtime's, and those the agent set (never started)
    starting: frozenset[Key] = frozenset()  # being started now
    reported: frozenset[Key] = frozenset()  # ended attempts whose end the control plane was told
    last_states: Mapping[Key, tuple] = field(default_factory=dict)  # state_of each attempt, as last reported
    drives_mounted: bool = False  # drives from other machines are mounted here


def state_of(st: WorkerStatus) -> tuple:
    """What a report says of an attempt, to tell whether it changed."""
    return (st.state, st.pid, st.exit_code, st.signal, st.message)


def adoptions(desired: Mapping[Key, P.Assignment] | None, workers: Mapping[Key, WorkerStatus]) -> list[Adopt]:
    """The attempts an older agent started under their older identity that are the assigned attempts of that ns,
    name and attempt. One asked to stop is not adopted (it belongs to a deleted run the same name was submitted
    again as)."""
    out = []
    for key in desired or {}:
        old = (P.older_identity(key[0]), key[1])
        st = workers.get(old)
        if old == key or key in workers or st is None or st.stopping:
            continue
        out.append(Adopt(old[0], old[1], key[0]))
    return out


def actions(desired: Mapping[Key, P.Assignment] | None, actual: Actual, now: float, stop_grace: float) -> list[Action]:
    """What to do, in order, to make the workers here what `desired` says (None: no answer from the control plane
    yet, so nothing is started or stopped)."""
    out: list[Action] = []
    workers = actual.workers
    if desired is not None:
        live_workers = {k[0] for k, st in workers.items() if not st.final}
        for key, a in desired.items():
            st = workers.get(key)
            if a.desired == "Running":
                if st is None and key not in actual.starting:
                    if key[0] in live_workers:
                        continue  # another attempt of this worker is still stopping: one at a time
                    live_workers.add(key[0])
                    out.append(Start(a))
            elif st is None and key not in actual.starting:
                out.append(StoppedBeforeStart(key[0], key[1], now))
            elif st is not None and not st.final and not st.stopping:
                out.append(Stop(key[0], key[1], stop_grace, a.stop_reason or "stopped by the control plane",
                                why=a.stop_reason or "desired Stopped"))
        for key, st in workers.items():
            if key not in desired and not st.final and not st.stopping and key not in actual.starting:
                out.append(Stop(key[0], key[1], stop_grace, NOT_ASSIGNED))
        for key, st in workers.items():
            if key not in desired and st.final and key in actual.reported:
                out.append(Forget(*key))
        if actual.drives_mounted:
            out.append(ReleaseDrives())
    changed = tuple((key, state_of(st)) for key, st in workers.items() if actual.last_states.get(key) != state_of(st))
    if changed:
        out.append(Report(changed))
    return out


def drives_needed(desired: Mapping[Key, P.Assignment], starting: frozenset[Key], live: set[Key], targets) -> set[str]:
    """The drives mounted from other machines that a worker here still needs (starting, or not ended):
    `targets(assignment)` names an assignment's."""
    return {t for k, a in desired.items() if k in starting or k in live for t in targets(a)}
