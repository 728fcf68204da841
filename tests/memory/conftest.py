"""Memory test helpers: principals, slice messages, stores on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.hotstore import hot_store
from memory.store import MemoryStore
from memory.types import SliceMessage
from memory.writer import MemoryWriter
from pairing.principal import Principal, Role
from tests.conftest import Clock

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)

ALICE = Principal.human("u_alice", Role.ADMIN, "Alice")
BOB = Principal.human("u_bob", Role.USER, "Bob")
CAROL = Principal.human("u_carol", Role.ADMIN, "Carol")
UNPAIRED = Principal.unpaired("Stranger")
CRON = Principal.system("cron-system")
SOP = Principal.system("sop-system")
WEBHOOK = Principal.system("webhook-system")


def msg(
    mid: str,
    user_id: str | None,
    role: str | None,
    text: str,
    *,
    minute: int = 0,
    agent: bool = False,
    name: str = "",
) -> SliceMessage:
    """A stored message of a slice, ``minute`` minutes after T0."""
    return SliceMessage(
        message_id=mid,
        user_id=user_id,
        stored_role=role,
        display_name=name or (user_id or "someone"),
        text=text,
        said_at=T0 + timedelta(minutes=minute),
        is_agent=agent,
    )


def agent(mid: str, text: str, *, minute: int = 0) -> SliceMessage:
    """An agent reply in a slice."""
    return msg(mid, None, None, text, minute=minute, agent=True, name="goclaw")


@pytest.fixture
def store(engine: AsyncEngine, clock: Clock) -> MemoryStore:
    # As the gateway builds it (gateway/memory_glue.py): on SQLite the turn's read and the write
    # path's statements run on the driver itself; tests/memory/test_write_driver.py holds that path
    # to SQLAlchemy's, statement by statement.
    return MemoryStore(engine, clock=clock, raw=hot_store(engine))


@pytest.fixture
def writer(store: MemoryStore) -> MemoryWriter:
    return MemoryWriter(store)
