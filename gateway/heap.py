"""The cyclic garbage collector, set for a long-running server once it has started.

Reference counting frees almost everything a turn makes; the cyclic collector
only has to find cycles. With CPython's default thresholds (700, 10, 10) it ran
about 1,300 times in a 20 s load of 200 sessions on a 500 ms model (about 6,000
turns), for 2.2 s of the gateway's CPU, and its full collections walked every
object in flight, stopping the event loop for up to 200 ms each
(``bench/model_load.py``). So, once the process has started:

- ``gc.freeze()`` moves everything start-up made (modules, tables, config, the
  app and its routes) out of the collector's way for good;
- the thresholds become :data:`THRESHOLDS`: a young collection per 20,000 net
  allocations (a few turns' worth, most of it already freed by then), an older
  one every 50 of those, and a full one at most every 100 of those. Cycles are
  still found; the collector just stops walking the same live objects.
"""

from __future__ import annotations

import gc

THRESHOLDS = (20_000, 50, 100)


def settle_heap() -> None:
    """Collect once, freeze what start-up left, and set the server thresholds (call once started)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
