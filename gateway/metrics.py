"""Prometheus metrics of one gateway process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class Metrics:
    """Counters and histograms, on a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.turns = Counter("goclaw_turns", "Turns handled", ["channel", "outcome"], registry=self.registry)
        self.turn_seconds = Histogram(
            "goclaw_turn_seconds",
            "Turn latency",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.llm_calls = Counter("goclaw_llm_calls", "LLM calls", ["provider"], registry=self.registry)
        self.llm_errors = Counter("goclaw_llm_errors", "LLM calls that failed", ["provider"], registry=self.registry)
        self.queue_depth = Gauge("goclaw_queue_depth", "Jobs waiting plus turns in flight", registry=self.registry)
        self.in_flight = Gauge("goclaw_turns_in_flight", "Turns being handled", registry=self.registry)
        self.jobs = Counter("goclaw_jobs", "Background jobs", ["kind", "outcome"], registry=self.registry)
        self.registry.register(_WriteLockWaits())
        self.registry.register(_GcPauses())
        self.registry.register(_TurnstileWaits())

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


class _WriteLockWaits(Collector):
    """On SQLite, what this process's hot-store writes (its turns', its worker thread's) waited for the write lock.

    Held by the job process's writes, mostly (``gateway.hotstore.sqlite.RELEASES``); always 0 on PostgreSQL.
    """

    def collect(self) -> Iterator[Metric]:
        from gateway.hotstore.sqlite import RELEASES

        yield CounterMetricFamily(
            "goclaw_sqlite_write_waits",
            "Hot-store writes (turns) that found SQLite's write lock held",
            value=RELEASES.waits,
        )
        yield CounterMetricFamily(
            "goclaw_sqlite_write_busy_tries",
            "Tries of those writes that found the lock held (2 ms of inline polls are one; more: waits for a release)",
            value=RELEASES.busy_tries,
        )
        yield CounterMetricFamily(
            "goclaw_sqlite_write_wait_seconds",
            "Seconds hot-store writes (turns) waited for SQLite's write lock",
            value=RELEASES.wait_seconds,
        )


class _TurnstileWaits(Collector):
    """Pieces of turns that waited for a later pass of the event loop (``gateway.turnstile``)."""

    def collect(self) -> Iterator[Metric]:
        from gateway.turnstile import STATS

        yield CounterMetricFamily(
            "goclaw_turnstile_waits",
            "Pieces of turns that waited for a later pass of the event loop, the loop's sockets read meanwhile",
            value=STATS.waited,
        )


class _GcPauses(Collector):
    """This process's cyclic-collector pauses (``gateway.heap.PAUSES``), by generation.

    The event loop stands still for each: under load these are what a ``/healthz`` or a
    turn waits for when nothing else is slow (``bench/model_load.py`` prints them).
    """

    def __init__(self) -> None:
        from gateway.heap import PAUSES

        PAUSES.install()  # timed from the first /metrics registry on, in any process that serves one
        self._pauses = PAUSES

    def collect(self) -> Iterator[Metric]:
        from gateway.heap import PAUSE_BUCKETS

        pauses = self._pauses
        histogram = HistogramMetricFamily(
            "goclaw_gc_pause_seconds",
            "Cyclic garbage collections of this process and how long each stopped it",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "goclaw_gc_pause_longest_seconds",
            "The longest cyclic garbage collection of this process so far",
            labels=["generation"],
        )
        for generation in range(3):
            counts, cumulative, buckets = pauses.counts[generation], 0, []
            for bound, count in zip((*map(str, PAUSE_BUCKETS), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric([str(generation)], buckets, sum_value=pauses.seconds[generation])
            longest.add_metric([str(generation)], pauses.longest[generation])
        yield histogram
        yield longest
        # How near the next collection is: the young generation's count is the objects the collector
        # counts (allocated less freed) since the last young collection, which runs when it passes the
        # threshold (gateway/heap.py); each older count is the collections of the one below since.
        pending = GaugeMetricFamily(
            "goclaw_gc_pending",
            "Per generation, what this process's next cyclic collection of it counts toward its threshold",
            labels=["generation"],
        )
        threshold = GaugeMetricFamily(
            "goclaw_gc_threshold", "Per generation, the count at which a collection of it runs", labels=["generation"]
        )
        for generation, (count, limit) in enumerate(zip(gc.get_count(), gc.get_threshold(), strict=True)):
            pending.add_metric([str(generation)], count)
            threshold.add_metric([str(generation)], limit)
        yield pending
        yield threshold
