"""Typed request bodies of the organisation API (the agent's are in astraeus.protocol), so /openapi.json says
what they accept and a body of the wrong shape is a 422, never a 500. The JSON shapes are those of docs/api.md;
unknown fields are ignored as before. Integers are bounded by what the database columns hold."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astraeus.spec import Strict, check_dns_label

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
    pools: list[str] | None = None  # the cluster's pools the workspace may use; null: every machine again
    host_network: bool | None = None  # its runs may ask for the machine's own network (`network: host`)
    default_image: str | None = None  # the image its runs use when they name none; "" or null: none
    # at most this many GPUs held at once by one user's runs (Slurm's MaxTRESPerUser); null: no limit (issue 45)
    max_gpus_per_user: Annotated[int, Field(ge=0, le=INT32)] | None = None


class WorkspaceCreate(Loose):
    name: str
    clusters: dict[str, AccessConf | None] | None = None


class WorkspacePatch(Loose):
    clusters: dict[str, AccessConf | None] | None = None


class ClusterCreate(Loose):
    name: str
    preemption: bool = True
    lost_after_seconds: Annotated[float, Field(gt=0, le=1e7)] | None = None
    # Victims of equal priority stopped first: the most recently started (the pages' rule) or those that lose
    # the fewest GPU-seconds since their last checkpoint (docs/progress.md)
    preemption_victims: Literal["recent", "least-work-lost"] | None = None
    # Issue 46: who may share a GPU: tenants of one workspace only (default) or of any (docs/gpu-sharing.md)
    gpu_sharing: Literal["workspace", "any"] | None = None
    # Issue 46: how machines and GPUs are chosen: fragmentation-aware (fgd), best fit (default) or spread
    placement: Literal["fgd", "bestfit", "spread"] | None = None


class ClusterPatch(Loose):
    preemption: bool | None = None
    lost_after_seconds: Annotated[float, Field(gt=0, le=1e7)] | None = None
    preemption_victims: Literal["recent", "least-work-lost"] | None = None
    gpu_sharing: Literal["workspace", "any"] | None = None
    placement: Literal["fgd", "bestfit", "spread"] | None = None


class TokenCreate(Loose):
    kind: Literal["user", "org_admin", "machine"]
    workspace: str | None = None
    role: Literal["viewer", "editor", "admin"] | None = None
    cluster: str | None = None
    expires_in_seconds: Annotated[float, Field(gt=0, le=10 * 366 * 86400)] | None = None


Name = Annotated[str, Field(max_length=63)]


class PoolSelector(Strict):
    """A pool's machines: these names, and every machine having all these labels (union of both)."""

    machines: list[Name] = Field(default_factory=list, max_length=4096)
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)


class PoolCreate(PoolSelector):
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, "pool name")


class PoolReplace(PoolSelector):
    name: str | None = None  # when given, the pool's own name (a pool is not renamed)


class ReservationCreate(Strict):
    """`machines` by name, or `count` machines of `pool`; `start`/`end` ISO 8601 (start default now, end null:
    no end)."""

    name: str
    cluster: Name
    workspaces: list[Name] = Field(min_length=1, max_length=256)
    machines: list[Name] | None = Field(default=None, max_length=4096)
    pool: Name | None = None
    count: Annotated[int, Field(ge=1, le=100_000)] | None = None
    start: Annotated[str, Field(max_length=64)] | None = None
    end: Annotated[str, Field(max_length=64)] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, "reservation name")


ERRORS: dict = {status: {"model": Error, "description": what} for status, what in (
    (400, "Bad request"), (401, "Missing, unknown, revoked or expired token"), (403, "Not allowed"),
    (404, "Not found (or not visible to this token)"), (409, "Conflict"), (422, "Invalid: the field and what to change"))}
