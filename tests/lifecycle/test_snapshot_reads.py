"""The scheduling loop's full read (server/loop.build_snapshot) decodes each run's spec once and keeps it by the
run's uid, per database and cluster (loop._SPECS): what it plans on must be what each database holds."""

from __future__ import annotations

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from astraeus.server import loop
from astraeus.server.db import Base
from tests.lifecycle.rows import T0, World, exits, place, running


def waiting(world: World) -> dict[str, float | None]:
    snap, _ = loop.build_snapshot(world.s, world.cluster, T0 + 1)
    return {r.name: r.time_limit_seconds for r in snap.waiting}


def test_each_database_plans_on_its_own_specs_read_after_read():
    engines = [create_engine("sqlite://") for _ in range(2)]
    sessions = []
    try:
        worlds = []
        for e in engines:
            Base.metadata.create_all(e)
            s = Session(e, expire_on_commit=False)
            sessions.append(s)
            worlds.append(World(s))
        # the same uid ("uid0") and cluster id in both databases, different time limits
        a, b = worlds
        a.run("r", limit=60)
        b.run("r", limit=600)
        for _ in range(2):  # the second read takes the specs kept from the first
            assert waiting(a) == {"r": 60}
            assert waiting(b) == {"r": 600}
        # a run submitted since is read with its own spec; one that ended is read no more
        done = a.run("done", limit=5)
        assert waiting(a) == {"r": 60, "done": 5}
        for step in (place(0), running(0), exits(0, 0)):
            step(a, done, T0)
        a.s.flush()
        assert done.state == "Completed"
        a.run("later", limit=30)
        assert waiting(a) == {"r": 60, "later": 30}
        assert waiting(b) == {"r": 600}
    finally:
        for s in sessions:
            s.close()
        for e in engines:
            e.dispose()
