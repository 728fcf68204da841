"""Belief revision: does a record replace related older records, or do later records replace it?

policy: "The subject rules and belief revision replace the older value with the
newer by that time [when it was said] ... Belief revision weighs such a record
both ways: against earlier records it may replace, and against later records
that may replace it."

For one live record, :class:`BeliefReviser`:

1. applies the subject rule again (same normalised subject, by ``said_at``);
2. picks at most ``max_candidates`` (10) related live records of the same scope
   (and owner, for personal memory): same subject first, then the most words
   shared (agent_notes through the ``memory_terms`` index);
3. asks the judge (a model seam like ``ExtractorModel``: ``(system, user) ->
   raw JSON``, schema :data:`REVISION_SCHEMA` named ``revision_judgement``)
   which of them the record replaces, and which replace it;
4. retires what the judge says, in one transaction, but only in the direction
   ``said_at`` allows (older replaced by newer, never by write order), with a
   ``memory_revisions`` row naming the judge's model and prompt version.

The judge is trusted for nothing it was not asked: a malformed answer retires
nothing; a decision naming a record it was not shown, or pointing against time,
is ignored and logged. An ``unverified`` record is never revised (it retires
nothing); an undone pair is never retired again (the store's veto).

Where it is triggered: after a live write (cause ``live``), for each record a
relearn wrote live (``relearn``), on confirm from review (``confirm``), and on
demand (``revise``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgspec import Struct, field
from sqlalchemy import select

from memory.models import MemoryRecord
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError, new_run_id, note_terms
from memory.types import ExtractorModel

log = logging.getLogger(__name__)

REVISION_SCHEMA_NAME = "revision_judgement"
JUDGE_PROMPT_VERSION = "judge-v1"
MAX_CANDIDATES = 10
RELATIONS: tuple[str, ...] = ("replaces", "replaced_by", "unrelated")
MAX_REASON_CHARS = 500

JudgeModel = ExtractorModel
"""The judge: (system prompt, user content) -> raw JSON text of :data:`REVISION_SCHEMA`."""

REVISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decisions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "record_id": {"type": "string"},
                    "relation": {"type": "string", "enum": list(RELATIONS)},
                    "reason": {"type": "string"},
                },
                "required": ["record_id", "relation", "reason"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["decisions"],
    "additionalProperties": False,
}
"""The judge's output shape, for OpenAI ``response_format`` json_schema named ``revision_judgement``."""

JUDGE_PROMPT = """\
You keep an AI agent's memory consistent over time. You are shown ONE record (the "record") and a \
few related records (the "candidates"), each with the time it was said (said_at, UTC). Decide, for \
each candidate, how it relates to the record:

- "replaces": the record replaces the candidate. They are about the same thing and the record, said \
later, gives a new value for it (e.g. the candidate says the report comes from example_orders, the \
record says to use example_archive instead of example_orders).
- "replaced_by": the candidate replaces the record. They are about the same thing and the candidate, \
said later, gives a new value for it.
- "unrelated": anything else: different topics, facts that can both be true, or you are not sure.

The newer value wins by said_at, never by the order records were written in. Only a later record can \
replace an earlier one. When in doubt, answer "unrelated": replacing a record takes it out of the \
agent's memory.

Give one decision per candidate, naming it by its id exactly as shown. Answer with JSON only, \
exactly of this shape:
{"decisions": [{"record_id": "...", "relation": "replaces|replaced_by|unrelated", "reason": "..."}]}
"""

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*)\n\s*```\s*$", re.DOTALL | re.IGNORECASE)


class MalformedJudgement(Exception):
    """The judge's answer is not the JSON shape asked for: nothing is retired."""

    def __init__(self, raw: str, problem: str) -> None:
        self.raw = raw
        self.problem = problem
        super().__init__(f"malformed judgement ({problem}): {raw[:200]!r}")


class Judgement(Struct, frozen=True):
    """One of the judge's decisions about a candidate it was shown."""

    record_id: str
    relation: str
    reason: str


def load_json_answer(raw: str) -> Any:
    """The JSON value of a model's answer (alone or in one markdown code fence).

    Raises:
        ValueError: not JSON.
    """
    text = raw.strip() if isinstance(raw, str) else ""
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group("body")
    return json.loads(text)


def parse_judgement(raw: str, shown: Iterable[str]) -> tuple[list[Judgement], list[str]]:
    """Validate the judge's answer against the candidates it was shown.

    Returns:
        The usable decisions (at most one per shown candidate), and a list of
        problems with the decisions that were ignored (unknown record, bad
        relation, missing fields, repeats).

    Raises:
        MalformedJudgement: not JSON, or not ``{"decisions": [...]}``.
    """
    try:
        data = load_json_answer(raw)
    except (ValueError, TypeError):
        raise MalformedJudgement(str(raw), "not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("decisions"), list):
        raise MalformedJudgement(str(raw), 'not an object with a "decisions" list')
    allowed = set(shown)
    seen: set[str] = set()
    out: list[Judgement] = []
    problems: list[str] = []
    for n, entry in enumerate(data["decisions"]):
        if not isinstance(entry, dict):
            problems.append(f"decision {n} is not an object")
            continue
        rid, relation, reason = entry.get("record_id"), entry.get("relation"), entry.get("reason", "")
        if not isinstance(rid, str) or not isinstance(relation, str):
            problems.append(f"decision {n} needs string record_id and relation")
            continue
        if rid not in allowed:
            # A judge naming a record it was not shown is ignored: it may only speak of what it saw.
            problems.append(f"decision {n} names {rid!r}, which the judge was not shown")
            continue
        if relation not in RELATIONS:
            problems.append(f"decision {n} has unknown relation {relation!r}")
            continue
        if rid in seen:
            problems.append(f"decision {n} repeats {rid}")
            continue
        seen.add(rid)
        out.append(Judgement(rid, relation, str(reason)[:MAX_REASON_CHARS] if isinstance(reason, str) else ""))
    return out, problems


def _shown(record: MemoryRecordView) -> dict[str, str]:
    return {
        "id": record.id,
        "subject": record.subject,
        "content": record.content,
        "said_at": record.said_at.isoformat(),
    }


def judge_input(record: MemoryRecordView, candidates: Sequence[MemoryRecordView]) -> str:
    """The judge's user content: the record and its candidates as JSON (``builtin_revision_judgement`` reads it)."""
    return json.dumps(
        {"record": _shown(record), "candidates": [_shown(c) for c in candidates]}, ensure_ascii=False, indent=1
    )


class RevisionOutcome(Struct):
    """What belief revision did for one record."""

    record_id: str
    run_id: str
    cause: str
    candidates: int = 0
    model_calls: int = 0
    failed: bool = False
    """The judge could not be asked, or its answer was malformed: nothing was retired by it."""
    retired: list[str] = field(default_factory=list)
    """Records this one replaced (subject rule or judge)."""
    replaced_by: str | None = None
    """The later record that replaced this one (it is history now)."""
    ignored: list[str] = field(default_factory=list)
    """Why decisions of the judge were not applied."""
    skipped: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "record_id": self.record_id,
            "run_id": self.run_id,
            "cause": self.cause,
            "candidates": self.candidates,
            "model_calls": self.model_calls,
            "failed": self.failed,
            "retired": list(self.retired),
            "replaced_by": self.replaced_by,
            "ignored": list(self.ignored),
            "skipped": self.skipped,
        }


class BeliefReviser:
    """Revises live records against related ones: the subject rule, then the judge.

    Args:
        store: The memory store.
        judge: The judge model seam (``revision_judgement``).
        judge_model: The judge's model name, recorded on each revision row.
        prompt_version: The judge prompt's version, recorded on each revision row.
        max_candidates: Related records shown to the judge per call (at most).
    """

    def __init__(
        self,
        store: MemoryStore,
        judge: JudgeModel,
        *,
        judge_model: str,
        prompt_version: str = JUDGE_PROMPT_VERSION,
        max_candidates: int = MAX_CANDIDATES,
    ) -> None:
        self.store = store
        self.judge = judge
        self.judge_model = judge_model
        self.prompt_version = prompt_version
        self.max_candidates = max(1, max_candidates)

    async def candidates(self, record: MemoryRecordView) -> list[MemoryRecordView]:
        """Related live records of the same scope (and owner): same subject first, then words shared."""
        words = note_terms(record.subject, record.content)
        wanted = set(words)
        scored: list[tuple[MemoryRecordView, int]]
        if record.scope == "agent_notes":
            scored = await self.store.notes_sharing_words(words, exclude_id=record.id, limit=self.max_candidates * 5)
            same = await self.store.live_on_subject("agent_notes", record.subject_key)
            known = {v.id for v, _ in scored}
            scored += [(v, 0) for v in same if v.subject_key == record.subject_key and v.id not in known]
        elif record.scope == "personal" and record.owner_user_id:
            mine = await self.store.personal_for(record.owner_user_id)
            scored = [(v, len(wanted & set(note_terms(v.subject, v.content)))) for v in mine]
        else:
            # Identity (global, agent_config) changes only by an admin's decision, never by a judge.
            return []
        related = [
            (v, n)
            for v, n in scored
            if v.id != record.id and v.status == "live" and (n > 0 or v.subject_key == record.subject_key)
        ]
        related.sort(key=lambda p: (p[0].subject_key != record.subject_key, -p[1], -p[0].said_at.timestamp(), p[0].id))
        return [v for v, _ in related[: self.max_candidates]]

    async def revise(
        self, record_id: str, *, cause: str, run_id: str | None = None, written: MemoryRecordView | None = None
    ) -> RevisionOutcome:
        """Revise one record: the subject rule again, then the judge over its related records.

        Args:
            record_id: The record (it must be live; anything else is skipped).
            cause: ``live``, ``relearn``, ``confirm`` or ``revise``: recorded on each revision row.
            run_id: The run the revision rows belong to (a fresh one by default).
            written: The record as the write that just committed it returned it. That write
                applied the subject rule in its own transaction (under the subject's lock on
                PostgreSQL), so the rule is not applied again nor the record read back; a
                later writer on the subject applies the rule itself. The judge's retirements
                still check, in their own transaction, that the record is live.
        """
        run = run_id or new_run_id("br")
        out = RevisionOutcome(record_id, run, cause)
        record = written if written is not None and written.id == record_id else None
        if record is None:
            record = await self._after_subject_rule(record_id, cause, run, out)
        elif record.status != "live":
            out.skipped = f"the record is {record.status}, not live"
            return out
        if record is None:
            return out
        shown = await self.candidates(record)
        out.candidates = len(shown)
        if not shown:
            return out
        try:
            raw = await self.judge(JUDGE_PROMPT, judge_input(record, shown))
            out.model_calls += 1
            decisions, problems = parse_judgement(raw, (c.id for c in shown))
        except MalformedJudgement as exc:
            log.warning("belief revision of %s: %s; nothing retired", record_id, exc)
            out.failed = True
            out.ignored.append(str(exc))
            return out
        except Exception as exc:  # the judge is a network call: its failure retires nothing
            log.warning("belief revision of %s: the judge failed (%s); nothing retired", record_id, exc)
            out.failed = True
            out.model_calls += 1
            return out
        for problem in problems:
            log.warning("belief revision of %s: ignored %s", record_id, problem)
        out.ignored.extend(problems)
        await self._apply(record, {c.id: c for c in shown}, decisions, out)
        return out

    async def _after_subject_rule(
        self, record_id: str, cause: str, run: str, out: RevisionOutcome
    ) -> MemoryRecordView | None:
        """The record read, the subject rule applied to it again, and read again; None (with why) if not live."""
        record = await self.store.get(record_id)
        if record is None:
            out.skipped = "no such record"
            return None
        if record.status != "live":
            # policy: "An unverified record retires nothing; confirming it queues belief revision."
            out.skipped = f"the record is {record.status}, not live"
            return None
        out.retired.extend(await self.store.apply_subject_rule(record_id, cause=cause, run_id=run))
        record = await self.store.get(record_id)
        if record is None or record.status != "live":
            out.replaced_by = record.superseded_by if record else None
            out.skipped = "the subject rule made it history"
            return None
        return record

    async def revise_many(
        self, record_ids: Iterable[str], *, cause: str, run_id: str | None = None
    ) -> list[RevisionOutcome]:
        """Revise several records one after another, under one run id."""
        run = run_id or new_run_id("br")
        return [await self.revise(rid, cause=cause, run_id=run) for rid in dict.fromkeys(record_ids)]

    async def _apply(
        self,
        record: MemoryRecordView,
        shown: Mapping[str, MemoryRecordView],
        decisions: Sequence[Judgement],
        out: RevisionOutcome,
    ) -> None:
        later: list[tuple[MemoryRecordView, Judgement]] = []
        earlier: list[tuple[MemoryRecordView, Judgement]] = []
        for d in decisions:
            other = shown[d.record_id]
            if d.relation == "replaced_by":
                if other.said_at < record.said_at:
                    # policy: the newer replaces the older "by that time", never the other way.
                    out.ignored.append(f"{other.id} cannot replace {record.id}: it was said earlier")
                    continue
                later.append((other, d))
            elif d.relation == "replaces":
                if other.said_at > record.said_at:
                    out.ignored.append(f"{record.id} cannot replace {other.id}: it was said earlier")
                    continue
                earlier.append((other, d))
        for problem in out.ignored:
            if "cannot replace" in problem:
                log.warning("belief revision of %s: ignored: %s", record.id, problem)
        if not later and not earlier:
            return
        common: dict[str, Any] = {
            "via": "belief_revision",
            "cause": out.cause,
            "run_id": out.run_id,
            "judge_model": self.judge_model,
            "prompt_version": self.prompt_version,
        }
        async with self.store.transaction() as s:
            # Decided on what was read before the judge's call: the record must still be live.
            now_status = (await s.execute(select(MemoryRecord.status).where(MemoryRecord.id == record.id))).scalar()
            if now_status != "live":
                out.skipped = f"the record became {now_status} while the judge was asked"
                return
            # Newest first: the record becomes history under the latest value that replaces it.
            for other, d in sorted(later, key=lambda p: (p[0].said_at, p[0].id), reverse=True):
                if await self.store.retire_superseded(
                    record.id, other.id, reason=f"judge: {d.reason or 'replaced by a later record'}", session=s,
                    **common,
                ):  # fmt: skip
                    out.replaced_by = other.id
                    # History retires nothing: an older record does not replace anything once it is replaced.
                    return
            for other, d in earlier:
                try:
                    done = await self.store.retire_superseded(
                        other.id, record.id, reason=f"judge: {d.reason or 'replaced by a later record'}", session=s,
                        **common,
                    )  # fmt: skip
                except MemoryStoreError as exc:  # pragma: no cover - values are validated above
                    out.ignored.append(str(exc))
                    continue
                if done:
                    out.retired.append(other.id)
