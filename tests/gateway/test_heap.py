"""The server's collector settings (gateway/heap.py): cycles are still freed, start-up's objects not walked."""

from __future__ import annotations

import gc
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
