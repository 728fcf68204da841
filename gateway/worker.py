"""The background worker: claims durable jobs and runs them, retrying with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta

from sqlalchemy import update

from gateway.metrics import Metrics
from gateway.models import Job
from gateway.sessions import SessionStore
from gateway.tasks import cancel_and_wait
from gateway.write_health import storage_reason

log = logging.getLogger(__name__)


async def renew_lease(sessions: SessionStore, job_id: int, worker_id: str) -> bool:
    """Move a running job's lease forward; False when the job is no longer this worker's."""
    async with sessions.transaction() as s:
        res = await s.execute(
            update(Job)
            .where(Job.id == job_id, Job.locked_by == worker_id, Job.status == "running")
            .values(locked_at=sessions.now())
        )
        return bool(res.rowcount)  # type: ignore[attr-defined]


class ParkableError(Exception):
    """A job failure that carries the model's raw answer, kept for inspection."""

    def __init__(self, message: str, raw_answer: str) -> None:
        super().__init__(message)
        self.raw_answer = raw_answer


JobHandler = Callable[[Job], Awaitable[None]]
Upkeep = Callable[[], Awaitable[tuple[int, bool]]]
"""Work the worker does when idle, every ``PRUNE_EVERY_S``: one batch, returning (how many, whether more are left)."""

PRUNE_BATCH = 1_000
"""Done jobs deleted in one transaction (on SQLite a turn may wait for it: a few milliseconds)."""
PRUNE_BATCHES = 10
"""Batches in one idle moment of the worker; more left, it comes back after ``PRUNE_AGAIN_S``."""
PRUNE_EVERY_S = 600.0
PRUNE_AGAIN_S = 1.0


class JobWorker:
    """Runs jobs until stopped; a job is finished only after its handler returned."""

    def __init__(
        self,
        sessions: SessionStore,
        handlers: Mapping[str, JobHandler],
        *,
        poll_interval: float = 1.0,
        max_attempts: int = 5,
        base_delay_s: float = 5.0,
        metrics: Metrics | None = None,
        lease_s: float = 30.0,
        heartbeat_s: float | None = None,
        forget_done: frozenset[str] = frozenset(),
        keep_done_s: float | None = None,
        upkeep: Mapping[str, Upkeep] | None = None,
    ) -> None:
        self.sessions = sessions
        self.handlers = dict(handlers)
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.metrics = metrics
        self.worker_id = "w_" + secrets.token_hex(4)
        # A short lease, renewed while the job runs: a dead worker's job is taken
        # over within ``lease_s``, a live one's never.
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else lease_s / 3
        # Kinds whose finished jobs are deleted, not kept as done: their outcome has its own record.
        self.forget_done = forget_done
        # Done jobs older than this are deleted when the worker is idle (None: kept); ``worker.keep_done_jobs_days``.
        self.keep_done_s = keep_done_s
        # More upkeep when idle, by what it does (for its log line): the memory store's expired postings.
        self.upkeep: dict[str, Upkeep] = dict(upkeep or {})
        self._prune_at = 0.0  # the loop's time of the next prune
        self._storage_down = False
        # Called with (kind, outcome) for each job run (the job process reports them to its parent's /metrics).
        self.report: Callable[[str, str], None] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next: Job | None = None  # claimed when the last job was finished: run_once runs it next

    def wake(self) -> None:
        """Look for work now (called after a trim)."""
        self._wake.set()

    async def run_once(self) -> bool:
        """Claim and run one job (or the one claimed as the last was finished); False when there was none."""
        job, self._next = self._next, None
        if job is None:
            job = await self.sessions.claim_job(self.worker_id, kinds=tuple(self.handlers), lease_s=self.lease_s)
        if job is None:
            return False
        handler = self.handlers[job.kind]
        heartbeat = asyncio.create_task(self._heartbeat(job.id), name=f"goclaw-job-{job.id}-lease")
        try:
            await handler(job)
        except ParkableError as exc:
            status = await self.sessions.fail_job(
                job.id,
                str(exc),
                raw_answer=exc.raw_answer,
                max_attempts=self.max_attempts,
                base_delay_s=self.base_delay_s,
            )
            log.warning("job %s (%s) failed: %s; now %s", job.id, job.kind, exc, status)
            self._count(job.kind, status)
            return True
        except Exception as exc:
            status = await self.sessions.fail_job(
                job.id, f"{type(exc).__name__}: {exc}", max_attempts=self.max_attempts, base_delay_s=self.base_delay_s
            )
            log.warning("job %s (%s) failed: %s; now %s", job.id, job.kind, exc, status)
            self._count(job.kind, status)
            return True
        finally:
            await cancel_and_wait(heartbeat)  # never swallows a stop that lands meanwhile
        # The next job is claimed as this one is finished (one write instead of two); the next
        # call runs it at once, with nothing awaited in between, so it is never left claimed and
        # idle (a cancellation lands in its handler, as for any running job: lease, then retry).
        # A kind in ``forget_done`` is deleted instead of kept as done.
        self._next = await self.sessions.finish_and_claim_job(
            job.id,
            self.worker_id,
            kinds=tuple(self.handlers),
            lease_s=self.lease_s,
            forget=job.kind in self.forget_done,
        )
        self._count(job.kind, "done")
        return True

    async def _heartbeat(self, job_id: int) -> None:
        """Renew this worker's lease on ``job_id`` every ``heartbeat_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                if not await renew_lease(self.sessions, job_id, self.worker_id):
                    log.warning("job %s: lease lost to another worker", job_id)
                    return
            except Exception as exc:  # the next beat tries again; the lease outlives a few misses
                log.warning("job %s: lease renewal failed: %s", job_id, exc)

    async def drain(self) -> int:
        """Run every runnable job now (tests, `goclaw` CLI); returns how many ran."""
        n = 0
        while await self.run_once():
            n += 1
        return n

    async def prune(self) -> tuple[int, bool]:
        """Delete done jobs finished more than ``keep_done_s`` ago, up to ``PRUNE_BATCHES`` batches.

        Returns how many went, and whether more are left for the next call.
        """
        if self.keep_done_s is None:
            return 0, False
        before = self.sessions.now() - timedelta(seconds=self.keep_done_s)
        total = 0
        for _ in range(PRUNE_BATCHES):
            n = await self.sessions.prune_done_jobs(before, limit=PRUNE_BATCH)
            total += n
            if n < PRUNE_BATCH:
                return total, False
        return total, True

    async def _prune_when_due(self) -> None:
        loop = asyncio.get_running_loop()
        if (self.keep_done_s is None and not self.upkeep) or loop.time() < self._prune_at:
            return
        self._prune_at = loop.time() + PRUNE_EVERY_S  # a failure below waits as long as a success
        pruned, more = await self.prune()
        if pruned:
            log.info("job worker: deleted %d done jobs finished more than %.0f s ago", pruned, self.keep_done_s)
        for what, step in self.upkeep.items():
            done, left = await step()
            more = more or left
            if done:
                log.info("job worker: %s: %d", what, done)
        if more:
            self._prune_at = loop.time() + PRUNE_AGAIN_S

    def _count(self, kind: str, outcome: str) -> None:
        if self.metrics:
            self.metrics.jobs.labels(kind, outcome).inc()
        if self.report is not None:
            self.report(kind, outcome)

    async def _loop(self) -> None:
        while True:
            try:
                while await self.run_once():
                    pass
                await self._prune_when_due()  # idle: the queue is empty
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason = storage_reason(exc)
                if reason is None:
                    log.exception("job worker: unexpected error; continuing")
                elif not self._storage_down:
                    log.error("job worker: the database refuses writes (%s); retrying quietly", reason)
                self._storage_down = reason is not None
            else:
                if self._storage_down:
                    log.warning("job worker: the database takes writes again")
                self._storage_down = False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)

    async def start(self) -> None:
        """Start polling in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="goclaw-job-worker")

    async def stop(self) -> None:
        """Stop polling (a running job is cancelled and will be reclaimed after its lease)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
