"""Benchmark: consolidation of 10,000 operational notes, 5% of them repeats, with the builtin model.

Fills a temporary SQLite database (migrated by Alembic, as in production) with
``--notes`` live agent_notes, each on its own subject; ``--dup-rate`` of them
are repeats of another note, worded the same apart from case, spacing and
punctuation. Then runs consolidation (``memory.consolidate.Consolidator``, the
builtin ``consolidation_result`` model, as ``cron-system``) run after run until
a run has nothing left to show, and prints per run and in total: model calls,
records shown, merges, records retired, and wall time. Asserts that every
repeat was merged and that no call showed more than 40 records nor any run made
more than 6 calls.

The fill writes rows directly (bulk insert, the same columns and term index the
store writes); the gate is for what people and runs say, and this is a fixture.
Every merge goes through the gate and the store as in production.

Usage: .venv/bin/python bench/consolidation.py [--notes N] [--dup-rate F] [--seed N] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.db import make_engine, upgrade
from memory.consolidate import BATCH_SIZE, MAX_CALLS, Consolidator
from memory.models import MemoryRecord, MemoryTerm
from memory.rules import builtin_consolidation_result
from memory.store import MemoryStore, note_postings
from memory.words import subject_key
from memory.writer import MemoryWriter
from pairing.principal import Principal

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
TOPICS = [
    "report", "invoice", "server", "backup", "deploy", "holiday", "payroll", "customer", "supplier", "warehouse",
    "dashboard", "export", "forecast", "ticket", "release", "budget", "contract", "audit", "security", "database",
]  # fmt: skip
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "xe", "zu", "pa", "qi", "fo", "de", "gi", "ha"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))


def _reworded(rng: random.Random, content: str) -> str:
    """The same note said again: other case, spacing and punctuation only."""
    variants = [content.lower(), content.upper(), "  " + content.replace(" ", "  "), content.rstrip(".") + "!"]
    return rng.choice(variants)


async def fill(engine: Any, notes: int, dup_rate: float, rng: random.Random) -> int:
    vocab = [_word(rng) for _ in range(3000)]
    contents: list[str] = []
    n_dups = int(notes * dup_rate)
    for _ in range(notes - n_dups):
        topic = rng.choice(TOPICS)
        words = " ".join(rng.choice(vocab) for _ in range(rng.randint(5, 9)))
        contents.append(f"The {topic} {words} uses {rng.choice(vocab)}_{rng.randint(1, 999)}.")
    for original in rng.sample(contents, n_dups):
        contents.append(_reworded(rng, original))
    rng.shuffle(contents)
    rows: list[dict[str, Any]] = []
    term_rows: list[dict[str, Any]] = []
    for i, content in enumerate(contents):
        rid = "m_" + secrets.token_hex(8)
        said = NOW - timedelta(minutes=rng.randint(0, 60 * 24 * 60))
        subject = f"note {i}"
        rows.append(
            {
                "id": rid, "scope": "agent_notes", "owner_user_id": None, "subject": subject,
                "subject_key": subject_key(subject), "content": content, "status": "live", "said_at": said,
                "recorded_at": said, "review_by": NOW + timedelta(days=60), "source": "live",
                "author_user_id": "u_admin", "author_role": "admin", "session_id": "s_bench", "evidence": [],
                "run_id": None, "superseded_by": None,
            }
        )  # fmt: skip
        term_rows.extend(note_postings(rid, subject, content, said, rows[-1]["review_by"]))
    async with engine.begin() as conn:
        for start in range(0, len(rows), 2000):
            await conn.execute(MemoryRecord.__table__.insert(), rows[start : start + 2000])
        for start in range(0, len(term_rows), 5000):
            await conn.execute(MemoryTerm.__table__.insert(), term_rows[start : start + 5000])
    return n_dups


class CountingModel:
    """The builtin consolidation model, counting calls and the largest batch it was shown."""

    def __init__(self) -> None:
        self.calls = 0
        self.largest = 0

    async def __call__(self, system: str, user: str) -> str:
        import json

        self.calls += 1
        self.largest = max(self.largest, len(json.loads(user)["records"]))
        return builtin_consolidation_result(system, user)


async def main(notes: int, dup_rate: float, seed: int, url: str | None) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(url or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        await upgrade(engine)
        t0 = time.perf_counter()
        n_dups = await fill(engine, notes, dup_rate, rng)
        print(f"filled {notes} notes ({n_dups} repeats) in {time.perf_counter() - t0:.1f} s")
        store = MemoryStore(engine, clock=lambda: NOW)
        model = CountingModel()
        consolidator = Consolidator(MemoryWriter(store), model, model_name="builtin-offline")
        cron = Principal.system("cron-system")
        print(f"{'run':>4} {'calls':>5} {'shown':>6} {'merges':>6} {'retired':>7} {'waiting':>7} {'secs':>6}")
        total_calls = total_merges = total_retired = runs = 0
        started = time.perf_counter()
        while True:
            t = time.perf_counter()
            run = await consolidator.run(cron)
            secs = time.perf_counter() - t
            runs += 1
            assert run.model_calls <= MAX_CALLS and run.failed_calls == 0, run.summary()
            total_calls += run.model_calls
            total_merges += len(run.merged)
            total_retired += run.retired
            print(
                f"{runs:>4} {run.model_calls:>5} {run.shown:>6} {len(run.merged):>6} {run.retired:>7} "
                f"{run.waiting:>7} {secs:>6.2f}"
            )
            if run.model_calls == 0 or runs >= 1000:
                break
        wall = time.perf_counter() - started
        live = len(await store.live_notes(limit=notes * 2))
        print(
            f"total: {runs} runs, {total_calls} model calls, {total_merges} merges retiring {total_retired} notes, "
            f"{live} live notes left, largest batch {model.largest} (limit {BATCH_SIZE}), wall {wall:.1f} s"
        )
        assert model.largest <= BATCH_SIZE
        # Every repeat is merged with its original: one merged note replaces the two.
        assert total_merges == n_dups and live == notes - n_dups, (total_merges, n_dups, live)
        await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--dup-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--url", default=None, help="a database URL instead of a temporary SQLite file")
    args = parser.parse_args()
    asyncio.run(main(args.notes, args.dup_rate, args.seed, args.url))
