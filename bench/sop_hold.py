"""Benchmark: the hold check an SOP run asks before it starts, over a database with a history.

Before every SOP run starts (each claimed scheduled run, every 15 s step; each webhook POST;
each manual run) the runner asks for the oldest open blocking obligation on that SOP
(``holding_obligation``). Obligations and their dispositions are insert-only (seed 001): an
obligation is open until a disposition row exists for it, so a deployment's obligations only
grow. This fills a fresh database (migrated by Alembic) with ``--obligations`` resolved
obligations on one SOP (each from a routed signal, each with its disposition) and ``--open``
open ones on it that do not block (owed, not holding: the SOP may run), then times
``holding_obligation`` ``--calls`` times: wall p50/p99 and CPU (the process's: on SQLite the
inline driver runs on the calling thread) a call; and the open listing (``obligations()``: the
dashboard's overview, the findings page, ``goclaw obligations``), wall p50 a call.

With ``--baseline-source DIR`` another tree does the same in the same run (each
measurement a process of its own on a fresh database, the trees alternating, ``--runs``
times; medians: ``bench/ab.py``).

    .venv/bin/python bench/sop_hold.py [--obligations 200000] [--open 5] [--calls 30] [--runs 3]
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
# Another tree's store (--baseline-source) imports that tree's code: this script runs again as a
# child with GOCLAW_BENCH_SOURCE pointing there (bench/ab.py).
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import ab
from signal_routing import EVIDENCE, OBLIGATION_COLUMNS, ROUTING_COLUMNS, SIGNAL_COLUMNS  # the same tables' fill

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
SOP = "deploy"
DISPOSITION_COLUMNS = ("obligation_id", "disposition", "by_user_id", "by_role", "at", "rationale")
AFFECTS = json.dumps([SOP])

Rows = list[tuple[object, ...]]


def _rows(n: int, open_: int, sqlite: bool) -> tuple[Rows, Rows, Rows, Rows]:
    """(signals, routings, obligations, dispositions): ``n`` resolved obligations on SOP, a minute apart,
    then ``open_`` open ones that do not block, the last a minute before NOW."""

    def at(t: datetime) -> object:
        return t.replace(tzinfo=None).isoformat(sep=" ") if sqlite else t

    signals, routings, obligations, dispositions = [], [], [], []
    for i in range(n + open_):
        t = NOW - timedelta(minutes=n + open_ - i)
        sid, oid = f"sg_{i:012x}", f"ob_{i:012x}"
        resolved = i < n
        severity = "blocking" if resolved else "advisory"
        signals.append(
            (
                sid, "research", f"run-{i // 5}", "research", f"subject {i % 500}", "a claim", "an observation",
                "a rationale", EVIDENCE, "medium", severity, AFFECTS, at(t), None, at(t),
            )
        )  # fmt: skip
        routings.append((sid, at(t), severity, "raised", f"{severity}: raised", "[]"))
        obligations.append((oid, sid, SOP, severity, resolved, at(t), f"{severity}: raised"))
        if resolved:
            dispositions.append((oid, "no-action", "u_admin", "admin", at(t + timedelta(seconds=30)), "seen to"))
    return signals, routings, obligations, dispositions


async def child(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Fill a fresh database and time the hold checks (and the open listings) on the SOP."""
    from memory.obligations import FindingsStore, holding_obligation

    signals, routings, obligations, dispositions = _rows(args.obligations, args.open, url.startswith("sqlite"))
    tables = [
        ("intelligence_signals", SIGNAL_COLUMNS, signals),
        ("signal_routings", ROUTING_COLUMNS, routings),
        ("obligations", OBLIGATION_COLUMNS, obligations),
        ("obligation_dispositions", DISPOSITION_COLUMNS, dispositions),
    ]
    # On SQLite the engine the serving process's worker thread, where the runner asks, makes.
    engine = await ab.loaded(url, tables, inline=True)
    try:
        store = FindingsStore(engine, clock=lambda: NOW)

        def free(held: Any) -> None:
            if held is not None:
                raise RuntimeError(f"{held} holds {SOP}, where no open obligation blocks")

        def all_open(listed: Any) -> None:
            if len(listed) != args.open:
                raise RuntimeError(f"{len(listed)} open obligations listed, not {args.open}")

        hold = await ab.timed(args.calls, lambda: holding_obligation(store, SOP), free)
        listing = await ab.timed(args.calls, store.obligations, all_open)
        return {**hold, "list": listing["p50"]}
    finally:
        await engine.dispose()


def _figures(r: dict[str, float]) -> str:
    return (
        f"hold check p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, CPU {r['cpu']:.2f} ms a call; "
        f"open listing p50 {r['list']:.2f} ms"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--obligations", type=int, default=200_000, help="resolved obligations already on the SOP")
    ap.add_argument("--open", type=int, default=5, help="open obligations on the SOP, none blocking")
    ap.add_argument("--calls", type=int, default=30)
    ab.add_arguments(ap)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(await child(args.child, args)))
        return
    trees = ab.trees(ROOT, args)
    child_args = ["--obligations", str(args.obligations), "--open", str(args.open), "--calls", str(args.calls)]
    child_args += ["--postgres"] * args.postgres
    med = await ab.on_fresh_databases(
        __file__, trees, args.runs, child_args, _figures, postgres=args.postgres, pg_server=args.pg_server
    )
    where = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"\n{where}, {args.obligations:,} resolved obligations on one SOP and {args.open} open (none blocking), "
        f"{args.calls} hold checks a run, medians of {args.runs} runs:"
    )
    ab.report(trees, med, _figures)


if __name__ == "__main__":
    asyncio.run(main())
