"""Kept: values made from stored rows, used again only for the very same row."""

from __future__ import annotations

import gc
from collections import OrderedDict

from gateway.kept import Kept


def test_a_kept_value_is_given_only_for_the_source_it_was_made_from() -> None:
    kept: Kept[tuple[int, str], str] = Kept()
    row = (1, "hello")
    assert kept.get(1, row) is None
    assert kept.put(1, row, "made from hello") == "made from hello"
    assert kept.get(1, row) == "made from hello"
    assert kept.get(1, (1, "hello")) == "made from hello"  # equal values read again: the same row
    assert kept.get(1, (1, "changed")) is None  # the row changed (or another database's row 1)
    kept.put(1, (1, "changed"), "made from changed")
    assert kept.get(1, row) is None and kept.get(1, (1, "changed")) == "made from changed"


def test_the_least_recently_used_goes_first_when_full() -> None:
    kept: Kept[str, int] = Kept(size=3)
    for i in range(3):
        kept.put(i, f"r{i}", i)
    assert kept.get(0, "r0") == 0  # used: now the newest
    kept.put(3, "r3", 3)
    assert len(kept) == 3
    assert kept.get(1, "r1") is None  # the least recently used went
    assert [kept.get(i, f"r{i}") for i in (0, 2, 3)] == [0, 2, 3]


def test_a_kept_entry_makes_no_object_the_cyclic_collector_walks() -> None:
    # gateway/kept.py: the collector walks every container object made since its last young
    # collection; a (source, value) pair per entry made the history's caches hold twice the objects.
    kept: Kept[tuple[int, str], list[int]] = Kept(size=5_000)
    sources = [(i, f"created {i}") for i in range(2_000)]
    values = [[i] for i in range(2_000)]
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i in range(2_000):
            kept.put(i, sources[i], values[i])
        for i in range(2_000):
            assert kept.get(i, sources[i]) is values[i]
        made = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert made < 20, f"{made} objects made for 2,000 kept entries"


def test_a_value_replaced_or_dropped_is_not_given_for_the_old_source() -> None:
    kept: Kept[str, str] = Kept()
    kept.put(7, "old row", "from old")
    kept.put(7, "new row", "from new")
    assert kept.get(7, "old row") is None and kept.get(7, "new row") == "from new"
    kept.drop(7)
    assert kept.get(7, "new row") is None and len(kept) == 0


def test_a_value_put_by_another_thread_during_a_get_is_not_given_for_the_old_source() -> None:
    # Kept is the loop's, but a thread of the job process may use the same store's at the same time: here
    # the other thread's put runs exactly between the get's read of the source and its read of the value.
    kept: Kept[str, str] = Kept()
    kept.put(1, "old row", "from old")

    class OtherThreadPutsNow(dict):  # type: ignore[type-arg]
        interleaved = False

        def get(self, key: object, default: object = None) -> object:
            found = super().get(key, default)
            if not self.interleaved:
                self.interleaved = True
                kept.put(1, "new row", "from new")
            return found

    kept._sources = OtherThreadPutsNow(kept._sources)  # type: ignore[assignment]
    assert kept.get(1, "old row") is None  # not "from new": it was made from another row
    assert kept.get(1, "new row") == "from new"


def test_a_get_by_another_thread_during_a_put_never_pairs_the_old_source_with_the_new_value() -> None:
    # The other way round: the other thread's get runs just after the put wrote the new value.
    kept: Kept[str, str] = Kept()
    kept.put(1, "old row", "from old")
    seen: list[str | None] = []

    class OtherThreadGetsNow(OrderedDict):  # type: ignore[type-arg]
        armed = False

        def __setitem__(self, key: object, value: object) -> None:
            super().__setitem__(key, value)
            if self.armed:
                seen.append(kept.get(1, "old row"))

    kept._values = OtherThreadGetsNow(kept._values)  # type: ignore[assignment]
    kept._values.armed = True  # type: ignore[attr-defined]
    kept.put(1, "new row", "from new")
    assert seen == [None]  # not "from new" for the old row
    assert kept.get(1, "new row") == "from new"
