"""Consolidation: merge live operational notes that say the same thing into one.

policy: "Consolidation (the nightly job, ``notes_distill`` and the automatic
distillation) merges live records that say the same thing into one, and
retires each source as superseded by the merged record, under one run. The
model is shown at most 40 records a call, records that share their words
together, and a run makes at most six calls; the rest wait for the next run.
Records it has looked at without finding a repeat are not shown again while
the gateway runs, unless a record new to it joins their batch."

How a run goes (:meth:`Consolidator.run`):

1. the current live agent_notes are read; a note an admin has un-merged before
   (an undone consolidation retirement) is never merged again;
2. they are clustered by the words they share (:func:`cluster_by_words`):
   identical notes together, then notes whose words overlap most; a note that
   shares no rare word with any other is not shown at all;
3. clusters whose every note was looked at before without a repeat are
   skipped (the in-memory looked-at cache, kept for the process's life);
4. the rest are packed into batches of at most ``batch_size`` (40), whole
   clusters together, and at most ``max_calls`` (6) batches are shown;
5. each merge the model proposes is checked (only records it was shown, at
   least two, none twice, no vetoed pair) and written through the write gate
   (source ``consolidate``) as one new record that retires its sources, with
   the run id, the model's name and the prompt version on each revision row;
6. before that, the merged text must be grounded in its sources
   (:func:`memory.grounding.ungrounded`): every identifier and every content
   word of it appears in at least one source. A merge that says anything its
   sources do not is refused: nothing is written, nothing is retired, and the
   run's report lists it (``ungrounded``).

A malformed answer, or a merge naming a record the model was not shown, is
ignored and logged; nothing is retired for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgspec import Struct, field

from memory.belief_revision import load_json_answer
from memory.grounding import ungrounded
from memory.rules import same_note_key
from memory.store import MemoryRecordView, MemoryStoreError, Merge, new_run_id, note_terms
from memory.types import ExtractorModel
from memory.words import subject_key
from memory.writer import MemoryWriter
from pairing.principal import Principal

log = logging.getLogger(__name__)

CONSOLIDATION_SCHEMA_NAME = "consolidation_result"
CONSOLIDATION_PROMPT_VERSION = "consolidate-v1"
BATCH_SIZE = 40
MAX_CALLS = 6
MAX_MERGED_CHARS = 2000
MAX_EVIDENCE = 50
# A note's three rarest words (each shared by at most this many notes) find its likely repeats.
_RARE_WORDS = 3
_MAX_DF = 2 * BATCH_SIZE
_MIN_OVERLAP = 0.3

ConsolidationModel = ExtractorModel
"""The consolidation model: (system prompt, user content) -> raw JSON text of :data:`CONSOLIDATION_SCHEMA`."""

CONSOLIDATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "merges": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "record_ids": {"type": "array", "items": {"type": "string"}},
                    "subject": {"type": "string"},
                    "content": {"type": "string"},
                    "reason": {"type": "string"},
                },
                "required": ["record_ids", "subject", "content", "reason"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["merges"],
    "additionalProperties": False,
}
"""The consolidation model's output shape, for ``response_format`` json_schema named ``consolidation_result``."""

CONSOLIDATION_PROMPT = """\
You tidy an AI agent's operational notes: facts its administrators taught it. You are shown a batch of \
notes, each with an id, a subject, its content and when it was said (said_at, UTC). Find notes that say \
the SAME thing (repeats, possibly worded differently) and merge each group into one note.

Merge only true repeats: notes that would be redundant next to each other. Do not merge notes that \
differ in any detail (a different table, host, number, time, or a negation), notes that contradict \
each other, or notes that are merely about the same topic. When in doubt, do not merge.

For each group give:
- record_ids: the ids of the notes it merges (two or more), exactly as shown
- subject: the subject of the merged note (usually the subject of the latest one)
- content: the merged note, keeping every detail the notes share, worded like the latest one
- reason: why these say the same thing

If there are no repeats, return {"merges": []}. Answer with JSON only, exactly of this shape:
{"merges": [{"record_ids": ["...", "..."], "subject": "...", "content": "...", "reason": "..."}]}
"""


class MalformedConsolidation(Exception):
    """The consolidation model's answer is not the JSON shape asked for: nothing is merged."""

    def __init__(self, raw: str, problem: str) -> None:
        self.raw = raw
        self.problem = problem
        super().__init__(f"malformed consolidation ({problem}): {raw[:200]!r}")


class ProposedMerge(Struct, frozen=True):
    """One merge the model proposed, over records it was shown."""

    record_ids: tuple[str, ...]
    subject: str
    content: str
    reason: str


def parse_consolidation(raw: str, shown: Iterable[str]) -> tuple[list[ProposedMerge], list[str]]:
    """Validate the model's answer against the records it was shown.

    Returns:
        The usable merges, and the problems of the merges that were ignored
        (a record not shown, fewer than two records, a record in two merges,
        empty content).

    Raises:
        MalformedConsolidation: not JSON, or not ``{"merges": [...]}``.
    """
    try:
        data = load_json_answer(raw)
    except (ValueError, TypeError):
        raise MalformedConsolidation(str(raw), "not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("merges"), list):
        raise MalformedConsolidation(str(raw), 'not an object with a "merges" list')
    allowed = set(shown)
    used: set[str] = set()
    out: list[ProposedMerge] = []
    problems: list[str] = []
    for n, entry in enumerate(data["merges"]):
        if not isinstance(entry, dict):
            problems.append(f"merge {n} is not an object")
            continue
        ids, subject, content, reason = (entry.get(k) for k in ("record_ids", "subject", "content", "reason"))
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            problems.append(f"merge {n} needs a list of record ids")
            continue
        wanted = tuple(dict.fromkeys(ids))
        unknown = [i for i in wanted if i not in allowed]
        if unknown:
            # A model naming records it was not shown is ignored: it may only merge what it saw.
            problems.append(f"merge {n} names {', '.join(unknown[:3])}, which the model was not shown")
            continue
        if len(wanted) < 2:
            problems.append(f"merge {n} names fewer than two records")
            continue
        again = [i for i in wanted if i in used]
        if again:
            problems.append(f"merge {n} repeats {', '.join(again[:3])} from another merge")
            continue
        if not isinstance(content, str) or not content.strip():
            problems.append(f"merge {n} has no content")
            continue
        used.update(wanted)
        out.append(
            ProposedMerge(
                wanted,
                subject.strip() if isinstance(subject, str) else "",
                content.strip()[:MAX_MERGED_CHARS],
                reason.strip()[:500] if isinstance(reason, str) else "",
            )
        )
    return out, problems


def consolidation_input(records: Sequence[MemoryRecordView]) -> str:
    """The model's user content: the batch as JSON (``builtin_consolidation_result`` reads it)."""
    import json

    shown = [
        {"id": r.id, "subject": r.subject, "content": r.content, "said_at": r.said_at.isoformat()} for r in records
    ]
    return json.dumps({"records": shown}, ensure_ascii=False, indent=1)


# ---- clustering by shared words -------------------------------------------------------------


class _Union:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _words(subject: str, content: str) -> tuple[str, ...]:
    # Interned: the notes share their words, and each kept tuple of fresh strings held its own copies.
    # A tuple, not a set: the collector stops tracking a tuple of strings, and keeps walking every
    # set; the memo keeps one for every live note in the serving process.
    return tuple(map(sys.intern, note_terms(subject, content)))


def _same_digest(key: str) -> bytes:
    # Identical notes are found by equal keys: 16 bytes of digest compare as the key does, where a
    # note's key is about as long as the note.
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


class PairMemo(Struct):
    """What earlier clusterings found: which notes were compared, and the pairs that were alike.

    Notes never change (append-only), so two notes compared once need not be
    compared again: a run over a large, settled store then compares only the
    notes new to it. For the same reason a note's words and its same-note key
    are worked out once, and kept (for the notes of the last call only) by the
    note's id, which ``compared`` holds anyway.
    """

    compared: set[str] = field(default_factory=set)
    alike: dict[tuple[str, str], float] = field(default_factory=dict)
    words: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Note id -> its distinct words (:func:`memory.store.note_terms`), interned."""
    same: dict[str, bytes] = field(default_factory=dict)
    """Note id -> the digest of its same-note key (:func:`memory.rules.same_note_key`), when it has one."""
    keys: dict[str, str] = field(default_factory=dict)
    """Note id -> its same-note key, for the notes in a group only (members are shown in its order)."""
    df: Counter[str] | None = None
    """How many of ``words``' notes have each word (None: count them again, as after a call that failed)."""


def cluster_by_words(
    records: Sequence[MemoryRecordView],
    *,
    batch_size: int = BATCH_SIZE,
    memo: PairMemo | None = None,
) -> list[list[MemoryRecordView]]:
    """Group notes that share their words, most alike first; each group has 2..``batch_size`` notes.

    Identical notes (same words apart from case, punctuation and articles) go
    together; otherwise two notes go together when one of a note's rarest
    words leads to the other and they share at least 30% of their words. A
    note alike to no other is left out: it has no repeat to find.

    Args:
        records: The notes.
        batch_size: The largest group.
        memo: Pairs compared by earlier calls (updated here): two notes both
            compared before are not compared again, their earlier result stands.
    """
    if len(records) < 2:
        return []
    by_id = {r.id: r for r in records}
    grouped = _group(list(by_id), by_id, memo)
    return _clusters(grouped, by_id, memo, batch_size)


class _Grouped(Struct):
    """What :func:`_group` found: the groups by their root, each grouped note's best score, new notes' keys."""

    groups: dict[str, list[str]]
    score: dict[str, float]
    fresh_keys: dict[str, str]


def _group(ids: Sequence[str], new: Mapping[str, MemoryRecordView], memo: PairMemo | None) -> _Grouped:
    """:func:`cluster_by_words`' grouping: ``ids`` the notes, ``new`` the records of those the memo has no words for.

    Only the notes new to the memo are read (their subject and content): a note's words and
    same-note key are kept in the memo by id, since a note never changes under its id.
    """
    known_words = memo.words if memo is not None else {}
    known_same = memo.same if memo is not None else {}
    words: dict[str, tuple[str, ...]] = {}
    digests: dict[str, bytes] = {}
    fresh_keys: dict[str, str] = {}
    fresh: list[str] = []  # the ids of the notes new to the memo
    for rid in ids:
        ws = known_words.get(rid)
        if ws is None:
            r = new[rid]
            ws = _words(r.subject, r.content)
            fresh.append(rid)
            key = fresh_keys[rid] = same_note_key(r.content)
            if key:
                digests[rid] = _same_digest(key)
        elif rid in known_same:
            digests[rid] = known_same[rid]
        words[rid] = ws
    union = _Union()
    score: dict[str, float] = {}

    def join(a: str, b: str, s: float) -> None:
        union.union(a, b)
        score[a] = max(score.get(a, 0.0), s)
        score[b] = max(score.get(b, 0.0), s)

    same: dict[bytes, list[str]] = defaultdict(list)
    for rid, digest in digests.items():
        same[digest].append(rid)
    for ids in same.values():
        for other in ids[1:]:
            join(ids[0], other, 1.0)

    before = memo.compared if memo is not None else set()
    # Only a pair with a note new to this call is compared, and a note finds its pairs through its
    # words: a word no new note has leads to no pair. So the postings hold those words alone, and a
    # note compared before that has none of them is passed over whole. A run over a settled store
    # (the automatic distillation, every 5 minutes) then builds nothing: 1.85 s of the serving
    # process's CPU at 65,536 notes, every run, for pairs it had compared already.
    fresh_words = [words[rid] for rid in dict.fromkeys(fresh)]  # the notes new to the memo: not in ``before``
    new_words = {w for ws in fresh_words for w in ws}
    df = _document_frequencies(memo, words, fresh_words)
    posted_words = {w for w in new_words if 2 <= df[w] <= _MAX_DF}
    postings: dict[str, list[str]] = defaultdict(list)
    if posted_words:
        for rid, ws in words.items():
            if posted_words.isdisjoint(ws):
                continue
            for w in ws:
                if w in posted_words:
                    postings[w].append(rid)
    alike: dict[tuple[str, str], float] = {}
    if memo is not None:
        alike = {p: v for p, v in memo.alike.items() if p[0] in words and p[1] in words}
    # The words as sets, for this call only and only for the notes it compares: two sets intersect
    # in about 60% of the time a set and a tuple take, and a first run compares millions of pairs.
    sets: dict[str, frozenset[str]] = {}
    # A note compared before leads to a pair only through a new note's word it has within the
    # counts (a posting): the others are passed over before their rare words are sorted. A new
    # note's common words ("the report uses ...") are in most notes, so a test of shared words
    # passed over almost none of them: 0.2 s of a run after one new note at 65,536 notes.
    posted = {rid for ids in postings.values() for rid in ids}
    for rid, ws in words.items():
        if rid in before and rid not in posted:
            continue
        rare = sorted((w for w in ws if 2 <= df[w] <= _MAX_DF), key=lambda w: (df[w], w))[:_RARE_WORDS]
        near: set[str] = set()
        for w in rare:
            near.update(postings[w])
        near.discard(rid)
        if rid in before:
            near.difference_update(before)
        if not near:
            continue
        mine = sets.get(rid)
        if mine is None:
            mine = sets[rid] = frozenset(ws)
        size = len(ws)
        for other in near:
            theirs = sets.get(other)
            if theirs is None:
                theirs = sets[other] = frozenset(words[other])
            shared = len(mine & theirs)
            # Jaccard overlap, the union counted rather than built (this loop is the clustering's cost).
            overlap = shared / (size + len(theirs) - shared)
            if overlap >= _MIN_OVERLAP:
                alike[(rid, other) if rid < other else (other, rid)] = overlap
    for (a, b), overlap in alike.items():
        join(a, b, overlap)
    groups: dict[str, list[str]] = defaultdict(list)
    for rid in words:
        if rid in score:
            groups[union.find(rid)].append(rid)
    if memo is not None:
        memo.compared = set(words)
        memo.alike = alike
        memo.words = words
        memo.same = digests
        memo.df = df
    return _Grouped(groups, score, fresh_keys)


def _document_frequencies(
    memo: PairMemo | None, words: Mapping[str, tuple[str, ...]], fresh: Sequence[tuple[str, ...]]
) -> Counter[str]:
    """How many of ``words``' notes have each word; ``fresh`` the words of those the memo does not know.

    The memo's counts are for its last call's notes: the notes gone since are taken out and the
    new ones added, so a run after one new note does not count every note's words again (about
    20 ms of CPU at 65,536 notes; they take about 2 MB there, for 67,680 distinct words).
    """
    if memo is None or memo.df is None:
        return Counter(w for ws in words.values() for w in ws)
    df, memo.df = memo.df, None  # until this call ends: one that fails part way leaves the memo to count again
    known = memo.words
    for rid in known.keys() - words.keys():
        for w in known[rid]:
            left = df.get(w, 0) - 1
            if left > 0:
                df[w] = left
            else:
                df.pop(w, None)
    for ws in fresh:
        df.update(ws)
    return df


def _clusters(
    grouped: _Grouped, by_id: Mapping[str, MemoryRecordView], memo: PairMemo | None, batch_size: int
) -> list[list[MemoryRecordView]]:
    """:func:`cluster_by_words`' groups as clusters of records: ``by_id`` holds at least every grouped note."""
    groups, score, fresh_keys = grouped.groups, grouped.score, grouped.fresh_keys
    known_keys = memo.keys if memo is not None else {}
    keys = {
        rid: fresh_keys[rid] if rid in fresh_keys else known_keys.get(rid) or same_note_key(by_id[rid].content)
        for rid in score
    }
    if memo is not None:
        memo.keys = keys
    clusters: list[tuple[float, str, list[MemoryRecordView]]] = []
    for root, ids in groups.items():
        members = sorted((by_id[i] for i in ids), key=lambda r: (keys[r.id], r.said_at, r.id))
        best = max(score[i] for i in ids)
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            if len(chunk) >= 2:
                clusters.append((best, f"{root}:{start}", chunk))
    clusters.sort(key=lambda c: (-c[0], c[1]))
    return [c for _, _, c in clusters]


def pack(
    clusters: Sequence[Sequence[MemoryRecordView]], *, batch_size: int = BATCH_SIZE
) -> list[list[MemoryRecordView]]:
    """Pack clusters, in order and each whole, into batches of at most ``batch_size`` records."""
    batches: list[list[MemoryRecordView]] = []
    for cluster in clusters:
        for batch in batches:
            if len(batch) + len(cluster) <= batch_size:
                batch.extend(cluster)
                break
        else:
            batches.append(list(cluster)[:batch_size])
    return batches


# ---- a run ------------------------------------------------------------------------------


class ConsolidationRun(Struct):
    """What one consolidation run did."""

    run_id: str
    model_calls: int = 0
    failed_calls: int = 0
    shown: int = 0
    """Records shown to the model (over all calls)."""
    merged: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """(new record id, the source ids it merged) for each merge written."""
    skipped_looked_at: int = 0
    """Records in clusters looked at before without a repeat: not shown again."""
    waiting: int = 0
    """Records in batches beyond the run's call limit: for the next run."""
    ignored: list[str] = field(default_factory=list)
    ungrounded: list[str] = field(default_factory=list)
    """Merges refused because their text says what none of their sources says (nothing retired)."""
    refused: str | None = None

    @property
    def retired(self) -> int:
        """How many source records the merges retired."""
        return sum(len(sources) for _, sources in self.merged)

    @property
    def failed(self) -> bool:
        """True when any of the run's model calls failed (the automatic distillation backs off)."""
        return self.failed_calls > 0

    def summary(self) -> str:
        """One line for a person."""
        if self.refused:
            return self.refused
        text = (
            f"Consolidation run {self.run_id}: {self.model_calls} model call(s), {self.shown} note(s) looked at, "
            f"{len(self.merged)} merge(s) retiring {self.retired} note(s)"
        )
        if self.failed_calls:
            text += f", {self.failed_calls} call(s) failed"
        if self.waiting:
            text += f"; {self.waiting} note(s) wait for the next run"
        if self.ignored:
            text += f"; {len(self.ignored)} proposal(s) ignored"
        if self.ungrounded:
            text += (
                f"; {len(self.ungrounded)} merge(s) refused as not grounded in their sources, nothing retired "
                f"({'; '.join(self.ungrounded[:3])})"
            )
        return text + "."

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "run_id": self.run_id,
            "model_calls": self.model_calls,
            "failed_calls": self.failed_calls,
            "shown": self.shown,
            "merged": [{"record_id": new, "sources": list(src)} for new, src in self.merged],
            "retired": self.retired,
            "skipped_looked_at": self.skipped_looked_at,
            "waiting": self.waiting,
            "ignored": list(self.ignored),
            "ungrounded": list(self.ungrounded),
            "refused": self.refused,
        }


class Consolidator:
    """Runs consolidation over the live agent_notes, with the looked-at cache of this process.

    Args:
        writer: The gated writer (merged records are written through the gate, source ``consolidate``).
        model: The consolidation model seam (``consolidation_result``).
        model_name: The model's name, recorded on each revision row.
        prompt_version: The prompt's version, recorded on each revision row.
        batch_size: Records shown per call (at most 40 by policy).
        max_calls: Model calls per run (at most 6 by policy).
    """

    def __init__(
        self,
        writer: MemoryWriter,
        model: ConsolidationModel,
        *,
        model_name: str,
        prompt_version: str = CONSOLIDATION_PROMPT_VERSION,
        batch_size: int = BATCH_SIZE,
        max_calls: int = MAX_CALLS,
    ) -> None:
        self.writer = writer
        self.model = model
        self.model_name = model_name
        self.prompt_version = prompt_version
        # policy: "at most 40 records a call ... at most six calls" -- a setting may lower them, never raise.
        self.batch_size = max(2, min(batch_size, BATCH_SIZE))
        self.max_calls = max(1, min(max_calls, MAX_CALLS))
        self._pairs = PairMemo()
        self._looked_at: dict[str, frozenset[str]] = {}
        """Record id -> the ids of the batch it was looked at in, without a repeat found (this process only)."""
        self._last: tuple[list[str], list[list[MemoryRecordView]]] | None = None
        """The last clustering: the ids of the notes it was given, in order, and the clusters it found."""

    @property
    def looked_at(self) -> frozenset[str]:
        """Ids of the records looked at without a repeat found (not shown again unless a new record joins)."""
        return frozenset(self._looked_at)

    def forget(self) -> None:
        """Empty the looked-at cache (as a restart of the gateway does)."""
        self._looked_at.clear()
        self._pairs = PairMemo()
        self._last = None

    async def run(self, principal: Principal, *, run_id: str | None = None) -> ConsolidationRun:
        """One consolidation run as ``principal`` (an admin's ``notes_distill`` or the scheduler's system run)."""
        run = ConsolidationRun(run_id or new_run_id("cr"))
        decision = self.writer.decide(principal, "agent_notes", "consolidate")
        if not decision.writes:
            run.refused = decision.message
            return run
        store = self.writer.store
        ids = await store.live_note_ids(limit=1_000_000)
        undone = await store.undone_revisions()
        # policy: "An undone retirement is a veto for that pair, forever": a note an admin took back
        # out of a merge is not merged again, and no merge joins a vetoed pair.
        unmerged = {r.retired_id for r in undone if r.via == "consolidation"}
        vetoed = {frozenset((r.retired_id, r.replacing_id)) for r in undone if r.replacing_id is not None}
        eligible_ids = [i for i in ids if i not in unmerged]
        last = self._last
        if last is not None and last[0] == eligible_ids:
            # The same notes as the last run's clustering (notes never change under their id): it
            # would compare no pair and find the same clusters. The automatic distillation nearly
            # always finds this, every 5 minutes on the serving process's worker thread, where
            # reading and decoding every note took 1.3 s of CPU at 65,536 notes.
            clusters = last[1]
        else:
            known = self._pairs.words
            new_ids = [i for i in eligible_ids if i not in known]
            if len(eligible_ids) >= 2 and len(new_ids) * 2 <= len(eligible_ids):
                # Most notes are known to the memo (their words and keys, by id): read only the new
                # ones, then the notes in a group. A note said since the last run no longer costs a
                # read of every note (1.3 s of CPU at 65,536 notes).
                new = {v.id: v for v in await store.records_by_id(new_ids)}
                eligible_ids = [i for i in eligible_ids if i in known or i in new]
                grouped = await asyncio.to_thread(_group, eligible_ids, new, self._pairs)
                members = [i for i in grouped.score if i not in new]
                by_id = new | {v.id: v for v in await store.records_by_id(members)}
                clusters = _clusters(grouped, by_id, self._pairs, self.batch_size)
            else:  # a first run, or most notes new: one read of them all
                notes = await store.live_notes(limit=1_000_000)
                eligible = [n for n in notes if n.id not in unmerged]
                eligible_ids = [n.id for n in eligible]
                # Clustering is CPU work on every live note: off the event loop, so turns are not held up.
                clusters = await asyncio.to_thread(
                    cluster_by_words, eligible, batch_size=self.batch_size, memo=self._pairs
                )
            self._last = (eligible_ids, clusters)
        live_ids = set(eligible_ids)
        for rid in [k for k in self._looked_at if k not in live_ids]:
            del self._looked_at[rid]

        fresh: list[list[MemoryRecordView]] = []
        for cluster in clusters:
            if all(r.id in self._looked_at for r in cluster):
                run.skipped_looked_at += len(cluster)
            else:
                fresh.append(cluster)
        batches = pack(fresh, batch_size=self.batch_size)
        run.waiting = sum(len(b) for b in batches[self.max_calls :])
        for batch in batches[: self.max_calls]:
            await self._one_call(principal, batch, vetoed, run)
        return run

    async def _one_call(
        self,
        principal: Principal,
        batch: Sequence[MemoryRecordView],
        vetoed: set[frozenset[str]],
        run: ConsolidationRun,
    ) -> None:
        shown = {r.id: r for r in batch}
        run.model_calls += 1
        run.shown += len(batch)
        try:
            raw = await self.model(CONSOLIDATION_PROMPT, consolidation_input(batch))
            merges, problems = parse_consolidation(raw, shown)
        except MalformedConsolidation as exc:
            log.warning("consolidation run %s: %s; nothing merged", run.run_id, exc)
            run.failed_calls += 1
            run.ignored.append(str(exc))
            return
        except Exception as exc:  # the model is a network call: its failure merges nothing
            log.warning("consolidation run %s: the model failed (%s); nothing merged", run.run_id, exc)
            run.failed_calls += 1
            return
        for problem in problems:
            log.warning("consolidation run %s: ignored %s", run.run_id, problem)
        run.ignored.extend(problems)
        merged_here: set[str] = set()
        for merge in merges:
            pairs = {frozenset((a, b)) for a in merge.record_ids for b in merge.record_ids if a != b}
            if pairs & vetoed:
                run.ignored.append(f"merge of {', '.join(merge.record_ids)} joins a pair an admin un-did")
                continue
            sources = [shown[i] for i in merge.record_ids]
            missing = ungrounded(merge.content, [f"{r.subject}\n{r.content}" for r in sources])
            if missing:
                # A merge restates its sources or it is not a merge: a model cannot author a note here.
                why = f"merge of {', '.join(merge.record_ids)} says what no source says: {', '.join(missing[:8])}"
                log.warning("consolidation run %s: refused %s", run.run_id, why)
                run.ungrounded.append(why)
                continue
            latest = max(sources, key=lambda r: (r.said_at, r.id))
            # The merged note keeps a subject of its sources: on any other, the subject rule would
            # retire a note nobody looked at.
            keys = {r.subject_key for r in sources}
            subject = merge.subject if subject_key(merge.subject) in keys else latest.subject
            evidence = list(dict.fromkeys([*merge.record_ids, *(e for r in sources for e in r.evidence)]))
            try:
                result = await self.writer.write(
                    principal,
                    "agent_notes",
                    "consolidate",
                    subject=subject,
                    content=merge.content,
                    said_at=latest.said_at,
                    evidence=evidence[:MAX_EVIDENCE],
                    run_id=run.run_id,
                    merge=Merge(
                        merge.record_ids, merge.reason or "the same note", self.model_name, self.prompt_version
                    ),
                )
            except MemoryStoreError as exc:
                log.warning("consolidation run %s: merge skipped: %s", run.run_id, exc)
                run.ignored.append(str(exc))
                continue
            if result.record is None:
                run.refused = result.decision.message
                return
            run.merged.append((result.record.id, merge.record_ids))
            merged_here.update(merge.record_ids)
        key = frozenset(shown)
        for rid in shown:
            if rid not in merged_here:
                self._looked_at[rid] = key
