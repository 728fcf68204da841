"""Stopping a background task without losing a cancellation meant for the one stopping it.

The usual way to stop a task, ``task.cancel()`` then ``await task`` inside
``suppress(CancelledError)``, has a hole: if the task doing it is itself
cancelled while it waits there, that ``CancelledError`` is suppressed too, and
the cancelled task carries on as if nothing had been asked. The job worker did
this in a job's ``finally`` (stopping the job's lease heartbeat): a stop that
landed in the loop turn between a job's end and its heartbeat's was swallowed,
the worker polled on, and ``goclaw serve``'s job process never exited on its
own; ``serve`` waited 30 s for it and then killed it (one stop in 10-30 under
load, ``tests/gateway/test_wal_checkpoint.py``).

:func:`cancel_and_wait` waits with :func:`asyncio.wait`, which never raises the
awaited tasks' outcome: the only ``CancelledError`` that can leave it is the
caller's own.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None skipped) and wait until each has finished.

    A cancellation of the caller while it waits propagates (the tasks, already
    cancelled, finish on their own). A task that ended with an error other
    than its cancellation raises it here, as ``await task`` would.
    """
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    pending = [t for t in live if not t.done()]
    if pending:
        await asyncio.wait(pending)
    for task in live:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
