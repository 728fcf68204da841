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

The threshold counts what stays, too: a young collection runs once 100,000 more
objects the collector counts are alive than at the last one. The caches a turn's
history goes through (``gateway/kept.py``) keep two such objects per message (the
decoded row, the history line), at most 32,768 when full. At about nine a message (a
pair per entry) filling them after a start reached the threshold some 5,600 turns in,
and that one collection walked about 97,000 objects, 34-59 ms each time. At four (the
row's key a tuple, a second record type made from each row) the caches alone stayed
under it, but not beside 200 turns waiting on a model (``bench/model_load.py``), whose
own objects were about 52,000: one collection per start, 26-99 ms. Those turns now hold
about 42,000 (their tools are made when the loop needs them, ``gateway/llm/loop.py``).
The count goes up at an object's allocation whether or not the collector tracks it, so an
untracked object still counts; a type made without the collector's header does not. The
decoded row (``StoredMessage``, ``gateway/hotstore/base.py``) is such a type since
2026-12-08: the caches count one object a message (the history line), and a turn waiting
on a model no longer counts its history's rows, which on PostgreSQL it reads afresh. In
that load the young count now peaks at about 65,000 on SQLite and 71,000 on PostgreSQL
(81,000 and 90,000 before; ``goclaw_gc_pending`` on ``/metrics``), and 240 waiting turns on
PostgreSQL (97,000 before, and a collection of 38-50 ms a start) reach about 80,000.
``tests/gateway/test_turn.py`` holds the full caches and those turns under 95,000, as the
collector counts them, and ``tests/gateway/test_model_limit.py`` what each waiting turn holds.
"""

from __future__ import annotations

import gc
import time
from typing import Any

THRESHOLDS = (100_000, 50, 100)

PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
"""Upper bounds (seconds) of the collector-pause histogram ``/metrics`` shows; 20 ms is ``/healthz``'s target."""


class GcPauses:
    """How long this process's cyclic collections stopped it, by generation (``goclaw_gc_pause_seconds``).

    A collection runs on whatever thread allocated last, the event loop's nearly always, and
    nothing else on that loop runs meanwhile: a turn, a ``/healthz`` answer wait for it. Timed
    with ``gc.callbacks``, which the collector calls before and after each collection; the two
    calls cost about a microsecond, against collections a few seconds apart under load.
    """

    def __init__(self) -> None:
        self.counts = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in range(3)]  # per generation, per bucket (+Inf last)
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Start timing collections (once per process; later calls do nothing)."""
        if not self._installed:
            self._installed = True
            gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = info["generation"]
        self.seconds[generation] += took
        self.longest[generation] = max(self.longest[generation], took)
        counts = self.counts[generation]
        for i, bound in enumerate(PAUSE_BUCKETS):
            if took <= bound:
                counts[i] += 1
                return
        counts[-1] += 1


PAUSES = GcPauses()
"""This process's collector pauses (``gateway.metrics`` shows them)."""


def settle_heap() -> None:
    """Collect once, freeze what start-up left, set the server thresholds and time collections from now on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    PAUSES.install()
