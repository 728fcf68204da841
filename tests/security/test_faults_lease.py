"""Issue 9 item 10: a killed worker's job is taken over within its short lease; a renewed lease never is."""

from __future__ import annotations

import asyncio

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.models import Job
from gateway.sessions import SessionKey, SessionStore
from gateway.worker import JobWorker
from pairing.principal import Principal, Role
from tests.conftest import Clock

ALICE = Principal.human("u_alice", Role.USER, "Alice")


async def _one_job(sessions: SessionStore, clock: Clock) -> int:
    sid = await sessions.session_id(SessionKey("api", "lease"))
    for i in range(3):
        await sessions.store_message(
            sid, platform_message_id=f"m{i}", speaker=ALICE, display_name="A", text="x", said_at=clock.now
        )
    trim = await sessions.trim(sid, max_messages=2, keep_messages=1, turn_principal=ALICE, trust_of=lambda _: "user")
    assert trim is not None
    return trim.job_id


async def _job(engine: AsyncEngine, job_id: int) -> Job:
    async with engine.connect() as conn:
        return (await conn.execute(select(Job).where(Job.id == job_id))).one()  # type: ignore[return-value]


async def _until(predicate: object, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_a_dead_workers_job_is_taken_within_30s_and_a_renewed_lease_never(
    engine: AsyncEngine, clock: Clock
) -> None:
    sessions = SessionStore(engine, clock=clock)
    job_id = await _one_job(sessions, clock)
    started = asyncio.Event()
    ran_by: list[str] = []

    async def stuck(job: Job) -> None:
        ran_by.append("a")
        started.set()
        await asyncio.Event().wait()  # runs until the worker is killed

    async def quick(job: Job) -> None:
        ran_by.append("b")

    a = JobWorker(sessions, {"extract": stuck}, lease_s=30, heartbeat_s=0.02)
    b = JobWorker(sessions, {"extract": quick}, lease_s=30, heartbeat_s=0.02)
    running_a = asyncio.create_task(a.run_once())
    await asyncio.wait_for(started.wait(), 30)

    # Worker a is alive: every beat moves its lease forward, so b never takes the job,
    # however long the job runs.
    for _ in range(4):
        clock.advance(seconds=20)
        target = clock.now

        async def renewed(target: object = target) -> bool:
            return (await _job(engine, job_id)).locked_at == target

        await _until(renewed)
        assert await b.run_once() is False
    assert ran_by == ["a"]

    # Worker a dies (its task, heartbeat included, is gone; the job stays "running").
    running_a.cancel()
    await asyncio.gather(running_a, return_exceptions=True)
    assert (await _job(engine, job_id)).status == "running"
    clock.advance(seconds=29)
    assert await b.run_once() is False  # still inside the last lease
    clock.advance(seconds=2)
    assert await b.run_once() is True  # 31 s after a's last beat: taken over
    done = await _job(engine, job_id)
    assert (done.status, done.locked_by, ran_by) == ("done", b.worker_id, ["a", "b"])
