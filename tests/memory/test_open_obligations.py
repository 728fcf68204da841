"""The hold check and the open listing read the queue of open obligations, which the database keeps.

Before every SOP run starts (each claimed scheduled run, each webhook POST, each manual run) the
runner asks for the oldest open blocking obligation on that SOP; the dashboard, the findings page
and ``goclaw obligations`` list the open ones. Obligations and dispositions are insert-only, so an
obligation is open until a disposition row exists, and finding the open ones by an anti-join read
every obligation ever opened: 22 ms a hold check at 40,000 on one SOP on SQLite
(``bench/sop_hold.py``). Migration 0020 keeps ``open_obligations`` by triggers. These check (on
real SQLite and PostgreSQL, migrated) that both reads are driven by that queue, that it follows the
records whatever code inserts them (an older process during an upgrade included), and that the
migration fills it with the obligations already open.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from memory.facts_models import IntelligenceSignal, Obligation, ObligationDisposition, OpenObligation
from memory.obligations import FindingsStore, ObligationView, holding_obligation
from tests.conftest import Clock, alembic_downgrade, captured_reads, explain_captured, pg_scans
from tests.memory.conftest import ALICE

RESOLVED = 3_000
SOP = "deploy"
RECORDS = ("obligations", "obligation_dispositions")


def _signal(i: int, at: datetime) -> dict[str, Any]:
    return {
        "id": f"sg_ob{i:06d}", "sop_name": "research", "run_id": f"run-{i}", "reporter": "research",
        "subject": f"subject {i}", "claim": "a claim", "observation": "seen", "rationale": "why",
        "evidence": ["https://example.com/e"], "confidence": "medium", "reported_severity": "blocking",
        "affected_sops": [SOP], "observed_at": at, "expires_at": None, "recorded_at": at,
    }  # fmt: skip


def _obligation(i: int, at: datetime, *, sop: str = SOP, blocks: bool = True) -> dict[str, Any]:
    return {
        "id": f"ob_fill{i:06d}", "signal_id": f"sg_ob{i:06d}", "sop_name": sop, "severity": "blocking",
        "blocks": blocks, "opened_at": at, "reason": "blocking: held",
    }  # fmt: skip


def _disposition(obligation_id: str, at: datetime) -> dict[str, Any]:
    return {
        "obligation_id": obligation_id, "disposition": "no-action", "by_user_id": "u_alice", "by_role": "admin",
        "at": at, "rationale": "seen to",
    }  # fmt: skip


async def _insert(
    engine: AsyncEngine,
    obligations: Sequence[dict[str, Any]] = (),
    dispositions: Sequence[dict[str, Any]] = (),
) -> None:
    """Rows inserted as SQL, not through the store: what an older gateway process, or a restore, would write."""
    async with engine.begin() as conn:
        if obligations:
            at = obligations[0]["opened_at"]
            signals = [_signal(int(o["signal_id"][5:]), at) for o in obligations]
            await conn.execute(IntelligenceSignal.__table__.insert(), signals)
            await conn.execute(Obligation.__table__.insert(), list(obligations))
        if dispositions:
            await conn.execute(ObligationDisposition.__table__.insert(), list(dispositions))


async def _queued(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set((await conn.execute(select(OpenObligation.__table__.c.obligation_id))).scalars())


async def _assert_visits_the_open_ones_only(engine: AsyncEngine, reads: list[tuple[str, Any]], open_: int) -> None:
    assert reads, "nothing read the obligations"
    for statement, params in reads:
        plan = await explain_captured(engine, statement, params)
        if engine.dialect.name == "sqlite":
            # Each access of a record table is a search by its key, one row an open obligation (the
            # queue or a list of its ids drives it). The anti-join before: SCAN obligations, or
            # SEARCH obligations USING INDEX ix_obligations_sop_name (sop_name=?), every one the SOP had.
            steps = [line.split() for line in plan.splitlines()]
            records = [s for s in steps if s[0] in ("SCAN", "SEARCH") and s[1] in RECORDS]
            assert all(s[0] == "SEARCH" and s[-1] in ("(id=?)", "(obligation_id=?)") for s in records), plan
        else:
            # No scan of the records expected to visit more than the open ones (a hash anti-join over
            # a sequential scan of the dispositions, or an index scan of the SOP's obligations,
            # expects every one).
            scans = [n for table in RECORDS for n in pg_scans(plan, table)]
            assert all(n["Plan Rows"] <= open_ for n in scans), plan


async def _analyze(engine: AsyncEngine) -> None:
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE")  # as autovacuum does after a load


async def test_the_hold_check_and_the_open_listing_visit_the_open_obligations_only(
    engine: AsyncEngine, clock: Clock
) -> None:
    start = clock.now - timedelta(days=30)
    resolved = [_obligation(i, start + timedelta(minutes=i)) for i in range(RESOLVED)]
    await _insert(engine, resolved, [_disposition(o["id"], clock.now) for o in resolved])
    # Open: two blocking on the SOP (the larger id opened first), one owed but not blocking, one on another SOP.
    later = start + timedelta(minutes=RESOLVED)
    await _insert(engine, [_obligation(RESOLVED + 1, later + timedelta(minutes=1))])
    await _insert(engine, [_obligation(RESOLVED + 2, later)])
    await _insert(engine, [_obligation(RESOLVED + 3, later - timedelta(days=40), blocks=False)])
    await _insert(engine, [_obligation(RESOLVED + 4, later - timedelta(days=50), sop="publish")])
    await _analyze(engine)
    store = FindingsStore(engine, clock=clock)

    with captured_reads(engine, "obligation") as reads:  # the records' and the queue's
        held = await holding_obligation(store, SOP)
    assert held == f"ob_fill{RESOLVED + 2:06d}"
    await _assert_visits_the_open_ones_only(engine, reads, 4)

    with captured_reads(engine, "obligation") as reads:
        listed = await store.obligations()
    assert [o.id for o in listed] == [f"ob_fill{RESOLVED + i:06d}" for i in (4, 3, 2, 1)]
    await _assert_visits_the_open_ones_only(engine, reads, 4)

    with captured_reads(engine, "obligation") as reads:
        on_sop = await store.obligations(sop_name=SOP)
    assert [o.id for o in on_sop] == [f"ob_fill{RESOLVED + i:06d}" for i in (3, 2, 1)]
    await _assert_visits_the_open_ones_only(engine, reads, 4)

    # The same obligations, in the same order, as the full listing's open ones: only the read changed.
    def open_of(every: list[ObligationView]) -> list[ObligationView]:
        return [o for o in every if o.status == "open"]

    assert listed == open_of(await store.obligations(include_resolved=True))
    assert on_sop == open_of(await store.obligations(include_resolved=True, sop_name=SOP))
    assert [o.holds for o in on_sop] == [False, True, True]
    signal = f"sg_ob{RESOLVED + 1:06d}"
    assert await store.obligations(signal_id=signal) == open_of(await store.obligations(include_resolved=True))[-1:]
    assert await store.obligations(signal_id="sg_ob000000") == []  # resolved


async def test_a_disposition_inserted_by_sql_releases_the_hold(engine: AsyncEngine, clock: Clock) -> None:
    store = FindingsStore(engine, clock=clock)
    await _insert(engine, [_obligation(1, clock.now)])
    await _insert(engine, [_obligation(2, clock.now + timedelta(minutes=1))])
    assert await holding_obligation(store, SOP) == "ob_fill000001"
    # An older process, which knows nothing of the queue, records a disposition: the database takes
    # the obligation off the queue, and the next one holds.
    await _insert(engine, dispositions=[_disposition("ob_fill000001", clock.now)])
    assert await _queued(engine) == {"ob_fill000002"}
    assert await holding_obligation(store, SOP) == "ob_fill000002"
    done = await store.resolve("ob_fill000002", by=ALICE, disposition="no-action", rationale="ok")
    assert done.status == "resolved"
    assert await _queued(engine) == set()
    assert await holding_obligation(store, SOP) is None
    assert await store.obligations() == []


async def test_an_obligation_inserted_by_sql_holds(engine: AsyncEngine, clock: Clock) -> None:
    store = FindingsStore(engine, clock=clock)
    assert await holding_obligation(store, SOP) is None
    # An older router opens an obligation without knowing the queue: the database queues it, and it holds.
    await _insert(engine, [_obligation(7, clock.now)])
    assert await _queued(engine) == {"ob_fill000007"}
    assert await holding_obligation(store, SOP) == "ob_fill000007"
    (listed,) = await store.obligations()
    assert (listed.id, listed.holds, listed.opened_at) == ("ob_fill000007", True, clock.now)


async def _has_queue(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: "open_obligations" in inspect(c).get_table_names())


async def test_the_migration_queues_the_obligations_already_open_and_downgrades(
    engine: AsyncEngine, clock: Clock
) -> None:
    from gateway.db import upgrade

    async with engine.begin() as conn:
        await conn.run_sync(alembic_downgrade, "0019_unrouted_signals")
    assert not await _has_queue(engine)
    # Obligations opened before the upgrade: two resolved, two open, the older open one not blocking.
    await _insert(
        engine,
        [_obligation(i, clock.now + timedelta(minutes=i), blocks=i != 1) for i in range(4)],
        [_disposition(f"ob_fill{i:06d}", clock.now) for i in (0, 2)],
    )
    await upgrade(engine)
    assert await _queued(engine) == {"ob_fill000001", "ob_fill000003"}
    store = FindingsStore(engine, clock=clock)
    assert await holding_obligation(store, SOP) == "ob_fill000003"
    assert [o.id for o in await store.obligations()] == ["ob_fill000001", "ob_fill000003"]
    async with engine.begin() as conn:
        await conn.run_sync(alembic_downgrade, "0019_unrouted_signals")
    assert not await _has_queue(engine)
    # No trigger left behind to write to a table that is gone.
    await _insert(engine, [_obligation(9, clock.now)], [_disposition("ob_fill000001", clock.now)])
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM obligations"))).scalar_one() == 5
