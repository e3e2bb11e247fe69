"""A workspace's credentials for image registries (docs/api.md, "Registries"), as Kubernetes' imagePullSecrets
and dstack's registry_auth give them: one username and password (or access token) per registry host[:port].

Who may do what follows the workspace's roles, as for runs and their secret env values: editors and admins set
and delete them (whoever may submit a run may say how its image is pulled); every member lists them, a viewer
without the username. The password is never returned, logged or put in an event; it is stored as a secret env
value is (in the database, which is 0600 on SQLite), and it reaches only the machine that pulls the image of one
of the workspace's own runs (astraeus.server.agents.assignments). Another workspace's credential is never used or
seen: every query is by the caller's workspace.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.imageref import DOCKER_HUB, ImageRef
from astraeus.server import lifecycle
from astraeus.server.db import RegistryCredential
from astraeus.server.services import HIDDEN, ApiError, Caller, iso, require

USERNAME_MAX = 255
PASSWORD_MAX = 4096  # registry tokens (a JWT, a cloud provider's temporary token) run to a few KiB


class RegistryPut(BaseModel):
    """PUT $API/registries/<host[:port]>."""

    model_config = ConfigDict(extra="forbid")

    username: str = Field(description="The registry user (or the token's user name, e.g. `$oauthtoken` on nvcr.io)")
    password: str = Field(repr=False, description="The password or access token; never shown back")

    @field_validator("username")
    @classmethod
    def _username(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the username is empty: give the registry user name")
        if len(v) > USERNAME_MAX:
            raise ValueError(f"the username is longer than {USERNAME_MAX} characters")
        if any(c in v for c in "\x00\r\n"):
            raise ValueError("the username must not contain NUL or line breaks")
        return v

    @field_validator("password")
    @classmethod
    def _password(cls, v: str) -> str:
        if not v:
            raise ValueError("the password is empty: give the registry password or access token")
        if len(v) > PASSWORD_MAX:
            raise ValueError(f"the password is longer than {PASSWORD_MAX} characters")
        if any(c in v for c in "\x00\r\n"):
            raise ValueError("the password must not contain NUL or line breaks")
        return v


def registry_host(text: str) -> str:
    """The registry `text` names, as image references name it (docker.io for Docker Hub), or ValueError saying
    what to change. A host needs a dot or a port (or is localhost), as in an image reference: `myregistry`
    alone would be a Docker Hub user there."""
    raw = (text or "").strip()
    example = "such as 127.0.0.1:5000, registry.example.com or nvcr.io"
    if not raw:
        raise ValueError(f"the registry is empty: name a host[:port], {example}")
    if "/" in raw or "@" in raw or any(c.isspace() for c in raw) or "://" in raw:
        raise ValueError(f"registry {raw!r} is not a host[:port]: give the host alone (no scheme, path or "
                         f"spaces), {example}")
    if not ("." in raw or ":" in raw or raw == "localhost" or raw.startswith("[")):
        raise ValueError(f"registry {raw!r} has no dot or port, so an image reference would read it as a Docker "
                         f"Hub user: give a host[:port], {example}")
    try:
        ref = ImageRef.parse(f"{raw}/probe:1")
    except ValueError:
        raise ValueError(f"registry {raw!r} is not a host[:port]: {example}") from None
    if ref.registry != raw and ref.registry != DOCKER_HUB:
        raise ValueError(f"registry {raw!r} is not a host[:port]: {example}")
    return ref.registry


def _host(text: str) -> str:
    try:
        return registry_host(text)
    except ValueError as e:
        raise ApiError(422, "INVALID", f"registry: {e}") from None


def view(c: RegistryCredential, role: str | None) -> dict:
    """A credential as `role` sees it: never the password; the username for editors and admins."""
    return {"registry": c.host, "username": c.username if role in ("editor", "admin") else HIDDEN,
            "created_at": iso(c.created_at), "updated_at": iso(c.updated_at)}


def _find(session: Session, workspace_id: int, host: str) -> RegistryCredential | None:
    return session.scalar(select(RegistryCredential).where(RegistryCredential.workspace_id == workspace_id,
                                                           RegistryCredential.host == host))


def put(session: Session, caller: Caller, host: str, body: RegistryPut, at: float) -> tuple[RegistryCredential, bool]:
    """Set the workspace's credential for `host`; returns it and whether it is new."""
    require(caller, "editor")
    host = _host(host)
    c = _find(session, caller.workspace.id, host)
    created = c is None
    if created:
        c = RegistryCredential(workspace_id=caller.workspace.id, host=host, created_at=at)
        session.add(c)
    c.username, c.password, c.updated_at = body.username, body.password, at
    lifecycle.event(session, caller.workspace.id, "RegistryCredentialSet", host,
                    f"credential for registry {host} {'set' if created else 'replaced'} (user {body.username})", at)
    session.flush()
    return c, created


def listed(session: Session, caller: Caller) -> list[RegistryCredential]:
    return list(session.scalars(select(RegistryCredential).where(RegistryCredential.workspace_id == caller.workspace.id)
                                .order_by(RegistryCredential.host)))


def get(session: Session, caller: Caller, host: str) -> RegistryCredential:
    host = _host(host)
    c = _find(session, caller.workspace.id, host)
    if c is None:
        raise ApiError(404, "NOT_FOUND", f"workspace {caller.workspace.name} has no credential for registry {host}: "
                                         f"set one with PUT $API/registries/{host}")
    return c


def delete(session: Session, caller: Caller, host: str, at: float) -> str:
    require(caller, "editor")
    c = get(session, caller, host)
    host = c.host
    session.delete(c)
    lifecycle.event(session, caller.workspace.id, "RegistryCredentialDeleted", host,
                    f"credential for registry {host} deleted", at)
    session.flush()
    return host


def for_images(session: Session, pairs: set[tuple[int, str]]) -> dict[tuple[int, str], RegistryCredential]:
    """(workspace id, registry) → that workspace's credential for that registry, for those that exist."""
    if not pairs:
        return {}
    ws_ids = {w for w, _ in pairs}
    rows = session.scalars(select(RegistryCredential).where(RegistryCredential.workspace_id.in_(ws_ids)))
    return {(c.workspace_id, c.host): c for c in rows if (c.workspace_id, c.host) in pairs}
