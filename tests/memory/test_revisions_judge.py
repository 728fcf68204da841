"""Belief revision: the judge weighs a record both ways; it is trusted for nothing it was not asked.

Scripted judges and the builtin one, on real SQLite and real PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from memory.belief_revision import (
    JUDGE_PROMPT_VERSION,
    REVISION_SCHEMA,
    REVISION_SCHEMA_NAME,
    BeliefReviser,
    MalformedJudgement,
    parse_judgement,
)
from memory.rules import builtin_revision_judgement
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from tests.memory.conftest import ALICE, BOB, T0

DAY = timedelta(days=1)


class ScriptedJudge:
    """Answers what the test says; records what it was shown."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, system: str, user: str) -> str:
        shown = json.loads(user)
        self.calls.append(shown)
        answer = self.answer(shown) if callable(self.answer) else self.answer
        return answer if isinstance(answer, str) else json.dumps(answer)


def every(relation: str) -> Any:
    """A judge answer giving ``relation`` for every candidate shown."""
    return lambda shown: {
        "decisions": [{"record_id": c["id"], "relation": relation, "reason": "scripted"} for c in shown["candidates"]]
    }


async def builtin_judge(system: str, user: str) -> str:
    return builtin_revision_judgement(system, user)


async def note(writer: MemoryWriter, subject: str, content: str, said_at: Any, **kw: Any) -> str:
    res = await writer.write(ALICE, "agent_notes", "live", subject=subject, content=content, said_at=said_at, **kw)
    assert res.record
    return res.record.id


async def status(store: MemoryStore, rid: str) -> str:
    rec = await store.get(rid)
    assert rec
    return rec.status


def test_the_judge_schema_is_named_and_strict() -> None:
    assert REVISION_SCHEMA_NAME == "revision_judgement"
    item = REVISION_SCHEMA["properties"]["decisions"]["items"]
    assert item["properties"]["relation"]["enum"] == ["replaces", "replaced_by", "unrelated"]
    assert item["additionalProperties"] is False


async def test_a_judged_replacement_records_the_judge_model_and_prompt_version(writer: MemoryWriter) -> None:
    old = await note(writer, "daily report", "The daily report reads example_orders", T0)
    new = await note(writer, "report tables", "Use example_archive for the daily report", T0 + DAY)
    judge = ScriptedJudge(every("replaces"))
    outcome = await BeliefReviser(writer.store, judge, judge_model="gpt-test").revise(new, cause="live", run_id="br_1")
    assert outcome.retired == [old] and outcome.model_calls == 1
    assert await status(writer.store, old) == "superseded"
    (rev,) = await writer.store.revisions_for(old)
    assert (rev.replacing_id, rev.via, rev.cause, rev.run_id) == (new, "belief_revision", "live", "br_1")
    assert (rev.judge_model, rev.prompt_version) == ("gpt-test", JUDGE_PROMPT_VERSION)


async def test_a_record_dated_in_the_past_is_replaced_by_a_later_one(writer: MemoryWriter) -> None:
    later = await note(writer, "report tables", "Use example_archive for the daily report", T0 + DAY)
    past = await note(writer, "daily report", "The daily report reads example_orders", T0 - DAY)
    judge = ScriptedJudge(every("replaced_by"))
    outcome = await BeliefReviser(writer.store, judge, judge_model="m").revise(past, cause="relearn")
    assert outcome.replaced_by == later and outcome.retired == []
    assert await status(writer.store, past) == "superseded"
    assert await status(writer.store, later) == "live"


async def test_the_judge_cannot_turn_time_around(writer: MemoryWriter) -> None:
    older = await note(writer, "daily report", "The daily report reads example_orders", T0)
    newer = await note(writer, "report tables", "Use example_archive for the daily report", T0 + DAY)
    # It says the older record replaces the newer one: against said_at, ignored.
    outcome = await BeliefReviser(writer.store, ScriptedJudge(every("replaces")), judge_model="m").revise(
        older, cause="revise"
    )
    assert outcome.retired == [] and any("said earlier" in p for p in outcome.ignored)
    assert await status(writer.store, newer) == "live" and await status(writer.store, older) == "live"


@pytest.mark.parametrize(
    "answer",
    [
        "not json at all",
        '{"decision": []}',
        '{"decisions": "replaces everything"}',
        "[]",
        '{"decisions": [{"record_id": 7, "relation": "replaces"}]}',
        '{"decisions": [{"relation": "replaces", "reason": "no id"}]}',
    ],
)
async def test_a_malformed_judgement_retires_nothing(writer: MemoryWriter, answer: str) -> None:
    older = await note(writer, "daily report", "The daily report reads example_orders", T0)
    newer = await note(writer, "report tables", "Use example_archive for the daily report", T0 + DAY)
    outcome = await BeliefReviser(writer.store, ScriptedJudge(answer), judge_model="m").revise(newer, cause="live")
    assert outcome.retired == []
    assert await status(writer.store, older) == "live"
    assert await writer.store.revisions_for(older) == []


async def test_a_hostile_judge_naming_records_it_was_not_shown_retires_nothing(writer: MemoryWriter) -> None:
    unrelated = await note(writer, "lunch", "Lunch is served at noon in the canteen", T0)
    older = await note(writer, "daily report", "The daily report reads example_orders", T0)
    newer = await note(writer, "report tables", "Use example_archive for the daily report", T0 + DAY)
    hostile = ScriptedJudge(
        {
            "decisions": [
                {"record_id": unrelated, "relation": "replaces", "reason": "I saw it somewhere"},
                {"record_id": newer, "relation": "replaced_by", "reason": "itself"},
                {"record_id": "m_doesnotexist", "relation": "replaces", "reason": "made up"},
            ]
        }
    )
    outcome = await BeliefReviser(writer.store, hostile, judge_model="m").revise(newer, cause="live")
    shown = [c["id"] for c in hostile.calls[0]["candidates"]]
    assert unrelated not in shown and older in shown
    assert outcome.retired == [] and outcome.replaced_by is None
    assert len([p for p in outcome.ignored if "was not shown" in p]) == 3
    for rid in (unrelated, older, newer):
        assert await status(writer.store, rid) == "live"


async def test_a_failing_judge_retires_nothing(writer: MemoryWriter) -> None:
    older = await note(writer, "daily report", "The daily report reads example_orders", T0)
    newer = await note(writer, "report tables", "Use example_archive for the daily report", T0 + DAY)

    async def down(system: str, user: str) -> str:
        raise ConnectionError("model server unreachable")

    outcome = await BeliefReviser(writer.store, down, judge_model="m").revise(newer, cause="live")
    assert outcome.failed and outcome.retired == []
    assert await status(writer.store, older) == "live"


async def test_candidates_are_bounded_and_same_subject_first(writer: MemoryWriter) -> None:
    for n in range(25):
        await note(
            writer, f"report part {n}", f"The daily report part {n} reads example_orders", T0 + timedelta(minutes=n)
        )
    target = await note(writer, "report tables", "The daily report reads example_archive", T0 + DAY)
    judge = ScriptedJudge(every("unrelated"))
    outcome = await BeliefReviser(writer.store, judge, judge_model="m").revise(target, cause="live")
    assert outcome.candidates == 10 and len(judge.calls[0]["candidates"]) == 10
    assert all(c["id"] != target for c in judge.calls[0]["candidates"])


async def test_no_related_records_means_no_model_call(writer: MemoryWriter) -> None:
    await note(writer, "vpn host", "The VPN lives on vpn.example.internal", T0)
    lonely = await note(writer, "lunch", "Lunch is at noon", T0 + DAY)
    judge = ScriptedJudge(every("replaces"))
    outcome = await BeliefReviser(writer.store, judge, judge_model="m").revise(lonely, cause="live")
    assert judge.calls == [] and outcome.model_calls == 0


async def test_an_unverified_record_is_not_revised_and_retires_nothing(writer: MemoryWriter) -> None:
    older = await note(writer, "daily report", "The daily report reads example_orders", T0)
    q = await writer.write(
        BOB, "agent_notes", "relearn", subject="report tables", content="Use example_archive instead of example_orders",
        said_at=T0 + DAY,
    )  # fmt: skip
    assert q.record and q.record.status == "unverified"
    judge = ScriptedJudge(every("replaces"))
    outcome = await BeliefReviser(writer.store, judge, judge_model="m").revise(q.record.id, cause="relearn")
    assert outcome.skipped and judge.calls == []
    assert await status(writer.store, older) == "live"


async def test_personal_candidates_are_the_owners_only(writer: MemoryWriter) -> None:
    mine = await writer.write(
        ALICE, "personal", "live", subject="reply style", content="Prefers short answers", said_at=T0
    )
    bobs = await writer.write(
        BOB, "personal", "live", subject="reply style", content="Prefers short answers", said_at=T0
    )
    new = await writer.write(
        ALICE, "personal", "live", subject="answer format", content="Prefers short answers in bullets", said_at=T0 + DAY
    )
    assert mine.record and bobs.record and new.record
    judge = ScriptedJudge(every("unrelated"))
    await BeliefReviser(writer.store, judge, judge_model="m").revise(new.record.id, cause="live")
    assert [c["id"] for c in judge.calls[0]["candidates"]] == [mine.record.id]


# ---- the builtin judge --------------------------------------------------------------------


async def test_builtin_judge_replaces_on_an_instead_of_naming_the_old_value(writer: MemoryWriter) -> None:
    old = await note(writer, "report data source", "The report is produced from example_orders", T0)
    other = await note(writer, "report owner", "The report is owned by the finance team", T0)
    new = await note(writer, "standing rule", "Use example_archive instead of example_orders for the report", T0 + DAY)
    outcome = await BeliefReviser(writer.store, builtin_judge, judge_model="builtin-offline").revise(new, cause="live")
    assert outcome.retired == [old]
    assert await status(writer.store, other) == "live"


async def test_builtin_judge_weighs_a_past_record_against_a_later_no_longer(writer: MemoryWriter) -> None:
    later = await note(writer, "standing rule", "We no longer use example_orders", T0 + DAY)
    past = await note(writer, "report data source", "The report is produced from example_orders", T0)
    outcome = await BeliefReviser(writer.store, builtin_judge, judge_model="builtin-offline").revise(
        past, cause="relearn"
    )
    assert outcome.replaced_by == later
    assert await status(writer.store, past) == "superseded"


def test_builtin_judge_is_conservative() -> None:
    def ask(record: dict[str, str], *cands: dict[str, str]) -> list[str]:
        raw = builtin_revision_judgement("", json.dumps({"record": record, "candidates": list(cands)}))
        return [d["relation"] for d in json.loads(raw)["decisions"]]

    r = {
        "id": "r",
        "subject": "report tables",
        "content": "Use example_archive",
        "said_at": "2026-11-02T00:00:00+00:00",
    }
    same_subject = {"id": "a", "subject": "Report-tables", "content": "x", "said_at": "2026-11-01T00:00:00+00:00"}
    related = {
        "id": "b",
        "subject": "daily report",
        "content": "reads example_orders",
        "said_at": "2026-11-01T00:00:00+00:00",
    }
    later = {"id": "c", "subject": "Report tables", "content": "y", "said_at": "2026-11-03T00:00:00+00:00"}
    assert ask(r, same_subject, related, later) == ["replaces", "unrelated", "replaced_by"]
    # "instead of" naming something the older one does not say: unrelated.
    r2 = {**r, "content": "Use example_archive instead of the old export"}
    assert ask(r2, related) == ["unrelated"]
    assert json.loads(builtin_revision_judgement("", "garbage")) == {"decisions": []}


def test_parse_judgement_keeps_one_decision_per_shown_record() -> None:
    raw = (
        "```json\n"
        + json.dumps(
            {
                "decisions": [
                    {"record_id": "a", "relation": "replaces", "reason": "x"},
                    {"record_id": "a", "relation": "unrelated", "reason": "again"},
                    {"record_id": "b", "relation": "supersedes", "reason": "bad relation"},
                    {"record_id": "z", "relation": "replaces", "reason": "not shown"},
                ]
            }
        )
        + "\n```"
    )
    decisions, problems = parse_judgement(raw, ["a", "b"])
    assert [(d.record_id, d.relation) for d in decisions] == [("a", "replaces")]
    assert len(problems) == 3
    with pytest.raises(MalformedJudgement):
        parse_judgement("nope", ["a"])
