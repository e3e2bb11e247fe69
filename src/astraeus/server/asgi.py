"""ASGI pieces shared by the app's own middlewares (app.RetryConflicts, routers/runs.PlainSubmits)."""

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
