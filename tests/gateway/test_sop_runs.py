"""SOP runs through the real gateway: schedules on an injected clock, history, one at a time, holds, restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.automation import api
from gateway.automation.store import SopError
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.llm.base import ChatMessage
from gateway.sessions import SessionKey
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider
from tests.gateway.sop_world import running

REPORT = {
    "name": "daily-report",
    "instruction": "Produce the daily report and post it.",
    "trigger": {"cron": "0 7 * * 1-5", "tz": "Europe/Berlin"},
}
QUEUE = {"name": "queue-check", "instruction": "Check the import queue.", "trigger": {"every": "15m"}}


async def test_cron_sop_fires_on_time_on_the_injected_clock(db_url: str, clock: Clock) -> None:
    provider = ScriptedProvider()
    async with running(db_url, [REPORT], clock=clock, provider=provider) as gw:
        auto = gw.automation
        # Monday 2026-11-30 09:00 UTC: the next 07:00 in Berlin is Tuesday 06:00 UTC.
        (sop,) = await api.list_sops(auto.store)
        assert sop.sop.next_run == datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
        assert await auto.scheduler.step() == []
        clock.now = datetime(2026, 12, 1, 5, 59, 59, tzinfo=UTC)
        assert await auto.scheduler.step() == []
        assert provider.calls == []

        clock.now = datetime(2026, 12, 1, 6, 0, 3, tzinfo=UTC)
        (claimed,) = await auto.scheduler.step()
        await auto.runner.drain()
        assert await auto.scheduler.step() == []  # the same due time never fires twice

        (run,) = await api.list_runs(auto.store, "daily-report")
        assert run.id == claimed.id
        assert (run.trigger, run.principal, run.status, run.model_calls) == ("cron", "cron-system", "ok", 1)
        assert run.due_at == datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
        assert (run.reply or "").endswith("] Produce the daily report and post it.")
        messages = await gw.sessions.all_messages(run.session_id or "")
        assert [(m.stored_role, m.text) for m in messages if not m.is_agent] == [
            ("cron-system", "Produce the daily report and post it.")
        ]
        assert await gw.sessions.find_session(SessionKey("sop", "daily-report")) == run.session_id
        summary = await api.get_sop(auto.store, "daily-report")
        assert summary.sop.next_run == datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
        assert [r.id for r in summary.last_runs] == [run.id]


async def test_runs_build_on_the_sops_own_session(sqlite_url: str, clock: Clock) -> None:
    provider = ScriptedProvider()
    async with running(sqlite_url, [QUEUE], clock=clock, provider=provider) as gw:
        auto = gw.automation
        for _ in range(2):
            clock.advance(minutes=15)
            await auto.scheduler.step()
            await auto.runner.drain()
        first, second = await api.list_runs(auto.store, "queue-check")
        assert first.session_id == second.session_id
        # The second run's model call saw the first run in its history.
        history = [m.content for m in provider.calls[-1] if m.role != "system"]
        assert "echo: [queue-check" not in history[0] and len(history) >= 3


async def test_a_failed_run_is_recorded_and_the_schedule_goes_on(sqlite_url: str, clock: Clock) -> None:
    provider = ScriptedProvider(fail=True)
    async with running(sqlite_url, [QUEUE], clock=clock, provider=provider) as gw:
        auto = gw.automation
        clock.advance(minutes=15)
        await auto.scheduler.step()
        await auto.runner.drain()

        def boom(_: Sequence[ChatMessage]) -> str:
            raise RuntimeError("the tool server went away")

        provider.fail = False
        provider._answer = boom
        clock.advance(minutes=15)
        await auto.scheduler.step()
        await auto.runner.drain()

        provider._answer = None
        clock.advance(minutes=15)
        await auto.scheduler.step()
        await auto.runner.drain()
        newest, crashed, unavailable = await api.list_runs(auto.store, "queue-check")
        assert (unavailable.status, unavailable.error) == ("failed", "the model was unavailable")
        assert crashed.status == "failed" and "the tool server went away" in (crashed.error or "")
        assert newest.status == "ok" and newest.error is None


async def test_a_due_run_while_one_is_running_is_skipped(db_url: str, clock: Clock) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(_: Sequence[ChatMessage]) -> str:
        started.set()
        await release.wait()
        return "done"

    async with running(db_url, [QUEUE], clock=clock, provider=ScriptedProvider(slow)) as gw:
        auto = gw.automation
        clock.advance(minutes=15)
        (first,) = await auto.scheduler.step()
        await asyncio.wait_for(started.wait(), 30)
        clock.advance(minutes=15)
        (second,) = await auto.scheduler.step()
        by_hand = await api.run_now(auto.runner, "queue-check")
        release.set()
        await auto.runner.drain()

        assert (second.status, second.error) == ("skipped", "another run of this SOP was still running")
        assert by_hand.status == "skipped"
        done = await auto.store.run(first.id)
        assert done is not None and done.status == "ok" and done.reply == "done"


async def test_a_held_sop_records_held_runs_and_never_starts(db_url: str, clock: Clock) -> None:
    provider = ScriptedProvider()
    asked: list[str] = []

    async def holds(name: str) -> str | None:
        asked.append(name)
        return "obl_7f3a" if name == "queue-check" else None

    manual = {"name": "summary", "instruction": "Summarise.", "trigger": {"manual": True}}
    async with running(db_url, [QUEUE, manual], clock=clock, provider=provider, holds=holds) as gw:
        auto = gw.automation
        clock.advance(minutes=15)
        (due,) = await auto.scheduler.step()
        by_hand = await api.run_now(auto.runner, "queue-check")
        free = await api.run_now(auto.runner, "summary")

    assert (due.status, due.held_by, due.started_at) == ("held", "obl_7f3a", None)
    assert by_hand.status == "held" and by_hand.held_by == "obl_7f3a" and "obl_7f3a" in (by_hand.error or "")
    assert free.status == "ok"
    assert len(provider.calls) == 1  # only the free SOP reached the model
    assert asked == ["queue-check", "queue-check", "summary"]


async def test_restart_catches_up_missed_runs_once_or_skips_them(db_url: str, clock: Clock) -> None:
    sops = [
        {**QUEUE, "name": "once", "catch_up": "once"},
        {**QUEUE, "name": "skip", "catch_up": "skip"},
    ]
    provider = ScriptedProvider()
    async with running(db_url, sops, clock=clock, provider=provider):
        pass  # first start: schedules begin at 09:15
    clock.advance(hours=1, minutes=5)  # down until 10:05: 09:15, 09:30, 09:45, 10:00 were missed
    async with running(db_url, sops, clock=clock, provider=provider) as gw:
        auto = gw.automation
        claimed = await auto.scheduler.step()
        await auto.runner.drain()
        assert await auto.scheduler.step() == []
        (once,) = await api.list_runs(auto.store, "once")
        (skip,) = await api.list_runs(auto.store, "skip")
        nexts = {s.sop.name: s.sop.next_run for s in await api.list_sops(auto.store)}

    assert len(claimed) == 2
    assert once.status == "ok" and once.due_at == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert skip.status == "skipped" and "missed 4 due run(s)" in (skip.error or "")
    assert len(provider.calls) == 1
    assert nexts == {n: datetime(2026, 11, 30, 10, 15, tzinfo=UTC) for n in ("once", "skip")}


async def test_definitions_survive_restarts_and_yaml_is_upserted(sqlite_url: str, clock: Clock) -> None:
    provider = ScriptedProvider()
    async with running(sqlite_url, [QUEUE], clock=clock, provider=provider) as gw:
        added = api.new_definition("by-hand", "Tidy the notes.", every="1h", deliver_to=None)
        await api.add_sop(gw.automation.store, added)
        with pytest.raises(SopError, match="already exists"):
            await api.add_sop(gw.automation.store, added)
        with pytest.raises(SopError, match="defined in the config"):
            await api.remove_sop(gw.automation.store, "queue-check")
        await api.set_enabled(gw.automation.store, "by-hand", False)

    changed = {**QUEUE, "instruction": "Check the import queue twice."}
    async with running(sqlite_url, [REPORT, changed], clock=clock, provider=provider) as gw:
        rows = {s.sop.name: s.sop for s in await api.list_sops(gw.automation.store)}
        assert set(rows) == {"by-hand", "daily-report", "queue-check"}
        assert rows["queue-check"].instruction == "Check the import queue twice."
        assert rows["queue-check"].origin == "yaml" and rows["by-hand"].origin == "cli"
        assert not rows["by-hand"].enabled and rows["by-hand"].next_run is None
        with pytest.raises(SopError, match="is disabled"):
            await api.run_now(gw.automation.runner, "by-hand")
        enabled = await api.set_enabled(gw.automation.store, "by-hand", True)
        assert enabled.next_run == clock.now + timedelta(hours=1)
        await api.remove_sop(gw.automation.store, "by-hand")

    # A YAML SOP removed from the file is removed from the database; its runs stay.
    async with running(sqlite_url, [REPORT], clock=clock, provider=provider) as gw:
        assert [s.sop.name for s in await api.list_sops(gw.automation.store)] == ["daily-report"]

    collide = {**QUEUE, "name": "by-hand-2"}
    async with running(sqlite_url, [], clock=clock, provider=provider) as gw:
        await api.add_sop(gw.automation.store, api.new_definition("by-hand-2", "x", manual=True))
    with pytest.raises(SopError, match="also an SOP added with the CLI"):
        async with running(sqlite_url, [collide], clock=clock, provider=provider):
            pass


async def test_the_scheduler_loop_calls_hooks_before_each_step_and_fires(sqlite_url: str, clock: Clock) -> None:
    provider = ScriptedProvider()
    async with running(sqlite_url, [QUEUE], clock=clock, provider=provider) as gw:
        auto = gw.automation
        order: list[str] = []

        async def router() -> None:
            order.append("hook")

        async def failing_hook() -> None:
            raise RuntimeError("router down")

        async def sleep(seconds: float) -> None:
            order.append("sleep")
            clock.advance(seconds=seconds)  # the loop's wait moves the injected clock, never real time
            await asyncio.sleep(0)

        gw.sop_before_step.extend([failing_hook, router])
        auto.scheduler.sleep = sleep
        await auto.start()
        async with asyncio.timeout(30):
            while not await api.list_runs(auto.store, "queue-check"):
                await asyncio.sleep(0.01)
        await auto.scheduler.stop()
        await auto.runner.drain()
        (run,) = await api.list_runs(auto.store, "queue-check")
    assert run.status == "ok"
    assert order[:3] == ["hook", "sleep", "hook"]


def test_yaml_errors_name_the_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "automation:\n"
        "  sops:\n"
        "    - name: daily-report\n"
        "      instruction: Produce the report.\n"
        '      trigger: {cron: "0 25 * * 1-5", tz: Europe/Berlin}\n'
        "    - name: Bad Name\n"
        "      instruction: x\n"
        "      trigger: {every: 15m}\n"
        "      deliver_to: slack:123\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    problems = exc.value.problems
    assert any("automation.sops.0.trigger.cron (line 5)" in p and "the hour field '25'" in p for p in problems)
    assert any("automation.sops.1.name (line 6)" in p for p in problems)
    assert any("sops.1.deliver_to (line 9)" in p and "unknown delivery channel 'slack'" in p for p in problems)
