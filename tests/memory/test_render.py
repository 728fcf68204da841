"""Memory into the prompt: relevance within a budget, provenance, and only the speaker's own memory."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory.render import (
    MAX_QUERY_TERMS,
    OPERATIONAL_HEADING,
    PERSONAL_HEADING,
    _query_terms,
    _rank,
    _record_terms,
    memory_sections,
)
from memory.store import MemoryRecordView
from memory.words import MAX_TERM_CHARS, STOPWORDS, estimate_tokens, terms
from memory.writer import MemoryWriter
from tests.conftest import Clock
from tests.memory.conftest import ALICE, BOB, CAROL, CRON, T0, UNPAIRED, WEBHOOK


async def _fill(writer: MemoryWriter) -> None:
    notes = [
        ("report data source", "The daily report is produced from example_orders and example_archive"),
        ("staging server", "The staging server is db2.example.internal"),
        ("invoice approvals", "Invoices above 5000 EUR need a second approval from finance"),
        ("holiday calendar", "The office is closed on 24 December"),
    ]
    for i, (subject, content) in enumerate(notes):
        await writer.write(
            ALICE, "agent_notes", "live", subject=subject, content=content, said_at=T0 + timedelta(minutes=i)
        )
    await writer.write(
        BOB, "personal", "live", subject="reply language", content="Wants answers in English", said_at=T0
    )
    await writer.write(BOB, "personal", "live", subject="team", content="Works in the finance team", said_at=T0)
    await writer.write(
        CAROL, "personal", "live", subject="secret", content="Carol's private note about invoices", said_at=T0
    )


async def test_sections_have_provenance_and_the_facts_not_rules_heading(writer: MemoryWriter, clock: Clock) -> None:
    await _fill(writer)
    s = await memory_sections(writer.store, BOB, "can you produce the daily report?", token_budget=1000)
    assert s.operational.startswith(OPERATIONAL_HEADING)
    assert "facts, not rules and not identity" in OPERATIONAL_HEADING
    assert "taught by u_alice (admin) on 2026-11-30" in s.operational
    assert f"review by {clock.now + timedelta(days=90):%Y-%m-%d}" in s.operational
    assert s.personal.startswith(PERSONAL_HEADING) and "not rules and not identity" in PERSONAL_HEADING
    assert "Wants answers in English" in s.personal and "taught by u_bob (user)" in s.personal
    assert s.tokens == estimate_tokens(s.text) <= 1000
    assert len(s.used_ids) == 6


async def test_never_another_persons_personal_memory(writer: MemoryWriter) -> None:
    await _fill(writer)
    s = await memory_sections(writer.store, BOB, "Carol private note invoices secret", token_budget=2000)
    assert "Carol" not in s.text
    c = await memory_sections(writer.store, CAROL, "invoices", token_budget=2000)
    assert "Carol's private note" in c.personal and "English" not in c.text


@pytest.mark.parametrize("who", [CRON, WEBHOOK, UNPAIRED], ids=["cron", "webhook", "unpaired"])
async def test_no_personal_memory_for_runs_and_unpaired(writer: MemoryWriter, who: object) -> None:
    await _fill(writer)
    s = await memory_sections(writer.store, who, "English finance invoices report", token_budget=2000)  # type: ignore[arg-type]
    assert s.personal == "" and "English" not in s.text and s.operational


async def test_relevant_notes_win_a_tight_budget(writer: MemoryWriter) -> None:
    await _fill(writer)
    s = await memory_sections(writer.store, ALICE, "which server is staging on?", token_budget=110)
    assert "db2.example.internal" in s.operational
    assert "24 December" not in s.operational
    assert s.tokens <= 110


async def test_expired_superseded_and_unverified_notes_are_never_rendered(writer: MemoryWriter, clock: Clock) -> None:
    await writer.write(ALICE, "agent_notes", "live", subject="old source", content="example_old", said_at=T0)
    await writer.write(
        ALICE, "agent_notes", "live", subject="old source", content="example_new", said_at=T0 + timedelta(1)
    )
    await writer.write(BOB, "agent_notes", "relearn", subject="quarantine", content="example_unverified", said_at=T0)
    s = await memory_sections(writer.store, ALICE, "example source", token_budget=1000)
    assert "example_new" in s.text and "example_old" not in s.text and "example_unverified" not in s.text
    clock.advance(days=91)
    s = await memory_sections(writer.store, ALICE, "example source", token_budget=1000)
    assert s.text == "" and s.used_ids == ()


@pytest.mark.parametrize("budget", [0, 5, 40, 80, 150, 400])
async def test_budget_is_never_exceeded(writer: MemoryWriter, budget: int) -> None:
    for i in range(60):
        await writer.write(
            ALICE, "agent_notes", "live", subject=f"topic {i}", content=f"report fact number {i} " + "word " * (i % 17),
            said_at=T0 + timedelta(minutes=i),
        )  # fmt: skip
        await writer.write(
            BOB, "personal", "live", subject=f"pref {i}", content=f"report preference {i} " + "x" * (i * 3),
            said_at=T0 + timedelta(minutes=i),
        )  # fmt: skip
    s = await memory_sections(writer.store, BOB, "report fact preference number 7", token_budget=budget)
    assert s.tokens == estimate_tokens(s.text) <= max(budget, 0)
    assert len(set(s.used_ids)) == len(s.used_ids)
    for rid in s.used_ids:
        rec = await writer.store.get(rid)
        assert rec and rec.content.split()[0] in s.text


async def test_notes_fill_the_budget_even_when_nothing_matches(writer: MemoryWriter) -> None:
    await _fill(writer)
    s = await memory_sections(writer.store, ALICE, "hello there", token_budget=1000)
    assert s.operational.count("\n- ") == 4


_WORDS = ["report", "reports", "the", "Daily", "x1", "ss", "İstanbul", "db01.internal", "hello", "uses", "a" * 70]


@given(
    # Few distinct words over a long text (the whole tail is read, across pieces), or many.
    pieces=st.lists(st.sampled_from(_WORDS), min_size=100, max_size=900)
    | st.lists(st.sampled_from(_WORDS) | st.text(max_size=12), max_size=900),
    seps=st.sampled_from([" ", "  ", ", ", "\n", "-"]),
)
def test_query_terms_are_the_newest_distinct_terms_of_the_conversation_tail(pieces: list[str], seps: str) -> None:
    # The tail is read backwards a piece at a time; the terms must be exactly those of the whole tail.
    text = seps.join(pieces)
    seen: dict[str, None] = {}
    for w in reversed(terms(text[-4000:])):
        seen.setdefault(w, None)
        if len(seen) >= MAX_QUERY_TERMS:
            break
    assert _query_terms(text) == list(seen)


_MESSAGE = st.lists(st.sampled_from(_WORDS) | st.text(max_size=12), max_size=60).map(" ".join) | st.lists(
    st.sampled_from(_WORDS), min_size=300, max_size=1200
).map(" ".join)


@given(messages=st.lists(_MESSAGE, max_size=8))
def test_query_terms_of_a_turns_messages_are_those_of_their_texts_joined(messages: list[str]) -> None:
    # A turn passes its last messages' texts, each one's terms kept for the next turns; the terms must be
    # exactly those of the texts joined by spaces, the oldest one cut where the tail cuts it (long texts
    # of few words make the tail end inside a message, or on the space between two).
    joined = " ".join(messages)
    assert _query_terms(messages) == _query_terms(joined)
    assert _query_terms(messages) == _query_terms(list(messages))  # the kept terms give the same again


@pytest.mark.parametrize("cut", [-2, -1, 0, 1, 2])
def test_query_terms_where_the_tail_ends_at_a_messages_edge(cut: int) -> None:
    # Newest message first; the tail's 4,000 characters end just inside, on or just past the space
    # before it, or inside the older message: only what the joined text's tail holds counts.
    newest = " ".join(["zeta"] * 20)
    older = "alpha beta " + "x" * 10 + " " + "k" * (4000 - len(newest) - 1 - 22 + cut)
    messages = [older, newest]
    assert len(" ".join(messages)) == 4000 + cut
    assert _query_terms(messages) == _query_terms(" ".join(messages))


def _rank_plainly(records: list[MemoryRecordView], query: set[str]) -> list[MemoryRecordView]:
    """BM25 as written plainly (the ranking before it was made quick): a Counter a record, idf a term a record."""
    k1, b = 1.2, 0.75
    docs = [(r, _record_terms(r.id, r.subject, r.content)) for r in records]
    if not docs:
        return []
    df = Counter(t for _, d in docs for t in set(d) if t in query)
    avgdl = sum(len(d) for _, d in docs) / len(docs)

    def bm25(doc: tuple[str, ...]) -> float:
        tf = Counter(t for t in doc if t in query)
        dl = len(doc) or 1
        score = 0.0
        for term, f in tf.items():
            idf = math.log(1 + (len(docs) - df.get(term, 0) + 0.5) / (df.get(term, 0) + 0.5))
            score += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * dl / (avgdl or 1)))
        return score

    scored = [(bm25(d), r) for r, d in docs]
    scored.sort(key=lambda p: (-p[0], -p[1].said_at.timestamp(), p[1].id))
    return [r for _, r in scored]


_VOCAB = ["report", "reports", "invoice", "english", "weekly", "the", "db01.internal", "x1", "coffee", "İstanbul"]


@given(
    records=st.lists(
        st.tuples(
            st.lists(st.sampled_from(_VOCAB) | st.text(max_size=8), max_size=30).map(" ".join),
            st.integers(min_value=0, max_value=5),  # minutes: many ties on time
        ),
        max_size=40,
    ),
    query=st.sets(st.sampled_from([*_VOCAB, "report", "invoice", "absent"]), max_size=8),
)
def test_a_persons_records_are_ranked_as_bm25_written_plainly_ranks_them(
    records: list[tuple[str, int]], query: set[str]
) -> None:
    # Up to 200 of a person's records are ranked on every turn of theirs: the quick ranking must give
    # exactly the order (scores to the last bit, ties newest first, then by id) of BM25 written plainly.
    views = [
        MemoryRecordView(
            id=f"m_{i:03d}", scope="personal", owner_user_id="u_bob", subject="note", subject_key="note",
            content=content, status="live", said_at=T0 + timedelta(minutes=minute), recorded_at=T0,
            review_by=None, source="user", author_user_id="u_bob", author_role="user", session_id=None,
            evidence=(), run_id=None, superseded_by=None,
        )
        for i, (content, minute) in enumerate(records)
    ]  # fmt: skip
    random.Random(len(views)).shuffle(views)  # the candidates come in the statement's order, not by id
    query_terms = set(terms(" ".join(query)))
    assert [r.id for r in _rank(views, query_terms)] == [r.id for r in _rank_plainly(views, query_terms)]


def _terms_plainly(text: str) -> list[str]:
    """``terms`` as its docstring says it, one word at a time."""
    out = []
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if len(word) < 2 or word in STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        if word in STOPWORDS:  # "uses" is "use"
            continue
        out.append(word[:MAX_TERM_CHARS])
    return out


@given(
    text=st.lists(st.sampled_from([*_WORDS, "as", "is", "bass", "sss", "I", "K", "\u212a", "x", "0", "s" * 80])).map(
        " ".join
    )
    | st.text(alphabet="aAsSbk0 1_.-ÉßİK\u212a", max_size=40)
    | st.text(max_size=40)
)
def test_terms_are_the_words_of_two_letters_or_more_without_stopwords_and_plural_s(text: str) -> None:
    # The fast comprehension must give exactly the plain definition's terms, in order.
    assert terms(text) == _terms_plainly(text)


def test_a_kept_line_is_used_only_for_the_view_it_was_made_from() -> None:
    # Lines are kept by record id across turns; another store's record under the same id (another
    # database in the same process), or the same record with another status, is rendered afresh.
    from msgspec.structs import replace

    from memory.render import _kept_line, _line
    from memory.store import MemoryRecordView

    view = MemoryRecordView(
        id="m_same", scope="agent_notes", owner_user_id=None, subject="backup window", subject_key="backup window",
        content="Backups run at 02:00", status="live", said_at=T0, recorded_at=T0, review_by=T0 + timedelta(days=90),
        source="live", author_user_id="u_alice", author_role="admin", session_id=None, evidence=(), run_id=None,
        superseded_by=None,
    )  # fmt: skip
    assert _kept_line(view) == _line(view)
    other = replace(view, content="Backups run at 04:00", author_user_id="u_bob")
    assert _kept_line(other) == _line(other) and "04:00" in _kept_line(other) and "u_bob" in _kept_line(other)
    assert "02:00" in _kept_line(replace(other, content="Backups run at 02:00"))
    assert _kept_line(replace(view, run_id="r_1")) == _line(replace(view, run_id="r_1"))
