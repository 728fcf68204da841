"""The background thread's SQLite engine: SQLAlchemy's aiosqlite dialect, its driver calls made inline.

What the background work writes through it must read back, through the
aiosqlite engine every other path uses, as it would have been written there;
a failed statement must roll back and leave the connection usable; a write must
wait out another connection's write lock instead of failing (and ``/metrics``
count a turn's wait); and the worker thread ``goclaw serve`` starts must use it,
and run a trim's extraction job to the end with it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import IntegrityError

from gateway.app import Gateway
from gateway.background import WorkerThread
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.metrics import Metrics
from gateway.models import Job, Message, Session
from gateway.sessions import SessionKey, SessionStore
from gateway.sqlite_inline import InlineConnection, make_inline_engine
from gateway.turn import TurnRequest
from memory.gate import WriteAccess
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from pairing.principal import Principal, Role
from tests.conftest import Clock

ALICE = Principal.human("u_alice", Role.USER, "Alice")
SAID = datetime(2026, 11, 30, 9, 15, 30, 123456, tzinfo=UTC)


def _db_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite+aiosqlite:///"))


async def test_records_written_inline_read_back_as_written_through_aiosqlite(sqlite_url: str) -> None:
    inline, plain = make_inline_engine(sqlite_url), make_engine(sqlite_url)
    try:
        await upgrade(plain)
        writer = MemoryWriter(MemoryStore(inline), write_access=WriteAccess())
        first = await writer.write(ALICE, "personal", "memory_write", subject="lunch", content="Soup.", said_at=SAID)
        later = SAID.replace(hour=10)
        second = await writer.write(ALICE, "personal", "memory_write", subject="lunch", content="Salad.", said_at=later)
        assert first.record is not None and second.record is not None
        # The subject rule ran through the inline driver: the first is history, with its revision row.
        read = MemoryStore(plain)
        old, new = await read.get(first.record.id), await read.get(second.record.id)
        assert old is not None and old.status == "superseded" and old.superseded_by == second.record.id
        assert new == second.record
        assert new.said_at == later and new.said_at.tzinfo is not None
        assert [r.retired_id for r in await read.revisions_for(first.record.id)] == [first.record.id]
    finally:
        await inline.dispose()
        await plain.dispose()


async def test_a_failed_statement_rolls_back_and_the_connection_goes_on(sqlite_url: str) -> None:
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    await plain.dispose()
    inline = make_inline_engine(sqlite_url)
    now = datetime.now(UTC)
    job = insert(Job).values(kind="extract", payload={}, status="pending", run_after=now)
    orphan = insert(Message).values(
        session_id="s_missing", speaker_user_id="u", stored_role="user", display_name="U",
        text="x", said_at=now, is_agent=False, created_at=now,
    )  # fmt: skip

    async def both() -> None:
        async with inline.begin() as conn:
            await conn.execute(job)
            await conn.execute(orphan)

    try:
        with pytest.raises(IntegrityError):  # foreign keys are on: no such session
            await both()
        async with inline.connect() as conn:
            assert (await conn.execute(select(Job.id))).all() == []  # the job went with the failed transaction
            raw = await conn.get_raw_connection()
            assert isinstance(raw.driver_connection, InlineConnection)
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
    finally:
        await inline.dispose()


async def test_a_write_waits_for_another_connections_write_lock(sqlite_url: str) -> None:
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    await plain.dispose()
    holder = sqlite3.connect(_db_path(sqlite_url), check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute(
        "INSERT INTO sessions (id, channel, conversation_id, thread_id, previous_context, created_at, updated_at)"
        " VALUES ('s_held', 'api', 'held', '', '', '2026-12-01 00:00:00', '2026-12-01 00:00:00')"
    )
    inline = make_inline_engine(sqlite_url)
    release = threading.Timer(0.3, holder.commit)
    try:
        release.start()
        now = datetime.now(UTC)
        async with inline.begin() as conn:  # waits in SQLite's busy handler, then commits
            await conn.execute(
                insert(Session).values(
                    id="s_inline", channel="api", conversation_id="inline", thread_id="", previous_context="",
                    created_at=now, updated_at=now,
                )
            )  # fmt: skip
        async with inline.connect() as conn:
            assert sorted((await conn.execute(select(Session.id))).scalars()) == ["s_held", "s_inline"]
    finally:
        release.join()
        holder.close()
        await inline.dispose()


async def test_the_worker_thread_runs_a_trims_extraction_job_on_the_inline_driver(sqlite_url: str) -> None:
    cfg = Config.model_validate(
        {"database": {"url": sqlite_url}, "session": {"max_messages": 4, "keep_messages": 1, "idle_extract_seconds": 0}}
    )
    gw = Gateway(cfg, clock=Clock())
    await gw.start(channels=False, worker=False)
    thread = WorkerThread(cfg)
    await thread.start()
    try:
        gw.wake_remote_worker = thread.wake
        assert thread.gateway is not None and thread._loop is not None

        async def driver() -> object:
            async with thread.gateway.engine.connect() as conn:  # type: ignore[union-attr]
                return (await conn.get_raw_connection()).driver_connection

        raw = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(driver(), thread._loop))
        assert isinstance(raw, InlineConnection)
        alice = await gw.pairing.principal_for_user((await gw.pairing.add_user("Alice", "user")).id)
        for i, said in enumerate(["my favourite colour is green", "I live in Lisbon", "thanks", "bye"]):
            await gw.turns.handle(
                TurnRequest(SessionKey("api", "room"), alice, said, f"m{i}", datetime.now(UTC), "Alice")
            )
        await gw.turns.settled()
        for _ in range(200):  # the worker thread claims and runs the trim's job on its own
            jobs = await gw.sessions.jobs()
            if jobs and all(j.status == "done" for j in jobs):
                break
            await asyncio.sleep(0.05)
        assert jobs and all(j.status == "done" for j in jobs), [(j.kind, j.status, j.last_error) for j in jobs]
        summaries = [r for r in await gw.memory.store.personal_for(alice.user_id or "") if r.source == "live"]
        assert summaries, "the job wrote nothing to Alice's memory"
    finally:
        await thread.stop()
        await gw.stop()


async def test_a_turn_waiting_for_the_write_lock_goes_on_when_the_background_connection_commits(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.hotstore.sqlite as hot

    # Without the release signal the turn would sleep out a 30 s backoff before trying again.
    monkeypatch.setattr(hot, "_FIRST_WAIT_S", 30.0)
    monkeypatch.setattr(hot, "_MAX_WAIT_S", 30.0)
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    sessions = SessionStore(plain)
    holding, release = threading.Event(), threading.Event()

    def background() -> None:  # the worker thread's loop and inline engine, holding the write lock
        async def hold() -> None:
            inline = make_inline_engine(sqlite_url)
            now = datetime.now(UTC)
            try:
                async with inline.begin() as conn:
                    await conn.execute(
                        insert(Session).values(
                            id="s_bg", channel="api", conversation_id="bg", thread_id="", previous_context="",
                            created_at=now, updated_at=now,
                        )
                    )  # fmt: skip
                    holding.set()
                    release.wait(30)
            finally:
                await inline.dispose()

        asyncio.run(hold())

    thread = threading.Thread(target=background)
    thread.start()
    waits, tries, seconds = hot.RELEASES.waits, hot.RELEASES.busy_tries, hot.RELEASES.wait_seconds
    try:
        assert await asyncio.to_thread(holding.wait, 30)
        turn = asyncio.create_task(
            sessions.begin_turn(
                SessionKey("api", "waiting"), platform_message_id="m1", speaker=ALICE, display_name="Alice",
                text="hello", said_at=datetime.now(UTC), history_limit=10,
            )
        )  # fmt: skip
        await asyncio.sleep(0.2)
        assert not turn.done()  # it found the database busy and waits
        release.set()
        started = await asyncio.wait_for(turn, 15)  # well inside the 30 s backoff: woken by the commit
        assert started.stored.text == "hello"
        # /metrics counts the wait: one write, two busy tries (2 ms of inline polls, then the wait for a
        # release; the next try after the commit got the lock).
        assert (hot.RELEASES.waits, hot.RELEASES.busy_tries) == (waits + 1, tries + 2)
        assert hot.RELEASES.wait_seconds - seconds >= 0.2
        body = Metrics().render().decode()
        assert f"goclaw_sqlite_write_waits_total {float(waits + 1)}" in body
        assert f"goclaw_sqlite_write_busy_tries_total {float(tries + 2)}" in body
        assert "goclaw_sqlite_write_wait_seconds_total " in body
    finally:
        release.set()
        await asyncio.to_thread(thread.join, 30)
        await plain.dispose()


async def _started_turn(sessions: SessionStore, conversation: str) -> None:
    await sessions.begin_turn(
        SessionKey("api", conversation), platform_message_id="m1", speaker=ALICE, display_name="Alice",
        text="hello", said_at=datetime.now(UTC), history_limit=10,
    )  # fmt: skip


async def test_a_write_that_finds_the_lock_held_briefly_takes_it_without_putting_the_turn_behind_the_loop(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job process's write transactions are short: a turn polls the lock inline, not through the loop.

    Through the loop, the turn went behind every callback queued by then (at 8 clients the other
    turns, a millisecond each), 5-6 ms a waiting write.
    """
    import gateway.hotstore.sqlite as hot

    plain = make_engine(sqlite_url)
    await upgrade(plain)
    sessions = SessionStore(plain)
    await _started_turn(sessions, "warm")  # the hot store's connection opened
    holder = sqlite3.connect(_db_path(sqlite_url), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's short write transaction
    holder.execute("UPDATE sessions SET previous_context = 'held' WHERE conversation_id = 'warm'")
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # the holder commits while the turn polls
        pauses.append(seconds)
        if holder.in_transaction:
            holder.execute("COMMIT")

    monkeypatch.setattr(hot, "_pause", pause)
    others_ran = asyncio.Event()
    other = asyncio.get_running_loop().call_soon(others_ran.set)  # what the loop had queued
    waits, tries = hot.RELEASES.waits, hot.RELEASES.busy_tries
    try:
        await _started_turn(sessions, "polled")
        assert pauses == [hot.POLL_STEP_S]  # it found the lock held once, polled, and took it
        assert not others_ran.is_set()  # without the loop running the callbacks queued before it
        assert (hot.RELEASES.waits, hot.RELEASES.busy_tries) == (waits + 1, tries + 1)
        async with plain.connect() as conn:
            stored = await conn.scalar(
                select(Message.text).join(Session, Session.id == Message.session_id)
                .where(Session.conversation_id == "polled")
            )  # fmt: skip
            held = await conn.scalar(select(Session.previous_context).where(Session.conversation_id == "warm"))
        assert (stored, held) == ("hello", "held")  # both writes kept
    finally:
        other.cancel()
        holder.close()
        await plain.dispose()


async def test_while_one_write_waits_for_a_release_the_next_does_not_poll_and_the_loop_runs(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock held past the inline polls is held long: writes after it wait without holding the loop."""
    import gateway.hotstore.sqlite as hot

    monkeypatch.setattr(hot, "_FIRST_WAIT_S", 30.0)  # only a release wakes them
    monkeypatch.setattr(hot, "_MAX_WAIT_S", 30.0)
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    sessions = SessionStore(plain)
    await _started_turn(sessions, "warm")
    holder = sqlite3.connect(_db_path(sqlite_url), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    pauses: list[float] = []
    monkeypatch.setattr(hot, "_pause", lambda s: (pauses.append(s), time.sleep(s)))
    try:
        first = asyncio.create_task(_started_turn(sessions, "first"))
        await asyncio.sleep(0.1)  # the loop runs: the first write polled for 2 ms, then waits for a release
        assert not first.done()
        polled = len(pauses)
        assert polled >= 1
        second = asyncio.create_task(_started_turn(sessions, "second"))
        await asyncio.sleep(0.1)
        assert not second.done()
        assert len(pauses) == polled  # it did not poll: one write already waits for a release
        holder.execute("COMMIT")
        hot.RELEASES.released()  # what the job process reports when its transaction ends
        await asyncio.wait_for(asyncio.gather(first, second), 15)
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        await plain.dispose()
