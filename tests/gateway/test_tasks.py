"""``cancel_and_wait``: a background task stopped, and the stopper's own cancellation never lost."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tasks import cancel_and_wait


async def _slow_to_stop(stopping: asyncio.Event) -> None:
    """A task that takes a few loop turns to finish once cancelled (a job's cleanup, a lease's last write)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        stopping.set()
        for _ in range(3):
            await asyncio.sleep(0)
        raise


async def test_the_caller_cancelled_while_it_waits_is_cancelled() -> None:
    stopping = asyncio.Event()
    inner = asyncio.create_task(_slow_to_stop(stopping))
    await asyncio.sleep(0)
    after: list[str] = []

    async def stopper() -> None:
        await cancel_and_wait(inner)
        after.append("carried on")  # what a swallowed cancellation would let happen

    outer = asyncio.create_task(stopper())
    await stopping.wait()  # the stopper is waiting for the inner task to finish
    outer.cancel()
    done, _ = await asyncio.wait({outer}, timeout=30)
    assert done and outer.cancelled()
    assert after == []
    await asyncio.wait({inner}, timeout=30)
    assert inner.cancelled()  # and the task it stopped finished anyway


async def test_tasks_are_stopped_none_skipped_and_a_crash_is_raised() -> None:
    stopping = asyncio.Event()
    slow = asyncio.create_task(_slow_to_stop(stopping))
    quick = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    await cancel_and_wait(slow, None, quick)
    assert slow.cancelled() and quick.cancelled()

    async def crash() -> None:
        raise RuntimeError("the loop had died")

    crashed = asyncio.create_task(crash())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="the loop had died"):
        await cancel_and_wait(crashed)  # as `await task` would: a stop does not hide why it had stopped
    await cancel_and_wait()  # nothing to stop
