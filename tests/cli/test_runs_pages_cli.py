"""`astra astraeus runs` with more runs than a page (issue 19): the newest 100 unless --limit or --all, the filters
--state and -l/--label, a line on stderr saying how to see more; and the Slurm commands that need every run
(squeue -j, scancel) still find one beyond the first pages. `astra` as a subprocess against a real local cluster,
with 250 finished runs put straight into its database."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from astraeus.server import lifecycle
from astraeus.server.db import Cluster, Workspace
from tests.cli.test_commands import astra, ok, one_line_error

N = 250


@pytest.fixture(scope="module")
def c(shared_cluster):
    engine = create_engine(f"sqlite:///{shared_cluster.home / 'astraeus.db'}")
    tt = {"image": "python:3.11", "command": "true", "requested_resources": {"gpu_requests": {"count": 0}}}
    with Session(engine) as s:
        ws = s.scalar(select(Workspace).order_by(Workspace.id))
        cl = s.scalar(select(Cluster).order_by(Cluster.id))
        for i in range(N):
            run = lifecycle.new_run(uid=uuid.uuid4().hex, workspace_id=ws.id, cluster_id=cl.id, name=f"old-{i:04d}",
                                    labels={"team": "a" if i % 2 else "b"}, spec={"task_template": tt, "priority": 0},
                                    created_at=1.7e9 + i)
            run.state = "Completed" if i % 5 else "Failed"
            s.add(run)
        s.commit()
    engine.dispose()
    return shared_cluster


def _rows(out: str) -> list[str]:
    lines = out.splitlines()
    assert lines[0].startswith("NAME")
    return [line.split()[0] for line in lines[1:]]


def test_runs_shows_the_newest_100_and_says_how_to_see_more(c):
    r = astra(c, "astraeus", "runs")
    assert _rows(ok(r)) == [f"old-{i:04d}" for i in reversed(range(N - 100, N))]
    assert r.stderr == ("… more runs than these 100: astra astraeus runs --limit 1000, or astra astraeus runs "
                        "--all\n")
    r = astra(c, "astraeus", "runs", "--limit", "7")
    assert _rows(ok(r)) == [f"old-{i:04d}" for i in reversed(range(N - 7, N))]
    assert "--limit 1000" in r.stderr


def test_all_and_a_limit_over_a_page_follow_the_cursor(c):
    r = astra(c, "astraeus", "runs", "--all")
    assert _rows(ok(r)) == [f"old-{i:04d}" for i in reversed(range(N))] and r.stderr == ""
    r = astra(c, "astraeus", "runs", "--limit", "1000")
    assert len(_rows(ok(r))) == N and r.stderr == ""


def test_filters_by_state_and_label(c):
    r = astra(c, "astraeus", "runs", "--state", "Failed", "-l", "team=a")
    assert _rows(ok(r)) == [f"old-{i:04d}" for i in reversed(range(N)) if i % 5 == 0 and i % 2]
    assert r.stderr == ""
    r = astra(c, "astraeus", "runs", "-l", "team=b", "--limit", "3")
    assert _rows(ok(r)) == ["old-0248", "old-0246", "old-0244"]
    assert r.stderr.endswith("astra astraeus runs -l team=b --limit 1000, or astra astraeus runs -l team=b --all\n")
    err = one_line_error(astra(c, "astraeus", "runs", "-l", "team"))
    assert "label" in err and "key=value" in err


def test_json_is_what_was_fetched(c):
    data = json.loads(ok(astra(c, "astraeus", "runs", "-o", "json", "--limit", "5")))
    assert [x["metadata"]["name"] for x in data["items"]] == [f"old-{i:04d}" for i in reversed(range(N - 5, N))]


def test_slurm_commands_see_every_run(c):
    out = ok(astra(c, "slurm", "squeue", "-j", "old-0000", "-t", "F"))
    assert "old-0000" in out
    ok(astra(c, "slurm", "scancel", "old-0001"))
    assert "old-0001" not in ok(astra(c, "astraeus", "runs", "--all"))
