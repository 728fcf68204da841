"""The hot path's PostgreSQL pool, on a real PostgreSQL: reuse, its bound, and what a fault leaves behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.hotstore.pgpool import ConnectionPool, PoolClosed
from gateway.write_health import storage_reason


@pytest.fixture
async def pool(pg_url: str) -> AsyncIterator[ConnectionPool]:
    p = ConnectionPool(pg_url.replace("postgresql+asyncpg://", "postgresql://"), max_size=2)
    try:
        yield p
    finally:
        await p.close()


async def _backends(pool: ConnectionPool) -> set[int]:
    """The server processes of this pool's database, seen from a connection of its own."""
    conn = await asyncpg.connect(pool.dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return {r[0] for r in rows}
    finally:
        await conn.close()


async def test_statements_one_after_another_share_one_connection(pool: ConnectionPool) -> None:
    pids = {await pool.fetchval("SELECT pg_backend_pid()") for _ in range(20)}
    assert len(pids) == 1 and pool.size == 1 and pool.idle == 1
    async with pool.acquire() as conn:
        assert conn.get_server_pid() in pids and pool.idle == 0


async def test_no_more_connections_than_max_size_and_a_waiter_gets_the_released_one(pool: ConnectionPool) -> None:
    held = [await pool.checkout(), await pool.checkout()]
    third = asyncio.create_task(pool.fetchval("SELECT pg_backend_pid()"))
    await asyncio.sleep(0.05)
    assert not third.done() and pool.size == 2  # every connection is in use: it waits, opens none
    released = held.pop()
    pool.checkin(released, clean=True)
    assert await asyncio.wait_for(third, 5) == released.get_server_pid()
    pool.checkin(held.pop(), clean=True)
    assert pool.size == 2 and len(await _backends(pool)) == 2


async def test_a_waiter_cancelled_passes_its_turn_on(pool: ConnectionPool) -> None:
    held = [await pool.checkout(), await pool.checkout()]
    first = asyncio.create_task(pool.checkout())
    second = asyncio.create_task(pool.fetchval("SELECT 1"))
    await asyncio.sleep(0.05)
    pool.checkin(held.pop(), clean=True)  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs: `second` must not wait for ever
    assert await asyncio.wait_for(second, 5) == 1
    with pytest.raises(asyncio.CancelledError):
        await first
    pool.checkin(held.pop(), clean=True)
    assert pool.size <= 2


async def test_a_block_that_raised_or_left_a_transaction_open_drops_its_connection(pool: ConnectionPool) -> None:
    pids: list[int] = []

    async def failing() -> None:
        async with pool.acquire() as conn, conn.transaction():
            pids.append(conn.get_server_pid())
            await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            await conn.execute("INSERT INTO t VALUES (1), (1)")

    with pytest.raises(asyncpg.UniqueViolationError):
        await failing()
    assert pool.size == 0 and pool.idle == 0
    async with pool.acquire() as conn:
        pids.append(conn.get_server_pid())
        await conn.execute("BEGIN")
        await conn.execute("CREATE TABLE left_open (id int)")
    dropped, left = pids
    assert pool.size == 0  # given back in a transaction: terminated, and the server rolled it back
    for _ in range(50):
        if not {dropped, left} & await _backends(pool):
            break
        await asyncio.sleep(0.05)
    assert not {dropped, left} & await _backends(pool)
    assert await pool.fetchval("SELECT to_regclass('left_open') IS NULL AND to_regclass('t') IS NULL") is True


async def test_a_connection_the_server_dropped_fails_one_statement_as_a_storage_fault_then_is_replaced(
    pool: ConnectionPool,
) -> None:
    first = await pool.fetchval("SELECT pg_backend_pid()")
    admin = await asyncpg.connect(pool.dsn)
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", first)
    finally:
        await admin.close()
    await asyncio.sleep(0.1)
    # Either the pool saw the connection close while idle and opened another, or this one
    # statement fails as a storage fault (a 503 that says so), never as a 500.
    outcome = await asyncio.gather(pool.fetchval("SELECT 1"), return_exceptions=True)
    assert outcome == [1] or storage_reason(outcome[0]) is not None, outcome
    replaced = await pool.fetchval("SELECT pg_backend_pid()")
    assert replaced != first and pool.size == 1


async def test_a_closed_pool_refuses_checkouts_as_a_storage_fault(pool: ConnectionPool) -> None:
    held = await pool.checkout()
    await pool.fetchval("SELECT 1")
    await pool.close()
    with pytest.raises(PoolClosed) as refused:
        await pool.checkout()
    assert storage_reason(refused.value) is not None
    pool.checkin(held, clean=True)  # a connection out at close is terminated when it comes back
    assert held.is_closed() and pool.size == 0


async def test_a_close_cancelled_halfway_leaves_no_connection_open(pool: ConnectionPool) -> None:
    held = [await pool.checkout(), await pool.checkout()]
    for conn in held:
        pool.checkin(conn, clean=True)
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0)  # inside close(), awaiting the first connection's goodbye
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert all(conn.is_closed() for conn in held) and pool.size == 0
