"""On SQLite, a turn that lost the write lock once goes before the background work's next write.

The job process and the worker thread write right after they commit; a turn learns of
the release through its loop, milliseconds later. Before the background writers let
waiting turns go first, a turn lost the lock again and again (4 tries on average for the
slowest 1% of turns at 8 clients, 24-31 ms waited). These tests hold the lock from the
background, make a turn lose it twice, then let the background commit and write again at
once, as the job process does: the turn's message must be stored before that next write.
The job process hears of waiting turns through its socket (``t``/``f``), tested here too.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, text

import gateway.hotstore.sqlite as hot
from gateway.db import make_engine, upgrade
from gateway.hotstore import hot_store
from gateway.jobproc import JobProcess, from_parent
from gateway.metrics import Metrics
from gateway.models import Session
from gateway.sessions import SessionKey, SessionStore
from gateway.sqlite_inline import make_inline_engine
from pairing.principal import Principal, Role

ALICE = Principal.human("u_alice", Role.USER, "Alice")


def _session_row(name: str) -> dict[str, object]:
    now = datetime.now(UTC)
    return {
        "id": f"s_{name}", "channel": "api", "conversation_id": name, "thread_id": "", "previous_context": "",
        "created_at": now, "updated_at": now,
    }  # fmt: skip


def _stored(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT count(*) FROM messages WHERE text = 'hello'").fetchone()[0] == 1


async def _inline_writes(url: str, holding: threading.Event, go: threading.Event, seen: list[bool]) -> None:
    """The worker thread: hold the lock, then commit and write again at once, noting if the turn came first."""
    inline = make_inline_engine(url)
    try:
        async with inline.begin() as conn:
            await conn.execute(insert(Session).values(**_session_row("first")))
            holding.set()
            await asyncio.to_thread(go.wait, 30)
        async with inline.begin() as conn:  # the next write, right after the commit
            await conn.execute(insert(Session).values(**_session_row("next")))
            raw = await conn.execute(text("SELECT count(*) FROM messages WHERE text = 'hello'"))
            seen.append(raw.scalar_one() == 1)
    finally:
        await inline.dispose()


async def _hot_store_writes(url: str, holding: threading.Event, go: threading.Event, seen: list[bool]) -> None:
    """The job process's hot store (a claim, a finish): the same, through ``SQLiteHotStore(background=True)``."""
    path = url.removeprefix("sqlite+aiosqlite:///")
    store = hot.SQLiteHotStore(path, background=True)
    try:

        def first(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO jobs (kind, payload, status, attempts, run_after, created_at)"
                         " VALUES ('x', '{}', 'done', 0, '2026-12-04', '2026-12-04')")  # fmt: skip
            holding.set()
            go.wait(30)  # holding the lock, as a job's transaction does

        await store._run(first, write=True)
        seen.append(await store._run(_stored, write=True))  # the next write, right after the commit
    finally:
        store.close_now()


@pytest.mark.parametrize("writer", [_inline_writes, _hot_store_writes], ids=["inline-engine", "hot-store"])
async def test_a_turn_that_lost_the_lock_goes_before_the_background_writers_next_write(
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    writer: Callable[[str, threading.Event, threading.Event, list[bool]], Awaitable[None]],
) -> None:
    monkeypatch.setattr(hot, "YIELD_MAX_S", 30.0)  # the background waits for the turn, however long it takes here
    monkeypatch.setattr(hot, "_MAX_WAIT_S", 0.005)
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    sessions = SessionStore(plain)
    waits_before = hot.RELEASES.waits
    holding, go, seen = threading.Event(), threading.Event(), []
    background = threading.Thread(target=lambda: asyncio.run(writer(sqlite_url, holding, go, seen)))
    background.start()
    try:
        assert await asyncio.to_thread(holding.wait, 30)
        turn = asyncio.create_task(
            sessions.begin_turn(
                SessionKey("api", "waiting"), platform_message_id="m1", speaker=ALICE, display_name="Alice",
                text="hello", said_at=datetime.now(UTC), history_limit=10,
            )
        )  # fmt: skip
        for _ in range(3000):  # busy once, then busy again after its backoff: it counts as waiting
            if hot.RELEASES.turns_waiting:
                break
            await asyncio.sleep(0.01)
        assert hot.RELEASES.turns_waiting == 1
        go.set()
        started = await asyncio.wait_for(turn, 30)
        assert started.stored.text == "hello"
        await asyncio.to_thread(background.join, 30)
        assert seen == [True]  # the background's next write came after the turn's
        assert hot.RELEASES.turns_waiting == 0
        assert hot.RELEASES.waits == waits_before + 1  # counted once in /metrics, however many tries it took
    finally:
        go.set()
        await asyncio.to_thread(background.join, 30)
        await plain.dispose()


async def test_a_background_writer_waits_for_waiting_turns_at_most_its_limit(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn that never gets the lock (another process holds it) costs a job at most ``YIELD_MAX_S`` a write."""
    monkeypatch.setattr(hot, "YIELD_MAX_S", 0.05)
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    await plain.dispose()
    store = hot.SQLiteHotStore(sqlite_url.removeprefix("sqlite+aiosqlite:///"), background=True)
    hot.RELEASES.turn_waiting(True)  # never ends while the background writes
    try:
        wrote = await asyncio.wait_for(store.queue_job("x", {}, datetime.now(UTC)), 10)
        assert wrote > 0
    finally:
        hot.RELEASES.turn_waiting(False)
        store.close_now()


async def test_the_turns_own_store_never_waits_for_turns(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the background's stores yield: the turns' store on the serving loop writes even while turns wait."""
    monkeypatch.setattr(hot, "YIELD_MAX_S", 30.0)
    engine = make_engine(sqlite_url)
    await upgrade(engine)
    store = hot_store(engine)
    inline = make_inline_engine(sqlite_url)
    assert isinstance(store, hot.SQLiteHotStore) and not store.background
    assert isinstance(bg := hot_store(inline), hot.SQLiteHotStore) and bg.background
    hot.RELEASES.turn_waiting(True)
    try:
        assert await asyncio.wait_for(store.queue_job("x", {}, datetime.now(UTC)), 5) > 0
    finally:
        hot.RELEASES.turn_waiting(False)
        await engine.dispose()
        await inline.dispose()


def test_the_serving_process_tells_the_job_process_when_turns_start_and_stop_waiting() -> None:
    jobs = JobProcess(None)
    parent, child = socket.socketpair()
    jobs._sock = parent
    hot.RELEASES.on_turns_waiting = jobs.turns_waiting
    try:
        hot.RELEASES.turn_waiting(True)
        hot.RELEASES.turn_waiting(True)  # a second turn: the job process knows already
        hot.RELEASES.turn_waiting(False)
        hot.RELEASES.turn_waiting(False)  # the last one has the lock
        jobs.wake()
        assert child.recv(64) == b"tfw"  # told once each way, then a wake
    finally:
        hot.RELEASES.on_turns_waiting = None
        parent.close()
        child.close()


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"w", (None, True)),
        (b"t", (True, False)),
        (b"tf", (False, False)),
        (b"ft", (True, False)),
        (b"wtw", (True, True)),
        (b"wwtfw", (False, True)),
        (b"\x00", (None, True)),  # any other byte is a wake, as before
    ],
)
def test_the_job_process_reads_what_its_parent_said(data: bytes, said: tuple[bool | None, bool]) -> None:
    assert from_parent(data) == said


def test_metrics_show_what_turns_waited_for_the_write_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hot.RELEASES, "waits", 3)
    monkeypatch.setattr(hot.RELEASES, "busy_tries", 7)
    monkeypatch.setattr(hot.RELEASES, "wait_seconds", 0.25)
    body = Metrics().render().decode()
    assert "goclaw_sqlite_write_waits_total 3.0" in body
    assert "goclaw_sqlite_write_busy_tries_total 7.0" in body
    assert "goclaw_sqlite_write_wait_seconds_total 0.25" in body
