"""Bounded logs (issue 13, item 6): a worker flooding its output (`yes`-like) for a few seconds keeps at most
ASTRAEUS_LOG_MAX_BYTES_PER_WORKER of log text (and _LINES_) in the database, the oldest lines dropped and one line
saying so at the top of the log; the agent ships at most ASTRAEUS_LOG_LINES_PER_SECOND lines a second for it and
says how many it dropped; deleting the run removes its lines. A real `astraeus server` and `astraeus agent`."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from .conftest import drop_postgres, postgres_url, sleeper_run, wait_for

pytestmark = pytest.mark.faults

MAX_BYTES = 64 * 1024
MAX_LINES = 2000
RATE = 500
FLOOD = "import sys\nline = 'y' * 100 + '\\n'\nwhile True:\n    sys.stdout.write(line)\n"


def stored(engine, worker: str) -> tuple[int, int, int]:
    """(lines, bytes as shown, lines dropped by retention) the database holds for a worker."""
    with engine.connect() as conn:
        wid = conn.execute(sa.text("SELECT id FROM workers WHERE name = :n ORDER BY id DESC"), {"n": worker}).scalar()
        n, size = conn.execute(sa.text("SELECT count(*), coalesce(sum(length(text) + 1), 0) FROM log_lines "
                                       "WHERE worker_id = :w AND attempt >= 0"), {"w": wid}).one()
        dropped = conn.execute(sa.text("SELECT seq FROM log_lines WHERE worker_id = :w AND attempt = -1"),
                               {"w": wid}).scalar()
        return int(n), int(size), int(dropped or 0)


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_flooding_worker_keeps_a_bounded_log_removed_with_its_run(fleet, db, monkeypatch):
    url = postgres_url() if db == "postgresql" else None
    env = {"ASTRAEUS_LOG_MAX_BYTES_PER_WORKER": str(MAX_BYTES), "ASTRAEUS_LOG_MAX_LINES_PER_WORKER": str(MAX_LINES)}
    if url:
        env["ASTRAEUS_DATABASE_URL"] = url
    engine = None
    try:
        server = fleet.server(env=env)
        monkeypatch.setenv("ASTRAEUS_LOG_LINES_PER_SECOND", str(RATE))
        fleet.agent(server)
        engine = sa.create_engine(url or f"sqlite:///{server.home / 'astraeus.db'}")
        with server.client() as c:
            assert c.post("/runs", json=sleeper_run("flood", gpus=0, code=FLOOD)).status_code == 201
            wait_for(lambda: stored(engine, "flood-0")[2] > 0, 60, what="the log to pass its limit and be trimmed")
            seen = []
            for _ in range(8):  # a few seconds of flood: never over the limits
                n, size, dropped = stored(engine, "flood-0")
                assert size <= MAX_BYTES and n <= MAX_LINES, (n, size)
                seen.append(dropped)
                time.sleep(0.5)
            assert seen[-1] > seen[0]  # still flooding, still trimming

            text = c.get("/workers/flood-0/logs").text
            assert len(text.encode()) <= MAX_BYTES + 200
            first, *rest = text.splitlines()
            assert first.startswith("… ") and first.endswith(" earlier lines dropped (log limit 64 KiB or 2000 lines)")
            assert int(first.split()[1]) > 0
            assert "y" * 100 in rest
            # the agent's own bound: at most RATE lines a second, and a line saying how many it dropped
            assert any(ln.startswith("… ") and ln.endswith(f" lines dropped (over {RATE} lines/s)") for ln in rest)
            assert text.count("y" * 100) <= MAX_LINES

            tail = c.get("/workers/flood-0/logs", params={"tail": 5}).text.splitlines()
            assert len(tail) == 5 and not any("earlier lines dropped" in ln for ln in tail)

            assert c.delete("/runs/flood").status_code == 200
            wait_for(lambda: stored(engine, "flood-0")[:2] == (0, 0), 10, what="the run's log lines to be removed")
            wait_for(lambda: c.get("/runs/flood").status_code == 404, 30, what="the run to be gone")
            time.sleep(1.5)  # lines the agent still ships for it are not stored
            assert stored(engine, "flood-0") == (0, 0, 0)
    finally:
        if engine is not None:
            engine.dispose()
        fleet.close()
        if url:
            drop_postgres(url)
