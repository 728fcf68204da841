"""Sessions and messages: stored once, trimmed into archives with a durable job."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.db import dialect_insert
from gateway.hotstore import hot_store
from gateway.hotstore.base import (
    NewMessage,
    StoredMessage,
    TrimSession,
    TrimWrite,
    TurnMessage,
    TurnRecordRow,
    new_session_id,
)
from gateway.models import Archive, Job, Message, Session
from gateway.ordering import ANSWER_LEASE_S, Blocker, earlier_in_answer, in_answer_order, lease_until
from memory.archive_format import render_archive_markdown
from memory.types import SliceMessage
from pairing.principal import Principal, PrincipalKind, Role
from pairing.store import PairingError

if TYPE_CHECKING:
    from gateway.explain import TurnExplanation


TRIM_JOB = "trim"
"""A durable job that trims one session (``TurnHandler`` queues it after the reply when trims run as jobs)."""
_TRIMS_KEPT = 10_000
"""Sessions whose last queued trim job ``queue_trim`` remembers (the least recent forgotten first)."""


class SessionKey(Struct, frozen=True):
    """Where a conversation happens."""

    channel: str
    conversation_id: str
    thread_id: str = ""
    parent_conversation_id: str | None = None


def _as_read(speaker: Principal, role: str | None) -> Principal:
    """``speaker`` with the role ``begin_turn`` read for them (the same object when it has not changed)."""
    if not speaker.from_users or role is None or speaker.stored_role == role or speaker.user_id is None:
        return speaker
    return Principal.human(speaker.user_id, Role(role), speaker.display_name, from_users=True)


class TurnStart(Struct, frozen=True):
    """The opening of a turn, read and written in one transaction."""

    session_id: str
    stored: StoredMessage | None  # None: already stored, nothing to answer (see ``reply``)
    history: list[StoredMessage]  # untrimmed, oldest first, including ``stored``
    previous_context: str
    reply: str | None = None  # a duplicate's stored reply
    resumed: bool = False  # ``stored`` was stored before but never answered: answer it now
    # Earlier messages another process is still answering (gateway/ordering.py): the turn waits for them.
    waiting_on: tuple[Blocker, ...] = ()
    # Who the turn runs as: the speaker given, or (``Principal.from_users``) the same person with the
    # role read where the message was stored, when it has changed since the speaker was read.
    speaker: Principal | None = None


class SpeakerGone(PairingError):
    """A turn's speaker came from the users table and has no row there any more: nothing was stored."""

    def __init__(self, user_id: str | None) -> None:
        super().__init__(f"no user {user_id!r}: see 'goclaw users list'")
        self.user_id = user_id


class TrimResult(Struct, frozen=True):
    """What one trim produced, all in one transaction."""

    archive_id: str
    job_id: int
    message_count: int
    trust: str
    summary: str


def stored_message(m: Message | Any) -> StoredMessage:
    """The view of a stored message, from an ORM ``Message`` or a Core row of the messages table."""
    return StoredMessage(
        m.id,
        m.session_id,
        m.platform_message_id,
        m.speaker_user_id,
        m.stored_role,
        m.display_name,
        m.text,
        m.said_at,
        m.is_agent,
        m.reply_to_id,
        m.answering_until,
    )


def principal_json(p: Principal) -> dict[str, Any]:
    """A principal as job payload."""
    return {
        "kind": p.kind.value,
        "user_id": p.user_id,
        "role": p.role.value if p.role else None,
        "system_name": p.system_name,
        "display_name": p.display_name,
    }


def principal_from_json(d: dict[str, Any]) -> Principal:
    """The inverse of principal_json."""
    kind = PrincipalKind(d["kind"])
    if kind is PrincipalKind.HUMAN:
        return Principal.human(d["user_id"], Role(d["role"]), d.get("display_name") or "")
    if kind is PrincipalKind.SYSTEM:
        return Principal.system(d["system_name"])
    return Principal.unpaired(d.get("display_name") or "")


def render_archive(
    session: Session | TrimSession,
    archive_id: str,
    messages: Sequence[StoredMessage],
    trust: str,
    summary: str,
    *,
    slices: Sequence[SliceMessage] | None = None,
) -> str:
    """The markdown document of a trimmed slice: every field escaped, one line per message.

    The format is memory's (``memory.archive_format``): relearn reads it back,
    so no field a person controls may be able to forge a line. ``slices`` are
    ``messages``' own ``as_slice()``, when the caller has made them already.
    """
    return render_archive_markdown(
        archive_id=archive_id,
        session_id=session.id,
        channel=session.channel,
        conversation_id=session.conversation_id,
        thread_id=session.thread_id or "",
        messages=[m.as_slice() for m in messages] if slices is None else slices,
        trust=trust,
        summary=summary,
    )


def summarize(messages: Sequence[StoredMessage], *, per_speaker: int = 3, chars: int = 160) -> str:
    """A deterministic extractive summary: who said what, in order of first appearance.

    Deterministic on purpose: it is written in the same transaction as the trim,
    and must not depend on a model being reachable.
    """
    if not messages:
        return ""
    order: list[str] = []
    said: dict[str, list[str]] = {}
    for m in messages:
        who = "the agent" if m.is_agent else f"{m.display_name or 'someone'} ({m.speaker_user_id or 'unpaired'})"
        if who not in said:
            order.append(who)
            said[who] = []
        if len(said[who]) < per_speaker:
            text = " ".join(m.text.split())
            said[who].append(text if len(text) <= chars else text[: chars - 1] + "…")
    head = f"{messages[0].said_at:%Y-%m-%d %H:%M}–{messages[-1].said_at:%H:%M} UTC, {len(messages)} messages."
    return head + " " + " ".join(f"{who}: " + " / ".join(said[who]) + "." for who in order)


class SessionStore:
    """Sessions, messages, archives and jobs on one database."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], datetime] | None = None) -> None:
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._dialect = engine.dialect.name
        self._hot = hot_store(engine)
        self.answer_lease_s = ANSWER_LEASE_S  # session.answer_lease_seconds (gateway/ordering.py)
        # Each session's last trim job this store queued, newest last (``queue_trim``).
        self._trims_queued: OrderedDict[str, int] = OrderedDict()

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock()

    def _insert(self, table: Any) -> Any:
        return dialect_insert(self._dialect, table)

    # ---- sessions & messages ------------------------------------------------------------

    async def session_id(self, key: SessionKey) -> str:
        """The id of the session for ``key``, created on first use (race-safe)."""
        async with self._sessions.begin() as s:
            found = await self._find_session(s, key)
            if found:
                return found
            now = self.now()
            stmt = (
                self._insert(Session)
                .values(
                    id=new_session_id(),
                    channel=key.channel,
                    conversation_id=key.conversation_id,
                    thread_id=key.thread_id or "",
                    parent_conversation_id=key.parent_conversation_id,
                    previous_context="",
                    created_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=["channel", "conversation_id", "thread_id"])
            )
            await s.execute(stmt)
            found = await self._find_session(s, key)
            assert found is not None
            return found

    @property
    def remote(self) -> bool:
        """Whether the hot path's statements wait on a database server (PostgreSQL): two can then overlap."""
        return self._hot.remote

    async def _find_session(self, s: AsyncSession, key: SessionKey) -> str | None:
        return (
            await s.execute(
                select(Session.id).where(
                    Session.channel == key.channel,
                    Session.conversation_id == key.conversation_id,
                    Session.thread_id == (key.thread_id or ""),
                )
            )
        ).scalar_one_or_none()

    async def begin_turn(
        self,
        key: SessionKey,
        *,
        platform_message_id: str,
        speaker: Principal,
        display_name: str,
        text: str,
        said_at: datetime,
        history_limit: int,
        reply_requested: bool = True,
    ) -> TurnStart:
        """Find or create the session, store the message once, and read what the prompt needs.

        One transaction on the hot path of every turn (the hot store's driver SQL, no SQLAlchemy):
        fewer round trips is most of what a turn costs on SQLite. A message
        already stored comes back as a duplicate with its stored reply, or, when
        it asked for an answer and never got one (the process died mid-turn, the
        model was down), as ``resumed`` so the caller answers it now.
        """
        start = await self._hot.begin_turn(
            TurnMessage(
                channel=key.channel,
                conversation_id=key.conversation_id,
                thread_id=key.thread_id or "",
                parent_conversation_id=key.parent_conversation_id,
                platform_message_id=platform_message_id,
                speaker_user_id=speaker.user_id,
                stored_role=speaker.stored_role,
                display_name=display_name,
                text=text,
                said_at=said_at,
                now=self.now(),
                history_limit=history_limit,
                reply_requested=reply_requested,
                # ordering: the lease of the turn that answers it, in the same insert.
                answering_until=lease_until(self.now(), self.answer_lease_s) if reply_requested else None,
                role_from_users=speaker.from_users and speaker.user_id is not None,
            )
        )
        if start.speaker_gone:
            raise SpeakerGone(speaker.user_id)
        speaker = _as_read(speaker, start.speaker_role)
        session_id, previous, new_id = start.session_id, start.previous_context, start.message_id
        if new_id is None:
            return TurnStart(session_id, None, [], previous, reply=start.reply, speaker=speaker)
        # ordering: each reply right after its message (with several processes a reply may come after a later message).
        history = in_answer_order(start.rows)
        # ordering: earlier messages still answered elsewhere, read from the rows above (no statement).
        waiting = earlier_in_answer(start.rows, new_id, self.now())
        if start.resumed:
            current = next(m for m in history if m.id == new_id)
            history = [m for m in history if m.id != new_id] + [current]
            return TurnStart(session_id, current, history, previous, resumed=True, waiting_on=waiting, speaker=speaker)
        return TurnStart(
            session_id, history[-1] if history else None, history, previous, waiting_on=waiting, speaker=speaker
        )

    async def get_session(self, session_id: str) -> Session | None:
        """A session row."""
        async with self._sessions() as s:
            return await s.get(Session, session_id)

    async def find_session(self, key: SessionKey) -> str | None:
        """The id of an existing session, or None."""
        async with self._sessions() as s:
            return await self._find_session(s, key)

    async def store_message(
        self,
        session_id: str,
        *,
        platform_message_id: str,
        speaker: Principal | None,
        display_name: str,
        text: str,
        said_at: datetime,
        is_agent: bool = False,
        explanation: TurnExplanation | None = None,
        answers: str | None = None,
        answered: Principal | None = None,
        reply_to: int | None = None,
    ) -> StoredMessage | None:
        """Store a message once; None when this platform message id was already stored.

        The speaker's user id and stored role come from the principal the
        gateway resolved, never from the text. An agent reply names the row it
        answers (``reply_to``); a second reply to the same row is not stored. A reply
        may bring its turn's ``explanation`` (of the message ``answers``, spoken by
        ``answered``): it is inserted in the same transaction, one row, for the dashboard.
        """
        user_id = speaker.user_id if speaker is not None and not is_agent else None
        role = speaker.stored_role if speaker is not None and not is_agent else None
        record = None
        if explanation is not None:
            record = TurnRecordRow(
                message_id=answers or "",
                speaker_user_id=answered.user_id if answered else None,
                stored_role=answered.stored_role if answered else None,
                memory=explanation.memory,
                sections=explanation.sections,
                model_calls=explanation.model_calls,
            )
        stored = await self._hot.store_message(
            NewMessage(
                session_id=session_id,
                platform_message_id=platform_message_id,
                speaker_user_id=user_id,
                stored_role=role,
                display_name=display_name,
                text=text,
                said_at=said_at,
                is_agent=is_agent,
                created_at=self.now(),
                reply_to=reply_to,
                record=record,
            )
        )
        if stored is None:
            return None
        new_id, record_id = stored
        return StoredMessage(
            new_id, session_id, platform_message_id, user_id, role, display_name, text, said_at, is_agent, reply_to,
            turn_record_id=record_id,
        )  # fmt: skip

    async def stored_reply(self, message_row_id: int) -> str | None:
        """The reply stored for a message row, if any."""
        return await self._hot.stored_reply(message_row_id)

    async def history(self, session_id: str, *, limit: int | None = None) -> list[StoredMessage]:
        """The session's untrimmed messages, oldest first (the newest ``limit`` if given)."""
        async with self._sessions() as s:
            q = select(Message).where(Message.session_id == session_id, Message.archive_id.is_(None))
            if limit is not None:
                q = q.order_by(Message.id.desc()).limit(limit)
                rows = list(reversed((await s.scalars(q)).all()))
            else:
                rows = list((await s.scalars(q.order_by(Message.id))).all())
            return [stored_message(m) for m in rows]

    async def newest_messages(
        self, session_id: str, limit: int, *, before: int | None = None
    ) -> tuple[list[StoredMessage], bool]:
        """The session's newest ``limit`` messages (older than row ``before``, if given), trimmed ones
        included, oldest first; and whether older ones are left.

        Their ids first, then their rows by primary key: only the rows returned are read and
        built. A long session's whole history, built as objects on the serving loop, took 2 s
        at 100,000 messages (the dashboard chat, ``GET /v1/sessions/{id}/messages``). Two
        statements, not one with a subquery: PostgreSQL joins a small table's rows to the
        subquery by reading them all. Messages have no (session_id, id) index (every turn's
        inserts would pay for it); the ids come off ``ix_messages_session_live`` (session_id,
        archive_id, id), whose entries for the session SQLite walks (not its rows).
        """
        m = Message.__table__.c
        newest = select(m.id).where(m.session_id == session_id)
        if before is not None:
            newest = newest.where(m.id < before)
        newest = newest.order_by(m.id.desc()).limit(limit + 1)
        shown = (m.id, m.session_id, m.platform_message_id, m.speaker_user_id, m.stored_role, m.display_name)
        async with self.engine.connect() as conn:
            ids = list((await conn.scalars(newest)).all())
            if not ids:
                return [], False
            wanted = (
                select(*shown, m.text, m.said_at, m.is_agent, m.reply_to_id, m.answering_until)
                .where(m.id.in_(ids[:limit]))
                .order_by(m.id)
            )
            return [stored_message(r) for r in await conn.execute(wanted)], len(ids) > limit

    async def all_messages(self, session_id: str) -> list[StoredMessage]:
        """Every message of a session, trimmed or not, oldest first."""
        async with self._sessions() as s:
            rows = (await s.scalars(select(Message).where(Message.session_id == session_id).order_by(Message.id))).all()
            return [stored_message(m) for m in rows]

    async def took_part(self, session_id: str, user_id: str) -> bool:
        """Whether ``user_id`` has a message in the session."""
        async with self._sessions() as s:
            n = await s.scalar(
                select(func.count())
                .select_from(Message)
                .where(Message.session_id == session_id, Message.speaker_user_id == user_id)
            )
            return bool(n)

    async def live_count(self, session_id: str) -> int:
        """How many untrimmed messages the session holds."""
        async with self._sessions() as s:
            return int(
                await s.scalar(
                    select(func.count())
                    .select_from(Message)
                    .where(Message.session_id == session_id, Message.archive_id.is_(None))
                )
                or 0
            )

    async def previous_context(self, session_id: str) -> str:
        """The session's PREVIOUS CONTEXT (summaries of trimmed slices)."""
        async with self._sessions() as s:
            return (await s.scalar(select(Session.previous_context).where(Session.id == session_id))) or ""

    # ---- trimming -----------------------------------------------------------------------

    async def trim(
        self,
        session_id: str,
        *,
        max_messages: int,
        keep_messages: int,
        turn_principal: Principal,
        trust_of: Callable[[Sequence[SliceMessage]], str],
        context_chars: int = 4000,
        _crash_after: str | None = None,
    ) -> TrimResult | None:
        """Cut the oldest slice when history passes ``max_messages``.

        The slice's summary (appended to PREVIOUS CONTEXT), its archive and its
        extraction job are written in one transaction with the marking of the
        slice, so a crash in between leaves the history as it was and a rerun
        makes no duplicate. ``_crash_after`` exists for the crash tests only.
        """
        planned: list[tuple[TrimWrite, TrimSession, list[StoredMessage]]] = []  # each plan, from its session and rows

        def plan(session: TrimSession, live_rows: list[StoredMessage]) -> TrimWrite | None:
            if len(live_rows) <= max_messages:
                return None
            live = in_answer_order(live_rows)  # ordering: a message and its reply are cut together
            if planned:
                write_before, before, rows_before = planned[-1]
                if before == session and live[: len(rows_before)] == rows_before:
                    # Planned again (on SQLite, inside the write lock) only because rows came after the ones
                    # planned from, each unchanged and in the same order: a turn stored its message and reply
                    # meanwhile. The slice planned is still the oldest, none of its messages is answered by a
                    # later row, and the new rows (later ids) stay live with the kept ones: that plan holds.
                    return write_before
            cut = live[: len(live) - keep_messages]
            slices = [m.as_slice() for m in cut]
            archive_id = "a_" + secrets.token_hex(8)
            summary = summarize(cut)
            trust = trust_of(slices)
            # The idle sweep may have extracted the slice's older messages already: the job
            # extracts only what lies after the mark (the archive still holds the whole slice).
            extracted_through = session.extracted_through or 0
            # ordering: a reply cut with its message may have a later id than a kept message; the mark
            # stays below every kept one, so nothing kept counts as extracted (one process: cut[-1].id).
            kept_from = min((m.id for m in live[len(live) - keep_messages :]), default=cut[-1].id + 1)
            through = max((m.id for m in cut if m.id < kept_from), default=extracted_through)
            write = TrimWrite(
                message_ids=[m.id for m in cut],
                archive_id=archive_id,
                created_at=self.now(),
                start_at=cut[0].said_at,
                end_at=cut[-1].said_at,
                trust=trust,
                summary=summary,
                markdown=render_archive(session, archive_id, cut, trust, summary, slices=slices),
                previous_context=(session.previous_context + "\n" + summary).strip()[-context_chars:],
                extracted_through=max(extracted_through, through),
                job_payload={
                    "session_id": session_id,
                    "archive_id": archive_id,
                    "turn_principal": principal_json(turn_principal),
                    "summary": summary,
                    "after_message_id": extracted_through,
                },
                crash_after=_crash_after,
            )
            planned.append((write, session, live))
            return write

        job_id = await self._hot.trim(session_id, plan)
        if job_id is None:
            return None
        done = planned[-1][0]  # a retry after a busy database plans again; the last plan is what was written
        return TrimResult(done.archive_id, job_id, len(done.message_ids), done.trust, done.summary)

    async def queue_trim(self, session_id: str, turn_principal: Principal) -> int:
        """Record a ``trim`` job for the session (run by the job process or ``goclaw worker``); returns its id.

        The job trims as ``trim`` does, when it runs: a session already trimmed by then
        (another job, another process) has nothing to cut and the job does nothing.

        While the session's last trim job from this store is still pending, none is added
        and its id is returned: it has not read the session yet, so it will cut what this
        one would, this turn's messages included (they are committed before this is
        called). Each turn past
        ``max_messages`` used to queue one until a worker got to the first, and the rest
        found nothing to cut: on PostgreSQL at 8 clients 0.25 trim jobs a turn for 0.03
        trims, each a claim, a session lock, its live messages read and a commit, in the
        queue ahead of the extraction jobs. A job that another process queued, or one
        already running, is not looked for: at most one more job each, as before.
        """
        payload = {"session_id": session_id, "turn_principal": principal_json(turn_principal)}
        now = self.now()
        last = self._trims_queued.get(session_id)
        if last is None:
            job_id = await self._hot.queue_job(TRIM_JOB, payload, now)
        else:
            queued = await self._hot.queue_job_unless_pending(TRIM_JOB, payload, now, last)
            if queued is None:
                return last
            job_id = queued
        self._trims_queued[session_id] = job_id
        self._trims_queued.move_to_end(session_id)
        while len(self._trims_queued) > _TRIMS_KEPT:
            self._trims_queued.popitem(last=False)
        return job_id

    async def queue_job(self, kind: str, payload: dict[str, Any]) -> int:
        """Record a pending job of ``kind``, due now, in a transaction of its own; returns its id."""
        return await self._hot.queue_job(kind, payload, self.now())

    async def archive_messages(self, archive_id: str) -> list[StoredMessage]:
        """The messages of one trimmed slice, oldest first."""
        return await self._hot.archive_messages(archive_id)

    async def get_archive(self, archive_id: str) -> Archive | None:
        """One archive."""
        async with self._sessions() as s:
            return await s.get(Archive, archive_id)

    async def list_archives(self, *, session_id: str | None = None, since: datetime | None = None) -> list[Archive]:
        """Archives, oldest first."""
        async with self._sessions() as s:
            q = select(Archive)
            if session_id:
                q = q.where(Archive.session_id == session_id)
            if since:
                q = q.where(Archive.end_at >= since)
            return list((await s.scalars(q.order_by(Archive.start_at, Archive.id))).all())

    # ---- durable jobs -------------------------------------------------------------------

    async def claim_job(
        self, worker_id: str, *, kinds: Sequence[str] = ("extract",), lease_s: float = 30
    ) -> Job | None:
        """Claim the oldest runnable job once (``FOR UPDATE SKIP LOCKED`` on PostgreSQL).

        A job whose worker died (lease expired while running) is runnable again.
        On the hot store: the worker claims one per job, and looks once more when idle.
        The job returned is a detached copy of the claimed row.
        """
        now = self.now()
        row = await self._hot.claim_job(worker_id, tuple(kinds), now, now - timedelta(seconds=lease_s))
        return None if row is None else Job(**row._asdict())

    async def finish_and_claim_job(
        self,
        job_id: int,
        worker_id: str,
        *,
        kinds: Sequence[str] = ("extract",),
        lease_s: float = 30,
        forget: bool = False,
    ) -> Job | None:
        """Mark a job done (``forget``: delete it) and claim the next runnable one, as ``claim_job``.

        Both hot stores do it with one commit (SQLite one transaction, PostgreSQL one statement).
        """
        now = self.now()
        stale_before = now - timedelta(seconds=lease_s)
        row = await self._hot.finish_and_claim(job_id, worker_id, tuple(kinds), now, stale_before, forget=forget)
        return None if row is None else Job(**row._asdict())

    async def finish_job(self, job_id: int, s: AsyncSession | None = None) -> None:
        """Mark a job done (inside the caller's transaction when given)."""
        if s is None:
            await self._hot.finish_job(job_id, self.now())
            return
        await s.execute(
            update(Job).where(Job.id == job_id).values(status="done", finished_at=self.now(), last_error=None)
        )

    async def fail_job(
        self, job_id: int, error: str, *, raw_answer: str | None = None, max_attempts: int = 5, base_delay_s: float = 5
    ) -> str:
        """Record a failure: retried with backoff, or parked as ``failed`` after ``max_attempts``."""
        async with self._sessions.begin() as s:
            job = await s.get(Job, job_id, with_for_update=True)
            if job is None:
                return "missing"
            job.last_error = error[:4000]
            if raw_answer is not None:
                job.raw_answer = raw_answer[:20000]
            if job.attempts >= max_attempts:
                job.status, job.finished_at = "failed", self.now()
            else:
                job.status = "pending"
                job.run_after = self.now() + timedelta(seconds=base_delay_s * 2 ** (job.attempts - 1))
            job.locked_by = None
            return job.status

    async def prune_done_jobs(self, finished_before: datetime, *, limit: int) -> int:
        """Delete up to ``limit`` done jobs finished before ``finished_before``, oldest first; how many went.

        Done jobs are read by nothing but the dashboard's count; kept forever, they grew
        the table by a row per trim. The oldest are found on the claim's index (status, id):
        jobs finish about in id order.
        """
        j = Job.__table__.c
        oldest = select(j.id).where(j.status == "done", j.finished_at < finished_before).order_by(j.id).limit(limit)
        async with self.engine.begin() as conn:
            return int((await conn.execute(delete(Job).where(j.id.in_(oldest)))).rowcount or 0)

    async def jobs(self, *, status: str | None = None) -> list[Job]:
        """Jobs, oldest first."""
        async with self._sessions() as s:
            q = select(Job)
            if status:
                q = q.where(Job.status == status)
            return list((await s.scalars(q.order_by(Job.id))).all())

    async def pending_jobs(self) -> int:
        """How many jobs wait (queue depth)."""
        async with self._sessions() as s:
            return int(
                await s.scalar(select(func.count()).select_from(Job).where(Job.status.in_(("pending", "running")))) or 0
            )

    def transaction(self) -> Any:
        """A write transaction on the same database (for job + writes in one commit)."""
        return self._sessions.begin()
