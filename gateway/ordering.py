"""One session's messages answered in order across gateway processes.

Within one process :class:`~gateway.turn.TurnHandler` keeps a session's turns in
order with an ``asyncio.Lock``. With several processes on one PostgreSQL
database (``goclaw serve --workers N``) message m1 may be answered by process A
while m2 of the same session, sent after m1 was stored, arrives at B. B must
answer m2 after m1, with m1 and its reply in m2's history.

The lease: a message stored to be answered carries ``messages.answering_until``
(set in the insert ``begin_turn`` already does, so no extra statement), renewed
every third of the lease while its turn runs (only a turn that lasts that long
pays for it). A message is done when its reply row exists (nothing to clear on
success); a failed turn clears its lease. ``begin_turn`` looks at the history it
reads anyway: an earlier message of the session under a live lease and without a
reply makes the turn wait (:meth:`AnswerOrder.wait`) and then read its history
again. A lease that expired, or was not renewed for ``lease_s`` seconds as this
process sees it (its process died, or clocks disagree), no longer blocks.

Order is the order in which messages were stored: a message still queued behind
its own process's lock is not yet stored and not yet in line anywhere else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from msgspec.structs import replace
from sqlalchemy import and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.models import Message
from gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    from gateway.sessions import StoredMessage, TurnStart

log = logging.getLogger(__name__)

ANSWER_LEASE_S = 30.0
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5


class Blocker(Struct, frozen=True):
    """An earlier message of the session that another turn is still answering."""

    message_row_id: int
    until: datetime


def lease_until(now: datetime, lease_s: float) -> datetime:
    """When a lease taken ``now`` runs out."""
    return now + timedelta(seconds=lease_s)


def earlier_in_answer(rows: Iterable[Any], current_id: int, now: datetime) -> tuple[Blocker, ...]:
    """The earlier messages, among history ``rows``, still under a live lease and without a reply.

    ``rows`` are rows of the messages table (anything with ``id``, ``is_agent``,
    ``reply_to_id`` and ``answering_until``): the history read ``begin_turn``
    does, so the check costs no statement.
    """
    rows = list(rows)
    replied = {r.reply_to_id for r in rows if r.is_agent and r.reply_to_id is not None}
    return tuple(
        Blocker(r.id, r.answering_until)
        for r in rows
        if not r.is_agent
        and r.id < current_id
        and r.answering_until is not None
        and r.answering_until > now
        and r.id not in replied
    )


def in_answer_order(rows: Iterable[Any]) -> list[Any]:
    """Rows oldest first, each reply right after the message it answers (a reply may have a later id)."""
    return sorted(
        rows, key=lambda r: (r.reply_to_id if r.is_agent and r.reply_to_id is not None else r.id, bool(r.is_agent))
    )


class Lease:
    """The lease of one message while its turn runs: renewed in the background, cleared if the turn fails."""

    def __init__(self, order: AnswerOrder, row_id: int) -> None:
        self._order = order
        self.row_id = row_id
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._order.lease_s / 3, self._renew)

    def _renew(self) -> None:
        self._task = asyncio.create_task(self._renew_now(), name=f"goclaw-answer-lease-{self.row_id}")

    async def _renew_now(self) -> None:
        try:
            await self._order.set_lease(self.row_id, lease_until(self._order.clock(), self._order.lease_s))
        except Exception as exc:  # the lease outlives a missed renewal or two
            log.warning("message %s: answer lease renewal failed: %s", self.row_id, exc)
        self._schedule()

    async def end(self, *, clear: bool) -> None:
        """Stop renewing; ``clear`` (a failed turn) lets the session's next message go now."""
        if self._timer is not None:
            self._timer.cancel()
        await cancel_and_wait(self._task)  # None, or done, costs nothing
        if clear:
            try:
                await self._order.set_lease(self.row_id, None)
            except Exception as exc:  # it expires on its own
                log.warning("message %s: answer lease not cleared: %s", self.row_id, exc)


class AnswerOrder:
    """Waits for a session's earlier messages being answered elsewhere; keeps this turn's lease.

    Args:
        engine: The gateway's database.
        lease_s: ``session.answer_lease_seconds``.
        clock: The store's clock (leases are compared with it).
    """

    def __init__(self, engine: AsyncEngine, *, lease_s: float, clock: Callable[[], datetime]) -> None:
        self.engine = engine
        self.lease_s = lease_s
        self.clock = clock

    def hold(self, row_id: int) -> Lease:
        """Keep ``row_id``'s lease alive until :meth:`Lease.end`."""
        return Lease(self, row_id)

    async def set_lease(self, row_id: int, until: datetime | None) -> None:
        """Renew (or, with None, clear) a message's lease."""
        async with self.engine.begin() as conn:
            await conn.execute(update(Message).where(Message.id == row_id).values(answering_until=until))

    async def take(self, row_id: int) -> None:
        """Take the lease of a message stored earlier and answered now (a resumed turn)."""
        await self.set_lease(row_id, lease_until(self.clock(), self.lease_s))

    async def wait(self, start: TurnStart, *, history_limit: int) -> TurnStart:
        """Wait until no earlier message of the session is being answered; the turn with its history read again."""
        from gateway.sessions import stored_message

        assert start.stored is not None
        current = start.stored.id
        blockers = start.waiting_on
        first = {b.message_row_id: b.until for b in blockers}
        log.debug(
            "session %s: message %s waits for earlier message(s) %s being answered elsewhere",
            start.session_id,
            current,
            ", ".join(str(b) for b in sorted(first)),
        )
        seen: dict[int, tuple[datetime, float]] = {}
        delay = POLL_FIRST_S
        rows: list[Any] = []
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
            rows = await self._history_rows(start.session_id, current, history_limit)
            now_m = time.monotonic()
            live = []
            for b in earlier_in_answer(rows, current, self.clock()):
                last = seen.get(b.message_row_id)
                if last is None or last[0] != b.until:
                    seen[b.message_row_id] = (b.until, now_m)
                elif now_m - last[1] > self.lease_s:
                    continue  # not renewed for a whole lease: its process is gone
                live.append(b)
            if not live:
                break
        history: list[StoredMessage] = [stored_message(r) for r in in_answer_order(rows)]
        current_msg = next(m for m in history if m.id == current)
        history = [m for m in history if m.id != current] + [current_msg]
        return replace(start, history=history, waiting_on=())

    async def _history_rows(self, session_id: str, current: int, limit: int) -> list[Any]:
        """The session's live messages up to ``current``, with replies to earlier ones stored after it."""
        msgs = Message.__table__
        q = (
            select(msgs)
            .where(
                msgs.c.session_id == session_id,
                msgs.c.archive_id.is_(None),
                or_(msgs.c.id <= current, and_(msgs.c.is_agent.is_(True), msgs.c.reply_to_id < current)),
            )
            .order_by(msgs.c.id.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            return list((await conn.execute(q)).all())
