"""Operational memory: dated facts, never rules (seed 001, issue 11).

One test per rule: review-by refused in the past or over 90 days out (and
never clamped), expired entries kept in the read model but never rendered and
recorded again when said again, a merge never extends a review-by, scope
filtering (SOP runs, people's conversations, a run by hand), retraction only by
a named, paired admin, and run ids on every retirement of the live path.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.memory_glue import principal_lookup, run_by_hand
from gateway.turn import RunContext, TurnRequest
from memory.retract import retract_by
from memory.store import MemoryStoreError
from memory.writer import MemoryWriter
from pairing.principal import Principal
from tests.policy.world import BOTH_BACKENDS, World

FACT = "The nightly export lands in example_exports by 04:00."


async def _admin_write(world: World, args: dict[str, object]) -> str:
    await world.api("alice", "hello")
    alice = await world.principal("alice")
    return await world.call_tool(alice, "memory_write", {"scope": "agent_notes", **args}, key=world.api_key("alice"))


async def _notes_seen_by(world: World, who: str) -> str:
    await world.api(who, "what do you know about the nightly export?")
    return world.section(world.last_prompt(), "operational")


async def _sop_prompt(world: World, sop: str, tags: tuple[str, ...] = ()) -> str:
    world.clock.advance(minutes=1)
    await world.gw.turns.handle(
        TurnRequest(
            key=world.thread_key(f"sop-{sop}"),
            principal=Principal.system("sop-system"),
            text="run the procedure",
            message_id=world.next_id("sop"),
            said_at=world.clock.now,
            display_name="sop-system",
            run=RunContext(sop_name=sop, run_id=f"run-{sop}-{world.last_message_id}", scope_tags=tags),
        )
    )
    return world.section(world.last_prompt(), "operational")


# ---- review-by --------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_review_by_in_the_past_or_over_90_days_is_refused_not_clamped(world: World) -> None:
    today = world.clock.now.date()
    past = await _admin_write(world, {"subject": "export", "content": FACT, "review_by": str(today - timedelta(1))})
    assert "not in the future" in past and "Nothing was saved" in past
    far = today + timedelta(days=121)
    over = await _admin_write(world, {"subject": "export", "content": FACT, "review_by": far.isoformat()})
    assert f"review_by {far.isoformat()} is 121 days out; at most 90" in over
    missing = await _admin_write(world, {"subject": "export", "content": FACT})
    assert "review_by is required" in missing
    assert [r for r in await world.records("agent_notes") if r.content == FACT] == []

    ok = await _admin_write(world, {"subject": "export", "content": FACT, "review_by": "30d"})
    assert ok.startswith("Saved"), ok
    (note,) = [r for r in await world.live("agent_notes") if r.content == FACT]
    assert note.review_by == world.clock.now + timedelta(days=30)

    # The store itself refuses, whoever calls it, and a writer's default cannot exceed 90 days.
    with pytest.raises(MemoryStoreError, match="91 days out; at most 90"):
        await world.gw.memory.writer.write(
            await world.principal("alice"), "agent_notes", "directive", subject="s", content="c",
            said_at=world.clock.now, review_by=world.clock.now + timedelta(days=91),
        )  # fmt: skip
    with pytest.raises(ValueError, match="use 1 to 90"):
        MemoryWriter(world.gw.memory.store, notes_review_days=120)


async def test_notes_directive_takes_a_review_by_in_brackets(world: World) -> None:
    refused = await world.api("alice", "@notes[120d]: " + FACT)
    assert refused.reply and "120 days out; at most 90" in refused.reply
    assert [r for r in await world.records("agent_notes") if r.source == "directive"] == []
    await world.api("alice", "@notes[14d]: " + FACT)
    (note,) = [r for r in await world.live("agent_notes") if r.source == "directive"]
    assert note.review_by == world.clock.now + timedelta(days=14)
    await world.api("alice", "@notes: the weekly digest goes out on Mondays")
    (plain,) = [r for r in await world.live("agent_notes") if "Mondays" in r.content]
    assert plain.review_by == world.clock.now + timedelta(days=world.gw.config.memory.notes_review_days)


# ---- expiry -----------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_expired_fact_is_listed_never_rendered_never_searched_and_said_again_is_new(world: World) -> None:
    await world.api("alice", "@notes[3d]: " + FACT)
    (first,) = [r for r in await world.live("agent_notes") if r.source == "directive"]
    assert FACT in await _notes_seen_by(world, "bob")

    world.clock.advance(days=4)
    assert FACT not in await _notes_seen_by(world, "bob")
    bob = await world.principal("bob")
    found = await world.call_tool(bob, "memory_search", {"query": "nightly export"}, key=world.api_key("bob"))
    assert FACT not in found
    listed = await world.gw.memory.store.list_records(scope="agent_notes", include_history=True)
    assert [r.effective_status(world.clock.now) for r in listed if r.id == first.id] == ["expired"]

    # Said again: a new entry, current and rendered; the expired one stays expired.
    await world.api("alice", "@notes[30d]: " + FACT)
    again = [r for r in await world.live("agent_notes") if r.source == "directive" and r.id != first.id]
    assert len(again) == 1 and again[0].current(world.clock.now)
    assert FACT in await _notes_seen_by(world, "bob")
    old = await world.gw.memory.store.get(first.id)
    assert old is not None and old.effective_status(world.clock.now) == "expired"


async def test_a_merge_takes_the_earliest_review_by_of_its_sources(world: World) -> None:
    for subject, days in (("export a", 10), ("export b", 60), ("export c", 30)):
        reply = await _admin_write(world, {"subject": subject, "content": FACT, "review_by": f"{days}d"})
        assert reply.startswith("Saved"), reply
    run = await world.gw.memory.scheduler.consolidate(await world.principal("alice"))
    assert run is not None and len(run.merged) == 1, run.summary()
    merged = await world.gw.memory.store.get(run.merged[0][0])
    assert merged is not None and merged.review_by is not None
    assert merged.review_by.date() == (world.clock.now + timedelta(days=10)).date()


# ---- scope ------------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_scoped_fact_is_rendered_only_to_runs_of_its_sops_and_by_hand(world: World) -> None:
    scoped = "The daily report needs TZ=UTC set before example_orders is read."
    everyone = "The weekly digest goes out on Mondays."
    reply = await _admin_write(
        world, {"subject": "tz", "content": scoped, "review_by": "30d", "applies_to": ["Daily-Report"]}
    )
    assert reply.startswith("Saved") and "For daily-report only" in reply, reply
    await _admin_write(world, {"subject": "digest", "content": everyone, "review_by": "30d"})

    assert scoped in (seen := await _sop_prompt(world, "daily-report")) and everyone in seen
    assert scoped in await _sop_prompt(world, "billing", tags=("daily-report",))  # a tag matches too
    assert scoped not in (other := await _sop_prompt(world, "billing")) and everyone in other
    assert scoped not in (conversation := await _notes_seen_by(world, "bob")) and everyone in conversation
    with run_by_hand():
        assert scoped in await _notes_seen_by(world, "alice")
    assert "for daily-report" in seen and "review by" in seen  # provenance and review-by, rendered


# ---- retraction -------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_retraction_only_by_a_named_paired_admin_and_kept_as_an_event(world: World) -> None:
    await world.api("alice", "@notes[30d]: " + FACT)
    (note,) = [r for r in await world.live("agent_notes") if r.source == "directive"]
    store, pairing = world.gw.memory.store, principal_lookup(world.gw.pairing)
    bob, dave = world["bob"].user_id, world["dave"].user_id
    assert bob and dave
    with pytest.raises(MemoryStoreError, match="not an admin"):
        await retract_by(store, pairing, note.id, by=bob, reason="I disagree")
    with pytest.raises(MemoryStoreError, match="not a paired person"):
        await retract_by(store, pairing, note.id, by="operator", reason="cleanup")
    await world.api("bob", "please forget the export note")
    refused = await world.call_tool(
        await world.principal("bob"), "memory_retract", {"id": note.id, "reason": "no"}, key=world.api_key("bob")
    )
    assert "requires an administrator" in refused
    assert (await store.get(note.id)).status == "live"  # type: ignore[union-attr]

    done = await retract_by(store, pairing, note.id, by=dave, reason="the export moved to example_archive")
    assert done.status == "retracted"
    (event,) = await store.reviews_for(note.id)
    assert (event.action, event.by_user_id, event.reason) == ("retract", dave, "the export moved to example_archive")
    assert FACT not in await _notes_seen_by(world, "bob")
    listed = await store.list_records(scope="agent_notes", include_history=True)
    assert [r.status for r in listed if r.id == note.id] == ["retracted"]  # kept, never deleted


async def test_admin_chat_tool_retracts_as_the_turns_admin(world: World) -> None:
    await world.api("alice", "@notes[30d]: " + FACT)
    (note,) = [r for r in await world.live("agent_notes") if r.source == "directive"]
    alice = await world.principal("alice")
    reply = await world.call_tool(
        alice, "memory_retract", {"id": note.id, "reason": "wrong"}, key=world.api_key("alice")
    )
    assert reply.startswith("Retracted"), reply
    (event,) = await world.gw.memory.store.reviews_for(note.id)
    assert event.by_user_id == alice.user_id


# ---- run ids ----------------------------------------------------------------------------


async def test_every_live_path_retirement_carries_a_run_and_undo_run_undoes_it_together(world: World) -> None:
    await world.api("alice", "@notes: the report data source is example_orders")
    await world.api("alice", "@notes: the report data source is example_archive")
    revisions = await world.gw.memory.store.list_revisions()
    assert revisions and all(r.run_id for r in revisions), [(r.id, r.run_id) for r in revisions]
    run = revisions[0].run_id
    assert run is not None
    undone = await world.gw.memory.store.undo(by="alice", run_id=run)
    assert {r.status for r in undone.restored} == {"live"}
