"""The builtin model says what will be learned, when, and what it used once it was learned."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.app import Gateway
from gateway.config import Config
from gateway.llm.builtin import BuiltinProvider
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from pairing import Principal
from tests.conftest import Clock

PAUSE = "when the conversation pauses"


async def _gateway(sqlite_url: str, clock: Clock, idle: float) -> Gateway:
    cfg = Config.model_validate({"database": {"url": sqlite_url}, "session": {"idle_extract_seconds": idle}})
    gw = Gateway(cfg, provider=BuiltinProvider(), clock=clock)
    await gw.start(channels=False, worker=False)
    return gw


@pytest.fixture
async def gw(sqlite_url: str, clock: Clock) -> AsyncIterator[Gateway]:
    gateway = await _gateway(sqlite_url, clock, 120)
    try:
        yield gateway
    finally:
        await gateway.stop()


_n = iter(range(10_000))


async def say(gw: Gateway, clock: Clock, who: Principal, text: str, room: str = "r1") -> str:
    clock.advance(seconds=5)
    res = await gw.turns.handle(TurnRequest(SessionKey("api", room), who, text, f"m{next(_n)}", clock.now, "x"))
    assert res.reply is not None
    return res.reply


async def person(gw: Gateway, role: str) -> Principal:
    return await gw.pairing.principal_for_user((await gw.pairing.add_user(role.title(), role)).id)


async def test_an_admins_procedure_is_learned_when_the_conversation_pauses_and_then_used(
    gw: Gateway, clock: Clock
) -> None:
    alice = await person(gw, "admin")
    reply = await say(gw, clock, alice, "from now on the daily report uses table example_orders")
    assert f"this will be learned as an operational note {PAUSE}" in reply
    clock.advance(seconds=121)
    await gw.idle.sweep_once()
    await gw.worker.drain()
    (note,) = await gw.memory.store.list_records(scope="agent_notes")
    reply = await say(gw, clock, alice, "produce the daily report")
    assert "Using what I have been taught:" in reply and note.id in reply and "example_orders" in reply


async def test_a_regular_users_procedure_is_declined_not_promised(gw: Gateway, clock: Clock) -> None:
    bob = await person(gw, "user")
    reply = await say(gw, clock, bob, "the daily report uses table example_archive")
    assert "Operational changes require an administrator" in reply and "will not learn this" in reply
    assert PAUSE not in reply


async def test_a_preference_is_remembered_when_the_conversation_pauses(gw: Gateway, clock: Clock) -> None:
    bob = await person(gw, "user")
    reply = await say(gw, clock, bob, "answer me in English, and keep it short")
    assert f"I'll remember this about you {PAUSE}." in reply
    stranger = Principal.unpaired("Stranger")
    reply = await say(gw, clock, stranger, "answer me in French", room="r2")
    assert "can't remember this" in reply and PAUSE not in reply


async def test_without_idle_extraction_the_reply_says_learning_waits_for_the_archive(
    sqlite_url: str, clock: Clock
) -> None:
    gw = await _gateway(sqlite_url, clock, 0)
    try:
        alice = await person(gw, "admin")
        reply = await say(gw, clock, alice, "from now on the daily report uses table example_orders")
        assert "when older messages are archived" in reply and PAUSE not in reply
        assert await gw.idle.sweep_once() == []
    finally:
        await gw.stop()


async def test_notes_directive_still_saves_at_once(gw: Gateway, clock: Clock) -> None:
    alice = await person(gw, "admin")
    reply = await say(gw, clock, alice, "@notes: the weekly report uses table weekly_sales")
    assert reply.startswith("Noted.")
    (note,) = await gw.memory.store.list_records(scope="agent_notes")
    assert note.subject == "weekly report data source"


def test_the_prompt_tells_any_model_when_it_learns() -> None:
    from gateway.prompt import build_system_prompt, learning_line

    line = learning_line(120, 40)
    assert "learned when the conversation pauses (after 120 s of quiet)" in line and "@notes: save at once" in line
    assert "when older messages are archived (past 40 messages)" in learning_line(0, 40)
    prompt = build_system_prompt(
        persona="p",
        agent_name="a",
        principal=Principal.unpaired("x"),
        operational="",
        personal="",
        previous_context="",
        learning=line,
    )
    policy = prompt.split("## MEMORY ROUTING POLICY\n", 1)[1].split("\n\n## ", 1)[0]
    assert policy.endswith("- " + line)
