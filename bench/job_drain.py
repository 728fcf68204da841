"""Job drain: how fast one worker gets through a queue of jobs, finishing each and claiming the next.

A worker with a queue (a burst of trims queues one ``trim`` and then one ``extract``
job per session; a model outage leaves its retries) spends, between two jobs, one
``finish_and_claim``: mark the finished job done (or delete it) and claim the oldest
runnable one. This times that step alone, on a fresh database: ``--jobs`` jobs
queued, then claimed and finished one after another until none is left, through the
hot store the job process uses. On SQLite it runs inside the write lock the turns
wait for.

- **this**: this tree's ``finish_and_claim``;
- **baseline**: with ``--baseline-source DIR`` another tree's (its own migrations,
  so its own index), else this tree's through ``HotStore.finish_and_claim``, the
  default the hot store interface keeps: ``finish_job`` then ``claim_job``, two
  commits (what PostgreSQL ran before 2026-12-04).

Each drain runs in a process of its own, on its own database; the two alternate,
``--runs`` times, and medians are printed: wall time per job, the drain's CPU per
job, and on PostgreSQL PostgreSQL's CPU per job (every ``postgres`` process, as
``turn_overhead.py`` counts it) and the server's durable commit time. On
PostgreSQL the plan of the claim follows the table's statistics, which a fresh
database has not got: by default the queue is drained as a burst meets it, before
autovacuum has looked at the table; ``--analyze`` analyzes the table once the jobs are
queued, as autovacuum does within a minute of a burst.

    .venv/bin/python bench/job_drain.py [--jobs 2000] [--runs 5] [--postgres] [--analyze] [--baseline-source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A drain of another tree (--baseline-source) imports that tree's gateway: this script runs again as a
# child with GOCLAW_BENCH_SOURCE pointing there (turn_overhead.py does the same).
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from turn_overhead import durable_commit_ms, pg_database, postgres_cpu_seconds

KIND = "bench"
LEASE = timedelta(seconds=60)


async def drain(url: str, jobs: int, *, two_calls: bool, postgres: bool, analyze: bool) -> tuple[float, float, float]:
    """(wall ms, CPU ms, PostgreSQL's CPU ms) per job, for ``jobs`` queued jobs (in the child)."""
    from gateway.db import make_engine, upgrade
    from gateway.hotstore import hot_store
    from gateway.hotstore.base import HotStore

    engine = make_engine(url)
    try:
        await upgrade(engine)
        store = hot_store(engine)
        step = HotStore.finish_and_claim if two_calls else type(store).finish_and_claim
        now = datetime.now(UTC)
        for i in range(jobs):
            await store.queue_job(KIND, {"n": i}, now)
        if analyze:
            from sqlalchemy import text

            async with engine.begin() as conn:
                await conn.execute(text("ANALYZE jobs"))
        job = await store.claim_job("bench", (KIND,), now, now - LEASE)
        done = 0
        pg0 = postgres_cpu_seconds() if postgres else 0.0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while job is not None:
            job = await step(store, job.id, "bench", (KIND,), now, now - LEASE, forget=True)
            done += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        pg = postgres_cpu_seconds() - pg0 if postgres else 0.0
        if done != jobs:
            raise RuntimeError(f"drained {done} of {jobs} jobs")
        return wall * 1000 / jobs, cpu * 1000 / jobs, pg * 1000 / jobs
    finally:
        await engine.dispose()


def run_child(
    source: Path, url: str, jobs: int, *, two_calls: bool, postgres: bool, analyze: bool
) -> tuple[float, float, float]:
    cmd = [sys.executable, __file__, "--child", url, "--jobs", str(jobs)]
    cmd += ["--two-calls"] * two_calls + ["--postgres"] * postgres + ["--analyze"] * analyze
    env = {**os.environ, "GOCLAW_BENCH_SOURCE": str(source)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    wall, cpu, pg = json.loads(out.strip().splitlines()[-1])
    return wall, cpu, pg


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--postgres", action="store_true", help="fresh PostgreSQL databases instead of SQLite files")
    ap.add_argument("--pg-server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--baseline-source", type=Path, default=None, help="drain with this tree's code as the baseline")
    ap.add_argument(
        "--analyze", action="store_true", help="ANALYZE the jobs table once queued (autovacuum does within a minute)"
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the child that drains one database
    ap.add_argument("--two-calls", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        got = await drain(args.child, args.jobs, two_calls=args.two_calls, postgres=args.postgres, analyze=args.analyze)
        print(json.dumps(got))
        return
    base = args.baseline_source.resolve() if args.baseline_source else None
    trees = {"this": (ROOT, False), "baseline": (base, False) if base else (ROOT, True)}
    results: dict[str, list[tuple[float, float, float]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            order = ["this", "baseline"] if run % 2 == 0 else ["baseline", "this"]  # which goes first alternates
            for name in order:
                source, two_calls = trees[name]
                db = f"goclaw_job_drain_{secrets.token_hex(4)}"
                if args.postgres:
                    url = await pg_database(args.pg_server, db)
                else:
                    url = f"sqlite+aiosqlite:///{Path(tmp) / (db + '.db')}"
                try:
                    r = run_child(
                        source, url, args.jobs, two_calls=two_calls, postgres=args.postgres, analyze=args.analyze
                    )
                finally:
                    if args.postgres:
                        await pg_database(args.pg_server, db, drop=True)
                results[name].append(r)
                pg_run = f", PostgreSQL {r[2]:.3f}" if args.postgres else ""
                print(f"run {run + 1}: {name:8} {r[0]:.3f} ms a job (CPU: the drain {r[1]:.3f}{pg_run})")
    where = "PostgreSQL" if args.postgres else "SQLite"
    stats = " (the table analyzed once queued)" if args.analyze else ""
    print(f"\n{where}, {args.jobs} jobs{stats}, medians of {args.runs} runs in alternating order (ms a job):")
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in results.items()}
    labels = {"this": str(ROOT), "baseline": str(base) if base else "finish_job + claim_job"}
    for name in ("this", "baseline"):
        wall, cpu, pg = med[name]
        pg_part = f", PostgreSQL {pg:.3f}" if args.postgres else ""
        print(f"  {name:8} ({labels[name]}) wall {wall:.3f}, CPU {cpu:.3f}{pg_part}")
    print(f"  this / baseline: wall {med['this'][0] / med['baseline'][0]:.2f}x")
    if args.postgres:
        print(f"  a durable commit on this server: {await durable_commit_ms(args.pg_server):.2f} ms (median of 200)")


if __name__ == "__main__":
    asyncio.run(main())
