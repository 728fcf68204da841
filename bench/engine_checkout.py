"""A cold path's checkout: one SQLAlchemy session on PostgreSQL, one after another.

Everything off the turn's hot path (the dashboard, the CLI, an extraction's memory
writes in the job process, consolidation) goes through SQLAlchemy's engine
(``gateway.db.make_engine``), and each of its sessions checks a connection out of the
pool. This times the smallest such session, ``SELECT 1`` on a connection checked out
and back in, ``--sessions`` times one after another, on a fresh database, in this tree
and in another with ``--baseline-source DIR`` (each drain a process of its own, the two
alternating, ``--runs`` times; medians): wall ms and the client's CPU ms a session, and
PostgreSQL's CPU ms a session (every ``postgres`` process, as ``turn_overhead.py``
counts it). Trees before the twenty-third session pinged every checkout
(``pool_pre_ping``: three round trips with asyncpg); since then a connection is pinged
only after ``PING_AFTER_IDLE_S`` idle in the pool. ``--idle-ms`` waits that long between
two sessions (outside the timing), so a value past the limit times the pinged path.

    .venv/bin/python bench/engine_checkout.py [--sessions 2000] [--runs 5] [--idle-ms 0] [--baseline-source DIR]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from turn_overhead import pg_database, postgres_cpu_seconds


async def sessions(url: str, n: int, idle_s: float) -> tuple[float, float, float]:
    """(wall ms, CPU ms, PostgreSQL's CPU ms) a session, over ``n`` sessions (in the child)."""
    from sqlalchemy import text

    from gateway.db import make_engine

    engine = make_engine(url)
    try:
        for _ in range(20):  # connect, warm the statement caches
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        wall = cpu = 0.0
        pg0 = postgres_cpu_seconds()  # over the whole drain: /proc's clock ticks are 10 ms
        for _ in range(n):
            if idle_s:
                await asyncio.sleep(idle_s)
            cpu0, t0 = time.process_time(), time.perf_counter()
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            wall += time.perf_counter() - t0
            cpu += time.process_time() - cpu0
        pg = postgres_cpu_seconds() - pg0
        return wall * 1000 / n, cpu * 1000 / n, pg * 1000 / n
    finally:
        await engine.dispose()


def run_child(source: Path, server: str, n: int, idle_ms: float) -> tuple[float, float, float]:
    """One drain of ``source``'s engine on a fresh database, in a process of its own."""
    name = f"goclaw_bench_checkout_{secrets.token_hex(4)}"
    url = asyncio.run(pg_database(server, name))
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", url, "--sessions", str(n), "--idle-ms", str(idle_ms)],
            env={**os.environ, "GOCLAW_BENCH_SOURCE": str(source)},
            capture_output=True,
            text=True,
            check=True,
        )
        wall, cpu, pg = json.loads(out.stdout.strip().splitlines()[-1])
        return wall, cpu, pg
    finally:
        asyncio.run(pg_database(server, name, drop=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle-ms", type=float, default=0.0, help="wait this long between two sessions (untimed)")
    ap.add_argument("--pg-server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--baseline-source", type=Path, default=None, help="also time this tree's engine")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(sessions(args.child, args.sessions, args.idle_ms / 1000))))
        return
    trees = [("this", ROOT)] + ([("baseline", args.baseline_source.resolve())] if args.baseline_source else [])
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in trees}
    for run in range(args.runs):
        for name, source in trees if run % 2 == 0 else trees[::-1]:
            results[name].append(run_child(source, args.pg_server, args.sessions, args.idle_ms))
        print(
            f"run {run + 1}: "
            + " | ".join(f"{name} {r[-1][0]:.3f} ms (CPU {r[-1][1]:.3f})" for name, r in results.items()),
            flush=True,
        )
    print(f"\nmedian of {args.runs} runs, {args.sessions} sessions each, {args.idle_ms:g} ms idle between two:")
    for name, source in trees:
        wall, cpu, pg = (statistics.median(r[i] for r in results[name]) for i in range(3))
        print(f"  {name:9s} {wall:.3f} ms a session, CPU {cpu:.3f} ms, PostgreSQL's CPU {pg:.3f} ms ({source})")
    if args.baseline_source:
        this, base = (statistics.median(r[0] for r in results[n]) for n in ("this", "baseline"))
        print(f"  this/baseline wall: {this / base:.2f}")


if __name__ == "__main__":
    main()
