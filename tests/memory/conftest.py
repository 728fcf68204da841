"""Memory test helpers: principals, slice messages, stores on both backends."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.hotstore import hot_store
from memory.facts_models import IdentityDecision, IdentityProposal
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


async def bulk_proposals(engine: AsyncEngine, n: int, *, before: datetime, decided: bool) -> list[str]:
    """``n`` identity proposals a minute apart, all older than ``before``, inserted in one go, oldest first.

    ``decided``: each rejected by u_alice (a decision row: the tables are insert-only).
    """
    tag = secrets.token_hex(3)
    ids = [f"ip_{tag}{i:05d}" for i in range(n)]
    proposals = [
        {"id": pid, "scope": "global", "subject": f"rule {i}", "content": f"Rule {i}", "rationale": "r",
         "proposer": "u_bob", "proposer_role": "user", "created_at": before - timedelta(minutes=n - i)}
        for i, pid in enumerate(ids)
    ]  # fmt: skip
    decisions = [
        {"id": f"id_{tag}{i:05d}", "proposal_id": pid, "record_id": None, "decision": "rejected",
         "by_user_id": "u_alice", "at": before, "rationale": "no"}
        for i, pid in enumerate(ids)
    ]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(IdentityProposal.__table__), proposals)
        if decided:
            await conn.execute(insert(IdentityDecision.__table__), decisions)
        if engine.dialect.name == "postgresql":
            await conn.exec_driver_sql("ANALYZE identity_proposals, identity_decisions")  # as autovacuum would
    return ids
