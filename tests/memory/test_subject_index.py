"""A write reads one owner's records on its subject, never every owner's (real SQLite and PostgreSQL, migrated).

Personal subjects are shared by name: everyone may have a "timezone", and each trim's
extraction writes its speaker a "conversation summary" superseding the last. Every
gated write first reads its subject (``_same_subject_statement``) and a live one then
applies the subject rule (``_other_live_statement``). On the index (scope, subject_key,
status) SQLite's subject read fetched every owner's records on the subject, history
included, to keep one owner's: a write's cost grew with the whole organisation
(``bench/memory_write.py`` on SQLite: 5.0 ms a write at 100,000 records, 0.48 ms on
migration 0018's index). These check the plan each database makes for those reads, on a table
where many owners share the subject, and that the write still touches only its owner.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from memory.models import MemoryRecord
from memory.store import _other_live_statement, _same_subject_statement
from memory.words import subject_key
from memory.writer import MemoryWriter
from tests.conftest import Clock, alembic_downgrade, pg_rows_visited, pg_scans, query_plan
from tests.memory.conftest import ALICE, BOB, T0

R = MemoryRecord.__table__.c
OWNERS = 150
HISTORY = 12  # records each owner has had on the subject: the last live, the rest superseded


def _record(i: int, owner: str | None, scope: str, subject: str, *, live: bool, said: Any) -> dict[str, Any]:
    return {
        "id": f"m_fill{i:06d}",
        "scope": scope,
        "owner_user_id": owner,
        "subject": subject,
        "subject_key": subject_key(subject),
        "content": f"{subject} value {i}",
        "status": "live" if live else "superseded",
        "said_at": said,
        "recorded_at": said,
        "review_by": T0 + timedelta(days=60) if scope == "agent_notes" else None,
        "source": "live",
        "author_user_id": owner or "u_alice",
        "author_role": "user" if owner else "admin",
        "session_id": "s_fill",
        "evidence": ["msg-1"],
        "run_id": None,
        "superseded_by": None,
    }


async def _fill(engine: AsyncEngine) -> None:
    """OWNERS people with HISTORY timezones each, and a shared note's HISTORY values, as a bulk fixture."""
    rows = []
    for o in range(OWNERS):
        for k in range(HISTORY):
            said = T0 - timedelta(days=HISTORY - k, minutes=o)
            rows.append(_record(len(rows), f"u_fill{o}", "personal", "Timezone", live=k == HISTORY - 1, said=said))
    for k in range(HISTORY):
        said = T0 - timedelta(days=HISTORY - k)
        rows.append(_record(len(rows), None, "agent_notes", "Deploy window", live=k == HISTORY - 1, said=said))
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), rows)
        if engine.dialect.name == "postgresql":
            await conn.execute(text("ANALYZE memory_records"))  # what autovacuum does after a load


async def _plan(engine: AsyncEngine, statement: Any, params: dict[str, Any]) -> str:
    return await query_plan(engine, statement.params(**params))


def _reads_one_owners_subject(engine: AsyncEngine, plan: str) -> bool:
    """Whether the read visits no more rows than one owner's history on the subject.

    SQLite: every access to the table is a SEARCH of an index on the subject and the owner.
    PostgreSQL (which may also combine indexes): no sequential scan, and the rows its scans
    produced or filtered out number at most HISTORY, where every owner's would be OWNERS x HISTORY.
    """
    if engine.dialect.name == "sqlite":
        searches = [line for line in plan.splitlines() if "memory_records" in line]
        return bool(searches) and all(
            line.startswith("SEARCH") and "subject_key=?" in line and "owner_user_id=?" in line for line in searches
        )
    scans = pg_scans(plan)
    return bool(scans) and not any(n["Node Type"] == "Seq Scan" for n in scans) and pg_rows_visited(scans) <= HISTORY


async def test_the_write_paths_subject_reads_seek_one_owners_records(engine: AsyncEngine) -> None:
    await _fill(engine)
    personal = {"scope": "personal", "key": "timezone", "owner": "u_fill7"}
    shared = {"scope": "agent_notes", "key": "deploy window"}
    reads = {
        "a person's subject read": (_same_subject_statement(True), {**personal, "said_at": T0}),
        "a shared note's subject read": (_same_subject_statement(False), {**shared, "said_at": T0}),
        "a person's subject rule": (_other_live_statement(True), {**personal, "id": "m_new", "now": T0}),
        "a shared note's subject rule": (_other_live_statement(False), {**shared, "id": "m_new", "now": T0}),
    }
    for name, (statement, params) in reads.items():
        plan = await _plan(engine, statement, params)
        assert _reads_one_owners_subject(engine, plan), f"{name} reads more than one owner's subject:\n{plan}"


async def test_a_write_on_a_shared_subject_supersedes_only_its_owners_value(
    engine: AsyncEngine, writer: MemoryWriter, clock: Clock
) -> None:
    await _fill(engine)
    first = await writer.write(BOB, "personal", "memory_write", subject="Timezone", content="UTC+1", said_at=T0)
    clock.advance(minutes=1)
    second = await writer.write(
        BOB, "personal", "memory_write", subject="timezone", content="UTC+2", said_at=T0 + timedelta(minutes=1)
    )
    assert first.record is not None and second.record is not None
    assert second.retired == (first.record.id,)
    note = await writer.write(
        ALICE, "agent_notes", "live", subject="Deploy window", content="Deploys on Tuesdays", said_at=T0
    )
    assert len(note.retired) == 1  # the shared note's live value, not a person's
    async with engine.connect() as conn:
        live = await conn.execute(
            select(R.owner_user_id, func.count())
            .where(R.subject_key == "timezone", R.status == "live")
            .group_by(R.owner_user_id)
        )
        counts = dict(live.all())
    assert counts.pop("u_bob") == 1
    assert counts == {f"u_fill{o}": 1 for o in range(OWNERS)}  # nobody else's value was retired


async def _subject_indexes(engine: AsyncEngine) -> dict[str, list[str]]:
    """The memory_records indexes that lead with (scope, subject_key), by name: their columns."""

    def read(conn: Any) -> dict[str, list[str]]:
        found = inspect(conn).get_indexes("memory_records")
        return {i["name"]: list(i["column_names"]) for i in found if i["column_names"][:2] == ["scope", "subject_key"]}

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def test_the_subject_index_migration_downgrades_and_upgrades(engine: AsyncEngine) -> None:
    from gateway.db import upgrade

    new = {"ix_memory_records_subject": ["scope", "subject_key", "owner_user_id", "status", "said_at"]}
    assert await _subject_indexes(engine) == new
    await _fill(engine)
    async with engine.begin() as conn:
        await conn.run_sync(alembic_downgrade, "0017_jobs_claim_by_id")
    assert await _subject_indexes(engine) == {
        "ix_memory_records_scope_subject_status": ["scope", "subject_key", "status"]
    }
    await upgrade(engine)
    assert await _subject_indexes(engine) == new
    personal = {"scope": "personal", "key": "timezone", "owner": "u_fill7", "said_at": T0}
    assert _reads_one_owners_subject(engine, await _plan(engine, _same_subject_statement(True), personal))
