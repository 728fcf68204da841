"""The hot store's contract, on SQLite and PostgreSQL: the turn's statements on the raw driver.

``gateway.hotstore`` runs begin-turn, store-reply, the role read and memory's
candidate statement without SQLAlchemy; these tests hold it to what the
SQLAlchemy versions did, through the stores every caller uses.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import weakref
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

import gateway.hotstore.sqlite
import gateway.sessions
import memory.store
from gateway.db import make_engine, upgrade
from gateway.explain import TurnExplanation
from gateway.hotstore import hot_store, sql
from gateway.hotstore.sqlite import _message_row, decode_time, encode_time
from gateway.models import Heartbeat, Job, Message, TurnRecord
from gateway.sessions import SessionKey, SessionStore
from gateway.write_health import storage_reason
from memory.models import MemoryRecord, MemoryTerm
from memory.render import MAX_QUERY_TERMS
from memory.store import MATCH_WORD_POSTINGS, MemoryStore, _candidates_statement, _view, note_postings
from memory.words import subject_key
from pairing.principal import Principal, Role
from pairing.store import PairingStore
from tests.conftest import Clock, alembic_downgrade

ALICE = Principal.human("u_alice", Role.USER, "Alice")
KEY = SessionKey("web", "conv-1")


async def begin(store: SessionStore, mid: str, text: str = "hello", *, key: SessionKey = KEY, **kw: Any) -> Any:
    kw.setdefault("history_limit", 50)
    return await store.begin_turn(
        key,
        platform_message_id=mid,
        speaker=ALICE,
        display_name="Alice",
        text=text,
        said_at=store.now(),
        **kw,
    )


async def reply(store: SessionStore, session_id: str, mid: str, row_id: int, text: str = "hi Alice") -> Any:
    return await store.store_message(
        session_id,
        platform_message_id=f"{mid}:reply",
        speaker=None,
        display_name="agent",
        text=text,
        said_at=store.now(),
        is_agent=True,
        explanation=TurnExplanation(memory=[{"id": "m_1", "why": "match"}], sections={"history": 3}, model_calls={}),
        answers=mid,
        answered=ALICE,
        reply_to=row_id,
    )


async def test_first_message_creates_the_session_and_stores_the_message(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    start = await begin(store, "m1")
    assert start.session_id.startswith("s_") and start.stored is not None and not start.resumed
    assert start.stored.speaker_user_id == "u_alice" and start.stored.stored_role == "user"
    assert start.stored.said_at == clock.now and start.stored.said_at.tzinfo is not None
    assert [m.text for m in start.history] == ["hello"]
    assert await store.find_session(KEY) == start.session_id
    # What the hot store wrote reads back through SQLAlchemy the same.
    assert (await store.history(start.session_id)) == start.history


async def test_same_message_twice_gets_the_stored_reply(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    first = await begin(store, "m1")
    assert await reply(store, first.session_id, "m1", first.stored.id) is not None
    again = await begin(store, "m1")
    assert again.stored is None and again.reply == "hi Alice" and again.session_id == first.session_id
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(Message)) == 2


async def test_an_unanswered_message_is_resumed_and_a_store_only_one_is_not(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    first = await begin(store, "m1")
    clock.advance(seconds=1)
    await begin(store, "m2", "later")
    again = await begin(store, "m1")
    assert again.resumed and again.stored is not None and again.stored.id == first.stored.id
    assert again.history[-1].id == first.stored.id  # the message to answer comes last
    kept = await begin(store, "m3", "just keep it", reply_requested=False)
    assert kept.stored is not None
    assert (await begin(store, "m3", reply_requested=False)).stored is None  # stored, nothing owed
    asked = await begin(store, "m3")  # a retry that asks for an answer is owed one
    assert asked.resumed and asked.stored.id == kept.stored.id


async def test_the_reply_is_stored_once_with_its_turn_record(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    start = await begin(store, "m1")
    row = await reply(store, start.session_id, "m1", start.stored.id)
    assert row is not None and row.is_agent and row.turn_record_id is not None
    assert await reply(store, start.session_id, "m1", start.stored.id, "a second answer") is None
    assert await store.stored_reply(start.stored.id) == "hi Alice"
    async with engine.connect() as conn:
        records = (await conn.execute(select(TurnRecord))).all()
    assert len(records) == 1
    rec = records[0]
    assert rec.id == row.turn_record_id and rec.message_id == "m1" and rec.reply_message_id == "m1:reply"
    assert rec.memory == [{"id": "m_1", "why": "match"}] and rec.sections == {"history": 3}
    assert rec.speaker_user_id == "u_alice" and rec.at == clock.now


@pytest.mark.parametrize(
    "odd",
    [{"why": "a lone surrogate \ud800 a person typed"}, {"n": 2**70}, {1: "a key that is a number"}],
    ids=["surrogate", "big-integer", "number-key"],
)
async def test_a_turn_record_is_stored_whatever_its_explanation_holds(
    engine: AsyncEngine, clock: Clock, odd: dict[Any, Any]
) -> None:
    store = SessionStore(engine, clock=clock)
    start = await begin(store, "m1")
    explanation = TurnExplanation(memory=[{"id": "m_1", **odd}], sections={"history": 3}, model_calls=odd)
    stored = await store.store_message(
        start.session_id, platform_message_id="m1:reply", speaker=None, display_name="agent", text="hi",
        said_at=store.now(), is_agent=True, explanation=explanation, answers="m1", answered=ALICE,
        reply_to=start.stored.id,
    )  # fmt: skip
    assert stored is not None
    async with engine.connect() as conn:
        record = (await conn.execute(select(TurnRecord).where(TurnRecord.id == stored.turn_record_id))).one()
    as_read = {str(k): v for k, v in odd.items()}  # JSON keys are text
    assert record.memory == [{"id": "m_1", **as_read}] and record.model_calls == as_read


async def test_history_is_oldest_first_and_limited_to_the_newest(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    for i in range(6):
        clock.advance(seconds=1)
        start = await begin(store, f"m{i}", f"text {i}", history_limit=4)
    assert [m.text for m in start.history] == ["text 2", "text 3", "text 4", "text 5"]
    assert start.stored.text == "text 5"
    assert [m.said_at for m in start.history] == sorted(m.said_at for m in start.history)


async def test_history_read_again_is_the_rows_as_they_are_now_not_as_first_read(
    engine: AsyncEngine, clock: Clock
) -> None:
    # Rows read every turn are made into objects once (gateway/kept.py); what another connection
    # may change since (the lease that orders answers) must come back changed, and what it may
    # not (what was said) is refused by the database, so a kept row is never out of date.
    store = SessionStore(engine, clock=clock)
    first = await begin(store, "m1", "first words")
    await reply(store, first.session_id, "m1", first.stored.id)
    clock.advance(seconds=1)
    assert (await begin(store, "m2", reply_requested=False)).waiting_on == ()
    until = clock.now + timedelta(minutes=5)
    async with engine.begin() as conn:  # another connection: SQLAlchemy's, not the hot store's
        await conn.execute(update(Message).where(Message.platform_message_id == "m2").values(answering_until=until))
    clock.advance(seconds=1)
    start = await begin(store, "m3")
    assert [m.text for m in start.history][:2] == ["first words", "hi Alice"]
    assert [b.until for b in start.waiting_on] == [until]  # m2's lease, written after it was first read
    await reply(store, start.session_id, "m3", start.stored.id)
    async with engine.begin() as conn:
        await conn.execute(update(Message).where(Message.platform_message_id == "m2").values(answering_until=None))
    clock.advance(seconds=1)
    assert (await begin(store, "m4")).waiting_on == ()


@pytest.mark.parametrize(
    "change",
    [{"text": "other words"}, {"display_name": "Mallory"}, {"speaker_user_id": "u_mallory"}, {"said_at": None}],
    ids=["text", "display_name", "speaker", "said_at"],
)
async def test_what_was_said_is_never_changed_after_the_insert(
    engine: AsyncEngine, clock: Clock, change: dict[str, Any]
) -> None:
    store = SessionStore(engine, clock=clock)
    first = await begin(store, "m1", "first words")
    values = {k: (clock.now - timedelta(days=1) if k == "said_at" else v) for k, v in change.items()}
    with pytest.raises(Exception, match="a stored message is not changed after its insert"):
        async with engine.begin() as conn:
            await conn.execute(update(Message).where(Message.id == first.stored.id).values(**values))
    async with engine.begin() as conn:  # the same value again, and the columns that may change, are taken
        await conn.execute(update(Message).where(Message.id == first.stored.id).values(text="first words"))
        await conn.execute(update(Message).where(Message.id == first.stored.id).values(reply_requested=False))
    clock.advance(seconds=1)
    start = await begin(store, "m2")
    said = start.history[0]
    assert (said.text, said.display_name, said.speaker_user_id) == ("first words", "Alice", "u_alice")


async def test_a_row_id_given_again_after_a_delete_is_read_afresh(engine: AsyncEngine, clock: Clock) -> None:
    # SQLite gives the largest rowid again once that row is deleted (an operator's repair, say):
    # the row now under it is another message, and the history must show that one, not the one kept.
    store = SessionStore(engine, clock=clock)
    await begin(store, "m1", "first words", reply_requested=False)
    clock.advance(seconds=1)
    gone = await begin(store, "m2", "deleted words", reply_requested=False)
    async with engine.begin() as conn:
        await conn.execute(Message.__table__.delete().where(Message.id == gone.stored.id))
    clock.advance(seconds=1)
    start = await begin(store, "m3", "new words", reply_requested=False)
    assert [m.text for m in start.history] == ["first words", "new words"]
    if engine.dialect.name == "sqlite":
        assert start.stored.id == gone.stored.id  # the id was given again: what this test is about


@pytest.fixture
async def other_engine(engine: AsyncEngine) -> Any:
    """A second engine on the same database: its hot store keeps nothing of the first's, as another process's."""
    other = make_engine(engine.url.render_as_string(hide_password=False))
    try:
        yield other
    finally:
        await other.dispose()


@pytest.mark.parametrize("written", [3, 12], ids=["a few rows new", "many rows new"])
async def test_history_kept_and_new_rows_come_in_order(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock, written: int
) -> None:
    # Rows this store has kept and rows another process wrote since (read one by one when few,
    # all at once when many) make one history, oldest first, each row whole.
    store = SessionStore(engine, clock=clock)
    for i in range(4):
        clock.advance(seconds=1)
        await begin(store, f"a{i}", f"kept {i}", reply_requested=False)
    other = SessionStore(other_engine, clock=clock)
    for i in range(written):
        clock.advance(seconds=1)
        await begin(other, f"b{i}", f"new {i}", reply_requested=False)
    clock.advance(seconds=1)
    start = await begin(store, "c", "last", reply_requested=False)
    expected = [f"kept {i}" for i in range(4)] + [f"new {i}" for i in range(written)] + ["last"]
    assert [m.text for m in start.history] == expected
    assert [m.platform_message_id for m in start.history][-2:] == [f"b{written - 1}", "c"]
    assert all(m.display_name == "Alice" and m.speaker_user_id == "u_alice" for m in start.history)


async def test_a_row_kept_from_its_insert_is_the_row_read_back(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    # The SQLite store keeps the rows it inserts (a message, its reply) as it would decode them
    # from the database: the history from this store and from another process's, which reads
    # every row whole, must be equal, field by field.
    store = SessionStore(engine, clock=clock)
    clock.now = clock.now.replace(microsecond=123456)
    first = await begin(store, "m1", "first words, with 'quotes' and \u00e9")
    await reply(store, first.session_id, "m1", first.stored.id)
    clock.advance(seconds=1)
    leased = await begin(store, "m2", "not answered yet")  # its lease (answering_until) is set
    clock.advance(seconds=1)
    here = await begin(store, "m3", "third", reply_requested=False)
    assert leased.stored.id in [m.id for m in here.history] and len(here.history) == 4
    async with other_engine.connect() as conn:  # read whole by the other engine's connection
        rows = (await conn.execute(select(Message).order_by(Message.id))).all()
    assert [(m.id, m.text, m.said_at, m.is_agent, m.display_name, m.stored_role) for m in here.history] == [
        (r.id, r.text, r.said_at, r.is_agent, r.display_name, r.stored_role) for r in rows
    ]
    if engine.dialect.name == "sqlite":  # every row kept, each equal to the row decoded from the database
        kept = hot_store(engine)._decoded  # type: ignore[attr-defined]
        async with other_engine.connect() as conn:
            whole = (await conn.exec_driver_sql(sql.KEYED_LIVE, (first.session_id,))).all()
        assert len(whole) == 4
        assert [kept.get(r[0], r[11]) for r in whole] == [_message_row(tuple(r)) for r in whole]


async def test_a_row_kept_from_an_insert_that_rolled_back_is_forgotten(
    sqlite_url: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite: a turn whose transaction fails after its insert leaves no row, and its id is given
    # to the next insert, here another process's at the same instant (this clock stands still):
    # only forgetting the row kept from the failed insert keeps that message's own text.
    engine, other_engine = make_engine(sqlite_url), make_engine(sqlite_url)
    try:
        await upgrade(engine)
        store, other = SessionStore(engine, clock=clock), SessionStore(other_engine, clock=clock)
        await begin(store, "m1", "first words", reply_requested=False)
        monkeypatch.setattr(sql, "HISTORY_KEYS", "SELECT no_such_column FROM messages")
        with pytest.raises(Exception, match="no_such_column"):
            await begin(store, "m2", "rolled back", reply_requested=False)
        monkeypatch.undo()
        await begin(other, "m3", "another process's message", reply_requested=False)
        start = await begin(store, "m4", "last", reply_requested=False)
        assert [m.text for m in start.history] == ["first words", "another process's message", "last"]
        assert start.history[1].id == 2  # the id the failed insert had: what this test is about
    finally:
        await engine.dispose()
        await other_engine.dispose()


async def test_a_trim_reads_the_live_rows_as_they_are_now(engine: AsyncEngine, clock: Clock) -> None:
    # A trim plans from the session's live rows, kept ones included: the lease another connection
    # wrote since they were first read is what the plan sees.
    store = SessionStore(engine, clock=clock)
    start = await begin(store, "m1", reply_requested=False)
    until = clock.now + timedelta(minutes=5)
    async with engine.begin() as conn:
        await conn.execute(update(Message).where(Message.id == start.stored.id).values(answering_until=until))
    seen: list[Any] = []

    def plan(session: Any, live: list[Any]) -> None:
        seen.extend(live)
        return None

    await store._hot.trim(start.session_id, plan)
    assert [(r.id, r.answering_until) for r in seen] == [(start.stored.id, until)]


async def test_a_rotation_of_200_full_sessions_makes_each_history_row_once(
    sqlite_url: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 sessions answered in turn, 40 rows of history each: the second round makes only its new rows.

    SQLite: rows read again every turn are made into objects once (gateway/kept.py). When the
    rotation was larger than what was kept, each session's rows had been pushed out by
    the others' before it came back, and every turn made all of them again. (On PostgreSQL
    asyncpg decodes every row it reads; the turn's history lines are made once from equal rows.)
    """
    engine = make_engine(sqlite_url)
    await upgrade(engine)
    try:
        await _rotate(engine, clock, monkeypatch)
    finally:
        await engine.dispose()


async def _rotate(engine: AsyncEngine, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SessionStore(engine, clock=clock)
    sessions, history = 200, 40
    first = [await begin(store, f"s{i}-0", key=SessionKey("web", f"rot-{i}")) for i in range(sessions)]
    async with engine.begin() as conn:
        await conn.execute(
            Message.__table__.insert(),
            [
                {
                    "session_id": start.session_id, "platform_message_id": f"s{i}-h{j}",
                    "speaker_user_id": ALICE.user_id,
                    "stored_role": "user", "display_name": "Alice", "text": f"history {j}",
                    "said_at": clock.now - timedelta(minutes=history - j), "is_agent": False, "created_at": clock.now,
                }
                for i, start in enumerate(first)
                for j in range(history - 2)
            ],
        )  # fmt: skip
    made: list[int] = []
    real = gateway.hotstore.sqlite.StoredMessage

    def counted(*a: Any, **kw: Any) -> Any:
        made.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(gateway.hotstore.sqlite, "StoredMessage", counted)
    for round_ in (1, 2):
        clock.advance(seconds=1)
        made.clear()
        for i in range(sessions):
            start = await begin(store, f"s{i}-{round_}", key=SessionKey("web", f"rot-{i}"), history_limit=history)
            assert len(start.history) == history
        if round_ == 2:
            assert len(made) == sessions  # each session's new message, nothing read before


async def test_a_history_read_holds_no_row_the_cyclic_collector_counts(engine: AsyncEngine, clock: Clock) -> None:
    # The young collection, which stops the loop for its whole walk, starts once 100,000 more objects the
    # collector counts are alive (gateway/heap.py). Rows a cache keeps and rows a turn holds while it waits on a
    # model were counted tuples until 2026-12-08: on PostgreSQL, whose rows each read makes afresh, 200 turns
    # waiting on a model took the count to 91,000-94,000, about 20,000 of them rows, and 240 ran a collection.
    store = SessionStore(engine, clock=clock)
    for i in range(15):
        clock.advance(seconds=1)
        start = await begin(store, f"m{i}", f"line {i}")
        await reply(store, start.session_id, f"m{i}", start.stored.id, text=f"answer {i}")
    held: list[Any] = []
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i in range(10):  # ten turns' history reads, held as ten turns waiting on a model hold them
            clock.advance(seconds=1)
            held.append(await begin(store, f"w{i}", f"waiting {i}"))
        counted = (gc.get_count()[0] - before) / 10
    finally:
        gc.enable()
    assert [len(s.history) for s in held] == list(range(31, 41))
    live: list[Any] = []

    def plan(session: Any, rows: list[Any]) -> None:
        live.extend(rows)

    await store._hot.trim(held[-1].session_id, plan)  # the rows a trim reads: the job process's
    assert len(live) == 40
    # A read's own objects (its result, its lists, the new message's) are about 18; fewer than one a row. When
    # each of the 31-40 rows counted, PostgreSQL's reads held about 50.
    assert counted < 31, f"{counted:.1f} objects the collector counts held by a read of 31-40 rows"
    assert [m.text for m in [*held[-1].history, *live] if gc.is_tracked(m)] == []


@pytest.mark.parametrize("reader", ["hot", "sqlalchemy"])
async def test_the_role_read_sees_a_role_change_at_once(engine: AsyncEngine, reader: str) -> None:
    # The gateway reads roles on the hot store; the CLI's stores through SQLAlchemy: the same answers.
    pairing = PairingStore(engine, roles=hot_store(engine) if reader == "hot" else None)
    user = await pairing.add_user("Bob", "user", links=["discord:42"])
    assert (await pairing.principal_for_user(user.id)).role is Role.USER
    assert (await pairing.resolve("discord", "42")).role is Role.USER
    await pairing.set_role(user.id, "admin", by="test")
    assert (await pairing.principal_for_user(user.id)).role is Role.ADMIN
    seen = await pairing.resolve("discord", "42", "Bobby")
    assert seen is not None and seen.role is Role.ADMIN and seen.display_name == "Bobby"
    assert await pairing.resolve("discord", "43") is None


async def test_a_turn_stores_and_runs_with_the_role_the_users_table_holds_when_it_is_stored(
    engine: AsyncEngine, clock: Clock
) -> None:
    # Every begin_turn path: a new session (the transaction), an existing one (PostgreSQL's one
    # statement), a message stored before; and a speaker with no row stores nothing.
    pairing = PairingStore(engine)
    bob = await pairing.principal_for_user((await pairing.add_user("Bob", "user")).id)
    assert bob.from_users and bob.role is Role.USER
    store = SessionStore(engine, clock=clock)

    async def turn(mid: str, key: SessionKey = KEY, speaker: Principal = bob) -> Any:
        return await store.begin_turn(
            key, platform_message_id=mid, speaker=speaker, display_name="Bob", text=mid, said_at=store.now(),
            history_limit=50,
        )  # fmt: skip

    first = await turn("m1")
    assert first.speaker is bob and first.stored.stored_role == "user"
    await pairing.set_role(bob.user_id, "admin", by="test")
    second = await turn("m2")  # bob as read before the change
    assert second.speaker.role is Role.ADMIN and second.speaker.user_id == bob.user_id and second.speaker.from_users
    assert second.stored.stored_role == "admin"
    assert [m.stored_role for m in await store.history(first.session_id)] == ["user", "admin"]
    elsewhere = await turn("m3", SessionKey("web", "conv-new"))
    assert elsewhere.speaker.role is Role.ADMIN and elsewhere.stored.stored_role == "admin"
    again = await turn("m2")  # stored before, never answered: resumed, as the person is now
    assert again.resumed and again.speaker.role is Role.ADMIN
    # A principal not read from the users table (the operator's) is taken as given.
    operator = Principal.human("admin", Role.ADMIN, "Dashboard")
    assert (await turn("m4", speaker=operator)).speaker is operator
    async with engine.begin() as conn:
        await conn.exec_driver_sql("DELETE FROM role_changes")
        await conn.exec_driver_sql("DELETE FROM users")
    count = await _messages(engine)
    for mid, key in (("m5", KEY), ("m6", SessionKey("web", "conv-none"))):
        with pytest.raises(gateway.sessions.SpeakerGone, match="no user"):
            await turn(mid, key)
    assert await _messages(engine) == count
    assert await store.find_session(SessionKey("web", "conv-none")) is None


async def _messages(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(Message)) or 0)


def _seed_rows(rng: random.Random, now: datetime) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    words = ["invoice", "server", "backup", "deploy", "payroll", "export", "audit", "ticket"]
    rows: list[dict[str, Any]] = []
    term_rows: list[dict[str, Any]] = []
    for i in range(120):
        personal = i % 3 == 0
        subject = f"{rng.choice(words)} {i}"
        content = " ".join(rng.choice(words) for _ in range(rng.randint(2, 6)))
        said = now - timedelta(minutes=rng.randint(0, 5000))
        status = "live" if rng.random() < 0.8 else "superseded"
        row = {
            "id": f"m_{i:04d}",
            "scope": "personal" if personal else "agent_notes",
            "owner_user_id": f"u_{i % 2}" if personal else None,
            "subject": subject,
            "subject_key": subject_key(subject),
            "content": content,
            "status": status,
            "said_at": said,
            "recorded_at": said,
            "review_by": None if personal else now + timedelta(days=rng.randint(-3, 30)),
            "source": "live",
            "author_user_id": "u_0",
            "author_role": "admin",
            "session_id": "s_x",
            "evidence": [f"msg-{i}"],
            "run_id": None,
            "superseded_by": None,
            "applies_to": ["sop-a"] if i % 7 == 0 else None,
            "citations": None,
        }
        rows.append(row)
        if not personal and status == "live":
            term_rows.extend(note_postings(row["id"], subject, content, row["said_at"], row["review_by"]))
    return rows, term_rows


async def _reference_candidates(
    engine: AsyncEngine, user_id: str | None, words: list[str], now: datetime
) -> dict[str, list[tuple[Any, float]]]:
    """What the candidate statement answers through SQLAlchemy, each record read whole by id: no cache."""
    params: dict[str, Any] = {"now": now, "recent_limit": 7}
    if words:
        params.update(words=words, match_word_postings=MATCH_WORD_POSTINGS)
    if user_id:
        params.update(user_id=user_id, personal_limit=9)
    by_part: dict[str, list[tuple[Any, float]]] = {"match": [], "recent": [], "personal": []}
    async with engine.connect() as conn:
        for r in (await conn.execute(_candidates_statement(bool(words), bool(user_id), 10), params)).all():
            whole = (await conn.execute(select(MemoryRecord.__table__).where(MemoryRecord.id == r.id))).one()
            assert (whole.status, whole.superseded_by) == (r.status, r.superseded_by)
            by_part[r.part].append((_view(whole), float(r.score)))
    return by_part


async def test_candidates_are_what_the_sqlalchemy_statement_returns(engine: AsyncEngine, clock: Clock) -> None:
    """On the raw driver and through SQLAlchemy, with the store's kept views cold and warm, after a retirement."""
    rows, term_rows = _seed_rows(random.Random(7), clock.now)
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), rows)
        await conn.execute(MemoryTerm.__table__.insert(), term_rows)
    stores = [MemoryStore(engine, clock=clock, raw=hot_store(engine)), MemoryStore(engine, clock=clock)]
    shapes = [("u_0", ["invoice", "audit"]), (None, ["server"]), ("u_1", []), (None, [])]
    seen: set[str] = set()
    gone: list[str] = []
    for round_ in ("cold", "warm", "after a retirement"):
        if round_ == "after a retirement":
            # Another process retires a note and a personal record the stores have already read.
            for scope in ("agent_notes", "personal"):
                gone.append(next(r["id"] for r in rows if r["scope"] == scope and r["id"] in seen))
            async with engine.begin() as conn:
                await conn.execute(
                    MemoryRecord.__table__.update()
                    .where(MemoryRecord.id.in_(gone))
                    .values(status="superseded", superseded_by=rows[-1]["id"])
                )
                await conn.execute(MemoryTerm.__table__.delete().where(MemoryTerm.record_id.in_(gone)))
            seen = set()
        for user_id, words in shapes:
            want = await _reference_candidates(engine, user_id, words, clock.now)
            for store in stores:
                got = await store.prompt_candidates(
                    user_id=user_id, query_terms=words, now=clock.now, matched_limit=10, recent_limit=7,
                    personal_limit=9,
                )  # fmt: skip
                assert {v.id: (v, round(s, 9)) for v, s in got.matched_notes} == {
                    v.id: (v, round(s, 9)) for v, s in want["match"]
                }, round_
                assert {v.id: v for v in got.recent_notes} == {v.id: v for v, _ in want["recent"]}, round_
                assert {v.id: v for v in got.personal} == {v.id: v for v, _ in want["personal"]}, round_
                assert bool(words) == bool(got.matched_notes) and bool(user_id) == bool(got.personal)
                seen |= {v.id for v, _ in got.matched_notes} | {v.id for v in got.recent_notes + got.personal}
    assert len(gone) == 2 and not seen & set(gone)


async def test_every_word_count_reads_what_the_sqlalchemy_statement_returns_compiled_once_per_shape(
    engine: AsyncEngine, clock: Clock
) -> None:
    """Conversations of 1 to MAX_QUERY_TERMS words: the raw driver's answer is SQLAlchemy's, on one compile a shape.

    A word count not seen before only expands the compiled statement's IN lists; it used
    to compile the whole UNION again (3-6 ms), which a new conversation length paid on its turn.
    """
    rows, term_rows = _seed_rows(random.Random(5), clock.now)
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), rows)
        await conn.execute(MemoryTerm.__table__.insert(), term_rows)
    memory.store._candidates_compiled.cache_clear()
    memory.store._candidates_sql.cache_clear()
    raw = MemoryStore(engine, clock=clock, raw=hot_store(engine))
    vocab = ["invoice", "server", "backup", "deploy", "payroll", "export", "audit", "ticket"]
    vocab += [f"nomatch{i}" for i in range(MAX_QUERY_TERMS)]
    for n in range(1, MAX_QUERY_TERMS + 1):
        words = random.Random(n).sample(vocab, n)
        for user_id in ("u_0", None):
            want = await _reference_candidates(engine, user_id, words, clock.now)
            got = await raw.prompt_candidates(
                user_id=user_id, query_terms=words, now=clock.now, matched_limit=10, recent_limit=7, personal_limit=9
            )
            assert {v.id: round(s, 9) for v, s in got.matched_notes} == {v.id: round(s, 9) for v, s in want["match"]}, (
                words
            )
            assert [v.id for v in got.recent_notes] == [v.id for v, _ in want["recent"]]
    assert memory.store._candidates_compiled.cache_info().misses == 2  # (words, user) and (words, no user)
    assert memory.store._candidates_sql.cache_info().misses == 2 * MAX_QUERY_TERMS


async def test_candidates_read_in_several_fetches_and_beyond_the_kept_views(
    engine: AsyncEngine, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More new ids than one fetch takes, and more records than the store keeps: the same answer."""
    rows, term_rows = _seed_rows(random.Random(11), clock.now)
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), rows)
        await conn.execute(MemoryTerm.__table__.insert(), term_rows)
    monkeypatch.setattr(memory.store, "_ID_BUCKETS", (2, 4))
    monkeypatch.setattr(memory.store, "_KEPT_VIEWS", 5)
    raw, plain = MemoryStore(engine, clock=clock, raw=hot_store(engine)), MemoryStore(engine, clock=clock)
    kw: dict[str, Any] = {"matched_limit": 30, "recent_limit": 30, "personal_limit": 30}
    for _ in range(2):
        got = await raw.prompt_candidates(user_id="u_0", query_terms=["invoice", "server"], now=clock.now, **kw)
        want = await plain.prompt_candidates(user_id="u_0", query_terms=["invoice", "server"], now=clock.now, **kw)
        assert got == want and len(got.matched_notes) > 4 and len(got.personal) > 4
        assert len(raw._views) <= 5 and len(plain._views) <= 5


async def _trimmed(store: SessionStore, conversation: str) -> tuple[str, str]:
    """A session of three messages trimmed to one: (session id, archive id); the trim queued its job."""
    sid = await store.session_id(SessionKey("web", conversation))
    for i in range(3):
        await store.store_message(
            sid, platform_message_id=f"{conversation}-{i}", speaker=ALICE, display_name="A", text=f"t{i}",
            said_at=store.now(),
        )  # fmt: skip
    done = await store.trim(sid, max_messages=2, keep_messages=1, turn_principal=ALICE, trust_of=lambda _: "user")
    assert done is not None
    return sid, done.archive_id


async def test_the_turn_after_a_trim_reads_the_sessions_previous_context_sent_once(
    engine: AsyncEngine, clock: Clock
) -> None:
    # The next prompt's PREVIOUS CONTEXT (the trimmed slices' summaries, up to 4,000 characters) comes with
    # the turn's own row. On PostgreSQL the one-statement turn sent it on every history row as well: most
    # of the statement's bytes, each copy decoded again into a string of its own.
    store = SessionStore(engine, clock=clock)
    sid, _ = await _trimmed(store, KEY.conversation_id)
    summary = await store.previous_context(sid)
    assert "t0" in summary and "t1" in summary  # the slice's summary
    start = await begin(store, "m-next", "and then")
    assert start.session_id == sid and start.previous_context == summary
    assert [m.text for m in start.history] == ["t2", "and then"]  # t0 and t1 went into the summary
    if engine.dialect.name != "postgresql":
        return
    from gateway.hotstore.base import TurnMessage
    from gateway.hotstore.postgres import _FIND_STORE_AND_READ, _message_values

    now = store.now()
    m = TurnMessage(
        channel=KEY.channel, conversation_id=KEY.conversation_id, thread_id="", parent_conversation_id=None,
        platform_message_id="m-last", speaker_user_id="u_alice", stored_role="user",
        display_name="Alice", text="last", said_at=now, now=now, history_limit=10, reply_requested=False,
    )  # fmt: skip
    conn = await asyncpg.connect(engine.url.set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        rows = await conn.fetch(
            _FIND_STORE_AND_READ, KEY.channel, KEY.conversation_id, "", *_message_values(m), 9, False
        )
    finally:
        await conn.close()
    assert sorted(r["text"] for r in rows) == ["and then", "last", "t2"]
    assert [(r["text"], r[0]) for r in rows if r[0] is not None] == [("last", summary)]  # with the new row only


async def test_a_job_is_queued_unless_the_one_named_is_still_pending(engine: AsyncEngine, clock: Clock) -> None:
    # Both stores: one statement looks at the named job and inserts only if it is not pending.
    hot = hot_store(engine)
    first = await hot.queue_job("trim", {"session_id": "s1"}, clock.now)
    assert await hot.queue_job_unless_pending("trim", {"session_id": "s1", "n": 2}, clock.now, first) is None
    store = SessionStore(engine, clock=clock)
    assert [(j.id, j.payload) for j in await store.jobs()] == [(first, {"session_id": "s1"})]  # nothing added
    taken = await store.claim_job("w1", kinds=("trim",), lease_s=60)
    assert taken is not None and taken.id == first
    second = await hot.queue_job_unless_pending("trim", {"session_id": "s1", "n": 3}, clock.now, first)
    assert second is not None and second != first  # the named one is running: a new one
    assert await hot.queue_job_unless_pending("trim", {"session_id": "s1"}, clock.now, 987_654) is not None  # none
    # A pending job of another session or kind under that id (SQLite gives a deleted job's id again) is not it.
    other = await hot.queue_job("trim", {"session_id": "s2"}, clock.now)
    assert await hot.queue_job_unless_pending("trim", {"session_id": "s1"}, clock.now, other) is not None
    extract = await hot.queue_job("extract", {"session_id": "s1"}, clock.now)
    assert await hot.queue_job_unless_pending("trim", {"session_id": "s1"}, clock.now, extract) is not None
    (row,) = [j for j in await store.jobs() if j.id == second]
    assert (row.kind, row.status, row.payload, row.attempts) == ("trim", "pending", {"session_id": "s1", "n": 3}, 0)
    assert row.run_after == clock.now and row.created_at == clock.now


async def test_on_sqlite_a_trim_still_pending_is_seen_without_the_write_lock(tmp_path: Path, clock: Clock) -> None:
    # Each turn past max_messages asks for a trim until the job process claims the pending one. The ask took
    # the write lock to write nothing, and waited for the job process's writes to do it.
    path = tmp_path / "q.db"
    engine = make_engine(f"sqlite+aiosqlite:///{path}")
    try:
        await upgrade(engine)
        hot = hot_store(engine)
        first = await hot.queue_job("trim", {"session_id": "s1"}, clock.now)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the job process's write transaction, held
        try:
            ask = hot.queue_job_unless_pending("trim", {"session_id": "s1"}, clock.now, first)
            assert await asyncio.wait_for(ask, timeout=20) is None  # the lock's holder never let it go
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store = SessionStore(engine, clock=clock)
        assert [j.id for j in await store.jobs()] == [first]
    finally:
        await engine.dispose()


async def test_each_job_is_claimed_once_across_processes_and_reads_back_as_stored(
    engine: AsyncEngine, db_url: str, clock: Clock
) -> None:
    store = SessionStore(engine, clock=clock)
    trimmed = [await _trimmed(store, f"conv-{i}") for i in range(2)]
    other_engine = make_engine(db_url)  # a second process's engine and hot store on the same database
    try:
        other = SessionStore(other_engine, clock=clock)
        assert await store.claim_job("w-revise", kinds=("revise",)) is None  # only the kinds asked for
        claims = await asyncio.gather(*(s.claim_job(f"w{i}", lease_s=60) for i, s in enumerate([store, other] * 3)))
        got = sorted((j for j in claims if j is not None), key=lambda j: j.id)
        assert len(got) == 2 and len({j.id for j in got}) == 2  # two jobs, each claimed once
        for job, (sid, archive_id) in zip(got, trimmed, strict=True):
            assert (job.kind, job.status, job.attempts) == ("extract", "running", 1)
            assert job.payload["archive_id"] == archive_id and job.payload["session_id"] == sid
            assert job.locked_at == clock.now and job.locked_at.tzinfo is not None
            async with store._sessions() as s:
                orm = await s.get(Job, job.id)
                assert orm is not None
                assert (orm.locked_by, orm.locked_at, orm.attempts, orm.payload, orm.run_after, orm.created_at) == (
                    job.locked_by, job.locked_at, job.attempts, job.payload, job.run_after, job.created_at,
                )  # fmt: skip
        # The slice the job extracts: what SQLAlchemy reads for the archive, oldest first.
        sid, archive_id = trimmed[0]
        async with store._sessions() as s:
            orm_rows = (await s.scalars(select(Message).where(Message.archive_id == archive_id))).all()
        assert [m.text for m in await other.archive_messages(archive_id)] == ["t0", "t1"]
        assert [m.id for m in await store.archive_messages(archive_id)] == sorted(m.id for m in orm_rows)
        clock.advance(seconds=5)
        await other.finish_job(got[0].id)
        (done,) = await store.jobs(status="done")
        assert done.id == got[0].id and done.finished_at == clock.now and done.last_error is None
        # The other job's worker died: its lease expires and another claims it, attempt 2.
        assert await store.claim_job("w-late", lease_s=60) is None
        clock.advance(seconds=61)
        again = await other.claim_job("w-late", lease_s=60)
        assert again is not None and (again.id, again.attempts, again.locked_by) == (got[1].id, 2, "w-late")
        assert await store.claim_job("w-later", lease_s=60) is None
    finally:
        await other_engine.dispose()


async def test_finishing_a_job_claims_the_next_once_and_the_last_finishes_alone(
    engine: AsyncEngine, db_url: str, clock: Clock
) -> None:
    store = SessionStore(engine, clock=clock)
    for i in range(3):
        await _trimmed(store, f"conv-{i}")
    other_engine = make_engine(db_url)  # another process's worker, claiming at the same time
    try:
        other = SessionStore(other_engine, clock=clock)
        first = await store.claim_job("w1", lease_s=60)
        taken = await other.claim_job("w2", lease_s=60)  # the second job: the other worker's
        assert first is not None and taken is not None
        clock.advance(seconds=1)
        nxt = await store.finish_and_claim_job(first.id, "w1", lease_s=60)
        assert nxt is not None and nxt.id not in (first.id, taken.id)  # the third: never the other's
        assert (nxt.status, nxt.locked_by, nxt.attempts, nxt.locked_at) == ("running", "w1", 1, clock.now)
        assert await store.finish_and_claim_job(nxt.id, "w1", kinds=("revise",), lease_s=60) is None  # kinds
        assert await other.finish_and_claim_job(taken.id, "w2", lease_s=60) is None  # nothing left: finished alone
        done = await store.jobs(status="done")
        assert sorted(j.id for j in done) == sorted((first.id, taken.id, nxt.id))
        assert all(j.finished_at == clock.now and j.last_error is None for j in done)
    finally:
        await other_engine.dispose()


async def test_a_forgotten_job_is_deleted_as_the_next_is_claimed(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    for i in range(2):
        await _trimmed(store, f"conv-{i}")
    first = await store.claim_job("w1", lease_s=60)
    assert first is not None
    nxt = await store.finish_and_claim_job(first.id, "w1", lease_s=60, forget=True)
    assert nxt is not None and nxt.id != first.id and (nxt.status, nxt.locked_by) == ("running", "w1")
    assert [j.id for j in await store.jobs()] == [nxt.id]  # the first is gone, not kept as done
    assert await store.finish_and_claim_job(nxt.id, "w1", lease_s=60, forget=True) is None
    assert await store.jobs() == []


@pytest.mark.parametrize("forget", [False, True])
async def test_a_job_finished_after_its_lease_ran_out_is_not_claimed_again_by_its_own_finish(
    engine: AsyncEngine, clock: Clock, forget: bool
) -> None:
    # On PostgreSQL the finish and the claim are one statement, whose claim reads the snapshot from
    # before the finish: there the finished job is still 'running' with a lease that has run out.
    store = SessionStore(engine, clock=clock)
    for i in range(2):
        await _trimmed(store, f"conv-{i}")
    first = await store.claim_job("w1", lease_s=60)
    assert first is not None
    clock.advance(seconds=61)  # a slow job: its lease is over when it finishes
    nxt = await store.finish_and_claim_job(first.id, "w1", lease_s=60, forget=forget)
    assert nxt is not None and nxt.id != first.id and (nxt.status, nxt.attempts) == ("running", 1)
    left = {j.id: j.status for j in await store.jobs()}
    assert left == ({nxt.id: "running"} if forget else {first.id: "done", nxt.id: "running"})
    assert await store.finish_and_claim_job(nxt.id, "w1", lease_s=60, forget=forget) is None
    assert await store.claim_job("w2", lease_s=60) is None  # nothing runs twice


async def test_a_job_not_yet_due_is_not_claimed(engine: AsyncEngine, clock: Clock) -> None:
    store = SessionStore(engine, clock=clock)
    await _trimmed(store, "conv-due")
    job = await store.claim_job("w1")
    assert job is not None
    assert await store.fail_job(job.id, "boom", base_delay_s=5) == "pending"
    assert await store.claim_job("w1") is None  # due in 5 s
    clock.advance(seconds=5)
    again = await store.claim_job("w1")
    assert again is not None and again.attempts == 2


async def test_a_turn_waits_for_a_cold_transaction_holding_the_write_lock(engine: AsyncEngine, clock: Clock) -> None:
    """A SQLAlchemy transaction holds the write lock across an await: the turn completes after it, nothing lost."""
    store = SessionStore(engine, clock=clock)
    await begin(store, "m0")  # the hot connection is open before the lock is taken
    hb = Heartbeat.__table__
    async with engine.begin() as conn:
        await conn.execute(hb.insert().values(id="cold", at=clock.now))  # SQLite: the write lock, held from here
        turn = asyncio.create_task(begin(store, "m1", "during the lock"))
        await asyncio.sleep(0.2)  # the loop must stay free to run this transaction to its end
        if engine.dialect.name == "sqlite":
            assert not turn.done()  # one writer at a time: the turn waits, it does not bypass the lock
        await conn.execute(hb.update().where(hb.c.id == "cold").values(at=clock.now + timedelta(seconds=1)))
    start = await asyncio.wait_for(turn, timeout=60)
    assert start.stored is not None and start.stored.text == "during the lock"
    async with engine.connect() as conn:
        assert await conn.scalar(select(hb.c.at).where(hb.c.id == "cold")) == clock.now + timedelta(seconds=1)
    assert [m.text for m in await store.history(start.session_id)] == ["hello", "during the lock"]


async def test_a_read_only_database_is_a_storage_fault(engine: AsyncEngine, db_url: str, clock: Clock) -> None:
    """A write the database refuses raises what the gateway answers 503, naming the reason; nothing is kept."""
    store = SessionStore(engine, clock=clock)
    await begin(store, "m0")
    if engine.dialect.name == "sqlite":

        def read_only(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.cursor().execute("PRAGMA query_only=ON")

        event.listen(engine.sync_engine, "connect", read_only)
    else:
        name = make_url(db_url).database
        conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        finally:
            await conn.close()
    await engine.dispose()  # the hot store reconnects into the fault with the engine
    with pytest.raises(Exception) as raised:
        await begin(store, "m1")
    reason = storage_reason(raised.value)
    assert reason is not None and "read" in reason.lower()
    assert raised.value.__module__.split(".")[0] in {"sqlite3", "asyncpg"}
    async with engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(Message)) == 1


async def test_one_hot_store_per_engine_closed_with_it(engine: AsyncEngine, clock: Clock) -> None:
    assert hot_store(engine) is hot_store(engine)
    store = SessionStore(engine, clock=clock)
    await begin(store, "m0")
    await engine.dispose()
    assert (await begin(store, "m1")).stored is not None  # reopened on next use


async def test_an_engine_let_go_takes_its_hot_store_with_it(engine: AsyncEngine, clock: Clock) -> None:
    """The stores are kept per engine in a weak map: neither may hold the other alive.

    The SQLite store's connect hook held its engine, so every engine a process made stayed, with
    its pool, its statement cache and the rows its store kept (the test suite's heap grew by
    about 9,000 rows over two of its files).
    """
    other = make_engine(engine.url.render_as_string(hide_password=False))
    await begin(SessionStore(other, clock=clock), "m0")  # the store made and used: a connection, a row kept
    store, made = weakref.ref(hot_store(other)), weakref.ref(other.sync_engine)  # the weak map's key
    await other.dispose()
    del other
    gc.collect()
    assert made() is None, "the engine is still held after it was let go"
    assert store() is None, "its hot store is still held after the engine went"


async def test_reading_a_trimmed_slice_on_sqlite_uses_the_session_index_not_a_scan_of_every_message(
    tmp_path: Path, clock: Clock
) -> None:
    # A job reads its slice once; by archive id alone that read walked every message ever stored.
    import sqlite3

    from gateway.hotstore import sql

    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    try:
        await upgrade(engine)
        _, archive_id = await _trimmed(SessionStore(engine, clock=clock), "conv-plan")
    finally:
        await engine.dispose()
    with sqlite3.connect(tmp_path / "g.db") as conn:
        plan = " ".join(str(r) for r in conn.execute("EXPLAIN QUERY PLAN " + sql.ARCHIVE_MESSAGES, (archive_id,) * 2))
    assert "SCAN messages" not in plan and "ix_messages_session_live" in plan, plan


@pytest.mark.parametrize("reply_requested", [True, False])
async def test_on_postgres_a_turn_waits_for_the_disk_once_and_a_store_only_message_on_its_own_commit(
    pg_url: str, reply_requested: bool
) -> None:
    # A message asked for an answer is committed without waiting for the disk: the reply's commit, which
    # waits, carries it (WAL order). A message stored without an answer must wait on its own commit.
    # Run here inside an outer transaction so the setting the statement leaves can be read before commit.
    from gateway.hotstore.base import TurnMessage
    from gateway.hotstore.postgres import _FIND_STORE_AND_READ, _message_values

    engine = make_engine(pg_url)
    try:
        await upgrade(engine)
        store = SessionStore(engine)
        first = await begin(store, "m1")  # the session exists: the next message takes the one-statement path
        conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            default = await conn.fetchval("SELECT current_setting('synchronous_commit')")
            now = store.now()
            m = TurnMessage(
                channel=KEY.channel, conversation_id=KEY.conversation_id, thread_id="", parent_conversation_id=None,
                platform_message_id="m2", speaker_user_id="u_alice", stored_role="user",
                display_name="Alice", text="again", said_at=now, now=now, history_limit=10,
                reply_requested=reply_requested,
            )  # fmt: skip
            async with conn.transaction():
                rows = await conn.fetch(_FIND_STORE_AND_READ, "web", "conv-1", "", *_message_values(m), 9, False)
                assert [r["platform_message_id"] for r in rows][:1] == ["m2"] and rows[0][
                    "session_id"
                ] == first.session_id
                setting = await conn.fetchval("SELECT current_setting('synchronous_commit')")
            assert setting == ("off" if reply_requested else default)
            assert (
                await conn.fetchval("SELECT current_setting('synchronous_commit')") == default
            )  # that transaction's only
        finally:
            await conn.close()
    finally:
        await engine.dispose()


@given(
    at=st.datetimes(timezones=st.just(UTC) | st.timezones(), allow_imaginary=False).filter(
        lambda d: datetime(1, 1, 2) <= d.replace(tzinfo=None) <= datetime(9999, 12, 30)
    )
)
def test_sqlite_stores_a_time_as_sqlalchemy_does_naive_utc_text_and_reads_it_back(at: datetime) -> None:
    # The hot store writes the same text SQLAlchemy's UTCDateTime does, which both then read back.
    text = encode_time(at)
    assert text == at.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
    assert decode_time(text) == at.astimezone(UTC)


async def test_the_append_only_migration_downgrades_and_upgrades(db_url: str, clock: Clock) -> None:
    engine = make_engine(db_url)
    try:
        await upgrade(engine)
        store = SessionStore(engine, clock=clock)
        first = await begin(store, "m1", "first words", reply_requested=False)
        change = update(Message).where(Message.id == first.stored.id).values(text="other words")
        async with engine.begin() as conn:
            await conn.run_sync(alembic_downgrade, "0014_operator_logouts")
        async with engine.begin() as conn:  # no trigger: the change is taken (and undone, below)
            await conn.execute(change)
            await conn.execute(update(Message).where(Message.id == first.stored.id).values(text="first words"))
        await upgrade(engine)
        with pytest.raises(Exception, match="a stored message is not changed after its insert"):
            async with engine.begin() as conn:
                await conn.execute(change)
    finally:
        await engine.dispose()


async def _reply_index(engine: AsyncEngine) -> tuple[bool, str]:
    """(whether ``uq_messages_reply_to`` is partial, the plan of the stored-reply read) on this database."""
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            indexes = (await conn.exec_driver_sql("PRAGMA index_list(messages)")).all()
            partial = next(bool(r[4]) for r in indexes if r[1] == "uq_messages_reply_to")
            plan = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql.REPLY, (1,))).all()
            return partial, " ".join(str(r) for r in plan)
        sql_text = "SELECT indexdef FROM pg_indexes WHERE indexname = 'uq_messages_reply_to'"
        definition = (await conn.exec_driver_sql(sql_text)).scalar_one()
        return "WHERE" in definition, ""


async def test_the_one_reply_index_holds_replies_only_and_still_refuses_a_second_reply(
    db_url: str, clock: Clock
) -> None:
    # A person's message has no reply_to_id: migration 0016 leaves it out of the index, so a turn's
    # first commit no longer writes an index page nothing reads. One reply per message still holds,
    # on a database upgraded across the migration with replies already stored.
    engine = make_engine(db_url)
    try:
        await upgrade(engine)
        async with engine.begin() as conn:
            await conn.run_sync(alembic_downgrade, "0015_messages_append_only")
        assert (await _reply_index(engine))[0] is False
        store = SessionStore(engine, clock=clock)
        first = await begin(store, "m1")
        assert await reply(store, first.session_id, "m1", first.stored.id) is not None
        await upgrade(engine)
        partial, plan = await _reply_index(engine)
        assert partial
        if engine.dialect.name == "sqlite":
            assert "uq_messages_reply_to" in plan, plan  # a retry's stored reply is still an index lookup
        store = SessionStore(engine, clock=clock)  # a fresh store: nothing kept from before the upgrade
        assert await reply(store, first.session_id, "m1", first.stored.id, "a second answer") is None
        again = await begin(store, "m1")
        assert again.stored is None and again.reply == "hi Alice"
        second = await begin(store, "m2", "more")
        assert await reply(store, second.session_id, "m2", second.stored.id, "answer two") is not None
        async with engine.begin() as conn:  # the index itself refuses a second reply, whatever wrote it
            with pytest.raises(Exception, match=r"(?i)unique"):
                await conn.execute(
                    Message.__table__.insert().values(
                        session_id=first.session_id, platform_message_id="sneaky", display_name="agent",
                        text="x", said_at=clock.now, is_agent=True, created_at=clock.now, reply_to_id=first.stored.id,
                    )
                )  # fmt: skip
    finally:
        await engine.dispose()


async def test_on_sqlite_a_claim_does_as_much_with_2000_jobs_queued_as_with_20(tmp_path: Path, clock: Clock) -> None:
    # The claim took the oldest runnable job by reading every due pending one and sorting them: a queue
    # of N jobs cost O(N) a claim, inside the write lock the turns wait for. SQLite's own count of the
    # steps its statements run (a progress handler called at every one) tells the work, not the time.
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'q.db'}")
    try:
        await upgrade(engine)
        hot = hot_store(engine)
        stale = clock.now - timedelta(seconds=60)

        async def steps_of_a_claim() -> int:
            steps = 0

            def step() -> int:
                nonlocal steps
                steps += 1
                return 0  # go on

            conn = hot._connection()  # type: ignore[attr-defined]
            conn.set_progress_handler(step, 1)
            try:
                job = await hot.claim_job("w1", ("extract",), clock.now, stale)
            finally:
                conn.set_progress_handler(None, 1)
            assert job is not None
            return steps

        async def queue(n: int) -> None:
            for i in range(n):
                await hot.queue_job("extract", {"n": i}, clock.now)

        await queue(20)
        few = await steps_of_a_claim()
        await queue(1980)
        many = await steps_of_a_claim()
    finally:
        await engine.dispose()
    assert many < 2 * few, (few, many)


async def test_the_claim_index_migration_downgrades_and_upgrades(db_url: str, clock: Clock) -> None:
    async def claim_index() -> list[str]:
        async with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                rows = (await conn.exec_driver_sql("PRAGMA index_info(ix_jobs_claim)")).all()
                return [r[2] for r in sorted(rows)]
            q = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_jobs_claim'"
            definition = (await conn.exec_driver_sql(q)).scalar_one()
            return [c.strip() for c in definition.rsplit("(", 1)[1].rstrip(")").split(",")]

    engine = make_engine(db_url)
    try:
        await upgrade(engine)
        store = SessionStore(engine, clock=clock)
        await _trimmed(store, "conv-index")
        assert await claim_index() == ["status", "id"]
        async with engine.begin() as conn:
            await conn.run_sync(alembic_downgrade, "0016_reply_index_partial")
        assert await claim_index() == ["status", "run_after"]
        await upgrade(engine)
        assert await claim_index() == ["status", "id"]
        job = await store.claim_job("w1")  # the job queued before the round trip is still there
        assert job is not None and job.kind == "extract"
    finally:
        await engine.dispose()
