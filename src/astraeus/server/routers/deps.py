"""What the routers depend on, read from the request: the control plane, a session, the token and the caller.

The ControlPlane lives on `request.app.state.cp` (create_api puts it there), so a router is a plain module-level
`APIRouter` with no closure over the app. FastAPI caches a dependency per request: a route's session, token and
caller share one database session.

FastAPI runs a plain `def` dependency in a worker thread, a hop through the thread pool (a queue put, a thread
woken, the GIL handed over and back) that cost more than the work of most of them: the control plane, the console
base and the session are `async def` (they do no I/O: a session takes its connection on first use), and a
workspace or admin caller is authenticated in the same thread as it is looked up (one hop, not two). A submit was
seven hops; it is one (routers/runs.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, Header, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.server import agents, services
from astraeus.server.core import ControlPlane
from astraeus.server.db import Machine, Token
from astraeus.server.services import Caller, tx

__all__ = ["CP", "AdminCaller", "AgentTok", "Base", "Sess", "Tok", "WsCaller", "control_plane", "machine_names",
           "now", "session", "tx"]


def control_plane(request: Request) -> ControlPlane:
    return request.app.state.cp


async def _control_plane(request: Request) -> ControlPlane:  # the dependency: no thread hop
    return request.app.state.cp


CP = Annotated[ControlPlane, Depends(_control_plane)]


async def session(cp: CP) -> AsyncIterator[Session]:
    s = cp.sessions()  # no connection yet: it is taken on first use, in the route's thread
    try:
        yield s
    finally:
        if s.in_transaction():  # a rollback is a round trip to the database: not on the event loop; shielded,
            with anyio.CancelScope(shield=True):  # so that a request cancelled (its client gone) still hands
                await anyio.to_thread.run_sync(s.close)  # the connection back
        else:
            s.close()


Sess = Annotated[Session, Depends(session)]


async def console_base(cp: CP) -> str:
    """The public base URL that console links in API answers start with."""
    return cp.settings.console_base()


Base = Annotated[str, Depends(console_base)]


def token(s: Sess, authorization: Annotated[str | None, Header()] = None) -> Token:
    return services.authenticate(s, authorization)


Tok = Annotated[Token, Depends(token)]


def ws_caller(org: str, ws: str, s: Sess, authorization: Annotated[str | None, Header()] = None) -> Caller:
    caller = services.user_caller(s, authorization, org, ws)  # authenticated here: one thread hop, not two
    services.hand_back_connection(s)  # see machine_token in routers/agent.py
    return caller


def admin_caller(org: str, s: Sess, authorization: Annotated[str | None, Header()] = None) -> Caller:
    tok = services.authenticate(s, authorization)
    caller = services.org_admin_caller(s, tok, org)
    services.hand_back_connection(s)
    return caller


def agent_token(tok: Tok) -> Token:
    return agents.machine_token(tok)


WsCaller = Annotated[Caller, Depends(ws_caller)]
AdminCaller = Annotated[Caller, Depends(admin_caller)]
AgentTok = Annotated[Token, Depends(agent_token)]


def machine_names(s: Session) -> dict[int, str]:
    return dict(s.execute(select(Machine.id, Machine.name)).all())


def now() -> float:
    return time.time()
