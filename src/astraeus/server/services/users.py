"""An organisation's users and service accounts, their roles per workspace, and their tokens (issue 45).

Callers are organisation admins (`org_admin_caller`); routers/users.py and the console only call these. A token
made for a user acts with a role no higher than the user's in that workspace; what it creates records the user's
name (`metadata.created_by`)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus.server.db import Org, Token, User, UserRole, Workspace
from astraeus.server.services.auth import ROLES, Caller, create_token
from astraeus.server.services.errors import ApiError
from astraeus.server.services.views import iso

SERVICE = "service:"  # a service account's name starts with it: `service:ci`


def check_role(role, where: str) -> str:
    if role not in ROLES:
        raise ApiError(422, "INVALID", f"{where}: unknown role {role!r}: give viewer, editor or admin")
    return role


def check_user_name(name) -> str:
    """A person's name is a DNS label (`alice`); a service account's is `service:` and one (`service:ci`)."""
    bare = name[len(SERVICE):] if isinstance(name, str) and name.startswith(SERVICE) else name
    try:
        S.check_dns_label(bare, "user name")
    except (ValueError, TypeError) as e:
        raise ApiError(422, "INVALID", f"name: {e} (a service account: service:NAME)") from None
    return name


def user_out(s: Session, u: User) -> dict:
    rows = s.execute(select(Workspace.name, UserRole.role).join(UserRole, UserRole.workspace_id == Workspace.id)
                     .where(UserRole.user_id == u.id).order_by(Workspace.name)).all()
    return {"name": u.name, "kind": u.kind, "display_name": u.display_name, "email": u.email,
            "org_admin": u.org_admin, "roles": dict(rows), "created_at": iso(u.created_at)}


def user_named(s: Session, c: Caller, name: str) -> User:
    u = s.scalar(select(User).where(User.org_id == c.org.id, User.name == name))
    if u is None:
        raise ApiError(404, "NOT_FOUND", f"user {name} not found in organisation {c.org.name}")
    return u


def _workspace(s: Session, org_id: int, name: str, where: str) -> Workspace:
    ws = s.scalar(select(Workspace).where(Workspace.org_id == org_id, Workspace.name == name))
    if ws is None:
        raise ApiError(422, "INVALID", f"{where}: no workspace named {name!r}: create it first or name another")
    return ws


def _set_roles(s: Session, u: User, roles: dict) -> None:
    """Set the user's role in each named workspace; a null role takes the user's access there away."""
    if not isinstance(roles, dict):
        raise ApiError(422, "INVALID", "roles: give an object {workspace: viewer|editor|admin}")
    for ws_name, role in roles.items():
        ws = _workspace(s, u.org_id, ws_name, f"roles.{ws_name}")
        if role is not None:
            check_role(role, f"roles.{ws_name}")
        row = s.scalar(select(UserRole).where(UserRole.user_id == u.id, UserRole.workspace_id == ws.id))
        if role is None:
            if row is not None:
                s.delete(row)
        elif row is None:
            s.add(UserRole(user_id=u.id, workspace_id=ws.id, role=role))
        else:
            row.role = role
    s.flush()


def _fields(u: User, body: dict) -> None:
    if "display_name" in body:
        u.display_name = str(body["display_name"] or "")[:200]
    if "email" in body:
        email = body["email"]
        if email is not None and (not isinstance(email, str) or "@" not in email or len(email) > 255):
            raise ApiError(422, "INVALID", f"email: {email!r} is not an email address (name@example.org)")
        u.email = email
    if "org_admin" in body:
        if not isinstance(body["org_admin"], bool):
            raise ApiError(422, "INVALID", "org_admin: give true or false")
        u.org_admin = body["org_admin"]


def create_user(s: Session, c: Caller, body: dict) -> dict:
    name = check_user_name(body.get("name"))
    if s.scalar(select(User.id).where(User.org_id == c.org.id, User.name == name)):
        raise ApiError(409, "ALREADY_EXISTS", f"a user named {name} already exists: pick another name, or change "
                                              f"that one (PATCH users/{name})")
    u = User(org_id=c.org.id, name=name, kind="service" if name.startswith(SERVICE) else "person",
             display_name="", org_admin=False)
    _fields(u, body)
    s.add(u)
    s.flush()
    _set_roles(s, u, body.get("roles") or {})
    return user_out(s, u)


def list_users(s: Session, c: Caller) -> list[dict]:
    return [user_out(s, u) for u in s.scalars(select(User).where(User.org_id == c.org.id).order_by(User.name))]


def update_user(s: Session, c: Caller, name: str, body: dict) -> dict:
    u = user_named(s, c, name)
    _fields(u, body)
    if "roles" in body:
        _set_roles(s, u, body["roles"] or {})
    return user_out(s, u)


def delete_user(s: Session, c: Caller, name: str) -> None:
    """The user goes, and its tokens stop working (revoked; they keep no owner). What it made keeps its name."""
    u = user_named(s, c, name)
    for t in s.scalars(select(Token).where(Token.user_id == u.id)):
        t.revoked, t.user_id = True, None
    s.execute(delete(UserRole).where(UserRole.user_id == u.id))
    s.delete(u)
    s.flush()


def issue_user_token(s: Session, c: Caller, name: str, body: dict) -> dict:
    """A token of user `name`: in `workspace` with `role` (default: the user's role there, and never above it), or
    an organisation admin token (`kind: org_admin`) of an org admin user. The only time its secret is shown."""
    u = user_named(s, c, name)
    org = s.get(Org, c.org.id)
    expires = body.get("expires_in_seconds")
    if expires is not None and (not isinstance(expires, int | float) or expires <= 0):
        raise ApiError(422, "INVALID", "expires_in_seconds: give a positive number of seconds")
    if body.get("kind") == "org_admin":
        if not u.org_admin:
            raise ApiError(403, "FORBIDDEN", f"user {name} is not an organisation admin: make it one first "
                                             f"(PATCH users/{name} with org_admin: true)")
        tok, secret = create_token(s, org, "org_admin", expires_in=expires, user=u)
        return {"id": tok.id, "kind": "org_admin", "role": None, "user": u.name, "token": secret}
    if body.get("kind", "user") != "user":
        raise ApiError(422, "INVALID", "kind: give user (a workspace token) or org_admin")
    ws_name = body.get("workspace")
    if not ws_name:
        raise ApiError(422, "INVALID", "workspace: name the workspace the token acts in")
    ws = _workspace(s, org.id, ws_name, "workspace")
    held = s.scalar(select(UserRole.role).where(UserRole.user_id == u.id, UserRole.workspace_id == ws.id))
    if held is None and u.org_admin:
        held = "admin"
    if held is None:
        raise ApiError(403, "FORBIDDEN", f"user {name} has no role in workspace {ws_name}: give it one first "
                                         f"(PATCH users/{name} with roles: {{{ws_name}: viewer|editor|admin}})")
    role = check_role(body.get("role", held), "role")
    if ROLES.index(role) > ROLES.index(held):
        raise ApiError(403, "FORBIDDEN", f"role {role} is above user {name}'s role in workspace {ws_name} ({held}): "
                                         f"give {held} or less")
    tok, secret = create_token(s, org, "user", ws, role, expires_in=expires, user=u)
    return {"id": tok.id, "kind": "user", "role": role, "workspace": ws_name, "user": u.name, "token": secret}


def ensure_user(s: Session, org: Org, name: str, *, org_admin: bool = False, display_name: str = "",
                roles: dict[Workspace, str] | None = None) -> User:
    """The user (or service account) `name`, made if missing (start-up's `admin`, the tokens of the token
    endpoint), with at least `roles`."""
    u = s.scalar(select(User).where(User.org_id == org.id, User.name == name))
    if u is None:
        u = User(org_id=org.id, name=name, kind="service" if name.startswith(SERVICE) else "person",
                 display_name=display_name, org_admin=org_admin)
        s.add(u)
        s.flush()
    for ws, role in (roles or {}).items():
        if not s.scalar(select(UserRole.id).where(UserRole.user_id == u.id, UserRole.workspace_id == ws.id)):
            s.add(UserRole(user_id=u.id, workspace_id=ws.id, role=role))
    s.flush()
    return u


def owner_for(s: Session, org: Org, kind: str, ws: Workspace | None, role: str | None) -> User | None:
    """Who a token made without a user belongs to (`POST $ORG_API/tokens`, as revision 0018 did for older ones):
    an org admin token the user `admin`; a workspace token the service account `service:<workspace>-<role>`."""
    if kind == "org_admin":
        return ensure_user(s, org, "admin", org_admin=True, display_name="Organisation admin")
    if kind == "user" and ws is not None:
        return ensure_user(s, org, f"{SERVICE}{ws.name}-{role}", display_name=f"tokens of workspace {ws.name} "
                                                                         f"({role})", roles={ws: role or "viewer"})
    return None
