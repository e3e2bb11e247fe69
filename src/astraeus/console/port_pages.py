"""The run page's "Open port": a GET through to an HTTP server inside a running worker, over the same port-forward
session as `astra astraeus port-forward` (one session per request, recorded as a PortForward event; editors only).

What the worker serves is shown on the console's own origin, so it is sandboxed: no script of it runs (it would run
as the signed-in user), no form is sent, and it sets no cookie. Pages, text, JSON and images come through;
applications that need JavaScript (notebooks, dashboards) are for `astra astraeus port-forward`."""

from __future__ import annotations

import http.client
import io
import json
from urllib.parse import quote

import anyio.to_thread
from fastapi import Request, WebSocketDisconnect
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from astraeus import protocol as P
from astraeus.console.base import cp_of, error_page, router, ws_page
from astraeus.server import exec_sessions as X
from astraeus.server import services
from astraeus.server.db import Cluster
from astraeus.server.services import ApiError

ANSWER_MAX_BYTES = 32 << 20  # the most of a worker's answer the console passes on
SANDBOX = {"Content-Security-Policy": "sandbox allow-same-origin", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
PASSED_HEADERS = ("content-type", "content-language", "last-modified", "etag")


def port_number(text: str) -> int:
    """The port a user typed; the range is the API's to check (exec_sessions.open_session)."""
    try:
        return int(text.strip())
    except ValueError:
        raise ApiError(422, "INVALID", f"port: {text!r} is not a TCP port; give one from 1 to 65535") from None


def http_request(path: str, query: str, port: int, accept: str | None) -> bytes:
    """The GET sent to the worker's server: the path below the console's prefix, none of the console's headers."""
    target = "/" + quote(path, safe="/%:@!$&'()*+,;=-._~") + (f"?{query}" if query else "")
    head = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
            "User-Agent: astraeus-console", f"Accept: {accept or '*/*'}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")


class _Bytes:
    def __init__(self, data: bytes):
        self.data = data

    def makefile(self, *_):
        return io.BytesIO(self.data)


def http_answer(raw: bytes, prefix: str) -> Response:
    """The worker server's answer as the console passes it on: its status, body and a few headers, sandboxed; a
    redirect to a path of its own is kept below the console's prefix."""
    r = http.client.HTTPResponse(_Bytes(raw))
    try:
        r.begin()
        body = r.read()
    except (http.client.HTTPException, ValueError) as e:
        raise ApiError(502, "BAD_GATEWAY", f"the worker's server did not answer in HTTP ({e.__class__.__name__}): "
                                           "is it an HTTP server on that port?") from None
    headers = {k: v for k, v in r.getheaders() if k.lower() in PASSED_HEADERS}
    loc = r.getheader("location")
    if loc and loc.startswith("/") and not loc.startswith("//"):
        headers["location"] = prefix + loc
    return Response(body, status_code=r.status, headers={**headers, **SANDBOX})


def _editor(request: Request, org: str, ws: str, cluster: str, name: str):
    """How the session finds its caller: the page's (cookie or bearer), on the run's own cluster."""

    def caller_of(s: Session) -> services.Caller:
        p = ws_page(s, request, org, ws)
        run = services.get_run(s, p.caller, name)
        if s.get(Cluster, run.cluster_id).name != cluster:
            raise ApiError(404, "NOT_FOUND", f"run {name} not found in workspace {ws} on cluster {cluster}")
        return p.caller

    return caller_of


async def _through(p: X.Pending, send: bytes) -> bytes:
    """Send the request through the worker's port-forward session and read its answer until the worker's server
    closes the connection."""
    agent = await X.agent_socket(p)
    try:
        await agent.send_bytes(bytes([P.EXEC_STDIN]) + send)
        await agent.send_text(P.ExecControl(type="eof").model_dump_json())
    except WebSocketDisconnect:
        pass  # the agent ended the session first (nothing answers on the port, say): its reason is read below
    out = bytearray()
    while True:
        msg = await agent.receive()
        if msg["type"] == "websocket.disconnect":
            return bytes(out)
        if msg.get("bytes") is not None:
            out += msg["bytes"][1:]
            if len(out) > ANSWER_MAX_BYTES:
                raise ApiError(502, "BAD_GATEWAY", f"the worker's answer is larger than {ANSWER_MAX_BYTES >> 20} MiB: "
                                                   "use `astra astraeus port-forward` for it")
        elif msg.get("text") is not None:
            ctl = P.ExecControl.model_validate(json.loads(msg["text"]))
            if ctl.type == "error":
                raise ApiError(502, "BAD_GATEWAY", ctl.message or "the port-forward session failed")


@router.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}/open-port")
def open_port(request: Request, org: str, ws: str, cluster: str, name: str, port: str = "", worker: int = 0):
    """The run page's "Open port" form (the worker from its chooser): to the worker's port below the run's page."""
    try:
        n = port_number(port)
    except ApiError as e:
        return error_page(request, e)
    return RedirectResponse(f"/o/{org}/w/{ws}/jobs/{cluster}/{name}/workers/{worker}/ports/{n}/", status_code=303)


@router.get("/o/{org}/w/{ws}/jobs/{cluster}/{name}/workers/{index}/ports/{port}/{path:path}")
async def worker_port(request: Request, org: str, ws: str, cluster: str, name: str, index: int, port: str, path: str):
    """A GET to `path` on `port` inside worker `index` of the run, passed on sandboxed."""
    prefix = f"/o/{org}/w/{ws}/jobs/{cluster}/{name}/workers/{index}/ports/{port}"
    hub = X.hub_of(request.app)
    try:
        n = port_number(port)
        p = await anyio.to_thread.run_sync(X.open_session, cp_of(request), None, org, ws, name, index, [], False,
                                           80, 24, n, _editor(request, org, ws, cluster, name))
    except ApiError as e:
        return error_page(request, e)
    hub.add(p)
    try:
        raw = await _through(p, http_request(path, request.url.query, n, request.headers.get("accept")))
        return http_answer(raw, prefix)
    except ApiError as e:
        return error_page(request, e)
    finally:
        hub.drop(p.info.id)
        await anyio.to_thread.run_sync(X.close_session, cp_of(request), p)  # attached for this request only
