"""Consolidation: merges through the gate under one run, 40 records a call, 6 calls a run, the looked-at cache.

Scripted models and the builtin one, on real SQLite and real PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from memory.consolidate import (
    CONSOLIDATION_PROMPT_VERSION,
    CONSOLIDATION_SCHEMA,
    CONSOLIDATION_SCHEMA_NAME,
    Consolidator,
    cluster_by_words,
    pack,
)
from memory.revisions import undo_revision_run
from memory.rules import builtin_consolidation_result
from memory.store import MemoryRecordView
from memory.writer import MemoryWriter
from tests.memory.conftest import ALICE, BOB, CRON, T0

MIN = timedelta(minutes=1)


class Model:
    """A consolidation model: scripted (or the builtin), recording every batch it was shown."""

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer
        self.batches: list[list[str]] = []

    async def __call__(self, system: str, user: str) -> str:
        shown = json.loads(user)["records"]
        self.batches.append([r["id"] for r in shown])
        if self.answer is None:
            return builtin_consolidation_result(system, user)
        answer = self.answer(shown) if callable(self.answer) else self.answer
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, str) else json.dumps(answer)


NO_MERGES = {"merges": []}


async def add_note(writer: MemoryWriter, subject: str, content: str, minute: int = 0) -> str:
    res = await writer.write(ALICE, "agent_notes", "live", subject=subject, content=content, said_at=T0 + minute * MIN)
    assert res.record and res.written
    return res.record.id


async def fill(writer: MemoryWriter, n: int, *, dup_every: int = 0) -> list[str]:
    """``n`` notes sharing some words in groups; every ``dup_every``-th is a copy of the one before."""
    ids = []
    content = ""
    for i in range(n):
        if dup_every and i % dup_every == dup_every - 1:
            content = "  " + content.lower().rstrip(".")  # the note before, said again
        else:
            content = f"The export of area {i} goes to bucket-{i} at {i % 24:02d}:00 (owner team {i % 7})."
        ids.append(await add_note(writer, f"note {i}", content, i))
    return ids


def test_the_schema_is_named_and_strict() -> None:
    assert CONSOLIDATION_SCHEMA_NAME == "consolidation_result"
    item = CONSOLIDATION_SCHEMA["properties"]["merges"]["items"]
    assert item["required"] == ["record_ids", "subject", "content", "reason"]


async def test_identical_notes_merge_into_one_new_record_under_one_run(writer: MemoryWriter) -> None:
    a = await add_note(writer, "vpn", "The VPN lives on vpn.example.internal.", 0)
    b = await add_note(writer, "vpn host", "the VPN lives on  vpn.example.internal", 5)
    c = await add_note(writer, "lunch", "Lunch is at noon.", 1)
    model = Model()
    run = await Consolidator(writer, model, model_name="builtin-offline").run(CRON, run_id="cr_test")
    assert run.model_calls == 1 and run.failed_calls == 0
    ((merged, sources),) = run.merged
    assert set(sources) == {a, b}
    store = writer.store
    rec = await store.get(merged)
    assert rec and (rec.status, rec.source, rec.run_id, rec.subject) == ("live", "consolidate", "cr_test", "vpn host")
    assert rec.said_at == T0 + 5 * MIN and {a, b} <= set(rec.evidence)
    assert sorted(r.id for r in await store.live_notes()) == sorted([merged, c])
    for src in (a, b):
        (rev,) = await store.revisions_for(src)
        assert (rev.replacing_id, rev.via, rev.cause, rev.run_id) == (merged, "consolidation", "consolidate", "cr_test")
        assert (rev.judge_model, rev.prompt_version) == ("builtin-offline", CONSOLIDATION_PROMPT_VERSION)


async def test_the_builtin_model_never_merges_notes_that_differ(writer: MemoryWriter) -> None:
    await add_note(writer, "a", "Use example_orders for the report.", 0)
    await add_note(writer, "b", "Do not use example_orders for the report.", 1)
    await add_note(writer, "c", "Use example_orders for the weekly report.", 2)
    run = await Consolidator(writer, Model(), model_name="builtin-offline").run(ALICE)
    assert run.model_calls == 1 and run.merged == []
    assert len(await writer.store.live_notes()) == 3


async def test_five_hundred_notes_take_at_most_six_calls_of_forty(writer: MemoryWriter) -> None:
    await fill(writer, 500, dup_every=10)
    model = Model(NO_MERGES)
    consolidator = Consolidator(writer, model, model_name="m")
    run = await consolidator.run(CRON)
    assert run.model_calls == len(model.batches) == 6
    assert all(2 <= len(b) <= 40 for b in model.batches)
    assert run.shown == sum(len(b) for b in model.batches) and run.waiting > 0
    # No record is shown twice in one run.
    shown = [rid for b in model.batches for rid in b]
    assert len(shown) == len(set(shown))


async def test_the_looked_at_cache_skips_batches_until_a_new_record_joins(writer: MemoryWriter) -> None:
    await add_note(writer, "vpn", "The VPN lives on vpn.example.internal", 0)
    await add_note(writer, "vpn backup", "The backup VPN lives on vpn2.example.internal", 1)
    model = Model(NO_MERGES)
    consolidator = Consolidator(writer, model, model_name="m")
    first = await consolidator.run(CRON)
    assert first.model_calls == 1
    second = await consolidator.run(CRON)
    assert second.model_calls == 0 and second.skipped_looked_at == 2
    new = await add_note(writer, "vpn again", "The VPN lives on vpn.example.internal, port 443", 2)
    third = await consolidator.run(CRON)
    assert third.model_calls == 1 and new in model.batches[-1] and len(model.batches[-1]) == 3
    # A restart forgets what was looked at.
    consolidator.forget()
    assert (await consolidator.run(CRON)).model_calls == 1


async def test_the_cache_lets_later_runs_reach_the_rest(writer: MemoryWriter) -> None:
    await fill(writer, 500, dup_every=10)
    model = Model(NO_MERGES)
    consolidator = Consolidator(writer, model, model_name="m")
    seen: set[str] = set()
    for _ in range(10):
        run = await consolidator.run(CRON)
        new = {rid for b in model.batches[-run.model_calls :] for rid in b} if run.model_calls else set()
        assert not (new & seen)  # what was looked at is not shown again
        seen |= new
        if run.model_calls == 0:
            break
    assert run.model_calls == 0 and run.waiting == 0


async def test_the_builtin_model_merges_the_duplicates_of_a_large_store(writer: MemoryWriter) -> None:
    await fill(writer, 200, dup_every=10)
    consolidator = Consolidator(writer, Model(), model_name="builtin-offline")
    merged = 0
    for _ in range(10):
        run = await consolidator.run(CRON)
        merged += len(run.merged)
        if run.model_calls == 0:
            break
    assert merged == 20
    assert len(await writer.store.live_notes(limit=1000)) == 200 - 20


@pytest.mark.parametrize(
    "answer",
    [
        "not json",
        '{"merge": []}',
        '{"merges": {"record_ids": []}}',
        ConnectionError("model server unreachable"),
    ],
    ids=["not-json", "wrong-key", "not-a-list", "model-down"],
)
async def test_a_malformed_or_failed_answer_merges_nothing(writer: MemoryWriter, answer: Any) -> None:
    await add_note(writer, "vpn", "The VPN lives on vpn.example.internal.", 0)
    await add_note(writer, "vpn host", "the VPN lives on vpn.example.internal", 1)
    consolidator = Consolidator(writer, Model(answer), model_name="m")
    run = await consolidator.run(CRON)
    assert run.merged == [] and run.failed_calls == 1 and run.failed
    assert len(await writer.store.live_notes()) == 2
    assert await writer.store.list_revisions() == []
    # A failed call is tried again next run: its records were not looked at.
    assert consolidator.looked_at == frozenset()


async def test_a_hostile_model_naming_records_it_was_not_shown_merges_nothing(writer: MemoryWriter) -> None:
    a = await add_note(writer, "vpn", "The VPN lives on vpn.example.internal.", 0)
    b = await add_note(writer, "vpn host", "the VPN lives on vpn.example.internal", 1)
    hidden = await add_note(writer, "lunch", "Lunch is at noon", 2)

    def hostile(shown: list[dict[str, str]]) -> dict[str, Any]:
        ids = [r["id"] for r in shown]
        return {
            "merges": [
                {"record_ids": [*ids, hidden], "subject": "x", "content": "merged", "reason": "r"},
                {"record_ids": [ids[0], "m_madeup"], "subject": "x", "content": "merged", "reason": "r"},
                {"record_ids": [ids[0]], "subject": "x", "content": "alone", "reason": "r"},
            ]
        }

    model = Model(hostile)
    run = await Consolidator(writer, model, model_name="m").run(CRON)
    assert hidden not in model.batches[0]
    assert run.merged == [] and len(run.ignored) == 3
    assert sorted(r.id for r in await writer.store.live_notes()) == sorted([a, b, hidden])


async def test_an_undone_merge_is_never_merged_again(writer: MemoryWriter) -> None:
    a = await add_note(writer, "vpn", "The VPN lives on vpn.example.internal.", 0)
    b = await add_note(writer, "vpn host", "the VPN lives on vpn.example.internal", 1)
    consolidator = Consolidator(writer, Model(), model_name="builtin-offline")
    run = await consolidator.run(ALICE)
    ((merged, _),) = run.merged
    done = await undo_revision_run(writer.store, run.run_id, principal=ALICE)
    assert sorted(r.id for r in done.restored) == sorted([a, b])
    # The merged record is left in place; the sources are back.
    assert sorted(r.id for r in await writer.store.live_notes()) == sorted([a, b, merged])
    consolidator.forget()
    again = await consolidator.run(ALICE)
    assert again.merged == []
    assert len(await writer.store.live_notes()) == 3


async def test_only_admins_and_system_runs_consolidate(writer: MemoryWriter) -> None:
    await add_note(writer, "vpn", "The VPN lives on vpn.example.internal.", 0)
    await add_note(writer, "vpn host", "the VPN lives on vpn.example.internal", 1)
    model = Model()
    run = await Consolidator(writer, model, model_name="m").run(BOB)
    assert run.refused and "administrator" in run.refused and model.batches == []
    assert len(await writer.store.live_notes()) == 2


async def test_a_merge_keeps_a_subject_of_its_sources(writer: MemoryWriter) -> None:
    # On any other subject the subject rule would retire a note nobody looked at.
    other = await add_note(writer, "report data source", "example_orders", 0)
    a = await add_note(writer, "vpn", "The VPN lives on vpn.example.internal.", 1)
    b = await add_note(writer, "vpn host", "the VPN lives on vpn.example.internal", 2)

    def sly(shown: list[dict[str, str]]) -> dict[str, Any]:
        return {"merges": [{"record_ids": [a, b], "subject": "report data source", "content": "VPN", "reason": "r"}]}

    run = await Consolidator(writer, Model(sly), model_name="m").run(CRON)
    ((merged, _),) = run.merged
    rec = await writer.store.get(merged)
    assert rec and rec.subject == "vpn host"
    assert (await writer.store.get(other)).status == "live"  # type: ignore[union-attr]


def test_clusters_put_notes_that_share_words_together() -> None:
    def view(rid: str, content: str) -> MemoryRecordView:
        return MemoryRecordView(
            rid, "agent_notes", None, rid, rid, content, "live", T0, T0, None, "live", None, None, None, (), None, None
        )

    notes = [
        view("a", "The VPN lives on vpn.example.internal"),
        view("b", "Lunch is served at noon in the canteen"),
        view("c", "the VPN lives on vpn.example.internal."),
        view("d", "Payroll closes on the 25th of each month"),
        view("e", "Lunch is served at noon in the canteen on Fridays"),
    ]
    clusters = cluster_by_words(notes)
    assert [sorted(r.id for r in c) for c in clusters] == [["a", "c"], ["b", "e"]]
    assert [len(b) for b in pack(clusters, batch_size=3)] == [2, 2]
    assert [len(b) for b in pack(clusters, batch_size=40)] == [4]


async def test_a_run_reads_only_the_ids_of_a_settled_store_and_only_new_notes_and_their_group_after(
    writer: MemoryWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The automatic distillation, every 5 minutes, reads what changed, not every note again.

    Over a settled store a run reads the notes' ids only. After a note is said (here the repeat
    of another), it reads that note and the notes grouped with it, and merges them.
    """
    first_id = ""
    for i in range(40):  # no two share a word: nothing to merge
        nid = await add_note(writer, f"topic {i}", " ".join(f"w{i}x{j}" for j in range(6)) + ".", i)
        first_id = first_id or nid
    store = writer.store
    reads: list[int] = []
    whole, by_id = store.live_notes, store.records_by_id

    async def all_read(**kw: Any) -> list[MemoryRecordView]:
        found = await whole(**kw)
        reads.append(len(found))
        return found

    async def some_read(ids: Any) -> list[MemoryRecordView]:
        found = await by_id(ids)
        reads.append(len(found))
        return found

    monkeypatch.setattr(store, "live_notes", all_read)
    monkeypatch.setattr(store, "records_by_id", some_read)
    model = Model()  # the builtin: it merges only notes that say the same
    consolidator = Consolidator(writer, model, model_name="m")
    first = await consolidator.run(CRON)
    assert (first.model_calls, reads) == (0, [40])  # a first run reads every note once
    for _ in range(3):
        assert (await consolidator.run(CRON)).model_calls == 0
    assert reads == [40]  # the settled runs read the notes' ids, not the notes

    again = await add_note(writer, "topic 0 again", "W0X0 w0x1 w0x2 w0x3 w0x4 w0x5!", 50)
    merged = await consolidator.run(CRON)
    assert reads == [40, 1, 1]  # the new note, then the one it is grouped with
    assert merged.model_calls == 1 and len(merged.merged) == 1
    assert set(merged.merged[0][1]) == {first_id, again}
    assert len(await whole()) == 40  # 39 untouched and the merged note
    fresh = Consolidator(writer, Model(), model_name="m")
    assert (await fresh.run(CRON)).model_calls == 0  # a restart's full read finds nothing more to merge
