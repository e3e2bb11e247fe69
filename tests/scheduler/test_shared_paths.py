"""The scheduler takes shortcuts for the common case (a run that may use any machine, why-not lines built from
per-shape templates, workspaces without a quota merged once in queue order). These properties check that the
shortcuts say what the general path says."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given

from astraeus.scheduler import NodeSelection, plan

from .builders import NOW
from .test_properties import SETTINGS, snapshots


@SETTINGS
@given(snapshots(max_waiting=8))
def test_why_not_lines_do_not_depend_on_the_limit(snap):
    full = plan(replace(snap, why_not_limit=None), NOW)
    for limit in (1, 3):
        part = plan(replace(snap, why_not_limit=limit), NOW)
        assert set(part.why_not) <= set(full.why_not)
        for worker, lines in part.why_not.items():
            assert lines == full.why_not[worker]
        assert replace(part, why_not={}) == replace(full, why_not={})


@SETTINGS
@given(snapshots(max_waiting=8))
def test_selecting_every_machine_by_name_is_the_same_as_any(snap):
    names = tuple(m.name for m in snap.machines)
    anywhere = replace(snap, why_not_limit=None)
    by_name = replace(anywhere, waiting=tuple(
        replace(r, node_selection=NodeSelection("Names", names)) for r in snap.waiting
    ))
    a, b = plan(anywhere, NOW), plan(by_name, NOW)
    if any(r.startswith("Cannot run") for r in a.reasons.values()):
        return  # the wording says "the largest machine it may use" for a selection
    assert a.starts == b.starts
    assert a.stops == b.stops
    assert a.why_not == b.why_not
    assert a.reasons == b.reasons


@SETTINGS
@given(snapshots(max_waiting=8, quotas=False))
def test_without_quotas_fair_share_orders_by_submission(snap):
    # No workspace has a quota, so every share is 0: within a priority, runs go by submission time.
    assert plan(snap, NOW) == plan(replace(snap, fair_share=False), NOW)
