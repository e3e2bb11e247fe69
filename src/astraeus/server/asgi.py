"""ASGI pieces shared by the app's own middlewares (app.RetryConflicts, routers/runs.PlainSubmits,
routers/agent.PlainReports)."""

from __future__ import annotations

import anyio


def replay(messages: list):
    """A `receive` that gives a request's body messages, already read, once more (then waits: only a disconnect
    could come after the body, and none will)."""
    async def receive():
        if messages:
            return messages.pop(0)
        await anyio.sleep_forever()
    return receive


async def read_request(scope, receive) -> tuple[str | None, bool | None, list, bool]:
    """A request's Authorization header (the first one), whether its Content-Type says `application/json` (every
    one it sends; None: it sends none), its body messages as received, and whether they hold the whole body (False:
    something else came first, such as a disconnect). The messages can be given on with replay()."""
    authorization, json_body = None, None
    for k, v in scope["headers"]:
        if k == b"authorization":
            if authorization is None:
                authorization = v.decode("latin-1")
        elif k == b"content-type":
            json_body = json_body is not False and v == b"application/json"
    messages, more = [], True
    while more:
        msg = await receive()
        messages.append(msg)
        if msg["type"] != "http.request":
            return authorization, json_body, messages, False
        more = msg.get("more_body", False)
    return authorization, json_body, messages, True
