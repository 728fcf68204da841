"""The hot store on SQLite: the standard ``sqlite3`` module, called inline on the event loop.

One connection per process (WAL, ``synchronous=NORMAL``, foreign keys on); a
write is ``BEGIN IMMEDIATE`` ... ``COMMIT`` with no ``await`` inside, so it is
never left open across a suspension. A commit in WAL costs less than one hand-off
to a driver thread.

The cold paths (SQLAlchemy with aiosqlite, in its own thread) may hold a write
transaction open across an ``await``. If this thread waited for it inside
SQLite's busy handler, that transaction could never finish: the loop that must
run it would be the one blocked. So this connection's ``busy_timeout`` is 0, and
on SQLITE_BUSY/LOCKED the transaction is rolled back and retried: a write polls
the lock inline for up to 2 ms first (the job process's transactions are
shorter), then awaits its release (1 ms, doubling to 50 ms, or when a release
is reported), for up to ``busy_timeout_s``; then the error is raised ("database
is locked"), which the gateway answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TypeVar

from gateway.hotstore import sql
from gateway.hotstore.base import (
    BOOL,
    DATETIME,
    JSON_VALUE,
    HotStore,
    JobRow,
    NewMessage,
    StoredMessage,
    TrimPlan,
    TrimSession,
    TrimWrite,
    TurnMessage,
    TurnRows,
    crash_point,
    json_text,
    new_session_id,
)
from gateway.kept import Kept

T = TypeVar("T")

_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_FIRST_WAIT_S = 0.001
_MAX_WAIT_S = 0.05
POLL_S = 0.002
"""How long a write that finds the lock held polls it inline first (``SQLiteHotStore._run``)."""
POLL_STEP_S = 0.00005
_pause = time.sleep  # between two polls (a test steps it)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class WriteLockReleases:
    """When this process's other SQLite connections end a write transaction, for waiters on any loop.

    The background thread's connection (``gateway/sqlite_inline.py``) reports each
    commit and rollback here. A turn whose ``BEGIN IMMEDIATE`` found the database
    busy then retries as soon as that transaction ends, instead of after its
    backoff (1 ms doubling to 50 ms), which kept a turn that met an extraction
    job's transaction waiting 7-67 ms. A writer in another process reports
    nothing; the backoff still bounds the wait for it.
    """

    def __init__(self) -> None:
        self.generation = 0
        # In the job process (gateway/jobproc.py): tells the serving process, whose turns may be waiting.
        self.on_release: Callable[[], None] | None = None
        # What this process's hot-store writes waited for the lock (``/metrics``): writes that found it
        # held, the busy tries they made (2 ms of inline polls are one; more: it waited for a release,
        # and lost the lock again after it), and the seconds from each one's first busy try to its end.
        self.waits = self.busy_tries = 0
        self.wait_seconds = 0.0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._lock = threading.Lock()

    def released(self) -> None:
        """A write transaction ended (called on any thread)."""
        if self.on_release is not None:
            self.on_release()
        with self._lock:
            self.generation += 1
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                loop.call_soon_threadsafe(_wake, fut)

    def waited(self, tries: int, seconds: float) -> None:
        """A write found the lock held: ``tries`` busy tries, ``seconds`` from the first to its end (any thread)."""
        with self._lock:
            self.waits += 1
            self.busy_tries += tries
            self.wait_seconds += seconds

    async def wait(self, generation: int, timeout: float) -> None:
        """Until a release after ``generation`` (at once if one happened already), or ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (loop, fut)
        with self._lock:
            if self.generation != generation:
                return
            self._waiters.add(entry)
        timer = loop.call_later(timeout, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            with self._lock:
                self._waiters.discard(entry)


RELEASES = WriteLockReleases()
"""This process's write-lock releases (one per process: every SQLite database in it shares it)."""

CHECKPOINT_BUSY_TIMEOUT_MS = 50
"""How long a restarting checkpoint waits for the write lock and for readers (``checkpoint_wal``).

While it waits for readers it holds the write lock, so this bounds the pause it can put on the turns."""


def checkpoint_connection(path: str) -> sqlite3.Connection:
    """A connection of its own for ``checkpoint_wal`` (any thread may use it, one at a time)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    conn.execute(f"PRAGMA busy_timeout={CHECKPOINT_BUSY_TIMEOUT_MS}")
    return conn


def checkpoint_wal(conn: sqlite3.Connection, limit_bytes: int) -> str:
    """Copy the WAL into the database file; past ``limit_bytes`` of frames, also start it again.

    Returns ``"copied"`` (under the limit: nothing waited), ``"restarted"`` (the next write
    starts the WAL from its beginning) or ``"busy"`` (a reader kept it; the next call tries
    again); either of the last two held the write lock for a while. A ``PASSIVE``
    checkpoint copies what it can without waiting, but it never starts the WAL again
    from its beginning: SQLite does that at the start of a write, and only if every frame
    had been copied when that write's snapshot began. The serving process commits a turn
    every millisecond or two under load, and a checkpoint from another process is never
    finished between two of them: under a real model's load (``bench/model_load.py``) the
    WAL grew by 7 MB a second and never shrank (156 MB after 20 s).

    Past the limit a ``RESTART`` checkpoint takes SQLite's write lock (new writes wait,
    readers do not) to copy the frames the ``PASSIVE`` pass left and sync the database
    file. That sync is what held the lock longest: a ``PASSIVE`` pass that is overtaken
    by new frames leaves the pages it copied unsynced, so the ``RESTART`` flushed every
    one of them to the disk (a 16 MB WAL's worth) while the turns' writes waited: 5.8 ms
    (median) and up to 24 ms at 8 clients (``bench/turn_overhead.py``). So before it, with
    no lock held, the database file is flushed (``_flush_database``), a second ``PASSIVE``
    pass copies the frames written meanwhile and the file is flushed again: the
    ``RESTART`` is left a few frames to copy and sync, 1.8 ms (median) and up to 2.7 ms
    under the same load. Nothing about what is durable changes (the ``RESTART`` still
    syncs the WAL and the file itself). The next write then starts from the WAL's
    beginning, and its commit cuts the file to ``journal_size_limit``
    (``gateway.db.make_engine``). While a reader is still on the WAL it waits at most
    ``CHECKPOINT_BUSY_TIMEOUT_MS`` holding the lock; if the reader is not done by then
    nothing starts again.
    """
    _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    (page,) = conn.execute("PRAGMA page_size").fetchone()
    if frames * (page + 24) <= limit_bytes:  # a frame is a page and its 24-byte header
        return "copied"
    if _flush_database(conn):
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        _flush_database(conn)
    return _restart(conn)


def _restart(conn: sqlite3.Connection) -> str:
    """The ``RESTART`` checkpoint itself: the part that holds the write lock (a function of its own to time it)."""
    busy, _frames, _copied = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
    return "busy" if busy else "restarted"


_DATABASE_FILES: dict[str, int] = {}
"""A read-only descriptor of each database file ``_flush_database`` flushed, kept until the process ends.

Never closed: closing any descriptor of a file drops every POSIX lock this process
holds on it, SQLite's included (its other connections here would lose theirs).
"""
_DATABASE_FILES_LOCK = threading.Lock()


def _flush_database(conn: sqlite3.Connection) -> bool:
    """Flush the database file of ``conn`` to the disk (``fdatasync``) without taking any SQLite lock.

    Only an earlier start: whatever is not flushed here, SQLite's own checkpoint syncs.
    False when the file cannot be flushed this way (an in-memory database, a platform
    without it, an error): the checkpoint then goes on as SQLite alone does it.
    """
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    if not path:
        return False
    try:
        with _DATABASE_FILES_LOCK:
            fd = _DATABASE_FILES.get(path)
            if fd is None or os.fstat(fd).st_ino != os.stat(path).st_ino:  # a new file at the path: flush that one
                fd = _DATABASE_FILES[path] = os.open(path, os.O_RDONLY)  # (the old descriptor stays open, as above)
        getattr(os, "fdatasync", os.fsync)(fd)
    except OSError:
        return False
    return True


def encode_time(value: datetime) -> str:
    """A datetime as SQLAlchemy's SQLite dialect stores a ``UTCDateTime``: naive UTC text, microseconds."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the database; use datetime.now(UTC)")
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # An aware UTC time's text ends in "+00:00": cut it, rather than make a naive copy first
    # (``replace(tzinfo=None)`` parses keyword arguments: it was 2% of a turn, called ~9 times).
    return value.isoformat(" ", "microseconds")[:-6]


@lru_cache(maxsize=16_384)
def decode_time(value: str | None) -> datetime | None:
    """The inverse of ``encode_time`` (timezone-aware UTC).

    Kept for the values seen lately: a session's history is read again every turn,
    and a stored time never changes.
    """
    return None if value is None else datetime.fromisoformat(value).replace(tzinfo=UTC)


_DECODERS: dict[str, Callable[[Any], Any]] = {DATETIME: decode_time, JSON_VALUE: json.loads, BOOL: bool}


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # an older sqlite3 module: the message is all there is
        return "locked" in str(exc) or "busy" in str(exc)
    return (code & 0xFF) in _BUSY_CODES


def _message_row(r: tuple[Any, ...]) -> StoredMessage:
    # id, session_id, platform_message_id, speaker_user_id, stored_role, display_name, text, said_at, is_agent,
    # reply_to_id, answering_until
    return StoredMessage(*r[:7], decode_time(r[7]), bool(r[8]), r[9], decode_time(r[10]))  # type: ignore[call-arg]


def _runnable_job(kinds: Sequence[str], at: str, stale_before: datetime) -> tuple[str, tuple[Any, ...]]:
    """The look for the oldest runnable job of ``kinds`` (``sql.next_job``) with its parameters."""
    return sql.next_job(len(kinds)), (*kinds, at, *kinds, encode_time(stale_before))


def _take_job(
    conn: sqlite3.Connection, worker_id: str, at: str, job_id: int, status: str, attempts: int
) -> JobRow | None:
    """Claim a job found runnable, compare-and-set on its status and attempts (None: taken meanwhile)."""
    row = conn.execute(sql.CLAIM_JOB, (worker_id, at, job_id, status, attempts)).fetchone()
    return None if row is None else _job_row(row)


def _job_row(r: tuple[Any, ...]) -> JobRow:
    # sql.JOB_COLUMNS: id, kind, payload, status, attempts, run_after, locked_by, locked_at, last_error,
    # raw_answer, created_at, finished_at
    run_after, created_at = decode_time(r[5]), decode_time(r[10])
    assert run_after is not None and created_at is not None  # NOT NULL columns
    return JobRow(
        r[0], r[1], json.loads(r[2]), r[3], r[4], run_after, r[6], decode_time(r[7]), r[8], r[9],
        created_at, decode_time(r[11]),
    )  # fmt: skip


STATEMENT_CACHE = 128
"""Prepared statements the connection keeps (``sqlite3``'s LRU, keyed by the SQL text).

What this connection can run: ``sql``'s 22 statements, the prompt's candidates in 50
shapes (with and without a speaker, by word count up to ``MAX_QUERY_TERMS`` 24, and
without words) and its record reads in 4 sizes: about 80. At the module's default
of 64, varied conversations pushed statements out, and preparing the candidates
statement again costs 157 µs against 36 µs to run it prepared (100,000 records).
"""


class SQLiteHotStore(HotStore):
    """The hot path on one inline ``sqlite3`` connection."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_s: float = 30.0,
        on_connect: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._on_connect = on_connect
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        # A session's history is read again every turn: its rows decoded once (gateway/kept.py).
        self._decoded: Kept[str, StoredMessage] = Kept()
        self._waiting = 0  # writes waiting for a release of the write lock (``_run``)

    def _connection(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is not None and self._pid == os.getpid():
            return conn
        # isolation_level=None: no implicit BEGIN; every transaction here is explicit.
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, cached_statements=STATEMENT_CACHE
        )
        try:
            if self._on_connect is not None:
                self._on_connect(conn)  # the engine's own connect hooks (pragmas, faults a test injects)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=0")  # never wait inside SQLite on the loop thread (see module doc)
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    async def close(self) -> None:
        """Close the connection (the next use opens a new one)."""
        self.close_now()

    def close_now(self) -> None:
        """Close the connection without awaiting (engine disposal calls this)."""
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            conn.close()

    async def _run(self, body: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """``body`` in one transaction (``BEGIN IMMEDIATE`` for a write), retried while the database is busy.

        A write that finds the lock held polls it inline first, every ``POLL_STEP_S`` for up to
        ``POLL_S``, the loop held meanwhile, unless another write of this store already waits
        for a release (then the lock is held long, and it waits with it). The holder is
        nearly always the job process, whose write transactions take 0.1-0.6 ms: waiting for
        its release through the loop put the turn behind every callback queued by then (at 8
        clients the other turns, each about a millisecond without a suspension), 5-6 ms a
        waiting write, and the turns' p99 was 24-30 ms against 17 with no jobs running.
        Past ``POLL_S`` it lets the loop run and tries again when the lock is released.
        """
        wait = _FIRST_WAIT_S
        busy, first_busy, poll_until = 0, 0.0, 0.0
        try:
            while True:
                released = RELEASES.generation  # read before trying: a release after it is never missed
                conn = self._connection()
                try:
                    if not write:
                        return body(conn)
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        result = body(conn)
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                    finally:
                        if RELEASES.on_release is not None:
                            RELEASES.released()  # the job process's claims and finishes: its parent's turns may wait
                    return result
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise
                    now = time.monotonic()
                    if now >= poll_until:  # a busy try of its own (the inline polls are one)
                        busy += 1
                        if busy == 1:
                            first_busy = now
                            if write and not self._waiting:
                                poll_until = now + POLL_S
                        if now >= first_busy + self.busy_timeout_s:
                            raise
                    if now < poll_until:
                        _pause(POLL_STEP_S)
                        continue
                # Another connection (the background thread's, a cold path's, another process's) holds the
                # write lock: let the loop run, and try again when it is released or after the backoff.
                self._waiting += 1
                try:
                    await RELEASES.wait(released, wait)
                finally:
                    self._waiting -= 1
                wait = min(wait * 2, _MAX_WAIT_S)
        finally:
            if busy:
                RELEASES.waited(busy, time.monotonic() - first_busy)

    # ---- principals ----------------------------------------------------------------------

    async def user_role(self, user_id: str) -> tuple[str, str] | None:
        """(role, display name) of a unified user, or None."""

        def body(conn: sqlite3.Connection) -> tuple[str, str] | None:
            return conn.execute(sql.USER_ROLE, (user_id,)).fetchone()

        return await self._run(body, write=False)

    async def identity_role(self, channel: str, platform_user_id: str) -> tuple[str, str, str] | None:
        """(user id, role, display name) behind a platform identity, or None."""

        def body(conn: sqlite3.Connection) -> tuple[str, str, str] | None:
            return conn.execute(sql.IDENTITY_ROLE, (channel, platform_user_id)).fetchone()

        return await self._run(body, write=False)

    # ---- turns ---------------------------------------------------------------------------

    async def begin_turn(self, m: TurnMessage) -> TurnRows:
        """Find or create the session, store the message once, read the history: one transaction."""
        return await self._inserting(lambda conn, inserted: _begin_turn(conn, m, self._decoded, inserted))

    async def store_message(self, m: NewMessage) -> tuple[int, int | None] | None:
        """Insert a message and its turn record in one transaction; None if it was stored before."""
        return await self._inserting(lambda conn, inserted: _store_message(conn, m, self._decoded, inserted))

    async def _inserting(self, body: Callable[[sqlite3.Connection, list[int]], T]) -> T:
        """A write whose inserted rows are kept (``_keep_inserted``), and forgotten if it does not commit.

        A transaction that does not commit leaves its rowids to be given again.
        """
        inserted: list[int] = []
        try:
            return await self._run(lambda conn: body(conn, inserted), write=True)
        except BaseException:
            for row_id in inserted:
                self._decoded.drop(row_id)
            raise

    async def stored_reply(self, message_row_id: int) -> str | None:
        """The reply stored for a message row, if any."""

        def body(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(sql.REPLY, (message_row_id,)).fetchone()
            return row[0] if row else None

        return await self._run(body, write=False)

    async def trim(self, session_id: str, plan: TrimPlan) -> int | None:
        """One trim, written in one ``BEGIN IMMEDIATE`` transaction, planned before it.

        The plan (the slice's summary, trust and archive markdown) is most of a trim's
        CPU, about a millisecond; made inside the write transaction it held SQLite's one
        write lock that long, and longer when the job process (nice +10) was preempted
        meanwhile: every turn's write waited (a busy-wait per turn and a half, under 8
        clients, measured). So it is planned from a read of the session and its live
        rows, and the write transaction reads their keys again: unchanged (no message
        stored or answered meanwhile, the session row as read), it writes that plan;
        changed, it plans again inside, as a single transaction always did (``SessionStore.trim``'s
        plan keeps the first when only rows after those it was made from came meanwhile).
        """
        decoded = self._decoded
        read = await self._run(lambda conn: _trim_read(conn, session_id, decoded), write=False)
        if read is None:
            return None
        session, keys, live = read
        planned = plan(session, live)
        if planned is None:
            return None

        def write(conn: sqlite3.Connection) -> int | None:
            now_session, now_keys = _trim_state(conn, session_id)
            if (now_session, now_keys) == (session, keys):
                return _trim_write(conn, session_id, planned)
            if now_session is None:
                return None
            # Changed since the read: plan again from the rows as they are now, inside this transaction.
            rows = _kept_rows(conn, now_keys, lambda: conn.execute(sql.KEYED_LIVE, (session_id,)).fetchall(), decoded)
            again = plan(now_session, rows)
            return None if again is None else _trim_write(conn, session_id, again)

        return await self._run(write, write=True)

    # ---- the job queue ---------------------------------------------------------------------

    async def claim_job(
        self, worker_id: str, kinds: Sequence[str], now: datetime, stale_before: datetime
    ) -> JobRow | None:
        """Find the oldest runnable job outside a transaction, then claim it compare-and-set.

        An idle worker's look finds nothing and takes no write lock; a job another
        worker claimed in between is not claimed twice (the update matches no row).
        """
        at = encode_time(now)
        find = _runnable_job(kinds, at, stale_before)

        def look(conn: sqlite3.Connection) -> tuple[int, str, int] | None:
            return conn.execute(*find).fetchone()

        while (found := await self._run(look, write=False)) is not None:
            claimed = await self._run(lambda conn: _take_job(conn, worker_id, at, *found), write=True)
            if claimed is not None:
                return claimed
        return None

    async def queue_job(self, kind: str, payload: dict[str, Any], now: datetime) -> int:
        """Record a pending job of ``kind``, due at ``now``; returns its id."""
        at, text = encode_time(now), json.dumps(payload)

        def body(conn: sqlite3.Connection) -> int:
            return int(conn.execute(sql.QUEUE_JOB, (kind, text, at, at)).fetchone()[0])

        return await self._run(body, write=True)

    async def queue_job_unless_pending(
        self, kind: str, payload: dict[str, Any], now: datetime, pending_id: int
    ) -> int | None:
        """``queue_job``, unless job ``pending_id`` is still pending (then None, nothing written).

        Looked at first without the write lock: the job is nearly always still pending (each
        turn past ``session.max_messages`` asks until the job process claims it: about half
        the turns of ``bench/turn_overhead.py``), and the look costs one read where the write
        transaction cost ``BEGIN IMMEDIATE``, the statement and ``COMMIT``, and waited for the
        job process's writes. A job pending at the look has not read the session, which holds
        this turn's messages already (committed before this is called), so skipping is what
        the insert's own check would do. Not pending: the insert checks again in its snapshot.
        """
        pending = (pending_id, kind, str(payload["session_id"]))
        if await self._run(lambda conn: conn.execute(sql.PENDING_JOB, pending).fetchone(), write=False):
            return None
        at, text = encode_time(now), json.dumps(payload)

        def body(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(sql.QUEUE_JOB_UNLESS_PENDING, (kind, text, at, at, *pending)).fetchone()
            return None if row is None else int(row[0])

        return await self._run(body, write=True)

    async def finish_job(self, job_id: int, now: datetime, *, forget: bool = False) -> None:
        """Mark a job done (``forget``: delete it)."""
        done = _finish_job(job_id, encode_time(now), forget)
        await self._run(lambda conn: conn.execute(*done), write=True)

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
        """Mark a job done (``forget``: delete it) and claim the next runnable one in the same write transaction.

        A job process working through a queue took the write lock twice between jobs
        (the finish, then the claim), and a turn that met either waited for the
        release: once instead. With nothing runnable it commits the finish alone.
        """
        at = encode_time(now)
        find = _runnable_job(kinds, at, stale_before)
        done = _finish_job(job_id, at, forget)

        def body(conn: sqlite3.Connection) -> JobRow | None:
            conn.execute(*done)
            found = conn.execute(*find).fetchone()
            return None if found is None else _take_job(conn, worker_id, at, *found)

        return await self._run(body, write=True)

    async def archive_messages(self, archive_id: str) -> list[StoredMessage]:
        """The messages of one trimmed slice, oldest first."""

        def body(conn: sqlite3.Connection) -> list[StoredMessage]:
            return [_message_row(r) for r in conn.execute(sql.ARCHIVE_MESSAGES, (archive_id, archive_id)).fetchall()]

        return await self._run(body, write=False)

    async def run_on(
        self, driver: Any, sql: str, args: Sequence[Any], kinds: Sequence[str | None] | None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """``sql`` on ``driver``, a SQLAlchemy session's own connection (aiosqlite's, or ``gateway.sqlite_inline``'s),
        inside that session's transaction: rows decoded by ``kinds`` (None: no rows read), and the row count.

        The memory store's write path runs its statements here (``memory.store.RawWrites``): on SQLite
        a write holds the one write lock until it commits, and every turn that meets it waits.
        """
        cursor = await driver.execute(sql, [_bind(a) for a in args])
        try:
            if kinds is None:
                return [], cursor.rowcount
            return _decoded(await cursor.fetchall(), kinds), cursor.rowcount
        finally:
            await cursor.close()

    async def select(self, sql: str, args: Sequence[Any], kinds: Sequence[str | None]) -> list[tuple[Any, ...]]:
        """One read statement (``?`` parameters bound as ``_bind`` does; values decoded by ``kinds``)."""
        params = [_bind(a) for a in args]

        def body(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return _decoded(conn.execute(sql, params).fetchall(), kinds)

        return await self._run(body, write=False)


def _decoded(rows: list[tuple[Any, ...]], kinds: Sequence[str | None]) -> list[tuple[Any, ...]]:
    """``rows`` with each value decoded by its column's kind (``_DECODERS``; None: as the driver gave it)."""
    decoders = [(i, _DECODERS[k]) for i, k in enumerate(kinds) if k is not None]
    if not decoders:
        return rows
    out = []
    for r in rows:
        values = list(r)
        for i, decode in decoders:
            if values[i] is not None:
                values[i] = decode(values[i])
        out.append(tuple(values))
    return out


_AS_IS = frozenset({str, int, float, bool, bytes, type(None)})
"""Parameter types bound as they are: most of a turn's ~65 parameters (the memory query's words) are ``str``."""


def _bind(value: Any) -> Any:
    """A parameter as SQLAlchemy's SQLite types bind it: ``UTCDateTime`` as text, a JSON list or object as its text."""
    if type(value) in _AS_IS:
        return value
    if isinstance(value, datetime):
        return encode_time(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value


_FEW_MISSING = 4
"""Rows not kept that ``_kept_rows`` reads one by one; with more, it reads them all in one statement."""


def _kept_rows(
    conn: sqlite3.Connection,
    keys: list[tuple[Any, ...]],
    whole: Callable[[], list[tuple[Any, ...]]],
    decoded: Kept[str, StoredMessage],
) -> list[StoredMessage]:
    """The rows behind ``keys`` (id, version: ``row_version``), in their order, kept ones not read again.

    A turn's history is mostly the rows the last turn read: reading only their keys
    (an id and a short string, not the text) and the few rows not kept costs about a third
    of reading every row whole. A stored message never changes after its insert but
    for its archive_id (a trim, which the keys' query leaves out), reply_requested (not
    in a ``StoredMessage``) and answering_until (in the version); created_at, its insert's
    own time to the microsecond, tells a row inserted again under a reused id (SQLite
    gives the largest rowid again after a delete) from the one kept. ``whole`` reads
    every row with its key (``KEYED_HISTORY``, ``KEYED_LIVE``): used when more than
    ``_FEW_MISSING`` are not kept (a session's first turn since the start).

    Called inside the transaction that read ``keys``, so the rows read are the ones keyed.
    """
    out: list[StoredMessage | None] = []
    missing = 0
    for key in keys:
        row = decoded.get(key[0], key[1])
        if row is None:
            missing += 1
            if missing > _FEW_MISSING:
                return [_kept(r, decoded) for r in whole()]
        out.append(row)
    if missing:
        for i, key in enumerate(keys):
            if out[i] is None:
                out[i] = _kept(conn.execute(sql.KEYED_MESSAGE_BY_ID, (key[0],)).fetchone(), decoded)
    return out  # type: ignore[return-value]  # every None was filled


def _kept(r: tuple[Any, ...], decoded: Kept[str, StoredMessage]) -> StoredMessage:
    """A keyed row (``sql.KEYED_*``: the message's columns, then its version) as a ``StoredMessage``, kept by its id."""
    row = decoded.get(r[0], r[11])
    return row if row is not None else decoded.put(r[0], r[11], _message_row(r))


def row_version(created_at: str, answering_until: str | None) -> str:
    """What ``sql.ROW_VERSION`` reads for a row with these stored times: what a kept row was made from.

    One string, not a tuple: the kept rows hold one each, and the cyclic collector tracks
    tuples, not strings (``gateway/heap.py``).
    """
    return f"{created_at}/{answering_until or ''}"


def _keep_inserted(
    decoded: Kept[str, StoredMessage],
    inserted: list[int],
    row_id: int,
    created_at: str,
    until: str | None,
    fields: tuple[Any, ...],
    said_at: str,
    is_agent: bool,
    reply_to: int | None,
) -> None:
    """Keep a row just inserted as reading it back would make it, so the next turn's history need not read it.

    ``fields`` are its first six columns after the id, as bound; the row is made by the
    read path's own ``_message_row`` from the values bound (``tests/gateway/test_hot_store.py``
    holds the row kept to the row read back). Its id goes on ``inserted``: should the transaction
    not commit, the caller forgets it (the id may be given to another row).
    """
    row = _message_row((row_id, *fields, said_at, is_agent, reply_to, until))
    decoded.put(row_id, row_version(created_at, until), row)
    inserted.append(row_id)


def _begin_turn(
    conn: sqlite3.Connection, m: TurnMessage, decoded: Kept[str, StoredMessage], inserted: list[int]
) -> TurnRows:
    role = m.stored_role
    if m.role_from_users:
        # The role the turn runs with, read in the transaction that stores its message.
        speaker = conn.execute(sql.USER_ROLE, (m.speaker_user_id,)).fetchone()
        if speaker is None:
            return TurnRows("", "", None, [], speaker_gone=True)
        role = speaker[0]
    key = (m.channel, m.conversation_id, m.thread_id)
    row = conn.execute(sql.FIND_SESSION, key).fetchone()
    if row is None:
        now = encode_time(m.now)
        conn.execute(sql.NEW_SESSION, (new_session_id(), *key, m.parent_conversation_id, now, now))
        row = conn.execute(sql.FIND_SESSION, key).fetchone()
    session_id, previous = row
    said_at, created_at = encode_time(m.said_at), encode_time(m.now)
    until = None if m.answering_until is None else encode_time(m.answering_until)
    found = conn.execute(
        sql.NEW_MESSAGE,
        (
            session_id,
            m.platform_message_id,
            m.speaker_user_id,
            role,
            m.display_name,
            m.text,
            said_at,
            created_at,
            int(m.reply_requested),
            until,
        ),
    ).fetchone()
    resumed = False
    if found is None:
        # Stored before: its reply, or (asked for an answer, never given one) answer it now.
        old_id, old_requested = conn.execute(sql.OLD_MESSAGE, (session_id, m.platform_message_id)).fetchone()
        reply = conn.execute(sql.REPLY, (old_id,)).fetchone()
        if reply is not None or not m.reply_requested:
            return TurnRows(session_id, previous, None, [], reply=reply[0] if reply else None, speaker_role=role)
        if not old_requested:
            conn.execute(sql.ASK_REPLY, (old_id,))
        new_id, resumed = old_id, True
    else:
        new_id = found[0]
        _keep_inserted(
            decoded, inserted, new_id, created_at, until,
            (session_id, m.platform_message_id, m.speaker_user_id, role, m.display_name, m.text),
            said_at, False, None,
        )  # fmt: skip
    at = (session_id, new_id, m.history_limit)
    keys = conn.execute(sql.HISTORY_KEYS, at).fetchall()
    rows = _kept_rows(conn, keys, lambda: conn.execute(sql.KEYED_HISTORY, at).fetchall(), decoded)
    if resumed and (not rows or rows[0].id != new_id):
        # Already trimmed into an archive: answer it with what is still live.
        rows.insert(0, _kept(conn.execute(sql.KEYED_MESSAGE_BY_ID, (new_id,)).fetchone(), decoded))
    return TurnRows(session_id, previous, new_id, rows, resumed=resumed, speaker_role=role)


def _store_message(
    conn: sqlite3.Connection, m: NewMessage, decoded: Kept[str, StoredMessage], inserted: list[int]
) -> tuple[int, int | None] | None:
    said_at, created_at = encode_time(m.said_at), encode_time(m.created_at)
    fields = (m.session_id, m.platform_message_id, m.speaker_user_id, m.stored_role, m.display_name, m.text)
    found = conn.execute(sql.STORE, (*fields, said_at, int(m.is_agent), created_at, m.reply_to)).fetchone()
    if found is None:
        return None
    _keep_inserted(decoded, inserted, found[0], created_at, None, fields, said_at, m.is_agent, m.reply_to)
    record_id = None
    if (r := m.record) is not None:
        (record_id,) = conn.execute(
            sql.TURN_RECORD,
            (
                m.session_id,
                r.message_id,
                m.platform_message_id,
                said_at,
                r.speaker_user_id,
                r.stored_role,
                json_text(r.memory),
                json_text(r.sections),
                json_text(r.model_calls),
            ),
        ).fetchone()
    return found[0], record_id


def _finish_job(job_id: int, at: str, forget: bool) -> tuple[str, tuple[Any, ...]]:
    """The statement that ends a job: marked done at ``at``, or (``forget``) deleted."""
    return (sql.FORGET_JOB, (job_id,)) if forget else (sql.FINISH_JOB, (at, job_id))


def _trim_state(conn: sqlite3.Connection, session_id: str) -> tuple[TrimSession | None, list[tuple[Any, ...]]]:
    """The session row a trim plans from, and its live rows' keys (id, ``row_version``)."""
    row = conn.execute(sql.TRIM_SESSION, (session_id,)).fetchone()
    if row is None:
        return None, []
    return TrimSession(*row), conn.execute(sql.LIVE_KEYS, (session_id,)).fetchall()


def _trim_read(
    conn: sqlite3.Connection, session_id: str, decoded: Kept[str, StoredMessage]
) -> tuple[TrimSession, list[tuple[Any, ...]], list[StoredMessage]] | None:
    """The session, its live rows' keys and the rows, from one read transaction (one snapshot)."""
    conn.execute("BEGIN")
    try:
        session, keys = _trim_state(conn, session_id)
        if session is None:
            return None
        live = _kept_rows(conn, keys, lambda: conn.execute(sql.KEYED_LIVE, (session_id,)).fetchall(), decoded)
        return session, keys, live
    finally:
        conn.execute("COMMIT")


def _trim_write(conn: sqlite3.Connection, session_id: str, w: TrimWrite) -> int:
    """Write a planned trim: mark the slice, its archive, the session's context and mark, its extraction job."""
    marks = ",".join("?" * len(w.message_ids))
    conn.execute(f"UPDATE messages SET archive_id = ? WHERE id IN ({marks})", (w.archive_id, *w.message_ids))
    crash_point(w, "mark")
    conn.execute(
        sql.ARCHIVE,
        (
            w.archive_id,
            session_id,
            encode_time(w.created_at),
            encode_time(w.start_at),
            encode_time(w.end_at),
            w.trust,
            len(w.message_ids),
            w.summary,
            w.markdown,
        ),
    )
    crash_point(w, "archive")
    conn.execute(sql.TRIMMED_SESSION, (w.previous_context, w.extracted_through, session_id))
    created = encode_time(w.created_at)
    (job_id,) = conn.execute(
        sql.EXTRACT_JOB,
        (json.dumps(w.job_payload), created, created),
    ).fetchone()
    crash_point(w, "job")
    return int(job_id)
