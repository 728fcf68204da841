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

Each run's wall time and CPU (the process's, every thread: clustering runs on
one of its own) are printed. Then ``--settled`` more runs over the settled store
(nothing left to show, the caches warm: what the automatic distillation does
every five minutes) and their medians.

``--memory``: what consolidation keeps in the process once the runs are over.
Traces allocations (``tracemalloc``, started after the fill: the runs' times
are then not comparable with a run without it), and reports, after
``gc.collect()``, the bytes, the objects the collector tracks
(``len(gc.get_objects())``) and the time of one full collection (median of 5)
with everything consolidation keeps, then after emptying the ``lru_cache``\ s of
``memory.consolidate`` and then also the consolidator's own memory
(``Consolidator.forget()``: the looked-at cache and the pairs compared); the
differences are what each kept. Also counts the tracked containers among the
cached values.

The store is built as ``goclaw serve``'s job process builds it, where consolidation runs (the
worker thread before 2026-12-06, built the same way: on SQLite the inline engine, with the hot
store's raw reads). Another tree's code: ``GOCLAW_BENCH_SOURCE=DIR``
(the same script, that tree's ``memory`` and ``gateway`` packages).

Usage: .venv/bin/python bench/consolidation.py [--notes N] [--dup-rate F] [--seed N] [--url URL]
       [--settled N] [--memory]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(Path(__file__).resolve().parents[1]))

import memory.consolidate
from gateway.db import make_engine, upgrade
from gateway.hotstore import hot_store
from gateway.sqlite_inline import make_inline_engine
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


def _held() -> tuple[int, int, float]:
    """(bytes traced, objects the collector tracks, one full collection's seconds: median of 5), after a collection."""
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    tracked = len(gc.get_objects())
    pauses = []
    for _ in range(5):
        t = time.perf_counter()
        gc.collect()
        pauses.append(time.perf_counter() - t)
    return held, tracked, statistics.median(pauses)


def _cached_objects() -> tuple[int, int]:
    """(the keys and values ``memory.consolidate``'s ``lru_cache``\\ s hold, those the collector tracks)."""
    held: list[Any] = []
    for fn in vars(memory.consolidate).values():
        if callable(getattr(fn, "cache_info", None)):
            # An lru_cache shows the collector each entry's key and value, its dict, function and types.
            held.extend(
                r
                for r in gc.get_referents(fn)
                if not isinstance(r, type | dict) and r is not fn.__wrapped__ and type(r) is not object
            )
    return len(held), sum(gc.is_tracked(o) for o in held)


def _memory_report(consolidator: Consolidator) -> None:
    full = _held()
    memo = [o for o in gc.get_referents(consolidator._pairs) if isinstance(o, dict)]
    memo_values = [v for d in memo for v in d.values()]
    cached, tracked_cached = _cached_objects()
    memo_tracked = sum(gc.is_tracked(v) for v in memo_values)
    n_memo_values = len(memo_values)
    del memo, memo_values  # what forget() lets go of must not be held here
    for fn in vars(memory.consolidate).values():
        if callable(getattr(fn, "cache_clear", None)):
            fn.cache_clear()
    no_lru = _held()
    consolidator.forget()
    empty = _held()
    print(
        f"kept by consolidation: lru_caches {(full[0] - no_lru[0]) / 1e6:.1f} MB, {full[1] - no_lru[1]} tracked "
        f"objects ({cached} keys and values, {tracked_cached} of them tracked); the consolidator's own "
        f"{(no_lru[0] - empty[0]) / 1e6:.1f} MB, {no_lru[1] - empty[1]} tracked objects ({n_memo_values} values "
        f"in the pair memo's dicts, {memo_tracked} of them tracked); in all {(full[0] - empty[0]) / 1e6:.1f} MB, "
        f"{full[1] - empty[1]} tracked objects"
    )
    print(
        f"full collection: {full[2] * 1e3:.1f} ms with them, {no_lru[2] * 1e3:.1f} ms without the lru_caches, "
        f"{empty[2] * 1e3:.1f} ms without any ({full[1]} / {no_lru[1]} / {empty[1]} tracked objects)"
    )


async def main(notes: int, dup_rate: float, seed: int, url: str | None, settled: int, memory: bool) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(url or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        await upgrade(engine)
        t0 = time.perf_counter()
        n_dups = await fill(engine, notes, dup_rate, rng)
        print(f"filled {notes} notes ({n_dups} repeats) in {time.perf_counter() - t0:.1f} s")
        # As the job process that runs consolidation in `goclaw serve` makes its store: on SQLite
        # the inline driver's engine, and the hot store's raw reads (gateway/memory_glue.py).
        work_engine = (
            make_inline_engine(engine.url.render_as_string(False)) if engine.dialect.name == "sqlite" else engine
        )
        store = MemoryStore(work_engine, clock=lambda: NOW, raw=hot_store(work_engine))
        model = CountingModel()
        consolidator = Consolidator(MemoryWriter(store), model, model_name="builtin-offline")
        cron = Principal.system("cron-system")
        if memory:
            gc.collect()
            tracemalloc.start()
        head = ("run", 4), ("calls", 5), ("shown", 6), ("merges", 6), ("retired", 7), ("waiting", 7), ("secs", 6)
        print(" ".join(f"{name:>{width}}" for name, width in (*head, ("cpu", 6))))
        total_calls = total_merges = total_retired = runs = 0
        started = time.perf_counter()
        while True:
            t, c = time.perf_counter(), time.process_time()
            run = await consolidator.run(cron)
            secs, cpu = time.perf_counter() - t, time.process_time() - c
            runs += 1
            assert run.model_calls <= MAX_CALLS and run.failed_calls == 0, run.summary()
            total_calls += run.model_calls
            total_merges += len(run.merged)
            total_retired += run.retired
            print(
                f"{runs:>4} {run.model_calls:>5} {run.shown:>6} {len(run.merged):>6} {run.retired:>7} "
                f"{run.waiting:>7} {secs:>6.2f} {cpu:>6.2f}"
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
        if settled:
            walls, cpus = [], []
            for _ in range(settled):
                t, c = time.perf_counter(), time.process_time()
                run = await consolidator.run(cron)
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
                assert run.model_calls == 0, run.summary()
            print(
                f"settled: {settled} runs over {live} notes, median wall {statistics.median(walls):.3f} s, "
                f"CPU {statistics.median(cpus):.3f} s (walls {', '.join(f'{w:.3f}' for w in walls)})"
            )
        if memory:
            _memory_report(consolidator)
            tracemalloc.stop()
        if work_engine is not engine:
            await work_engine.dispose()
        await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--dup-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--url", default=None, help="a database URL instead of a temporary SQLite file")
    parser.add_argument("--settled", type=int, default=3, help="runs over the settled store, timed")
    parser.add_argument("--memory", action="store_true", help="what consolidation keeps once the runs are over")
    args = parser.parse_args()
    asyncio.run(main(args.notes, args.dup_rate, args.seed, args.url, args.settled, args.memory))
