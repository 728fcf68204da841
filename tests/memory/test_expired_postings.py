"""A note past its review-by date leaves the index each turn's match walks (real SQLite and PostgreSQL, migrated).

An expired note stays ``live``: nothing changes a record's review-by, and a fact still true is
recorded again, which retires it. No prompt shows it, but its postings stayed in
``memory_terms``, and each turn's match walked them for its words and dropped them one by one:
a turn cost more with every note an organisation let expire (1.30 ms of ``prompt_candidates``
with none, 1.85 with 2,000, 4.53 with 10,000 on SQLite). The job worker now deletes them when
idle (``MemoryStore.prune_expired_postings``); the records, their history and listings stay.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.sessions import SessionStore
from gateway.worker import JobWorker
from memory.models import MemoryTerm
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from tests.conftest import Clock
from tests.memory.conftest import ALICE

T = MemoryTerm.__table__.c


async def _postings(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(T.record_id, func.count()).group_by(T.record_id))
        return dict(rows.all())


async def _notes(writer: MemoryWriter, clock: Clock, days: list[int]) -> list[str]:
    """Admin notes about the deploy window, each with its review-by ``days`` from now."""
    ids = []
    for i, d in enumerate(days):
        done = await writer.write(
            ALICE, "agent_notes", "memory_write", subject=f"deploy step {i}",
            content=f"Deploys of service {i} wait for the release checklist", said_at=clock.now,
            review_by=clock.now + timedelta(days=d),
        )  # fmt: skip
        assert done.record is not None, done.decision.message
        ids.append(done.record.id)
    return ids


async def test_a_note_past_its_review_by_leaves_the_index_and_nothing_else(
    engine: AsyncEngine, store: MemoryStore, writer: MemoryWriter, clock: Clock
) -> None:
    soon, later, also_soon = await _notes(writer, clock, [2, 30, 3])
    query = ["deploys", "release", "checklist"]
    before = await store.prompt_candidates(user_id=None, query_terms=query, now=clock.now)
    assert {r.id for r, _ in before.matched_notes} == {soon, later, also_soon}
    assert await store.prune_expired_postings() == (0, False)  # nothing past its date yet

    clock.advance(days=4)
    shown = await store.prompt_candidates(user_id=None, query_terms=query, now=clock.now)
    assert [r.id for r, _ in shown.matched_notes] == [later]  # the expired ones are never shown
    assert await store.prune_expired_postings(notes=1) == (1, True)  # one at a time: more left
    assert await store.prune_expired_postings(notes=1) == (1, False)
    assert set(await _postings(engine)) == {later}
    after = await store.prompt_candidates(user_id=None, query_terms=query, now=clock.now)
    assert [r.id for r, _ in after.matched_notes] == [later]  # the same prompt as before the prune
    for expired in (soon, also_soon):  # the record and its listing are untouched
        record = await store.get(expired)
        assert record is not None and record.status == "live"
        assert record.effective_status(clock.now) == "expired"
    assert {r.id for r in await store.list_records(scope="agent_notes")} == {soon, later, also_soon}


async def test_an_idle_job_worker_prunes_the_expired_notes_terms(
    engine: AsyncEngine, store: MemoryStore, writer: MemoryWriter, clock: Clock
) -> None:
    expired, current = await _notes(writer, clock, [1, 60])
    clock.advance(days=2)
    sessions = SessionStore(engine, clock=clock)
    worker = JobWorker(sessions, {}, poll_interval=0.05, upkeep={"expired terms": store.prune_expired_postings})
    await worker.start()
    try:
        for _ in range(600):  # only a hang's limit: the first idle moment prunes
            if expired not in await _postings(engine):
                break
            await asyncio.sleep(0.05)
        assert set(await _postings(engine)) == {current}
    finally:
        await worker.stop()


async def test_the_gateways_job_worker_prunes_them(db_url: str, clock: Clock) -> None:
    from gateway.app import Gateway
    from gateway.config import Config

    gw = Gateway(Config.model_validate({"database": {"url": db_url}}), clock=clock)
    await gw.start(channels=False, worker=False)
    try:
        expired, current = await _notes(gw.memory.writer, clock, [1, 60])
        clock.advance(days=2)
        await gw.worker.start()  # its first idle moment prunes
        for _ in range(600):  # only a hang's limit
            if expired not in await _postings(gw.engine):
                break
            await asyncio.sleep(0.05)
        assert set(await _postings(gw.engine)) == {current}
    finally:
        await gw.stop()
