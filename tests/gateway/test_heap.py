"""The server's collector settings (gateway/heap.py): cycles are still freed, start-up's objects not walked."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from gateway.heap import THRESHOLDS, settle_heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_cyclic_garbage_made_after_start_is_still_freed_without_an_explicit_collect(restored_collector: None) -> None:
    settle_heap()
    assert gc.get_threshold() == THRESHOLDS
    assert gc.get_freeze_count() > 0  # what existed at start-up is out of the collector's way
    freed = []
    for _ in range(200):
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: reference counting alone never frees it
        weakref.finalize(a, freed.append, 1)
        del a, b
    # About as many allocations as a few turns make: the young collection finds the cycles on its own.
    churn = [[i] for i in range(THRESHOLDS[0] * 3)]
    del churn
    assert len(freed) == 200


def _metric(body: str, name: str) -> float:
    return float(next(line.split(" ")[1] for line in body.splitlines() if line.startswith(name + " ")))


def test_metrics_show_how_long_each_generations_collections_stopped_the_process(restored_collector: None) -> None:
    """``/metrics`` counts the collector's pauses by generation and times them (the loop stands still for each)."""
    from gateway.metrics import Metrics

    metrics = Metrics()
    gc.disable()  # only the collection asked for below runs
    try:
        # Something to walk: a full collection over 300,000 live containers takes milliseconds.
        live = [[i] for i in range(300_000)]
        before = metrics.render().decode()
        started = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - started
        after = metrics.render().decode()
        del live
    finally:
        gc.enable()

    count, total = 'goclaw_gc_pause_seconds_count{generation="2"}', 'goclaw_gc_pause_seconds_sum{generation="2"}'
    assert _metric(after, count) == _metric(before, count) + 1
    paused = _metric(after, total) - _metric(before, total)
    assert 0 < paused <= took  # timed inside the call, by the collector's own callbacks
    assert _metric(after, 'goclaw_gc_pause_seconds_bucket{generation="2",le="+Inf"}') == _metric(after, count)
    assert _metric(after, 'goclaw_gc_pause_longest_seconds{generation="2"}') >= paused


def test_collections_are_timed_once_however_many_registries_are_made() -> None:
    """Each app makes its own metrics; the collector's callback is installed once per process."""
    from gateway.heap import PAUSES
    from gateway.metrics import Metrics

    Metrics(), Metrics()
    settle_heap_callbacks = [cb for cb in gc.callbacks if getattr(cb, "__self__", None) is PAUSES]
    assert len(settle_heap_callbacks) == 1


def test_metrics_show_how_near_the_next_young_collection_is(restored_collector: None) -> None:
    """``/metrics`` shows the young generation's count beside its threshold: what is left before the loop stops."""
    from gateway.metrics import Metrics

    metrics = Metrics()
    settle_heap()
    gc.disable()  # nothing collected between the two reads
    try:
        before = metrics.render().decode()
        kept = [[i] for i in range(20_000)]  # 20,001 objects the collector counts, alive
        after = metrics.render().decode()
    finally:
        gc.enable()
    pending = 'goclaw_gc_pending{generation="0"}'
    # Rendering makes and frees a few objects of its own; the 20,000 kept are what stays.
    assert 20_000 <= _metric(after, pending) - _metric(before, pending) < 20_500
    assert _metric(after, 'goclaw_gc_threshold{generation="0"}') == THRESHOLDS[0]
    assert _metric(after, 'goclaw_gc_threshold{generation="2"}') == THRESHOLDS[2]
    del kept
