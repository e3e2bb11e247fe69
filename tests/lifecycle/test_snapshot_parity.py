"""One snapshot builder: a kept snapshot extended with the runs submitted since (server/loop.Kept.extend) is what
a full read (loop.build_snapshot) gives at the same moment, snapshot and lookups alike, over a sequence of submits
and ends. Rows in an in-memory SQLite database, no server process."""

from __future__ import annotations

from dataclasses import fields

from astraeus import scheduler as sched
from astraeus.server import lifecycle as L
from astraeus.server import loop
from astraeus.server.db import Workspace
from tests.lifecycle.rows import T0, World, exits, place, running


def lookups_of(lk: loop.Lookups) -> dict:
    """The lookups as plain data (the interned selections and workers compared by value, the keys by their text and run)."""
    d = {f.name: getattr(lk, f.name) for f in fields(lk)}
    d["interned"] = sorted(map(repr, lk.interned))
    d["shared"] = sorted((str(k), k.run_id) for k in lk.shared)
    d["runs"] = {(str(k), getattr(k, "run_id", v)): v for k, v in lk.runs.items()}
    return d


def fresh(world: World, at: float):
    world.s.flush()
    return loop.build_snapshot(world.s, world.cluster, at)


def extended(world: World, kept: loop.Kept):
    world.s.flush()
    return kept.extend(world.s, world.cluster.id)


def assert_same(got, want) -> None:
    assert got is not None, "the kept snapshot refused runs a plain submit makes"
    (snap, lk), (snap2, lk2) = got, want
    assert snap == snap2
    assert [w.name for w in snap.waiting] == [w.name for w in snap2.waiting]
    assert lookups_of(lk) == lookups_of(lk2)


def test_a_kept_snapshot_extended_over_submits_and_ends_is_the_full_read(world):
    at = T0 + 1
    gang = world.run("gang", workers=2)
    world.run("solo", limit=60)
    snap, lk = fresh(world, at)
    kept = loop.Kept(snap, lk, at)

    # plain submits: a gang, an independent run, one with a time limit
    world.run("more", workers=3)
    world.run("each", workers=2, start="Independent")
    world.run("short", limit=5)
    got = extended(world, kept)
    assert_same(got, fresh(world, at))

    # applied and kept again (Kept.kept), then more submits
    kept = kept.kept(*got)
    world.run("later")
    got = extended(world, kept)
    assert_same(got, fresh(world, at))

    # an end changes what the full read sees: the loop reads afresh, keeps that, and goes on extending it
    for step in (place(0), place(1, "gpu-02"), running(0), running(1), exits(0, 0), exits(1, 0)):
        step(world, gang, at)
    assert gang.state == L.RunState.COMPLETED
    kept = loop.Kept(*fresh(world, at), at)
    world.run("after-end", workers=2)
    assert_same(extended(world, kept), fresh(world, at))

    # nothing new: the same snapshot and lookups
    kept = loop.Kept(*fresh(world, at), at)
    snap, lk = extended(world, kept)
    assert snap is kept.snap and lk is kept.lookups


def test_a_name_another_workspace_uses_needs_the_full_read_whose_keys_tell_them_apart(world):
    at = T0 + 1
    world.run("train")
    kept = loop.Kept(*fresh(world, at), at)
    other = Workspace(org_id=world.ws.org_id, name="nlp", ns="ws-ba9876543210")
    world.s.add(other)
    world.s.flush()
    run = L.new_run(uid="other-train", workspace_id=other.id, cluster_id=world.cluster.id, name="train",
                    spec={"start": "Gang", "task_template": {"image": "python:3.11", "command": "true"}},
                    priority=0, created_at=T0)
    world.s.add(run)
    world.s.flush()
    world.s.add(L.new_worker(run_id=run.id, name="train-0", index=0, gpus=1, gpu_indices=[], why_not=[]))
    assert extended(world, kept) is None

    snap, lk = fresh(world, at)
    keys = sorted(str(w.name) for w in snap.waiting)
    assert keys == ["train@ws-0123456789ab", "train@ws-ba9876543210"]
    assert sorted(lk.workers) == ["train@ws-0123456789ab-0", "train@ws-ba9876543210-0"]
    # each key names its own run, and the words of a plan show the name alone
    assert {k.run_id for k in lk.runs} == set(lk.runs.values())
    assert lk.shown("Queued behind train@ws-ba9876543210, which starts") == "Queued behind train, which starts"


def test_equal_workers_and_selections_are_one_object_in_the_snapshot(world):
    """A cycle reads every waiting run's workers and selection: runs that ask the same share one object (read from
    the cache run after run), on the full read and on a kept snapshot extended alike."""
    at = T0 + 1
    world.run("a")
    world.run("b")
    world.run("gang", workers=2)
    snap, lk = fresh(world, at)
    a, b, gang = sorted(snap.waiting, key=lambda r: str(r.name))
    assert a.workers == b.workers and a.workers is b.workers
    assert a.node_selection is b.node_selection is gang.node_selection
    assert gang.workers is not a.workers and len(gang.workers) == 2

    world.run("c")
    snap2, _ = extended(world, loop.Kept(snap, lk, at))
    c = next(r for r in snap2.waiting if str(r.name) == "c")
    assert c.workers is a.workers and c.node_selection is a.node_selection


def test_a_share_of_one_gpu_is_never_interned_as_the_whole_gpu():
    """1.0 == 1 in Python, but a worker asking a share (a float) is placed on a shared GPU and one asking a whole GPU
    (an int) is not: equal-looking asks of the two kinds give two objects."""
    interned: dict = {}
    whole = sched.interned_workers(interned, ((0, 1, 4.0, 1 << 30),))
    share = sched.interned_workers(interned, ((0, 1.0, 4.0, 1 << 30),))
    assert whole == (sched.WorkerRequest(0, 1, 4.0, 1 << 30),) and whole[0].gpus.__class__ is int
    assert share[0].gpus.__class__ is float and share is not whole
    assert sched.interned_workers(interned, ((0, 1, 4.0, 1 << 30),)) is whole
    assert sched.interned_workers(interned, ((0, 1.0, 4.0, 1 << 30),)) is share
