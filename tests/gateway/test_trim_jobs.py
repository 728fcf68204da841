"""Trims as durable jobs (issue 14, target 3): ``goclaw serve`` queues them and the job process runs them.

The turn's loop only records a ``trim`` job after the reply; whoever runs the jobs makes the
same trim, in the same one transaction, the turn would have made. On both databases.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.app import Gateway
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.hotstore import sql
from gateway.hotstore.postgres import _TRIM_SESSION
from gateway.hotstore.sql import numbered
from gateway.hotstore.sqlite import encode_time
from gateway.llm.base import ChatMessage, Completion, JsonSchema, Tool
from gateway.llm.builtin import BuiltinProvider
from gateway.sessions import TRIM_JOB, SessionKey, SessionStore, TrimResult
from gateway.turn import TurnRequest, TurnResult
from pairing import Principal
from pairing.principal import Role
from tests.conftest import Clock

ROOM = SessionKey("api", "room-1")
ALICE = Principal.human("u_alice", Role.USER, "Alice")


class SeeingBuiltin(BuiltinProvider):
    """The offline model, noting how many history lines each answer was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    async def complete(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), json_schema: JsonSchema | None = None
    ) -> Completion:
        if json_schema is None and not any(m.role == "tool" for m in messages):
            self.seen.append(sum(m.role != "system" for m in messages))
        return await super().complete(messages, tools=tools, json_schema=json_schema)


@pytest.fixture
async def gw(db_url: str, clock: Clock) -> AsyncIterator[Gateway]:
    cfg = Config.model_validate(
        {"database": {"url": db_url}, "session": {"max_messages": 6, "keep_messages": 2, "idle_extract_seconds": 0}}
    )
    gateway = Gateway(cfg, provider=SeeingBuiltin(), clock=clock, trim_jobs=True)
    await gateway.start(channels=False, worker=False)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def alice(gw: Gateway) -> Principal:
    user = await gw.pairing.add_user("Alice", "user")
    principal = await gw.pairing.principal_for_user(user.id)
    assert principal is not None
    return principal


async def say(gw: Gateway, clock: Clock, who: Principal, i: int) -> TurnResult:
    clock.advance(minutes=1)
    result = await gw.turns.handle(TurnRequest(ROOM, who, f"what is on the agenda for day {i}", f"m{i}", clock.now))
    await gw.turns.settled()  # the moment after the reply: the trim job is queued by now
    return result


async def test_the_turn_queues_the_trim_and_the_job_makes_it_in_one_transaction(gw: Gateway, clock: Clock) -> None:
    who = await alice(gw)
    results = [await say(gw, clock, who, i) for i in range(4)]  # 8 messages: past max_messages (6)
    sid = results[-1].session_id
    # The turn's loop trimmed nothing: it queued the job, and the history is whole meanwhile.
    assert [r.trimmed for r in results] == [None] * 4
    assert [j.kind for j in await gw.sessions.jobs(status="pending")] == [TRIM_JOB]
    assert await gw.sessions.list_archives(session_id=sid) == []
    assert len(await gw.sessions.history(sid)) == 8
    # The worker runs it: the trim, then the extraction job the trim wrote with its archive.
    assert await gw.worker.drain() == 2
    (archive,) = await gw.sessions.list_archives(session_id=sid)
    assert archive.message_count == 6
    live = await gw.sessions.history(sid)
    assert [m.text for m in live[:1]] == ["what is on the agenda for day 3"] and len(live) == 2
    assert "day 0" in await gw.sessions.previous_context(sid)  # the slice's summary, for the next prompts
    # A done trim job is forgotten (its archive and extraction job are its record); the extraction ran once.
    jobs = await gw.sessions.jobs()
    assert [(j.kind, j.status, j.payload["archive_id"]) for j in jobs] == [("extract", "done", archive.id)]
    # The next turn is answered from the trimmed history: the two kept lines and its own.
    await say(gw, clock, who, 4)
    assert gw.provider.seen[-1] == 3  # type: ignore[attr-defined]
    # The done extraction job stays worker.keep_done_jobs_days (7), then the idle worker deletes it.
    clock.advance(days=6)
    assert await gw.worker.prune() == (0, False)
    clock.advance(days=2)
    assert await gw.worker.prune() == (1, False)
    assert await gw.sessions.jobs() == []


async def test_turns_that_outrun_the_worker_add_no_trim_while_theirs_is_pending_and_the_session_is_cut_once(
    gw: Gateway, clock: Clock
) -> None:
    who = await alice(gw)
    results = [await say(gw, clock, who, i) for i in range(6)]  # past max_messages at the 4th, 5th and 6th
    sid = results[-1].session_id
    # The 5th and 6th turns found the 4th's trim job still pending: it will cut their messages too.
    (queued,) = await gw.sessions.jobs(status="pending")
    assert queued.kind == TRIM_JOB and queued.payload["turn_principal"]["user_id"] == who.user_id
    assert await gw.worker.drain() == 2  # the trim, then its extraction
    (archive,) = await gw.sessions.list_archives(session_id=sid)
    assert archive.message_count == 10  # all but keep_messages, the last two turns' included
    assert len(await gw.sessions.history(sid)) == 2
    jobs = await gw.sessions.jobs()
    assert [(j.kind, j.status) for j in jobs] == [("extract", "done")]  # one archive, one extraction


async def test_a_turn_queues_a_trim_again_once_the_pending_one_has_been_taken(gw: Gateway, clock: Clock) -> None:
    who = await alice(gw)
    [await say(gw, clock, who, i) for i in range(4)]  # the 4th queues a trim
    lease = gw.config.session.job_lease_seconds
    taken = await gw.sessions.claim_job("w-1", kinds=(TRIM_JOB,), lease_s=lease)
    assert taken is not None  # running: it may have read the session before the next turn's messages
    await say(gw, clock, who, 4)
    pending = await gw.sessions.jobs(status="pending")
    assert [j.kind for j in pending] == [TRIM_JOB] and pending[0].id != taken.id
    await say(gw, clock, who, 5)  # that one is pending: nothing more
    assert [j.id for j in await gw.sessions.jobs(status="pending")] == [pending[0].id]


async def test_a_trim_job_whose_worker_died_is_run_again_and_trims_once(gw: Gateway, clock: Clock) -> None:
    who = await alice(gw)
    sid = [await say(gw, clock, who, i) for i in range(4)][-1].session_id
    lease = gw.config.session.job_lease_seconds
    claimed = await gw.sessions.claim_job("w-dead", kinds=(TRIM_JOB,), lease_s=lease)
    assert claimed is not None and claimed.kind == TRIM_JOB  # ... and its worker is killed here
    assert await gw.worker.drain() == 0  # a live lease: nobody else takes it
    clock.advance(seconds=lease + 1)
    assert await gw.worker.drain() == 2
    (archive,) = await gw.sessions.list_archives(session_id=sid)
    assert archive.message_count == 6
    assert [j.kind for j in await gw.sessions.jobs()] == ["extract"]


async def three_messages(engine: AsyncEngine, clock: Clock) -> tuple[SessionStore, str]:
    """A session store on ``engine`` and a session holding Alice's t0, t1, t2."""
    store = SessionStore(engine, clock=clock)
    sid = await store.session_id(SessionKey("web", "room"))
    for i in range(3):
        await store.store_message(
            sid, platform_message_id=f"t{i}", speaker=ALICE, display_name="Alice", text=f"t{i}", said_at=clock.now
        )
    return store, sid


async def _trim_while_a_turn_stores(
    tmp_path: Path, clock: Clock, meanwhile: Callable[[sqlite3.Connection, str, str], None]
) -> tuple[list[str], list[str], TrimResult | None, int]:
    """Trim t0, t1, t2 to one kept message while ``meanwhile`` writes, from another connection, as the trim plans.

    Returns the history after, the slice archived, the trim and how many times it planned.
    """
    path = tmp_path / "g.db"
    engine = make_engine(f"sqlite+aiosqlite:///{path}")
    await upgrade(engine)
    store, sid = await three_messages(engine, clock)
    plans = 0

    def trust_of(_slice: Sequence[object]) -> str:
        # Called while the trim plans: a turn (another connection, no busy wait) writes now.
        nonlocal plans
        plans += 1
        if plans == 1:
            turn = sqlite3.connect(path, isolation_level=None, timeout=0)
            try:
                turn.execute("BEGIN IMMEDIATE")  # "database is locked" if the trim held the write lock
                meanwhile(turn, sid, encode_time(clock.now))
                turn.execute("COMMIT")
            finally:
                turn.close()
        return "user"

    try:
        done = await store.trim(sid, max_messages=2, keep_messages=1, turn_principal=ALICE, trust_of=trust_of)
        history = [m.text for m in await store.history(sid)]
        archived = [] if done is None else [m.text for m in await store.archive_messages(done.archive_id)]
    finally:
        await engine.dispose()
    return history, archived, done, plans


async def test_on_sqlite_a_trim_plans_without_the_write_lock_and_keeps_its_plan_when_a_turn_adds_to_the_history(
    tmp_path: Path, clock: Clock
) -> None:
    def new_message(turn: sqlite3.Connection, sid: str, at: str) -> None:
        turn.execute(sql.STORE, (sid, "t3", ALICE.user_id, "user", "Alice", "t3", at, False, at, None))

    history, archived, done, plans = await _trim_while_a_turn_stores(tmp_path, clock, new_message)
    # Planned once: the slice it planned (two of three) is still the oldest, and the write lock was not held
    # to plan again. The message stored meanwhile stays live with the one kept.
    assert plans == 1
    assert done is not None and done.message_count == 2
    assert archived == ["t0", "t1"]
    assert history == ["t2", "t3"]


async def test_on_sqlite_a_trim_plans_again_when_a_reply_to_its_slice_came_meanwhile(
    tmp_path: Path, clock: Clock
) -> None:
    def reply_to_t0(turn: sqlite3.Connection, sid: str, at: str) -> None:
        (t0,) = turn.execute(
            "SELECT id FROM messages WHERE session_id = ? AND platform_message_id = 't0'", (sid,)
        ).fetchone()
        turn.execute(sql.STORE, (sid, "t0:reply", None, None, "goclaw", "r0", at, True, at, t0))

    history, archived, done, plans = await _trim_while_a_turn_stores(tmp_path, clock, reply_to_t0)
    # ordering: the reply goes with its message, so the slice planned (t0, t1) is no longer the oldest two:
    # planned again, inside the write transaction, over the rows as they are now.
    assert plans == 2
    assert done is not None
    assert sorted(archived) == ["r0", "t0", "t1"]  # the archive reads back in id order
    assert history == ["t2"]


async def test_on_postgresql_a_turn_stores_a_message_while_a_trim_holds_the_session(pg_url: str, clock: Clock) -> None:
    """The trim's lock on the session row leaves the foreign key's KEY SHARE free: a turn's insert never waits for it.

    With ``FOR UPDATE`` the insert below waited until the trim committed (here: forever, so
    ``lock_timeout`` says so); a turn then waited for a trim's plan in the job process.
    """
    engine = make_engine(pg_url)
    await upgrade(engine)
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    try:
        store, sid = await three_messages(engine, clock)
        assert _TRIM_SESSION.endswith("FOR NO KEY UPDATE")
        stored: list[object] = []

        async def turn_stores() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("SET lock_timeout = '5s'")  # a wait for the trim's lock fails here, not hangs
                values = (sid, "t3", ALICE.user_id, "user", "Alice", "t3", clock.now, False, clock.now, None)
                stored.append(await conn.fetchval(numbered(sql.STORE), *values))
            except Exception as exc:  # reported by the assertion below
                stored.append(exc)
            finally:
                await conn.close()

        def trust_of(_slice: Sequence[object]) -> str:
            # Called while the trim plans, its transaction holding the session row: another connection stores now.
            if not stored:
                t = threading.Thread(target=lambda: asyncio.run(turn_stores()))
                t.start()
                t.join()
            return "user"

        done = await store.trim(sid, max_messages=2, keep_messages=1, turn_principal=ALICE, trust_of=trust_of)
        assert len(stored) == 1 and isinstance(stored[0], int), stored
        # The trim cut what it planned from the history it read; the message stored meanwhile stays live.
        assert done is not None and done.message_count == 2
        assert [m.text for m in await store.history(sid)] == ["t2", "t3"]
        assert [m.text for m in await store.archive_messages(done.archive_id)] == ["t0", "t1"]
    finally:
        await engine.dispose()
