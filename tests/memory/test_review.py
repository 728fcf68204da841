"""Review of quarantined learning (``review_learned``), retraction, and the admin tools' authorization.

On real SQLite and real PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from memory.belief_revision import BeliefReviser
from memory.render import memory_sections
from memory.review import confirm_learned, list_unverified, reject_learned, retract_note
from memory.store import MemoryStoreError
from memory.tools_admin import (
    NOTES_DISTILL_SCHEMA,
    REVIEW_LEARNED_SCHEMA,
    authorize_notes_distill,
    authorize_review_learned,
    notes_distill,
    review_learned,
)
from memory.writer import MemoryWriter
from pairing.principal import Principal
from tests.memory.conftest import ALICE, BOB, CAROL, CRON, SOP, T0, UNPAIRED, WEBHOOK

DAY = timedelta(days=1)
NOT_ADMINS = [BOB, CRON, SOP, WEBHOOK, UNPAIRED]


def _id(p: Principal) -> str:
    return p.display_name or str(p.kind)


class Judge:
    """A judge that records each call and says every candidate is replaced."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, system: str, user: str) -> str:
        shown = json.loads(user)
        self.calls.append(shown)
        return json.dumps(
            {"decisions": [{"record_id": c["id"], "relation": "replaces", "reason": "r"} for c in shown["candidates"]]}
        )


async def quarantined(writer: MemoryWriter, content: str, *, subject: str = "report tables", at: Any = T0) -> str:
    res = await writer.write(BOB, "agent_notes", "relearn", subject=subject, content=content, said_at=at)
    assert res.record and res.record.status == "unverified"
    return res.record.id


async def test_unverified_records_are_never_in_a_prompt(writer: MemoryWriter) -> None:
    rid = await quarantined(writer, "The daily report uses example_archive")
    assert await writer.store.live_notes() == []
    sections = await memory_sections(writer.store, ALICE, "the daily report example_archive", token_budget=2000)
    assert rid not in sections.used_ids and "example_archive" not in sections.text
    assert [r.id for r in await list_unverified(writer.store)] == [rid]


async def test_confirm_makes_it_live_and_queues_belief_revision(writer: MemoryWriter) -> None:
    older = await writer.write(
        ALICE, "agent_notes", "live", subject="daily report", content="The daily report uses example_orders",
        said_at=T0 - DAY,
    )  # fmt: skip
    assert older.record
    rid = await quarantined(writer, "The daily report uses example_archive")
    judge = Judge()
    reviser = BeliefReviser(writer.store, judge, judge_model="scripted")
    done = await confirm_learned(writer, ALICE, rid, reviser=reviser)
    assert done.record.status == "live" and done.revision is not None
    assert judge.calls and judge.calls[0]["record"]["id"] == rid
    (rev,) = await writer.store.revisions_for(older.record.id)
    assert (rev.replacing_id, rev.via, rev.cause, rev.run_id) == (rid, "belief_revision", "confirm", done.run_id)
    sections = await memory_sections(writer.store, ALICE, "the daily report", token_budget=2000)
    assert rid in sections.used_ids
    assert "It replaces" in done.text()


async def test_an_older_confirmed_record_becomes_history_and_retires_nothing(writer: MemoryWriter) -> None:
    rid = await quarantined(writer, "The report uses example_orders", subject="report data source", at=T0)
    newer = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="The report uses example_archive",
        said_at=T0 + DAY,
    )  # fmt: skip
    assert newer.record
    judge = Judge()
    done = await confirm_learned(writer, ALICE, rid, reviser=BeliefReviser(writer.store, judge, judge_model="m"))
    assert done.record.status == "superseded" and done.record.superseded_by == newer.record.id
    assert judge.calls == []  # history is not weighed against anything it could retire
    assert [r.id for r in await writer.store.live_notes()] == [newer.record.id]
    assert "kept as history" in done.text()


async def test_reject_keeps_it_as_rejected(writer: MemoryWriter) -> None:
    rid = await quarantined(writer, "The daily report uses example_archive")
    rec = await reject_learned(writer, CAROL, rid, reason="wrong table")
    assert rec.status == "rejected"
    (review,) = await writer.store.reviews_for(rid)
    assert (review.action, review.by_user_id, review.reason) == ("reject", "u_carol", "wrong table")
    with pytest.raises(MemoryStoreError, match="is rejected, not awaiting review"):
        await confirm_learned(writer, ALICE, rid)
    assert await writer.store.live_notes() == []


@pytest.mark.parametrize("who", NOT_ADMINS, ids=_id)
async def test_only_human_admins_review(writer: MemoryWriter, who: Principal) -> None:
    rid = await quarantined(writer, "The daily report uses example_archive")
    assert authorize_review_learned(who) is not None
    assert "requires an administrator" in await review_learned(writer, who, {"action": "list"})
    assert "requires an administrator" in await review_learned(writer, who, {"action": "confirm", "id": rid})
    with pytest.raises(MemoryStoreError):
        await confirm_learned(writer, who, rid)
    with pytest.raises(MemoryStoreError):
        await reject_learned(writer, who, rid)
    assert (await writer.store.get(rid)).status == "unverified"  # type: ignore[union-attr]


async def test_review_learned_tool_lists_confirms_and_rejects(writer: MemoryWriter) -> None:
    assert authorize_review_learned(ALICE) is None
    assert await review_learned(writer, ALICE, {"action": "list"}) == "Nothing is awaiting review."
    a = await quarantined(writer, "The daily report uses example_archive", subject="a")
    b = await quarantined(writer, "The weekly report uses example_weekly", subject="b")
    listing = await review_learned(writer, ALICE, {"action": "list"})
    assert "2 learned fact(s)" in listing and a in listing and b in listing and "evidence" in listing
    assert "Confirmed" in await review_learned(writer, ALICE, {"action": "confirm", "id": a})
    assert "Rejected" in await review_learned(writer, ALICE, {"action": "reject", "id": b, "reason": "no"})
    assert "error" in await review_learned(writer, ALICE, {"action": "confirm", "id": "m_nope"})
    assert "error" in await review_learned(writer, ALICE, {"action": "confirm"})
    assert "error" in await review_learned(writer, ALICE, {"action": "delete", "id": a})
    assert set(REVIEW_LEARNED_SCHEMA["properties"]["action"]["enum"]) == {"list", "confirm", "reject"}


async def test_personal_memory_is_not_reviewed(writer: MemoryWriter) -> None:
    p = await writer.write(ALICE, "personal", "live", subject="name", content="Alice", said_at=T0)
    assert p.record
    with pytest.raises(MemoryStoreError, match="not reviewed"):
        await confirm_learned(writer, ALICE, p.record.id)


async def test_retraction_by_a_named_admin_keeps_the_record(writer: MemoryWriter) -> None:
    res = await writer.write(ALICE, "agent_notes", "live", subject="vpn", content="vpn.example.internal", said_at=T0)
    assert res.record
    with pytest.raises(MemoryStoreError, match="requires an administrator"):
        await retract_note(writer.store, BOB, res.record.id, reason="x")
    with pytest.raises(MemoryStoreError, match="needs a reason"):
        await retract_note(writer.store, ALICE, res.record.id, reason=" ")
    rec = await retract_note(writer.store, ALICE, res.record.id, reason="host retired")
    assert rec.status == "retracted" and await writer.store.live_notes() == []
    (review,) = await writer.store.reviews_for(rec.id)
    assert (review.action, review.by_user_id) == ("retract", "u_alice")
    with pytest.raises(MemoryStoreError, match="only a live note"):
        await retract_note(writer.store, ALICE, res.record.id, reason="again")


@pytest.mark.parametrize("who", NOT_ADMINS, ids=_id)
async def test_notes_distill_is_for_human_admins_only(who: Principal) -> None:
    ran: list[Principal] = []

    async def run(p: Principal) -> str:
        ran.append(p)
        return "done"

    assert authorize_notes_distill(who) is not None
    assert "requires an administrator" in await notes_distill(who, {}, run=run)
    assert ran == []
    assert authorize_notes_distill(ALICE) is None
    assert await notes_distill(ALICE, {}, run=run) == "done" and ran == [ALICE]
    assert NOTES_DISTILL_SCHEMA["properties"] == {}
