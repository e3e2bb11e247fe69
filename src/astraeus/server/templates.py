"""A workspace's run templates (docs/api.md, "Templates"): any part of a run's spec kept under a name, as
Determined's templates are. A run names one with `"spec": {"template": NAME}` (submits.submit_run_body merges
it; astraeus.templates says how); schedules and replica groups name one in their `run`.

A template is checked as a run's spec is, field by field (astraeus.templates.checkable): unknown
fields and bad values are a 422 naming the field. Beyond its shape, what a run would meet at submit is met when
the template is made or changed: each drive it mounts must exist in the workspace (400 DRIVE_NOT_FOUND) and its
priority must be within the workspace's maximum on its cluster (403 PRIORITY_NOT_ALLOWED), so that a schedule or a
group never finds out at 2 a.m. Each change adds one to its `version`; a run records the version it came from.
A template that a schedule or a replica group still names cannot be deleted (409 saying which).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus import spec as S
from astraeus import templates as T
from astraeus.server import lifecycle, services, submits
from astraeus.server.db import ReplicaGroup, Schedule, Template
from astraeus.server.services import (
    ApiError,
    Caller,
    InvalidBody,
    _cluster_for,
    iso,
    require,
    shown_template,
)


class TemplateMetadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The template's name, as runs name it (`spec.template`)")
    labels: dict[str, str] = Field(default_factory=dict, description="Merged into its runs' labels, by key")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return S.check_dns_label(v, "template name")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return S.check_labels(v)


class TemplateBody(BaseModel):
    """POST $API/templates and PUT $API/templates/NAME: `{"metadata": {"name", "labels"?}, "spec": {…any part of a
    run's spec…}}`."""

    model_config = ConfigDict(extra="forbid")

    metadata: TemplateMetadata
    spec: dict[str, Any] = Field(description="Any part of a run's spec (priority, start, cluster, task_template.…)")


def _spec_errors(spec: dict[str, Any]) -> list[dict]:
    """Pydantic's errors of a template's spec (locations inside the spec), or []: every field it gives is checked by
    the run spec's own rules, with placeholders for what only a run gives (astraeus.templates.checkable)."""
    if isinstance(spec, dict) and "template" in spec:
        return [{"loc": ("template",), "msg": "a template cannot name another template: give its fields here",
                 "type": "value_error"}]
    try:
        S.RunSpecBody.model_validate(T.checkable(spec))
    except ValidationError as e:
        return e.errors()
    return []


def _checked(session: Session, caller: Caller, body: TemplateBody) -> dict[str, Any]:
    """The template's spec, or the error a run with these fields would get at submit (see the module doc)."""
    spec = body.spec
    errors = _spec_errors(spec)
    if errors:
        raise InvalidBody(errors, ("spec",))
    cluster, access = _cluster_for(session, caller, spec.get("cluster"))
    tt = spec.get("task_template") or {}
    submits.check_made(session, caller, access, spec.get("priority"),
                       [ref.get("name") for ref in tt.get("datavolume_refs") or []],
                       "spec.task_template.datavolume_refs[{i}]")
    return spec


def _find(session: Session, caller: Caller, name: str) -> Template | None:
    return services.find_named(session, caller, Template, name)


def get(session: Session, caller: Caller, name: str) -> Template:
    return services.get_named(session, caller, Template, name, "template", "templates")


def listed(session: Session, caller: Caller) -> list[Template]:
    return services.list_named(session, caller, Template)


def create(session: Session, caller: Caller, body: TemplateBody, at: float) -> Template:
    require(caller, "editor")
    spec = _checked(session, caller, body)
    name = body.metadata.name
    if _find(session, caller, name) is not None:
        raise ApiError(409, "ALREADY_EXISTS",
                       f"a template named {name} already exists in workspace {caller.workspace.name}: choose another "
                       f"metadata.name, or change it with PUT $API/templates/{name}")
    t = Template(workspace_id=caller.workspace.id, name=name, labels=dict(body.metadata.labels), spec=spec,
                 version=1, created_at=at, updated_at=at, created_by=caller.user, updated_by=caller.user)
    session.add(t)
    lifecycle.event(session, caller.workspace.id, "TemplateCreated", name, f"template {name} created (version 1)", at)
    session.flush()
    return t


def replace(session: Session, caller: Caller, name: str, body: TemplateBody, at: float) -> Template:
    """PUT: the template's labels and spec become the body's; its version grows by one."""
    require(caller, "editor")
    if body.metadata.name != name:
        raise InvalidBody([{"loc": ("metadata", "name"), "type": "value_error",
                            "msg": f"{body.metadata.name} is not the template in the path ({name}): a template keeps "
                                   "its name; to rename one, create the new one and delete the old"}])
    t = get(session, caller, name)
    spec = _checked(session, caller, body)
    t.labels, t.spec, t.version, t.updated_at = dict(body.metadata.labels), spec, t.version + 1, at
    t.updated_by = caller.user
    lifecycle.event(session, caller.workspace.id, "TemplateChanged", name,
                    f"template {name} changed (version {t.version}); runs made from now on use it", at)
    session.flush()
    return t


def users(session: Session, workspace_id: int, name: str) -> list[str]:
    """The schedules and replica groups of a workspace whose run names template `name`: ["schedule nightly", …]."""
    out = []
    for kind, model in (("schedule", Schedule), ("replica group", ReplicaGroup)):
        for obj in session.scalars(select(model).where(model.workspace_id == workspace_id).order_by(model.name)):
            if _names_template(obj.spec, name):
                out.append(f"{kind} {obj.name}")
    return out


def _names_template(spec: Any, name: str) -> bool:
    run = spec.get("run") if isinstance(spec, dict) else None
    if not isinstance(run, dict):
        return False
    inner = run.get("spec") if isinstance(run.get("spec"), dict) else {}
    return run.get("template") == name or inner.get("template") == name


def delete(session: Session, caller: Caller, name: str, at: float) -> None:
    require(caller, "editor")
    t = get(session, caller, name)
    named_by = users(session, caller.workspace.id, name)
    if named_by:
        raise ApiError(409, "IN_USE", f"template {name} is still named by {', '.join(named_by)}: change or delete "
                                      f"{'it' if len(named_by) == 1 else 'them'} first")
    session.delete(t)
    lifecycle.event(session, caller.workspace.id, "TemplateDeleted", name,
                    f"template {name} deleted (it was at version {t.version}); runs made from it stay", at)
    session.flush()


def _shown_spec(spec: dict[str, Any], role: str | None) -> dict[str, Any]:
    """The spec as `role` may see it: env and config values hidden as a run's are (services.shown_template)."""
    tt = spec.get("task_template")
    if not isinstance(tt, dict):
        return spec
    shown = shown_template(tt, role)
    return {**spec, "task_template": {**tt, **{k: shown[k] for k in ("env", "configs") if k in tt}}}


def view(t: Template, caller: Caller) -> dict[str, Any]:
    return {"metadata": {"name": t.name, "labels": t.labels or {}, "workspace": caller.workspace.name,
                         "namespace": caller.workspace.ns, "version": t.version, "created_at": iso(t.created_at),
                         "updated_at": iso(t.updated_at), **services.made_by(t)},
            "spec": _shown_spec(t.spec or {}, caller.role),
            "status": {"version": t.version}}
