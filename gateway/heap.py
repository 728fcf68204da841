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

Measured on 2026-12-02 under that load (gc.callbacks, CPU time): a young
collection still took 35-58 ms, about once a second. It walks the turns in
flight, about 60,000 objects with 335,000 references (coroutines, cells,
closures, the history rows made anew), and at about a microsecond an object it
is cache misses, not the count. At (100_000, 50, 100) one such collection ran in
a 15 s load instead of six, and the gateway's CPU was 2.37 against 2.48 ms a
turn (medians of three pairs), but ``/healthz`` p99 was no better (123 against
116 ms): its p50 was already 10-13 ms, the loop's queue at 85% of a core. A
higher threshold also holds five times as much cyclic garbage before it is
found, so the thresholds stayed; fewer objects per turn in flight is what would
shorten these pauses.
"""

from __future__ import annotations

import gc

THRESHOLDS = (20_000, 50, 100)


def settle_heap() -> None:
    """Collect once, freeze what start-up left, and set the server thresholds (call once started)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
