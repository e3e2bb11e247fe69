"""The audit log (issue 45): every change asked of the control plane, who asked, from where, and its answer.

`Audited` is one ASGI middleware around the whole app: each request that may change something (not GET, HEAD or
OPTIONS; not an agent's report) is written down once its answer has started, allowed (2xx/3xx) or refused (4xx,
5xx), with the caller resolved from its token or console session. Only the method, path and status are kept:
never a body, a query or a header, so no secret (token, password, registry credential) reaches it.

`describe` decides what an entry says (pure); `record` and `trim` write; `page` reads. Nothing updates or
deletes an entry but `trim`, after `audit_retention_days`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import anyio.to_thread
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from astraeus.server.db import AuditEntry, ConsoleSession, Token, User
from astraeus.server.services import Caller, digest, iso

QUIET = frozenset({"GET", "HEAD", "OPTIONS"})
ACTIONS = {"POST": "create", "PUT": "update", "PATCH": "update", "DELETE": "delete"}
_ORG_PATH = re.compile(r"^(?:/api/v1)?/o/([^/]+)(?:/w/([^/]+))?(?:/(.*))?$")
_NOT_AUDITED = ("/api/v1/agent", "/api/v1/machines/", "/metrics", "/healthz", "/readyz")
TRIM_EVERY = 3600.0  # seconds between two trims of old entries, per server process


@dataclass(frozen=True)
class Described:
    org: str | None
    workspace: str | None
    action: str
    object: str


def audited(method: str, path: str) -> bool:
    return method not in QUIET and not path.startswith(_NOT_AUDITED)


def describe(method: str, path: str) -> Described:
    """What an entry says of a request: its organisation and workspace (from the path), its action and object
    (`runs/hello`, `users/alice/tokens`)."""
    m = _ORG_PATH.match(path)
    org, ws, rest = (m.group(1), m.group(2), m.group(3) or "") if m else (None, None, path.lstrip("/"))
    action = ACTIONS.get(method, method.lower())
    if method == "POST" and rest.count("/") >= 2 and not rest.endswith("/tokens"):
        action = rest.rsplit("/", 1)[1][:16]  # an action on an object: runs/x/cancel, runs/x/hold
    return Described(org, ws, action, rest[:200])


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k == name:
            return v.decode("latin-1")
    return None


def _cookie(scope, name: str) -> str | None:
    raw = _header(scope, b"cookie") or ""
    for part in raw.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def who(s: Session, authorization: str | None, cookie: str | None) -> str | None:
    """The name of the user behind a request's bearer token, or behind its console session; None: unknown."""
    tok = None
    if authorization and authorization.lower().startswith("bearer "):
        tok = s.scalar(select(Token).where(Token.digest == digest(authorization.split(None, 1)[1].strip())))
    elif cookie:
        cs = s.scalar(select(ConsoleSession).where(ConsoleSession.digest == digest(cookie)))
        tok = s.get(Token, cs.token_id) if cs is not None else None
    if tok is None:
        return None
    if tok.user_id is not None:
        return s.scalar(select(User.name).where(User.id == tok.user_id))
    return f"token:{tok.id}"  # a token with no owner (a machine's, or a join token)


def record(sessions, scope, status: int, cookie_name: str) -> None:
    """Write one entry for the request `scope` answered `status` (its own transaction)."""
    d = describe(scope["method"], scope["path"])
    client = scope.get("client")
    with sessions() as s, s.begin():
        s.add(AuditEntry(org=d.org, time=time.time(), workspace=d.workspace, action=d.action,
                         method=scope["method"], path=scope["path"][:500], object=d.object,
                         address=client[0][:64] if client else None, status=status, allowed=status < 400,
                         user=who(s, _header(scope, b"authorization"), _cookie(scope, cookie_name))))


def trim(s: Session, retention_days: float, now: float) -> int:
    """Remove the entries older than the retention; returns how many went."""
    return s.execute(delete(AuditEntry).where(AuditEntry.time < now - retention_days * 86400)).rowcount or 0


class Audited:
    """The middleware: the app's answer goes out as it is, then its entry is written (a failure to write one is
    not the client's: it is logged). Outermost, so a 401, 403 or 413 answered by any layer is in the log too."""

    def __init__(self, app, cp, cookie_name: str):
        self.app, self.cp, self.cookie_name = app, cp, cookie_name
        self.trimmed = 0.0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not audited(scope["method"], scope["path"]):
            return await self.app(scope, receive, send)
        status = 500

        async def sending(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, sending)
        finally:
            await anyio.to_thread.run_sync(self._write, scope, status)

    def _write(self, scope, status: int) -> None:
        import logging

        try:
            record(self.cp.sessions, scope, status, self.cookie_name)
            now = time.time()
            if now - self.trimmed > TRIM_EVERY:
                self.trimmed = now
                with self.cp.sessions() as s, s.begin():
                    trim(s, self.cp.settings.audit_retention_days, now)
        except Exception:  # the answer has gone; the entry's loss is logged, not the client's error
            logging.getLogger("astraeus.audit").exception("audit entry not written for %s %s", scope["method"],
                                                          scope["path"])


# --------------------------------------------------------------------------------------------- reading


def entry_view(e: AuditEntry) -> dict:
    return {"id": e.id, "time": iso(e.time), "user": e.user, "workspace": e.workspace, "action": e.action,
            "method": e.method, "path": e.path, "object": e.object, "address": e.address, "status": e.status,
            "allowed": e.allowed}


def page(s: Session, c: Caller, since: float | None, user: str | None, workspace: str | None,
         after: int | None, limit: int) -> list[AuditEntry]:
    """The organisation's entries, oldest first from `since` (epoch seconds), after the entry id `after` (a
    page's last), at most `limit`."""
    q = select(AuditEntry).where(AuditEntry.org == c.org.name)
    if since is not None:
        q = q.where(AuditEntry.time >= since)
    if user:
        q = q.where(AuditEntry.user == user)
    if workspace:
        q = q.where(AuditEntry.workspace == workspace)
    if after is not None:
        q = q.where(AuditEntry.id > after)
    return list(s.scalars(q.order_by(AuditEntry.id).limit(limit)))
