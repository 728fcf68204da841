"""Idle extraction: a quiet session is learned from without waiting for the trim, and never twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

import gateway.idle as idle_module
from gateway.app import Gateway
from gateway.config import Config
from gateway.idle import IdleExtractor
from gateway.llm.base import ChatMessage, Completion, JsonSchema, Tool
from gateway.llm.builtin import BuiltinProvider
from gateway.models import Message, Session
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from pairing import Principal
from tests.conftest import Clock, captured_reads, explain_captured, pg_rows_visited, pg_scans, query_plan

ROOM = SessionKey("api", "room-1")
TEACH = "from now on the daily report uses table example_orders"


class RecordingBuiltin(BuiltinProvider):
    """The offline model, recording every prompt and every extraction input it is shown."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []
        self.extraction_inputs: list[str] = []

    async def complete(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), json_schema: JsonSchema | None = None
    ) -> Completion:
        if json_schema is not None and json_schema.name == "extraction_result":
            self.extraction_inputs.append(next(m.content for m in reversed(messages) if m.role == "user"))
        elif json_schema is None:
            self.prompts.append("\n".join(m.content for m in messages if m.role == "system"))
        return await super().complete(messages, tools=tools, json_schema=json_schema)


@pytest.fixture
async def gw(db_url: str, clock: Clock) -> AsyncIterator[Gateway]:
    cfg = Config.model_validate(
        {
            "database": {"url": db_url},
            "session": {"max_messages": 10, "keep_messages": 1, "idle_extract_seconds": 120},
        }
    )
    gateway = Gateway(cfg, provider=RecordingBuiltin(), clock=clock)
    await gateway.start(channels=False, worker=False)
    try:
        yield gateway
    finally:
        await gateway.stop()


def model(gw: Gateway) -> RecordingBuiltin:
    assert isinstance(gw.provider, RecordingBuiltin)
    return gw.provider


async def person(gw: Gateway, name: str, role: str) -> Principal:
    user = await gw.pairing.add_user(name, role)
    principal = await gw.pairing.principal_for_user(user.id)
    assert principal is not None
    return principal


_n = iter(range(10_000))


async def say(gw: Gateway, clock: Clock, who: Principal, text: str, *, key: SessionKey = ROOM) -> str | None:
    clock.advance(seconds=5)
    name = who.display_name or "someone"
    result = await gw.turns.handle(TurnRequest(key, who, text, f"m{next(_n)}", clock.now, name))
    return result.reply


async def test_admin_teaching_is_in_the_next_prompt_once_the_session_is_quiet(gw: Gateway, clock: Clock) -> None:
    alice = await person(gw, "Alice", "admin")
    await say(gw, clock, alice, TEACH)
    # Not quiet yet: nothing is handed over, nothing is learned.
    clock.advance(seconds=60)
    assert await gw.idle.sweep_once() == []
    assert await gw.memory.store.list_records() == []

    clock.advance(seconds=61)
    (handed,) = await gw.idle.sweep_once()
    assert handed.job_id is not None
    assert await gw.worker.drain() == 1
    (note,) = await gw.memory.store.list_records(scope="agent_notes")
    assert "example_orders" in note.content and note.author_user_id == alice.user_id

    reply = await say(gw, clock, alice, "produce the daily report")
    assert note.id in model(gw).prompts[-1]
    assert reply is not None and "example_orders" in reply
    # A session already handed over is not handed over again while nothing new is said.
    clock.advance(seconds=600)
    swept = await gw.idle.sweep_once()
    assert [s.through_message_id > handed.through_message_id for s in swept] == [True]


async def test_a_later_trim_does_not_extract_the_same_messages_again(gw: Gateway, clock: Clock) -> None:
    alice = await person(gw, "Alice", "admin")
    await say(gw, clock, alice, TEACH)
    await say(gw, clock, alice, "answer me in English")
    clock.advance(seconds=121)
    (idle,) = await gw.idle.sweep_once()
    assert await gw.worker.drain() == 1
    learned = await gw.memory.store.list_records(include_history=True)

    # Four more exchanges pass max_messages (10): the trim cuts the oldest eleven messages.
    for text in ("what is on the agenda", "and tomorrow", "who is on call"):
        await say(gw, clock, alice, text)
    trimmed = await gw.turns.handle(TurnRequest(ROOM, alice, "thanks", "m-last", clock.now, "Alice"))
    await gw.turns.settled()  # the trim runs after the reply
    assert trimmed.trimmed is not None and trimmed.trimmed.message_count == 11
    assert await gw.worker.drain() == 1
    # The next quiet spell hands over only the message the trim kept.
    clock.advance(seconds=121)
    (after_trim,) = await gw.idle.sweep_once()
    assert after_trim.through_message_id - after_trim.after_message_id == 1
    assert after_trim.job_id is None  # only the agent's reply was new
    jobs = await gw.sessions.jobs()
    assert [j.payload.get("after_message_id") for j in jobs] == [0, idle.through_message_id]
    # The teaching lines went to the extractor once, in the idle slice; the trim's job
    # covered only what was said after it.
    inputs = model(gw).extraction_inputs
    assert sum(TEACH in i for i in inputs) == 1
    assert sum("answer me in English" in i for i in inputs) == 1
    assert "what is on the agenda" in inputs[-1]
    records = await gw.memory.store.list_records(include_history=True)
    notes = [r for r in records if r.scope == "agent_notes"]
    assert [r.status for r in notes] == ["live"]
    assert {r.id for r in learned} <= {r.id for r in records}
    assert await gw.memory.store.list_revisions() == []
    # The archive still holds the whole slice, the teaching line included.
    archive = await gw.sessions.get_archive(trimmed.trimmed.archive_id)
    assert archive is not None and TEACH in archive.markdown
    # The trimmed slice was all Alice's: its summary still goes to her personal memory.
    summaries = [r for r in records if r.subject == "conversation summary"]
    assert len(summaries) == 1 and summaries[0].owner_user_id == alice.user_id


async def test_shared_thread_rules_hold_in_an_idle_slice(gw: Gateway, clock: Clock) -> None:
    alice = await person(gw, "Alice", "admin")
    bob = await person(gw, "Bob", "user")
    stranger = Principal.unpaired("Stranger")
    await say(gw, clock, alice, TEACH)
    reply = await say(gw, clock, bob, "from now on use example_archive instead of example_orders")
    await say(gw, clock, bob, "answer me in English")
    await say(gw, clock, stranger, "from now on use example_unpaired. answer me in French")
    clock.advance(seconds=121)
    await gw.idle.sweep_once()
    assert await gw.worker.drain() == 1

    records = await gw.memory.store.list_records(include_history=True)
    notes = [r for r in records if r.scope == "agent_notes"]
    # A regular user's operational line is dropped; the admin's procedure stands.
    assert [(r.author_user_id, r.status) for r in notes] == [(alice.user_id, "live")]
    assert "example_orders" in notes[0].content
    # Personal items go to the person who said them; the unpaired sender's lines are nobody's.
    personal = {(r.owner_user_id, r.content) for r in records if r.scope == "personal"}
    assert personal == {(bob.user_id, "Wants answers in English")}
    assert not [r for r in records if "example_unpaired" in r.content or "French" in r.content]
    # No summary of a shared idle slice anywhere.
    assert not [r for r in records if r.subject == "conversation summary"]
    assert reply is not None and "administrator" in reply


async def test_two_sweeps_that_saw_the_same_quiet_session_write_one_job(gw: Gateway, clock: Clock, db_url: str) -> None:
    from gateway.db import make_engine

    alice = await person(gw, "Alice", "admin")
    await say(gw, clock, alice, TEACH)
    clock.advance(seconds=121)
    other_engine = make_engine(db_url)  # a second gateway process on the same database
    try:
        other = IdleExtractor(other_engine, idle_seconds=120, clock=clock)
        mine, theirs = await gw.idle.quiet_sessions(), await other.quiet_sessions()
        assert mine == theirs and len(mine) == 1
        (sid, after, through) = mine[0]
        got = await asyncio.gather(
            gw.idle.extract_session(sid, after, through), other.extract_session(sid, after, through)
        )
        assert sorted(g is None for g in got) == [False, True]
    finally:
        await other_engine.dispose()
    assert len(await gw.sessions.jobs()) == 1


async def test_a_trim_between_the_read_and_the_write_wins(gw: Gateway, clock: Clock) -> None:
    alice = await person(gw, "Alice", "admin")
    for text in (TEACH, "answer me in English", "thanks"):
        await say(gw, clock, alice, text)
    clock.advance(seconds=121)
    ((sid, after, through),) = await gw.idle.quiet_sessions()
    trimmed = await gw.sessions.trim(
        sid, max_messages=4, keep_messages=1, turn_principal=alice, trust_of=gw.memory.trust_of
    )
    assert trimmed is not None
    assert await gw.idle.extract_session(sid, after, through) is None
    (job,) = await gw.sessions.jobs()
    assert job.payload["archive_id"] == trimmed.archive_id and job.payload["after_message_id"] == 0
    # The one message the trim kept is still to be extracted, by the next sweep.
    (rest,) = await gw.idle.sweep_once()
    assert rest.after_message_id > after and rest.through_message_id == through


async def test_the_background_sweep_learns_without_being_called(db_url: str, clock: Clock) -> None:
    cfg = Config.model_validate({"database": {"url": db_url}, "session": {"idle_extract_seconds": 1}})
    gateway = Gateway(cfg, provider=RecordingBuiltin(), clock=clock)
    await gateway.start(channels=False, worker=True)
    try:
        alice = await person(gateway, "Alice", "admin")
        await say(gateway, clock, alice, TEACH)
        clock.advance(seconds=2)
        for _ in range(300):  # up to 30 s for the background sweep and the worker
            if await gateway.memory.store.list_records(scope="agent_notes"):
                break
            await asyncio.sleep(0.1)
        (note,) = await gateway.memory.store.list_records(scope="agent_notes")
        assert "example_orders" in note.content
    finally:
        await gateway.stop()


def test_idle_extraction_is_configurable_and_can_be_switched_off() -> None:
    assert Config.model_validate({}).session.idle_extract_seconds == 120
    assert Config.model_validate({"session": {"idle_extract_seconds": 0}}).session.idle_extract_seconds == 0
    with pytest.raises(ValueError, match="idle_extract_seconds"):
        Config.model_validate({"session": {"idle_extract_seconds": -1}})


async def test_the_sweep_seeks_each_sessions_unextracted_messages_not_every_message(
    engine: AsyncEngine, clock: Clock
) -> None:
    """A sweep costs what the sessions have not had extracted, not every message ever stored.

    Trimmed messages stay in ``messages`` (append-only), so a sweep driven by the messages
    walked them all every few seconds: on SQLite the whole index, 48 ms at a million
    messages. 30 sessions here, each 200 trimmed messages and 3 live ones; ten have
    their live ones unextracted.
    """
    sessions, trimmed, live, pending = 30, 200, 3, 10
    old = clock.now - timedelta(hours=1)
    rows, marks = [], {}
    next_id = 0
    for s in range(sessions):
        for k in range(trimmed + live):
            next_id += 1
            rows.append(
                {
                    "id": next_id,
                    "session_id": f"s_{s}",
                    "platform_message_id": f"p{next_id}",
                    "speaker_user_id": "u_1",
                    "stored_role": "user",
                    "display_name": "Ann",
                    "text": "hello",
                    "said_at": old,
                    "is_agent": False,
                    "created_at": old,
                    "archive_id": f"a_{s}_{k // 50}" if k < trimmed else None,
                }
            )
        marks[f"s_{s}"] = next_id - live if s < pending else next_id
    async with engine.begin() as conn:
        await conn.execute(
            insert(Session.__table__),
            [
                {
                    "id": sid,
                    "channel": "api",
                    "conversation_id": sid,
                    "thread_id": "",
                    "previous_context": "",
                    "created_at": old,
                    "updated_at": old,
                    "extracted_through": mark,
                }
                for sid, mark in marks.items()
            ],
        )
        await conn.execute(insert(Message.__table__), rows)
        if engine.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE sessions, messages")  # what autovacuum does after a load
    sweep = IdleExtractor(engine, idle_seconds=120, clock=clock)
    found = await sweep.quiet_sessions()
    assert sorted(found) == sorted((f"s_{s}", marks[f"s_{s}"], marks[f"s_{s}"] + live) for s in range(pending))
    plan = await query_plan(engine, sweep.quiet_query())
    if engine.dialect.name == "sqlite":
        steps = [line for line in plan.splitlines() if " messages " in f"{line} "]
        assert steps and all(line.startswith("SEARCH messages USING") for line in steps), plan
    else:
        # Each session's live messages, a few times over (PostgreSQL runs each subquery for the select
        # and for the filter): a scan would read all 6,090.
        scans = pg_scans(plan, "messages")
        assert scans and pg_rows_visited(scans) <= 4 * sessions * live, plan


async def _dormant_sessions(engine: AsyncEngine, clock: Clock, n: int) -> dict[str, int]:
    """``n`` sessions of two messages each (ids 10s+1 and 10s+2), an hour old, all extracted: their marks."""
    old = clock.now - timedelta(hours=1)
    rows, marks = [], {}
    for s in range(n):
        for k in (1, 2):
            rows.append(
                {"id": 10 * s + k, "session_id": f"s_{s}", "platform_message_id": f"p{10 * s + k}",
                 "speaker_user_id": "u_1", "stored_role": "user", "display_name": "Ann", "text": "hello",
                 "said_at": old, "is_agent": k == 2, "created_at": old}
            )  # fmt: skip
        marks[f"s_{s}"] = 10 * s + 2
    async with engine.begin() as conn:
        await conn.execute(
            insert(Session.__table__),
            [
                {"id": sid, "channel": "api", "conversation_id": sid, "thread_id": "", "previous_context": "",
                 "created_at": old, "updated_at": old, "extracted_through": mark}
                for sid, mark in marks.items()
            ],
        )  # fmt: skip
        await conn.execute(insert(Message.__table__), rows)
        if engine.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE sessions, messages")  # what autovacuum does after a load
    return marks


async def _say(engine: AsyncEngine, clock: Clock, session_id: str, message_id: int, *, ago_s: float = 3600) -> None:
    """A person's message in ``session_id``, ``ago_s`` old (an hour: quiet long enough), with this id."""
    old = clock.now - timedelta(seconds=ago_s)
    async with engine.begin() as conn:
        await conn.execute(
            insert(Message.__table__).values(
                id=message_id, session_id=session_id, platform_message_id=f"p{message_id}", speaker_user_id="u_1",
                stored_role="user", display_name="Ann", text="from now on reports go out at nine", said_at=old,
                is_agent=False, created_at=old,
            )
        )  # fmt: skip


async def test_between_full_sweeps_a_sweep_looks_only_past_its_floor(engine: AsyncEngine, clock: Clock) -> None:
    """Sessions accumulate (every conversation; each nameless request of the OpenAI-compatible endpoint),
    and a sweep over all of them every 10 s cost 101 ms at 200,000. Between full sweeps a sweep looks at
    the sessions with live messages past its floor: here one of 2,000."""
    marks = await _dormant_sessions(engine, clock, 2000)
    sweep = IdleExtractor(engine, idle_seconds=120, clock=clock)
    assert await sweep.quiet_sessions() == []  # the first sweep looks at every session: nothing waits
    await _say(engine, clock, "s_7", 20_001)  # a session quiet for long says something new
    with captured_reads(engine, "messages") as reads:
        found = await sweep.quiet_sessions()
    assert found == [("s_7", marks["s_7"], 20_001)]
    assert reads
    for statement, params in reads:
        plan = await explain_captured(engine, statement, params, analyze=True)
        if engine.dialect.name == "sqlite":
            # Sessions by primary key, messages past the floor by rowid or by session: no scan of either.
            assert not any(line.startswith("SCAN ") and " CONSTANT ROW" not in line for line in plan.splitlines()), plan
        else:
            for table in ("sessions", "messages"):
                scans = pg_scans(plan, table)
                assert not any(n["Node Type"] == "Seq Scan" for n in scans), plan
                assert pg_rows_visited(scans) <= 10, plan


async def test_a_message_that_commits_below_the_floor_is_found_by_the_next_full_sweep(
    engine: AsyncEngine, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a message may commit after another that took a later id: below the floor, it waits for
    the next sweep over every session (``FULL_SWEEP_S``), never for ever."""
    marks = await _dormant_sessions(engine, clock, 10)
    now = [1000.0]
    monkeypatch.setattr(idle_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    sweep = IdleExtractor(engine, idle_seconds=120, clock=clock)
    assert await sweep.quiet_sessions() == []  # a full sweep: its floor is the newest message, 92
    await _say(engine, clock, "s_3", 35)  # its id taken before 92's, its commit after the sweep
    assert await sweep.quiet_sessions() == []  # past the floor only: not seen yet
    now[0] += idle_module.FULL_SWEEP_S
    assert await sweep.quiet_sessions() == [("s_3", marks["s_3"], 35)]


async def test_a_session_still_waiting_is_looked_at_until_it_is_quiet(engine: AsyncEngine, clock: Clock) -> None:
    marks = await _dormant_sessions(engine, clock, 10)
    sweep = IdleExtractor(engine, idle_seconds=120, clock=clock)
    await _say(engine, clock, "s_4", 95, ago_s=0)  # just said: waiting, not yet quiet
    assert await sweep.quiet_sessions() == []  # a full sweep
    assert await sweep.quiet_sessions() == []  # nothing new since, and s_4 not quiet yet
    clock.advance(seconds=121)
    assert await sweep.quiet_sessions() == [("s_4", marks["s_4"], 95)]  # below the floor, still looked at
