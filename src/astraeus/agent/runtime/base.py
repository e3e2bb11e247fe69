"""The runtime interface the agent drives. `ProcessRuntime` runs commands on the host; `ContainerRuntime`
(astraeus.agent.runtime.container) runs them from their images with runc."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from astraeus.protocol import Assignment, WorkerLogLine, WorkerReport

# States an agent reports (docs/api.md): Starting, Running, Exited, StartFailed.
STARTING = "Starting"
RUNNING = "Running"
EXITED = "Exited"
START_FAILED = "StartFailed"
FINAL_STATES = frozenset({EXITED, START_FAILED})


@dataclass
class WorkerStatus:
    worker: str
    attempt: int
    state: str
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str | None = None
    environment: str | None = None  # the local environment the image mapped to
    started_at: float | None = None
    finished_at: float | None = None
    stopping: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return (self.worker, self.attempt)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def report(self) -> WorkerReport:
        """The entry of POST /report for this worker."""
        return WorkerReport(worker=self.worker, attempt=self.attempt, state=self.state, pid=self.pid,
                            exit_code=self.exit_code, signal=self.signal, message=self.message,
                            environment=self.environment, started_at=self.started_at, finished_at=self.finished_at,
                            oom_limit_bytes=self.extra.get("oom_limit_bytes") if self.extra.get("oom") else None)


@dataclass
class LogLine:
    worker: str
    attempt: int
    seq: int
    time: float
    stream: str
    text: str

    def shipped(self) -> WorkerLogLine:
        """The entry of POST /logs for this line."""
        return WorkerLogLine(worker=self.worker, attempt=self.attempt, seq=self.seq, time=self.time,
                             stream=self.stream, text=self.text)


class StartFailed(Exception):
    """The worker could not be started; str(e) says why (reported as StartFailed with this message)."""


class Runtime(abc.ABC):
    """Starts, stops, watches and adopts worker attempts on this machine. Keys are (worker, attempt)."""

    @abc.abstractmethod
    def start(self, assignment: Assignment) -> WorkerStatus:
        """Start one worker attempt from its assignment (docs/api.md). Raises StartFailed."""

    @abc.abstractmethod
    def stop(self, worker: str, attempt: int, grace: float | None = None, wait: bool = True,
             reason: str | None = None) -> WorkerStatus | None:
        """SIGTERM to the main process; SIGKILL to the whole tree when `grace` runs out. With wait=False,
        returns at once (the stop goes on without the caller). `reason` (why, in words) and the grace are
        written to the worker's ASTRAEUS_STOP_REASON_FILE before the SIGTERM."""

    @abc.abstractmethod
    def status(self, worker: str, attempt: int) -> WorkerStatus | None:
        """The attempt's current state, or None when this runtime does not know it."""

    def wait_event(self, timeout: float) -> bool:
        """Block until a worker starts or ends (True) or `timeout` passes (False). A runtime that cannot tell
        just sleeps, and the agent finds changes at its next poll."""
        import time

        time.sleep(timeout)
        return False

    @abc.abstractmethod
    def list(self) -> list[WorkerStatus]:
        """Every attempt this runtime knows (live and ended, until forgotten)."""

    @abc.abstractmethod
    def adopt(self) -> list[WorkerStatus]:
        """After a restart: find the attempts still running (and those that ended meanwhile)."""

    @abc.abstractmethod
    def read_logs(self, worker: str, attempt: int, offset: int = 0, limit: int = 1000) -> tuple[list[LogLine], int]:
        """Log lines from byte offset `offset`; returns them and the offset to continue from."""

    @abc.abstractmethod
    def forget(self, worker: str, attempt: int) -> None:
        """Drop an ended attempt's records and logs."""

    def adopt_as(self, worker: str, attempt: int, identity: str) -> bool:
        """Name a live attempt an older agent keyed `worker` by `identity` from now on (protocol: worker
        identity); False when this runtime keeps no such attempt."""
        return False

    def close(self) -> None:  # noqa: B027 (a runtime with nothing of its own to stop has nothing to do)
        """The agent is shutting down: stop what the runtime runs for itself (not the workers, which run on)."""
