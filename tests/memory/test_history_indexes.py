"""Two reads that grew with history seek what they want (real SQLite and PostgreSQL, migrated to head).

- A stranger's DM asks for their pairing code: the channel's pending requests not yet expired.
  An expired request stays 'pending', so on (channel, status) the read walked every code that
  ever expired on the channel.
- Every automatic distillation (every 5 minutes) reads the undone revisions, its vetoes. A
  revision row is written for every retirement and few are undone; with no index on
  ``undone_at`` the read went through them all.

Migration 0021 indexes both; these check the plans of the statements really sent.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from memory.models import MemoryRecord, MemoryRevision
from memory.store import MemoryStore
from memory.words import subject_key
from pairing.models import PairingRequest
from pairing.store import PairingStore
from tests.conftest import Clock, alembic_downgrade, captured_reads, explain_captured, pg_rows_visited, pg_scans

HISTORY = 3_000


async def _analyze(engine: AsyncEngine, *tables: str) -> None:
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE " + ", ".join(tables))  # as autovacuum does after a load


async def _plans(engine: AsyncEngine, reads: list[tuple[str, Any]]) -> list[str]:
    assert reads, "nothing was read"
    return [await explain_captured(engine, statement, params, analyze=True) for statement, params in reads]


def _visits_at_most(engine: AsyncEngine, plan: str, table: str, rows: int, index: str) -> bool:
    """SQLite: every access of ``table`` goes through ``index``. PostgreSQL: no sequential scan of it, and its
    scans produced or filtered out at most ``rows`` rows."""
    if engine.dialect.name == "sqlite":
        steps = [line for line in plan.splitlines() if table in line]
        return bool(steps) and all(
            f"USING INDEX {index}" in line or f"USING COVERING INDEX {index}" in line for line in steps
        )
    scans = pg_scans(plan, table)
    return bool(scans) and not any(n["Node Type"] == "Seq Scan" for n in scans) and pg_rows_visited(scans) <= rows


async def test_a_strangers_code_request_seeks_the_live_requests(engine: AsyncEngine, clock: Clock) -> None:
    old = clock.now - timedelta(days=30)
    expired = [
        {"channel": "discord", "code": f"C{i:07d}", "platform_user_id": f"p{i}", "display_name": f"p{i}",
         "created_at": old - timedelta(minutes=i), "expires_at": old - timedelta(minutes=i) + timedelta(hours=1),
         "status": "pending"}
        for i in range(HISTORY)
    ]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(PairingRequest.__table__.insert(), expired)
    pairing = PairingStore(engine, clock=clock)
    first = await pairing.request_code("discord", "stranger-1", "Stranger")
    await _analyze(engine, "pairing_requests")
    with captured_reads(engine, "pairing_requests") as reads:
        again = await pairing.request_code("discord", "stranger-1", "Stranger")
    assert (again.code, again.new) == (first.code, False)  # a repeat DM gets the same code back
    for plan in await _plans(engine, reads):
        # Before: SEARCH pairing_requests USING INDEX ix_pairing_requests_channel_status (channel=? AND status=?)
        assert _visits_at_most(engine, plan, "pairing_requests", 1, "ix_pairing_requests_channel_status_expiry"), plan


def _record(i: int) -> dict[str, Any]:
    return {
        "id": f"m_fill{i:06d}", "scope": "personal", "owner_user_id": "u_bob", "subject": "Timezone",
        "subject_key": subject_key("Timezone"), "content": f"UTC+{i}", "status": "superseded",
        "said_at": None, "recorded_at": None, "review_by": None, "source": "live", "author_user_id": "u_bob",
        "author_role": "user", "session_id": "s_fill", "evidence": ["msg-1"], "run_id": None, "superseded_by": None,
    }  # fmt: skip


async def test_the_vetoes_read_seeks_the_undone_revisions(
    engine: AsyncEngine, store: MemoryStore, clock: Clock
) -> None:
    records = [{**_record(i), "said_at": clock.now, "recorded_at": clock.now} for i in range(2)]
    revisions = [
        {"id": f"rv_fill{i:06d}", "retired_id": "m_fill000000", "replacing_id": "m_fill000001", "reason": "newer",
         "via": "subject_rule", "cause": "newer", "run_id": None, "judge_model": None, "prompt_version": None,
         "created_at": clock.now - timedelta(minutes=i), "undone_at": clock.now if i in (7, 70) else None,
         "undone_by": "u_alice" if i in (7, 70) else None, "prior_status": None}
        for i in range(HISTORY)
    ]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), records)
        await conn.execute(MemoryRevision.__table__.insert(), revisions)
    await _analyze(engine, "memory_revisions")
    with captured_reads(engine, "memory_revisions") as reads:
        undone = await store.undone_revisions()
    assert sorted(r.id for r in undone) == ["rv_fill000007", "rv_fill000070"]
    for plan in await _plans(engine, reads):
        # Before: SCAN memory_revisions.
        assert _visits_at_most(engine, plan, "memory_revisions", 2, "ix_memory_revisions_undone"), plan


async def test_the_history_indexes_migration_downgrades_and_upgrades(engine: AsyncEngine) -> None:
    from gateway.db import upgrade

    async def names() -> set[str]:
        def read(conn: Any) -> set[str]:
            found = inspect(conn)
            return {i["name"] for t in ("pairing_requests", "memory_revisions") for i in found.get_indexes(t)}

        async with engine.connect() as conn:
            return await conn.run_sync(read)

    new = {"ix_pairing_requests_channel_status_expiry", "ix_memory_revisions_undone"}
    assert new <= await names()
    async with engine.begin() as conn:
        await conn.run_sync(alembic_downgrade, "0020_open_obligations")
    after = await names()
    assert not new & after and "ix_pairing_requests_channel_status" in after
    await upgrade(engine)
    assert new <= await names() and "ix_pairing_requests_channel_status" not in await names()
