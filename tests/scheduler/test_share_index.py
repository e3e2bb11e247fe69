"""Issue 46: what keys the cluster's share index (`gpushare.usable_shares`): per who may take room on a machine's
shared GPUs, the free thousandths they find there."""

from __future__ import annotations

from astraeus.scheduler.gpushare import ANY_WORKSPACE, SAME_WORKSPACE, usable_shares


def test_one_workspace_per_gpu_keys_each_gpu_by_its_workspace():
    on = {0: [500, {"a": 1}], 1: [250, {"b": 1}], 2: [750, {"a": 2}], 3: [1000, {"a": 4}]}
    assert usable_shares(on, SAME_WORKSPACE) == {"a": (250, 500), "b": (750,)}  # a full GPU offers nothing


def test_a_gpu_with_two_workspaces_takes_no_one_unless_any_may_share():
    on = {0: [500, {"a": 1, "b": 1}], 1: [250, {"a": 1}]}
    assert usable_shares(on, SAME_WORKSPACE) == {"a": (750,)}
    assert usable_shares(on, ANY_WORKSPACE) == {None: (500, 750)}
