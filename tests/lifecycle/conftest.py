"""Fixtures for the direct lifecycle tests: rows in an in-memory SQLite database, no server process."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from astraeus.server import lifecycle as L
from astraeus.server.db import Base
from tests.lifecycle.rows import World


@pytest.fixture
def session():
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine, expire_on_commit=False) as s:
        yield s
    engine.dispose()


@pytest.fixture(autouse=True)
def default_backoff(monkeypatch):
    monkeypatch.delenv(L.BACKOFF_ENV, raising=False)


@pytest.fixture
def applied(monkeypatch):
    """The names of the rules lifecycle applies during the test, in order."""
    names: list[str] = []
    real = L._move

    def recording(row, name, reason=None, **fields):
        real(row, name, reason, **fields)
        names.append(name)

    monkeypatch.setattr(L, "_move", recording)
    return names


@pytest.fixture
def world(session):
    return World(session)
