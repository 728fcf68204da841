"""One session's messages in order across processes: the answer lease (gateway/ordering.py).

Two TurnHandlers on one database stand for two processes: each has its own
per-session asyncio.Lock, so only the lease in the database orders them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.config import Config, SessionConfig
from gateway.llm.base import ChatMessage
from gateway.models import Message
from gateway.ordering import in_answer_order
from gateway.sessions import SessionKey, SessionStore
from gateway.turn import TurnHandler, TurnRequest
from pairing.principal import Principal, Role
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider

ALICE = Principal.human("u_alice", Role.USER, "Alice")
KEY = SessionKey("api", "u_alice/room")


def handler(engine: AsyncEngine, provider: ScriptedProvider, clock: Clock) -> TurnHandler:
    cfg = Config(session=SessionConfig(max_messages=40, keep_messages=10, answer_lease_seconds=30))
    return TurnHandler(config=cfg, sessions=SessionStore(engine, clock=clock), provider=provider, clock=clock)


def req(text: str, clock: Clock) -> TurnRequest:
    return TurnRequest(key=KEY, principal=ALICE, text=text, message_id=text, said_at=clock.now, display_name="Alice")


async def rows(engine: AsyncEngine) -> list[object]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(Message.__table__).order_by(Message.id))).all())


async def until(condition: object, limit: float = 60) -> None:
    async with asyncio.timeout(limit):
        while not await condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_a_later_message_at_another_process_waits_and_sees_the_earlier_reply(
    engine: AsyncEngine, clock: Clock
) -> None:
    release = asyncio.Event()
    events: list[str] = []

    async def held(messages: Sequence[ChatMessage]) -> str:
        events.append("a-start")
        await release.wait()
        events.append("a-end")
        return "reply to m1"

    async def prompt(messages: Sequence[ChatMessage]) -> str:
        events.append("b-start")
        return "reply to m2"

    b_model = ScriptedProvider(prompt)
    a, b = handler(engine, ScriptedProvider(held), clock), handler(engine, b_model, clock)
    first = asyncio.create_task(a.handle(req("m1", clock)))
    await until(lambda: _stored(engine, "m1"))
    second = asyncio.create_task(b.handle(req("m2", clock)))
    await until(lambda: _stored(engine, "m2"))
    release.set()
    r1, r2 = await asyncio.gather(first, second)
    assert (r1.reply, r2.reply) == ("reply to m1", "reply to m2")
    assert events == ["a-start", "a-end", "b-start"]
    history = [m.content for m in b_model.calls[0][1:]]
    assert history == ["[Alice · u_alice] m1", "reply to m1", "[Alice · u_alice] m2"]


async def _stored(engine: AsyncEngine, platform_id: str) -> bool:
    return any(getattr(r, "platform_message_id", None) == platform_id for r in await rows(engine))


async def test_an_expired_lease_no_longer_holds_the_session(engine: AsyncEngine, clock: Clock) -> None:
    sessions = SessionStore(engine, clock=clock)
    # A process stored m1 to answer it, and died.
    await sessions.begin_turn(
        KEY,
        platform_message_id="m1",
        speaker=ALICE,
        display_name="Alice",
        text="m1",
        said_at=clock.now,
        history_limit=10,
    )
    clock.advance(seconds=31)
    model = ScriptedProvider(lambda _m: "reply to m2")
    result = await handler(engine, model, clock).handle(req("m2", clock))
    assert result.reply == "reply to m2"
    assert [m.content for m in model.calls[0][1:]] == ["[Alice · u_alice] m1", "[Alice · u_alice] m2"]


async def test_a_failed_turn_lets_the_next_message_go_at_once(engine: AsyncEngine, clock: Clock) -> None:
    result = await handler(engine, ScriptedProvider(fail=True), clock).handle(req("m1", clock))
    assert result.failed
    m1 = next(r for r in await rows(engine) if r.platform_message_id == "m1")  # type: ignore[attr-defined]
    assert m1.answering_until is None
    # Another process answers the next message without waiting for the lease to run out (the clock stands still).
    second = await handler(engine, ScriptedProvider(lambda _m: "ok"), clock).handle(req("m2", clock))
    assert second.reply == "ok"


async def test_an_answered_message_holds_nothing(engine: AsyncEngine, clock: Clock) -> None:
    turns = handler(engine, ScriptedProvider(lambda _m: "ok"), clock)
    await turns.handle(req("m1", clock))
    start = await SessionStore(engine, clock=clock).begin_turn(
        KEY,
        platform_message_id="m2",
        speaker=ALICE,
        display_name="Alice",
        text="m2",
        said_at=clock.now,
        history_limit=10,
    )
    assert start.waiting_on == ()


def test_a_reply_comes_right_after_the_message_it_answers() -> None:
    class R:
        def __init__(self, id: int, is_agent: bool = False, reply_to_id: int | None = None) -> None:
            self.id, self.is_agent, self.reply_to_id = id, is_agent, reply_to_id

    # m1 (1) was answered (4) after m2 (2) and m3 (3) were stored; m2's reply is 5.
    got = [r.id for r in in_answer_order([R(5, True, 2), R(4, True, 1), R(3), R(2), R(1)])]
    assert got == [1, 4, 2, 5, 3]


async def test_the_lease_is_renewed_while_a_long_turn_runs(engine: AsyncEngine, clock: Clock) -> None:
    release = asyncio.Event()

    async def held(_m: Sequence[ChatMessage]) -> str:
        await release.wait()
        return "late"

    cfg = Config(session=SessionConfig(max_messages=40, keep_messages=10, answer_lease_seconds=2))
    turns = TurnHandler(
        config=cfg, sessions=SessionStore(engine, clock=clock), provider=ScriptedProvider(held), clock=clock
    )
    task = asyncio.create_task(turns.handle(req("m1", clock)))
    await until(lambda: _stored(engine, "m1"))
    first = next(r for r in await rows(engine) if r.platform_message_id == "m1")  # type: ignore[attr-defined]
    clock.advance(seconds=10)

    async def renewed() -> bool:
        now = next(r for r in await rows(engine) if r.platform_message_id == "m1")  # type: ignore[attr-defined]
        return bool(now.answering_until and now.answering_until > first.answering_until + timedelta(seconds=5))

    await until(renewed)
    release.set()
    assert (await task).reply == "late"


async def test_a_trim_cuts_a_reply_with_its_message_and_marks_nothing_kept_as_extracted(
    engine: AsyncEngine, clock: Clock
) -> None:
    sessions = SessionStore(engine, clock=clock)

    async def said(text: str) -> int:
        start = await sessions.begin_turn(
            KEY, platform_message_id=text, speaker=ALICE, display_name="Alice", text=text, said_at=clock.now,
            history_limit=50,
        )  # fmt: skip
        assert start.stored is not None
        return start.stored.id

    async def answer(row_id: int, text: str) -> None:
        sid = await sessions.session_id(KEY)
        await sessions.store_message(
            sid, platform_message_id=f"{text}:reply", speaker=None, display_name="goclaw", text=f"re {text}",
            said_at=clock.now, is_agent=True, reply_to=row_id,
        )  # fmt: skip

    # Two processes: m2 was stored while m1 was being answered, so m1's reply has a later id than m2.
    m1 = await said("m1")
    m2 = await said("m2")
    await answer(m1, "m1")
    await answer(m2, "m2")
    for i in range(3, 6):
        await answer(await said(f"m{i}"), f"m{i}")
    sid = await sessions.session_id(KEY)
    trimmed = await sessions.trim(
        sid, max_messages=8, keep_messages=8, turn_principal=ALICE, trust_of=lambda _m: "none"
    )
    assert trimmed is not None
    cut = await sessions.archive_messages(trimmed.archive_id)
    assert [m.text for m in cut] == ["m1", "re m1"]
    assert [m.text for m in await sessions.history(sid)][:2] == ["m2", "re m2"]
    session = await sessions.get_session(sid)
    assert session is not None
    assert session.extracted_through == m1  # m2 (kept) is not counted as extracted
