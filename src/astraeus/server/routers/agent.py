"""The agent protocol: a machine registers, long-polls its assignments, reports its workers and sends their logs.

Only machine tokens may call these: a join token only /register, which answers the machine's own credential;
that credential the rest, for its own machine only (astraeus.server.agents). The bodies are `astraeus.protocol`'s
models, shared with the agent.
"""

from __future__ import annotations

import time
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query

from astraeus import protocol as P
from astraeus.server import agents, heartbeats, leader, services
from astraeus.server import bodies as B
from astraeus.server.db import Machine, Token
from astraeus.server.routers.deps import CP, Sess, tx

LONG_POLL_MAX = 30.0


def machine_token(s: Sess, authorization: Annotated[str | None, Header()] = None) -> Token:
    tok = agents.authenticate(s, authorization)
    # The route's body runs in another call to the thread pool: do not keep a pooled connection (idle in the read
    # transaction) while the request waits for a thread. With every thread busy, those requests held the whole pool
    # and the state lock's holder could not get a connection (benchmarks/bench_agents.py at 400 agents).
    services.hand_back_connection(s)
    return tok


AgentTok = Annotated[Token, Depends(machine_token)]

router = APIRouter(prefix="/api/v1/agent", tags=["agent"], responses=B.ERRORS)


@router.post("/register")
def agent_register(tok: AgentTok, s: Sess, cp: CP, body: P.Register) -> P.Registered:
    settings = cp.settings
    with tx(s):
        m, cl, changed, credential = agents.register(s, tok, body, time.time(), settings.heartbeat_seconds)
        out = P.Registered(machine=m.name, cluster=cl.name, heartbeat_seconds=settings.heartbeat_seconds,
                           lost_after_seconds=cl.lost_after_seconds, credential=credential)
        mid = m.id
    cp.notifier.bump_machines([mid])
    cp.notifier.wake_scheduler()
    return out


@router.get("/assignments")
async def agent_assignments(cp: CP, machine: str, after: int = 0,
                            wait: Annotated[float, Query(ge=0, le=LONG_POLL_MAX)] = 0,
                            authorization: Annotated[str | None, Header()] = None) -> P.Assignments:
    """The long-poll waits on the event loop (core.Notifier.await_machine), not in a request thread: each agent
    keeps one open, and a fleet's would otherwise take every thread. Its reads run in the thread pool."""
    mid = await anyio.to_thread.run_sync(machine_id, cp, authorization, machine)
    version = await cp.notifier.await_machine(mid, after, wait) if wait else cp.notifier.machine_version(mid)
    return await anyio.to_thread.run_sync(answer_assignments, cp, mid, version)


def machine_id(cp, authorization: str | None, machine: str) -> int:
    with cp.sessions() as s:
        return agents.machine_for(s, agents.authenticate(s, authorization), machine).id


def answer_assignments(cp, mid: int, version: int) -> P.Assignments:
    with cp.sessions() as s:
        # the scheduling lease's epoch, read before the assignments (they are at least as new as it): an agent
        # ignores answers older than the newest epoch it saw
        epoch, _, _ = leader.current(s)
        m = s.get(Machine, mid)
        return P.Assignments(version=version, assignments=agents.assignments(s, m), exports=agents.exports(s, m),
                             epoch=epoch)


@router.post("/report")
def agent_report(tok: AgentTok, s: Sess, cp: CP, body: P.Report) -> P.Ack:
    if not body.lines and heartbeats.heartbeat_only(s, agents.machine_for(s, tok, body.machine), body, time.time()):
        return P.Ack()  # a bare heartbeat: written without the state lock (server/heartbeats.py)
    with tx(s):
        m = agents.machine_for(s, tok, body.machine)
        # the last lines of the attempts it says ended, first: their end may release them from this machine
        stored = agents.store_logs(s, m, body.lines, cp.settings.log_max_bytes, cp.settings.log_max_lines) \
            if body.lines else 0
        keepers: set[int] = set()
        changed = agents.report(s, m, body, time.time(), keepers)
        mid = m.id
    if changed:
        cp.notifier.bump_machines([mid, *keepers])
        cp.notifier.wake_scheduler()
    if changed or stored:
        cp.notifier.bump_logs()
    return P.Ack()


@router.post("/logs")
def agent_logs(tok: AgentTok, s: Sess, cp: CP, body: P.Logs) -> P.LogsStored:
    with tx(s):
        m = agents.machine_for(s, tok, body.machine)
        n = agents.store_logs(s, m, body.lines, cp.settings.log_max_bytes, cp.settings.log_max_lines)
    if n:
        cp.notifier.bump_logs()
    return P.LogsStored(stored=n)
