"""The agent protocol: a machine registers, long-polls its assignments, reports its workers and sends their logs.

Only machine tokens may call these: a join token only /register, which answers the machine's own credential;
that credential the rest, for its own machine only (astraeus.server.agents). The bodies are `astraeus.protocol`'s
models, shared with the agent.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query

from astraeus import protocol as P
from astraeus.server import agents, leader
from astraeus.server import bodies as B
from astraeus.server.db import Machine, Token
from astraeus.server.routers.deps import CP, Sess, tx

LONG_POLL_MAX = 30.0


def machine_token(s: Sess, authorization: Annotated[str | None, Header()] = None) -> Token:
    return agents.authenticate(s, authorization)


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
def agent_assignments(tok: AgentTok, s: Sess, cp: CP, machine: str, after: int = 0,
                      wait: Annotated[float, Query(ge=0, le=LONG_POLL_MAX)] = 0) -> P.Assignments:
    m = agents.machine_for(s, tok, machine)
    mid = m.id
    s.rollback()
    version = cp.notifier.wait_machine(mid, after, wait) if wait else cp.notifier.machine_version(mid)
    with cp.sessions() as s2:
        # the scheduling lease's epoch, read before the assignments (they are at least as new as it): an agent
        # ignores answers older than the newest epoch it saw
        epoch, _, _ = leader.current(s2)
        m2 = s2.get(Machine, mid)
        return P.Assignments(version=version, assignments=agents.assignments(s2, m2), exports=agents.exports(s2, m2),
                             epoch=epoch)


@router.post("/report")
def agent_report(tok: AgentTok, s: Sess, cp: CP, body: P.Report) -> P.Ack:
    with tx(s):
        m = agents.machine_for(s, tok, body.machine)
        keepers: set[int] = set()
        changed = agents.report(s, m, body, time.time(), keepers)
        mid = m.id
    if changed:
        cp.notifier.bump_machines([mid, *keepers])
        cp.notifier.bump_logs()
        cp.notifier.wake_scheduler()
    return P.Ack()


@router.post("/logs")
def agent_logs(tok: AgentTok, s: Sess, cp: CP, body: P.Logs) -> P.LogsStored:
    with tx(s):
        m = agents.machine_for(s, tok, body.machine)
        n = agents.store_logs(s, m, body.lines, cp.settings.log_max_bytes, cp.settings.log_max_lines)
    if n:
        cp.notifier.bump_logs()
    return P.LogsStored(stored=n)
