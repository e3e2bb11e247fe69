"""The organisation's users and service accounts, their roles per workspace and their tokens (docs/users.md).
Organisation admins only; services/users.py decides."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from pydantic import Field

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server.routers.deps import AdminCaller, Sess, tx
from astraeus.server.services import users

router = APIRouter(prefix="/api/v1/o/{org}", tags=["organisation"], responses=B.ERRORS)


class UserCreate(B.Loose):
    name: str = Field(max_length=80, description="alice (a DNS label), or service:NAME for a service account")
    display_name: str | None = None
    email: str | None = None
    org_admin: bool = False
    roles: dict[str, str | None] | None = Field(None, description="{workspace: viewer|editor|admin}")


class UserPatch(B.Loose):
    display_name: str | None = None
    email: str | None = None
    org_admin: bool | None = None
    roles: dict[str, str | None] | None = Field(None, description="{workspace: role}; a null role takes it away")


class UserToken(B.Loose):
    kind: str = Field("user", description="user (a workspace token) or org_admin")
    workspace: str | None = None
    role: str | None = Field(None, description="at most the user's role there; default: that role")
    expires_in_seconds: Annotated[float, Field(gt=0, le=10 * 366 * 86400)] | None = None


class UserOut(A.Out):
    name: str
    kind: str = Field(description="person | service")
    display_name: str
    email: str | None
    org_admin: bool
    roles: dict[str, str]
    created_at: A.Time | None


class UserList(A.Out):
    items: list[UserOut]


class UserDeleted(A.Out):
    name: str
    deleted: bool


class UserTokenIssued(A.TokenIssued):
    user: str
    workspace: str | None = None


@router.get("/users", response_model=UserList, response_model_exclude_unset=True)
def list_users(c: AdminCaller, s: Sess):
    return {"items": users.list_users(s, c)}


@router.post("/users", status_code=201, response_model=UserOut, response_model_exclude_unset=True)
def create_user(c: AdminCaller, s: Sess, body: Annotated[UserCreate, Body()]):
    with tx(s):
        return users.create_user(s, c, body.model_dump(exclude_unset=True))


@router.get("/users/{name}", response_model=UserOut, response_model_exclude_unset=True)
def get_user(name: str, c: AdminCaller, s: Sess):
    return users.user_out(s, users.user_named(s, c, name))


@router.patch("/users/{name}", response_model=UserOut, response_model_exclude_unset=True)
def patch_user(name: str, c: AdminCaller, s: Sess, body: Annotated[UserPatch, Body()]):
    with tx(s):
        return users.update_user(s, c, name, body.model_dump(exclude_unset=True))


@router.delete("/users/{name}", response_model=UserDeleted, response_model_exclude_unset=True)
def delete_user(name: str, c: AdminCaller, s: Sess):
    with tx(s):
        users.delete_user(s, c, name)
    return {"name": name, "deleted": True}


@router.post("/users/{name}/tokens", status_code=201, response_model=UserTokenIssued,
             response_model_exclude_unset=True)
def create_user_token(name: str, c: AdminCaller, s: Sess, body: Annotated[UserToken, Body()]):
    """A token of the user; its secret is shown this once."""
    with tx(s):
        return users.issue_user_token(s, c, name, body.model_dump(exclude_unset=True))
