"""The concurrency limit bounds model calls in flight, never a whole turn (issue 14, target 2)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.app import Gateway
from gateway.config import Config, LLMConfig, load_config
from gateway.llm.base import ChatMessage, Completion, Tool
from gateway.llm.loop import _never_run
from gateway.models import Message
from gateway.sessions import SessionKey, SessionStore
from gateway.turn import TurnHandler, TurnRequest
from pairing.principal import Principal, Role
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider

ALICE = Principal.human("u_alice", Role.USER, "Alice")


class GatedModel:
    """Answers once ``release`` is set; counts the calls inside it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.inside = 0
        self.peak = 0

    async def __call__(self, messages: Sequence[ChatMessage]) -> str:
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        try:
            await self.release.wait()
        finally:
            self.inside -= 1
        return "done"


def _turns(engine: AsyncEngine, model: GatedModel, clock: Clock, limit: int) -> TurnHandler:
    cfg = Config(llm=LLMConfig(max_concurrent_calls=limit))
    return TurnHandler(
        config=cfg, sessions=SessionStore(engine, clock=clock), provider=ScriptedProvider(model), clock=clock
    )


def _req(room: str, clock: Clock, *, reply: bool = True, mid: str = "") -> TurnRequest:
    return TurnRequest(
        key=SessionKey("api", room),
        principal=ALICE,
        text=f"hello from {room}",
        message_id=mid or f"m-{room}",
        said_at=clock.now,
        reply=reply,
    )


async def _stored(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(Message))).scalar_one())


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(600):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_model_calls_in_flight_never_exceed_the_limit_while_every_session_moves_on(
    engine: AsyncEngine, clock: Clock
) -> None:
    model = GatedModel()
    turns = _turns(engine, model, clock, limit=2)
    tasks = [asyncio.create_task(turns.handle(_req(f"room-{i}", clock))) for i in range(6)]
    # Every session stores its message although only two may talk to the model: the
    # old per-turn semaphore stopped the other four before they were even stored.
    await _until(lambda: _async(model.inside == 2), "two model calls in flight")
    await _until(lambda: _count_is(engine, 6), "all six messages stored")
    assert model.inside == 2
    model.release.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    assert [r.reply for r in results] == ["done"] * 6
    assert model.peak == 2
    assert turns.model_calls.peak == 2


async def test_a_session_waiting_for_the_model_holds_no_database_connection(engine: AsyncEngine, clock: Clock) -> None:
    # On SQLite the engine has one connection; were it held across the model call,
    # the store-only message and the read below would wait for the model.
    model = GatedModel()
    turns = _turns(engine, model, clock, limit=1)
    waiting = asyncio.create_task(turns.handle(_req("slow", clock)))
    await _until(lambda: _async(model.inside == 1), "the model call in flight")
    stored_only = await asyncio.wait_for(turns.handle(_req("other", clock, reply=False)), timeout=30)
    assert stored_only.reply is None and not stored_only.duplicate
    history = await asyncio.wait_for(turns.sessions.history(stored_only.session_id), timeout=30)
    assert [m.text for m in history] == ["hello from other"]
    assert not waiting.done()
    model.release.set()
    assert (await asyncio.wait_for(waiting, timeout=30)).reply == "done"


class OfferRecorder(ScriptedProvider):
    """A scripted model that also records the names of the tools each call was offered."""

    def __init__(self, answer: GatedModel) -> None:
        super().__init__(answer)
        self.offered: list[list[Tool]] = []

    async def complete(self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), **kw: Any) -> Completion:
        self.offered.append(list(tools))
        return await super().complete(messages, tools=tools, **kw)


async def test_turns_waiting_on_the_model_hold_none_of_their_tools(sqlite_url: str, clock: Clock) -> None:
    # Each turn's tools close over its message and run (gateway/memory_glue.py, gateway/facts_glue.py): ten
    # Tools with their closures, about 55 objects the collector counts. Held while the model answered, 200 turns
    # waiting on a model held some 11,000 toward the next young collection, which stops the loop for its whole
    # walk (gateway/heap.py). The loop makes them when it needs them (gateway/llm/loop.py).
    model = GatedModel()
    provider = OfferRecorder(model)
    gw = Gateway(Config.model_validate({"database": {"url": sqlite_url}}), provider=provider, clock=clock)
    await gw.start(channels=False, worker=False)
    try:
        before = sum(1 for o in gc.get_objects() if type(o) is Tool)
        waiting = [asyncio.create_task(gw.turns.handle(_req(f"room-{i}", clock))) for i in range(20)]
        await _until(lambda: _async(model.inside == 20), "20 turns waiting on the model")
        held = sum(1 for o in gc.get_objects() if type(o) is Tool and o.handler is not _never_run)
        model.release.set()
        results = await asyncio.wait_for(asyncio.gather(*waiting), timeout=30)
    finally:
        await gw.stop()
    assert held - before <= 0, f"{held - before} tools held by 20 turns waiting on the model"
    assert [r.reply for r in results] == ["done"] * 20
    # The model is offered one kept copy of each tool, the same objects for every turn, and they run nothing.
    first = provider.offered[0]
    assert len(provider.offered) == 20 and all(
        len(offer) == len(first) and all(a is b for a, b in zip(offer, first, strict=True))
        for offer in provider.offered
    )
    assert all(t.handler is _never_run for t in first)
    # The tools are offered as before: a person's own, not an admin's.
    names = [t.name for t in first]
    assert "memory_write" in names and "memory_search" in names and "review_learned" not in names


def test_the_retired_session_limit_loads_with_a_warning_naming_its_replacement(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("session:\n  max_concurrent_sessions: 32\n")
    cfg = load_config(path, env={})
    (warning,) = cfg.warnings
    assert "session.max_concurrent_sessions is retired" in warning
    assert "llm.max_concurrent_calls" in warning
    assert cfg.llm.max_concurrent_calls == 256


async def _async(value: bool) -> bool:
    return value


async def _count_is(engine: AsyncEngine, n: int) -> bool:
    return await _stored(engine) == n


async def test_turns_waiting_on_the_model_hold_little_the_collector_counts(db_url: str, clock: Clock) -> None:
    # 200 turns waiting on a model (bench/model_load.py) must stay, with the history caches full, under the
    # 100,000 objects that start a young collection, which stops the loop for its whole walk (gateway/heap.py).
    # On PostgreSQL each waiting turn held its history's rows, read afresh and each one counted: 200 such
    # turns took the count to 91,000-94,000, and 240 ran a collection of 53 ms (2026-12-08).
    model = GatedModel()
    gw = Gateway(Config.model_validate({"database": {"url": db_url}}), provider=ScriptedProvider(model), clock=clock)
    await gw.start(channels=False, worker=False)
    rooms = [f"room-{i}" for i in range(20)]
    try:
        model.release.set()
        for n in range(15):  # histories of 30 messages, as a conversation's under way (max_messages 40)
            clock.advance(seconds=1)  # the rooms at once: the pools open what 20 turns in flight use
            await asyncio.gather(*(gw.turns.handle(_req(room, clock, mid=f"m-{room}-{n}")) for room in rooms))
        model.release.clear()
        await gw.turns.settled()
        gc.collect()
        gc.disable()
        try:
            before = gc.get_count()[0]
            waiting = [asyncio.create_task(gw.turns.handle(_req(room, clock, mid=f"w-{room}"))) for room in rooms]
            await _until(lambda: _async(model.inside == 20), "20 turns waiting on the model")
            held = (gc.get_count()[0] - before) / len(rooms)
        finally:
            gc.enable()
        model.release.set()
        results = await asyncio.wait_for(asyncio.gather(*waiting), timeout=30)
    finally:
        await gw.stop()
    assert [r.reply for r in results] == ["done"] * 20
    # About 70 a turn on both databases (its task and coroutines, its lease's timer, its request and start); with
    # its 31 history rows each counted, 100 on PostgreSQL.
    assert held < 85, f"{held:.1f} objects the collector counts held by each turn waiting on the model"
