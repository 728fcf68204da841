"""memory_write, memory_search and @notes: -- what each says, and what each refuses."""

from __future__ import annotations

from datetime import timedelta

from memory.gate import WriteAccess
from memory.store import MemoryStore
from memory.tools import (
    MEMORY_SEARCH_SCHEMA,
    MEMORY_WRITE_SCHEMA,
    handle_notes_directive,
    memory_search,
    memory_write,
)
from memory.writer import MemoryWriter
from pairing.principal import Principal, Role
from tests.conftest import Clock
from tests.memory.conftest import ALICE, BOB, CAROL, CRON, SOP, T0, UNPAIRED, WEBHOOK

KW = {"said_at": T0, "session_id": "s1", "message_id": "msg-1"}


async def test_admin_memory_write_to_agent_notes_is_saved(writer: MemoryWriter) -> None:
    args = {"scope": "agent_notes", "subject": "report data source", "content": "example_orders"}
    reply = await memory_write(writer, ALICE, args, **KW)
    assert reply.startswith("Saved to agent_notes (m_") and "Review by" in reply
    (rec,) = await writer.store.live_notes()
    assert rec.source == "memory_write" and rec.evidence == ("msg-1",) and rec.said_at == T0
    again = await memory_write(
        writer, ALICE, {**args, "content": "example_archive"}, **{**KW, "said_at": T0 + timedelta(1)}
    )
    assert f"replaces {rec.id}" in again


async def test_regular_user_memory_write_to_agent_notes_is_refused_and_pointed_to_personal(
    writer: MemoryWriter,
) -> None:
    reply = await memory_write(writer, BOB, {"scope": "agent_notes", "subject": "s", "content": "c"}, **KW)
    assert "scope='personal'" in reply and "administrator" in reply
    assert await writer.store.list_records(include_history=True) == []
    saved = await memory_write(writer, BOB, {"scope": "personal", "subject": "s", "content": "c"}, **KW)
    assert saved.startswith("Saved to your personal memory")
    (rec,) = await writer.store.personal_for("u_bob")
    assert rec.owner_user_id == "u_bob"


async def test_write_access_lets_a_listed_user_write_agent_notes(store: MemoryStore) -> None:
    writer = MemoryWriter(store, write_access=WriteAccess(users=["u_bob"]))
    reply = await memory_write(writer, BOB, {"scope": "agent_notes", "subject": "s", "content": "c"}, **KW)
    assert reply.startswith("Saved to agent_notes")
    refused = await memory_write(writer, BOB, {"scope": "global", "subject": "s", "content": "c"}, **KW)
    assert "propose_policy_change" in refused and "Nothing was saved" in refused


async def test_system_runs_may_record_results_in_agent_notes_but_nothing_else(writer: MemoryWriter) -> None:
    for run in (CRON, SOP, WEBHOOK):
        ok = await memory_write(
            writer, run, {"scope": "agent_notes", "subject": "run", "content": str(run.system_name)}, **KW
        )
        assert ok.startswith("Saved to agent_notes")
        for scope in ("global", "agent_config"):
            refused = await memory_write(writer, run, {"scope": scope, "subject": "s", "content": "c"}, **KW)
            assert "not written directly, by anyone" in refused
        personal = await memory_write(writer, run, {"scope": "personal", "subject": "s", "content": "c"}, **KW)
        assert "no personal memory" in personal
    assert len(await writer.store.list_records(include_history=True)) == 3


async def test_memory_write_argument_errors(writer: MemoryWriter) -> None:
    unknown = await memory_write(writer, ALICE, {"scope": "org", "subject": "s", "content": "c"}, **KW)
    assert "unknown scope 'org'" in unknown and "personal, agent_notes, global, agent_config" in unknown
    empty = await memory_write(writer, ALICE, {"scope": "agent_notes", "subject": "s", "content": "  "}, **KW)
    assert "content is empty" in empty
    long = await memory_write(
        writer, ALICE, {"scope": "agent_notes", "subject": "s", "content": "x" * 51}, **KW, max_chars=50
    )
    assert "the limit is 50" in long
    unpaired = await memory_write(writer, UNPAIRED, {"scope": "personal", "subject": "s", "content": "c"}, **KW)
    assert "no personal memory" in unpaired
    assert await writer.store.list_records(include_history=True) == []


def test_tool_schemas() -> None:
    assert MEMORY_WRITE_SCHEMA["required"] == ["scope", "subject", "content"]
    assert MEMORY_WRITE_SCHEMA["properties"]["scope"]["enum"] == ["personal", "agent_notes", "global", "agent_config"]
    assert MEMORY_SEARCH_SCHEMA["required"] == ["query"]


async def test_notes_directive_from_an_admin_is_saved(writer: MemoryWriter) -> None:
    reply = await handle_notes_directive(writer, ALICE, "@notes: the report data source is example_archive", **KW)
    assert reply and reply.startswith("Noted. Saved to agent_notes")
    (rec,) = await writer.store.live_notes()
    assert (rec.source, rec.subject, rec.content) == (
        "directive",
        "report data source",
        "the report data source is example_archive",
    )


async def test_notes_directive_from_anyone_else_is_refused_and_nothing_saved(store: MemoryStore) -> None:
    # write_access does not apply to @notes: (policy: "@notes: is for admins only").
    writer = MemoryWriter(store, write_access=WriteAccess(users=["u_bob"], roles=["user"]))
    for who in (BOB, UNPAIRED, CRON, WEBHOOK):
        reply = await handle_notes_directive(writer, who, "@notes: use example_archive", **KW)
        assert reply and "Operational changes require an administrator" in reply
    assert await store.list_records(include_history=True) == []


async def test_notes_directive_edge_cases(writer: MemoryWriter) -> None:
    assert await handle_notes_directive(writer, ALICE, "notes: not a directive", **KW) is None
    assert await handle_notes_directive(writer, ALICE, "hello @notes: x", **KW) is None
    empty = await handle_notes_directive(writer, ALICE, "@NOTES:   ", **KW)
    assert empty and "Nothing to note" in empty
    too_long = await handle_notes_directive(writer, ALICE, "@notes: " + "x" * 30, **KW, max_chars=10)
    assert too_long and "the limit is 10" in too_long


async def test_memory_search_shows_own_personal_and_notes_with_history(writer: MemoryWriter, clock: Clock) -> None:
    await memory_write(
        writer,
        ALICE,
        {"scope": "agent_notes", "subject": "report data source", "content": "example_orders report"},
        **KW,
    )
    await memory_write(
        writer, ALICE, {"scope": "agent_notes", "subject": "report data source", "content": "example_archive report"},
        **{**KW, "said_at": T0 + timedelta(days=1)},
    )  # fmt: skip
    await memory_write(
        writer, BOB, {"scope": "personal", "subject": "report style", "content": "Bob wants short reports"}, **KW
    )
    await memory_write(
        writer, CAROL, {"scope": "personal", "subject": "report style", "content": "Carol wants long reports"}, **KW
    )
    await writer.write(
        BOB, "agent_notes", "relearn", subject="report data source", content="quarantined report", said_at=T0
    )
    store = writer.store

    bob = await memory_search(store, BOB, {"query": "report"})
    assert "Bob wants short reports" in bob and "Carol" not in bob
    assert "example_archive report" in bob and "example_orders report" in bob
    assert "superseded" in bob and "said 2026-11-30 by u_alice (admin)" in bob and "review by" in bob
    assert "quarantined" not in bob

    alice = await memory_search(store, ALICE, {"query": "report"})
    assert "quarantined report" in alice and "unverified" in alice and "Bob wants" not in alice

    for run in (CRON, UNPAIRED):
        seen = await memory_search(store, run, {"query": "report"})
        assert "wants" not in seen and "example_archive" in seen

    assert "No memory matches" in await memory_search(store, BOB, {"query": "zebra"})
    assert "error" in await memory_search(store, BOB, {"query": ""})


async def test_memory_write_never_changes_a_role(writer: MemoryWriter) -> None:
    claimant = Principal.human("u_zed", Role.USER)
    reply = await memory_write(
        writer, claimant, {"scope": "agent_config", "subject": "admins", "content": "u_zed is an admin"}, **KW
    )
    assert "propose_policy_change" in reply
    assert await writer.store.list_records(include_history=True) == []


async def test_the_same_fact_written_again_says_so(writer: MemoryWriter) -> None:
    args = {"scope": "personal", "subject": "reply language", "content": "English"}
    assert (await memory_write(writer, BOB, args, **KW)).startswith("Saved")
    assert (await memory_write(writer, BOB, args, **KW)).startswith("Already remembered")
    assert (await handle_notes_directive(writer, ALICE, "@notes: use example_orders", **KW) or "").startswith("Noted")
    assert (await handle_notes_directive(writer, ALICE, "@notes: use example_orders", **KW) or "").startswith("Already")
