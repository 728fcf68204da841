"""A shared scope's listing seeks its own records, not every live record (real SQLite and PostgreSQL, migrated).

Every prompt renders the identity (``agent_config``, then ``global``). Each serving process
caches it for 30 s, and the turn that finds the cache stale reads it again: ``list_records``
of each scope, live, newest said first. On (scope, status) SQLite walked every live record of
every scope newest first (``ix_memory_records_status_said_at``) to find the few identity records,
set up long before people's records: 170 ms at 100,000 records (``bench/memory_prompt.py``).
Shared records have no owner, and saying so lets the read seek (scope, owner, status, said_at).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from memory.models import MemoryRecord
from memory.render import identity_lines
from memory.store import MemoryStore
from memory.words import subject_key
from tests.conftest import captured_reads, explain_captured, pg_rows_visited, pg_scans
from tests.memory.conftest import T0

PEOPLE_RECORDS = 3_000
IDENTITY = {"agent_config": 2, "global": 2}


def _record(i: int, scope: str, owner: str | None, said: Any) -> dict[str, Any]:
    subject = f"{scope} rule {i}" if owner is None else "report preference"
    return {
        "id": f"m_fill{i:06d}", "scope": scope, "owner_user_id": owner, "subject": subject,
        "subject_key": subject_key(subject), "content": f"value {i}", "status": "live", "said_at": said,
        "recorded_at": said, "review_by": None, "source": "live", "author_user_id": owner or "u_alice",
        "author_role": "user" if owner else "admin", "session_id": "s_fill", "evidence": ["msg-1"],
        "run_id": None, "superseded_by": None,
    }  # fmt: skip


async def test_the_identity_read_seeks_the_identity_records_not_every_live_record(
    engine: AsyncEngine, store: MemoryStore
) -> None:
    rows = []
    for scope, n in IDENTITY.items():  # set up with the agent, long before people's records
        for k in range(n):
            rows.append(_record(len(rows), scope, None, T0 - timedelta(days=100, minutes=k)))
    for k in range(PEOPLE_RECORDS):
        rows.append(_record(len(rows), "personal", f"u_fill{k % 300}", T0 - timedelta(minutes=k)))
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), rows)
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE memory_records")  # as autovacuum does after a load
    with captured_reads(engine, "memory_records") as reads:
        lines = await identity_lines(store)
    assert len(lines) == sum(IDENTITY.values())
    assert [line.split("agent_config rule ")[-1][:1] for line in lines[:2]] == ["1", "0"]  # oldest first
    assert len(reads) == len(IDENTITY), reads
    for statement, params in reads:
        plan = await explain_captured(engine, statement, params, analyze=True)
        if engine.dialect.name == "sqlite":
            # Before: SEARCH memory_records USING INDEX ix_memory_records_status_said_at (status=?).
            steps = [line for line in plan.splitlines() if "memory_records" in line]
            assert steps and all("scope=? AND owner_user_id=? AND status=?" in line for line in steps), plan
        else:
            scans = pg_scans(plan, "memory_records")
            assert scans and not any(n["Node Type"] == "Seq Scan" for n in scans), plan
            assert pg_rows_visited(scans) <= max(IDENTITY.values()), plan
