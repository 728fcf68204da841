"""Consolidation's clustering over runs: what it keeps between runs, and that keeping it changes no result."""

from __future__ import annotations

import gc
import random
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from memory import consolidate
from memory.consolidate import PairMemo, cluster_by_words
from memory.store import MemoryRecordView
from tests.memory.conftest import T0

MIN = timedelta(minutes=1)


def view(rid: str, content: str, minute: int = 0, subject: str = "") -> MemoryRecordView:
    return MemoryRecordView(
        rid,
        "agent_notes",
        None,
        subject or f"note {rid}",
        subject or f"note {rid}",
        content,
        "live",
        T0 + minute * MIN,
        T0,
        None,
        "live",
        None,
        None,
        None,
        (),
        None,
        None,
    )


def ids(clusters: list[list[MemoryRecordView]]) -> list[list[str]]:
    return [[r.id for r in c] for c in clusters]


def test_what_clustering_keeps_for_the_next_run_is_no_work_for_the_collector() -> None:
    """The serving process keeps every live note's words between runs: none of it is walked by each full collection.

    A kept set per note (sets are never untracked) made each of the serving process's full
    collections walk 65,536 more objects, stopping its event loop the longer.
    """
    notes = [  # in pairs, each note said twice
        view(f"m_{i:05d}", f"The export of area {i // 2} goes to bucket-{i // 2} at {i % 24:02d}:00 (team {i % 7}).")
        for i in range(2000)
    ]
    memo = PairMemo()
    gc.collect()
    tracked = len(gc.get_objects())
    for _ in range(2):  # the first run works out each note's words, the second finds them kept
        assert cluster_by_words(notes, memo=memo)
    gc.collect()
    kept = len(gc.get_objects()) - tracked
    assert kept < 50  # a set per note kept 2,000 (and the notes' texts as its keys)


# Identical notes in other case and punctuation, notes alike by their words but not identical, and
# said_at ties: the order members are shown in (same-note key, said_at, id) and the chunks of a
# group larger than the batch, as consolidation made them before it kept digests instead of keys.
NOTES = [
    view("m_a1", "Backups of the orders table run at 02:00 on db-1.", 10),
    view("m_a2", "backups of orders table run at 02:00 on db-1", 5),
    view("m_a3", "BACKUPS OF THE ORDERS TABLE RUN AT 02:00 ON DB-1!", 5),
    view("m_a0", "Backups of the orders table run at 03:00 on db-1.", 20),
    view("m_a5", "Backups of the invoices table run at 02:00 on db-1.", 1),
    view("m_a4", "An orders table backup runs at 02:00 on db-1 nightly.", 30),
    view("m_b2", "Lunch is served at noon in the canteen", 3),
    view("m_b1", "Lunch is served at noon in the canteen on Fridays", 3),
    view("m_c1", "Payroll closes on the 25th of each month", 7),
    view("m_c2", "The the.", 8, subject="payroll month closes"),
    view("m_c3", "a", 9, subject="payroll month closes"),
]


def test_clusters_and_their_order_stay_as_they_were_over_runs() -> None:
    memo = PairMemo()
    first = [["m_a5", "m_a2", "m_a3", "m_a1", "m_a0", "m_a4"], ["m_c2", "m_c3", "m_c1"], ["m_b2", "m_b1"]]
    assert ids(cluster_by_words(NOTES, memo=memo)) == first
    assert ids(cluster_by_words(NOTES)) == first
    assert ids(cluster_by_words(NOTES, batch_size=3)) == [
        ["m_a5", "m_a2", "m_a3"],
        ["m_a1", "m_a0", "m_a4"],
        ["m_c2", "m_c3", "m_c1"],
        ["m_b2", "m_b1"],
    ]
    # The next run: one note merged away, and a new one said again that joins the backups.
    later = [n for n in NOTES if n.id != "m_a3"] + [view("m_a6", "backups of the ORDERS table run at 02:00 on db-1", 5)]
    assert ids(cluster_by_words(later, memo=memo)) == [
        ["m_a5", "m_a2", "m_a6", "m_a1", "m_a0", "m_a4"],
        ["m_c2", "m_c3", "m_c1"],
        ["m_b2", "m_b1"],
    ]
    assert ids(cluster_by_words(later, memo=memo)) == ids(cluster_by_words(later))


def test_the_word_counts_kept_follow_the_notes_added_and_gone_and_change_no_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memo keeps how many notes have each word, moved by the notes added and gone since its last call.

    Recounting every note's words was most of a run after one new note (0.8 s of CPU at 65,536 notes).
    """
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(60)]

    def note(n: int) -> MemoryRecordView:
        return view(f"m_{n:04d}", " ".join(rng.sample(vocabulary, rng.randint(3, 9))), n % 50)

    notes = [note(n) for n in range(300)]
    made = len(notes)
    memo, recounted = PairMemo(), PairMemo()
    for _ in range(8):
        recounted.df = None  # counts every note's words again, as each call did before
        assert ids(cluster_by_words(notes, memo=memo)) == ids(cluster_by_words(notes, memo=recounted))
        assert memo.df == recounted.df == Counter(w for ws in memo.words.values() for w in ws)
        # Some notes merged or retired away, some said since.
        notes = [n for n in notes if rng.random() > 0.1]
        for _ in range(rng.randint(0, 40)):
            notes.append(note(made))
            made += 1
    # A call that fails part way leaves counts to be made again, not counts that are wrong.
    counted = consolidate._document_frequencies

    def fails_after_counting(*args: Any) -> Counter[str]:
        counted(*args)
        raise RuntimeError("cancelled part way")

    monkeypatch.setattr(consolidate, "_document_frequencies", fails_after_counting)
    with pytest.raises(RuntimeError):
        cluster_by_words([*notes[1:], view("m_zzzz", "w1 w2 w3")], memo=memo)
    assert memo.df is None
    monkeypatch.undo()
    recounted.df = None
    assert ids(cluster_by_words(notes, memo=memo)) == ids(cluster_by_words(notes, memo=recounted))
    assert memo.df == Counter(w for ws in memo.words.values() for w in ws)
