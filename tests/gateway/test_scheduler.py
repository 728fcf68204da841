"""The memory scheduler: nightly consolidation, automatic distillation with backoff, notes_distill, the lock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import make_engine, upgrade
from gateway.llm.builtin import BuiltinProvider
from gateway.scheduler import (
    BUSY,
    Scheduler,
    consolidation_model,
    distill_wait,
    judge_model,
    next_consolidation_at,
    parse_hh_mm,
)
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from tests.conftest import Clock
from tests.memory.conftest import ALICE, BOB, CRON, T0

NO_MERGES = json.dumps({"merges": []})


class Model:
    """A consolidation model that fails the first ``failures`` calls, then finds no repeats."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self, system: str, user: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("model server unreachable")
        return NO_MERGES


class FakeSleep:
    """Records each wait and moves the clock; after ``stop_after`` waits it blocks until cancelled."""

    def __init__(self, clock: Clock, stop_after: int) -> None:
        self.clock = clock
        self.stop_after = stop_after
        self.waits: list[float] = []
        self.reached = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if len(self.waits) >= self.stop_after:
            self.reached.set()
            await asyncio.Event().wait()
        self.clock.advance(seconds=seconds)


async def _notes(writer: MemoryWriter) -> None:
    await writer.write(ALICE, "agent_notes", "live", subject="vpn", content="VPN on vpn.example.internal", said_at=T0)
    await writer.write(
        ALICE, "agent_notes", "live", subject="vpn backup", content="Backup VPN on vpn2.example.internal", said_at=T0
    )


def _scheduler(engine: AsyncEngine, clock: Clock, model: Any, **kw: Any) -> tuple[Scheduler, MemoryWriter]:
    writer = MemoryWriter(MemoryStore(engine, clock=clock))
    return Scheduler(engine=engine, writer=writer, model=model, model_name="scripted", clock=clock, **kw), writer


def test_the_automatic_distillation_backs_off_5_10_20_up_to_6_hours() -> None:
    minutes = [distill_wait(n) / timedelta(minutes=1) for n in range(10)]
    assert minutes == [5, 10, 20, 40, 80, 160, 320, 360, 360, 360]
    assert distill_wait(1000) == timedelta(hours=6)


def test_the_nightly_time_is_the_next_hh_mm_utc() -> None:
    at = parse_hh_mm("03:00")
    assert next_consolidation_at(datetime(2026, 11, 30, 9, 0, tzinfo=UTC), at) == datetime(
        2026, 12, 1, 3, 0, tzinfo=UTC
    )
    assert next_consolidation_at(datetime(2026, 11, 30, 2, 59, tzinfo=UTC), at) == datetime(2026, 11, 30, 3, tzinfo=UTC)
    assert next_consolidation_at(datetime(2026, 11, 30, 3, 0, tzinfo=UTC), at) == datetime(2026, 12, 1, 3, tzinfo=UTC)
    assert parse_hh_mm("23:45") == time(23, 45, tzinfo=UTC)
    with pytest.raises(ValueError, match="HH:MM"):
        parse_hh_mm("3pm")


async def test_distill_once_doubles_after_failed_runs_and_resets_after_a_success(
    engine: AsyncEngine, clock: Clock
) -> None:
    scheduler, writer = _scheduler(engine, clock, Model(failures=2), auto_distill=True)
    await _notes(writer)
    assert scheduler.next_distill_wait == timedelta(minutes=5)
    first = await scheduler.distill_once()
    assert first and first.failed and scheduler.next_distill_wait == timedelta(minutes=10)
    await scheduler.distill_once()
    assert scheduler.next_distill_wait == timedelta(minutes=20)
    third = await scheduler.distill_once()
    assert third and not third.failed and third.model_calls == 1
    assert scheduler.next_distill_wait == timedelta(minutes=5)


async def test_the_automatic_loop_waits_5_10_20_40_then_5_again(engine: AsyncEngine, clock: Clock) -> None:
    sleep = FakeSleep(clock, stop_after=5)
    scheduler, writer = _scheduler(engine, clock, Model(failures=3), sleep=sleep, consolidation_time="03:00")
    await _notes(writer)
    # Only the distillation loop's waits: the nightly loop is not started here.
    task = asyncio.create_task(scheduler._distill_loop())
    await asyncio.wait_for(sleep.reached.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [w / 60 for w in sleep.waits] == [5, 10, 20, 40, 5]


async def test_the_nightly_loop_sleeps_until_consolidation_time(engine: AsyncEngine, clock: Clock) -> None:
    sleep = FakeSleep(clock, stop_after=3)
    model = Model()
    scheduler, writer = _scheduler(engine, clock, model, sleep=sleep, consolidation_time="03:00", auto_distill=False)
    await _notes(writer)
    await scheduler.start()
    assert scheduler.running
    await asyncio.wait_for(sleep.reached.wait(), 30)
    await scheduler.stop()
    assert not scheduler.running
    # The clock starts at 09:00 UTC: 18 hours to 03:00, then a day.
    assert [w / 3600 for w in sleep.waits] == [18, 24, 24]
    assert model.calls == 1  # the second night finds only what it looked at the first
    assert scheduler.last_run is not None


async def test_notes_distill_runs_for_admins_and_refuses_others(engine: AsyncEngine, clock: Clock) -> None:
    model = Model()
    scheduler, writer = _scheduler(engine, clock, model)
    await _notes(writer)
    assert "administrator" in await scheduler.notes_distill(BOB)
    assert "administrator" in await scheduler.notes_distill(CRON)
    assert model.calls == 0
    summary = await scheduler.notes_distill(ALICE)
    assert summary.startswith("Consolidation run cr_") and "1 model call(s)" in summary


async def test_runs_never_overlap_in_one_process(engine: AsyncEngine, clock: Clock) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow(system: str, user: str) -> str:
        entered.set()
        await release.wait()
        return NO_MERGES

    scheduler, writer = _scheduler(engine, clock, slow)
    await _notes(writer)
    first = asyncio.create_task(scheduler.consolidate(CRON))
    await asyncio.wait_for(entered.wait(), 30)
    assert await scheduler.consolidate(CRON) is None
    assert await scheduler.notes_distill(ALICE) == BUSY
    release.set()
    assert (await first) is not None


@pytest.fixture
async def pg_engines(pg_url: str) -> AsyncIterator[tuple[AsyncEngine, AsyncEngine]]:
    a, b = make_engine(pg_url), make_engine(pg_url)
    await upgrade(a)
    try:
        yield a, b
    finally:
        await a.dispose()
        await b.dispose()


async def test_only_one_gateway_process_consolidates_on_postgresql(
    pg_engines: tuple[AsyncEngine, AsyncEngine], clock: Clock
) -> None:
    one, two = pg_engines
    first, writer = _scheduler(one, clock, Model())
    second, _ = _scheduler(two, clock, Model())
    await _notes(writer)
    async with first._singleton() as held:
        assert held
        assert await second.consolidate(CRON) is None
        assert await second.notes_distill(ALICE) == BUSY
    run = await second.consolidate(CRON)
    assert run is not None and run.model_calls == 1


async def test_the_builtin_provider_answers_the_judge_and_consolidation_seams() -> None:
    provider = BuiltinProvider()
    records = {
        "records": [
            {
                "id": "a",
                "subject": "vpn",
                "content": "VPN on vpn.example.internal",
                "said_at": "2026-11-01T00:00:00+00:00",
            },
            {
                "id": "b",
                "subject": "vpn2",
                "content": "vpn on vpn.example.internal.",
                "said_at": "2026-11-02T00:00:00+00:00",
            },
        ]
    }
    merged = json.loads(await consolidation_model(provider)("system", json.dumps(records)))
    assert merged["merges"][0]["record_ids"] == ["a", "b"]
    judged = json.loads(
        await judge_model(provider)("system", json.dumps({"record": records["records"][1], "candidates": []}))
    )
    assert judged == {"decisions": []}


async def test_on_sqlite_the_lock_is_a_file_beside_the_database_that_every_engine_on_it_respects(
    sqlite_url: str, clock: Clock
) -> None:
    # serve's notes_distill and its job process's runs are two processes on one SQLite file: a lock of one
    # process let both merge the same notes at once. Two engines here stand for them (an flock belongs to
    # the open file, so two opens conflict in one process as in two; test_processes.py runs two processes).
    one, two = make_engine(sqlite_url), make_engine(sqlite_url)
    await upgrade(one)
    try:
        first, writer = _scheduler(one, clock, Model())
        second, _ = _scheduler(two, clock, Model())
        await _notes(writer)
        async with first._singleton() as held:
            assert held
            assert Path(sqlite_url.split("///", 1)[1] + "-consolidation.lock").exists()
            assert await second.consolidate(CRON) is None
            assert await second.notes_distill(ALICE) == BUSY
        run = await second.consolidate(CRON)
        assert run is not None and run.model_calls == 1
    finally:
        await one.dispose()
        await two.dispose()
