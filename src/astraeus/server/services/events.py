"""A workspace's events."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from astraeus.server.db import (
    Event,
)
from astraeus.server.services.auth import Caller


def list_events(session: Session, caller: Caller, limit: int = 200) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.workspace_id == caller.workspace.id)
                                .order_by(Event.id.desc()).limit(limit)))
