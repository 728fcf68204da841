"""Benchmark: one idle-extraction sweep over a database with a history (a million messages).

The job process (or ``goclaw worker``) looks for quiet sessions every quarter of
``session.idle_extract_seconds`` (every 10 s at the default 120): sessions whose live
messages past their "extracted through" mark have been quiet long enough. Trimmed
messages stay in ``messages`` (append-only), so a database's history only grows. This
fills a fresh database (migrated by Alembic) with ``--sessions`` sessions of
``--messages`` messages in all, each session's last ``--live`` messages live and the
rest trimmed, ``--pending`` of the sessions with their live messages not yet extracted,
then times ``IdleExtractor.quiet_sessions()`` ``--sweeps`` times: wall p50/p99 and CPU
(the process's: SQLite runs inline on it) a sweep. In trees since the twenty-eighth session the
first sweep (untimed, with the warm-up) looks at every session, and the timed ones at the
sessions with messages since the last sweep or still waiting; one sweep in 60 (every
``FULL_SWEEP_S``, 10 minutes) looks at every session again, at about the tree before's cost.

With ``--baseline-source DIR`` another tree does the same in the same run (each
measurement a process of its own on a fresh database, the trees alternating, ``--runs``
times; medians).

    .venv/bin/python bench/idle_sweep.py [--messages 1000000] [--sessions 2000] [--runs 3] [--postgres]
        [--baseline-source DIR]
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
# Another tree's sweep (--baseline-source) imports that tree's gateway: this script runs again as a
# child with GOCLAW_BENCH_SOURCE pointing there (bench/ab.py).
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import ab

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
COLUMNS = (
    "id",
    "session_id",
    "platform_message_id",
    "speaker_user_id",
    "stored_role",
    "display_name",
    "text",
    "said_at",
    "is_agent",
    "created_at",
    "archive_id",
    "reply_requested",
)


def _rows(args: argparse.Namespace, sqlite: bool) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """(sessions, messages) as rows, in ``COLUMNS`` order for the messages."""
    per = args.messages // args.sessions
    old = NOW - timedelta(hours=1)
    at: object = old.replace(tzinfo=None).isoformat(sep=" ") if sqlite else old
    sessions, messages = [], []
    next_id = 0
    for s in range(args.sessions):
        for k in range(per):
            next_id += 1
            trimmed = k < per - args.live
            archive = f"a_{s}_{k // 30}" if trimmed else None
            messages.append(
                (
                    next_id,
                    f"s_{s}",
                    f"p{next_id}",
                    "u_1",
                    "user",
                    "Ann",
                    "hello there",
                    at,
                    k % 2 == 1,
                    at,
                    archive,
                    False,
                )
            )
        mark = next_id - args.live if s < args.pending else next_id
        sessions.append((f"s_{s}", "api", f"c_{s}", "", None, "", at, at, mark))
    return sessions, messages


async def child(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Fill a fresh database and time the sweeps."""
    from gateway.idle import IdleExtractor

    sessions, messages = _rows(args, url.startswith("sqlite"))
    session_cols = (
        "id", "channel", "conversation_id", "thread_id", "parent_conversation_id", "previous_context",
        "created_at", "updated_at", "extracted_through",
    )  # fmt: skip
    tables = [("sessions", session_cols, sessions), ("messages", COLUMNS, messages)]
    # On SQLite the engine the job process, where the sweep runs, makes.
    engine = await ab.loaded(url, tables, inline=True)
    try:
        sweep = IdleExtractor(engine, idle_seconds=120, clock=lambda: NOW)
        want = min(args.pending, 100)

        def all_quiet(found: Any) -> None:
            if len(found) != want:
                raise RuntimeError(f"the sweep found {len(found)} quiet sessions, not {want}")

        return await ab.timed(args.sweeps, sweep.quiet_sessions, all_quiet)
    finally:
        await engine.dispose()


def _figures(r: dict[str, float]) -> str:
    return f"p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, CPU {r['cpu']:.2f} ms a sweep"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=2_000)
    ap.add_argument("--live", type=int, default=20, help="live (untrimmed) messages a session")
    ap.add_argument("--pending", type=int, default=40, help="sessions whose live messages are not yet extracted")
    ap.add_argument("--sweeps", type=int, default=20)
    ab.add_arguments(ap)
    args = ap.parse_args()
    if not 0 < args.live < args.messages // args.sessions or args.pending > args.sessions:
        ap.error("each session needs more messages than --live, and --pending at most --sessions")
    if args.child:
        print(json.dumps(await child(args.child, args)))
        return
    trees = ab.trees(ROOT, args)
    child_args = ["--messages", str(args.messages), "--sessions", str(args.sessions), "--live", str(args.live)]
    child_args += ["--pending", str(args.pending), "--sweeps", str(args.sweeps)] + ["--postgres"] * args.postgres
    med = await ab.on_fresh_databases(
        __file__, trees, args.runs, child_args, _figures, postgres=args.postgres, pg_server=args.pg_server
    )
    where = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"\n{where}, {args.messages:,} messages over {args.sessions:,} sessions ({args.live} live each, "
        f"{args.pending} sessions to extract), {args.sweeps} sweeps a run, medians of {args.runs} runs:"
    )
    ab.report(trees, med, _figures)


if __name__ == "__main__":
    asyncio.run(main())
