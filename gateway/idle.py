"""Idle extraction: a session quiet for ``session.idle_extract_seconds`` is learned from at once.

Without it, nothing a person teaches is learned until the trim, which may be
forty messages away. The sweep hands a quiet session's messages not yet
extracted to the same durable ``extract`` job a trim writes, so they go
through exactly the same rules (``lines_by_speaker``, roles as stored,
unpaired lines nobody's, the write gate). Each session keeps an "extracted
through" mark (a message id); the sweep and the trim each cover only what lies
after it and move it in the transaction that writes their job, so no message
is extracted twice. On PostgreSQL with several gateway processes, the mark is
moved only if it still holds the value the sweep read: of two processes that
saw the same quiet session, one writes the job and the other writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from msgspec import Struct
from sqlalchemy import Select, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.models import Job, Message, Session
from gateway.sessions import StoredMessage, stored_message
from gateway.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EXTRACT_JOB = "extract"
SWEEP_BATCH = 100
MAX_LOOKED_AT = 2_000
"""More sessions than this to look at between full sweeps, and a sweep looks at every one (a long list costs more)."""
FULL_SWEEP_S = 600.0
"""How often a sweep looks at every session; between, it looks only at those with live messages past its floor.

The first sweep after a start is one. A message that commits below the floor (on PostgreSQL a
sequence number taken before another that committed first) is found by the next one: at most
this late, instead of ``session.idle_extract_seconds``.
"""


class IdleSlice(Struct, frozen=True):
    """What one sweep handed to extraction for one session."""

    session_id: str
    after_message_id: int
    through_message_id: int
    job_id: int | None  # None: only agent replies were new; the mark moved, no job was needed


def sweep_interval(idle_seconds: float) -> float:
    """How often to look for quiet sessions: a quarter of the idle delay, between 0.2 s and 10 s."""
    return max(0.2, min(idle_seconds / 4, 10.0))


class IdleExtractor:
    """Finds sessions quiet for ``idle_seconds`` and writes their extraction jobs.

    Args:
        engine: The gateway's database.
        idle_seconds: How long a session must have been quiet (0 switches the sweep off).
        clock: The gateway's clock (tests move it by hand).
        on_job: Called after a sweep wrote at least one job (wakes the job worker).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        idle_seconds: float,
        clock: Callable[[], datetime],
        on_job: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._on_job = on_job
        self._task: asyncio.Task[None] | None = None
        # Between full sweeps a sweep looks at the sessions with live messages past ``_floor`` (the newest
        # message at the last sweep) and at ``_waiting``, those that still had some not yet extracted.
        self._floor: int | None = None
        self._waiting: list[str] = []
        self._full_at = 0.0  # the monotonic time of the next sweep over every session

    async def quiet_sessions(self, *, limit: int = SWEEP_BATCH) -> list[tuple[str, int, int]]:
        """(session id, mark, newest message id) of sessions with unextracted messages, quiet long enough.

        Every ``FULL_SWEEP_S`` (and first) it looks at every session. Between, it looks only
        at the sessions with live messages stored since the last sweep and at those that
        still had messages waiting then. Sessions accumulate: every conversation is one,
        and the OpenAI-compatible endpoint makes one for each request that names none; a
        sweep (every 10 s by default) over all of them cost 105 ms at 200,000 sessions on
        SQLite and 559 ms on PostgreSQL, one between full sweeps 2.1 and 4.0 ms
        (``bench/idle_sweep.py --sessions 200000 --live 2``).
        """
        now = time.monotonic()
        msgs = Message.__table__
        full = self._floor is None or now >= self._full_at
        async with self.engine.connect() as conn:
            newest = (await conn.execute(select(func.max(msgs.c.id)))).scalar()
            ids: list[str] | None = None
            if not full:
                since = select(msgs.c.session_id).where(msgs.c.id > self._floor, msgs.c.archive_id.is_(None))
                # Deduplicated here: with DISTINCT, SQLite walked a whole index in session order instead.
                ids = sorted(set((await conn.execute(since)).scalars()) | set(self._waiting))
                full = len(ids) > MAX_LOOKED_AT
            if full:
                ids = None
            pending: list[str] = []
            found: list[tuple[str, int, int]] = []
            if ids is None or ids:
                pending = list((await conn.execute(self.waiting_query(ids))).scalars())
                rows = await conn.execute(self.quiet_query(limit, ids=ids))
                found = [(r.session_id, int(r.extracted_through), int(r.through)) for r in rows]
        if full:
            self._full_at = now + FULL_SWEEP_S
        # Read first: a message stored since has a higher id (on SQLite always; on PostgreSQL one whose
        # id was taken earlier may commit later, and the next full sweep finds it).
        self._floor, self._waiting = int(newest or 0), pending
        return found

    def _sessions(self, ids: Sequence[str] | None) -> Any:
        """The sessions a sweep looks at: every one, or these (read by primary key)."""
        sess = Session.__table__
        if ids is None:
            return sess
        return select(sess).where(sess.c.id.in_(list(ids))).subquery("looked_at")

    def waiting_query(self, ids: Sequence[str] | None = None) -> Select[Any]:
        """The ids of the sessions looked at (all, or ``ids``) that have live messages not yet extracted."""
        msgs = Message.__table__
        sess = self._sessions(ids)
        unextracted = (
            select(msgs.c.id)
            .where(msgs.c.session_id == sess.c.id, msgs.c.archive_id.is_(None), msgs.c.id > sess.c.extracted_through)
            .exists()
        )
        return select(sess.c.id).where(unextracted)

    def quiet_query(self, limit: int = SWEEP_BATCH, *, ids: Sequence[str] | None = None) -> Select[Any]:
        """``quiet_sessions``' statement, as of now, over every session or only ``ids``.

        Driven by the sessions: for each, its live messages past its mark are sought on
        ``ix_messages_session_live`` (session, archive, id). Driven by the messages (a join
        grouped by session) SQLite walked that whole index, every message ever stored and
        trimmed ones included, and PostgreSQL scanned the table, each sweep (every 10 s at the
        default idle delay), in one read transaction that kept SQLite's WAL from starting
        again: ``bench/idle_sweep.py``, a million messages over 2,000 sessions, 47 ms on
        SQLite and 48 on PostgreSQL, against 3.3 and 4.1 ms for this, which grows with the
        sessions, not with their history.
        """
        msgs, sess = Message.__table__, self._sessions(ids)
        cutoff = self._clock() - timedelta(seconds=self.idle_seconds)
        unextracted = (
            msgs.c.session_id == sess.c.id,
            msgs.c.archive_id.is_(None),
            msgs.c.id > sess.c.extracted_through,
        )
        through = select(func.max(msgs.c.id)).where(*unextracted).scalar_subquery()
        last = select(func.max(msgs.c.created_at)).where(*unextracted).scalar_subquery()
        per_session = select(
            sess.c.id.label("session_id"), sess.c.extracted_through, through.label("through"), last.label("last")
        ).subquery()
        return (
            select(per_session.c.session_id, per_session.c.extracted_through, per_session.c.through)
            .where(per_session.c.through.is_not(None), per_session.c.last <= cutoff)
            .order_by(per_session.c.last)
            .limit(limit)
        )

    async def extract_session(self, session_id: str, after: int, through: int) -> IdleSlice | None:
        """Move the session's mark from ``after`` to ``through`` and write the job, in one transaction.

        Returns None when the mark no longer holds ``after`` (a trim, or another
        process's sweep, moved it first): then nothing is written.
        """
        msgs = Message.__table__
        now = self._clock()
        async with self.engine.begin() as conn:
            moved = await conn.execute(
                update(Session)
                .where(Session.id == session_id, Session.extracted_through == after)
                .values(extracted_through=through)
            )
            if moved.rowcount != 1:
                return None
            people = await conn.scalar(
                select(func.count())
                .select_from(msgs)
                .where(
                    msgs.c.session_id == session_id,
                    msgs.c.id > after,
                    msgs.c.id <= through,
                    msgs.c.is_agent.is_(False),
                )
            )
            if not people:
                return IdleSlice(session_id, after, through, None)
            job_id = (
                await conn.execute(
                    insert(Job)
                    .values(
                        kind=EXTRACT_JOB,
                        payload={
                            "session_id": session_id,
                            "archive_id": None,
                            # No turn is running: everyone is read by the role their
                            # messages were stored with (see gateway.memory_glue).
                            "turn_principal": None,
                            "summary": "",
                            "after_message_id": after,
                            "through_message_id": through,
                        },
                        status="pending",
                        attempts=0,
                        run_after=now,
                        created_at=now,
                    )
                    .returning(Job.id)
                )
            ).scalar_one()
        return IdleSlice(session_id, after, through, int(job_id))

    async def sweep_once(self) -> list[IdleSlice]:
        """Write an extraction job for every quiet session; returns what was handed over."""
        if self.idle_seconds <= 0:
            return []
        done: list[IdleSlice] = []
        for session_id, after, through in await self.quiet_sessions():
            got = await self.extract_session(session_id, after, through)
            if got is not None:
                done.append(got)
                log.info(
                    "session %s: quiet for %ss; messages %d..%d handed to extraction (job %s)",
                    session_id,
                    self.idle_seconds,
                    after + 1,
                    through,
                    got.job_id,
                )
        if any(d.job_id is not None for d in done) and self._on_job is not None:
            self._on_job()
        return done

    async def _loop(self) -> None:
        interval = sweep_interval(self.idle_seconds)
        while True:
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("idle extraction sweep failed; trying again")
            await asyncio.sleep(interval)

    async def start(self) -> None:
        """Sweep in the background (nothing when ``idle_seconds`` is 0)."""
        if self._task is None and self.idle_seconds > 0:
            self._task = asyncio.create_task(self._loop(), name="goclaw-idle-extraction")

    async def stop(self) -> None:
        """Stop sweeping."""
        task, self._task = self._task, None
        await cancel_and_wait(task)


async def messages_between(engine: AsyncEngine, session_id: str, after: int, through: int) -> list[StoredMessage]:
    """A session's messages with ``after < id <= through``, trimmed or not, oldest first."""
    msgs = Message.__table__
    q = select(msgs).where(msgs.c.session_id == session_id, msgs.c.id > after, msgs.c.id <= through).order_by(msgs.c.id)
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return [stored_message(r) for r in rows]
