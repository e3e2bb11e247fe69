"""heap.settle(): what a started control plane or agent holds is left out of the garbage collector's walks, and
garbage made later is still collected (cycles included)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, weakref
from astraeus import heap
import astraeus.app  # what a control plane holds at its start
before = gc.get_freeze_count()
heap.settle()
print(before, gc.get_freeze_count(), gc.get_threshold()[0])

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the collector frees it
gone = weakref.ref(a)
del a, b
kept = [[] for _ in range(heap.YOUNG * 2)]  # enough objects kept for a young collection to run
print(gone() is None)
"""


def test_settle_freezes_what_the_process_holds_and_still_collects_later_cycles():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    first, second = out.stdout.split("\n")[:2]
    before, frozen, young = (int(x) for x in first.split())
    from astraeus import heap

    assert before == 0
    assert frozen > 10_000  # the app's modules, routes and models: out of every later walk
    assert young == heap.YOUNG
    assert second == "True"  # the cycle made after settle() was collected without an explicit gc.collect()
