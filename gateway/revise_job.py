"""Belief revision of a turn's own writes, as a durable ``revise`` job run by the worker.

The judge is a model call (hundreds of milliseconds on a real model): after a
``memory_write`` or an ``@notes:`` directive the turn only records the job, and
the worker calls the same reviser with the same cause (``live``). The subject
rule already ran inside the write, so the record is never left contradicting an
exact-subject predecessor while the job waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.models import Job
from gateway.sessions import SessionStore
from memory.belief_revision import BeliefReviser

REVISE_JOB = "revise"
# A done revise job is deleted: the revision rows (run id, cause, judge model) are its record, and a
# job row per memory_write would only grow the jobs table. A failed one stays, parked, for inspection.
FORGET_DONE = frozenset({REVISE_JOB})
# The sources a turn writes with; extraction, relearn and confirm revise in place (they run off the turn already).
TURN_SOURCES = frozenset({"memory_write", "directive"})


def revision_enqueuer(sessions: SessionStore, wake: Callable[[], None]) -> Callable[[str, str | None], Awaitable[None]]:
    """A function that records a ``revise`` job for one record (under its write's run id) and wakes the worker."""

    async def enqueue(record_id: str, run_id: str | None = None) -> None:
        # The write's run id travels with the job: the judge's retirements are
        # undone with the write's own (goclaw memory revisions undo --run).
        await sessions.queue_job(REVISE_JOB, {"record_id": record_id, "cause": "live", "run_id": run_id})
        wake()

    return enqueue


def revise_job(reviser: BeliefReviser) -> Callable[[Job], Awaitable[None]]:
    """The worker's handler: revise the job's record (a record no longer live is skipped by the reviser)."""

    async def handle(job: Job) -> None:
        run_id = job.payload.get("run_id")
        await reviser.revise(
            str(job.payload["record_id"]),
            cause=str(job.payload.get("cause") or "live"),
            run_id=str(run_id) if run_id else None,
        )

    return handle
