"""The background work, off the turns' event loop: in a thread of ``goclaw serve``, or ``goclaw worker``.

The background work is the durable job worker (extraction, belief revision's
judge), the idle extraction sweep, the memory scheduler (nightly consolidation,
automatic distillation) and the SOP scheduler. None of it belongs on the loop
that answers turns: a slow extraction model or a 20 ms job would add to a turn's
latency.

- ``worker.mode: inline`` (the default): ``goclaw serve`` runs the jobs, the idle
  sweep and consolidation in a child process of its own (``gateway/jobproc.py``),
  which shares no GIL with the turns, and the SOP schedules in
  :class:`WorkerThread`, a thread with its own event loop and its own
  :class:`~gateway.app.Gateway` (engine, stores, model client), so that an SOP run
  delivers through this process's channels. The turns' loop only wakes them.
- ``worker.mode: separate`` (PostgreSQL): ``goclaw serve`` runs none of it and
  ``goclaw worker`` (:func:`run_worker_forever`) does, in its own process.
  ``goclaw serve --workers N`` with ``inline`` starts one such process itself.

Jobs are claimed once (``FOR UPDATE SKIP LOCKED``), so any number of workers
share them. The scheduler-type work (idle sweep, consolidation, SOP schedules)
runs in one place at a time: on PostgreSQL the worker that holds the session
advisory lock :data:`SINGLETON_LOCK_KEY` runs it, and another worker takes over
when that one's connection ends (its process died). Each of those is also safe
on its own (consolidation's own lock, the SOP run row as the claim,
the idle mark moved compare-and-set); the lock keeps them from being raced for.

With a job process (``worker.mode: inline``) the idle sweep and consolidation run
there, and not on the worker thread. The sweep's look for quiet sessions reads
every live message (10-30 ms of Python and SQLite with 10,000 stored); a
consolidation run clusters every current operational note (a second or more of
Python at tens of thousands of notes, about 10 s for the first run after a start
at 65,536). On a thread of the serving process that time held the GIL the turns'
loop needed. On PostgreSQL the job process that holds :data:`IDLE_LOCK_KEY` runs
them; on SQLite consolidation's file lock (``gateway/scheduler.py``) keeps
``notes_distill``, asked in the serving process, from running beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import text

from gateway.config import Config
from gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from gateway.app import Gateway
    from gateway.metrics import Metrics

log = logging.getLogger("goclaw.worker")

SINGLETON_LOCK_KEY = int.from_bytes(hashlib.sha256(b"goclaw:scheduler-singleton").digest()[:8], "big", signed=True)
"""The PostgreSQL advisory lock of the scheduler-type work (one worker at a time)."""

IDLE_LOCK_KEY = int.from_bytes(hashlib.sha256(b"goclaw:idle-sweep-singleton").digest()[:8], "big", signed=True)
"""The PostgreSQL advisory lock of the job processes' share, the idle sweep and consolidation (one at a time)."""

LEADER_RETRY_S = 5.0


class Background:
    """Runs a started Gateway's background work: jobs always, the scheduler-type work while it holds the lock.

    Args:
        gw: A Gateway started with ``worker=False``.
        retry_s: How often a worker without the lock tries to take it, and checks it still holds it.
        jobs: Run the job worker (False: the job process, ``gateway/jobproc.py``, runs the jobs).
        idle: Run the idle sweep (False: the job process runs it).
        consolidation: Run the memory scheduler (False: the job process runs it).
        sops: Run the SOP scheduler (False: this is a job process, whose share, the idle sweep
            and consolidation, runs under :data:`IDLE_LOCK_KEY` on PostgreSQL).
    """

    def __init__(
        self,
        gw: Gateway,
        *,
        retry_s: float = LEADER_RETRY_S,
        jobs: bool = True,
        idle: bool = True,
        consolidation: bool = True,
        sops: bool = True,
    ) -> None:
        self.gw = gw
        self.retry_s = retry_s
        self.jobs = jobs
        self.idle = idle
        self.consolidation = consolidation
        self.sops = sops
        self.lock_key = SINGLETON_LOCK_KEY if sops else IDLE_LOCK_KEY
        self.leading = False
        self._task: asyncio.Task[None] | None = None

    def _work(self) -> str:
        """What this runs while it holds its lock, for the log."""
        parts = [
            name
            for name, on in (
                ("idle extraction", self.idle),
                ("consolidation", self.consolidation),
                ("SOP schedules", self.sops),
            )
            if on
        ]
        return f"the scheduled work ({', '.join(parts) or 'none'})"

    async def start(self) -> None:
        """Start the job worker (unless another process runs the jobs), and the loop that holds the scheduler lock."""
        if self.jobs:
            await self.gw.worker.start()
        self._task = asyncio.create_task(self._lead(), name="goclaw-scheduler-lock")

    async def stop(self) -> None:
        """Stop everything this started (the lock goes with its connection)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self._stop_singletons()
        if self.jobs:
            await self.gw.worker.stop()

    async def _start_singletons(self) -> None:
        self.leading = True
        if self.idle:
            await self.gw.idle.start()
        if self.consolidation:
            await self.gw.memory.scheduler.start()
        if self.sops:
            await self.gw.automation.start()

    async def _stop_singletons(self) -> None:
        if not self.leading:
            return
        self.leading = False
        if self.sops:
            await self.gw.automation.stop()
        if self.consolidation:
            await self.gw.memory.scheduler.stop()
        if self.idle:
            await self.gw.idle.stop()

    async def _lead(self) -> None:
        engine = self.gw.engine
        if engine.dialect.name != "postgresql":
            log.info("this %s runs %s", "worker" if self.sops else "job process", self._work())
            await self._start_singletons()  # SQLite: one gateway, one worker
            return
        while True:
            try:
                async with engine.connect() as conn:
                    if await self._try_lock(conn, self.lock_key):
                        log.info("this %s runs %s", "worker" if self.sops else "job process", self._work())
                        await self._start_singletons()
                        try:
                            while True:  # a dead connection means the lock is gone too
                                await asyncio.sleep(self.retry_s)
                                await conn.execute(text("SELECT 1"))
                                await conn.commit()
                        finally:
                            await self._stop_singletons()
                            # A session lock outlives the transaction: let it go before the connection
                            # goes back to the pool (a dead connection took it with it already).
                            with contextlib.suppress(Exception):
                                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.lock_key})
                                await conn.commit()
                    else:
                        await conn.rollback()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scheduler lock: %s; trying again in %ss", exc, self.retry_s)
            await asyncio.sleep(self.retry_s)

    @staticmethod
    async def _try_lock(conn: AsyncConnection, key: int) -> bool:
        got = bool((await conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key})).scalar())
        await conn.commit()
        return got


async def _start_worker_gateway(
    cfg: Config,
    metrics: Metrics | None = None,
    *,
    inline_driver: bool = False,
    wake_jobs: Callable[[], None] | None = None,
) -> tuple[Gateway, Background]:
    from gateway.app import Gateway

    # Its SOP runs' trims are jobs too: for the job process (inline), or for this worker's own job worker.
    gw = Gateway(cfg, inline_driver=inline_driver, trim_jobs=True)
    if metrics is not None:
        gw.metrics = metrics  # the serving process's /metrics shows the jobs too
    await gw.start(channels=False, worker=False)
    # With a job process, what this gateway queues (an SOP run's trim) wakes that process, which runs the
    # jobs, the idle sweep and consolidation.
    gw.wake_remote_worker = wake_jobs
    alone = wake_jobs is None
    bg = Background(gw, jobs=alone, idle=alone, consolidation=alone)
    await bg.start()
    return gw, bg


class WorkerThread:
    """The background work on a thread with its own event loop (``worker.mode: inline``).

    Its Gateway has its own engine and stores: nothing it awaits shares the
    turns' loop, so a slow job never delays a turn.
    """

    def __init__(
        self, cfg: Config, *, metrics: Metrics | None = None, wake_jobs: Callable[[], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        # Set when a job process runs the jobs: this thread runs the scheduler-type work only.
        self.wake_jobs = wake_jobs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.gateway: Gateway | None = None
        self._thread = threading.Thread(target=self._run, name="goclaw-worker", daemon=True)

    async def start(self) -> None:
        """Start the thread and wait until its worker runs (raising what stopped it from starting)."""
        self._thread.start()
        await asyncio.to_thread(self._ready.wait)
        if self._error is not None:
            raise self._error

    def wake(self) -> None:
        """Look for jobs now (called from the turns' loop after a trim or a deferred revision)."""
        loop, gw = self._loop, self.gateway
        if loop is not None and gw is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown)
                loop.call_soon_threadsafe(gw.worker.wake)

    async def stop(self) -> None:
        """Stop the worker and wait for the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(self._thread.join, 60)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); after start, logged
            if not self._ready.is_set():
                self._error = exc
            else:
                log.exception("the worker thread stopped")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # Its own loop answers no turn: on SQLite its driver calls are made inline (gateway/sqlite_inline.py).
        gw, bg = await _start_worker_gateway(self.cfg, self.metrics, inline_driver=True, wake_jobs=self.wake_jobs)
        self.gateway = gw
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await bg.stop()
            await gw.stop()


async def run_worker_forever(cfg: Config) -> None:
    """``goclaw worker``: the background work in this process, no listener, no channels, until SIGINT/SIGTERM."""
    from gateway.heap import settle_heap

    gw, bg = await _start_worker_gateway(cfg)
    settle_heap()
    try:
        log.info(
            "goclaw worker running (jobs, idle extraction, consolidation, SOP schedules; model: %s)", gw.provider.name
        )
        print("goclaw worker: running; stop it with Ctrl-C or SIGTERM", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await bg.stop()
        await gw.stop()
