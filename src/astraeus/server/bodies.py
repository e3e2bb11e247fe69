"""Typed request bodies of the organisation API (the agent's are in astraeus.protocol), so /openapi.json says
what they accept and a body of the wrong shape is a 422, never a 500. The JSON shapes are those of docs/api.md;
unknown fields are ignored as before. Integers are bounded by what the database columns hold."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

INT32 = 2**31 - 1
INT64 = 2**63 - 1


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Error(BaseModel):
    """Every 4xx answer: {"code", "message"} (422 adds "errors": [{"field", "message"}])."""

    code: str
    message: str
    errors: list[dict] | None = None


class Quota(Loose):
    gpus: Annotated[int, Field(ge=0, le=INT32)] | None = None
    cpu_cores: Annotated[float, Field(ge=0, le=1e9)] | None = None
    memory_bytes: Annotated[int, Field(ge=0, le=INT64)] | None = None
    workers: Annotated[int, Field(ge=0, le=INT32)] | None = None


class AccessConf(Loose):
    max_priority: Annotated[int, Field(ge=-1000, le=1000)] | None = None
    weight: Annotated[float, Field(gt=0, le=1e6)] | None = None
    host_paths: list[str] | None = None
    quota: Quota | None = None


class WorkspaceCreate(Loose):
    name: str
    clusters: dict[str, AccessConf | None] | None = None


class WorkspacePatch(Loose):
    clusters: dict[str, AccessConf | None] | None = None


class ClusterCreate(Loose):
    name: str
    preemption: bool = True
    lost_after_seconds: Annotated[float, Field(gt=0, le=1e7)] | None = None


class ClusterPatch(Loose):
    preemption: bool | None = None
    lost_after_seconds: Annotated[float, Field(gt=0, le=1e7)] | None = None


class TokenCreate(Loose):
    kind: Literal["user", "org_admin", "machine"]
    workspace: str | None = None
    role: Literal["viewer", "editor", "admin"] | None = None
    cluster: str | None = None
    expires_in_seconds: Annotated[float, Field(gt=0, le=10 * 366 * 86400)] | None = None


ERRORS: dict = {status: {"model": Error, "description": what} for status, what in (
    (400, "Bad request"), (401, "Missing, unknown, revoked or expired token"), (403, "Not allowed"),
    (404, "Not found (or not visible to this token)"), (409, "Conflict"), (422, "Invalid: the field and what to change"))}
