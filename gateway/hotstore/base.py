"""The hot store's interface: the few statements every turn runs, on the raw driver.

DESIGN.md: the hot path of a turn (auth, begin turn, history, memory
candidates, store reply) is the one place where driver SQL is preferred over
SQLAlchemy. Each operation is one round of statements in one transaction; the
stores (``SessionStore``, ``PairingStore``, ``MemoryStore``) keep their
signatures and call these, so every caller gets the same path. The SQL here
reads and writes the tables that Alembic creates, in the same stored forms
SQLAlchemy uses (``tests/gateway/test_hot_store.py`` checks both ways).
"""

from __future__ import annotations

import abc
import json
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from msgspec import Struct

# Column kinds a raw row's values are decoded by (SQLite stores datetimes and JSON as text):
from memory.store import DATETIME as DATETIME  # the kinds memory asks its raw reads to decode
from memory.store import JSON_VALUE as JSON_VALUE
from memory.types import SliceMessage

BOOL = "bool"


def json_text(value: Any) -> str:
    """A turn record's JSON value as text: ``orjson``'s compact form (a tenth of ``json.dumps``'s time).

    Keys that are not strings are written as strings, as ``json.dumps`` writes them; what
    orjson will not write (a lone surrogate in text a person typed, an integer past 64 bits:
    its error is a TypeError) is written by ``json.dumps``, as before. Imported at the first
    record: its import costs about 20 ms that start-up need not pay.
    """
    import orjson

    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)


def new_session_id() -> str:
    """The id of a session created now: made only when ``begin_turn`` finds no session (not on every turn)."""
    return "s_" + secrets.token_hex(8)


class TurnMessage(Struct, frozen=True):
    """The inbound message of a turn and where it was said (the input of ``begin_turn``)."""

    channel: str
    conversation_id: str
    thread_id: str
    parent_conversation_id: str | None
    platform_message_id: str
    speaker_user_id: str | None
    stored_role: str | None
    display_name: str
    text: str
    said_at: datetime
    now: datetime
    history_limit: int
    reply_requested: bool
    answering_until: datetime | None = None  # the answer lease (gateway/ordering.py), set in the insert
    # The speaker's role is the users table's, read where the message is stored: ``stored_role`` is then
    # only what the caller last knew, and the message is stored with the role read (TurnRows.speaker_role).
    role_from_users: bool = False


class StoredMessage(Struct, frozen=True, gc=False):
    """A message as stored: one row of ``sql.MESSAGE_SELECT``, and the history line's source.

    One type from the row read to the turn's history: the SQLite store keeps each row
    it reads (``gateway/kept.py``) and the history is those same objects. A second type
    made from each row (a dataclass, until 2026-12-07) was one more object per message
    kept.

    Not the cyclic collector's (``gc=False``): its fields are scalars (numbers, strings,
    times, None), so it can never be part of a reference cycle, and the collector neither
    walks it nor counts it towards the next young collection, which stops the loop for its
    whole walk (``gateway/heap.py``). A tuple, which this was until 2026-12-08, is counted
    from its creation to its end: every row a cache keeps and every row a turn holds
    while it waits on a model. On PostgreSQL, whose rows each turn reads afresh, 200 turns
    waiting on a model took the count to 91,000-94,000 of the 100,000 that start a
    collection, about 20,000 of them these rows, and 240 such turns ran one (53 ms).
    """

    id: int
    session_id: str
    platform_message_id: str
    speaker_user_id: str | None
    stored_role: str | None
    display_name: str
    text: str
    said_at: datetime
    is_agent: bool
    reply_to_id: int | None = None  # a reply's message row (what ordering reads)
    answering_until: datetime | None = None  # the answer lease (gateway/ordering.py)
    turn_record_id: int | None = None  # set on a reply stored with its turn's explanation (not a column)

    def as_slice(self) -> SliceMessage:
        """The view memory reads."""
        return SliceMessage(
            message_id=self.platform_message_id,
            user_id=self.speaker_user_id,
            stored_role=self.stored_role,
            display_name=self.display_name,
            text=self.text,
            said_at=self.said_at,
            is_agent=self.is_agent,
        )

    def as_json(self) -> dict[str, Any]:
        """The API shape."""
        return {
            "id": self.platform_message_id,
            "speaker": "agent" if self.is_agent else self.speaker_user_id,
            "role": self.stored_role,
            "name": self.display_name,
            "text": self.text,
            "said_at": self.said_at.isoformat(),
        }


class JobRow(NamedTuple):
    """One row of the jobs table, in ``sql.JOB_COLUMNS`` order (the payload decoded)."""

    id: int
    kind: str
    payload: dict[str, Any]
    status: str
    attempts: int
    run_after: datetime
    locked_by: str | None
    locked_at: datetime | None
    last_error: str | None
    raw_answer: str | None
    created_at: datetime
    finished_at: datetime | None


class TurnRows(Struct, frozen=True):
    """What ``begin_turn`` read and wrote: raw message tuples in ``sql.MESSAGE_SELECT`` order.

    ``message_id`` is None when the message was stored before and needs no
    answer (then ``reply`` is its stored reply, if any); ``resumed`` when it was
    stored before, asked for an answer and never got one. ``rows`` are the
    session's untrimmed messages up to ``message_id``, newest first (the
    message itself first even when a trim archived it).
    """

    session_id: str
    previous_context: str
    message_id: int | None
    rows: list[StoredMessage]
    reply: str | None = None
    resumed: bool = False
    speaker_role: str | None = None  # with ``role_from_users``: the role read in the same transaction
    speaker_gone: bool = False  # with ``role_from_users``: the speaker has no users row; nothing was stored


class TurnRecordRow(Struct, frozen=True):
    """A turn's explanation, stored with its reply."""

    message_id: str
    speaker_user_id: str | None
    stored_role: str | None
    memory: list[Any]
    sections: dict[str, Any]
    model_calls: dict[str, Any]


class NewMessage(Struct, frozen=True):
    """A message to store once (an agent reply names the row it answers)."""

    session_id: str
    platform_message_id: str
    speaker_user_id: str | None
    stored_role: str | None
    display_name: str
    text: str
    said_at: datetime
    is_agent: bool
    created_at: datetime
    reply_to: int | None
    record: TurnRecordRow | None


class TrimSession(Struct, frozen=True):
    """The session row a trim reads (locked for the transaction)."""

    id: str
    channel: str
    conversation_id: str
    thread_id: str
    previous_context: str
    extracted_through: int


class TrimWrite(Struct, frozen=True):
    """What one trim writes, planned from the session and its live messages (``TrimPlan``)."""

    message_ids: list[int]  # the slice, marked with ``archive_id``
    archive_id: str
    created_at: datetime
    start_at: datetime
    end_at: datetime
    trust: str
    summary: str
    markdown: str
    previous_context: str
    extracted_through: int
    job_payload: dict[str, Any]
    crash_after: str | None = None  # the crash tests only: "mark", "archive" or "job"


TrimPlan = Callable[[TrimSession, list[StoredMessage]], TrimWrite | None]
"""Given the session and its live messages (``sql.MESSAGE_SELECT`` tuples, oldest first): the write, or None."""


def crash_point(w: TrimWrite, step: str) -> None:
    """Fail inside the trim's transaction after ``step`` (the crash tests' switch; never set otherwise)."""
    if w.crash_after == step:
        raise RuntimeError(f"simulated crash after {CRASH_STEPS[step]}")


CRASH_STEPS = {"mark": "marking the slice", "archive": "writing the archive", "job": "writing the job"}


class HotStore(abc.ABC):
    """The hot path's statements on one database; one instance per engine (see ``hot_store``)."""

    remote = False
    """Whether a statement waits on a database server (PostgreSQL), so two can be in flight at once."""

    @abc.abstractmethod
    async def user_role(self, user_id: str) -> tuple[str, str] | None:
        """(role, display name) of a unified user, read now (never cached), or None."""

    @abc.abstractmethod
    async def identity_role(self, channel: str, platform_user_id: str) -> tuple[str, str, str] | None:
        """(user id, role, display name) of the person behind a platform identity, or None."""

    @abc.abstractmethod
    async def begin_turn(self, m: TurnMessage) -> TurnRows:
        """Find or create the session, store the message once, read the history: one transaction."""

    @abc.abstractmethod
    async def store_message(self, m: NewMessage) -> tuple[int, int | None] | None:
        """Insert a message (and its turn record) in one transaction: (row id, record id), or None if stored."""

    @abc.abstractmethod
    async def stored_reply(self, message_row_id: int) -> str | None:
        """The reply stored for a message row, if any."""

    @abc.abstractmethod
    async def trim(self, session_id: str, plan: TrimPlan) -> int | None:
        """One trim in one transaction: lock the session, read its live messages, write ``plan``'s result.

        Returns the extraction job's id, or None when there was nothing to trim.
        """

    @abc.abstractmethod
    async def claim_job(
        self, worker_id: str, kinds: Sequence[str], now: datetime, stale_before: datetime
    ) -> JobRow | None:
        """Claim the oldest runnable job of ``kinds`` once: pending and due at ``now``, or running on a lease
        taken before ``stale_before`` (its worker died). Returns the claimed row, or None.
        """

    @abc.abstractmethod
    async def queue_job(self, kind: str, payload: dict[str, Any], now: datetime) -> int:
        """Record a pending job of ``kind``, due at ``now``, in a transaction of its own; returns its id."""

    @abc.abstractmethod
    async def queue_job_unless_pending(
        self, kind: str, payload: dict[str, Any], now: datetime, pending_id: int
    ) -> int | None:
        """``queue_job``, unless job ``pending_id`` is still pending: then nothing is written and None returned.

        ``payload`` names a ``session_id``; the pending job counts only if it is of the same kind and
        session (on SQLite a deleted job's id may be given to another job). One statement: the look
        and the insert in the same snapshot (SQLite looks once before it, without the write lock).
        """

    @abc.abstractmethod
    async def finish_job(self, job_id: int, now: datetime, *, forget: bool = False) -> None:
        """Mark a job done; ``forget``: delete it (its outcome has a record of its own: an archive, revisions)."""

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
        """Mark a job done (``forget``: delete it), then claim the next as ``claim_job`` does.

        Both stores override this with one commit for the two: SQLite in one write
        transaction, PostgreSQL in one statement.
        """
        await self.finish_job(job_id, now, forget=forget)
        return await self.claim_job(worker_id, kinds, now, stale_before)

    @abc.abstractmethod
    async def archive_messages(self, archive_id: str) -> list[StoredMessage]:
        """The messages of one trimmed slice, oldest first."""

    @abc.abstractmethod
    async def select(self, sql: str, args: Sequence[Any], kinds: Sequence[str | None]) -> list[tuple[Any, ...]]:
        """Run one read statement in the driver's paramstyle; values decoded by ``kinds`` (one per column)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection or pool (reopened on next use)."""
