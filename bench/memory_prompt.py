"""Benchmark: choosing and rendering memory for a turn's prompt at 100,000 records.

Fills a temporary SQLite database (with ``--postgres``, a fresh PostgreSQL
database; migrated by Alembic, as in production) with 100,000 memory records --
operational notes with their superseded history and personal records for many
people -- then runs ``memory_sections`` for varied conversations and speakers,
and prints p50/p99 latency and the tokens injected against the budget. Asserts the budget is never exceeded.

The calls run with the collector set as ``goclaw serve`` sets it once started
(``gateway.heap.settle_heap``: start-up's objects frozen, a young collection per
100,000 allocations); ``--default-gc`` keeps CPython's defaults instead, under which
the fill's objects and the store's kept views were walked by a young collection every
nine calls or so and by one full collection of 55-70 ms (2026-12-03). The number of
collections of each generation during the calls is printed.

Beside the wall-clock figures it prints the calls' CPU time (SQLite runs inline on
the calling thread, so that is all of their work) and, between the calls, a fixed
~2 ms CPU loop's wall p50/p99: on a shared VM the p99 of any short computation is
mostly the machine's (that loop's p99 was 6x its p50 on 2026-12-02), and this says
how much, in the same run.

The fill writes rows directly (bulk insert, the same columns and term index the
store writes); the gate is for what people and runs say, and this is a fixture.

Usage: .venv/bin/python bench/memory_prompt.py [--records N] [--runs N] [--budget N] [--expired N] [--postgres]
    [--default-gc]

With ``--expired N`` the fill adds N notes past their review-by date (still ``live``: nothing
recorded them again) with their index terms; a tree whose job worker prunes those terms
(``MemoryStore.prune_expired_postings``) prunes them before the calls, as its worker does when idle.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# memory_write.py fills another tree's database (--baseline-source) with this: GOCLAW_BENCH_SOURCE names it.
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(Path(__file__).resolve().parents[1]))

from gateway.db import make_engine, upgrade
from gateway.heap import settle_heap
from gateway.hotstore import hot_store
from memory.models import MemoryRecord, MemoryTerm
from memory.render import identity_lines, memory_sections
from memory.store import MemoryStore, note_postings
from memory.words import subject_key
from pairing.principal import Principal, Role

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
TOPICS = [
    "report", "invoice", "server", "backup", "deploy", "holiday", "payroll", "customer", "supplier", "warehouse",
    "dashboard", "export", "forecast", "ticket", "release", "budget", "contract", "audit", "security", "database",
]  # fmt: skip
IDENTITY_RECORDS = 12
"""Identity records (``agent_config`` and ``global``) the fill adds: every prompt renders them."""
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "xe", "zu", "pa", "qi", "fo", "de", "gi", "ha"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))


def _sentence(rng: random.Random, vocab: list[str], topic: str, n: int) -> str:
    return f"{topic} " + " ".join(rng.choice(vocab) for _ in range(n))


def _row(rng: random.Random, **kw: Any) -> dict[str, Any]:
    said = NOW - timedelta(minutes=rng.randint(0, 60 * 24 * 80))
    base = {
        "id": "m_" + secrets.token_hex(8),
        "owner_user_id": None,
        "said_at": said,
        "recorded_at": said,
        "review_by": None,
        "source": "live",
        "author_user_id": "u_admin0",
        "author_role": "admin",
        "session_id": "s_bench",
        "evidence": ["msg-1"],
        "run_id": None,
        "superseded_by": None,
    }
    base.update(kw)
    base["subject_key"] = subject_key(base["subject"])
    return base


async def fill(store_engine: Any, records: int, users: int, rng: random.Random, *, expired: int = 0) -> dict[str, int]:
    vocab = [_word(rng) for _ in range(3000)]
    rows: list[dict[str, Any]] = []
    terms_rows: list[dict[str, Any]] = []
    n_notes = records // 5  # 20% operational notes (a third live, the rest their history)
    subjects = [f"{rng.choice(TOPICS)} {_word(rng)}" for _ in range(n_notes // 3)]
    live_subjects: set[str] = set()
    for i in range(n_notes):
        subject = subjects[i % len(subjects)]
        live = subject not in live_subjects
        live_subjects.add(subject)
        content = _sentence(rng, vocab, subject.split()[0], rng.randint(6, 24))
        row = _row(
            rng,
            scope="agent_notes",
            subject=subject,
            content=content,
            status="live" if live else "superseded",
            review_by=NOW + timedelta(days=rng.randint(-5, 90)),
        )
        rows.append(row)
        if live:
            terms_rows.extend(note_postings(row["id"], subject, content, row["said_at"], row["review_by"]))
    for _ in range(records - n_notes):
        uid = f"u_{rng.randrange(users)}"
        topic = rng.choice(TOPICS)
        rows.append(
            _row(
                rng,
                scope="personal",
                owner_user_id=uid,
                subject=f"{topic} preference",
                content=_sentence(rng, vocab, topic, rng.randint(4, 16)),
                status="live" if rng.random() < 0.8 else "superseded",
                author_user_id=uid,
                author_role="user",
            )
        )
    for k in range(expired):  # notes nobody recorded again past their review-by date: still 'live'
        said = NOW - timedelta(days=100 + k % 700, minutes=k)
        topic = rng.choice(TOPICS)
        row = _row(
            rng,
            scope="agent_notes",
            subject=f"{topic} {_word(rng)}",
            content=_sentence(rng, vocab, topic, rng.randint(6, 24)),
            status="live",
            review_by=said + timedelta(days=90),
        )
        row.update(said_at=said, recorded_at=said)
        rows.append(row)
        terms_rows.extend(note_postings(row["id"], row["subject"], row["content"], said, row["review_by"]))
    for k in range(IDENTITY_RECORDS):  # set up with the agent, before everything else
        scope = "agent_config" if k % 2 == 0 else "global"
        said = NOW - timedelta(days=100, minutes=k)
        rows.append(
            {
                **_row(
                    rng, scope=scope, subject=f"identity rule {k}", content=f"Always answer rule {k}", status="live"
                ),
                "said_at": said,
                "recorded_at": said,
            }
        )
    async with store_engine.begin() as conn:
        for start in range(0, len(rows), 5000):
            await conn.execute(MemoryRecord.__table__.insert(), rows[start : start + 5000])
        for start in range(0, len(terms_rows), 20000):
            await conn.execute(MemoryTerm.__table__.insert(), terms_rows[start : start + 20000])
    return {"records": len(rows), "live_notes": len(live_subjects), "terms": len(terms_rows), "vocab": len(vocab)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--budget", type=int, default=1200)
    parser.add_argument("--identity-runs", type=int, default=30)
    parser.add_argument(
        "--expired",
        type=int,
        default=0,
        help="also this many notes past their review-by date (a tree that prunes their index terms does so first)",
    )
    parser.add_argument("--postgres", action="store_true", help="a fresh PostgreSQL database instead of a SQLite file")
    parser.add_argument("--pg-server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--default-gc", action="store_true", help="CPython's collector thresholds, not the ones goclaw serve sets"
    )
    args = parser.parse_args()
    rng = random.Random(42)

    with tempfile.TemporaryDirectory(prefix="goclaw-bench-") as folder:
        pg_name = None
        if args.postgres:
            url, pg_name = await fresh_pg_database(args.pg_server)
        else:
            url = f"sqlite+aiosqlite:///{Path(folder) / 'bench.db'}"
        engine = make_engine(url)
        try:
            await upgrade(engine)
            t0 = time.perf_counter()
            shape = await fill(engine, args.records, args.users, rng, expired=args.expired)
            if args.expired:
                pruned = await prune_expired(engine)
                print(f"{args.expired:,} notes past their review-by date; their index terms pruned first: {pruned}")
            if pg_name:
                await vacuum_analyze(url)
            print(
                f"filled {shape['records']:,} records ({shape['live_notes']:,} live notes, "
                f"{shape['terms']:,} index terms) in {time.perf_counter() - t0:.1f}s"
                + (" (PostgreSQL, then VACUUM ANALYZE as autovacuum would)" if pg_name else "")
            )
            await measure(engine, args, rng)
        finally:
            await engine.dispose()
            if pg_name:
                await drop_pg_database(args.pg_server, pg_name)


async def prune_expired(engine: Any) -> bool:
    """As the job worker does when idle (trees since the twenty-eighth session), until none is left; False if
    this tree's store cannot (its index keeps the expired notes' terms)."""
    store = MemoryStore(engine, clock=lambda: NOW)
    prune = getattr(store, "prune_expired_postings", None)
    if prune is None:
        return False
    while (await prune(notes=1000))[1]:
        pass
    return True


async def fresh_pg_database(server: str) -> tuple[str, str]:
    """A new empty database on the PostgreSQL at ``server``: (its SQLAlchemy URL, its name)."""
    import asyncpg

    name = "goclaw_bench_" + secrets.token_hex(5)
    conn = await asyncpg.connect(server)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{server.rpartition('/')[0]}/{name}".replace("postgresql://", "postgresql+asyncpg://", 1), name


async def vacuum_analyze(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await conn.execute("VACUUM ANALYZE memory_records, memory_terms")
    finally:
        await conn.close()


async def drop_pg_database(server: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(server)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def measure(engine: Any, args: argparse.Namespace, rng: random.Random) -> None:
    """Time ``memory_sections`` for varied conversations and speakers; print p50/p99 and the tokens."""
    store = MemoryStore(engine, clock=lambda: NOW, raw=hot_store(engine))  # as the gateway builds it
    vocab_sample = [_word(rng) for _ in range(500)]
    speakers = [Principal.human(f"u_{rng.randrange(args.users)}", Role.USER) for _ in range(50)]
    speakers += [Principal.human("u_admin0", Role.ADMIN), Principal.system("cron-system"), Principal.unpaired()]

    # Warm the connection pool and the database's page cache, as a running gateway would be.
    for _ in range(10):
        await memory_sections(store, speakers[0], "report invoice", token_budget=args.budget)

    if not args.default_gc:
        settle_heap()  # as goclaw serve does once started (gateway/heap.py)
    collections = [0, 0, 0]

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections[info["generation"]] += 1

    gc.callbacks.append(counted)
    timings: list[float] = []
    cpu: list[float] = []
    probe: list[float] = []
    tokens: list[int] = []
    items: list[int] = []
    spins = _calibrate(2.0)
    for run in range(args.runs):
        principal = speakers[run % len(speakers)]
        words = [rng.choice(TOPICS) for _ in range(rng.randint(0, 3))]
        words += [rng.choice(vocab_sample) for _ in range(rng.randint(0, 12))]
        conversation = "Can you help me with the " + " ".join(words) + " please? " * rng.randint(0, 3)
        start, start_cpu = time.perf_counter(), time.thread_time()
        sections = await memory_sections(store, principal, conversation, token_budget=args.budget)
        timings.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
        probe.append(_spin(spins))
        tokens.append(sections.tokens)
        items.append(len(sections.used_ids))
        assert sections.tokens <= args.budget, (sections.tokens, args.budget)
        if principal.is_system or not principal.is_human:
            assert sections.personal == ""

    gc.callbacks.remove(counted)
    timings.sort()
    p50, p99 = statistics.median(timings), _p99(timings)
    print(f"memory_sections x{args.runs}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {timings[-1]:.2f} ms")
    print(
        f"  its CPU (this thread: SQLite runs inline on it): p50 {statistics.median(cpu):.2f} ms, "
        f"p99 {_p99(cpu):.2f} ms"
    )
    print(
        f"  the machine's own tail, a fixed CPU loop between the calls: p50 {statistics.median(probe):.2f} ms, "
        f"p99 {_p99(probe):.2f} ms (wall; what a shared VM adds to any p99)"
    )
    print(
        f"tokens injected: mean {statistics.mean(tokens):.0f}, max {max(tokens)} of budget {args.budget} "
        f"(never exceeded); items per prompt: mean {statistics.mean(items):.1f}"
    )
    # The identity lines: every prompt has them, from a cache each serving process refreshes every
    # IDENTITY_TTL_S (gateway/memory_glue.py), in the turn that finds it stale.
    identity, identity_cpu = [], []
    for _ in range(args.identity_runs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        lines = await identity_lines(store)
        identity.append((time.perf_counter() - start) * 1000)
        identity_cpu.append((time.thread_time() - start_cpu) * 1000)
        assert len(lines) == IDENTITY_RECORDS, len(lines)
    identity.sort()
    print(
        f"identity_lines x{args.identity_runs} (the turn that finds the cache stale, every 30 s): "
        f"p50 {statistics.median(identity):.2f} ms, p99 {_p99(identity):.2f} ms, "
        f"CPU p50 {statistics.median(identity_cpu):.2f} ms"
    )
    heap = "CPython's defaults (--default-gc)" if args.default_gc else "as goclaw serve sets it (gateway/heap.py)"
    print(
        f"the collector {heap}: {collections[0]} young, {collections[1]} middle and {collections[2]} full "
        "collections during the calls"
    )


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _spin(n: int) -> float:
    """Wall ms of ``n`` turns of a fixed pure-Python loop (no I/O, no allocation to speak of)."""
    start = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return (time.perf_counter() - start) * 1000


def _calibrate(ms: float) -> int:
    """The loop length whose best of a few runs takes about ``ms``: the probe of the machine's own tail."""
    n = 100_000
    best = min(_spin(n) for _ in range(5))
    return max(1, int(n * ms / max(best, 1e-6)))


if __name__ == "__main__":
    asyncio.run(main())
