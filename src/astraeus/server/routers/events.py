"""The workspace's events, newest first; and how the workspace's lists are paged.

A list answer is `{"items": [...], "next_cursor": str | null}`: at most `limit` items (default 100, at most
1000), and `next_cursor` gives the next page (`?cursor=`), null on the last one. A cursor is opaque to clients:
the last item's sort key, so a page never repeats or skips an item whatever is added or deleted meanwhile."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server import services
from astraeus.server.db import Event
from astraeus.server.routers.deps import Sess, WsCaller
from astraeus.server.routers.workspace import PREFIX
from astraeus.server.services import ApiError

router = APIRouter(prefix=PREFIX, tags=["workspace"], responses=B.ERRORS)

PAGE_DEFAULT = 100
PAGE_MAX = 1000
Limit = Annotated[int, Query(ge=1, le=PAGE_MAX, description=f"the most items in one page (1-{PAGE_MAX})")]
Cursor = Annotated[str | None, Query(max_length=512, description="the previous page's next_cursor")]


def encode_cursor(key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, kinds: Sequence[type]) -> tuple | None:
    """The sort key a cursor holds (one value of each of `kinds`), None for the first page; a 422 naming `cursor`
    for anything that is not a next_cursor of this list."""
    if cursor is None:
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        key = None
    if (not isinstance(key, list) or len(key) != len(kinds)
            or not all(type(v) is k and (k is not int or -B.INT32 <= v <= B.INT32)
                       for v, k in zip(key, kinds, strict=True))):
        raise ApiError(422, "INVALID", "cursor: not a next_cursor of this list: give the next_cursor of the previous "
                                       "page's answer, or no cursor for the first page")
    return tuple(key)


def page(rows: list, limit: int, key: Callable[[Any], Sequence[Any]], view: Callable[[Any], dict]) -> dict:
    """The answer for `rows` read with limit + 1: the first `limit` shown, and a cursor when there are more."""
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": [view(r) for r in rows], "next_cursor": encode_cursor(key(rows[-1])) if more else None}


@router.get("/events", response_model=A.EventPage, response_model_exclude_unset=True)
def list_events(c: WsCaller, s: Sess, limit: Limit = PAGE_DEFAULT, cursor: Cursor = None):
    after = decode_cursor(cursor, (int,))
    q = select(Event).where(Event.workspace_id == c.workspace.id)
    if after is not None:
        q = q.where(Event.id < after[0])
    rows = list(s.scalars(q.order_by(Event.id.desc()).limit(limit + 1)))
    return page(rows, limit, lambda e: (e.id,), services.event_view)
