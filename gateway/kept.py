"""What a turn makes again from the same stored rows, kept by row id and used only for the very same row.

Every turn reads its session's history again (up to ``session.max_messages``
rows) and makes the same objects from it: the decoded row (a ``StoredMessage``)
and the history line the model is shown. A stored message never
changes after its insert except for what the ordering lease and a trim write (the
database refuses any other change: migration 0015), so most of that work repeats
the previous turn's. ``Kept`` holds the result by row id **with the source it was
made from**; a caller takes it only when the source it has now is that same source
(the same object, or equal values), so a changed row, another database's row
with the same id, or a row written by another process is made afresh and never
mistaken for an old one. Correct without invalidation, across processes. The
SQLite hot store's source for a message row is its version, created_at and
answering_until in one string: with the rest fixed by the database, the id and that
are the row, and the rows it keeps are not read again (``gateway/hotstore/sqlite.py``,
``_kept_rows``).
"""

from __future__ import annotations

import threading
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

    **No object of its own per entry.** The cyclic collector walks every container
    object made since its last young collection, and one runs once 100,000 more are
    alive (``gateway/heap.py``). A turn's history passes through two of these maps
    (the decoded row, the history line; three until 2026-12-07); with a (source, value)
    pair per entry and three maps they held about nine such objects per message, so
    filling them after a start (16,384 messages) ran a young collection over ~100,000
    objects, 34-59 ms of a stopped loop (``bench/README.md``, forty-first session). The
    source and the value are kept in two maps instead, no pair made, and a source
    should be an object the collector does not track (a string, a number) or one the
    value is made from and would be kept anyway (the decoded row for its history line).

    Meant for one thread (the loop that owns the store), and safe for another's use at
    the same time, which can only cost a value made again, never return a wrong one:
    ``put`` and ``drop`` (under a lock) count themselves before and after they change the
    two maps, and ``get`` returns a value only if none was under way or counted while it
    read the source and the value.
    """

    __slots__ = ("_lock", "_size", "_sources", "_values", "_version")

    def __init__(self, size: int = KEPT_ROWS) -> None:
        self._values: OrderedDict[int, V] = OrderedDict()
        self._sources: dict[int, S] = {}
        self._size = size
        self._lock = threading.Lock()
        self._version = 0  # twice the puts and drops so far, odd during one (``get`` tells one that overlapped it)

    def get(self, key: int, source: S) -> V | None:
        """The value made from ``source`` under ``key``, or None if it was made from anything else."""
        version = self._version
        kept_source = self._sources.get(key)
        if kept_source is not source and (kept_source is None or kept_source != source):
            return None
        value = self._values.get(key)
        if value is None or version & 1 or self._version != version:  # a put or drop during the reads (a thread)
            return None
        try:  # noqa: SIM105 (runs ~100 times a turn: a with-block of contextlib.suppress costs more)
            self._values.move_to_end(key)
        except KeyError:  # another thread let it go meanwhile
            pass
        return value

    def put(self, key: int, source: S, value: V) -> V:
        """Keep ``value`` as made from ``source``; returns it."""
        values, sources = self._values, self._sources
        with self._lock:
            self._version += 1  # odd while it changes the maps: a get that overlaps it gives nothing
            try:
                values[key] = value
                sources[key] = source
                values.move_to_end(key)
                if len(values) > self._size:
                    gone, _ = values.popitem(last=False)
                    sources.pop(gone, None)
            finally:
                self._version += 1
        return value

    def drop(self, key: int) -> None:
        """Forget what is kept under ``key`` (nothing if nothing is)."""
        with self._lock:
            self._version += 1
            try:
                self._sources.pop(key, None)
                self._values.pop(key, None)
            finally:
                self._version += 1

    def __len__(self) -> int:
        return len(self._values)
