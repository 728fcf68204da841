"""The term index's postings carry their note's said_at and review_by, on every path that writes them.

The prompt's match ranks and filters on the postings alone (``memory.store._candidates_statement``),
so a posting whose values differ from its record's would choose other notes than the records say.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import make_engine, upgrade
from memory.models import MemoryRecord, MemoryTerm
from memory.revisions import undo_revision
from memory.store import Merge, note_terms
from memory.words import subject_key
from memory.writer import MemoryWriter
from tests.conftest import alembic_downgrade
from tests.memory.conftest import ALICE, BOB, CRON, T0

DAY = timedelta(days=1)


async def _postings_agree_with_records(engine: AsyncEngine) -> set[str]:
    """Assert every posting's said_at/review_by is its record's, and the record is a live note; the ids."""
    T, R = MemoryTerm.__table__, MemoryRecord.__table__
    q = select(T.c.record_id, T.c.said_at, T.c.review_by, R.c.said_at, R.c.review_by, R.c.status, R.c.scope).join(
        R, R.c.id == T.c.record_id
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    assert rows
    for rid, said, review, rec_said, rec_review, status, scope in rows:
        assert (said, review) == (rec_said, rec_review), rid
        assert (status, scope) == ("live", "agent_notes"), rid
    return {r[0] for r in rows}


async def test_every_path_that_indexes_a_note_stamps_its_postings(writer: MemoryWriter, engine: AsyncEngine) -> None:
    store = writer.store
    # add: a live note.
    live = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="example_orders", said_at=T0,
        review_by=T0 + 30 * DAY,
    )  # fmt: skip
    # add then undo: the retired note comes back into the index.
    newer = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="example_archive", said_at=T0 + DAY
    )
    assert live.record and newer.record and newer.retired == (live.record.id,)
    (rev,) = await store.revisions_for(live.record.id)
    await undo_revision(store, rev.id, principal=ALICE)
    # confirm: an unverified note made live.
    held = await writer.write(BOB, "agent_notes", "relearn", subject="vpn host", content="vpn.internal", said_at=T0)
    assert held.record and held.record.status == "unverified"
    await writer.confirm(ALICE, held.record.id)
    # merge (consolidation): a new note replacing two.
    a = await writer.write(ALICE, "agent_notes", "live", subject="lunch", content="Lunch is at noon", said_at=T0)
    b = await writer.write(ALICE, "agent_notes", "live", subject="lunch time", content="lunch at noon", said_at=T0)
    assert a.record and b.record
    merged = await writer.write(
        CRON, "agent_notes", "consolidate", subject="lunch", content="Lunch is at noon.", said_at=T0 + 2 * DAY,
        merge=Merge((a.record.id, b.record.id), "the same note"),
    )  # fmt: skip
    assert merged.record and merged.record.status == "live"
    ids = await _postings_agree_with_records(engine)
    assert ids == {live.record.id, newer.record.id, held.record.id, merged.record.id}


def _old_note(subject: str, content: str, said: datetime, review: datetime | None) -> dict[str, Any]:
    """A live admin's note ``m_old``, as a row inserted under an older revision of the schema."""
    return {
        "id": "m_old", "scope": "agent_notes", "owner_user_id": None, "subject": subject,
        "subject_key": subject_key(subject), "content": content, "status": "live", "said_at": said,
        "recorded_at": said, "review_by": review, "source": "live", "author_user_id": "u_alice",
        "author_role": "admin", "session_id": None, "evidence": [], "run_id": None, "superseded_by": None,
    }  # fmt: skip


async def test_the_migration_stamps_existing_postings_and_downgrades(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        await upgrade(engine, "0012_answering")
        row = _old_note("backup window", "backups run at 02:00", T0 - DAY, T0 + 10 * DAY)
        words = note_terms(row["subject"], row["content"])
        async with engine.begin() as conn:
            await conn.execute(MemoryRecord.__table__.insert().values(**row))
            for w in words:
                await conn.execute(
                    text("INSERT INTO memory_terms (term, record_id) VALUES (:t, :r)"), {"t": w, "r": "m_old"}
                )
        await upgrade(engine)
        assert await _postings_agree_with_records(engine) == {"m_old"}
        async with engine.begin() as conn:
            await conn.run_sync(alembic_downgrade, "0012_answering")
        async with engine.connect() as conn:
            back = (await conn.execute(text("SELECT term, record_id FROM memory_terms"))).all()
        assert sorted(back) == sorted((w, "m_old") for w in words)
        await upgrade(engine)  # and up again
        assert await _postings_agree_with_records(engine) == {"m_old"}
    finally:
        await engine.dispose()


async def test_a_plural_whose_singular_is_a_stopword_is_not_indexed(writer: MemoryWriter, engine: AsyncEngine) -> None:
    # "uses" is "use", a stopword: in most of an organisation's notes, it said nothing about any of them.
    note = await writer.write(
        ALICE, "agent_notes", "live", subject="daily report", content="The daily report uses example_orders and makes "
        "one chart for the others", said_at=T0,
    )  # fmt: skip
    assert note.record
    async with engine.connect() as conn:
        posted = set((await conn.execute(select(MemoryTerm.term))).scalars())
    assert posted == {"daily", "report", "example", "order", "chart"}


async def test_the_migration_deletes_the_stopword_postings_written_before(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        await upgrade(engine, "0022_terms_review_by")
        row = _old_note("daily report", "the report uses example_orders", T0, None)
        async with engine.begin() as conn:
            await conn.execute(MemoryRecord.__table__.insert().values(**row))
            for w in ("daily", "report", "use", "example_orders"):  # as the code before indexed it
                await conn.execute(
                    text("INSERT INTO memory_terms (term, record_id, said_at) VALUES (:t, :r, :s)"),
                    {"t": w, "r": "m_old", "s": T0},
                )
        await upgrade(engine)
        async with engine.connect() as conn:
            left = set((await conn.execute(text("SELECT term FROM memory_terms"))).scalars())
        assert left == {"daily", "report", "example_orders"}
        assert await _postings_agree_with_records(engine) == {"m_old"}
    finally:
        await engine.dispose()
