"""Sessions into running workers (exec, shell, port-forward), streamed through the control plane.

A user opens a WebSocket to `$API/runs/{name}/exec` (or `/port-forward`) with a bearer token; an editor's session is
recorded as an Event of the workspace and waits here. The worker's machine hears of it from its long-poll
(GET /api/v1/agent/exec-sessions) and opens its own WebSocket back (agents only make outbound connections); the two
are then paired and their frames passed on both ways until either side ends (astraeus.protocol, "exec").

Pairing is in this process's memory: a control plane run as several processes or replicas pairs only the sessions
whose two sides reach the same process (the agent's long-poll and the user's WebSocket must land on one).
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from astraeus import protocol as P
from astraeus.server import lifecycle, services
from astraeus.server.db import Event, Machine, Run, Worker, Workspace
from astraeus.server.services import ApiError, tx

AGENT_ANSWER_SECONDS = 20.0  # how long a user's session waits for the worker's machine to open its side


@dataclass
class Pending:
    info: P.ExecSession
    machine_id: int
    machine: str
    agent: asyncio.Future | None = None  # the agent's WebSocket, once it has opened it (made by Hub.add)
    done: asyncio.Event | None = None  # set when the user's side has ended
    worker_id: int = 0  # the session's worker (its attachment counts for the idle timeout); 0: none


class Hub:
    """The sessions waiting for, or joined by, their machine's agent (one hub per control-plane process)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Pending] = {}
        self.queued: dict[int, list[str]] = {}  # machine id -> sessions its agent has not taken yet
        self.wake: dict[int, asyncio.Event] = {}

    def add(self, p: Pending) -> None:
        """On the event loop (the future and the event belong to it)."""
        p.agent, p.done = asyncio.get_running_loop().create_future(), asyncio.Event()
        self.sessions[p.info.id] = p
        self.queued.setdefault(p.machine_id, []).append(p.info.id)
        self.wake.setdefault(p.machine_id, asyncio.Event()).set()

    def drop(self, sid: str) -> None:
        p = self.sessions.pop(sid, None)
        if p is not None:
            q = self.queued.get(p.machine_id) or []
            if sid in q:
                q.remove(sid)
            p.done.set()

    async def take(self, machine_id: int, wait: float) -> list[P.ExecSession]:
        """The sessions for this machine, at once when there are some, else when one comes or after `wait`."""
        ev = self.wake.setdefault(machine_id, asyncio.Event())
        if not self.queued.get(machine_id) and wait > 0:
            try:
                await asyncio.wait_for(ev.wait(), wait)
            except TimeoutError:
                pass
        ev.clear()
        ids = self.queued.pop(machine_id, [])
        return [self.sessions[i].info for i in ids if i in self.sessions]


async def agent_socket(p: Pending):
    """The agent's WebSocket for session `p`, once its machine has opened it (the user is told when it does not)."""
    try:
        return await asyncio.wait_for(asyncio.shield(p.agent), AGENT_ANSWER_SECONDS)
    except TimeoutError:
        raise ApiError(504, "TIMEOUT", f"machine {p.machine} did not open the session within "
                                       f"{AGENT_ANSWER_SECONDS:g}s: is its agent running and connected to this "
                                       "control plane? try again") from None


def hub_of(app) -> Hub:
    hub = getattr(app.state, "exec_hub", None)
    if hub is None:
        hub = app.state.exec_hub = Hub()
    return hub


def open_session(cp, authorization: str | None, org: str, ws: str, run_name: str, index: int,
                 command: list[str], tty: bool, cols: int, rows: int, port: int | None,
                 caller_of: Callable[[Session], services.Caller] | None = None) -> Pending:
    """Check the caller (an editor of the workspace; by its bearer token, or as `caller_of` finds it: the console's
    cookie) and the worker (running, placed), record the session as an Event of the workspace, and describe it for
    the agent. Runs in a worker thread (database calls)."""
    with cp.sessions() as s:
        caller = caller_of(s) if caller_of is not None else services.user_caller(s, authorization, org, ws)
        what = "port-forward" if port is not None else "shell" if tty and not command else "exec"
        if (caller.role or "viewer") not in ("editor", "admin"):
            raise ApiError(403, "FORBIDDEN", f"{what} into a worker needs the editor role in workspace "
                                             f"{caller.workspace.name}; this token has the {caller.role} role: "
                                             "use an editor's token")
        if port is None and not command and not tty:
            raise ApiError(422, "INVALID", "command: give the command to run (`astra astraeus exec RUN -- CMD`)")
        if port is not None and not 1 <= port <= 65535:
            raise ApiError(422, "INVALID", f"port: {port} is not a TCP port; give one from 1 to 65535")
        run = services.get_run(s, caller, run_name)
        w = s.scalar(select(Worker).where(Worker.run_id == run.id, Worker.index == index))
        if w is None:
            n = len(s.scalars(select(Worker.id).where(Worker.run_id == run.id)).all())
            raise ApiError(404, "NOT_FOUND", f"run {run_name} has no worker {index}"
                                             + (f": give --worker from 0 to {n - 1}" if n else ""))
        if w.state != "Running" or w.machine_id is None:
            raise ApiError(409, "NOT_RUNNING", f"worker {w.name} is {w.state}, not Running: a session needs a running "
                                               "worker; wait until `astra astraeus describe "
                                               f"{run_name}` shows it Running")
        m = s.get(Machine, w.machine_id)
        ns = s.get(Workspace, run.workspace_id).ns
        shown = f"port {port}" if port is not None else (shlex.join(command) if command else "a shell")
        who = f"token {caller.token.id}" if caller.token is not None else "the control plane"
        with tx(s):
            at = time.time()
            lifecycle.event(s, caller.workspace.id, "PortForward" if port is not None else "Exec", w.name,
                            f"{what} by {who} ({caller.role}) into worker {w.name} on machine {m.name}: {shown}", at)
            # attached (a port-forward too: a notebook in use): an interactive run's idle timeout waits
            lifecycle.sessions_changed(run, w, True, at)
        info = P.ExecSession(id=secrets.token_hex(12), worker=P.worker_identity(ns, w.name, run.uid),
                             attempt=w.attempt, command=list(command), tty=tty, cols=cols, rows=rows, port=port)
        return Pending(info=info, machine_id=m.id, machine=m.name, worker_id=w.id)


def close_session(cp, p: Pending) -> None:
    """An exec, shell or port-forward session ended: recorded (ExecEnded), and when it was the worker's last one
    attached (the Exec and PortForward events of its attempt less the ExecEnded ones), its run's idle timeout counts
    from now. Runs in a worker thread (database calls)."""
    if not p.worker_id:
        return
    with cp.sessions() as s:
        w = s.get(Worker, p.worker_id)
        if w is None:
            return
        with tx(s):
            at = time.time()
            lifecycle.event(s, s.get(Run, w.run_id).workspace_id, "ExecEnded", w.name,
                            f"session into worker {w.name} ended", at)
            s.flush()
            run = s.get(Run, w.run_id)
            since = w.started_at or 0.0
            count = {k: n for k, n in s.execute(
                select(Event.kind, func.count()).where(Event.workspace_id == run.workspace_id, Event.object == w.name,
                                                       Event.kind.in_(("Exec", "PortForward", "ExecEnded")),
                                                       Event.time >= since)
                .group_by(Event.kind))}
            opened = count.get("Exec", 0) + count.get("PortForward", 0)
            lifecycle.sessions_changed(run, w, opened > count.get("ExecEnded", 0), at)
