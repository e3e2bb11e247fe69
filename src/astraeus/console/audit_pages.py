"""Settings → Audit (organisation admins): the organisation's audit log, oldest first from `since`, a page at a
time, filtered by user and workspace; read through `astraeus.server.audit` as GET $ORG_API/audit reads it."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from fastapi import Request

from astraeus import usage as U
from astraeus.console.base import admin_page, cp_of, page, render, router
from astraeus.server import audit
from astraeus.server.services import ApiError

AUDIT_PAGE = 50  # entries on one page
SINCE_CHOICES = ("1d", "7d", "30d")


def parse_after(after: str) -> int | None:
    """The page's cursor: the id of the previous page's last entry."""
    if not after.strip():
        return None
    if not after.strip().isdigit():
        raise ApiError(422, "INVALID", f"after={after!r} is not an entry id: give the number in a Next link "
                                       "(or leave it out for the first page)")
    return int(after)


@router.get("/o/{org}/settings/audit")
@page
def audit_log(request: Request, org: str, since: str = "7d", user: str = "", workspace: str = "", after: str = ""):
    since = since.strip() or "7d"
    try:
        start = U.parse_time(since, time.time(), "since")
    except U.UsageError as e:
        raise ApiError(422, "INVALID", str(e)) from None
    cursor = parse_after(after)
    with cp_of(request).sessions() as s:
        p = admin_page(s, request, org)
        rows = audit.page(s, p.caller, start, user.strip() or None, workspace.strip() or None, cursor,
                          AUDIT_PAGE + 1)
        more, rows = len(rows) > AUDIT_PAGE, rows[:AUDIT_PAGE]
        keep = {"since": since, "user": user.strip(), "workspace": workspace.strip()}

        def query(**extra) -> str:
            return "?" + urlencode({k: v for k, v in {**keep, **extra}.items() if v})

        return render(request, "audit.html", p, nav="audit", entries=[audit.entry_view(e) for e in rows],
                      since=since, user=keep["user"], workspace=keep["workspace"], choices=SINCE_CHOICES,
                      first_url=query() if cursor is not None else None,
                      next_url=query(after=str(rows[-1].id)) if more else None, query=query)
