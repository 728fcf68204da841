"""On PostgreSQL a turn reads memory beside storing its message, and never uses a read made for other words.

Memory is chosen by the session's last six texts. The turn handler starts that read
with the texts it saw when it answered the session's last message, on a second
connection, while ``begin_turn`` stores the new one; it keeps the read only when the
history read back ends in those same texts and the speaker is the same. These tests
make the guess wrong every way a user could (another process adds a message, the
speaker's role changes, the read fails) and check the prompt shows memory read for
what was really said, by whom it was really said.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.config import Config, SessionConfig
from gateway.llm.base import Tool
from gateway.sessions import SessionKey, SessionStore
from gateway.turn import MemoryContext, RunContext, TurnHandler, TurnRequest
from memory.types import SliceMessage
from pairing.principal import Principal, Role
from pairing.store import PairingStore
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider

KEY = SessionKey("api", "room-early")
NOTE = "Deploys go out on Fridays."
BOB = Principal.human("u_bob", Role.USER, "Bob")


EVENTS: list[str] = []


class TracedSessions(SessionStore):
    """The session store, noting when each ``begin_turn`` starts and ends (``EVENTS``)."""

    async def begin_turn(self, *args: Any, **kwargs: Any) -> Any:
        EVENTS.append("store")
        try:
            return await super().begin_turn(*args, **kwargs)
        finally:
            EVENTS.append("stored")


class WordMemory:
    """Memory that shows ``NOTE`` when "deploy" was said, and whose role it read for; records each read."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.reads: list[tuple[str, list[str]]] = []  # (the speaker's role, the texts) of each read
        self.fail_next = False

    async def context(
        self, principal: Principal, conversation_text: str | Sequence[str], *, run: RunContext | None = None
    ) -> MemoryContext:
        texts, role = list(conversation_text), str(principal.stored_role)
        EVENTS.append("read")
        self.reads.append((role, texts))
        await asyncio.sleep(0)
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("the memory read failed")
        said = " ".join(texts)
        return MemoryContext(operational=(NOTE if "deploy" in said else "") + f" (read for {role})")

    def tools(self, principal: Principal, **_: object) -> list[Tool]:
        return []

    async def directive(self, principal: Principal, text: str, **_: object) -> str | None:
        return None

    def trust_of(self, messages: Sequence[SliceMessage]) -> str:
        return "none"


ON_POSTGRES = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # conftest's migrated ``engine``
ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def gateway(engine: AsyncEngine, clock: Clock) -> tuple[WordMemory, ScriptedProvider, TurnHandler]:
    """A turn handler on ``engine`` (one gateway process) with its memory and model, both recording."""
    memory, provider = WordMemory(engine), ScriptedProvider()
    cfg = Config(session=SessionConfig(max_messages=40, keep_messages=10))
    sessions = TracedSessions(engine, clock=clock)
    return memory, provider, TurnHandler(config=cfg, sessions=sessions, provider=provider, memory=memory, clock=clock)


def ask(text: str, mid: str, who: Principal, clock: Clock, *, reply: bool = True) -> TurnRequest:
    when: datetime = clock.now
    return TurnRequest(key=KEY, principal=who, text=text, message_id=mid, said_at=when, display_name="Bob", reply=reply)


def system_prompt(provider: ScriptedProvider) -> str:
    return provider.calls[-1][0].content


@ON_POSTGRES
async def test_the_early_read_is_used_when_the_history_is_what_this_process_last_saw(
    engine: AsyncEngine, clock: Clock
) -> None:
    memory, provider, turns = gateway(engine, clock)
    EVENTS.clear()
    await turns.handle(ask("hello", "m1", BOB, clock))
    assert EVENTS == ["store", "stored", "read"]  # the session's first turn here: nothing to start from
    EVENTS.clear()
    await turns.handle(ask("when do we deploy?", "m2", BOB, clock))
    # One read for the second turn, made while its message was being stored, for exactly the history read back.
    assert EVENTS == ["store", "read", "stored"]
    assert len(memory.reads) == 2
    assert memory.reads[1][1] == ["hello", "echo: [Bob · u_bob] hello", "when do we deploy?"]
    assert NOTE in system_prompt(provider)


@ON_POSTGRES
async def test_a_message_another_process_stored_meanwhile_is_read_for(engine: AsyncEngine, clock: Clock) -> None:
    # Another gateway process (its own SessionStore and handler on the same database) stores
    # a message in the session between two turns of this one: the early read, made from the
    # texts this process last saw, lacks it and must not be used.
    memory, provider, turns = gateway(engine, clock)
    _memory, _provider, elsewhere = gateway(engine, clock)
    await turns.handle(ask("hello", "m1", BOB, clock))
    await turns.handle(ask("what is new?", "m2", BOB, clock))
    await elsewhere.handle(ask("the deploy moved", "m3", BOB, clock, reply=False))
    before = len(memory.reads)
    await turns.handle(ask("so when?", "m4", BOB, clock))
    assert NOTE in system_prompt(provider)  # read for what was said, the other process's message too
    early, again = memory.reads[before:]
    assert "the deploy moved" not in early[1] and again[1][-2:] == ["the deploy moved", "so when?"]
    # The next turn starts from what this one saw, and its early read is used.
    await turns.handle(ask("thanks", "m5", BOB, clock))
    assert len(memory.reads) == before + 3
    assert NOTE in system_prompt(provider)


@ON_POSTGRES
async def test_a_role_changed_since_the_request_was_read_is_read_for_as_it_is_now(
    engine: AsyncEngine, clock: Clock
) -> None:
    # The early read runs as the caller read the speaker; begin_turn reads the role again. An
    # admin demoted meanwhile gets memory read for a user, never what the admin read found.
    pairing = PairingStore(engine)
    bob = await pairing.principal_for_user((await pairing.add_user("Bob", "admin")).id)
    memory, provider, turns = gateway(engine, clock)
    await turns.handle(ask("hello", "m1", bob, clock))
    assert bob.user_id is not None
    await pairing.set_role(bob.user_id, "user", by="test")
    before = len(memory.reads)
    await turns.handle(ask("hello again", "m2", bob, clock))  # bob as read before the change
    assert [role for role, _texts in memory.reads[before:]] == ["admin", "user"]
    system = system_prompt(provider)
    assert "(read for user)" in system and "(read for admin)" not in system
    assert "Paired role: regular user" in system


@ON_POSTGRES
async def test_an_early_read_that_fails_is_made_again_and_the_turn_answers(engine: AsyncEngine, clock: Clock) -> None:
    memory, provider, turns = gateway(engine, clock)
    await turns.handle(ask("hello", "m1", BOB, clock))
    memory.fail_next = True
    result = await turns.handle(ask("when do we deploy?", "m2", BOB, clock))
    assert result.reply and not result.failed
    assert len(memory.reads) == 3 and memory.reads[1][1] == memory.reads[2][1]
    assert NOTE in system_prompt(provider)


@ON_SQLITE
async def test_on_sqlite_memory_is_read_once_after_the_message_is_stored(engine: AsyncEngine, clock: Clock) -> None:
    # SQLite's statements run inline on the loop: nothing could overlap, so no early read is made.
    memory, provider, turns = gateway(engine, clock)
    EVENTS.clear()
    for i, text in enumerate(["hello", "when do we deploy?", "thanks"]):
        await turns.handle(ask(text, f"m{i}", BOB, clock))
    assert EVENTS == ["store", "stored", "read"] * 3
    assert [texts[-1] for _role, texts in memory.reads] == ["hello", "when do we deploy?", "thanks"]
    assert NOTE in system_prompt(provider)
