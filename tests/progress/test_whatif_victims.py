"""What-if names what each victim of the asker's own workspace loses, as JSON fields too (issue 47): a table over
both victim rules, read from the same plan and its JSON answer (astraeus.server.whatif.view, answers.WhatIfOut)."""

from dataclasses import replace

import pytest

from astraeus import scheduler as sched
from astraeus.server.answers import WhatIfOut
from astraeus.server.whatif import view
from tests.scheduler.test_progress_rules import T0, _snapshot


@pytest.mark.parametrize("victims, run, loses_seconds, loses_gpu_seconds, checkpoint_at", [
    ("least-work-lost", "b-fresh-ckpt", 5.0, 20.0, "2026-10-01T14:01:55Z"),  # its checkpoint 5 s ago, 4 GPUs
    ("recent", "a-new-start", 60.0, 240.0, None),  # no checkpoint: since its start a minute ago
])
def test_each_victim_says_what_it_loses_in_json(victims, run, loses_seconds, loses_gpu_seconds, checkpoint_at):
    snap = _snapshot(victims, T0)
    answer = sched.what_if(replace(snap, waiting=()), snap.waiting[0], T0)
    body = view(answer, "urgent", "main")
    assert body["outcome"] == "Preempts"
    assert body["victims"] == [{"run": run, "loses_seconds": loses_seconds, "loses_gpu_seconds": loses_gpu_seconds,
                                "checkpoint_at": checkpoint_at}]
    assert WhatIfOut.model_validate(body).victims[0].loses_seconds == loses_seconds


def test_another_workspaces_victim_is_not_described():
    snap = _snapshot("least-work-lost", T0)
    snap = replace(snap, running=tuple(replace(u, workspace="other") for u in snap.running),
                   workspaces=snap.workspaces + (sched.Workspace(id="other", name="other"),))
    body = view(sched.what_if(replace(snap, waiting=()), snap.waiting[0], T0), "urgent", "main")
    assert body["outcome"] == "Preempts" and body["victims"] == [], body


def test_an_answer_without_a_plan_time_names_no_figures():
    snap = _snapshot("least-work-lost", T0)
    plan = sched.plan(snap, T0)
    assert sched.answer(plan, snap, "urgent").victim_losses == ()
    assert view(sched.answer(plan, snap, "urgent", T0), "urgent", "main")["victims"][0]["run"] == "b-fresh-ckpt"
