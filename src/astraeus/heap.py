"""The garbage collector of a long-lived Astraeus process: the control plane and the agent.

CPython's cyclic collector looks at the young objects every 700 allocations and, now and then, at every tracked
object. What these processes hold from their start (modules, the app and its routes, SQLAlchemy's mappers and
compiled statements, pydantic's models: hundreds of thousands of objects) never becomes garbage, yet every full
collection walks it, a visible share of both processes' CPU under load (benchmarks/README.md, "A fleet's agents" and "API submit rate").

settle(), once the process has started: one full collection, then gc.freeze() (what is alive now is left out of
every later collection: it is only ever freed by reference counting, as it would have been) and a young
generation of YOUNG allocations instead of 700 (fewer collections; garbage that only the collector can free, cycles,
waits a few milliseconds longer). Objects freed by reference counting, nearly all, go at once as before.
"""

from __future__ import annotations

import gc

YOUNG = 10_000


def settle() -> None:
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
