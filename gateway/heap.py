"""The cyclic garbage collector, set for a long-running server once it has started.

Reference counting frees almost everything a turn makes; the cyclic collector
only has to find cycles. With CPython's default thresholds (700, 10, 10) it ran
about 1,300 times in a 20 s load of 200 sessions on a 500 ms model (about 6,000
turns), for 2.2 s of the gateway's CPU, and its full collections walked every
object in flight, stopping the event loop for up to 200 ms each
(``bench/model_load.py``). So, once the process has started:

- ``gc.freeze()`` moves everything start-up made (modules, tables, config, the
  app and its routes) out of the collector's way for good;
- the thresholds become :data:`THRESHOLDS`: a young collection per 100,000 net
  allocations (several seconds of a busy gateway), an older one every 50 of
  those, and a full one at most every 100 of those. Cycles are still found; the
  collector just stops walking the same live objects.

What a young collection costs is the objects alive when it runs, not the
allocations between two of them: reference counting has already freed the rest.
Under ``bench/model_load.py`` (200 sessions on a 500 ms model) those are the
objects of the turns in flight, and walking them took 13-25 ms whether the
threshold was 20,000 or 100,000 (measured with ``gc.callbacks`` on 2026-12-02).
At 20,000 that pause came every one to two seconds, 2% of the time, so it was
what ``/healthz``'s p99 measured; at 100,000 it comes every ten seconds or more.
The same collections found 0 to 7 cyclic objects each: what a turn makes is
freed by reference counting, so waiting longer holds almost no garbage.
``/healthz`` p99 in three alternating pairs: 18.0 / 29.3 / 18.6 ms against
22.8 / 31.8 / 24.4 ms at 20,000. Lower thresholds were no better (one pair each:
(700, 10, 100) 30.7 against 20.3 ms, (5,000, 20, 100) 26.4 against 22.8): the
turns in flight survive a young collection into the older generation, whose
collections then walk them all.
"""

from __future__ import annotations

import gc

THRESHOLDS = (100_000, 50, 100)


def settle_heap() -> None:
    """Collect once, freeze what start-up left, and set the server thresholds (call once started)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
