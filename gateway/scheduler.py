"""The memory scheduler: nightly consolidation, automatic distillation, and ``notes_distill`` on request.

policy: "Consolidation (the nightly job, ``notes_distill`` and the automatic
distillation) merges live records that say the same thing into one ... The
automatic distillation waits five minutes between runs, twice as long after
each run in a row whose model calls failed, up to six hours."

Three triggers, one :class:`~memory.consolidate.Consolidator` (so one looked-at
cache per process):

1. **nightly**: at ``memory.consolidation_time`` (HH:MM, UTC), as ``cron-system``;
2. **automatic distillation** (``memory.auto_distill``): a run, then a wait of
   5 minutes; after each run in a row with a failed model call the wait doubles
   (5, 10, 20, 40 ... minutes) up to 6 hours; a run without failures resets it;
3. **notes_distill**: :meth:`Scheduler.notes_distill`, for the admin tool, as
   the asking admin.

Consolidation is singleton work: on PostgreSQL each run holds the session
advisory lock ``pg_try_advisory_lock(CONSOLIDATION_LOCK_KEY)``, so only one
gateway process consolidates at a time (the others skip that run); on SQLite an
exclusive ``flock`` on a file beside the database (``<database>-consolidation.lock``)
does the same between ``goclaw serve`` (``notes_distill``), its job process (the
nightly and automatic runs, ``gateway/jobproc.py``) and ``goclaw memory
consolidate``; an in-memory database, which no other process can open, takes a lock
of the process. Within a process, runs never overlap.

Wiring it (``gateway/app.py``)::

    from gateway.scheduler import Scheduler, structured_model
    from memory import CONSOLIDATION_SCHEMA, CONSOLIDATION_SCHEMA_NAME

    scheduler = Scheduler(
        engine=engine,                       # the gateway's AsyncEngine (migrated)
        writer=memory_writer,                # memory.MemoryWriter over the MemoryStore
        model=structured_model(provider, CONSOLIDATION_SCHEMA_NAME, CONSOLIDATION_SCHEMA),
        model_name=provider.model,           # recorded on each revision row
        consolidation_time=cfg.memory.consolidation_time,
        auto_distill=cfg.memory.auto_distill,
    )
    await scheduler.start()                  # after migrations and provider.start()
    ...
    await scheduler.stop()                   # before provider.stop() / engine.dispose()

    # the admin tool (memory.tools_admin):
    Tool("notes_distill", NOTES_DISTILL_DESCRIPTION, NOTES_DISTILL_SCHEMA,
         lambda p, a: notes_distill(p, a, run=scheduler.notes_distill), authorize_notes_distill)

:func:`structured_model` is the provider adapter for every structured-output
seam of memory (extraction, the belief-revision judge, consolidation).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, time, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.llm.base import ChatMessage, JsonSchema, LLMProvider
from gateway.tasks import cancel_and_wait
from memory.belief_revision import REVISION_SCHEMA, REVISION_SCHEMA_NAME
from memory.consolidate import (
    BATCH_SIZE,
    CONSOLIDATION_SCHEMA,
    CONSOLIDATION_SCHEMA_NAME,
    MAX_CALLS,
    ConsolidationRun,
    Consolidator,
)
from memory.extract import EXTRACTION_SCHEMA, EXTRACTION_SCHEMA_NAME
from memory.tools_admin import authorize_notes_distill
from memory.writer import MemoryWriter
from pairing.principal import Principal

log = logging.getLogger(__name__)

StructuredModel = Callable[[str, str], Awaitable[str]]
Sleep = Callable[[float], Awaitable[None]]

DISTILL_WAIT = timedelta(minutes=5)
DISTILL_MAX_WAIT = timedelta(hours=6)
CONSOLIDATION_LOCK_KEY = int.from_bytes(hashlib.sha256(b"goclaw:memory-consolidation").digest()[:8], "big", signed=True)
"""The PostgreSQL advisory lock key of consolidation (one process at a time)."""

# An in-memory SQLite database (tests): the Schedulers of one process take turns on a lock of the process.
_PROCESS_LOCK = threading.Lock()
LOCK_FILE_SUFFIX = "-consolidation.lock"
"""On SQLite, the file beside the database whose ``flock`` is consolidation's lock (kept, never removed)."""

BUSY = "A consolidation is already running (here or in another gateway process); try again in a few minutes."


def structured_model(provider: LLMProvider, name: str, schema: Mapping[str, Any]) -> StructuredModel:
    """The provider as a memory model seam: (system, user) -> the raw JSON text of schema ``name``."""

    async def model(system: str, user: str) -> str:
        completion = await provider.complete(
            [ChatMessage("system", system), ChatMessage("user", user)],
            json_schema=JsonSchema(name, schema),
        )
        return completion.text

    return model


def extraction_model(provider: LLMProvider) -> StructuredModel:
    """The extractor seam (``extraction_result``), as on the live path."""
    return structured_model(provider, EXTRACTION_SCHEMA_NAME, EXTRACTION_SCHEMA)


def judge_model(provider: LLMProvider) -> StructuredModel:
    """The belief-revision judge seam (``revision_judgement``)."""
    return structured_model(provider, REVISION_SCHEMA_NAME, REVISION_SCHEMA)


def consolidation_model(provider: LLMProvider) -> StructuredModel:
    """The consolidation seam (``consolidation_result``)."""
    return structured_model(provider, CONSOLIDATION_SCHEMA_NAME, CONSOLIDATION_SCHEMA)


def distill_wait(failed_in_a_row: int) -> timedelta:
    """How long the automatic distillation waits after ``failed_in_a_row`` failed runs in a row.

    5 minutes, then twice as long after each failed run in a row (10, 20, 40
    ... minutes), never more than 6 hours.
    """
    if failed_in_a_row <= 0:
        return DISTILL_WAIT
    # Capped before multiplying so a long outage never overflows.
    factor = 2 ** min(failed_in_a_row, 16)
    return min(DISTILL_WAIT * factor, DISTILL_MAX_WAIT)


def parse_hh_mm(value: str) -> time:
    """``HH:MM`` (UTC) as a time.

    Raises:
        ValueError: not HH:MM.
    """
    try:
        hh, mm = value.split(":")
        return time(int(hh), int(mm), tzinfo=UTC)
    except ValueError:
        raise ValueError(f"consolidation time {value!r}: use HH:MM in UTC, for example 03:00") from None


def next_consolidation_at(now: datetime, at: time) -> datetime:
    """The first ``at`` (UTC) strictly after ``now``."""
    now = now.astimezone(UTC)
    today = now.replace(hour=at.hour, minute=at.minute, second=0, microsecond=0)
    return today if today > now else today + timedelta(days=1)


def sqlite_lock_path(database: str | None) -> str | None:
    """Consolidation's lock file for a SQLite database file; None for an in-memory database."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return database + LOCK_FILE_SUFFIX


@contextlib.contextmanager
def _process_lock() -> Iterator[bool]:
    """Try this process's consolidation lock (an in-memory database): yields whether it was taken."""
    got = _PROCESS_LOCK.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            _PROCESS_LOCK.release()


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[bool]:
    """Try an exclusive ``flock`` on ``path`` (created if missing): yields whether it was taken.

    An ``flock`` belongs to the open file, so two opens conflict even in one process
    (the serving thread's ``notes_distill`` and another thread's run), and the kernel
    lets it go with the file when a process dies: a crashed run never leaves it held.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class Scheduler:
    """Runs consolidation nightly, as automatic distillation, and for ``notes_distill``.

    No I/O in the constructor: :meth:`start` starts the loops, :meth:`stop` ends them.

    Args:
        engine: The gateway's database engine (for the PostgreSQL advisory lock).
        writer: The gated memory writer (over the MemoryStore).
        model: The consolidation model seam (see :func:`consolidation_model`).
        model_name: The model's name, recorded on each revision row.
        consolidation_time: ``memory.consolidation_time`` (HH:MM, UTC).
        auto_distill: ``memory.auto_distill``.
        clock: The time (injectable for tests).
        sleep: How to wait (injectable for tests).
        system_principal: Who the nightly and automatic runs are (``cron-system``).
        batch_size: Records per model call (at most 40).
        max_calls: Model calls per run (at most 6).
    """

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        writer: MemoryWriter,
        model: StructuredModel,
        model_name: str,
        consolidation_time: str = "03:00",
        auto_distill: bool = True,
        clock: Callable[[], datetime] | None = None,
        sleep: Sleep | None = None,
        system_principal: Principal | None = None,
        batch_size: int = BATCH_SIZE,
        max_calls: int = MAX_CALLS,
    ) -> None:
        self.engine = engine
        self.consolidator = Consolidator(
            writer, model, model_name=model_name, batch_size=batch_size, max_calls=max_calls
        )
        self.consolidation_time = parse_hh_mm(consolidation_time)
        self.auto_distill = auto_distill
        self.clock = clock or (lambda: datetime.now(UTC))
        self.sleep: Sleep = sleep or asyncio.sleep
        self.system_principal = system_principal or Principal.system("cron-system")
        self.failed_in_a_row = 0
        self.last_run: ConsolidationRun | None = None
        self._running = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_nightly: datetime | None = None

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start the nightly loop and, if enabled, the automatic distillation loop."""
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._nightly_loop(), name="memory-nightly-consolidation"))
        if self.auto_distill:
            self._tasks.append(asyncio.create_task(self._distill_loop(), name="memory-auto-distill"))

    async def stop(self) -> None:
        """Stop the loops (a run in progress is cancelled; its merges are whole or not at all)."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return bool(self._tasks)

    # ---- runs -------------------------------------------------------------------------

    @property
    def next_distill_wait(self) -> timedelta:
        """How long the automatic distillation waits before its next run."""
        return distill_wait(self.failed_in_a_row)

    @asynccontextmanager
    async def _singleton(self) -> AsyncIterator[bool]:
        """Hold the consolidation lock, across every process and thread on the same database."""
        if self.engine.dialect.name != "postgresql":
            path = sqlite_lock_path(self.engine.url.database)
            with file_lock(path) if path is not None else _process_lock() as got:
                yield got
            return
        async with self.engine.connect() as conn:
            got = bool(
                (await conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": CONSOLIDATION_LOCK_KEY})).scalar()
            )
            await conn.commit()
            try:
                yield got
            finally:
                if got:
                    # A session lock outlives the transaction: release it before the connection goes back to the pool.
                    await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": CONSOLIDATION_LOCK_KEY})
                    await conn.commit()

    async def consolidate(self, principal: Principal, *, trigger: str = "manual") -> ConsolidationRun | None:
        """One consolidation run as ``principal``; None when another run (here or elsewhere) holds the lock."""
        if self._running.locked():
            return None
        async with self._running, self._singleton() as held:
            if not held:
                log.info("consolidation (%s) skipped: another gateway process or thread is consolidating", trigger)
                return None
            run = await self.consolidator.run(principal)
        self.last_run = run
        log.info("consolidation (%s): %s", trigger, run.summary())
        return run

    async def distill_once(self) -> ConsolidationRun | None:
        """One automatic distillation run; updates the wait before the next one."""
        try:
            run = await self.consolidate(self.system_principal, trigger="auto")
        except Exception:
            log.exception("automatic distillation failed")
            self.failed_in_a_row += 1
            return None
        if run is not None:
            # policy: "twice as long after each run in a row whose model calls failed, up to six hours".
            self.failed_in_a_row = self.failed_in_a_row + 1 if run.failed else 0
        return run

    async def nightly_once(self) -> ConsolidationRun | None:
        """The nightly consolidation run."""
        try:
            return await self.consolidate(self.system_principal, trigger="nightly")
        except Exception:
            log.exception("nightly consolidation failed")
            return None

    async def notes_distill(self, principal: Principal) -> str:
        """The ``notes_distill`` admin tool's run: one consolidation as the asking admin, summarised."""
        refusal = authorize_notes_distill(principal)
        if refusal:
            return refusal
        run = await self.consolidate(principal, trigger="notes_distill")
        if run is None:
            return BUSY
        return run.summary()

    # ---- loops ------------------------------------------------------------------------

    async def _nightly_loop(self) -> None:
        while True:
            now = self.clock()
            if self._last_nightly is not None and now < self._last_nightly:
                now = self._last_nightly
            at = next_consolidation_at(now, self.consolidation_time)
            await self.sleep(max(0.0, (at - self.clock()).total_seconds()))
            self._last_nightly = at
            await self.nightly_once()

    async def _distill_loop(self) -> None:
        while True:
            await self.sleep(self.next_distill_wait.total_seconds())
            await self.distill_once()
