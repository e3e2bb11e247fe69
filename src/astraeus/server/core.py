"""The control plane's shared parts: settings, the database handle, and the wake-ups between threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import sessionmaker

from astraeus.server import db
from astraeus.settings import ServerSettings


def _env() -> ServerSettings:
    return ServerSettings.load()  # raises SettingsError naming a bad ASTRAEUS_* variable


@dataclass
class Settings:
    """What one control-plane process runs with. Fields not given are read from the environment
    (astraeus.settings.ServerSettings; docs/configuration.md); tests pass them as keywords."""

    home: Path = field(default_factory=lambda: _env().home)
    database_url: str | None = field(default_factory=lambda: _env().database_url)
    host: str = "127.0.0.1"
    port: int = 8420
    public_url: str | None = field(default_factory=lambda: _env().public_url)
    # The pages: "The scheduler looks at every waiting run at least every 15 seconds, and whenever something
    # changes." A change wakes the loop at once; this is the longest it sleeps.
    schedule_interval: float = field(default_factory=lambda: _env().schedule_interval)
    # Debounce: a burst of submits within this many seconds is scheduled in one cycle.
    schedule_debounce: float = 0.005  # 5 ms
    heartbeat_seconds: float = field(default_factory=lambda: _env().heartbeat)
    # Request and log bounds (docs/api.md, "Limits").
    max_body_bytes: int = field(default_factory=lambda: _env().max_body_bytes)
    log_max_bytes: int = field(default_factory=lambda: _env().log_max_bytes_per_worker)
    log_max_lines: int = field(default_factory=lambda: _env().log_max_lines_per_worker)
    console_session_hours: float = field(default_factory=lambda: _env().console_session_hours)

    @classmethod
    def from_env(cls, env: ServerSettings | None = None, **given) -> Settings:
        """The environment's settings (read once), with `given` fields (home, host, port, ...) winning."""
        env = env or _env()
        kw = {"home": env.home, "database_url": env.database_url, "public_url": env.public_url,
              "schedule_interval": env.schedule_interval, "heartbeat_seconds": env.heartbeat,
              "console_session_hours": env.console_session_hours}
        kw.update(max_body_bytes=env.max_body_bytes, log_max_bytes=env.log_max_bytes_per_worker,
                  log_max_lines=env.log_max_lines_per_worker)
        kw.update({k: v for k, v in given.items() if v is not None})
        return cls(**kw)

    def url(self) -> str:
        if self.database_url:
            return self.database_url
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)  # the database, the env file with tokens, the agents' state
        return f"sqlite:///{self.home / 'astraeus.db'}"

    def console_base(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


# Every transaction that changes state takes this lock: API writes, agent reports and the scheduling loop's
# apply. One control-plane process then never applies a decision made on state that another write has since
# changed (a delete racing a scheduling cycle, say). Reads never take it.
STATE_LOCK = threading.RLock()


class Notifier:
    """Version counters that threads wait on: per machine (desired workers) and for logs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._machine: dict[int, int] = {}
        self._logs = 0
        self._wake = threading.Event()
        self.closing = False

    def close(self) -> None:
        """Let every waiting long-poll and log follower return now: the control plane is stopping."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()

    # machines --------------------------------------------------------------------------------------
    def machine_version(self, machine_id: int) -> int:
        with self._cond:
            return self._machine.setdefault(machine_id, 1)

    def bump_machines(self, machine_ids) -> None:
        with self._cond:
            for m in machine_ids:
                if m is not None:
                    self._machine[m] = self._machine.setdefault(m, 1) + 1
            self._cond.notify_all()

    def wait_machine(self, machine_id: int, after: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.closing or self._machine.setdefault(machine_id, 1) > after, timeout=timeout)
            return self._machine[machine_id]

    # logs ------------------------------------------------------------------------------------------
    def logs_version(self) -> int:
        with self._cond:
            return self._logs

    def bump_logs(self) -> None:
        with self._cond:
            self._logs += 1
            self._cond.notify_all()

    def wait_logs(self, after: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.closing or self._logs > after, timeout=timeout)
            return self._logs

    # the scheduling loop ---------------------------------------------------------------------------
    def wake_scheduler(self) -> None:
        self._wake.set()

    def wait_scheduler(self, timeout: float) -> bool:
        woke = self._wake.wait(timeout)
        self._wake.clear()
        return woke


@dataclass
class ControlPlane:
    settings: Settings
    engine: object
    sessions: sessionmaker
    notifier: Notifier

    @classmethod
    def open(cls, settings: Settings) -> ControlPlane:
        engine = db.make_engine(settings.url())
        db.migrate(engine)
        return cls(settings=settings, engine=engine, sessions=db.session_factory(engine), notifier=Notifier())
