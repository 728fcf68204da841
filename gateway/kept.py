"""What a turn makes again from the same stored rows, kept by row id and used only for the very same row.

Every turn reads its session's history again (up to ``session.max_messages``
rows) and makes the same objects from it: the decoded row, the
``StoredMessage``, the history line the model is shown and its token
estimate. A stored message never changes after its insert except for what the
ordering lease and a trim write (the database refuses any other change: migration
0015), so most of that work repeats the previous turn's. ``Kept`` holds the
result by row id **with the source it was made
from**; a caller takes it only when the source it has now is that same source
(the same object, or equal values), so a changed row, another database's row
with the same id, or a row written by another process is made afresh and never
mistaken for an old one. Correct without invalidation, across processes. The
SQLite hot store's source for a message row is its key, (id, created_at,
answering_until): with the rest fixed by the database, that is the row, and the
rows it keeps are not read again (``gateway/hotstore/sqlite.py``, ``_kept_rows``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

S = TypeVar("S")
V = TypeVar("V")

KEPT_ROWS = 16_384
"""About 400 sessions' worth of history (``session.max_messages`` 40): the sessions answered lately.

Least recently used goes first, so a rotation of sessions larger than this keeps
nothing: each session comes back after all the others have pushed its rows out. At
4,096 (100 sessions) the 200 sessions of ``bench/model_load.py`` made every history
row again on every turn, about a tenth of the turn's CPU. A kept row costs a few
hundred bytes; the serving process's resident memory under that load was the same
within 2 MB at either size.
"""


class Kept(Generic[S, V]):
    """A bounded map of row id -> (source, value made from it); the least recently used goes first.

    Meant for one thread (the loop that owns the store); another thread's use at the same time
    can only cost a value made again, never return a wrong one.
    """

    __slots__ = ("_items", "_size")

    def __init__(self, size: int = KEPT_ROWS) -> None:
        self._items: OrderedDict[int, tuple[S, V]] = OrderedDict()
        self._size = size

    def get(self, key: int, source: S) -> V | None:
        """The value made from ``source`` under ``key``, or None if it was made from anything else."""
        hit = self._items.get(key)
        if hit is None:
            return None
        kept_source, value = hit
        if kept_source is not source and kept_source != source:
            return None
        try:  # noqa: SIM105 (runs ~100 times a turn: a with-block of contextlib.suppress costs more)
            self._items.move_to_end(key)
        except KeyError:  # another thread let it go meanwhile
            pass
        return value

    def put(self, key: int, source: S, value: V) -> V:
        """Keep ``value`` as made from ``source``; returns it."""
        items = self._items
        items[key] = (source, value)
        try:
            items.move_to_end(key)
            if len(items) > self._size:
                items.popitem(last=False)
        except KeyError:
            pass
        return value

    def drop(self, key: int) -> None:
        """Forget what is kept under ``key`` (nothing if nothing is)."""
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)
