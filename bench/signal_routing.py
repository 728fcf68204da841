"""Benchmark: the intelligence router's look for unrouted signals, over a database with a history.

Before each SOP scheduler step (every 15 s) and before an SOP run starts, the serving
process's worker thread routes every signal not yet routed (``route_pending``): nearly
always none. Signals and their routings are insert-only (seed 001), so a deployment's
signals only grow. This fills a fresh database (migrated by Alembic) with ``--signals``
routed signals (each with its routing row; one in ten raised an obligation) and
``--pending`` unrouted ones, routes those once (untimed), then times ``route_pending``
``--calls`` times with nothing left to route (the common case): wall p50/p99 and CPU
(the process's: on SQLite the worker thread's inline driver runs on it) a call.

With ``--baseline-source DIR`` another tree does the same in the same run (each
measurement a process of its own on a fresh database, the trees alternating, ``--runs``
times; medians: ``bench/ab.py``).

    .venv/bin/python bench/signal_routing.py [--signals 200000] [--pending 20] [--calls 30] [--runs 3]
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
# Another tree's router (--baseline-source) imports that tree's code: this script runs again as a
# child with GOCLAW_BENCH_SOURCE pointing there (bench/ab.py).
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import ab

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
SIGNAL_COLUMNS = (
    "id",
    "sop_name",
    "run_id",
    "reporter",
    "subject",
    "claim",
    "observation",
    "rationale",
    "evidence",
    "confidence",
    "reported_severity",
    "affected_sops",
    "observed_at",
    "expires_at",
    "recorded_at",
)
ROUTING_COLUMNS = ("signal_id", "routed_at", "severity", "outcome", "reason", "floors")
EVIDENCE = json.dumps(["https://example.com/e"])
OBLIGATION_COLUMNS = ("id", "signal_id", "sop_name", "severity", "blocks", "opened_at", "reason")


def _rows(n: int, sqlite: bool) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], list[tuple[object, ...]]]:
    """(signals, routings, obligations) of ``n`` routed signals, a minute apart, the last a minute before NOW."""

    def at(t: datetime) -> object:
        return t.replace(tzinfo=None).isoformat(sep=" ") if sqlite else t

    signals, routings, obligations = [], [], []
    for i in range(n):
        t = NOW - timedelta(minutes=n - i)
        sid = f"sg_{i:012x}"
        raised = i % 10 == 0
        severity = "blocking" if raised else "info"
        signals.append(
            (
                sid, "research", f"run-{i // 5}", "research", f"subject {i % 500}", "a claim", "an observation",
                "a rationale", EVIDENCE, "medium", severity, "[]", at(t), None, at(t),
            )
        )  # fmt: skip
        outcome = "raised" if raised else "noted"
        routings.append((sid, at(t), severity, outcome, f"{severity}: {outcome}", "[]"))
        if raised:
            obligations.append((f"ob_{i:012x}", sid, "research", severity, True, at(t), "blocking: held"))
    return signals, routings, obligations


async def child(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Fill a fresh database, route the pending signals once, and time the calls that find none."""
    from memory.intelligence import RoutingPolicy, parse_report
    from memory.obligations import FindingsStore, route_pending

    signals, routings, obligations = _rows(args.signals, url.startswith("sqlite"))
    tables = [
        ("intelligence_signals", SIGNAL_COLUMNS, signals),
        ("signal_routings", ROUTING_COLUMNS, routings),
        ("obligations", OBLIGATION_COLUMNS, obligations),
    ]
    # On SQLite the engine the serving process's worker thread, where the router runs, makes.
    engine = await ab.loaded(url, tables, inline=True)
    try:
        store = FindingsStore(engine, clock=lambda: NOW)
        report = {"subject": "s", "claim": "c", "observation": "o", "evidence": ["e"], "confidence": "low",
                  "reported_severity": "advisory"}  # fmt: skip
        for i in range(args.pending):
            await store.append_signal(parse_report(report, now=NOW), sop_name="research", run_id=f"r{i}", reporter="x")
        policy = RoutingPolicy()
        routed = await route_pending(store, policy, NOW)
        if len(routed) != args.pending:
            raise RuntimeError(f"the router routed {len(routed)} signals, not the {args.pending} pending")

        def none_left(found: Any) -> None:
            if found:
                raise RuntimeError(f"the router found {len(found)} signals to route, where none was left")

        return await ab.timed(args.calls, lambda: route_pending(store, policy, NOW), none_left)
    finally:
        await engine.dispose()


def _figures(r: dict[str, float]) -> str:
    return f"p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, CPU {r['cpu']:.2f} ms a call"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--signals", type=int, default=200_000, help="routed signals already stored")
    ap.add_argument("--pending", type=int, default=20, help="unrouted signals, routed once before the timed calls")
    ap.add_argument("--calls", type=int, default=30)
    ab.add_arguments(ap)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(await child(args.child, args)))
        return
    trees = ab.trees(ROOT, args)
    child_args = ["--signals", str(args.signals), "--pending", str(args.pending), "--calls", str(args.calls)]
    child_args += ["--postgres"] * args.postgres
    med = await ab.on_fresh_databases(
        __file__, trees, args.runs, child_args, _figures, postgres=args.postgres, pg_server=args.pg_server
    )
    where = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"\n{where}, {args.signals:,} routed signals ({args.pending} more routed once before), "
        f"{args.calls} calls a run finding none to route, medians of {args.runs} runs:"
    )
    ab.report(trees, med, _figures)


if __name__ == "__main__":
    asyncio.run(main())
