"""Who is calling: tokens (stored as digests), the caller in a workspace or an organisation, and roles."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import and_, bindparam, select
from sqlalchemy.orm import Session

from astraeus.server.db import (
    Cluster,
    ConsoleSession,
    Org,
    Token,
    User,
    Workspace,
)
from astraeus.server.services.errors import ApiError
from astraeus.server.state_lock import STATE_LOCK_COLUMNS, STATE_LOCK_PARAMS

ROLES = ("viewer", "editor", "admin")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_ns() -> str:
    return "ws-" + secrets.token_hex(6)




@dataclass
class Caller:
    token: Token | None  # None: the control plane acting for the workspace (system_caller)
    org: Org
    workspace: Workspace | None = None
    role: str | None = None  # viewer | editor | admin (org admins act as admin)
    user: str | None = None  # who: the token's user or service account (`service:NAME`); None: the control plane

    @property
    def org_admin(self) -> bool:
        return self.token is not None and self.token.kind == "org_admin"


def _bearer(authorization: str | None) -> str:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise ApiError(401, "UNAUTHENTICATED", "missing bearer token: send 'Authorization: Bearer $ASTRAEUS_TOKEN'")
    return authorization.split(None, 1)[1].strip()


def _valid(tok: Token | None) -> Token:
    if tok is None or tok.revoked:
        raise ApiError(401, "UNAUTHENTICATED", "the token is not valid (unknown or revoked): ask for a new one")
    if tok.expires_at is not None and tok.expires_at <= time.time():
        raise ApiError(401, "UNAUTHENTICATED", "the token has expired: ask for a new one")
    return tok


TOKEN_BY_DIGEST = select(Token).where(Token.digest == bindparam("digest"))  # built once (see _USER_CALLER)


def authenticate(session: Session, authorization: str | None) -> Token:
    secret = _bearer(authorization)
    return _valid(session.scalar(TOKEN_BY_DIGEST, {"digest": digest(secret)}))


def token_user(session: Session, tok: Token) -> str | None:
    """The name of the user or service account `tok` belongs to (None: a machine's or a join token)."""
    return session.scalar(select(User.name).where(User.id == tok.user_id)) if tok.user_id is not None else None


def _in_workspace(tok: Token, org: Org | None, ws: Workspace | None, org_name: str, ws_name: str,
                  user: str | None = None) -> Caller:
    """The caller `tok` is in workspace `ws` of `org` (as found by their names; None: no such one)."""
    if tok.kind == "machine" or ws is None or org is None or tok.org_id != org.id or (
            tok.kind != "org_admin" and tok.workspace_id != ws.id):
        raise ApiError(404, "NOT_FOUND", f"workspace {org_name}/{ws_name} not found (or this token has no access)")
    return Caller(tok, org, ws, "admin" if tok.kind == "org_admin" else tok.role, user)


def workspace_caller(session: Session, tok: Token, org_name: str, ws_name: str) -> Caller:
    row = session.execute(select(Org, Workspace).join(Workspace, Workspace.org_id == Org.id).where(
        Org.name == org_name, Workspace.name == ws_name)).first()  # one statement for both
    return _in_workspace(tok, *(row or (None, None)), org_name, ws_name, token_user(session, tok))


# The statements each API call (and each agent's report) runs, built once, each call binding its values: building
# a statement anew per call (its clauses, their coercions) cost as much CPU as running it.
_USER_CALLER = (select(Token, Org, Workspace, User.name).select_from(Token)
                .outerjoin(Org, Org.name == bindparam("org"))
                .outerjoin(Workspace, and_(Workspace.org_id == Org.id, Workspace.name == bindparam("ws")))
                .outerjoin(User, User.id == Token.user_id)
                .where(Token.digest == bindparam("digest")))


_USER_CALLER_LOCKING = _USER_CALLER.add_columns(*STATE_LOCK_COLUMNS)


def user_caller(session: Session, authorization: str | None, org_name: str, ws_name: str,
                lock: bool = False) -> Caller:
    """The caller of a workspace's user endpoint from its Authorization header (routers/deps.ws_caller, and the
    group-commit writer for a batch's submits): a machine token is refused. The token, the organisation and the
    workspace are read in one statement (each API call's first round trip, and on PostgreSQL its only one for
    this), with the same refusals in the same order as authenticate() then workspace_caller().

    `lock` (PostgreSQL): the same statement also takes the state lock (state_lock.lock_state's) when it finds the token,
    whether or not the caller is then refused; not found, no lock is taken."""
    secret = _bearer(authorization)
    params = {"org": org_name, "ws": ws_name, "digest": digest(secret)}
    if lock:
        params.update(STATE_LOCK_PARAMS)
    row = session.execute(_USER_CALLER_LOCKING if lock else _USER_CALLER, params).first()
    tok = _valid(row[0] if row is not None else None)
    if tok.kind == "machine":
        raise ApiError(403, "FORBIDDEN", "a machine token cannot call user endpoints")
    return _in_workspace(tok, row[1], row[2], org_name, ws_name, row[3])


def org_admin_caller(session: Session, tok: Token, org_name: str) -> Caller:
    org = session.scalar(select(Org).where(Org.name == org_name))
    if org is None or tok.org_id != org.id:
        raise ApiError(404, "NOT_FOUND", f"organisation {org_name} not found (or this token has no access)")
    if tok.kind != "org_admin":
        raise ApiError(403, "FORBIDDEN", "this needs an organisation admin token")
    return Caller(tok, org, None, "admin", token_user(session, tok))


def require(caller: Caller, role: str) -> None:
    if ROLES.index(caller.role or "viewer") < ROLES.index(role):
        raise ApiError(403, "FORBIDDEN", f"this needs the {role} role in workspace {caller.workspace.name}; "
                                         f"this token has the {caller.role} role")


def create_token(session: Session, org: Org, kind: str, workspace: Workspace | None = None, role: str | None = None,
                 cluster: Cluster | None = None, expires_in: float | None = None,
                 user: User | None = None) -> tuple[Token, str]:
    prefix = {"user": "ast_u_", "org_admin": "ast_o_", "machine": "ast_m_"}[kind]
    secret = prefix + secrets.token_urlsafe(32)
    tok = Token(digest=digest(secret), kind=kind, org_id=org.id, workspace_id=workspace.id if workspace else None,
                role=role, cluster_id=cluster.id if cluster else None,
                expires_at=time.time() + expires_in if expires_in else None, user_id=user.id if user else None)
    session.add(tok)
    session.flush()
    return tok, secret




def system_caller(session: Session, workspace: Workspace) -> Caller:
    """An editor of `workspace`, for what the control plane does on its behalf (a schedule's tick, a group's
    replacement): every rule a person's submit meets (the priority cap, drives, names) is met the same way."""
    return Caller(token=None, org=session.get(Org, workspace.org_id), workspace=workspace, role="editor")


# ------------------------------------------------------------------------------------------- console sessions
CONSOLE_COOKIE = "astraeus_session"  # a console session's own secret (never the API token)


def own_origins(scheme: str, host: str, forwarded_proto: str | None, public_url: str | None) -> set[str]:
    """The origins the console is reached at: the request's own (scheme as X-Forwarded-Proto says, else as the
    connection is; ws/wss count as http/https) and ASTRAEUS_PUBLIC_URL's."""
    scheme = (forwarded_proto or scheme).split(",")[0].strip().lower()
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    out = {f"{scheme}://{host}".lower()}
    if public_url:
        u = urlsplit(public_url)
        out.add(f"{u.scheme}://{u.netloc}".lower())
    return out


def live_console_session(session: Session, secret: str | None) -> ConsoleSession | None:
    """The signed-in console session a cookie's secret names, when it is live (not signed out, not expired)."""
    if not secret:
        return None
    cs = session.scalar(select(ConsoleSession).where(ConsoleSession.digest == digest(secret)))
    if cs is None or cs.revoked or cs.expires_at <= time.time():
        return None
    return cs


def open_console_session(session: Session, tok: Token, hours: float) -> str:
    """A new console session acting as `tok` (signed in by token or by single sign-on): the cookie's secret."""
    cookie = "ast_c_" + secrets.token_urlsafe(32)
    at = time.time()
    session.add(ConsoleSession(digest=digest(cookie), csrf=secrets.token_urlsafe(32), token_id=tok.id, created_at=at,
                               expires_at=at + hours * 3600))
    session.flush()
    return cookie


def console_token(session: Session, cs: ConsoleSession | None) -> Token:
    """The API token a live console session acts as."""
    if cs is None:
        raise ApiError(401, "UNAUTHENTICATED", "sign in to the console")
    tok = session.get(Token, cs.token_id)
    if tok is None or tok.revoked or (tok.expires_at is not None and tok.expires_at <= time.time()):
        raise ApiError(401, "UNAUTHENTICATED", "the token this console signed in with is no longer valid")
    if tok.kind == "machine":
        raise ApiError(403, "FORBIDDEN", "a machine token cannot call user endpoints")
    return tok


@dataclass
class ConsoleCredential:
    """What a browser's WebSocket brings instead of an Authorization header (it cannot set one): the console
    session's cookie, its CSRF token (a query parameter), the Origin header and the origins that are the console."""

    secret: str | None
    csrf: str
    origin: str | None
    origins: set[str]


def console_ws_caller(session: Session, cred: ConsoleCredential, org_name: str, ws_name: str) -> Caller:
    """The caller of a WebSocket signed in by the console's cookie. A browser sends the cookie whichever site opens
    the socket, so the Origin must be the console's own (cross-site WebSocket hijacking) and the CSRF token the
    session's."""
    if cred.origin is None or cred.origin.lower() not in cred.origins:
        raise ApiError(403, "FORBIDDEN", f"this session was opened from another site ({cred.origin or 'no Origin'}), "
                                         "not from this console: open the run's page in the console and use its "
                                         "terminal there")
    cs = live_console_session(session, cred.secret)
    tok = console_token(session, cs)
    if not hmac.compare_digest(cred.csrf.encode(), cs.csrf.encode()):
        raise ApiError(403, "FORBIDDEN", "the session's CSRF token is missing or wrong (an old page): reload the "
                                         "run's page and open the terminal again")
    return workspace_caller(session, tok, org_name, ws_name)
