"""The hot store on PostgreSQL: asyncpg connections in a pool of its own, prepared statements, no pre-ping.

Each operation is one pool checkout and (for a write) one transaction; asyncpg
prepares each statement once per connection (its statement cache), so a turn
costs its statements' round trips and nothing else. The pool
(``gateway/hotstore/pgpool.py``) hands out an idle connection without
suspending and takes it back without awaiting. A connection the server dropped
raises on use, which the gateway answers 503 (``storage_reason``); the pool
drops it and opens a new one on a later checkout.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from msgspec.structs import replace

from gateway.hotstore import sql
from gateway.hotstore.base import (
    HotStore,
    JobRow,
    NewMessage,
    StoredMessage,
    TrimPlan,
    TrimSession,
    TurnMessage,
    TurnRows,
    crash_point,
    new_session_id,
)
from gateway.hotstore.pgpool import ConnectionPool
from gateway.hotstore.sql import numbered

DEFAULT_POOL_SIZE = 10

_FIND_SESSION, _NEW_SESSION, _NEW_MESSAGE = (numbered(q) for q in (sql.FIND_SESSION, sql.NEW_SESSION, sql.NEW_MESSAGE))
_OLD_MESSAGE, _ASK_REPLY, _REPLY = (numbered(q) for q in (sql.OLD_MESSAGE, sql.ASK_REPLY, sql.REPLY))
_HISTORY, _MESSAGE_BY_ID = numbered(sql.HISTORY), numbered(sql.MESSAGE_BY_ID)
_STORE, _TURN_RECORD, _USER_ROLE, _IDENTITY_ROLE = (
    numbered(q) for q in (sql.STORE, sql.TURN_RECORD, sql.USER_ROLE, sql.IDENTITY_ROLE)
)
# Trims of one session run one at a time on this lock. NO KEY: a turn storing a message in the session meanwhile
# takes the foreign key's KEY SHARE on the same row, which FOR UPDATE blocked until the trim committed (its plan,
# about a millisecond of the job process's CPU, included); the trim changes no key of the session row.
_TRIM_SESSION = numbered(sql.TRIM_SESSION) + " FOR NO KEY UPDATE"
_LIVE, _ARCHIVE, _TRIMMED_SESSION, _EXTRACT_JOB, _QUEUE_JOB = (
    numbered(q) for q in (sql.LIVE, sql.ARCHIVE, sql.TRIMMED_SESSION, sql.EXTRACT_JOB, sql.QUEUE_JOB)
)


def _claim(finish: str = "") -> str:
    """The oldest runnable job, skipping rows another worker has locked, claimed; after ``finish`` when given.

    Two parts, each walking ``ix_jobs_claim`` (status, id) in id order to the first row it can
    lock, and the older of the two (the other is unlocked at the commit, the statement's end):
    with one ``OR`` PostgreSQL read every due pending job and sorted them to take one (a queue
    of N jobs cost O(N) a claim).

    ``finish`` is a statement ending job $5 (done or deleted), run first in the same statement: one
    round trip and one commit, so one wait for the disk between two jobs, not two. It runs to its
    end though nothing reads it; the claim reads the snapshot from before it, where the finished
    job is still 'running', so it leaves that row out by id.
    """
    also = " AND id <> $5" if finish else ""
    part = "SELECT id FROM jobs WHERE status = '{}' AND kind = ANY($3::varchar[])" + also
    lock = " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
    return (
        "WITH "
        + (f"done AS ({finish}), " if finish else "")
        + "due AS ("
        + part.format("pending")
        + " AND run_after <= $2"
        + lock
        + ", lapsed AS ("
        + part.format("running")
        + " AND locked_at < $4"
        + lock
        + " UPDATE jobs SET status = 'running', locked_by = $1, locked_at = $2, attempts = attempts + 1"
        " WHERE id = (SELECT min(id) FROM (SELECT id FROM due UNION ALL SELECT id FROM lapsed) AS runnable)"
        " RETURNING " + sql.JOB_COLUMNS
    )


_CLAIM_JOB = _claim()
_FINISH_JOB, _FORGET_JOB = numbered(sql.FINISH_JOB), numbered(sql.FORGET_JOB)
_FINISH_AND_CLAIM = _claim("UPDATE jobs SET status = 'done', finished_at = $2, last_error = NULL WHERE id = $5")
_FORGET_AND_CLAIM = _claim("DELETE FROM jobs WHERE id = $5")
_ARCHIVE_MESSAGES = numbered(sql.ARCHIVE_MESSAGES)
# A turn's common case in one statement (it commits on its own): the session exists and the message is
# new. The new row comes back from the insert; the rest of the history is the session's untrimmed rows
# in the statement's snapshot, all older than it. Anything else (a new session, a message stored before)
# returns no row and goes through the transaction below.
#
# One wait for the disk a turn: a message asked for an answer is committed with synchronous_commit off for that
# one transaction, so a turn waits for the disk once (its reply), not twice. Nothing is acknowledged on
# the strength of that commit: the reply is sent only after its own commit, which waits for the disk and,
# WAL being written in order, makes the earlier message durable with it; a failed turn's lease is cleared
# by a commit that waits too; a memory write from a tool commits durably before the model sees its
# result. The message is in PostgreSQL (visible to every process) as soon as the statement returns, so a
# gateway that dies mid-turn loses nothing; only a crash of PostgreSQL itself, within its WAL writer's
# delay (200 ms by default) and before any of those commits, could lose it, and then no reply was ever
# sent for it. A message stored without asking for an answer waits for the disk on its own commit.
_MESSAGE_COLUMNS = sql.MESSAGE_SELECT.removeprefix("SELECT ").removesuffix(" FROM messages")
#
# With $14 (``role_from_users``) the message is stored with the speaker's role as the users table holds it
# in this statement's snapshot, and not at all if they have no row (the transaction below says so).
_FIND_STORE_AND_READ = (
    "WITH s AS (SELECT id, previous_context FROM sessions WHERE channel = $1 AND conversation_id = $2"
    " AND thread_id = $3), u AS (SELECT role FROM users WHERE id = $5 AND $14::boolean),"
    " m AS (INSERT INTO messages (session_id, platform_message_id, speaker_user_id,"
    " stored_role, display_name, text, said_at, is_agent, created_at, reply_requested, answering_until)"
    " SELECT s.id, $4::varchar, $5::varchar, CASE WHEN $14::boolean THEN u.role ELSE $6::varchar END,"
    " $7::varchar, $8::text, $9::timestamptz, FALSE, $10::timestamptz, $11::boolean, $12::timestamptz"
    " FROM s LEFT JOIN u ON TRUE WHERE (NOT $14::boolean OR u.role IS NOT NULL)"
    # The commit waits for the disk only for a store-only message (one wait a turn, above); CASE
    # evaluates set_config only when the message is asked for an answer.
    " AND CASE WHEN $11::boolean THEN set_config('synchronous_commit', 'off', true) = 'off' ELSE TRUE END"
    " ON CONFLICT (session_id, is_agent, platform_message_id) DO NOTHING RETURNING " + _MESSAGE_COLUMNS + ")"
    # The session's previous context (up to ``context_chars``, 4,000 by default) comes once, with the new row:
    # on every history row it was most of the bytes sent, and each copy decoded again into a string of its own.
    " SELECT s.previous_context, m.* FROM s, m"
    " UNION ALL SELECT NULL, h.* FROM s, LATERAL (SELECT " + _MESSAGE_COLUMNS + " FROM messages"
    " WHERE session_id = s.id AND archive_id IS NULL ORDER BY id DESC LIMIT $13) h WHERE EXISTS (SELECT 1 FROM m)"
)
# A reply and its turn record in one statement: the record only if the reply was new.
_STORE_WITH_RECORD = (
    "WITH m AS (" + numbered(sql.STORE) + "), t AS (INSERT INTO turn_records (session_id, message_id,"
    " reply_message_id, at, speaker_user_id, stored_role, memory, sections, model_calls)"
    " SELECT $1::varchar, $11::varchar, $2::varchar, $12::timestamptz, $13::varchar, $14::varchar, $15::json,"
    " $16::json, $17::json FROM m RETURNING id) SELECT m.id, (SELECT id FROM t) FROM m"
)
_MARK = "UPDATE messages SET archive_id = $1 WHERE id = ANY($2::integer[])"
# ``sql.QUEUE_JOB_UNLESS_PENDING`` with its parameters typed (an INSERT ... SELECT list does not take the columns').
_QUEUE_JOB_UNLESS_PENDING = (
    "INSERT INTO jobs (kind, payload, status, attempts, run_after, created_at)"
    " SELECT $1::varchar, $2::json, 'pending', 0, $3::timestamptz, $4::timestamptz"
    " WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = $5 AND status = 'pending' AND kind = $1"
    " AND payload->>'session_id' = $6) RETURNING id"
)


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the database; use datetime.now(UTC)")
    return value


def _write_args(args: Sequence[Any]) -> list[Any]:
    """The memory write path's parameters as SQLAlchemy's asyncpg dialect binds them: a JSON value as its text."""
    return [json.dumps(a) if isinstance(a, list | dict) else a for a in args]


def _message_values(m: TurnMessage) -> tuple[Any, ...]:
    """The inbound message's values after its session id, in ``sql.NEW_MESSAGE``'s order."""
    until = None if m.answering_until is None else _aware(m.answering_until)
    return (
        m.platform_message_id,
        m.speaker_user_id,
        m.stored_role,
        m.display_name,
        m.text,
        _aware(m.said_at),
        _aware(m.now),
        m.reply_requested,
        until,
    )


async def _init_connection(conn: Any) -> None:
    # JSON columns (sa.JSON) in and out as Python values, as SQLAlchemy's dialect does.
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class PostgresHotStore(HotStore):
    """The hot path on an asyncpg pool (created on first use, closed by ``close``)."""

    remote = True

    def __init__(self, dsn: str, *, max_size: int = DEFAULT_POOL_SIZE) -> None:
        self.dsn = dsn
        self.max_size = max_size
        self._pool: ConnectionPool | None = None
        self._pid = 0
        self._opening: asyncio.Lock | None = None

    async def _get_pool(self) -> ConnectionPool:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None or self._pid != os.getpid():
                # Nothing is reset between checkouts: these statements leave no session state (SET,
                # LISTEN, cursors), and a connection that ended a checkout in any doubt is dropped.
                self._pool = ConnectionPool(self.dsn, max_size=self.max_size, init=_init_connection)
                self._pid = os.getpid()
            return self._pool

    async def close(self) -> None:
        """Close the pool (the next use opens a new one)."""
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            await pool.close()  # cancelled halfway, it drops the rest of its connections itself

    def terminate(self) -> None:
        """Drop the pool's connections at once (when awaiting is impossible)."""
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.terminate()

    async def user_role(self, user_id: str) -> tuple[str, str] | None:
        """(role, display name) of a unified user, or None."""
        pool = await self._get_pool()
        row = await pool.fetchrow(_USER_ROLE, user_id)
        return (row[0], row[1]) if row else None

    async def identity_role(self, channel: str, platform_user_id: str) -> tuple[str, str, str] | None:
        """(user id, role, display name) behind a platform identity, or None."""
        pool = await self._get_pool()
        row = await pool.fetchrow(_IDENTITY_ROLE, channel, platform_user_id)
        return (row[0], row[1], row[2]) if row else None

    async def begin_turn(self, m: TurnMessage) -> TurnRows:
        """Find or create the session, store the message once, read the history.

        The common case (the session exists, the message is new) is one statement, one
        round trip and one commit: the session found, the message stored, and the history
        read as it stood when the message was stored. Otherwise (a new session, a message
        stored before), one transaction.
        """
        pool = await self._get_pool()
        key = (m.channel, m.conversation_id, m.thread_id)
        async with pool.acquire() as conn:
            found = await conn.fetch(
                _FIND_STORE_AND_READ, *key, *_message_values(m), max(m.history_limit - 1, 0), m.role_from_users
            )
            if found:
                # Newest first: the new row, then the older ones (each row: previous_context, then the columns;
                # previous_context on the new row only).
                rows = sorted((StoredMessage(*r[1:]) for r in found), key=lambda r: r.id, reverse=True)
                new = rows[0]
                previous = next(r[0] for r in found if r[1] == new.id)
                return TurnRows(new.session_id, previous, new.id, rows[: m.history_limit], speaker_role=new.stored_role)
            return await self._begin_turn(conn, m, key)

    @staticmethod
    async def _begin_turn(conn: Any, m: TurnMessage, key: tuple[str, str, str]) -> TurnRows:
        """``begin_turn`` in one transaction: a new session, or a message stored before."""
        async with conn.transaction():
            if m.role_from_users:
                # The role the turn runs with, read in the transaction that stores its message.
                role = await conn.fetchval(_USER_ROLE, m.speaker_user_id)  # (role, display name): the role
                if role is None:
                    return TurnRows("", "", None, [], speaker_gone=True)
                m = replace(m, stored_role=role)
            row = await conn.fetchrow(_FIND_SESSION, *key)
            if row is None:
                now = _aware(m.now)
                await conn.execute(_NEW_SESSION, new_session_id(), *key, m.parent_conversation_id, now, now)
                row = await conn.fetchrow(_FIND_SESSION, *key)
            session_id, previous = row[0], row[1]
            new_id = await conn.fetchval(_NEW_MESSAGE, session_id, *_message_values(m))
            resumed = False
            if new_id is None:
                old = await conn.fetchrow(_OLD_MESSAGE, session_id, m.platform_message_id)
                reply = await conn.fetchval(_REPLY, old[0])
                if reply is not None or not m.reply_requested:
                    return TurnRows(session_id, previous, None, [], reply=reply, speaker_role=m.stored_role)
                if not old[1]:
                    await conn.execute(_ASK_REPLY, old[0])
                new_id, resumed = old[0], True
            rows = [StoredMessage(*r) for r in await conn.fetch(_HISTORY, session_id, new_id, m.history_limit)]
            if resumed and (not rows or rows[0].id != new_id):
                # Already trimmed into an archive: answer it with what is still live.
                rows.insert(0, StoredMessage(*await conn.fetchrow(_MESSAGE_BY_ID, new_id)))
        return TurnRows(session_id, previous, new_id, rows, resumed=resumed, speaker_role=m.stored_role)

    async def store_message(self, m: NewMessage) -> tuple[int, int | None] | None:
        """Insert a message and its turn record in one statement (one commit); None if it was stored before."""
        pool = await self._get_pool()
        stored = (
            m.session_id,
            m.platform_message_id,
            m.speaker_user_id,
            m.stored_role,
            m.display_name,
            m.text,
            _aware(m.said_at),
            m.is_agent,
            _aware(m.created_at),
            m.reply_to,
        )
        if (r := m.record) is None:
            new_id = await pool.fetchval(_STORE, *stored)
            return None if new_id is None else (new_id, None)
        row = await pool.fetchrow(
            _STORE_WITH_RECORD,
            *stored,
            r.message_id,
            _aware(m.said_at),
            r.speaker_user_id,
            r.stored_role,
            r.memory,
            r.sections,
            r.model_calls,
        )
        return None if row is None else (row[0], row[1])

    async def stored_reply(self, message_row_id: int) -> str | None:
        """The reply stored for a message row, if any."""
        pool = await self._get_pool()
        return await pool.fetchval(_REPLY, message_row_id)

    async def trim(self, session_id: str, plan: TrimPlan) -> int | None:
        """One trim in one transaction (the session row locked ``FOR NO KEY UPDATE``: turns go on storing meanwhile)."""
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_TRIM_SESSION, session_id)
            if row is None:
                return None
            live = [StoredMessage(*r) for r in await conn.fetch(_LIVE, session_id)]
            w = plan(TrimSession(*row), live)
            if w is None:
                return None
            await conn.execute(_MARK, w.archive_id, w.message_ids)
            crash_point(w, "mark")
            await conn.execute(
                _ARCHIVE,
                w.archive_id,
                session_id,
                _aware(w.created_at),
                _aware(w.start_at),
                _aware(w.end_at),
                w.trust,
                len(w.message_ids),
                w.summary,
                w.markdown,
            )
            crash_point(w, "archive")
            await conn.execute(
                _TRIMMED_SESSION,
                w.previous_context,
                w.extracted_through,
                session_id,
            )
            created = _aware(w.created_at)
            job_id = await conn.fetchval(_EXTRACT_JOB, w.job_payload, created, created)
            crash_point(w, "job")
        return int(job_id)

    async def claim_job(
        self, worker_id: str, kinds: Sequence[str], now: datetime, stale_before: datetime
    ) -> JobRow | None:
        """Claim the oldest runnable job in one statement (``FOR UPDATE SKIP LOCKED``)."""
        pool = await self._get_pool()
        row = await pool.fetchrow(_CLAIM_JOB, worker_id, _aware(now), list(kinds), _aware(stale_before))
        return None if row is None else JobRow(*row)

    async def finish_and_claim(
        self,
        job_id: int,
        worker_id: str,
        kinds: Sequence[str],
        now: datetime,
        stale_before: datetime,
        *,
        forget: bool = False,
    ) -> JobRow | None:
        """Mark a job done (``forget``: delete it) and claim the next runnable one in one statement.

        With nothing runnable it commits the finish alone.
        """
        pool = await self._get_pool()
        at, stale = _aware(now), _aware(stale_before)
        row = await pool.fetchrow(
            _FORGET_AND_CLAIM if forget else _FINISH_AND_CLAIM, worker_id, at, list(kinds), stale, job_id
        )
        return None if row is None else JobRow(*row)

    async def queue_job(self, kind: str, payload: dict[str, Any], now: datetime) -> int:
        """Record a pending job of ``kind``, due at ``now`` (one statement, its own commit); returns its id."""
        pool = await self._get_pool()
        at = _aware(now)
        return int(await pool.fetchval(_QUEUE_JOB, kind, payload, at, at))

    async def queue_job_unless_pending(
        self, kind: str, payload: dict[str, Any], now: datetime, pending_id: int
    ) -> int | None:
        """``queue_job``, unless job ``pending_id`` is still pending (then None, nothing written)."""
        pool = await self._get_pool()
        at = _aware(now)
        session = str(payload["session_id"])
        job_id = await pool.fetchval(_QUEUE_JOB_UNLESS_PENDING, kind, payload, at, at, pending_id, session)
        return None if job_id is None else int(job_id)

    async def finish_job(self, job_id: int, now: datetime, *, forget: bool = False) -> None:
        """Mark a job done (``forget``: delete it)."""
        pool = await self._get_pool()
        await (pool.execute(_FORGET_JOB, job_id) if forget else pool.execute(_FINISH_JOB, _aware(now), job_id))

    async def archive_messages(self, archive_id: str) -> list[StoredMessage]:
        """The messages of one trimmed slice, oldest first."""
        pool = await self._get_pool()
        return [StoredMessage(*r) for r in await pool.fetch(_ARCHIVE_MESSAGES, archive_id, archive_id)]

    async def run_on(
        self, driver: Any, sql: str, args: Sequence[Any], kinds: Sequence[str | None] | None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """``sql`` on ``driver``, a SQLAlchemy session's own asyncpg connection, inside that session's transaction.

        The memory store's write path runs its statements here (``memory.store.RawWrites``); the store
        has SQLAlchemy begin the transaction before the first one (``MemoryStore._driver``), so each
        commits or rolls back with the rest. Rows come decoded by the connection's own codecs (the
        ones SQLAlchemy's dialect set on it: JSON as Python values, times as aware datetimes), so
        ``kinds`` only says whether rows are read; the row count is the command tag's.
        """
        params = _write_args(args)
        if kinds is None:
            status = await driver.execute(sql, *params)
            tail = status.rsplit(" ", 1)[-1]
            return [], int(tail) if tail.isdigit() else -1
        rows = await driver.fetch(sql, *params)
        return [tuple(r) for r in rows], len(rows)

    async def run_many_on(self, driver: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """``sql`` once per row of ``rows`` on ``driver`` (in its transaction), in one round trip (``executemany``)."""
        await driver.executemany(sql, [_write_args(r) for r in rows])

    async def select(self, sql: str, args: Sequence[Any], kinds: Sequence[str | None]) -> list[tuple[Any, ...]]:
        """One read statement (``$n`` parameters; asyncpg decodes every column itself)."""
        pool = await self._get_pool()
        return [tuple(r) for r in await pool.fetch(sql, *args)]
