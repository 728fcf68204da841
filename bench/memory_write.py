"""Benchmark: one gated memory write at 100,000 records, where many people share a subject.

Every write through the gate reads its subject first (the live and unverified records,
and the same saying in any status) and, for a live one, applies the subject rule. Personal
subjects are shared by name: everyone may have a "report preference", and every trim's
extraction writes its speaker a "conversation summary" that supersedes the last. This
fills a database as ``memory_prompt.py`` does (100,000 records, 2,000 people, personal
records on 20 "<topic> preference" subjects), adds each person a history of conversation
summaries (``--summaries`` each, the last live, within ``--records``), then times
``--writes`` writes through ``MemoryWriter.write``, each in a transaction of its own as the
extraction job and the ``memory_write`` tool make them (sources ``live`` and ``memory_write``),
half of them a person's new preference and half a person's new conversation summary, for
people picked at random.

With ``--baseline-source DIR`` another tree does the same in the same run (its own
migrations, so its own indexes); each measurement runs in a process of its own on a fresh
database, the two trees alternating, ``--runs`` times, and the medians are printed: wall
p50 and p99 a write, and the CPU a write (the process's: SQLite runs inline on it).

    .venv/bin/python bench/memory_write.py [--records 100000] [--writes 400] [--runs 3] [--postgres]
        [--baseline-source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Another tree's write (--baseline-source) imports that tree's memory package: this script runs again
# as a child with GOCLAW_BENCH_SOURCE pointing there (memory_prompt.py, whose fill it uses, honours it).
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import ab

SUMMARY_SUBJECT = "conversation summary"  # gateway.memory_glue.SUMMARY_SUBJECT


async def child(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Fill a fresh database and time the writes: p50/p99 wall ms, CPU ms a write."""
    import secrets

    from memory_prompt import NOW, TOPICS, _row, fill, vacuum_analyze

    from gateway.db import make_engine, upgrade
    from gateway.hotstore import hot_store
    from memory.models import MemoryRecord
    from memory.store import MemoryStore
    from memory.writer import MemoryWriter
    from pairing.principal import Principal, Role

    rng = random.Random(7)
    if url.startswith("sqlite"):
        from gateway.db import checkpoint_elsewhere
        from gateway.sqlite_inline import make_inline_engine

        # As the job process, where extraction writes, makes its engine; its commits copy no WAL
        # (it checkpoints once a second on a thread of its own), so a write's time is the write's.
        checkpoint_elsewhere()
        engine = make_inline_engine(url)
    else:
        engine = make_engine(url)
    try:
        await upgrade(engine)
        summaries = args.users * args.summaries
        await fill(engine, args.records - summaries, args.users, rng)
        rows = []
        for u in range(args.users):
            for k in range(args.summaries):
                rows.append(
                    _row(
                        rng,
                        scope="personal",
                        owner_user_id=f"u_{u}",
                        subject=SUMMARY_SUBJECT,
                        content=f"talked about the weekly report, part {k}",
                        status="live" if k == args.summaries - 1 else "superseded",
                        author_user_id=f"u_{u}",
                        author_role="user",
                        source="live",
                        said_at=NOW - timedelta(days=args.summaries - k),
                    )
                )
        async with engine.begin() as conn:
            for start in range(0, len(rows), 5000):
                await conn.execute(MemoryRecord.__table__.insert(), rows[start : start + 5000])
        if args.postgres:
            await vacuum_analyze(url)  # what autovacuum does after a bulk load
        clock = [NOW]
        store = MemoryStore(engine, clock=lambda: clock[0], raw=hot_store(engine))  # as the gateway builds it
        writer = MemoryWriter(store)
        walls: list[float] = []
        cpu = 0.0
        for i in range(args.warmup + args.writes):
            clock[0] = NOW + timedelta(seconds=i + 1)
            uid = f"u_{rng.randrange(args.users)}"
            person = Principal.human(uid, Role.USER)
            if i % 2:
                subject, source = SUMMARY_SUBJECT, "live"  # as an extraction job writes it
                content = f"talked about the {rng.choice(TOPICS)} {secrets.token_hex(3)}"
            else:
                topic = rng.choice(TOPICS)
                subject, source = f"{topic} preference", "memory_write"  # as the model's tool writes it
                content = f"{topic} should come as a {secrets.token_hex(3)} file"
            c0, t0 = time.process_time(), time.perf_counter()
            result = await writer.write(
                person, "personal", source, subject=subject, content=content, said_at=clock[0], owner_user_id=uid
            )
            t1, c1 = time.perf_counter(), time.process_time()
            if not result.written:
                raise RuntimeError(f"write {i} was not written: {result.decision}")
            if i >= args.warmup:
                walls.append((t1 - t0) * 1000)
                cpu += c1 - c0
        walls.sort()
        p99 = walls[min(len(walls) - 1, round(0.99 * (len(walls) - 1)))]
        return {"p50": statistics.median(walls), "p99": p99, "cpu": cpu * 1000 / args.writes}
    finally:
        await engine.dispose()


def _figures(r: dict[str, float]) -> str:
    return f"p50 {r['p50']:.3f} ms, p99 {r['p99']:.3f} ms, CPU {r['cpu']:.3f} ms a write"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--summaries", type=int, default=10, help="conversation summaries each person has had")
    ap.add_argument("--writes", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    ab.add_arguments(ap)
    args = ap.parse_args()
    if args.users * args.summaries >= args.records:
        ap.error("--users x --summaries must be fewer than --records")
    if args.child:
        print(json.dumps(await child(args.child, args)))
        return
    trees = ab.trees(ROOT, args)
    child_args = ["--records", str(args.records), "--users", str(args.users), "--summaries", str(args.summaries)]
    child_args += ["--writes", str(args.writes), "--warmup", str(args.warmup)] + ["--postgres"] * args.postgres
    med = await ab.on_fresh_databases(
        __file__, trees, args.runs, child_args, _figures, postgres=args.postgres, pg_server=args.pg_server
    )
    where = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"\n{where}, {args.records:,} records ({args.users:,} people, {args.summaries} conversation summaries each), "
        f"{args.writes} gated writes a run, medians of {args.runs} runs:"
    )
    ab.report(trees, med, _figures)


if __name__ == "__main__":
    asyncio.run(main())
