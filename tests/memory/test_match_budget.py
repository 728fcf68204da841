"""A turn's ``match`` leaves out a word in too many notes, and otherwise is exactly the idf ranking.

The match scores each live, current note by the sum of ``1/df`` over the conversation's words it
has. A word in every note (with 65,536 notes, "use") made it group and sort every posting of that
word: 80-140 ms of CPU each turn. A word in more notes than ``match_word_postings`` is now left
out, and the store remembers it for a while so later turns do not even count it. These tests hold
the statement to a ranking worked out here in Python from every posting, on both databases, on
the raw driver and through SQLAlchemy.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

import memory.store
from gateway.hotstore import hot_store
from memory.models import MemoryRecord, MemoryTerm
from memory.store import MemoryStore, note_postings
from memory.words import subject_key
from tests.conftest import Clock

MATCHED = 12


async def _seed(engine: AsyncEngine, now: datetime) -> None:
    """160 notes: "common" in every one, a topic in a fifth each, and rarer words; some retired or expired."""
    rng = random.Random(11)
    rare = [f"rare{i}" for i in range(40)]
    rows: list[dict[str, Any]] = []
    postings: list[dict[str, Any]] = []
    for i in range(160):
        subject = f"topic{i % 5} item"
        content = "common " + " ".join(rng.sample(rare, rng.randint(1, 4)))
        said = now - timedelta(minutes=rng.randint(0, 9000))
        status = "live" if rng.random() < 0.9 else "superseded"
        review_by = now + timedelta(days=rng.randint(-2, 40))
        row = {
            "id": f"m_{i:04d}", "scope": "agent_notes", "owner_user_id": None, "subject": subject,
            "subject_key": subject_key(subject), "content": content, "status": status, "said_at": said,
            "recorded_at": said, "review_by": review_by, "source": "live", "author_user_id": "u_0",
            "author_role": "admin", "session_id": "s_x", "evidence": [], "run_id": None, "superseded_by": None,
        }  # fmt: skip
        rows.append(row)
        if status == "live":
            postings.extend(note_postings(row["id"], subject, content, said, review_by))
    async with engine.begin() as conn:
        await conn.execute(MemoryRecord.__table__.insert(), rows)
        await conn.execute(MemoryTerm.__table__.insert(), postings)


async def _reference(engine: AsyncEngine, words: list[str], now: datetime) -> list[tuple[str, float]]:
    """The idf ranking over ``words`` from every posting: (id, score), best first, at most MATCHED."""
    T, R = MemoryTerm.__table__, MemoryRecord.__table__
    async with engine.connect() as conn:
        rows = (await conn.execute(select(T.c.term, T.c.record_id, T.c.review_by))).all()
        notes = {r.id: r for r in (await conn.execute(select(R).where(R.c.scope == "agent_notes"))).all()}
    df = Counter(term for term, _, _ in rows)
    score: dict[str, float] = {}
    for term, rid, review_by in rows:
        if term in words and (review_by is None or review_by > now):
            score[rid] = score.get(rid, 0.0) + 1.0 / df[term]
    live = [
        (rid, s)
        for rid, s in score.items()
        if notes[rid].status == "live" and (notes[rid].review_by is None or notes[rid].review_by > now)
    ]
    # Scores equal but for the order of a float sum (each database adds in its own order) are a tie.
    live.sort(key=lambda p: (-round(p[1], 9), -notes[p[0]].said_at.timestamp(), p[0]))
    return [(rid, round(s, 9)) for rid, s in live[:MATCHED]]


async def _matched(store: MemoryStore, words: list[str], now: datetime, **bounds: int) -> list[tuple[str, float]]:
    got = await store.prompt_candidates(
        user_id=None, query_terms=words, now=now, matched_limit=MATCHED, recent_limit=3, personal_limit=3, **bounds
    )
    ranked = sorted(got.matched_notes, key=lambda p: (-round(p[1], 9), -p[0].said_at.timestamp(), p[0].id))
    return [(v.id, round(s, 9)) for v, s in ranked]


async def test_below_the_bounds_the_match_is_the_idf_ranking_of_every_shared_word(
    engine: AsyncEngine, clock: Clock
) -> None:
    await _seed(engine, clock.now)
    stores = [MemoryStore(engine, clock=clock, raw=hot_store(engine)), MemoryStore(engine, clock=clock)]
    rng = random.Random(3)
    vocabulary = ["common", "item", "absent", *(f"topic{i}" for i in range(5)), *(f"rare{i}" for i in range(40))]
    for n in (1, 2, 3, 5, 8, 13, 24):
        words = rng.sample(vocabulary, n)
        want = await _reference(engine, words, clock.now)
        assert want, words
        for store in stores:
            assert await _matched(store, words, clock.now) == want, words


async def test_a_word_in_more_notes_than_the_bound_is_left_out_and_remembered_for_a_while(
    engine: AsyncEngine, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _seed(engine, clock.now)
    async with engine.connect() as conn:
        T = MemoryTerm.__table__
        df = Counter(t for (t,) in (await conn.execute(select(T.c.term))).all())
    common, topic, rare = df["common"], df["topic1"], df["rare7"]
    assert common > topic > rare > 0
    words = ["common", "topic1", "rare7"]
    for store in (MemoryStore(engine, clock=clock, raw=hot_store(engine)), MemoryStore(engine, clock=clock)):
        # At the bound exactly, a word is kept: the ranking of every shared word.
        assert await _matched(store, words, clock.now, match_word_postings=common) == await _reference(
            engine, words, clock.now
        )
        # "common" is in every note: past a bound below its postings it is left out, the rest ranked as before.
        bound = common - 1
        without = await _reference(engine, ["topic1", "rare7"], clock.now)
        assert await _matched(store, words, clock.now, match_word_postings=bound) == without
        assert store._common["common"][1] == common  # remembered with its count
        # Its next turns do not name it to the database at all (nothing to count), with the same answer.
        asked: list[list[str]] = []
        rows = store._candidate_rows

        async def recorded(*args: Any, asked: list[list[str]] = asked, rows: Any = rows) -> Any:
            asked.append(list(args[3].get("words", [])))  # (with_words, with_user, n_words, params, ...)
            return await rows(*args)

        monkeypatch.setattr(store, "_candidate_rows", recorded)
        assert await _matched(store, words, clock.now, match_word_postings=bound) == without
        assert asked == [["topic1", "rare7"]]
        # A higher bound (another caller) still counts it; so does this one once the memory is old.
        assert await _matched(store, words, clock.now, match_word_postings=common) == await _reference(
            engine, words, clock.now
        )
        monkeypatch.setattr(memory.store, "COMMON_WORD_TTL_S", -1.0)
        store._common.clear()
        await _matched(store, words, clock.now, match_word_postings=bound)
        asked.clear()
        await _matched(store, words, clock.now, match_word_postings=bound)
        assert asked == [words]
        monkeypatch.undo()
        # Nothing left: no match, and the turn still has its recent notes.
        got = await store.prompt_candidates(
            user_id=None, query_terms=["common"], now=clock.now, matched_limit=MATCHED, recent_limit=3,
            personal_limit=3, match_word_postings=bound,
        )  # fmt: skip
        assert got.matched_notes == [] and len(got.recent_notes) == 3


async def test_related_notes_leave_out_a_word_in_more_notes_than_the_bound(
    engine: AsyncEngine, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Belief revision's related notes (each note written) count shared words without the too common ones.

    Grouping every posting of a word in every note took 190 ms a call at 65,536 notes, for each
    admin's note written in a turn and each merge of a consolidation run.
    """
    await _seed(engine, clock.now)
    async with engine.connect() as conn:
        T = MemoryTerm.__table__
        having = {r for (r,) in (await conn.execute(select(T.c.record_id).where(T.c.term == "rare7"))).all()}
        df = Counter(t for (t,) in (await conn.execute(select(T.c.term))).all())
    store = MemoryStore(engine, clock=clock)
    both = await store.notes_sharing_words(["common", "rare7"], limit=500)
    having &= {v.id for v, _ in both}  # the live, current ones
    assert having and len(both) > len(having)  # every note has "common"
    assert {v.id for v, n in both if n == 2} == having
    monkeypatch.setattr(memory.store, "MATCH_WORD_POSTINGS", df["common"] - 1)
    fresh = MemoryStore(engine, clock=clock)
    rare_only = await fresh.notes_sharing_words(["common", "rare7"], limit=500)
    assert {v.id for v, _ in rare_only} == having
    assert all(n == 1 for _, n in rare_only)
    assert fresh._common["common"][1] == df["common"]  # remembered: the next call does not count it
    assert await fresh.notes_sharing_words(["common"]) == []
