"""Objects a workspace names (templates, schedules, replica groups...): find, get (or 404), list."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.server.services.auth import Caller
from astraeus.server.services.errors import ApiError


def find_named(session: Session, caller: Caller, model, name: str):
    """The caller's workspace's object of `model` (a table with workspace_id and name) named `name`, or None."""
    return session.scalar(select(model).where(model.workspace_id == caller.workspace.id, model.name == name))


def get_named(session: Session, caller: Caller, model, name: str, what: str, path: str):
    """As find_named, or 404 NOT_FOUND saying where to list them (`what`: "schedule"; `path`: "schedules")."""
    found = find_named(session, caller, model, name)
    if found is None:
        raise ApiError(404, "NOT_FOUND", f"{what} {name} not found in workspace {caller.workspace.name}: see the "
                                         f"workspace's {what}s with GET $API/{path}")
    return found


def list_named(session: Session, caller: Caller, model) -> list:
    """The caller's workspace's objects of `model`, by name."""
    return list(session.scalars(select(model).where(model.workspace_id == caller.workspace.id).order_by(model.name)))
