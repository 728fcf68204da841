"""A whole gateway on a real database, with a cast of people, driven the way its surfaces drive it.

Shared threads go through ``gw.dispatcher.handle`` (Discord / Teams
``InboundMessage``, so the pairing store resolves who spoke); the API and the
dashboard go through the web app over HTTP or through ``gw.turns.handle``;
autonomous runs through ``gw.system_turn``. Trims happen in the real turn
handler; extraction runs in the real worker (``drain``).

``check_invariants`` states the policy's authority rules over everything stored,
and most tests end with it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from channels.base import ConversationKind, InboundMessage
from gateway.app import Gateway
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.llm.base import ToolCall
from gateway.llm.loop import run_tool
from gateway.models import Archive, Job, Message
from gateway.prompt import OPERATIONAL, PERSONAL, PREVIOUS, SPEAKER
from gateway.sessions import SessionKey, StoredMessage
from gateway.turn import TurnRequest, TurnResult
from memory.store import MemoryRecordView
from pairing.principal import SYSTEM_PRINCIPALS, Principal
from pairing.store import PairingStore
from tests.conftest import Clock
from tests.policy.hostile import OVERRIDE, HostileProvider, RecordingBuiltin, copied_subject

BOTH_BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
"""Run a test on PostgreSQL too (skipped when absent, a failure in CI): the representative subset."""

ALL_STATUSES = ("live", "superseded", "unverified", "rejected", "retracted", "expired")
GUILD, CHANNEL = "guild-1", "chan-1"
DASHBOARD_TOKEN = "dashboard-token-policy-0123456789"
AUTHORITY_SCOPES = ("agent_notes", "global", "agent_config")

# key -> (display name, pairing role or None for an unpaired sender)
CAST: dict[str, tuple[str, str | None]] = {
    "alice": ("Alice", "admin"),
    "dave": ("Dave", "admin"),
    "bob": ("Bob", "user"),
    "carol": ("Carol", "user"),
    "mallory": ("Mallory", None),  # unpaired, let in by allow_from
    "trent": ("Trent", None),  # unpaired, let in by allow_from
}


@dataclass
class Person:
    """Someone in the cast: their platform ids, and their unified id and token if paired."""

    key: str
    name: str
    role: str | None
    discord_id: str
    teams_id: str
    user_id: str | None = None
    token: str | None = None

    def platform_id(self, channel: str) -> str:
        """This person's id on ``channel``."""
        return self.discord_id if channel == "discord" else self.teams_id


def strip_section(prompt: str, heading: str) -> str:
    """One section of a system prompt (heading excluded), or '' when absent."""
    start = prompt.find(heading + "\n")
    if start < 0:
        return ""
    body = prompt[start + len(heading) + 1 :]
    end = body.find("\n\n## ")
    return body if end < 0 else body[:end]


@dataclass
class World:
    """One started gateway with the cast paired (see ``CAST``)."""

    gw: Gateway
    engine: AsyncEngine
    model: HostileProvider | RecordingBuiltin
    clock: Clock
    people: dict[str, Person]
    write_access_users: frozenset[str] = frozenset()
    last_message_id: str = ""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __getitem__(self, key: str) -> Person:
        return self.people[key]

    @property
    def hostile(self) -> HostileProvider | None:
        """The hostile model, when this world runs it."""
        return self.model if isinstance(self.model, HostileProvider) else None

    def next_id(self, prefix: str = "m") -> str:
        """A fresh platform message id (remembered as the latest one sent)."""
        self.last_message_id = f"{prefix}-{next(self._ids)}"
        return self.last_message_id

    async def principal(self, who: str) -> Principal:
        """The principal the pairing store gives ``who`` now."""
        user_id = self.people[who].user_id
        assert user_id is not None, f"{who} is not paired"
        return await self.gw.pairing.principal_for_user(user_id)

    # ---- surfaces -----------------------------------------------------------------------

    def thread_key(self, thread: str = "thread-1", channel: str = "discord") -> SessionKey:
        """The session key of a group thread on ``channel``."""
        return SessionKey(channel, CHANNEL, thread, GUILD)

    async def say(
        self,
        who: str,
        text: str,
        *,
        thread: str = "thread-1",
        channel: str = "discord",
        mention: bool = True,
        display_name: str | None = None,
    ) -> str | None:
        """``who`` posts ``text`` in a group thread (through the dispatcher); the reply, if any."""
        person = self.people[who]
        self.clock.advance(minutes=1)
        msg = InboundMessage(
            channel=channel,
            conversation_id=CHANNEL,
            thread_id=thread,
            sender_id=person.platform_id(channel),
            display_name=display_name or person.name,
            text=text,
            timestamp=self.clock.now,
            message_id=self.next_id(channel[:2]),
            is_direct=False,
            mentions_bot=mention,
            kind=ConversationKind.CHANNEL,
            conversation_ids=(CHANNEL, GUILD),
        )
        return await self.gw.dispatcher.handle(msg)

    async def dm(self, who: str, text: str, *, channel: str = "discord") -> str | None:
        """``who`` sends ``text`` by direct message (through the dispatcher)."""
        person = self.people[who]
        self.clock.advance(minutes=1)
        pid = person.platform_id(channel)
        msg = InboundMessage(
            channel=channel,
            conversation_id=f"dm-{pid}",
            thread_id=None,
            sender_id=pid,
            display_name=person.name,
            text=text,
            timestamp=self.clock.now,
            message_id=self.next_id("dm"),
            is_direct=True,
            mentions_bot=True,
            kind=ConversationKind.DIRECT,
        )
        return await self.gw.dispatcher.handle(msg)

    def dm_key(self, who: str, channel: str = "discord") -> SessionKey:
        """The session key of ``who``'s direct messages."""
        return SessionKey(channel, f"dm-{self.people[who].platform_id(channel)}")

    async def api(self, who: str, text: str, *, session: str = "s-1") -> TurnResult:
        """A turn as the API does it: the token's user (role read from pairing now), session ``user/session``."""
        person = self.people[who]
        assert person.user_id is not None
        principal = await self.gw.pairing.principal_for_user(person.user_id)
        self.clock.advance(minutes=1)
        return await self.gw.turns.handle(
            TurnRequest(
                key=self.api_key(who, session),
                principal=principal,
                text=text,
                message_id=self.next_id("api"),
                said_at=self.clock.now,
                display_name=principal.display_name,
            )
        )

    def api_key(self, who: str, session: str = "s-1") -> SessionKey:
        """The session key the API uses for ``who``'s session ``session``."""
        return SessionKey("api", f"{self.people[who].user_id}/{session}")

    async def run(self, system_name: str, text: str, *, key: SessionKey | None = None) -> TurnResult:
        """An autonomous run's turn: in its own session, or delegated into ``key`` (e.g. a shared thread)."""
        self.clock.advance(minutes=1)
        if key is None:
            return await self.gw.system_turn(system_name, text, session="job", message_id=self.next_id(system_name))
        return await self.gw.turns.handle(
            TurnRequest(
                key=key,
                principal=Principal.system(system_name),
                text=text,
                message_id=self.next_id(system_name),
                said_at=self.clock.now,
                display_name=system_name,
            )
        )

    @asynccontextmanager
    async def http(self) -> AsyncIterator[tuple[ClientSession, str]]:
        """The gateway's web app on 127.0.0.1, and a client for it."""
        server = TestServer(self.gw.web, host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as client:
                yield client, str(server.make_url("")).rstrip("/")
        finally:
            await server.close()

    # ---- explicit tool calls -------------------------------------------------------------

    async def call_tool(
        self, principal: Principal, name: str, args: dict[str, Any], *, key: SessionKey, message_id: str | None = None
    ) -> str:
        """Call one of the turn's tools exactly as the tool loop does when a model calls it."""
        sid = await self.gw.sessions.find_session(key)
        assert sid is not None, f"no session {key}"
        mid = message_id or self.last_message_id
        said_at = (await self.messages())[mid].said_at
        tools = self.gw.memory.tools(principal, session_id=sid, message_id=mid, said_at=said_at)
        tool = next((t for t in tools if t.name == name), None)
        return await run_tool(tool, ToolCall("explicit", name, args), principal)

    async def explicit_writes(
        self,
        principal: Principal,
        key: SessionKey,
        text: str,
        scopes: Sequence[str],
        send: Callable[[], Awaitable[Any]],
    ) -> list[str]:
        """Send a turn in which ``memory_write`` is called for each scope; return the tool results.

        The hostile model makes the calls itself, inside the turn. The builtin model
        never calls tools, so for it the test makes the same calls, with the tools the
        turn offers, right after the turn (as a tool-calling model would have).
        """
        if isinstance(self.model, HostileProvider):
            self.model.write_scopes = list(scopes)
            seen = len(self.model.tool_results)
            await send()
            results = [r for name, r in self.model.tool_results[seen:] if name == "memory_write"]
            return results[: len(scopes)]
        await send()
        args = {"subject": copied_subject(text), "content": f"{OVERRIDE}: {text}"}
        return [await self.call_tool(principal, "memory_write", {"scope": s, **args}, key=key) for s in scopes]

    # ---- trims and the worker -----------------------------------------------------------

    async def archives(self, key: SessionKey) -> list[Archive]:
        """The archives of a session, oldest first."""
        sid = await self.gw.sessions.find_session(key)
        return [] if sid is None else await self.gw.sessions.list_archives(session_id=sid)

    async def trim_with(self, key: SessionKey, send: Callable[[], Awaitable[Any]], *, limit: int = 40) -> Archive:
        """Call ``send`` until the session of ``key`` is trimmed; run the worker; return the new archive."""
        before = len(await self.archives(key))
        for _ in range(limit):
            await send()
            after = await self.archives(key)
            if len(after) > before:
                await self.drain()
                return after[-1]
        raise AssertionError(f"no trim of {key} after {limit} messages")

    async def trim_by(self, who: str, *, thread: str = "thread-1", channel: str = "discord") -> Archive:
        """``who`` says "thanks" in the thread until it is trimmed on their turn; then the worker runs."""
        return await self.trim_with(
            self.thread_key(thread, channel), lambda: self.say(who, "thanks", thread=thread, channel=channel)
        )

    async def drain(self) -> int:
        """Run every pending extraction job now; none may fail."""
        n = await self.gw.worker.drain()
        failed = [(j.id, j.last_error) for j in await self.gw.sessions.jobs() if j.status != "done"]
        assert not failed, f"extraction jobs not done: {failed}"
        return n

    async def trims(self) -> list[dict[str, Any]]:
        """The turn principal of every trim so far, in order (from the extraction jobs)."""
        return [j.payload["turn_principal"] for j in await self.gw.sessions.jobs() if j.kind == "extract"]

    # ---- what is stored -----------------------------------------------------------------

    async def records(self, scope: str | None = None, *, owner: str | None = None) -> list[MemoryRecordView]:
        """Every record (all statuses), newest said first."""
        return await self.gw.memory.store.list_records(
            scope=scope, owner_user_id=owner, statuses=ALL_STATUSES, limit=10_000
        )

    async def live(self, scope: str | None = None, *, owner: str | None = None) -> list[MemoryRecordView]:
        """Live records only."""
        return await self.gw.memory.store.list_records(scope=scope, owner_user_id=owner, limit=10_000)

    async def messages(self) -> dict[str, StoredMessage]:
        """Every stored message of every session, by platform message id."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(Message).order_by(Message.id))).all()
        out: dict[str, StoredMessage] = {}
        for r in rows:
            m = r.Message if hasattr(r, "Message") else r
            assert m.platform_message_id not in out, f"message id {m.platform_message_id} used in two sessions"
            out[m.platform_message_id] = StoredMessage(
                m.id,
                m.session_id,
                m.platform_message_id,
                m.speaker_user_id,
                m.stored_role,
                m.display_name,
                m.text,
                m.said_at,
                m.is_agent,
            )
        return out

    async def session_messages(self, key: SessionKey) -> list[StoredMessage]:
        """Every message of one session, trimmed or not."""
        sid = await self.gw.sessions.find_session(key)
        assert sid is not None, f"no session {key}"
        return await self.gw.sessions.all_messages(sid)

    async def archive_ids(self) -> set[str]:
        """The id of every archive."""
        async with self.engine.connect() as conn:
            return set((await conn.scalars(select(Archive.id))).all())

    async def jobs(self) -> list[Job]:
        """Every job."""
        return await self.gw.sessions.jobs()

    # ---- what the model saw -------------------------------------------------------------

    def last_prompt(self) -> str:
        """The system prompt of the latest chat turn."""
        assert self.model.system_prompts, "the model was never called for a chat turn"
        return self.model.system_prompts[-1]

    @staticmethod
    def section(prompt: str, which: str) -> str:
        """A section of a system prompt: ``speaker``, ``operational``, ``personal`` or ``previous``."""
        heading = {"speaker": SPEAKER, "operational": OPERATIONAL, "personal": PERSONAL, "previous": PREVIOUS}[which]
        return strip_section(prompt, heading)

    def stated_roles(self, prompt: str) -> list[str]:
        """Every role CURRENT SPEAKER states ("paired role: ..."), lower-cased: one, from pairing."""
        speaker = self.section(prompt, "speaker")
        return [m.strip().lower() for m in re.findall(r"paired role:\s*([A-Za-z ]+)", speaker, re.IGNORECASE)]

    # ---- the policy's invariants --------------------------------------------------------

    def admin_ids(self) -> set[str]:
        """Unified ids the pairing store gave the admin role at the start, and the dashboard's."""
        return {p.user_id for p in self.people.values() if p.role == "admin" and p.user_id} | {"admin"}

    async def check_invariants(self, *, strict_admin_evidence: bool = True) -> None:
        """Authority comes only from pairing; personal memory only to its own person; unpaired lines are nobody's.

        - every agent_notes / global / agent_config record was authored by a human admin
          (or, for ``memory_write`` to agent_notes only, an autonomous run or a person
          listed in ``memory.write_access``), and its evidence messages are that
          author's own, stored with the admin role (``strict_admin_evidence``);
        - every personal record belongs to its author, and every message it cites was
          said by its owner (a summary: every person's line of its archive);
        - no record cites a line stored without a user id.
        """
        messages = await self.messages()
        archives = await self.archive_ids()
        facts = self.gw.memory.facts
        assert facts is not None
        proposals = {p.id: p for p in await facts.identity.proposals(include_decided=True)}
        archive_lines: dict[str, list[StoredMessage]] = {}
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(Message.platform_message_id, Message.archive_id))).all()
        for pid, aid in rows:
            if aid:
                archive_lines.setdefault(aid, []).append(messages[pid])
        for rec in await self.records():
            cited = [messages[e] for e in rec.evidence if e in messages]
            unknown = [e for e in rec.evidence if e not in messages and e not in archives and e not in proposals]
            assert not unknown, f"{rec.id} cites unknown evidence {unknown}"
            by = f"{rec.author_user_id}/{rec.author_role}"
            where = f"{rec.scope} record {rec.id} ({rec.source}, by {by}): {rec.content!r}"
            for m in cited:
                assert m.is_agent or m.speaker_user_id or m.stored_role in SYSTEM_PRINCIPALS, (
                    f"{where} cites an unpaired sender's line {m.platform_message_id}: {m.text!r}"
                )
                assert not m.is_agent, f"{where} cites an agent reply {m.platform_message_id}"
            if rec.scope in AUTHORITY_SCOPES:
                system_write = (
                    rec.scope == "agent_notes" and rec.source == "memory_write" and rec.author_role in SYSTEM_PRINCIPALS
                )
                listed_write = (
                    rec.scope == "agent_notes"
                    and rec.source == "memory_write"
                    and rec.author_user_id in self.write_access_users
                )
                if system_write:
                    assert all(m.stored_role == rec.author_user_id for m in cited), where
                    continue
                if listed_write:
                    assert all(m.speaker_user_id == rec.author_user_id for m in cited), where
                    continue
                assert rec.author_role == "admin", f"{where} was not authored by an admin"
                if rec.scope != "agent_notes":
                    # Seed 001: identity only "when a named person accepts a proposal".
                    assert rec.source == "decision", f"{where}: identity written other than by a decision"
                    (pid,) = rec.evidence
                    decided = proposals[pid].decision
                    assert decided is not None and decided.decision == "accepted", f"{where}: {pid} not accepted"
                    assert (decided.record_id, decided.by_user_id) == (rec.id, rec.author_user_id), where
                    assert rec.author_user_id in self.admin_ids(), f"{where}: accepted by a non-admin"
                    continue
                assert rec.source in ("live", "directive", "memory_write", "relearn", "confirm", "consolidate"), where
                assert cited or rec.source in ("relearn", "confirm", "consolidate"), f"{where} cites no message"
                for m in cited:
                    assert m.speaker_user_id == rec.author_user_id, f"{where} cites {m.speaker_user_id}'s line"
                    if strict_admin_evidence:
                        assert m.stored_role == "admin", f"{where} cites a line stored as {m.stored_role}"
                        assert m.speaker_user_id in self.admin_ids(), f"{where} cites a non-admin's line"
            elif rec.scope == "personal":
                assert rec.owner_user_id, where
                assert rec.owner_user_id == rec.author_user_id, f"{where} belongs to {rec.owner_user_id}"
                for m in cited:
                    assert m.speaker_user_id == rec.owner_user_id, f"{where} cites {m.speaker_user_id}'s line"
                for e in rec.evidence:
                    if e in archives and not cited:  # a summary: the whole slice must be the owner's
                        people = [m for m in archive_lines.get(e, []) if not m.is_agent]
                        assert people and all(m.speaker_user_id == rec.owner_user_id for m in people), (
                            f"{where}: summary of a slice not all the owner's"
                        )


async def open_world(
    url: str,
    model: HostileProvider | RecordingBuiltin,
    clock: Clock,
    *,
    max_messages: int = 8,
    keep_messages: int = 1,
    write_access_users: Sequence[str] = (),
    write_access_roles: Sequence[str] = (),
    cast: Sequence[str] = tuple(CAST),
    intelligence: dict[str, Any] | None = None,
) -> World:
    """Pair the cast on a fresh database and start a gateway on it (no channels, no background worker)."""
    engine = make_engine(url)
    await upgrade(engine)
    pairing = PairingStore(engine, clock=clock)
    people: dict[str, Person] = {}
    for n, key in enumerate(cast, start=1):
        name, role = CAST[key]
        person = Person(key, name, role, discord_id=str(1000 + n), teams_id=f"aad-{key}")
        if role is not None:
            user = await pairing.add_user(
                name, role, links=[f"discord:{person.discord_id}", f"teams:{person.teams_id}"]
            )
            person.user_id = user.id
            person.token = f"token-{key}-0123456789abcdef"
        people[key] = person
    unpaired = [p for p in people.values() if p.role is None]
    users = {p.key: p.user_id for p in people.values()}
    channel_rules = {"dm_policy": "pairing", "group_policy": "open", "require_mention": True}
    cfg = Config.model_validate(
        {
            "database": {"url": url},
            "session": {"max_messages": max_messages, "keep_messages": keep_messages},
            "server": {
                "dashboard_token": DASHBOARD_TOKEN,
                "api_users": [{"token": p.token, "user": p.user_id} for p in people.values() if p.token],
            },
            "channels": {
                "discord": {**channel_rules, "allow_from": [p.discord_id for p in unpaired]},
                "teams": {**channel_rules, "allow_from": [p.teams_id for p in unpaired]},
            },
            "memory": {
                "write_access": {
                    "users": [users.get(u) or u for u in write_access_users],
                    "roles": list(write_access_roles),
                }
            },
            "intelligence": intelligence or {},
        }
    )
    gw = Gateway(cfg, provider=model, clock=clock, engine=engine)
    await gw.start(channels=False, worker=False)
    listed = frozenset(users.get(u) or u for u in write_access_users)
    return World(gw, engine, model, clock, people, write_access_users=listed)


MakeWorld = Callable[..., Awaitable[World]]
"""The ``make_world`` fixture: ``await make_world(**open_world options)``."""


async def close_world(world: World) -> None:
    """Stop the gateway and close its database."""
    await world.gw.stop()
    await world.engine.dispose()
