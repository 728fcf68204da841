"""The cold paths' SQLAlchemy engine on a real PostgreSQL: a pooled connection is pinged only after it sat idle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

import gateway.db as db
from gateway.write_health import storage_reason


@pytest.fixture
async def pg_engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    eng = db.make_engine(pg_url)
    try:
        yield eng
    finally:
        await eng.dispose()


def _count_pings(eng: AsyncEngine) -> list[None]:
    """Each ping the engine's pool makes appends to the returned list (the dialect's own ping still runs)."""
    pings: list[None] = []
    ping = eng.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        pings.append(None)
        return ping(dbapi_conn)

    eng.dialect.do_ping = counted  # type: ignore[method-assign]
    return pings


async def _backend(eng: AsyncEngine) -> int:
    async with eng.connect() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _terminate(pg_url: str, pid: int) -> None:
    admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await asyncio.sleep(0.1)


async def test_sessions_one_after_another_reuse_the_connection_without_pinging_it(pg_engine: AsyncEngine) -> None:
    pings = _count_pings(pg_engine)
    pids = {await _backend(pg_engine) for _ in range(10)}
    # pool_pre_ping pinged at each of the ten checkouts: three round trips each with asyncpg.
    assert len(pids) == 1 and pings == []


async def test_a_connection_idle_past_the_limit_is_pinged_at_checkout(
    pg_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.05)
    pings = _count_pings(pg_engine)
    first = await _backend(pg_engine)
    await asyncio.sleep(0.1)
    assert await _backend(pg_engine) == first and len(pings) == 1


async def test_a_connection_that_died_while_idle_is_replaced_before_anything_uses_it(
    pg_engine: AsyncEngine, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.05)
    first = await _backend(pg_engine)
    await _terminate(pg_url, first)
    assert await _backend(pg_engine) != first  # no error reached the caller


async def test_a_connection_that_died_a_moment_after_use_fails_once_as_a_storage_fault(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    first = await _backend(pg_engine)
    await _terminate(pg_url, first)  # 0.1 s later: well inside PING_AFTER_IDLE_S, so no ping
    with pytest.raises(DBAPIError) as failed:
        await _backend(pg_engine)
    assert storage_reason(failed.value) is not None  # a 503 that says so, never a 500
    assert await _backend(pg_engine) != first
