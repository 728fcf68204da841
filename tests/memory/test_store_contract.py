"""The memory store's contract, on real SQLite and real PostgreSQL (migrated by Alembic)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from memory.gate import decide
from memory.models import MemoryBase, MemoryRevision, MemoryTerm
from memory.store import MemoryStore, MemoryStoreError
from memory.words import subject_key
from memory.writer import MemoryWriter
from tests.conftest import Clock
from tests.memory.conftest import ALICE, BOB, CAROL, CRON, T0


async def _count(engine: AsyncEngine, model: type) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(model))).scalar_one())


async def test_migration_and_models_agree(engine: AsyncEngine) -> None:
    mine = set(MemoryBase.metadata.tables)

    def diff(conn: Connection) -> list[object]:
        def include(name: str | None, type_: str, _parent: object) -> bool:
            return type_ != "table" or name in mine

        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": include})
        return list(compare_metadata(ctx, MemoryBase.metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []


def test_subject_key_normalises_punctuation_case_and_spacing() -> None:
    assert subject_key("Daily report source") == subject_key("daily-report  source") == "daily report source"
    assert subject_key("report_data.source!") == "report data source"


async def test_add_returns_the_record_with_provenance(writer: MemoryWriter, clock: Clock) -> None:
    said = T0 - timedelta(hours=2)
    res = await writer.write(
        ALICE,
        "agent_notes",
        "live",
        subject="Report data source",
        content="The report is produced from example_orders",
        said_at=said,
        session_id="s_1",
        evidence=["msg-1", "arch-1"],
        run_id="job-1",
    )
    rec = res.record
    assert rec is not None and rec.id.startswith("m_")
    assert (rec.scope, rec.owner_user_id, rec.status, rec.source) == ("agent_notes", None, "live", "live")
    assert rec.subject == "Report data source" and rec.subject_key == "report data source"
    # policy: "A learned record's time is when it was said" -- not the write clock.
    assert rec.said_at == said and rec.recorded_at == clock.now
    assert rec.review_by == clock.now + timedelta(days=90)
    assert (rec.author_user_id, rec.author_role) == ("u_alice", "admin")
    assert rec.evidence == ("msg-1", "arch-1") and rec.run_id == "job-1" and rec.session_id == "s_1"


async def test_review_by_is_at_most_ninety_days_out(store: MemoryStore, clock: Clock) -> None:
    short = MemoryWriter(store, notes_review_days=30)
    a = (await short.write(ALICE, "agent_notes", "live", subject="a", content="x", said_at=T0)).record
    assert a and a.review_by == clock.now + timedelta(days=30)
    # Issue 11: "Silent clamping is gone": a default past 90 days is refused, and so is such an entry.
    with pytest.raises(ValueError, match="use 1 to 90"):
        MemoryWriter(store, notes_review_days=400)
    with pytest.raises(MemoryStoreError, match="100 days out; at most 90"):
        await short.write(
            ALICE, "agent_notes", "live", subject="b", content="y", said_at=T0,
            review_by=clock.now + timedelta(days=100),
        )  # fmt: skip
    with pytest.raises(MemoryStoreError, match="not in the future"):
        await short.write(ALICE, "agent_notes", "live", subject="b", content="y", said_at=T0, review_by=clock.now)
    p = (await short.write(BOB, "personal", "live", subject="name", content="Bob", said_at=T0)).record
    assert p and p.review_by is None


async def test_store_add_requires_a_writing_gate_decision(store: MemoryStore) -> None:
    refused = decide(BOB, "agent_notes", "memory_write")
    with pytest.raises(MemoryStoreError, match="did not allow"):
        await store.add(refused, subject="s", content="c", said_at=T0)
    with pytest.raises(MemoryStoreError, match="did not allow"):
        await store.add("WRITE", subject="s", content="c", said_at=T0)  # type: ignore[arg-type]
    assert await store.list_records(include_history=True) == []


async def test_newer_value_on_same_subject_supersedes_with_revision(writer: MemoryWriter, engine: AsyncEngine) -> None:
    old = (
        await writer.write(ALICE, "agent_notes", "live", subject="Daily report source", content="orders", said_at=T0)
    ).record
    new = await writer.write(
        ALICE, "agent_notes", "live", subject="daily-report source", content="archive", said_at=T0 + timedelta(hours=1)
    )
    assert old and new.record and new.retired == (old.id,)
    store = writer.store
    again = await store.get(old.id)
    assert again and again.status == "superseded" and again.superseded_by == new.record.id
    assert again.content == "orders"  # nothing edited in place but the status
    (rev,) = await store.revisions_for(old.id)
    assert (rev.retired_id, rev.replacing_id, rev.via, rev.cause) == (old.id, new.record.id, "subject_rule", "live")
    assert rev.undone_at is None
    assert [r.id for r in await store.live_notes()] == [new.record.id]
    # The retired note leaves the relevance index with its status.
    async with engine.connect() as conn:
        ids = set((await conn.execute(select(MemoryTerm.record_id))).scalars())
    assert ids == {new.record.id}


async def test_older_value_becomes_history_and_retires_nothing(writer: MemoryWriter) -> None:
    # policy: "A relearned or confirmed record older than the live value on its subject becomes
    # history itself; it does not retire the newer value."
    live = (
        await writer.write(ALICE, "agent_notes", "live", subject="report data source", content="archive", said_at=T0)
    ).record
    old = await writer.write(
        ALICE, "agent_notes", "relearn", subject="Report data source", content="orders",
        said_at=T0 - timedelta(days=10), trusted=True,
    )  # fmt: skip
    assert live and old.record
    assert old.record.status == "superseded" and old.record.superseded_by == live.id and old.retired == ()
    assert (await writer.store.get(live.id)).status == "live"  # type: ignore[union-attr]
    (rev,) = await writer.store.revisions_for(old.record.id)
    assert (rev.retired_id, rev.replacing_id, rev.cause) == (old.record.id, live.id, "relearn")


async def test_unverified_records_retire_nothing(writer: MemoryWriter) -> None:
    live = (
        await writer.write(ALICE, "agent_notes", "live", subject="report data source", content="a", said_at=T0)
    ).record
    quarantined = await writer.write(
        BOB, "agent_notes", "relearn", subject="report data source", content="b", said_at=T0 + timedelta(days=1)
    )
    assert quarantined.record and quarantined.record.status == "unverified" and quarantined.retired == ()
    assert live and (await writer.store.get(live.id)).status == "live"  # type: ignore[union-attr]
    assert [r.id for r in await writer.store.live_notes()] == [live.id]


async def test_personal_supersession_is_per_owner(writer: MemoryWriter) -> None:
    b1 = (await writer.write(BOB, "personal", "live", subject="reply language", content="English", said_at=T0)).record
    c1 = (await writer.write(CAROL, "personal", "live", subject="reply language", content="French", said_at=T0)).record
    b2 = await writer.write(
        BOB, "personal", "live", subject="Reply language", content="German", said_at=T0 + timedelta(minutes=5)
    )
    assert b1 and c1 and b2.retired == (b1.id,)
    assert [r.content for r in await writer.store.personal_for("u_carol")] == ["French"]
    assert [r.content for r in await writer.store.personal_for("u_bob")] == ["German"]


async def test_list_filters_and_history(writer: MemoryWriter) -> None:
    await writer.write(ALICE, "agent_notes", "live", subject="s", content="one", said_at=T0)
    await writer.write(ALICE, "agent_notes", "live", subject="s", content="two", said_at=T0 + timedelta(minutes=1))
    await writer.write(BOB, "personal", "live", subject="name", content="Bob", said_at=T0)
    await writer.write(
        CRON, "agent_notes", "memory_write", subject="run result", content="ok", said_at=T0 - timedelta(minutes=1)
    )
    store = writer.store
    assert [r.content for r in await store.list_records(scope="agent_notes")] == ["two", "ok"]
    assert [r.content for r in await store.list_records(scope="agent_notes", include_history=True)] == [
        "two",
        "one",
        "ok",
    ]
    assert [r.content for r in await store.list_records(owner_user_id="u_bob")] == ["Bob"]
    assert [r.content for r in await store.list_records(statuses=["superseded"])] == ["one"]
    with pytest.raises(MemoryStoreError, match="unknown scope"):
        await store.list_records(scope="nope")
    cron_note = (await store.list_records(scope="agent_notes"))[1]
    assert (cron_note.author_user_id, cron_note.author_role) == ("cron-system", "cron-system")


async def test_search_matches_words_restricts_personal_and_includes_history(writer: MemoryWriter) -> None:
    await writer.write(ALICE, "agent_notes", "live", subject="report data source", content="example_orders", said_at=T0)
    await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="example_archive",
        said_at=T0 + timedelta(hours=1),
    )  # fmt: skip
    await writer.write(BOB, "personal", "live", subject="report style", content="Bob likes short reports", said_at=T0)
    await writer.write(
        CAROL, "personal", "live", subject="report style", content="Carol likes long reports", said_at=T0
    )
    store = writer.store
    for_bob = await store.search("report", owner_user_id="u_bob")
    contents = [r.content for r in for_bob]
    assert "Carol likes long reports" not in contents
    assert {"example_orders", "example_archive", "Bob likes short reports"} <= set(contents)
    assert {r.status for r in for_bob} == {"live", "superseded"}
    no_owner = await store.search("report")
    assert all(r.scope == "agent_notes" for r in no_owner)
    everyone = await store.search("likes", any_owner=True)
    assert len(everyone) == 2
    assert await store.search("the and of") == []
    # Best match first.
    ranked = await store.search("archive example", owner_user_id="u_bob")
    assert ranked[0].content == "example_archive"


async def test_expired_notes_are_listed_but_not_current(writer: MemoryWriter, clock: Clock) -> None:
    rec = (await writer.write(ALICE, "agent_notes", "live", subject="s", content="c", said_at=T0)).record
    assert rec
    clock.advance(days=91)
    store = writer.store
    assert await store.live_notes() == []
    (listed,) = await store.list_records(scope="agent_notes")
    assert listed.effective_status(clock.now) == "expired"
    assert listed.as_json(clock.now)["status"] == "expired"


async def test_a_batch_is_one_transaction(writer: MemoryWriter) -> None:
    async def half_done() -> None:
        async with writer.batch() as batch:
            await batch.write(ALICE, "agent_notes", "live", subject="s", content="c", said_at=T0)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await half_done()
    assert await writer.store.list_records(include_history=True) == []


async def test_retire_superseded_records_a_revision_and_honours_a_veto(
    writer: MemoryWriter, engine: AsyncEngine, clock: Clock
) -> None:
    a = (await writer.write(ALICE, "agent_notes", "live", subject="x", content="a", said_at=T0)).record
    b = (await writer.write(ALICE, "agent_notes", "live", subject="y", content="b", said_at=T0)).record
    assert a and b
    store = writer.store
    assert await store.retire_superseded(
        a.id, b.id, reason="same fact", via="belief_revision", cause="revise", judge_model="m", prompt_version="v1"
    )
    assert not await store.retire_superseded(a.id, b.id, reason="again", via="belief_revision", cause="revise")
    rev = (await store.revisions_for(a.id))[0]
    assert (rev.via, rev.cause, rev.judge_model, rev.prompt_version) == ("belief_revision", "revise", "m", "v1")
    # An undone retirement is a veto for that pair, forever.
    c = (await writer.write(ALICE, "agent_notes", "live", subject="z", content="c", said_at=T0)).record
    assert c
    async with store.transaction() as s:
        s.add(
            MemoryRevision(
                id="rv_undone", retired_id=c.id, replacing_id=b.id, reason="r", via="belief_revision",
                cause="revise", created_at=clock.now, undone_at=clock.now, undone_by="u_alice",
            )
        )  # fmt: skip
    assert not await store.retire_superseded(c.id, b.id, reason="r", via="belief_revision", cause="revise")
    assert (await store.get(c.id)).status == "live"  # type: ignore[union-attr]
    with pytest.raises(MemoryStoreError, match="unknown retirement"):
        await store.retire_superseded(c.id, b.id, reason="r", via="magic", cause="revise")


async def test_every_retirement_writes_a_revision_row(writer: MemoryWriter, engine: AsyncEngine) -> None:
    for minute in range(5):
        await writer.write(
            ALICE, "agent_notes", "live", subject="s", content=f"v{minute}", said_at=T0 + timedelta(minutes=minute)
        )
    assert len(await writer.store.list_records(statuses=["superseded"])) == 4
    assert await _count(engine, MemoryRevision) == 4


async def test_concurrent_writes_on_one_subject_leave_one_live_value(writer: MemoryWriter, engine: AsyncEngine) -> None:
    # PostgreSQL: the per-subject lock; SQLite: one queued connection serialises writers.
    async def one(n: int) -> None:
        await writer.write(
            ALICE, "agent_notes", "live", subject="race", content=f"v{n}", said_at=T0 + timedelta(seconds=n)
        )

    await asyncio.gather(*(one(n) for n in range(8)))
    live = await writer.store.list_records(scope="agent_notes")
    assert len(live) == 1 and live[0].content == "v7"


async def test_the_same_fact_said_again_is_not_a_new_value(writer: MemoryWriter) -> None:
    first = await writer.write(BOB, "personal", "live", subject="reply language", content="English", said_at=T0)
    again = await writer.write(
        BOB, "personal", "live", subject="Reply language", content=" english ", said_at=T0 + timedelta(days=1)
    )
    assert first.record and again.duplicate and not again.written
    assert again.record and again.record.id == first.record.id
    assert len(await writer.store.list_records(include_history=True)) == 1
    # A live write of a quarantined fact is the upgrade, not a duplicate.
    q = await writer.write(BOB, "agent_notes", "relearn", subject="s", content="fact", said_at=T0)
    assert q.record and q.record.status == "unverified"
    assert (await writer.write(BOB, "agent_notes", "relearn", subject="s", content="fact", said_at=T0)).duplicate
    up = await writer.write(ALICE, "agent_notes", "live", subject="s", content="fact", said_at=T0)
    assert up.written and up.record and up.record.status == "live"


async def test_whole_record_reads_answer_the_same_on_the_driver_as_through_sqlalchemy(
    writer: MemoryWriter, engine: AsyncEngine, clock: Clock
) -> None:
    """Consolidation reads every current note on each run: the driver's read answers what SQLAlchemy's does.

    Current notes only (not expired, not retired, not personal), newest first with ties by id,
    every field decoded the same (times, evidence, citations, scoped SOPs), the limit honoured.
    """
    store = writer.store
    assert store._raw is not None  # the fixture's store reads on the driver, as the gateway's does
    through_sqlalchemy = MemoryStore(engine, clock=clock)
    day = timedelta(days=1)
    for i in range(6):
        await writer.write(
            ALICE, "agent_notes", "live", subject=f"procedure {i}", content=f"Run step {i} from example_{i}",
            said_at=T0 + timedelta(minutes=i % 3), session_id="s_1", evidence=[f"msg-{i}"],
            review_by=None if i == 0 else clock.now + (day * 30 if i != 4 else day), citations=["the runbook"],
            applies_to=["daily-report"] if i == 2 else (),
        )  # fmt: skip
    old = await writer.write(ALICE, "agent_notes", "live", subject="procedure 5", content="Run it", said_at=T0)
    await writer.write(BOB, "personal", "live", subject="lunch", content="Bob likes soup", said_at=T0)
    assert old.record is not None and old.record.status == "superseded"  # said before the live one: not current
    clock.advance(days=2)  # note 4 is past its review-by date now

    on_driver = await store.live_notes()
    assert on_driver == await through_sqlalchemy.live_notes()
    assert {n.subject for n in on_driver} == {f"procedure {i}" for i in (0, 1, 2, 3, 5)}
    assert on_driver == sorted(on_driver, key=lambda n: (-n.said_at.timestamp(), n.id))
    assert all(n.said_at.tzinfo is not None for n in on_driver)
    assert next(n for n in on_driver if n.subject == "procedure 2").applies_to == ("daily-report",)
    assert await store.live_notes(limit=2) == on_driver[:2] == await through_sqlalchemy.live_notes(limit=2)
    # Belief revision's read of a person's records, on each personal write, the same way.
    assert [r.content for r in await store.personal_for("u_bob")] == ["Bob likes soup"]
    assert await store.personal_for("u_bob") == await through_sqlalchemy.personal_for("u_bob")
