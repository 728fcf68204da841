"""Where the scheduler-type work runs: one place at a time on PostgreSQL; the idle sweep apart with a job process.

With ``worker.mode: inline`` the idle sweep runs in the job process (``gateway/jobproc.py``), beside the jobs
it writes, under an advisory lock of its own; the serving process's worker thread keeps consolidation and the
SOP schedules under the scheduler lock. Real gateways on one fresh PostgreSQL database.
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


def _scheduling(gw: Gateway) -> bool:
    """Consolidation's and the SOP schedules' loops run."""
    return gw.memory.scheduler.running and gw.automation.scheduler.running


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


async def test_one_job_process_sweeps_and_another_takes_over_when_it_stops(gateways: list[Gateway]) -> None:
    first, second, thread = gateways
    # Two serve processes' job processes (the idle sweep alone), and a worker thread that leaves it to them.
    sweeps = [Background(gw, retry_s=RETRY_S, jobs=False, scheduled=False) for gw in (first, second)]
    scheduled = Background(thread, retry_s=RETRY_S, jobs=False, idle=False)
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
        assert not _scheduling(leader.gw) and not _scheduling(other.gw)  # the sweep's leader runs nothing else
        assert _scheduling(thread)
        # The leading job process stops (its connection, and so its lock, goes): the other one sweeps.
        await leader.stop()
        assert not _sweeping(leader.gw)
        await _until(lambda: other.leading and _sweeping(other.gw), "the other job process to take the sweep over")
    finally:
        for bg in (*sweeps, scheduled):
            await bg.stop()
