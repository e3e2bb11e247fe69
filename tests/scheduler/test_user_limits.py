"""A workspace's per-user GPU limit (`max_gpus_per_user`, Slurm's QOS MaxTRESPerUser) in the pure scheduler: a
run whose user would hold more than the limit waits with `Waits for alice's limit: gpus 8 in use + 4 asked > 8`,
is never the head (nothing is preempted for it), and other users' work still starts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from astraeus.scheduler import plan
from astraeus.scheduler.cycle import PLAIN

from .builders import NOW, WS_A, WS_B, cluster, machine, started_names


def owned(b, users: dict[str, str], limit: int | None = 8, ws: str = WS_A):
    """The builder's runs and units named in `users` made that user's; workspace `ws` limited to `limit` GPUs."""
    b.runs = [replace(r, user=users[r.name]) if r.name in users else r for r in b.runs]
    b.units = [replace(u, user=users[u.run]) if u.run in users else u for u in b.units]
    b.spaces[ws] = replace(b.spaces[ws], max_gpus_per_user=limit)
    return b


# (running: [(run, user, gpus)], waiting: [(run, user, gpus)], limit) -> started, {run: reason}
TABLE = [
    pytest.param([("a1", "alice", 8)], [("a2", "alice", 4)], 8, [], {"a2": "Waits for alice's limit: gpus 8 in use + "
                                                                          "4 asked > 8"}, id="over-the-limit-waits"),
    pytest.param([("a1", "alice", 4)], [("a2", "alice", 4)], 8, ["a2"], {}, id="up-to-the-limit-starts"),
    pytest.param([("a1", "alice", 8)], [("a2", "alice", 4), ("b1", "bob", 4)], 8, ["b1"],
                 {"a2": "Waits for alice's limit: gpus 8 in use + 4 asked > 8"}, id="another-user-still-starts"),
    pytest.param([], [("a1", "alice", 4), ("a2", "alice", 4), ("a3", "alice", 4)], 8, ["a1", "a2"],
                 {"a3": "Waits for alice's limit: gpus 8 in use + 4 asked > 8"}, id="counts-what-this-cycle-starts"),
    pytest.param([("a1", "alice", 8)], [("a2", "alice", 4)], None, ["a2"], {}, id="no-limit"),
    pytest.param([], [("a1", "alice", 12)], 8, [], {"a1": "Waits for alice's limit: gpus 0 in use + 12 asked > 8"},
                 id="more-than-the-limit-at-all"),
]


@pytest.mark.parametrize("running,waiting,limit,started,reasons", TABLE)
@pytest.mark.parametrize("paths", ["fast", "plain"])
def test_per_user_limit(running, waiting, limit, started, reasons, paths):
    b = cluster(machine("gpu-01", gpus=16), machine("gpu-02", gpus=16))
    for run, _, gpus in running:
        b.running(run, gpus=gpus)
    for run, _, gpus in waiting:
        b.waiting(run, gpus=gpus)
    owned(b, {r: u for r, u, _ in running + waiting}, limit)
    p = plan(b.build(), NOW) if paths == "fast" else plan(b.build(), NOW, PLAIN)
    assert sorted(started_names(p)) == started
    for run, reason in reasons.items():
        assert p.reasons[run] == reason
    assert p.head is None  # a run held by its user's limit is never the head: nothing is preempted for it


def test_the_limit_is_per_workspace():
    b = cluster(machine("gpu-01", gpus=16))
    b.running("a1", gpus=8, ws=WS_A).waiting("a2", gpus=4, ws=WS_A).waiting("a3", gpus=4, ws=WS_B)
    owned(b, {"a1": "alice", "a2": "alice", "a3": "alice"}, 8, ws=WS_A)
    p = plan(b.build(), NOW)
    assert started_names(p) == ["a3"]
    assert p.reasons["a2"] == "Waits for alice's limit: gpus 8 in use + 4 asked > 8"
