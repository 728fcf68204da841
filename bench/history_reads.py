"""Benchmark: two reads that ran over a table's whole history, over a database that has one.

- A DM from a sender nobody paired asks for their pairing code (``PairingStore.request_code``,
  on the serving process's loop): the channel's pending requests not yet expired. An expired
  request stays 'pending', so a channel's expired codes only grow (each stranger who never
  got approved, a flood of them included).
- Every automatic distillation (every 5 minutes, on the worker thread) reads the undone
  revisions, its vetoes (``MemoryStore.undone_revisions``): a revision row is written for
  every retirement, each conversation summary's included, and few are ever undone.

This fills a fresh database (migrated by Alembic) with ``--history`` expired pairing requests
on one channel and ``--history`` revision rows, ``--undone`` of them undone, then times a
repeat DM's code request and the vetoes' read, ``--calls`` times each: wall p50/p99 and the
process's CPU a call (all its threads: aiosqlite's included).

With ``--baseline-source DIR`` another tree does the same in the same run (each measurement a
process of its own on a fresh database, the trees alternating, ``--runs`` times; medians:
``bench/ab.py``).

    .venv/bin/python bench/history_reads.py [--history 200000] [--undone 5] [--calls 30] [--runs 3]
        [--postgres] [--baseline-source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Another tree's stores (--baseline-source) import that tree's code: this script runs again as a
# child with GOCLAW_BENCH_SOURCE pointing there (bench/ab.py).
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import ab

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
REQUEST_COLUMNS = ("channel", "code", "platform_user_id", "display_name", "created_at", "expires_at", "status")
RECORD_COLUMNS = (
    "id", "scope", "owner_user_id", "subject", "subject_key", "content", "status", "said_at", "recorded_at",
    "source", "author_user_id", "author_role", "session_id", "evidence",
)  # fmt: skip
REVISION_COLUMNS = (
    "id",
    "retired_id",
    "replacing_id",
    "reason",
    "via",
    "cause",
    "created_at",
    "undone_at",
    "undone_by",
)


def _rows(args: argparse.Namespace, sqlite: bool) -> list[tuple[str, tuple[str, ...], list[tuple[Any, ...]]]]:
    def at(t: datetime) -> Any:
        return t.replace(tzinfo=None).isoformat(sep=" ") if sqlite else t

    n = args.history
    requests = [
        ("discord", f"C{i:07d}", f"p{i}", f"p{i}", at(NOW - timedelta(hours=2, minutes=i)),
         at(NOW - timedelta(hours=1, minutes=i)), "pending")
        for i in range(n)
    ]  # fmt: skip
    records = [
        (f"m_{k}", "personal", "u_1", "conversation summary", "conversation summary", f"summary {k}", "superseded",
         at(NOW), at(NOW), "live", "u_1", "user", "s_1", '["msg-1"]')
        for k in range(2)
    ]  # fmt: skip
    undone = set(range(0, n, max(1, n // args.undone))[: args.undone])
    revisions = [
        (f"rv_{i}", "m_0", "m_1", "newer", "subject_rule", "newer", at(NOW - timedelta(minutes=i)),
         at(NOW) if i in undone else None, "u_admin" if i in undone else None)
        for i in range(n)
    ]  # fmt: skip
    return [
        ("pairing_requests", REQUEST_COLUMNS, requests),
        ("memory_records", RECORD_COLUMNS, records),
        ("memory_revisions", REVISION_COLUMNS, revisions),
    ]


async def child(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Fill a fresh database and time the two reads."""
    from memory.store import MemoryStore
    from pairing.store import PairingStore

    # The serving process's engine (its loop answers DMs; the worker thread's differs).
    engine = await ab.loaded(url, _rows(args, url.startswith("sqlite")))
    try:
        pairing = PairingStore(engine, clock=lambda: NOW)
        first = await pairing.request_code("discord", "stranger", "Stranger")

        def same_code(got: Any) -> None:
            if got.code != first.code or got.new:
                raise RuntimeError("a repeat DM did not get its code back")

        def vetoes(got: Any) -> None:
            if len(got) != args.undone:
                raise RuntimeError(f"read {len(got)} undone revisions, not {args.undone}")

        code = await ab.timed(args.calls, lambda: pairing.request_code("discord", "stranger", "Stranger"), same_code)
        store = MemoryStore(engine, clock=lambda: NOW)
        undone = await ab.timed(args.calls, store.undone_revisions, vetoes)
        return {**code, **{f"undone_{k}": v for k, v in undone.items()}}
    finally:
        await engine.dispose()


def _figures(r: dict[str, float]) -> str:
    return (
        f"a code request p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, CPU {r['cpu']:.2f} ms; the vetoes' read p50"
        f" {r['undone_p50']:.2f} ms, p99 {r['undone_p99']:.2f} ms, CPU {r['undone_cpu']:.2f} ms"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=200_000, help="expired pairing requests, and revision rows")
    ap.add_argument("--undone", type=int, default=5, help="revision rows undone")
    ap.add_argument("--calls", type=int, default=30)
    ab.add_arguments(ap)
    args = ap.parse_args()
    if not 0 < args.undone <= args.history:
        ap.error("--undone must be between 1 and --history")
    if args.child:
        print(json.dumps(await child(args.child, args)))
        return
    trees = ab.trees(ROOT, args)
    child_args = ["--history", str(args.history), "--undone", str(args.undone), "--calls", str(args.calls)]
    med = await ab.on_fresh_databases(
        __file__, trees, args.runs, child_args + ["--postgres"] * args.postgres, _figures,
        postgres=args.postgres, pg_server=args.pg_server,
    )  # fmt: skip
    where = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"\n{where}, {args.history:,} expired pairing requests and {args.history:,} revision rows "
        f"({args.undone} undone), {args.calls} calls a run, medians of {args.runs} runs:"
    )
    ab.report(trees, med, _figures)
    if "baseline" in med:
        this, base = med["this"], med["baseline"]
        print(f"  this / baseline, the vetoes' read: p50 {this['undone_p50'] / base['undone_p50']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
