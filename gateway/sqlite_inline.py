"""SQLAlchemy's aiosqlite dialect over a ``sqlite3`` connection called inline: for the background thread.

The background work (``gateway/background.py``) runs on a thread with an event
loop of its own, and nothing on that loop answers a turn. There, a ``sqlite3``
call made inline blocks only the background work, and saves what aiosqlite
costs on every statement: a hand-off to aiosqlite's own thread and back
through the loop's self-pipe, about 117 of them for an extraction job that
writes a summary, and a third thread contending for the GIL with the turns'
loop. The SQL, the dialect, the pool and the transactions are SQLAlchemy's, as
on every other path: only the driver's calls stop crossing threads.

:class:`InlineConnection` and :class:`InlineCursor` are the parts of
aiosqlite's ``Connection`` and ``Cursor`` that SQLAlchemy's adapter
(``sqlalchemy.dialects.sqlite.aiosqlite``) calls, each a coroutine that
completes without suspending. The exceptions are ``sqlite3``'s own, as
aiosqlite raises them.

A wait for SQLite's write lock (another connection's transaction: the turns'
hot store, or a cold path's) happens in SQLite's busy handler, with the GIL
released, on this thread only. Each commit and rollback is reported to the hot
store (:data:`gateway.hotstore.sqlite.RELEASES`), so a turn that found the
database busy tries again the moment this thread's transaction ends.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.hotstore.sqlite import RELEASES


class InlineCursor:
    """An aiosqlite-shaped cursor whose coroutines run ``sqlite3`` inline."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._cursor.close()

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> InlineCursor:
        if parameters is None:
            self._cursor.execute(sql)
        else:
            self._cursor.execute(sql, parameters)
        return self

    async def executemany(self, sql: str, parameters: Iterable[Sequence[Any]]) -> InlineCursor:
        self._cursor.executemany(sql, parameters)
        return self

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cursor.fetchmany(self._cursor.arraysize if size is None else size)

    async def close(self) -> None:
        self._cursor.close()

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value


class _CursorContext:
    """What aiosqlite's ``Connection.cursor()`` returns: awaited, or entered with ``async with``."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def __aenter__(self) -> InlineCursor:
        return InlineCursor(self._conn.cursor())

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __await__(self) -> Any:
        return self.__aenter__().__await__()


class InlineConnection:
    """An aiosqlite-shaped connection over a ``sqlite3`` connection, called inline."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._connection: sqlite3.Connection | None = conn  # truthy while open, as aiosqlite's

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._connection is None:
            raise ValueError("no active connection")
        return self._connection

    def cursor(self) -> _CursorContext:
        return _CursorContext(self._conn)

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> InlineCursor:
        return await InlineCursor(self._conn.cursor()).execute(sql, parameters)

    async def commit(self) -> None:
        held = self._conn.in_transaction  # the pool's reset after a commit ends nothing: nobody to tell
        try:
            self._conn.commit()
        finally:
            if held:
                RELEASES.released()  # a turn waiting for the write lock tries again now

    async def rollback(self) -> None:
        held = self._conn.in_transaction
        try:
            self._conn.rollback()
        finally:
            if held:
                RELEASES.released()

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def stop(self) -> None:
        """Close now (SQLAlchemy's terminate); aiosqlite stops its thread here."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def create_function(self, *args: Any, **kw: Any) -> None:
        self._conn.create_function(*args, **kw)

    @property
    def isolation_level(self) -> str | None:
        return self._conn.isolation_level

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction


def make_inline_engine(url: str, *, echo: bool = False, wal_limit_bytes: int | None = None) -> AsyncEngine:
    """``make_engine(url)`` for SQLite, its driver's calls made inline (one thread and loop only).

    The engine must be used, and disposed, on the thread that made its first
    connection: it is the background thread's.
    """
    from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

    from gateway.db import WAL_LIMIT_BYTES, make_engine

    args, kwargs = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
    database, uri = str(args[0]), bool(kwargs.get("uri", False))

    async def connect() -> InlineConnection:
        # The busy timeout is make_engine's (30 s): a wait for the write lock blocks this thread only.
        return InlineConnection(sqlite3.connect(database, timeout=30, check_same_thread=False, uri=uri))

    limit = WAL_LIMIT_BYTES if wal_limit_bytes is None else wal_limit_bytes
    return make_engine(url, echo=echo, async_creator=connect, wal_limit_bytes=limit)
