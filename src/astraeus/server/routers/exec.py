"""Sessions into running workers: the user's WebSockets (exec, shell, port-forward) and the agent's side of them
(a long-poll for new sessions and the WebSocket it opens back). Pairing, checks and events: exec_sessions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from astraeus import protocol as P
from astraeus.server import agents, services
from astraeus.server import exec_sessions as X
from astraeus.server.routers.agent import LONG_POLL_MAX
from astraeus.server.routers.workspace import PREFIX
from astraeus.server.services import ApiError

router = APIRouter()


async def _refuse(websocket: WebSocket, status: int, code: str, message: str, frame: bool = False) -> None:
    """An HTTP answer to the WebSocket handshake (the server supports it), else an error frame and a close. `frame`:
    the frame always (a browser's socket never shows its script an HTTP answer's body)."""
    if not frame:
        with contextlib.suppress(RuntimeError):
            return await websocket.send_denial_response(JSONResponse({"code": code, "message": message},
                                                                     status_code=status))
    await websocket.accept()
    await websocket.send_text(P.ExecControl(type="error", code=status, message=message).model_dump_json())
    await websocket.close(4000 + status if status < 1000 else 4000)


def _console(websocket: WebSocket) -> services.ConsoleCredential | None:
    """A browser's credential (the console's terminal), when the socket brings no Authorization header and the
    console's cookie."""
    h = websocket.headers
    if h.get("authorization") or services.CONSOLE_COOKIE not in websocket.cookies:
        return None
    origins = services.own_origins(websocket.url.scheme, h.get("host") or websocket.url.netloc,
                                   h.get("x-forwarded-proto"), websocket.app.state.cp.settings.public_url)
    return services.ConsoleCredential(secret=websocket.cookies[services.CONSOLE_COOKIE],
                                      csrf=websocket.query_params.get("csrf", ""), origin=h.get("origin"),
                                      origins=origins)


async def _session(websocket: WebSocket, org: str, ws: str, name: str, worker: int, command: list[str], tty: bool,
                   cols: int, rows: int, port: int | None) -> None:
    cp = websocket.app.state.cp
    hub = X.hub_of(websocket.app)
    console = _console(websocket)
    try:
        p = await anyio.to_thread.run_sync(X.open_session, cp, websocket.headers.get("authorization"), org, ws, name,
                                           worker, command, tty, cols, rows, port,
                                           None if console is None else functools.partial(
                                               services.console_ws_caller, cred=console, org_name=org, ws_name=ws))
    except ApiError as e:
        return await _refuse(websocket, e.status, e.code, e.message, frame=console is not None)
    hub.add(p)
    try:
        await websocket.accept()
        try:
            agent_ws: WebSocket = await X.agent_socket(p)
        except ApiError as e:
            await websocket.send_text(P.ExecControl(type="error", message=e.message).model_dump_json())
            await websocket.close()
            return
        await _pair(websocket, agent_ws)
    finally:
        hub.drop(p.info.id)
        await anyio.to_thread.run_sync(X.close_session, cp, p)


async def _pass(src: WebSocket, dst: WebSocket) -> None:
    """Frames from src to dst as they came (text or binary), until src ends."""
    while True:
        msg = await src.receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("bytes") is not None:
            await dst.send_bytes(msg["bytes"])
        elif msg.get("text") is not None:
            await dst.send_text(msg["text"])


async def _pair(user: WebSocket, agent: WebSocket) -> None:
    tasks = [asyncio.create_task(_pass(user, agent)), asyncio.create_task(_pass(agent, user))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        for w in (user, agent):
            with contextlib.suppress(Exception):
                await w.close()


@router.websocket(PREFIX + "/runs/{name}/exec")
async def run_exec(websocket: WebSocket, org: str, ws: str, name: str, worker: int = 0,
                   command: Annotated[list[str] | None, Query()] = None, tty: bool = False, cols: int = 80,
                   rows: int = 24) -> None:
    """Run `command` (repeat it: one argument each) in the worker, or a shell with `tty` and no command."""
    await _session(websocket, org, ws, name, worker, list(command or []), tty, cols, rows, None)


@router.websocket(PREFIX + "/runs/{name}/port-forward")
async def run_port_forward(websocket: WebSocket, org: str, ws: str, name: str, port: int, worker: int = 0) -> None:
    """One TCP connection to `port` inside the worker: binary frames both ways."""
    await _session(websocket, org, ws, name, worker, [], False, 80, 24, port)


# ------------------------------------------------------------------------------------------- the agent's side
def _machine_id(cp, authorization: str | None, machine: str) -> int:
    with cp.sessions() as s:
        return agents.caller_machine(s, authorization, machine).id


@router.get("/api/v1/agent/exec-sessions", include_in_schema=False, response_model=P.ExecSessions)
async def agent_exec_sessions(request: Request, machine: str,
                              wait: Annotated[float, Query(ge=0, le=LONG_POLL_MAX)] = 0,
                              authorization: Annotated[str | None, Header()] = None) -> P.ExecSessions:
    """Long-poll: the sessions users opened into this machine's workers."""
    mid = await anyio.to_thread.run_sync(_machine_id, request.app.state.cp, authorization, machine)
    return P.ExecSessions(sessions=await X.hub_of(request.app).take(mid, wait))


@router.websocket("/api/v1/agent/exec-sessions/{sid}")
async def agent_exec_session(websocket: WebSocket, sid: str, machine: str) -> None:
    """The agent's side of session `sid`, paired with the user's (which then passes the frames)."""
    cp = websocket.app.state.cp
    try:
        mid = await anyio.to_thread.run_sync(_machine_id, cp, websocket.headers.get("authorization"), machine)
    except ApiError as e:
        return await _refuse(websocket, e.status, e.code, e.message)
    p = X.hub_of(websocket.app).sessions.get(sid)
    if p is None or p.machine_id != mid or p.agent.done():
        return await _refuse(websocket, 404, "NOT_FOUND", f"no session {sid} waits for machine {machine}: the user "
                                                          "has gone, or it was opened already")
    await websocket.accept()
    p.agent.set_result(websocket)
    with contextlib.suppress(WebSocketDisconnect):
        await p.done.wait()  # the user's side passes this socket's frames; it ends the session
