"""Audit and undo: every retirement is a row; an admin undoes one or a run; an undone pair is a veto forever.

On real SQLite and real PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from memory.belief_revision import BeliefReviser
from memory.render import memory_sections
from memory.revisions import UndoRefused, authorize_undo, list_revisions, undo_revision, undo_revision_run, undo_run
from memory.store import MemoryStore, MemoryStoreError
from memory.writer import MemoryWriter
from pairing.principal import Principal
from tests.conftest import Clock
from tests.memory.conftest import ALICE, BOB, CRON, SOP, T0, UNPAIRED, WEBHOOK

DAY = timedelta(days=1)


class ScriptedJudge:
    """A judge that answers what the test says, and records what it was shown."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, system: str, user: str) -> str:
        shown = json.loads(user)
        self.calls.append(shown)
        answer = self.answer(shown) if callable(self.answer) else self.answer
        return answer if isinstance(answer, str) else json.dumps(answer)


async def _snapshot(store: MemoryStore) -> tuple[Any, ...]:
    records = await store.list_records(include_history=True, limit=10_000)
    revisions = await store.list_revisions()
    return tuple((r.id, r.status, r.superseded_by) for r in records), tuple(revisions)


async def _two_on_a_subject(writer: MemoryWriter) -> tuple[str, str, str]:
    a = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="example_orders", said_at=T0
    )
    b = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="example_archive", said_at=T0 + DAY
    )
    assert a.record and b.record and b.retired == (a.record.id,)
    (rev,) = await writer.store.revisions_for(a.record.id)
    return a.record.id, b.record.id, rev.id


async def test_undo_returns_the_record_to_the_prompt_and_leaves_the_replacing_one(writer: MemoryWriter) -> None:
    a, b, rev_id = await _two_on_a_subject(writer)
    store = writer.store
    done = await undo_revision(store, rev_id, principal=ALICE)
    assert [r.id for r in done.restored] == [a]
    (undone,) = done.revisions
    assert undone.undone and undone.undone_by == "u_alice"
    assert (await store.get(a)).status == "live"  # type: ignore[union-attr]
    assert (await store.get(b)).status == "live"  # type: ignore[union-attr]
    sections = await memory_sections(store, ALICE, "which report data source?", token_budget=2000)
    assert a in sections.used_ids and b in sections.used_ids
    # Its words are back in the relevance index too.
    assert a in [v.id for v, _ in await store.notes_sharing_words(["example", "order"])]


async def test_an_undone_pair_is_vetoed_against_the_subject_rule(writer: MemoryWriter) -> None:
    a, b, rev_id = await _two_on_a_subject(writer)
    store = writer.store
    await undo_revision(store, rev_id, principal=ALICE)
    # The subject rule proposes the same retirement again: vetoed.
    assert await store.apply_subject_rule(b, cause="revise") == ()
    assert not await store.retire_superseded(a, b, reason="again", via="subject_rule", cause="revise")
    assert (await store.get(a)).status == "live"  # type: ignore[union-attr]
    # Only the undone row and no new one.
    assert [r.id for r in await store.revisions_for(a)] == [rev_id]


async def test_an_undone_pair_is_vetoed_against_the_judge(writer: MemoryWriter) -> None:
    a, b, rev_id = await _two_on_a_subject(writer)
    store = writer.store
    await undo_revision(store, rev_id, principal=ALICE)
    judge = ScriptedJudge(
        lambda shown: {
            "decisions": [{"record_id": c["id"], "relation": "replaces", "reason": "same"} for c in shown["candidates"]]
        }
    )
    outcome = await BeliefReviser(store, judge, judge_model="scripted").revise(b, cause="revise")
    assert judge.calls and a in [c["id"] for c in judge.calls[0]["candidates"]]
    assert outcome.retired == []
    assert (await store.get(a)).status == "live"  # type: ignore[union-attr]
    assert [r.id for r in await store.revisions_for(a)] == [rev_id]


async def test_undo_a_whole_run(writer: MemoryWriter) -> None:
    store = writer.store
    ids = []
    for n in range(3):
        res = await writer.write(
            ALICE, "agent_notes", "live", subject=f"s{n}", content=f"old {n}", said_at=T0, run_id="job-1"
        )
        assert res.record
        ids.append(res.record.id)
    for n in range(3):
        await writer.write(
            ALICE, "agent_notes", "relearn", subject=f"s{n}", content=f"new {n}", said_at=T0 + DAY,
            trusted=True, run_id="rl_run",
        )  # fmt: skip
    assert len(await list_revisions(store, run_id="rl_run")) == 3
    done = await undo_revision_run(store, "rl_run", principal=ALICE)
    assert sorted(r.id for r in done.restored) == sorted(ids)
    assert all(r.undone for r in await list_revisions(store, run_id="rl_run"))
    assert len(await store.live_notes()) == 6
    assert undo_run is undo_revision_run


async def test_undo_of_an_unknown_or_undone_id_is_a_clear_error_and_changes_nothing(writer: MemoryWriter) -> None:
    _a, _b, rev_id = await _two_on_a_subject(writer)
    store = writer.store
    before = await _snapshot(store)
    with pytest.raises(MemoryStoreError, match="no revision rv_nope"):
        await undo_revision(store, "rv_nope", principal=ALICE)
    with pytest.raises(MemoryStoreError, match="no run nope"):
        await undo_revision_run(store, "nope", principal=ALICE)
    assert await _snapshot(store) == before
    await undo_revision(store, rev_id, principal=ALICE)
    after_undo = await _snapshot(store)
    with pytest.raises(MemoryStoreError, match="already undone"):
        await undo_revision(store, rev_id, principal=ALICE)
    assert await _snapshot(store) == after_undo


@pytest.mark.parametrize("who", [BOB, CRON, SOP, WEBHOOK, UNPAIRED], ids=lambda p: p.display_name or p.kind)
async def test_only_human_admins_undo(writer: MemoryWriter, who: Principal) -> None:
    _a, _b, rev_id = await _two_on_a_subject(writer)
    before = await _snapshot(writer.store)
    assert authorize_undo(who) is not None
    with pytest.raises(UndoRefused, match="requires an administrator"):
        await undo_revision(writer.store, rev_id, principal=who)
    with pytest.raises(UndoRefused):
        await undo_revision_run(writer.store, "any", principal=who)
    assert await _snapshot(writer.store) == before
    assert authorize_undo(ALICE) is None


async def test_undo_returns_a_retired_unverified_record_to_unverified(writer: MemoryWriter, clock: Clock) -> None:
    q = await writer.write(BOB, "agent_notes", "relearn", subject="x", content="quarantined", said_at=T0)
    live = await writer.write(ALICE, "agent_notes", "live", subject="y", content="the admin's", said_at=T0 + DAY)
    assert q.record and live.record
    store = writer.store
    assert await store.retire_superseded(q.record.id, live.record.id, reason="r", via="belief_revision", cause="revise")
    (rev,) = await store.revisions_for(q.record.id)
    assert rev.prior_status == "unverified"
    await undo_revision(store, rev.id, principal=ALICE)
    assert (await store.get(q.record.id)).status == "unverified"  # type: ignore[union-attr]
    assert [r.id for r in await store.live_notes()] == [live.record.id]


async def test_the_veto_is_for_the_pair_only_a_later_value_still_replaces_both(writer: MemoryWriter) -> None:
    a, b, rev_ab = await _two_on_a_subject(writer)
    store = writer.store
    await undo_revision(store, rev_ab, principal=ALICE)
    c = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="third", said_at=T0 + 2 * DAY
    )
    assert c.record and set(c.retired) == {a, b}
    assert (await store.get(a)).superseded_by == c.record.id  # type: ignore[union-attr]


async def test_a_run_undo_skips_rows_undone_before_and_then_reports_it_done(writer: MemoryWriter) -> None:
    store = writer.store
    for n in range(2):
        await writer.write(ALICE, "agent_notes", "live", subject=f"s{n}", content=f"old {n}", said_at=T0)
        await writer.write(
            ALICE, "agent_notes", "live", subject=f"s{n}", content=f"new {n}", said_at=T0 + DAY, run_id="r1"
        )
    first, second = await list_revisions(store, run_id="r1")
    await undo_revision(store, first.id, principal=ALICE)
    done = await undo_revision_run(store, "r1", principal=ALICE)
    assert [r.id for r in done.revisions] == [second.id]
    with pytest.raises(MemoryStoreError, match="run r1 is already undone"):
        await undo_revision_run(store, "r1", principal=ALICE)
