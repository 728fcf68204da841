"""The router reads the queue of unrouted signals, which the database keeps (real SQLite and PostgreSQL, migrated).

Before each SOP scheduler step (every 15 s) and each SOP run, the serving process routes
the signals without a routing row. Signals and routings are insert-only, so finding them
by an anti-join read every signal ever reported: 54 ms a call at 200,000 signals on
SQLite (``bench/signal_routing.py``), nearly always to find none. Migration 0019 keeps
``unrouted_signals`` by triggers. These check that the router's read is driven by that
queue, that the queue follows the records whatever code inserts them (an older process
during an upgrade included), and that the migration fills it with the signals already waiting.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from memory.facts_models import IntelligenceSignal, SignalRouting, UnroutedSignal
from memory.intelligence import RoutingPolicy, parse_report
from memory.obligations import FindingsStore, route_pending
from tests.conftest import Clock, alembic_downgrade, captured_reads, explain_captured, pg_scans

ROUTED = 2_000


def _signal(i: int, at: Any) -> dict[str, Any]:
    return {
        "id": f"sg_fill{i:06d}", "sop_name": "research", "run_id": f"run-{i}", "reporter": "research",
        "subject": f"subject {i}", "claim": "a claim", "observation": "seen", "rationale": "why",
        "evidence": ["https://example.com/e"], "confidence": "medium", "reported_severity": "blocking",
        "affected_sops": [], "observed_at": at, "expires_at": None, "recorded_at": at,
    }  # fmt: skip


def _routing(signal_id: str, at: Any) -> dict[str, Any]:
    return {
        "signal_id": signal_id,
        "routed_at": at,
        "severity": "info",
        "outcome": "noted",
        "reason": "r",
        "floors": [],
    }


async def _insert(engine: AsyncEngine, signals: list[dict[str, Any]], routings: list[dict[str, Any]]) -> None:
    """Rows inserted as SQL, not through the store: what an older gateway process, or a restore, would write."""
    async with engine.begin() as conn:
        if signals:
            await conn.execute(IntelligenceSignal.__table__.insert(), signals)
        if routings:
            await conn.execute(SignalRouting.__table__.insert(), routings)


async def _queued(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set((await conn.execute(select(UnroutedSignal.__table__.c.signal_id))).scalars())


async def _append(store: FindingsStore, clock: Clock, n: int) -> list[str]:
    report = {"subject": "s", "claim": "c", "observation": "o", "evidence": ["e"], "confidence": "low",
              "reported_severity": "info"}  # fmt: skip
    out = []
    for i in range(n):
        signal = await store.append_signal(
            parse_report(report, now=clock.now), sop_name="r", run_id=f"r{i}", reporter="x"
        )
        out.append(signal.id)
    return out


async def test_the_routers_reads_visit_the_waiting_signals_not_every_signal(engine: AsyncEngine, clock: Clock) -> None:
    rows = [_signal(i, clock.now - timedelta(minutes=ROUTED - i)) for i in range(ROUTED)]
    await _insert(engine, rows, [_routing(r["id"], clock.now) for r in rows])
    store = FindingsStore(engine, clock=clock)
    waiting = await _append(store, clock, 3)
    assert await _queued(engine) == set(waiting)
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE")  # as autovacuum does after a load
    with captured_reads(engine, "intelligence_signals") as reads:
        routed = await route_pending(store, RoutingPolicy(), clock.now)
    assert sorted(r.signal_id for r in routed) == sorted(waiting)
    assert reads, "the router read no signal"
    for statement, params in reads:
        plan = await explain_captured(engine, statement, params)
        if engine.dialect.name == "sqlite":
            # Each read of the signals is a search by id; the anti-join before: SCAN intelligence_signals.
            steps = [line for line in plan.splitlines() if "intelligence_signals" in line]
            assert steps and all(line.startswith("SEARCH") and "(id=?)" in line for line in steps), plan
        else:
            # No scan of the signals expected to visit more than those waiting (a merge join over the
            # primary key, or a hash anti-join over a sequential scan, expects every signal).
            scans = pg_scans(plan, "intelligence_signals")
            assert scans and all(n["Plan Rows"] <= len(waiting) for n in scans), plan
    assert await _queued(engine) == set()
    assert await route_pending(store, RoutingPolicy(), clock.now) == []


async def test_the_queue_follows_the_records_whatever_inserts_them(engine: AsyncEngine, clock: Clock) -> None:
    store = FindingsStore(engine, clock=clock)
    # An older process reports a signal without knowing the queue: the database queues it, and it is routed.
    await _insert(engine, [_signal(1, clock.now)], [])
    assert await _queued(engine) == {"sg_fill000001"}
    # An older router routes one of ours: the database takes it off the queue, so it is not routed twice.
    ours = await _append(store, clock, 2)
    await _insert(engine, [], [_routing(ours[0], clock.now)])
    assert await _queued(engine) == {"sg_fill000001", ours[1]}
    routed = await route_pending(store, RoutingPolicy(), clock.now)
    assert sorted(r.signal_id for r in routed) == sorted(["sg_fill000001", ours[1]])
    signals = await store.signals()
    assert len(signals) == 3 and all(routing is not None for _, routing in signals)
    assert [s.id for s, _ in await store.signals(unrouted_only=True)] == []
    async with engine.connect() as conn:
        routings = (await conn.execute(select(func.count()).select_from(SignalRouting.__table__))).scalar_one()
    assert routings == 3  # each signal routed once: the older router's routing stands


async def _has_queue(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: "unrouted_signals" in inspect(c).get_table_names())


async def test_the_migration_queues_the_signals_already_waiting_and_downgrades(
    engine: AsyncEngine, clock: Clock
) -> None:
    from gateway.db import upgrade

    async with engine.begin() as conn:
        await conn.run_sync(alembic_downgrade, "0018_subject_index_owner")
    assert not await _has_queue(engine)
    # Signals reported before the upgrade: two routed, two waiting.
    await _insert(
        engine, [_signal(i, clock.now) for i in range(4)], [_routing(f"sg_fill{i:06d}", clock.now) for i in (0, 2)]
    )
    await upgrade(engine)
    assert await _queued(engine) == {"sg_fill000001", "sg_fill000003"}
    store = FindingsStore(engine, clock=clock)
    assert sorted(r.signal_id for r in await route_pending(store, RoutingPolicy(), clock.now)) == [
        "sg_fill000001",
        "sg_fill000003",
    ]
    async with engine.begin() as conn:
        await conn.run_sync(alembic_downgrade, "0018_subject_index_owner")
    assert not await _has_queue(engine)
    await _insert(engine, [_signal(9, clock.now)], [])  # no trigger left behind to write to a table that is gone
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM intelligence_signals"))).scalar_one() == 5
