"""Why-not lines on a big cluster (issue 19): past `Snapshot.why_not_machines` machines, a waiting worker's lines
are the `EACH` machines it may use with the most free GPUs, each with its own line as on a small cluster, then one
line per reason for every other machine ("gpu-00012, gpu-00013 and 9,978 more machines"). Nothing else in the
plan changes."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from itertools import takewhile

import pytest
from hypothesis import given

from astraeus.scheduler import plan
from astraeus.scheduler import whynot as whynot_module

from .builders import NOW, cluster, machine
from .test_constraint_index import SETTINGS, snapshots

_MORE = re.compile(r"^(\S+), (\S+) and ([\d,]+) more machines$")


def _count(label: str, names: set[str]) -> tuple[int, list[str]]:
    """How many machines a line stands for, and the ones it names."""
    if label in names:
        return 1, [label]
    m = _MORE.match(label)
    if m:
        return int(m.group(3).replace(",", "")) + 2, [m.group(1), m.group(2)]
    shown = label.split(", ")
    assert len(shown) == 2 and set(shown) <= names, label
    return 2, shown


def _without_holders(line: str) -> str:
    return line.split(" (")[0] if line.startswith("not enough free GPUs") else line


@SETTINGS
@given(snapshots())
def test_grouped_lines_count_every_machine_once_with_its_reason(snap):
    full = plan(replace(snap, why_not_limit=None, why_not_machines=None), NOW)
    names = {m.name for m in snap.machines}
    with pytest.MonkeyPatch.context() as mp:
        for each in (0, 1, 3):
            mp.setattr(whynot_module, "EACH", each)
            got = plan(replace(snap, why_not_limit=None, why_not_machines=0), NOW)
            assert replace(got, why_not={}) == replace(full, why_not={})  # nothing but the lines changes
            assert set(got.why_not) == set(full.why_not)
            for worker, lines in got.why_not.items():
                want = dict(full.why_not[worker])
                # the machines with a line of their own come first, each with the line of a small cluster
                # (a group of one machine without holders reads the same: counted as its own line here)
                own = list(takewhile(lambda x, want=want: x[0] in names and x[1] == want[x[0]], lines[:each]))
                rest = Counter({_without_holders(want[m]): 0 for m in want})
                for m in names - {m for m, _ in own}:
                    rest[_without_holders(want[m])] += 1
                seen: Counter = Counter()
                for label, reason in lines[len(own):]:
                    n, shown = _count(label, names)
                    seen[reason] += n
                    for m in shown:
                        assert _without_holders(want[m]) == reason
                    assert seen[reason] == n  # one line per reason
                assert +seen == +rest
                assert len(own) + sum(seen.values()) == len(names)


def test_a_big_cluster_shows_the_machines_closest_to_fitting_then_one_line_per_reason():
    machines = [machine(f"gpu-{i:03d}") for i in range(150)]
    b = cluster(*machines)
    for i in range(150):
        # gpu-000..029 have 7 GPUs free, 030..149 none; one machine is lost
        b.running(f"train-{i}", gpus=1 if i < 30 else 8, on=f"gpu-{i:03d}", prio=5)
    b.machines[149] = replace(b.machines[149], schedulable=False)
    snap = b.waiting("big", gpus=8).build()
    lines = plan(snap, NOW).why_not["big-0"]
    assert lines[:20] == tuple(
        (f"gpu-{i:03d}", f"not enough free GPUs: 7 free, 8 asked (1 held by train-{i} at priority 5)")
        for i in range(20)
    )
    assert lines[20:] == (
        ("gpu-020, gpu-021 and 8 more machines", "not enough free GPUs: 7 free, 8 asked"),
        ("gpu-030, gpu-031 and 117 more machines", "not enough free GPUs: 0 free, 8 asked"),
        ("gpu-149", "machine is not schedulable (lost)"),
    )
    # at or under the size, one line per machine
    assert len(plan(replace(snap, why_not_machines=150), NOW).why_not["big-0"]) == 150
