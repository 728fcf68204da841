"""The trim runs after the reply, in the session's lock (issue 14, target 3): ordering and crash safety kept."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.config import Config, SessionConfig
from gateway.llm.base import ChatMessage
from gateway.sessions import SessionKey, SessionStore, TrimResult
from gateway.turn import TurnHandler, TurnRequest
from pairing.principal import Principal, Role
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider

ALICE = Principal.human("u_alice", Role.USER, "Alice")
KEY = SessionKey("api", "room-1")


class GatedTrimStore(SessionStore):
    """The real store; its trim waits for ``release`` first and notes when it ran (our own seam)."""

    def __init__(self, engine: AsyncEngine, clock: Clock, events: list[str]) -> None:
        super().__init__(engine, clock=clock)
        self.events = events
        self.release = asyncio.Event()
        self.crash_next = False

    async def trim(self, session_id: str, **kwargs: Any) -> TrimResult | None:
        self.events.append("trim waits")
        await self.release.wait()
        if self.crash_next:
            self.crash_next = False
            raise RuntimeError("simulated crash before the trim's transaction")
        result = await super().trim(session_id, **kwargs)
        self.events.append("trim done" if result else "trim found nothing")
        return result


def _setup(engine: AsyncEngine, clock: Clock) -> tuple[TurnHandler, GatedTrimStore, list[str]]:
    events: list[str] = []

    def answer(messages: Sequence[ChatMessage]) -> str:
        # What the model saw: the live history it was given (trimmed or not).
        events.append(f"model sees {sum(m.role != 'system' for m in messages)} messages")
        return "ok"

    store = GatedTrimStore(engine, clock, events)
    cfg = Config(session=SessionConfig(max_messages=6, keep_messages=2))
    return TurnHandler(config=cfg, sessions=store, provider=ScriptedProvider(answer), clock=clock), store, events


def _req(i: int, clock: Clock) -> TurnRequest:
    clock.advance(minutes=1)
    return TurnRequest(key=KEY, principal=ALICE, text=f"line {i}", message_id=f"m{i}", said_at=clock.now)


async def _until(check: Callable[[], bool], what: str) -> None:
    for _ in range(600):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_reply_is_returned_before_the_trim_and_the_next_message_waits_for_it(
    engine: AsyncEngine, clock: Clock
) -> None:
    turns, store, events = _setup(engine, clock)
    for i in range(3):
        assert (await turns.handle(_req(i, clock))).reply == "ok"
    assert "trim waits" not in events  # 6 messages: no trim yet
    # The 4th turn passes max_messages: its reply comes back while the trim is held.
    fourth = await asyncio.wait_for(turns.handle(_req(3, clock)), timeout=30)
    assert fourth.reply == "ok" and fourth.trimmed is None
    await _until(lambda: "trim waits" in events, "the trim to start")
    assert [m.text for m in await store.history(fourth.session_id)][-1] == "ok"  # the reply is stored
    # The session's next message is stored and answered only after the trim.
    fifth = asyncio.create_task(turns.handle(_req(4, clock)))
    await asyncio.sleep(0)
    assert not fifth.done()
    store.release.set()
    assert (await asyncio.wait_for(fifth, timeout=30)).reply == "ok"
    await turns.settled()
    assert events[-3:] == ["trim waits", "trim done", "model sees 3 messages"]
    assert fourth.trimmed is not None and fourth.trimmed.message_count == 6
    assert len(await store.list_archives(session_id=fourth.session_id)) == 1
    assert [j.kind for j in await store.jobs()] == ["extract"]


async def test_a_trim_lost_after_the_reply_is_done_by_the_next_turn(engine: AsyncEngine, clock: Clock) -> None:
    turns, store, events = _setup(engine, clock)
    store.release.set()
    store.crash_next = True
    for i in range(4):
        await turns.handle(_req(i, clock))
    await turns.settled()
    sid = (await turns.handle(_req(99, clock))).session_id  # redone here: nothing was lost
    await turns.settled()
    # The failed trim left the history whole; the next turn's trim cut it in one transaction.
    assert events.count("trim waits") == 2 and events.count("trim done") == 1
    (archive,) = await store.list_archives(session_id=sid)
    assert archive.message_count == 8
    assert [m.text for m in await store.history(sid)] == ["line 99", "ok"]
