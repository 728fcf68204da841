"""Kept: values made from stored rows, used again only for the very same row."""

from __future__ import annotations

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
