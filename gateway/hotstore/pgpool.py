"""A small pool of asyncpg connections for the hot path: a checkout that costs nothing when one is idle.

asyncpg's own ``Pool`` cost about as much CPU per statement as the statement
itself (a ``SELECT 1`` on this machine: 0.51 ms through the pool, 0.26 ms on the
connection). Every release went through ``asyncio.shield`` (a new task, so one
more pass of the event loop before the turn went on), the reset hook, and an
inactivity timer cancelled at checkout and armed again at release; a turn makes
four checkouts. Here a checkout takes the connection released last without
suspending, and a release gives it back without awaiting.

Only a connection in a known state goes back: the block that used it ended
without an exception and left no transaction open. Any other (a statement that
failed, a task cancelled mid-statement, a connection the server dropped) is
terminated, which rolls back whatever it had open on the server, and a later
checkout opens a new one. The hot path's statements raise nothing in normal
operation, so this costs a reconnect only after a fault, and a fault never
leaves a connection half-used for the next turn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any


class PoolClosed(ConnectionError):
    """A checkout from a pool that was closed (the gateway stopping or its engine disposed)."""


class ConnectionPool:
    """Up to ``max_size`` asyncpg connections, opened on demand, the last one released used first."""

    def __init__(self, dsn: str, *, max_size: int, init: Callable[[Any], Awaitable[None]] | None = None) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.dsn = dsn
        self.max_size = max_size
        self._init = init
        self._idle: list[Any] = []
        self._size = 0  # connections open or being opened, idle or checked out
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def size(self) -> int:
        """Connections open or being opened."""
        return self._size

    @property
    def idle(self) -> int:
        """Connections waiting for a checkout."""
        return len(self._idle)

    async def checkout(self) -> Any:
        """A connection for the caller alone until :meth:`checkin`; waits while every one is in use."""
        while True:
            if self._closed:
                raise PoolClosed("the database pool is closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    return conn
                self._size -= 1  # closed while idle (the server went away): open another below
            if self._size < self.max_size:
                return await self._open()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken and cancelled at once: the next waiter takes the turn
                else:
                    self._waiters.remove(waiter)
                raise

    def checkin(self, conn: Any, *, clean: bool) -> None:
        """Give ``conn`` back: kept if ``clean`` and in no transaction, else terminated (never awaits)."""
        if clean and not self._closed and not conn.is_closed() and not conn.is_in_transaction():
            self._idle.append(conn)
        else:
            conn.terminate()
            self._size -= 1
        self._wake()

    def acquire(self) -> _Checkout:
        """``async with pool.acquire() as conn``: a checkout, given back when the block ends."""
        return _Checkout(self)

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        """``conn.fetch`` on a checkout."""
        async with _Checkout(self) as conn:
            rows: list[Any] = await conn.fetch(query, *args)
            return rows

    async def fetchrow(self, query: str, *args: Any) -> Any:
        """``conn.fetchrow`` on a checkout."""
        async with _Checkout(self) as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        """``conn.fetchval`` on a checkout."""
        row = await self.fetchrow(query, *args)
        return None if row is None else row[0]

    async def execute(self, query: str, *args: Any) -> str:
        """``conn.execute`` on a checkout."""
        async with _Checkout(self) as conn:
            status: str = await conn.execute(query, *args)
            return status

    async def close(self) -> None:
        """Close the idle connections; one still checked out is terminated when it comes back."""
        idle = self._shut()
        try:
            for conn in idle:
                try:
                    await conn.close(timeout=5)
                except Exception:  # closing anyway: drop it
                    conn.terminate()
        finally:  # cancelled halfway: the rest are dropped at once, never left open
            for conn in idle:
                if not conn.is_closed():
                    conn.terminate()

    def terminate(self) -> None:
        """Drop the idle connections at once (when awaiting is impossible)."""
        for conn in self._shut():
            conn.terminate()

    def _shut(self) -> list[Any]:
        """Refuse checkouts from now on, wake every waiter (to be refused), and hand over the idle connections."""
        self._closed = True
        idle, self._idle = self._idle, []
        self._size -= len(idle)
        self._wake_all()
        return idle

    async def _open(self) -> Any:
        import asyncpg

        self._size += 1
        conn = None
        try:
            conn = await asyncpg.connect(self.dsn)
            if self._init is not None:
                await self._init(conn)
        except BaseException:
            if conn is not None:
                conn.terminate()
            self._size -= 1
            self._wake()  # a waiter may open one in its place
            raise
        return conn

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class _Checkout:
    """One checkout as an ``async with`` block: given back clean only if the block ended without an exception."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        self._conn = await self._pool.checkout()
        return self._conn

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._pool.checkin(self._conn, clean=exc_type is None)
