"""Where the scheduler-type work runs: one place at a time on PostgreSQL; the sweep and consolidation apart.

With ``worker.mode: inline`` the idle sweep and consolidation run in the job process (``gateway/jobproc.py``),
the sweep beside the jobs it writes, under an advisory lock of their own; the serving process's worker thread
keeps the SOP schedules under the scheduler lock. Real gateways on one fresh PostgreSQL database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.app import Gateway
from gateway.background import Background
from gateway.config import Config

pytestmark = pytest.mark.asyncio

RETRY_S = 0.1
LIMIT_S = 30.0


async def _until(check: Callable[[], bool], what: str) -> None:
    for _ in range(int(LIMIT_S / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def _sweeping(gw: Gateway) -> bool:
    task = gw.idle._task
    return task is not None and not task.done()


def _consolidating(gw: Gateway) -> bool:
    """Consolidation's loops (nightly, automatic distillation) run."""
    return gw.memory.scheduler.running


def _scheduling_sops(gw: Gateway) -> bool:
    """The SOP schedules' loop runs."""
    return gw.automation.scheduler.running


@pytest.fixture
async def gateways(pg_url: str) -> AsyncIterator[list[Gateway]]:
    cfg = Config.model_validate({"database": {"url": pg_url}, "session": {"idle_extract_seconds": 60}})
    started: list[Gateway] = []
    try:
        for _ in range(3):
            gw = Gateway(cfg)
            await gw.start(channels=False, worker=False)
            started.append(gw)
        yield started
    finally:
        for gw in started:
            await gw.stop()


async def test_one_job_process_sweeps_and_consolidates_and_another_takes_over_when_it_stops(
    gateways: list[Gateway],
) -> None:
    first, second, thread = gateways
    # Two serve processes' job processes (the idle sweep and consolidation), and a worker thread that leaves
    # those to them (the SOP schedules alone), as gateway/jobproc.py and gateway/background.py build them.
    sweeps = [Background(gw, retry_s=RETRY_S, jobs=False, sops=False) for gw in (first, second)]
    scheduled = Background(thread, retry_s=RETRY_S, jobs=False, idle=False, consolidation=False)
    try:
        for bg in (*sweeps, scheduled):
            await bg.start()
        await _until(lambda: any(bg.leading for bg in sweeps), "a job process to take the idle sweep's lock")
        # The scheduler lock is another lock: the worker thread leads at the same time, without the sweep.
        await _until(lambda: scheduled.leading, "the worker thread to take the scheduler lock")
        await asyncio.sleep(5 * RETRY_S)  # the other job process tried meanwhile, and was refused
        leader, other = sweeps if sweeps[0].leading else sweeps[::-1]
        assert not other.leading
        assert _sweeping(leader.gw) and not _sweeping(other.gw) and not _sweeping(thread)
        assert _consolidating(leader.gw) and not _consolidating(other.gw) and not _consolidating(thread)
        assert not _scheduling_sops(leader.gw) and not _scheduling_sops(other.gw)  # the SOPs stay on the thread
        assert _scheduling_sops(thread)
        # The leading job process stops (its connection, and so its lock, goes): the other one takes both over.
        await leader.stop()
        assert not _sweeping(leader.gw) and not _consolidating(leader.gw)
        await _until(
            lambda: other.leading and _sweeping(other.gw) and _consolidating(other.gw),
            "the other job process to take the sweep and consolidation over",
        )
    finally:
        for bg in (*sweeps, scheduled):
            await bg.stop()
