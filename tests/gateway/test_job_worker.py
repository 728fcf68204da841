"""The job worker through a queue: each job finished claims the next, and every job runs once, in order.

Done jobs are kept ``worker.keep_done_jobs_days`` (7 by default), then the idle worker deletes them.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import gateway.worker as worker_module
from gateway.config import Config
from gateway.db import make_engine
from gateway.models import Job
from gateway.sessions import SessionKey, SessionStore
from gateway.worker import JobWorker
from pairing.principal import Principal, Role
from tests.conftest import Clock

ALICE = Principal.human("u_alice", Role.USER, "Alice")


async def _queue(sessions: SessionStore, n: int, *, prefix: str = "queue") -> list[int]:
    """``n`` extraction jobs, each a trim's (of sessions ``prefix-0``...), oldest first."""
    ids = []
    for c in range(n):
        sid = await sessions.session_id(SessionKey("api", f"{prefix}-{c}"))
        for i in range(3):
            await sessions.store_message(
                sid, platform_message_id=f"m{i}", speaker=ALICE, display_name="A", text="x", said_at=sessions.now()
            )
        trim = await sessions.trim(sid, max_messages=2, keep_messages=1, turn_principal=ALICE, trust_of=lambda _: "u")
        assert trim is not None
        ids.append(trim.job_id)
    return ids


async def test_a_queue_runs_in_order_each_job_once_a_failure_retried(engine: AsyncEngine, clock: Clock) -> None:
    sessions = SessionStore(engine, clock=clock)
    ids = await _queue(sessions, 4)
    ran: list[int] = []

    async def handler(job: Job) -> None:
        ran.append(job.id)
        if job.id == ids[1] and job.attempts == 1:
            raise RuntimeError("the model timed out")

    worker = JobWorker(sessions, {"extract": handler}, base_delay_s=5)
    assert await worker.drain() == 4
    assert ran == ids  # the failed one did not stop the queue behind it
    jobs = {j.id: j for j in await sessions.jobs()}
    assert [jobs[i].status for i in ids] == ["done", "pending", "done", "done"]
    assert jobs[ids[1]].attempts == 1 and jobs[ids[1]].last_error == "RuntimeError: the model timed out"
    assert await worker.drain() == 0  # the retry is not due yet
    clock.advance(seconds=6)
    assert await worker.drain() == 1
    assert ran == [*ids, ids[1]]
    assert {j.status for j in await sessions.jobs()} == {"done"}


async def test_two_workers_on_one_queue_run_each_job_exactly_once(
    engine: AsyncEngine, db_url: str, clock: Clock
) -> None:
    sessions = SessionStore(engine, clock=clock)
    ids = await _queue(sessions, 12)
    other_engine = make_engine(db_url)  # the second worker is another process's
    try:
        other = SessionStore(other_engine, clock=clock)
        ran: list[tuple[str, int]] = []

        def handler(name: str):  # type: ignore[no-untyped-def]
            async def run(job: Job) -> None:
                ran.append((name, job.id))
                await asyncio.sleep(0)  # let the other worker claim meanwhile

            return run

        a = JobWorker(sessions, {"extract": handler("a")})
        b = JobWorker(other, {"extract": handler("b")})
        counts = await asyncio.gather(a.drain(), b.drain())
        assert sum(counts) == 12
        assert sorted(job_id for _, job_id in ran) == ids  # each once
        assert {j.status for j in await sessions.jobs()} == {"done"}
    finally:
        await other_engine.dispose()


async def test_a_stop_that_lands_as_a_job_ends_stops_the_worker(engine: AsyncEngine, clock: Clock) -> None:
    # The job's end stops its lease heartbeat and waits one loop turn for it. A stop landing in that
    # turn was swallowed with the heartbeat's own cancellation: the worker polled on for good, and
    # goclaw serve's job process never exited until it was killed 30 s later.
    sessions = SessionStore(engine, clock=clock)
    await _queue(sessions, 2)
    ran: list[int] = []

    async def ended(job: Job) -> None:
        ran.append(job.id)
        assert worker._task is not None
        # Queued now, so it runs after this handler returns and before the heartbeat has finished.
        asyncio.get_running_loop().call_soon(worker._task.cancel)

    worker = JobWorker(sessions, {"extract": ended}, poll_interval=0.05)
    await worker.start()
    task = worker._task
    assert task is not None
    done, _ = await asyncio.wait({task}, timeout=30)  # only a hang's limit: it ends at once or never
    assert done, "the worker kept running after it was told to stop"
    assert task.cancelled()
    assert len(ran) == 1  # it stopped after the job it was running, not after the queue


async def _never(job: Job) -> None:
    raise AssertionError(f"no job of this kind exists: {job.kind}")


async def _done_and_kept(sessions: SessionStore, clock: Clock) -> tuple[list[int], list[int]]:
    """Three extraction jobs done eight days ago; a done one, a pending one and a parked one from now."""

    async def ok(job: Job) -> None:
        return None

    old = await _queue(sessions, 3)
    assert await JobWorker(sessions, {"extract": ok}).drain() == 3
    clock.advance(days=8)
    recent_done, pending, parked = await _queue(sessions, 3, prefix="later")

    async def claim() -> int:
        job = await sessions.claim_job("w", kinds=("extract",), lease_s=30)
        assert job is not None
        return job.id

    assert await claim() == recent_done
    await sessions.finish_job(recent_done)
    assert await claim() == pending
    assert await sessions.fail_job(pending, "the model timed out", max_attempts=5) == "pending"  # retried later
    assert await claim() == parked
    assert await sessions.fail_job(parked, "bad answer", max_attempts=1) == "failed"
    return old, [recent_done, pending, parked]


async def test_done_jobs_past_the_days_kept_are_deleted_and_no_other(
    engine: AsyncEngine, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kept forever they grew the table by a row per trim (the dashboard's count read them all).
    sessions = SessionStore(engine, clock=clock)
    old, kept = await _done_and_kept(sessions, clock)
    monkeypatch.setattr(worker_module, "PRUNE_BATCH", 2)
    monkeypatch.setattr(worker_module, "PRUNE_BATCHES", 1)
    worker = JobWorker(sessions, {"none": _never}, keep_done_s=7 * 86_400)
    assert await worker.prune() == (2, True)  # a full batch: more may be left
    assert await worker.prune() == (1, False)
    assert await worker.prune() == (0, False)
    jobs = {j.id: j.status for j in await sessions.jobs()}
    assert sorted(jobs) == sorted(kept)
    assert [jobs[i] for i in kept] == ["done", "pending", "failed"]
    assert not set(old) & set(jobs)
    assert await JobWorker(sessions, {"none": _never}).prune() == (0, False)  # no keep_done_s: kept


async def test_an_idle_worker_deletes_old_done_jobs_on_its_own(engine: AsyncEngine, clock: Clock) -> None:
    sessions = SessionStore(engine, clock=clock)
    old, kept = await _done_and_kept(sessions, clock)
    worker = JobWorker(
        sessions, {"none": _never}, keep_done_s=Config().worker.keep_done_jobs_days * 86_400, poll_interval=0.05
    )
    await worker.start()
    try:
        for _ in range(600):  # only a hang's limit: the first idle moment prunes
            if not {j.id for j in await sessions.jobs()} & set(old):
                break
            await asyncio.sleep(0.05)
        assert sorted(j.id for j in await sessions.jobs()) == sorted(kept)
    finally:
        await worker.stop()
