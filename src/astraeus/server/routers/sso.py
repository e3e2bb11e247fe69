"""Single sign-on (docs/users.md "Single sign-on"): the organisation's OpenID Connect provider, set by an org admin,
and the exchange of an ID token (`astra login --sso`) for a token of its user. services/sso.py decides."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from pydantic import Field

from astraeus.server import answers as A
from astraeus.server import bodies as B
from astraeus.server.routers.deps import AdminCaller, Sess, tx
from astraeus.server.services import sso

router = APIRouter(prefix="/api/v1/o/{org}", tags=["organisation"], responses=B.ERRORS)


class SsoConfig(B.Loose):
    name: str | None = Field(None, description='the sign-in button says "Sign in with NAME"; default: the host')
    issuer: str | None = Field(None, description="the provider's issuer URL, as its discovery document says")
    client_id: str | None = Field(None, description="the console's client (authorization code + PKCE)")
    client_secret: str | None = Field(None, description="the console client's secret; kept, never shown back")
    cli_client_id: str | None = Field(None, description="astra login --sso's client (device flow), a public client")
    match_by: str | None = Field(None, description="sub (default) or email: how a signed-in person is found")
    groups_claim: str | None = Field(None, description="the ID token's claim listing the groups (default: groups)")
    roles: dict[str, dict[str, str]] | None = Field(None, description='{group: {workspace: role}}')


class SsoConfigOut(A.Out):
    configured: bool
    name: str | None = None
    issuer: str | None = None
    client_id: str | None = None
    client_secret_set: bool | None = Field(None, description="whether a secret is kept (it is never shown)")
    cli_client_id: str | None = None
    match_by: str | None = None
    groups_claim: str | None = None
    roles: dict[str, dict[str, str]] | None = None


class SsoCli(A.Out):
    issuer: str
    client_id: str
    scope: str


class SsoToken(B.Loose):
    id_token: str = Field(description="the ID token the provider gave astra by the device flow")
    workspace: str | None = Field(None, description="the workspace the token acts in; default: the first mapped")


class SsoTokenIssued(A.TokenIssued):
    user: str
    workspace: str


@router.get("/sso", response_model=SsoConfigOut, response_model_exclude_unset=True)
def get_sso(c: AdminCaller, s: Sess):
    return sso.config_out(sso.provider_of(s, c.org))


@router.put("/sso", response_model=SsoConfigOut, response_model_exclude_unset=True)
def put_sso(c: AdminCaller, s: Sess, body: Annotated[SsoConfig, Body()]):
    """Set the provider (a field left out keeps its value); refused with what to change, nothing stored."""
    with tx(s):
        return sso.set_config(s, c, body.model_dump(exclude_unset=True))


@router.delete("/sso", response_model=SsoConfigOut, response_model_exclude_unset=True)
def delete_sso(c: AdminCaller, s: Sess):
    with tx(s):
        sso.delete_config(s, c)
    return {"configured": False}


@router.get("/sso/cli", response_model=SsoCli)
def sso_cli(org: str, s: Sess):
    """Where astra's device flow starts (no token needed: it is how one gets a token)."""
    return sso.cli_client(s, org)


@router.post("/sso/token", status_code=201, response_model=SsoTokenIssued)
def sso_token(org: str, s: Sess, body: Annotated[SsoToken, Body()]):
    """The provider's ID token → a token of its user (roles from its groups); the secret is shown this once."""
    with tx(s):
        return sso.token_for_id_token(s, org, body.model_dump())
