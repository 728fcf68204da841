"""The write path on the database driver itself (``RawWrites``) against the same path through SQLAlchemy.

The gateway's memory store runs the write path's statements (the subject read,
the record insert, the subject rule's retirement, the veto check, the revision
row) on the session's own driver connection, bound and decoded by the hot
store: ``sqlite3`` on SQLite, asyncpg on PostgreSQL, inside the session's
transaction. These tests hold it to SQLAlchemy's: one scenario of writes,
retirements, a duplicate, history, an unverified record, an undo and its veto,
run once each way on real databases, must leave the same rows; the driver path
must really be the one taken (SQLAlchemy never sees those statements); and on
PostgreSQL a write that fails part-way leaves nothing, as one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import make_engine, upgrade
from gateway.hotstore import hot_store
from gateway.sqlite_inline import make_inline_engine
from memory.models import MemoryRecord
from memory.store import MemoryStore
from memory.words import terms
from memory.writer import MemoryWriter
from tests.conftest import Clock, _drop_pg_database, _fresh_pg_database, _require_pg
from tests.memory.conftest import ALICE, BOB, CRON, T0


async def _scenario(store: MemoryStore, clock: Clock) -> dict[str, str]:
    """Writes that take every branch of the write path; returns what each step answered, by name."""
    w = MemoryWriter(store)
    seen: dict[str, str] = {}
    ids: dict[str, str] = {}

    async def note(name: str, content: str, minutes: int, who: Any = ALICE, source: str = "live") -> None:
        res = await w.write(
            who,
            "agent_notes",
            source,
            subject="Report data source",
            content=content,
            said_at=T0 + timedelta(minutes=minutes),
            session_id="s_1",
            evidence=["msg-" + name],
            review_by=clock.now + timedelta(days=30),
            citations=["the admin said so"] if name == "first" else (),
            applies_to=["daily-report"] if name == "second" else (),
        )
        ids[name] = res.record.id if res.record else ""
        status = res.record.status if res.record else "-"
        seen[name] = f"{res.decision.verdict.value}:{status}:{len(res.retired)}:{res.duplicate}"

    await note("first", "The report is produced from example_orders", 0)
    await note("second", "The report is produced from orders_v2", 10)  # retires first
    await note("again", "The report is produced from orders_v2", 12)  # the same fact: a duplicate
    await note("older", "The report is produced from legacy_orders", 5)  # said earlier: history itself
    await note("cron", "The report is produced from cron_orders", 20, who=CRON)  # unverified: retires nothing
    for minute, content in ((1, "Bob likes short answers"), (30, "Bob likes long answers")):
        res = await w.write(
            BOB,
            "personal",
            "live",
            subject="answer length",
            content=content,
            said_at=T0 + timedelta(minutes=minute),
            owner_user_id=BOB.user_id,
        )
        seen[f"bob-{minute}"] = f"{res.record.status if res.record else '-'}:{len(res.retired)}"
    (revision,) = await store.revisions_for(ids["first"])  # the second note retired the first
    undone = await store.undo(by=ALICE.user_id or "", revision_id=revision.id)
    seen["undo"] = f"{len(undone.restored)}"
    again = await store.apply_subject_rule(ids["second"], cause="relearn")
    seen["vetoed"] = f"{len(again)}"  # the undone pair stays apart
    return seen


async def _rows(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the scenario wrote, with generated ids replaced by what the rows say."""
    async with engine.connect() as conn:
        records = (await conn.execute(text("SELECT * FROM memory_records ORDER BY said_at, content"))).all()
        name = {r.id: f"{r.scope}:{r.content}" for r in records}
        revisions = (await conn.execute(text("SELECT * FROM memory_revisions"))).all()
        terms = (await conn.execute(text("SELECT term, record_id, said_at, review_by FROM memory_terms"))).all()
    return {
        "records": [
            tuple(name.get(v, v) if k in ("id", "superseded_by") else v for k, v in r._mapping.items()) for r in records
        ],
        "revisions": sorted(
            # [1:]: the row without its own id (random), its first column
            tuple(name.get(v, v) if k in ("retired_id", "replacing_id") else v for k, v in r._mapping.items())[1:]
            for r in revisions
        ),
        "terms": sorted((t.term, name[t.record_id], t.said_at, t.review_by) for t in terms),
    }


@pytest.fixture(params=["sqlite", "postgres"])
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two fresh databases of one backend: one for the driver path, one for SQLAlchemy's."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'driver'}.db", f"sqlite+aiosqlite:///{tmp_path / 'sqlalchemy'}.db"
        return
    _require_pg()
    made = [asyncio.run(_fresh_pg_database()) for _ in range(2)]
    try:
        yield made[0][0], made[1][0]
    finally:
        for _url, database in made:
            asyncio.run(_drop_pg_database(database))


@pytest.fixture
async def engines(urls: tuple[str, str]) -> AsyncIterator[tuple[AsyncEngine, AsyncEngine]]:
    made = []
    try:
        for url in urls:
            engine = make_engine(url)
            made.append(engine)
            await upgrade(engine)
        yield made[0], made[1]
    finally:
        for engine in made:
            await engine.dispose()


async def test_the_driver_path_writes_what_sqlalchemy_writes(engines: tuple[AsyncEngine, AsyncEngine]) -> None:
    driver_engine, sa_engine = engines
    answers = []
    for engine, raw in ((driver_engine, hot_store(driver_engine)), (sa_engine, None)):
        clock = Clock(T0 + timedelta(hours=1))
        answers.append(await _scenario(MemoryStore(engine, clock=clock, raw=raw), clock))
    assert answers[0] == answers[1]
    assert answers[0]["second"].endswith(":1:False")  # the scenario took the branches it is for
    assert answers[0]["again"].endswith(":True") and answers[0]["older"].startswith("write:superseded")
    assert answers[0]["undo"] == "1" and answers[0]["vetoed"] == "0"
    driver_rows, sa_rows = await _rows(driver_engine), await _rows(sa_engine)
    assert driver_rows["records"] and driver_rows["revisions"] and driver_rows["terms"]
    for table in ("records", "revisions", "terms"):
        assert driver_rows[table] == sa_rows[table], table


@pytest.fixture(params=["aiosqlite", "inline", "postgres"])
def write_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A fresh database's URL, and how the engine reaches it: serve's SQLite, the job process's, PostgreSQL."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_url"), request.param
    return f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", request.param


async def test_the_write_path_does_not_go_through_sqlalchemy(write_url: tuple[str, str]) -> None:
    """SQLAlchemy reads what the check below reads and, on PostgreSQL, begins the transaction (the subject's lock)."""
    url, kind = write_url
    setup = make_engine(url)
    await upgrade(setup)
    await setup.dispose()
    engine = make_inline_engine(url) if kind == "inline" else make_engine(url)  # the job process's, or serve's
    through_sqlalchemy: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: through_sqlalchemy.append(a[2]))
    try:
        clock = Clock(T0 + timedelta(hours=1))
        store = MemoryStore(engine, clock=clock, raw=hot_store(engine))
        w = MemoryWriter(store)
        for minute in (0, 10):
            res = await w.write(
                BOB,
                "personal",
                "live",
                subject="answer length",
                content=f"Bob likes answers of {minute} lines",
                said_at=T0 + timedelta(minutes=minute),
                owner_user_id=BOB.user_id,
            )
        assert res.record is not None and len(res.retired) == 1
        live = await store.personal_for(BOB.user_id or "")
        assert [r.content for r in live] == ["Bob likes answers of 10 lines"]
        note = await w.write(  # an agent note: its postings (the prompt's match index) too
            ALICE,
            "agent_notes",
            "live",
            subject="Report data source",
            content="The report is produced from example_orders every Monday for finance",
            said_at=T0,
            review_by=clock.now + timedelta(days=30),
        )
        assert note.record is not None
        found = await store.prompt_candidates(user_id=None, query_terms=terms("example_orders"), now=clock.now)
        assert [v.id for v, _score in found.matched_notes] == [note.record.id]
        assert await store.get(note.record.id) is not None  # a read through SQLAlchemy (the check below)
    finally:
        await engine.dispose()
    written = [s for s in through_sqlalchemy if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert written == []  # every insert, update and delete of the write path went to the driver itself
    assert any("memory_records" in s for s in through_sqlalchemy)  # the check can see SQLAlchemy's own reads


async def test_on_postgresql_a_write_that_fails_part_way_leaves_nothing(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's statements run in the session's transaction: a failure after some of them undoes them all."""
    engine = make_engine(pg_url)
    await upgrade(engine)
    try:
        clock = Clock(T0 + timedelta(hours=1))
        store = MemoryStore(engine, clock=clock, raw=hot_store(engine))
        w = MemoryWriter(store)

        async def say(minute: int) -> Any:
            return await w.write(
                BOB, "personal", "live", subject="answer length", content=f"Bob likes answers of {minute} lines",
                said_at=T0 + timedelta(minutes=minute), owner_user_id=BOB.user_id,
            )  # fmt: skip

        first = await say(0)
        assert first.record is not None
        run_on = store._run_on
        assert run_on is not None

        async def fails_at_the_revision(driver: Any, sql: str, args: Any, kinds: Any) -> Any:
            if sql.lstrip().upper().startswith("INSERT INTO MEMORY_REVISIONS"):
                raise ConnectionResetError("the connection went away mid-write")
            return await run_on(driver, sql, args, kinds)

        monkeypatch.setattr(store, "_run_on", fails_at_the_revision)
        with pytest.raises(ConnectionResetError):
            await say(10)  # its record inserted and the first retired on the driver, then the revision fails
        live = await store.personal_for(BOB.user_id or "")
        assert [r.id for r in live] == [first.record.id]  # the old value live, the new one never stored
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM memory_records"))).scalar_one() == 1
            assert (await conn.execute(text("SELECT count(*) FROM memory_revisions"))).scalar_one() == 0

        # A transaction whose first statement goes to the driver (nothing through SQLAlchemy before it).
        records = MemoryRecord.__table__
        retire = update(records).where(records.c.id == first.record.id).values(status="superseded")

        async def retire_then_fail() -> None:
            async with store.transaction() as s:
                assert await store._write(s, retire, {}) == 1
                raise RuntimeError("the caller fails after the statement")

        with pytest.raises(RuntimeError):
            await retire_then_fail()
        assert [r.id for r in await store.personal_for(BOB.user_id or "")] == [first.record.id]

        monkeypatch.setattr(store, "_run_on", run_on)
        again = await say(10)  # the connections are usable afterwards
        assert again.record is not None and len(again.retired) == 1
    finally:
        await engine.dispose()
