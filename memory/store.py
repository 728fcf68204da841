"""The memory store: append-only records, the subject rule, revisions, and the reads.

Writing takes a :class:`~memory.gate.GateDecision`: there is no way to add a
record without having asked the gate (``MemoryWriter`` in ``memory.writer`` is
the usual way in; it asks the gate and calls :meth:`MemoryStore.add`).

Nothing is edited in place: after insert only ``status`` and ``superseded_by``
change, and every retirement writes a ``memory_revisions`` row.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol

from msgspec import Struct
from msgspec.structs import replace
from sqlalchemy import (
    JSON,
    ColumnElement,
    Float,
    Integer,
    String,
    Table,
    and_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from memory.gate import GateDecision
from memory.models import (
    CAUSES,
    SCOPES,
    STATUSES,
    VIAS,
    MemoryRecord,
    MemoryReview,
    MemoryRevision,
    MemoryTerm,
)
from memory.notes import MAX_REVIEW_DAYS, is_expired, review_by_problem
from memory.paraphrase import same_fact
from memory.words import subject_key, terms
from pairing.models import UTCDateTime

__all__ = ["MAX_REVIEW_DAYS"]
MAX_SUBJECT_CHARS = 200
MAX_NOTE_TERMS = 64

# The cause a retirement records for each source that wrote the replacing record.
_CAUSE_OF_SOURCE: Mapping[str, str] = {
    "live": "live",
    "memory_write": "live",
    "directive": "live",
    "relearn": "relearn",
    "confirm": "confirm",
    "consolidate": "consolidate",
    "decision": "decision",
}

R = MemoryRecord.__table__.c


class MemoryStoreError(Exception):
    """A memory operation that cannot be done; the message says why."""


class MemoryRecordView(Struct, frozen=True):
    """A memory record as read from the store."""

    id: str
    scope: str
    owner_user_id: str | None
    subject: str
    subject_key: str
    content: str
    status: str
    said_at: datetime
    recorded_at: datetime
    review_by: datetime | None
    source: str
    author_user_id: str | None
    author_role: str | None
    session_id: str | None
    evidence: tuple[str, ...]
    run_id: str | None
    superseded_by: str | None
    status_reason: str | None = None
    """Why it was written ``unverified`` (held for review), when it was."""
    applies_to: tuple[str, ...] = ()
    """agent_notes: the SOP names / tags it is for; () is every conversation and run."""
    citations: tuple[str, ...] = ()
    """What the writer cited (not provenance: ``evidence`` is what the host stamped)."""

    def effective_status(self, now: datetime) -> str:
        """The status, with a live note past its review-by date shown as ``expired``."""
        if self.status == "live" and is_expired(self.review_by, now):
            return "expired"
        return self.status

    def current(self, now: datetime) -> bool:
        """Live and not past its review-by date: what may be rendered or given to the model."""
        return self.effective_status(now) == "live"

    def as_json(self, now: datetime | None = None) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "scope": self.scope,
            "user_id": self.owner_user_id,
            "subject": self.subject,
            "content": self.content,
            "status": self.effective_status(now) if now else self.status,
            "said_at": self.said_at.isoformat(),
            "recorded_at": self.recorded_at.isoformat(),
            "review_by": self.review_by.isoformat() if self.review_by else None,
            "source": self.source,
            "author_id": self.author_user_id,
            "author_role": self.author_role,
            "session_id": self.session_id,
            "evidence": list(self.evidence),
            "run_id": self.run_id,
            "superseded_by": self.superseded_by,
            "status_reason": self.status_reason,
            "applies_to": list(self.applies_to),
            "citations": list(self.citations),
        }


class RevisionView(Struct, frozen=True):
    """One retirement row."""

    id: str
    retired_id: str
    replacing_id: str | None
    reason: str
    via: str
    cause: str
    run_id: str | None
    judge_model: str | None
    prompt_version: str | None
    created_at: datetime
    undone_at: datetime | None
    undone_by: str | None
    prior_status: str | None = None

    @property
    def undone(self) -> bool:
        """True when an admin undid this retirement: the pair is vetoed forever."""
        return self.undone_at is not None

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "retired_id": self.retired_id,
            "replacing_id": self.replacing_id,
            "reason": self.reason,
            "via": self.via,
            "cause": self.cause,
            "run_id": self.run_id,
            "judge_model": self.judge_model,
            "prompt_version": self.prompt_version,
            "created_at": self.created_at.isoformat(),
            "undone_at": self.undone_at.isoformat() if self.undone_at else None,
            "undone_by": self.undone_by,
            "prior_status": self.prior_status or "live",
        }


class Added(Struct, frozen=True):
    """What one add did: the record, and the live records it retired."""

    record: MemoryRecordView
    retired: tuple[str, ...] = ()
    duplicate: bool = False
    """True when the same fact was already on record: nothing was written, ``record`` is the known one."""


class _NoteFields(Struct, frozen=True):
    review_by: datetime | None
    applies_to: tuple[str, ...]
    citations: tuple[str, ...]


class Merge(Struct, frozen=True):
    """A consolidation merge: the live agent_notes the new record replaces, and who decided it."""

    sources: tuple[str, ...]
    reason: str
    judge_model: str | None = None
    prompt_version: str | None = None


class ReviewView(Struct, frozen=True):
    """One person's decision on a record (confirm, reject, retract)."""

    id: str
    record_id: str
    action: str
    by_user_id: str
    at: datetime
    reason: str

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "record_id": self.record_id,
            "action": self.action,
            "by": self.by_user_id,
            "at": self.at.isoformat(),
            "reason": self.reason,
        }


class Undone(Struct, frozen=True):
    """What an undo did: the revision rows it marked undone and the records it returned."""

    revisions: tuple[RevisionView, ...]
    restored: tuple[MemoryRecordView, ...]


class PromptCandidates(Struct, frozen=True):
    """What the prompt may draw on this turn (see ``memory.render``)."""

    matched_notes: list[tuple[MemoryRecordView, float]]
    """Live, current notes sharing words with the conversation, best first, with their score."""
    recent_notes: list[MemoryRecordView]
    """The newest live, current notes."""
    personal: list[MemoryRecordView]
    """The person's own live personal records, newest first."""


def new_record_id() -> str:
    """A fresh record id."""
    return "m_" + secrets.token_hex(8)


def _new_revision_id() -> str:
    return "rv_" + secrets.token_hex(8)


def new_run_id(prefix: str = "run") -> str:
    """A fresh run id (a relearn, a belief revision, a consolidation)."""
    return f"{prefix}_" + secrets.token_hex(8)


_EXTRACTED = frozenset({"live", "relearn"})
"""Sources whose wording is the extractor's, not a person's own."""


def _said_again(content: str) -> str:
    return " ".join(content.split()).lower()


def _view(row: Any) -> MemoryRecordView:
    m = row._mapping if hasattr(row, "_mapping") else row
    return MemoryRecordView(
        id=m["id"],
        scope=m["scope"],
        owner_user_id=m["owner_user_id"],
        subject=m["subject"],
        subject_key=m["subject_key"],
        content=m["content"],
        status=m["status"],
        said_at=m["said_at"],
        recorded_at=m["recorded_at"],
        review_by=m["review_by"],
        source=m["source"],
        author_user_id=m["author_user_id"],
        author_role=m["author_role"],
        session_id=m["session_id"],
        evidence=tuple(str(e) for e in (m["evidence"] or ())),
        run_id=m["run_id"],
        superseded_by=m["superseded_by"],
        status_reason=m.get("status_reason"),
        applies_to=tuple(str(x) for x in (m.get("applies_to") or ())),
        citations=tuple(str(x) for x in (m.get("citations") or ())),
    )


def _orm_view(rec: MemoryRecord) -> MemoryRecordView:
    return _view({c.key: getattr(rec, c.key) for c in MemoryRecord.__table__.columns})


def _rev_view(row: Any) -> RevisionView:
    m = row._mapping
    return RevisionView(**{k: m[k] for k in RevisionView.__struct_fields__})


def _review_view(row: Any) -> ReviewView:
    m = row._mapping
    return ReviewView(**{k: m[k] for k in ReviewView.__struct_fields__})


def note_terms(subject: str, content: str) -> list[str]:
    """The distinct index terms of a note (subject first), at most ``MAX_NOTE_TERMS``."""
    seen: dict[str, None] = {}
    for t in terms(subject) + terms(content):
        seen.setdefault(t, None)
        if len(seen) >= MAX_NOTE_TERMS:
            break
    return list(seen)


def note_postings(
    record_id: str, subject: str, content: str, said_at: datetime, review_by: datetime | None
) -> list[dict[str, Any]]:
    """The ``memory_terms`` rows of a live note: one per index term, with the note's ``said_at`` and ``review_by``."""
    return [
        {"term": t, "record_id": record_id, "said_at": said_at, "review_by": review_by}
        for t in note_terms(subject, content)
    ]


def _postings(rec: MemoryRecord | MemoryRecordView) -> list[MemoryTerm]:
    # Every posting the store writes is made here, so each carries what the prompt's match ranks by.
    return [MemoryTerm(**row) for row in note_postings(rec.id, rec.subject, rec.content, rec.said_at, rec.review_by)]


def _lock_key(scope: str, owner: str | None, key: str) -> int:
    digest = hashlib.sha256(f"{scope}\0{owner or ''}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _same_owner(owner: str | None) -> ColumnElement[bool]:
    return R.owner_user_id.is_(None) if owner is None else R.owner_user_id == owner


# ---- the write path's statements, built once (values are bind parameters) -------------------
# Building a select's where clause costs more than running it (about 170 of 250 us for the
# subject read on SQLite); these run for every record written and every retirement.
def _table(model: Any) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


_T, _REV, _TERMS = _table(MemoryRecord), _table(MemoryRevision), _table(MemoryTerm)
_BY_ID = select(_T).where(R.id == bindparam("id"))
_BY_ID_LOCKED = _BY_ID.with_for_update()
_VETO = select(_REV.c.id).where(
    _REV.c.retired_id == bindparam("retired"),
    _REV.c.replacing_id == bindparam("replacing"),
    _REV.c.undone_at.is_not(None),
)
_PRIOR_STATUS = select(R.status).where(R.id == bindparam("id"), R.status.in_(("live", "unverified"))).with_for_update()
_RETIRE = (
    update(_T)
    .where(R.id == bindparam("retired"), R.status == bindparam("prior"))
    .values(status=bindparam("to_status"), superseded_by=bindparam("by"))
)
_DELETE_POSTINGS = delete(_TERMS).where(_TERMS.c.record_id == bindparam("retired"))
_EXPIRED_POSTINGS = (
    select(_TERMS.c.record_id)
    .where(_TERMS.c.review_by <= bindparam("now", type_=UTCDateTime()))
    .distinct()
    .limit(bindparam("limit", type_=Integer()))
)
_DELETE_NOTES_POSTINGS = delete(_TERMS).where(_TERMS.c.record_id.in_(bindparam("ids", expanding=True)))
_INSERT_RECORD = insert(_T)
_INSERT_REVISION = insert(_REV)
_INSERT_POSTING = insert(_TERMS)
_SUBJECT_LOCK = text("SELECT pg_advisory_xact_lock(:k)")
_SUBJECT_LOCK_SQL = "SELECT pg_advisory_xact_lock($1::bigint)"  # asyncpg's own parameters


def _owner_param(with_owner: bool) -> ColumnElement[bool]:
    return R.owner_user_id == bindparam("owner") if with_owner else R.owner_user_id.is_(None)


@lru_cache(maxsize=2)
def _same_subject_statement(with_owner: bool) -> Any:
    """``_add``'s read: the subject's live and unverified records, and the same saying in any status."""
    return select(_T).where(
        R.scope == bindparam("scope"),
        R.subject_key == bindparam("key"),
        _owner_param(with_owner),
        # The same saying in any status: a relearn run twice finds its history, its
        # rejected and its retracted records, and writes none of them again.
        or_(R.status.in_(("live", "unverified")), R.said_at == bindparam("said_at")),
    )


@lru_cache(maxsize=2)
def _other_live_statement(with_owner: bool) -> Any:
    """The subject rule's read: the other live, unexpired records on the subject."""
    return select(_T).where(
        R.scope == bindparam("scope"),
        R.subject_key == bindparam("key"),
        R.status == "live",
        R.id != bindparam("id"),
        _owner_param(with_owner),
        # An expired note stays expired in the read model: a new value does not retire it.
        or_(R.review_by.is_(None), R.review_by > bindparam("now")),
    )


@lru_cache(maxsize=4)
def _personal_statement(limit: int) -> Any:
    return (
        select(_T)
        .where(R.scope == "personal", R.owner_user_id == bindparam("owner"), R.status == "live")
        .order_by(R.said_at.desc(), R.id)
        .limit(limit)
    )


MATCH_WORD_POSTINGS = 5_000
"""A word in more notes than this is left out of a turn's ``match``, as a stop word is: its ``1/df``
weight is next to nothing, and grouping its postings was most of the turn (a word in every one of
65,536 notes, such as "use", cost 80-140 ms of CPU each turn). The statement still counts the
postings of such a word, and names it (the ``common`` part); the store then leaves it out of its
next turns' statements for :data:`COMMON_WORD_TTL_S`, so it is counted once in that time."""
COMMON_WORD_TTL_S = 600.0
"""How long a store leaves out a word found in more than :data:`MATCH_WORD_POSTINGS` notes: a word
becomes that common over many writes, and one that stops being so is still left out for this long."""
_COMMON_WORDS_KEPT = 4_096
"""The most common words a store remembers (past it, it forgets them all and finds them again)."""


@lru_cache(maxsize=16)
def _candidates_statement(with_words: bool, with_user: bool, matched_limit: int) -> Any:
    """The prompt-candidates statement for one shape, built once (values are bind parameters).

    ``matched_limit`` is written into the statement: PostgreSQL's generic plan of a prepared
    statement does not know a parameter's value, took the ``match`` for 10% of its postings, and
    joined them to a scan of every record (25 ms at 65,536 notes, against 4 on an index).

    Building a UNION of three record selects costs more than running it on
    SQLite, so each shape (words or not, a person or not, the limit) is built once and reused.
    """
    now = bindparam("now", type_=UTCDateTime())
    live_note = and_(
        R.scope == "agent_notes",
        R.owner_user_id.is_(None),
        R.status == "live",
        or_(R.review_by.is_(None), R.review_by > now),
    )

    def part(name: str, score: Any) -> list[Any]:
        # Only what changes after insert (status, superseded_by) besides the id: a record's other
        # columns never do, so its view is read once (``_records_statement``) and kept by the store.
        cols = (R.id, R.status, R.superseded_by)
        return [*cols, cast(score, Float).label("score"), literal(name, String).label("part")]

    parts: list[Any] = []
    if with_words:
        T = MemoryTerm.__table__
        words: Any = bindparam("words", expanding=True)
        df = select(T.c.term, func.count().label("n")).where(T.c.term.in_(words)).group_by(T.c.term).cte("df")
        postings = T.alias("postings")
        # Ranked and limited on the postings alone (their covering index holds said_at and
        # review_by), then only the chosen records are read. memory_terms holds live agent
        # notes only, so the records' own filter below keeps every chosen one; it stays as a
        # guard, so a stale posting can never bring back a note that is not live. The postings
        # of a note past its review-by date are filtered here until the job worker's next
        # prune deletes them (``prune_expired_postings``); the df counts them until then.
        # (said_at is one value per record: grouping by it too is cheaper than a max() per posting.)
        # A word in more than ``match_word_postings`` notes is left out: its postings are counted
        # (on the covering index), never grouped. The postings are read from the words that are
        # kept (the join's driver), not from the IN list, which names the common ones too.
        cap = bindparam("match_word_postings", type_=Integer())
        score = func.sum(cast(1.0, Float) / df.c.n).label("score")
        best = (
            select(postings.c.record_id, score)
            .select_from(df)
            .join(postings, and_(postings.c.term == df.c.term, df.c.n <= cap))
            .where(or_(postings.c.review_by.is_(None), postings.c.review_by > now))
            .group_by(postings.c.record_id, postings.c.said_at)
            .order_by(score.desc(), postings.c.said_at.desc(), postings.c.record_id)
            .limit(literal_column(str(int(matched_limit))))
            .subquery("best")
        )
        parts.append(select(*part("match", best.c.score)).join(best, best.c.record_id == R.id).where(live_note))
        # The words left out, with their counts: the store leaves them out of its next statements.
        parts.append(
            select(
                df.c.term, literal(None, String), literal(None, String), cast(df.c.n, Float), literal("common", String)
            ).where(df.c.n > cap)
        )
    parts.append(
        select(*part("recent", 0.0))
        .where(live_note)
        .order_by(R.said_at.desc(), R.id)
        .limit(bindparam("recent_limit", type_=Integer()))
    )
    if with_user:
        parts.append(
            select(*part("personal", 0.0))
            .where(R.scope == "personal", R.owner_user_id == bindparam("user_id"), R.status == "live")
            .order_by(R.said_at.desc(), R.id)
            .limit(bindparam("personal_limit", type_=Integer()))
        )
    return union_all(*(select(p.subquery()) for p in parts))


@lru_cache(maxsize=2)
def _live_notes_statement(ids_only: bool = False) -> Any:
    """``MemoryStore.live_notes`` (or only their ids): current operational notes, newest first (``now``, ``limit``)."""
    now = bindparam("now", type_=UTCDateTime())
    return (
        select(R.id if ids_only else MemoryRecord.__table__)
        .where(R.scope == "agent_notes", R.owner_user_id.is_(None), R.status == "live")
        .where(or_(R.review_by.is_(None), R.review_by > now))
        .order_by(R.said_at.desc(), R.id)
        .limit(bindparam("limit", type_=Integer()))
    )


@lru_cache(maxsize=1)
def _records_statement() -> Any:
    """Whole records by id (``ids`` is an expanding bind parameter)."""
    return select(MemoryRecord.__table__).where(R.id.in_(bindparam("ids", expanding=True)))


# The value kinds a ``RawReads.select`` decodes (one per column, None: as the driver gives it).
DATETIME = "datetime"
JSON_VALUE = "json"


class RawReads(Protocol):
    """One read statement on the database driver itself (the gateway's hot store, ``gateway.hotstore``)."""

    async def select(self, sql: str, args: Sequence[Any], kinds: Sequence[str | None]) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (the driver's paramstyle), each value decoded by its kind (DATETIME, JSON_VALUE)."""


class RawWrites(Protocol):
    """The write path's statements on the driver connection of an open SQLAlchemy transaction.

    The gateway's hot stores have it (``run_on``): the same SQL, bound and decoded as
    SQLAlchemy would, without SQLAlchemy's execution around each statement. On SQLite a
    write holds the database's one write lock from its first statement to its commit, and
    every turn waits for it; that hold was about 1.1 ms, of which the SQL was 0.18. On
    PostgreSQL a gated write cost 5.4 ms of the gateway's CPU through SQLAlchemy and 3.3 on
    asyncpg itself (``bench/memory_write.py --postgres``), where the ``memory_write`` tool runs
    on the turn's loop and every extraction job's writes in the job process. PostgreSQL's hot
    store also has ``run_many_on`` (one ``executemany`` for a note's postings).
    """

    async def run_on(
        self, driver: Any, sql: str, args: Sequence[Any], kinds: Sequence[str | None] | None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """``sql`` on ``driver`` (the session's own connection, in its transaction): rows decoded by ``kinds``
        (None: a statement without rows), and the row count."""


class _DriverSQL(Struct, frozen=True):
    statement: Any  # kept, so the id it is cached under stays its own
    sql: str
    names: tuple[str, ...]
    fixed: dict[str, Any]

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The driver's parameters, in the SQL's order: ``params`` and the values compiled into the shape."""
        values = self.fixed | dict(params)
        return [values[n] for n in self.names]


_DRIVER_SQL: dict[tuple[int, str, frozenset[str]], _DriverSQL] = {}
_DRIVER_KEY = "goclaw.driver_connection"


async def _autoflush(s: AsyncSession) -> None:
    """What SQLAlchemy's autoflush does before a statement: the session's pending objects written first."""
    if s.new or s.dirty or s.deleted:
        await s.flush()


def _driver_sql(dialect: Any, statement: Any, keys: Iterable[str]) -> _DriverSQL:
    """``statement`` as the driver's own SQL for parameters named ``keys``: compiled once per shape.

    The text, the order of its parameters, and the values of its literals (an ``IN`` of
    constants is a parameter list SQLAlchemy expands); an insert names the columns in ``keys``.
    """
    names = frozenset(keys)
    cache_key = (id(statement), dialect.name, names)
    found = _DRIVER_SQL.get(cache_key)
    if found is not None and found.statement is statement:
        return found
    column_keys = sorted(names) if getattr(statement, "is_insert", False) else None
    expanded = statement.compile(dialect=dialect, column_keys=column_keys).construct_expanded_state(
        dict.fromkeys(names)
    )
    fixed = {k: v for k, v in expanded.parameters.items() if k not in names}
    found = _DriverSQL(statement, str(expanded.statement), tuple(expanded.positiontup or ()), fixed)
    _DRIVER_SQL[cache_key] = found
    return found


_RECORD_COLUMNS = tuple(c.key for c in MemoryRecord.__table__.columns)
if tuple(MemoryRecordView.__struct_fields__) != _RECORD_COLUMNS:
    raise RuntimeError("MemoryRecordView's fields must be memory_records' columns, in order (see _row_view)")


def _strs(values: Any) -> tuple[str, ...]:
    return tuple(map(str, values)) if values else ()


def _row_view(row: Sequence[Any]) -> MemoryRecordView:
    """``_view`` of a candidate row as the hot store gives it: the record's columns in order, decoded."""
    r = row
    return MemoryRecordView(
        r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13],
        _strs(r[14]), r[15], r[16], r[17], _strs(r[18]), _strs(r[19]),
    )  # fmt: skip


def _column_kind(col: Any) -> str | None:
    if isinstance(col.type, UTCDateTime):
        return DATETIME
    if isinstance(col.type, JSON):
        return JSON_VALUE
    return None


_CANDIDATE_KINDS = (None, None, None, None, None)  # id, status, superseded_by, score, part
_RECORD_KINDS = tuple(_column_kind(c) for c in MemoryRecord.__table__.columns)
_KEPT_VIEWS = 32_768
"""How many records' views a store keeps for the prompt's candidates (least recently used dropped).

A turn's candidates are up to ``PERSONAL_CANDIDATES`` (200) of the speaker's own records and some 70
notes. At 8,192, fifty people with 200 records each, speaking in turn, pushed each other's records
out before they spoke again (least recently used goes first, so a rotation larger than this keeps
nothing): every turn read about 160 whole records again, 3 ms of its 5-6 ms (``bench/memory_prompt.py
--users 200``). A view is about 600 bytes; 32,768 of them about 20 MB, for some 160 such people.
"""
_ID_BUCKETS = (8, 32, 128, 512)
"""How many ids one ``_records_sql`` statement takes (padded with the last id): few shapes to compile."""
_CANDIDATE_PARAMS = frozenset({"now", "recent_limit", "match_word_postings", "user_id", "personal_limit", "words"})


@lru_cache(maxsize=16)
def _candidates_compiled(dialect: Any, with_words: bool, with_user: bool, matched_limit: int) -> Any:
    """``_candidates_statement`` compiled once per shape (3-6 ms each: far more than running it)."""
    return _candidates_statement(with_words, with_user, matched_limit).compile(dialect=dialect)


@lru_cache(maxsize=64)
def _candidates_sql(
    dialect: Any, with_words: bool, with_user: bool, n_words: int, matched_limit: int
) -> tuple[str, tuple[str, ...], dict]:
    """``_candidates_statement`` for ``n_words`` words, as the driver's own SQL.

    The statement stays the one SQLAlchemy expression above; the hot store runs
    its text (its parameter names in order, and the values of its literals). It is
    compiled once per shape; each word count (up to ``MAX_QUERY_TERMS``) only expands
    that compiled form's ``IN`` lists (about 0.05 ms), so a turn whose conversation
    has a word count not seen before does not pay a compile.
    """
    sample: dict[str, Any] = {"now": datetime.now(UTC), "recent_limit": 0, "match_word_postings": 0}
    sample.update(user_id="", personal_limit=0, words=[""] * n_words)
    expanded = _candidates_compiled(dialect, with_words, with_user, matched_limit).construct_expanded_state(sample)
    names = tuple(expanded.positiontup or ())
    fixed = {
        k: v
        for k, v in expanded.parameters.items()
        if k not in _CANDIDATE_PARAMS and not (k.startswith("words_") and k[6:].isdigit())
    }
    return expanded.statement, names, fixed


@lru_cache(maxsize=2)
def _records_compiled(dialect: Any) -> Any:
    """``_records_statement`` compiled once; each id bucket only expands its ``IN`` list."""
    return _records_statement().compile(dialect=dialect)


@lru_cache(maxsize=16)
def _records_sql(dialect: Any, n_ids: int) -> str:
    """``_records_statement`` compiled for ``n_ids`` ids into the driver's SQL (its parameters: the ids, in order)."""
    expanded = _records_compiled(dialect).construct_expanded_state({"ids": [""] * n_ids})
    return str(expanded.statement)


class MemoryStore:
    """Reads and writes memory records on SQLite or PostgreSQL.

    Every write runs in one transaction (pass ``session=`` to join a larger
    one, see :meth:`transaction`); a failed write leaves nothing behind.
    The turn's one read, :meth:`prompt_candidates`, runs on ``raw`` when the
    gateway gives it its hot store (the raw driver), else through SQLAlchemy:
    the same statement either way.
    """

    def __init__(
        self, engine: AsyncEngine, *, clock: Callable[[], datetime] | None = None, raw: RawReads | None = None
    ) -> None:
        self._engine = engine
        self._raw = raw
        # The write path's statements on the session's own driver connection (RawWrites), in its transaction,
        # where the hot store can: sqlite3 on SQLite, asyncpg on PostgreSQL. A store built without one: SQLAlchemy.
        self._run_on = getattr(raw, "run_on", None)
        self._run_many_on = getattr(raw, "run_many_on", None)  # one statement for many rows (PostgreSQL)
        # Records whose views prompt_candidates has built, by id, newest use last. Only status and
        # superseded_by change after insert, and every read takes those two from the database.
        self._views: OrderedDict[str, MemoryRecordView] = OrderedDict()
        # Words found in more than MATCH_WORD_POSTINGS notes: word -> (until when, by time.monotonic(), its count).
        self._common: dict[str, tuple[float, int]] = {}
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or (lambda: datetime.now(UTC))

    def now(self) -> datetime:
        """The store's clock (injectable for tests)."""
        return self._clock()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    @asynccontextmanager
    async def transaction(self, *, rollback: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction: committed when the block ends, rolled back if it raises.

        With ``rollback=True`` it is always rolled back (a dry run: everything is
        computed as if written, and nothing is kept).
        """
        if not rollback:
            async with self._sessions() as session, session.begin():
                yield session
            return
        async with self._sessions() as session:
            tx = await session.begin()
            try:
                yield session
            finally:
                await tx.rollback()

    # ---- the write path's statements -------------------------------------------------------
    # Each runs in the caller's transaction ``s``: through SQLAlchemy, or (``_run_on``) the same
    # SQL on the session's own driver connection, bound and decoded as SQLAlchemy would.

    async def _driver(self, s: AsyncSession) -> Any:
        """The driver connection under ``s``'s transaction (looked up once per transaction)."""
        tx = s.get_transaction()
        kept = s.info.get(_DRIVER_KEY)
        if tx is not None and kept is not None and kept[0] is tx:
            return kept[1]
        conn = await s.connection()  # begins the session's transaction if nothing has yet
        driver = (await conn.get_raw_connection()).driver_connection
        if self._engine.dialect.name == "postgresql" and not driver.is_in_transaction():
            # SQLAlchemy's asyncpg adapter sends its BEGIN with the transaction's first statement; until then
            # the connection is in no transaction, and a statement sent on it would commit on its own.
            await conn.exec_driver_sql("SELECT 1")
        s.info[_DRIVER_KEY] = (s.get_transaction(), driver)
        return driver

    async def _on_driver(
        self, s: AsyncSession, statement: Any, params: Mapping[str, Any], kinds: Sequence[str | None] | None
    ) -> tuple[list[tuple[Any, ...]], int]:
        assert self._run_on is not None
        await _autoflush(s)
        compiled = _driver_sql(self._engine.dialect, statement, params)
        rows, count = await self._run_on(await self._driver(s), compiled.sql, compiled.args(params), kinds)
        return rows, int(count)

    async def _records(self, s: AsyncSession, statement: Any, params: Mapping[str, Any]) -> list[MemoryRecordView]:
        """The whole records a select of ``memory_records`` finds."""
        if self._run_on is None:
            return [_view(r) for r in await s.execute(statement, params)]
        rows, _ = await self._on_driver(s, statement, params, _RECORD_KINDS)
        return [_row_view(r) for r in rows]

    async def _first(self, s: AsyncSession, statement: Any, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or None without one."""
        row: Sequence[Any] | None
        if self._run_on is None:
            row = (await s.execute(statement, params)).first()
        else:
            rows, _ = await self._on_driver(s, statement, params, (None,))
            row = rows[0] if rows else None
        return None if row is None else row[0]

    async def _write(self, s: AsyncSession, statement: Any, params: Mapping[str, Any]) -> int:
        """Run an insert, update or delete; the rows it changed."""
        if self._run_on is None:
            return int((await s.execute(statement, params)).rowcount)  # type: ignore[attr-defined]
        _, count = await self._on_driver(s, statement, params, None)
        return count

    async def _insert_many(self, s: AsyncSession, statement: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert ``rows``: one statement for many through SQLAlchemy and on PostgreSQL's driver (``run_many_on``,
        rows of the same columns), one each on SQLite's (inline: no round trips to save)."""
        if not rows:
            return
        if self._run_on is None:
            await s.execute(statement, list(rows))
            return
        if self._run_many_on is None or any(r.keys() != rows[0].keys() for r in rows):
            for row in rows:
                await self._on_driver(s, statement, row, None)
            return
        await _autoflush(s)
        compiled = _driver_sql(self._engine.dialect, statement, rows[0])
        await self._run_many_on(await self._driver(s), compiled.sql, [compiled.args(r) for r in rows])

    # ---- writes --------------------------------------------------------------------------

    async def add(
        self,
        decision: GateDecision,
        *,
        subject: str,
        content: str,
        said_at: datetime,
        session_id: str | None = None,
        evidence: Sequence[str] = (),
        run_id: str | None = None,
        review_by: datetime | None = None,
        applies_to: Sequence[str] = (),
        citations: Sequence[str] = (),
        merge: Merge | None = None,
        session: AsyncSession | None = None,
    ) -> Added:
        """Write one record under a gate decision, applying the subject rule by ``said_at``.

        A new live record retires the live record(s) on the same subject (same
        owner for personal) -- unless one of them was said later, in which case
        the new record is itself history (``superseded`` by the newest) and
        retires nothing. An ``unverified`` record retires nothing. The same fact
        already on record (live, or the same saying at the same ``said_at`` in
        any status) is not written again.

        Args:
            decision: The gate's WRITE or WRITE_UNVERIFIED for this principal, scope and source.
            subject: The subject as given; its normalised key drives the subject rule.
            content: The fact.
            said_at: When it was said (the message time), never the write clock.
            session_id: The chat session it came from.
            evidence: Message ids and/or an archive id.
            run_id: The job or run that wrote it.
            review_by: agent_notes: when the fact comes up for review; required, in the future and at
                most 90 days out (seed 001), or the store refuses the entry. A merge takes the earliest
                of its sources' instead.
            applies_to: agent_notes: the SOP names / tags it is for (empty: everyone).
            citations: What the writer cited (kept apart from the host-stamped ``evidence``).
            merge: For consolidation: the live notes this record merges (each is retired by it).
            session: Join this transaction instead of opening one.

        Raises:
            MemoryStoreError: the decision does not allow a write, the values are unusable,
                or a merge's sources are no longer live.
        """
        if not isinstance(decision, GateDecision) or not decision.writes:
            raise MemoryStoreError(f"the gate did not allow this write: {getattr(decision, 'reason', decision)!r}")
        if said_at.tzinfo is None:
            raise MemoryStoreError("said_at must be timezone-aware (UTC)")
        if not content.strip():
            raise MemoryStoreError("a memory record needs content")
        if merge is not None and decision.source != "consolidate":
            raise MemoryStoreError("only consolidation merges records")
        extra = _NoteFields(review_by, tuple(applies_to), tuple(str(c) for c in citations))
        args = (decision, subject, content, said_at, session_id, tuple(evidence), run_id, extra, merge)
        if session is None:
            async with self.transaction() as s:
                return await self._add(s, *args)
        return await self._add(session, *args)

    async def _lock_subject(self, s: AsyncSession, scope: str, owner: str | None, key: str) -> None:
        if self._engine.dialect.name == "postgresql":
            # Two writers on one subject would otherwise both see "no live value" and both stay live.
            if self._run_on is None:
                await s.execute(_SUBJECT_LOCK, {"k": _lock_key(scope, owner, key)})
            else:  # on the connection itself (it begins the transaction when it is the first statement)
                await (await s.connection()).exec_driver_sql(_SUBJECT_LOCK_SQL, (_lock_key(scope, owner, key),))

    async def _add(
        self,
        s: AsyncSession,
        decision: GateDecision,
        subject: str,
        content: str,
        said_at: datetime,
        session_id: str | None,
        evidence: Sequence[str],
        run_id: str | None,
        extra: _NoteFields,
        merge: Merge | None,
    ) -> Added:
        now = self.now()
        scope = decision.scope
        owner = decision.owner_user_id if scope == "personal" else None
        if scope == "personal" and not owner:
            raise MemoryStoreError("a personal record needs its owner")
        subject = subject.strip()[:MAX_SUBJECT_CHARS] or content.strip()[:60]
        key = subject_key(subject) or subject_key(content)[:60]
        principal = decision.principal
        status = decision.status
        review_by = extra.review_by if scope == "agent_notes" else None
        if scope == "agent_notes" and merge is None:
            # Seed 001: "The store refuses ... a reviewBy in the past ... a reviewBy more than 90 days out".
            problem = review_by_problem(review_by, now)
            if problem:
                raise MemoryStoreError(problem)

        # The record's columns as values: an ORM instance (instrumented attributes) costs about
        # 0.2 ms to make, and only a merge adds one to the session (``_add_merged``).
        values: dict[str, Any] = dict(
            id=new_record_id(),
            scope=scope,
            owner_user_id=owner,
            subject=subject,
            subject_key=key,
            content=content.strip(),
            status=status,
            said_at=said_at,
            recorded_at=now,
            review_by=review_by,
            source=decision.source,
            author_user_id=principal.user_id or principal.system_name,
            author_role=principal.stored_role,
            session_id=session_id,
            evidence=[str(e) for e in evidence],
            run_id=run_id,
            superseded_by=None,
            status_reason=decision.reason if status == "unverified" else None,
            applies_to=list(extra.applies_to) if scope == "agent_notes" and extra.applies_to else None,
            citations=list(extra.citations) or None,
        )
        await self._lock_subject(s, scope, owner, key)
        if merge is not None:
            return await self._add_merged(s, MemoryRecord(**values), merge)
        said_again = _said_again(content)
        same_subject = await self._records(
            s,
            _same_subject_statement(owner is not None),
            {"scope": scope, "key": key, "owner": owner, "said_at": said_at},
        )
        for known in same_subject:
            if (
                known.status == "live"
                and decision.source in _EXTRACTED
                and not is_expired(known.review_by, now)
                and same_fact(known.content, content)
            ):
                # A paraphrase of a live fact (the extractor rewording an admin's @notes:) is no
                # new value: keep the earlier, more authoritative wording; retire nothing.
                return Added(known, duplicate=True)
            if _said_again(known.content) != said_again:
                continue
            if known.status == "live" and is_expired(known.review_by, now):
                # Seed 001: a fact still true after its review date "is recorded again": an expired
                # entry does not absorb it, or it could never come back.
                continue
            if known.status == "live":
                # The same fact said again (each trim re-reads it) is not a new value: keep the first.
                return Added(known, duplicate=True)
            if known.status == "unverified":
                # An unverified copy does not count against a live write: that write is the upgrade.
                if status != "live":
                    return Added(known, duplicate=True)
                continue
            if known.said_at == said_at:
                return Added(known, duplicate=True)
        view = _view(values)
        await self._write(s, _INSERT_RECORD, values)
        if status != "live":
            # policy: "An unverified record retires nothing".
            return Added(view)
        if scope == "agent_notes":
            await self._insert_many(
                s, _INSERT_POSTING, note_postings(view.id, view.subject, view.content, view.said_at, view.review_by)
            )
        retired = await self._subject_rule(s, view, cause=_CAUSE_OF_SOURCE[decision.source], run_id=run_id)
        return Added(await self._reread(s, view.id), retired)

    async def _reread(self, s: AsyncSession, record_id: str) -> MemoryRecordView:
        found = await self._records(s, _BY_ID, {"id": record_id})
        if not found:
            raise MemoryStoreError(f"no memory record {record_id!r}")
        return found[0]

    async def _subject_rule(
        self, s: AsyncSession, record: MemoryRecordView, *, cause: str, run_id: str | None
    ) -> tuple[str, ...]:
        """Apply the subject rule to a record that just became live; return the ids it retired.

        policy: "The subject rules and belief revision replace the older value with the
        newer by that time [when it was said]." A record said before another live value on
        its subject becomes history itself (superseded by the newest) and retires nothing:
        "A relearned or confirmed record older than the live value on its subject becomes
        history itself; it does not retire the newer value."
        """
        others = await self._records(
            s,
            _other_live_statement(record.owner_user_id is not None),
            {
                "scope": record.scope,
                "key": record.subject_key,
                "id": record.id,
                "owner": record.owner_user_id,
                "now": self.now(),
            },
        )
        newer = [o for o in others if o.said_at > record.said_at]
        if newer:
            newest = max(newer, key=lambda v: (v.said_at, v.id))
            await self._retire(
                s,
                record.id,
                newest.id,
                reason=(
                    f"said {record.said_at:%Y-%m-%d %H:%M} UTC, before the live value on '{record.subject}' "
                    f"(said {newest.said_at:%Y-%m-%d %H:%M})"
                ),
                via="subject_rule",
                cause=cause,
                run_id=run_id,
            )
            return ()
        retired: list[str] = []
        for old in others:
            if await self._retire(
                s,
                old.id,
                record.id,
                reason=(
                    f"'{record.subject}' said again on {record.said_at:%Y-%m-%d %H:%M} UTC "
                    f"(was {old.said_at:%Y-%m-%d %H:%M})"
                ),
                via="subject_rule",
                cause=cause,
                run_id=run_id,
            ):
                retired.append(old.id)
        return tuple(retired)

    async def _add_merged(self, s: AsyncSession, rec: MemoryRecord, merge: Merge) -> Added:
        """Write a consolidation's merged record and retire each of its sources by it."""
        wanted = list(dict.fromkeys(merge.sources))
        if len(wanted) < 2:
            raise MemoryStoreError("a merge needs at least two records")
        if rec.status != "live" or rec.scope != "agent_notes":
            raise MemoryStoreError("consolidation merges live agent_notes only")
        sources = {
            v.id: v for v in (_view(r) for r in await s.execute(select(MemoryRecord.__table__).where(R.id.in_(wanted))))
        }
        for rid in wanted:
            src = sources.get(rid)
            if src is None or src.scope != "agent_notes" or src.owner_user_id is not None or src.status != "live":
                raise MemoryStoreError(f"cannot merge {rid}: it is not a live agent note (any more)")
        # Seed 001 / issue 11: consolidation never extends a review-by: the merge takes the earliest.
        dated = [v.review_by for v in sources.values() if v.review_by is not None]
        if dated:
            rec.review_by = min(dated)
        problem = review_by_problem(rec.review_by, self.now())
        if problem:
            raise MemoryStoreError(f"cannot merge: {problem}")
        # Scoped only as narrowly as its widest source: an unscoped source was already everyone's.
        scopes = [v.applies_to for v in sources.values()]
        rec.applies_to = None if any(not sc for sc in scopes) else sorted({n for sc in scopes for n in sc})
        s.add(rec)
        s.add_all(_postings(rec))
        await s.flush()
        for rid in wanted:
            done = await self._retire(
                s,
                rid,
                rec.id,
                reason=f"merged into {rec.id}: {merge.reason}"[:2000],
                via="consolidation",
                cause="consolidate",
                run_id=rec.run_id,
                judge_model=merge.judge_model,
                prompt_version=merge.prompt_version,
            )
            if not done:
                # policy: "An undone retirement is a veto for that pair, forever" -- the whole merge
                # is abandoned rather than leaving a half-merged copy behind.
                raise MemoryStoreError(f"cannot merge {rid}: an undone revision vetoes it")
        return Added(_orm_view(rec), tuple(wanted))

    async def _retire(
        self,
        s: AsyncSession,
        retired_id: str,
        replacing_id: str | None,
        *,
        reason: str,
        via: str,
        cause: str,
        run_id: str | None = None,
        judge_model: str | None = None,
        prompt_version: str | None = None,
        status: str = "superseded",
    ) -> bool:
        if via not in VIAS or cause not in CAUSES:
            raise MemoryStoreError(f"unknown retirement via={via!r} cause={cause!r}")
        if replacing_id is not None and await self._vetoed(s, retired_id, replacing_id):
            # policy: "the undone row stands as a veto: the same record never replaces the same record again".
            return False
        prior = await self._first(s, _PRIOR_STATUS, {"id": retired_id})
        if prior is None:
            return False
        changed = await self._write(
            s, _RETIRE, {"retired": retired_id, "prior": prior, "to_status": status, "by": replacing_id}
        )
        if changed != 1:
            return False
        await self._write(s, _DELETE_POSTINGS, {"retired": retired_id})
        await self._write(
            s,
            _INSERT_REVISION,
            {
                "id": _new_revision_id(),
                "retired_id": retired_id,
                "replacing_id": replacing_id,
                "reason": reason,
                "via": via,
                "cause": cause,
                "run_id": run_id,
                "judge_model": judge_model,
                "prompt_version": prompt_version,
                "created_at": self.now(),
                "undone_at": None,
                "prior_status": prior,
            },
        )
        return True

    async def _vetoed(self, s: AsyncSession, retired_id: str, replacing_id: str) -> bool:
        return await self._first(s, _VETO, {"retired": retired_id, "replacing": replacing_id}) is not None

    async def retire_superseded(
        self,
        retired_id: str,
        replacing_id: str,
        *,
        reason: str,
        via: str,
        cause: str,
        run_id: str | None = None,
        judge_model: str | None = None,
        prompt_version: str | None = None,
        session: AsyncSession | None = None,
    ) -> bool:
        """Retire a live (or unverified) record as superseded by another, with its revision row.

        For belief revision and consolidation. Returns False when the record is
        not live/unverified any more, or an undone revision vetoes this pair.
        """
        kwargs: dict[str, Any] = {
            "reason": reason,
            "via": via,
            "cause": cause,
            "run_id": run_id,
            "judge_model": judge_model,
            "prompt_version": prompt_version,
        }
        if session is None:
            async with self.transaction() as s:
                return await self._retire(s, retired_id, replacing_id, **kwargs)
        return await self._retire(session, retired_id, replacing_id, **kwargs)

    async def apply_subject_rule(
        self, record_id: str, *, cause: str, run_id: str | None = None, session: AsyncSession | None = None
    ) -> tuple[str, ...]:
        """Apply the subject rule to a live record again (belief revision does this first).

        Returns the ids it retired (none if the record is not live, or is older
        than the live value on its subject and so became history). Undone pairs
        stay vetoed.
        """

        async def go(s: AsyncSession) -> tuple[str, ...]:
            rec = await self._locked(s, record_id)
            if rec.status != "live":
                return ()
            await self._lock_subject(s, rec.scope, rec.owner_user_id, rec.subject_key)
            return await self._subject_rule(s, rec, cause=cause, run_id=run_id)

        if session is None:
            async with self.transaction() as s:
                return await go(s)
        return await go(session)

    async def live_on_subject(
        self, scope: str, subject_key: str, *, owner_user_id: str | None = None
    ) -> list[MemoryRecordView]:
        """The live, current records on one normalised subject (one owner's for personal), newest said first.

        An expired note is left out: it stays expired in the read model, nothing retires it.
        """
        q = (
            select(MemoryRecord.__table__)
            .where(R.scope == scope, R.subject_key == subject_key, R.status == "live", _same_owner(owner_user_id))
            .where(or_(R.review_by.is_(None), R.review_by > self.now()))
            .order_by(R.said_at.desc(), R.id)
        )
        async with self._read() as conn:
            return [_view(r) for r in await conn.execute(q)]

    async def notes_sharing_words(
        self, words: Sequence[str], *, exclude_id: str | None = None, limit: int = 50
    ) -> list[tuple[MemoryRecordView, int]]:
        """Live agent notes sharing index terms with ``words``, most shared first, with the count.

        A term in more than :data:`MATCH_WORD_POSTINGS` notes is left out, as in a turn's match:
        sharing it relates nothing, and grouping its postings took 190 ms a call at 65,536 notes
        with a word in every one (belief revision asks this for each note written: an admin's
        ``memory_write`` in a turn, each merge of a consolidation run).
        """
        wanted = list(dict.fromkeys(words))[:MAX_NOTE_TERMS]
        if self._common:
            wanted = self._not_common(wanted, MATCH_WORD_POSTINGS)
        if not wanted:
            return []
        T = MemoryTerm.__table__
        counts = select(T.c.term, func.count()).where(T.c.term.in_(wanted)).group_by(T.c.term)
        async with self._read() as conn:
            common = {term: int(n) for term, n in await conn.execute(counts) if n > MATCH_WORD_POSTINGS}
            for term, n in common.items():
                self._found_common(term, n)
            wanted = [w for w in wanted if w not in common]
            if not wanted:
                return []
            shared = (
                select(T.c.record_id, func.count().label("n"))
                .where(T.c.term.in_(wanted))
                .group_by(T.c.record_id)
                .subquery("shared")
            )
            q = (
                select(MemoryRecord.__table__, shared.c.n)
                .join(shared, shared.c.record_id == R.id)
                .where(R.status == "live", R.scope == "agent_notes")
                .where(or_(R.review_by.is_(None), R.review_by > self.now()))
                .order_by(shared.c.n.desc(), R.said_at.desc(), R.id)
                .limit(limit)
            )
            if exclude_id is not None:
                q = q.where(R.id != exclude_id)
            return [(_view(r), int(r.n)) for r in await conn.execute(q)]

    # ---- review: confirm, reject, retract -------------------------------------------------

    def _review(self, record_id: str, action: str, by: str, reason: str) -> MemoryReview:
        return MemoryReview(
            id="rw_" + secrets.token_hex(8), record_id=record_id, action=action, by_user_id=by, at=self.now(),
            reason=reason,
        )  # fmt: skip

    async def _locked(self, s: AsyncSession, record_id: str) -> MemoryRecordView:
        row = (await s.execute(_BY_ID_LOCKED, {"id": record_id})).first()
        if row is None:
            raise MemoryStoreError(f"no memory record {record_id!r}")
        return _view(row)

    async def confirm(
        self, decision: GateDecision, record_id: str, *, run_id: str | None = None, session: AsyncSession | None = None
    ) -> Added:
        """Make a quarantined (``unverified``) record live under the gate's ``confirm`` decision.

        The subject rule then applies by the record's own ``said_at``: a record
        said before the live value on its subject becomes history (superseded
        by it) rather than retiring the newer value. Who confirmed it is kept
        in ``memory_reviews``.

        Raises:
            MemoryStoreError: the decision is not a confirm write, the record is
                unknown, or it is not awaiting review.
        """
        if not isinstance(decision, GateDecision) or decision.source != "confirm" or decision.status != "live":
            raise MemoryStoreError(f"the gate did not allow this confirm: {getattr(decision, 'reason', decision)!r}")
        if session is None:
            async with self.transaction() as s:
                return await self._confirm(s, decision, record_id, run_id)
        return await self._confirm(session, decision, record_id, run_id)

    async def _confirm(self, s: AsyncSession, decision: GateDecision, record_id: str, run_id: str | None) -> Added:
        rec = await self._locked(s, record_id)
        if rec.status != "unverified":
            raise MemoryStoreError(f"memory record {record_id} is {rec.status}, not awaiting review")
        if rec.scope != decision.scope:
            raise MemoryStoreError(f"the confirm decision is for {decision.scope}, the record is {rec.scope}")
        await self._lock_subject(s, rec.scope, rec.owner_user_id, rec.subject_key)
        await s.execute(
            update(MemoryRecord)
            .where(MemoryRecord.id == record_id, MemoryRecord.status == "unverified")
            .values(status="live")
            .execution_options(synchronize_session=False)
        )
        if rec.scope == "agent_notes":
            s.add_all(_postings(rec))
        by = decision.principal.user_id or decision.principal.system_name or "unknown"
        s.add(self._review(record_id, "confirm", by, decision.reason))
        await s.flush()
        retired = await self._subject_rule(s, await self._reread(s, record_id), cause="confirm", run_id=run_id)
        return Added(await self._reread(s, record_id), retired)

    async def reject(self, decision: GateDecision, record_id: str, *, reason: str = "") -> MemoryRecordView:
        """Keep a quarantined record as ``rejected`` (never in a prompt, nothing deleted).

        ``decision`` is the gate's answer for ``confirm`` by the reviewer: the
        same authority decides both ways.

        Raises:
            MemoryStoreError: not allowed, unknown record, or not awaiting review.
        """
        if not isinstance(decision, GateDecision) or decision.source != "confirm" or not decision.writes:
            raise MemoryStoreError(f"the gate did not allow this review: {getattr(decision, 'reason', decision)!r}")
        async with self.transaction() as s:
            rec = await self._locked(s, record_id)
            if rec.status != "unverified":
                raise MemoryStoreError(f"memory record {record_id} is {rec.status}, not awaiting review")
            await s.execute(
                update(MemoryRecord)
                .where(MemoryRecord.id == record_id)
                .values(status="rejected")
                .execution_options(synchronize_session=False)
            )
            by = decision.principal.user_id or "unknown"
            s.add(self._review(record_id, "reject", by, reason or "rejected in review"))
            await s.flush()
            return await self._reread(s, record_id)

    async def prune_expired_postings(self, *, now: datetime | None = None, notes: int = 100) -> tuple[int, bool]:
        """Delete the index terms of up to ``notes`` notes past their review-by date; (how many, whether more are left).

        An expired note stays ``live`` (nothing changes a record's review-by; a fact still
        true is recorded again, and that retires it), and no prompt shows it: the match
        filters its postings out one by one. Each turn walked them all for its words, so a
        turn cost more with every note an organisation let expire (``bench/memory_prompt.py
        --expired``). The job worker calls this when idle. Only the derived index changes:
        the record, its history and its listing stay; an undo that brings a note back adds
        its terms again, and they go at the next prune if it is past its date.
        """
        at = now or self.now()
        async with self.transaction() as s:
            found = await s.execute(_EXPIRED_POSTINGS, {"now": at, "limit": notes + 1})
            ids = [r[0] for r in found]
            if ids:
                await s.execute(_DELETE_NOTES_POSTINGS, {"ids": ids[:notes]})
        return min(len(ids), notes), len(ids) > notes

    async def retract(self, record_id: str, *, by_user_id: str, reason: str) -> MemoryRecordView:
        """Retract a live agent note: a later event by a named admin; nothing is deleted.

        Authorization is the caller's (``memory.review.retract_note`` checks
        ``is_human_admin``).

        Raises:
            MemoryStoreError: unknown record, not an agent note, or not live.
        """
        if not reason.strip():
            raise MemoryStoreError("a retraction needs a reason")
        async with self.transaction() as s:
            rec = await self._locked(s, record_id)
            if rec.scope != "agent_notes":
                raise MemoryStoreError(f"memory record {record_id} is {rec.scope}; only agent_notes are retracted")
            if rec.status != "live":
                raise MemoryStoreError(f"memory record {record_id} is {rec.status}; only a live note is retracted")
            await s.execute(
                update(MemoryRecord)
                .where(MemoryRecord.id == record_id)
                .values(status="retracted")
                .execution_options(synchronize_session=False)
            )
            await s.execute(delete(MemoryTerm).where(MemoryTerm.record_id == record_id))
            s.add(self._review(record_id, "retract", by_user_id, reason.strip()))
            await s.flush()
            return await self._reread(s, record_id)

    async def reviews_for(self, record_id: str) -> list[ReviewView]:
        """Who confirmed, rejected or retracted this record, oldest first."""
        t = MemoryReview.__table__
        async with self._read() as conn:
            rows = await conn.execute(select(t).where(t.c.record_id == record_id).order_by(t.c.at, t.c.id))
            return [_review_view(r) for r in rows]

    # ---- revisions: list and undo ---------------------------------------------------------

    async def get_revision(self, revision_id: str) -> RevisionView | None:
        """One revision row, or None."""
        t = MemoryRevision.__table__
        async with self._read() as conn:
            row = (await conn.execute(select(t).where(t.c.id == revision_id))).first()
        return _rev_view(row) if row else None

    async def list_revisions(self, *, run_id: str | None = None, limit: int = 1000) -> list[RevisionView]:
        """Revision rows, newest first (one run's if ``run_id``)."""
        t = MemoryRevision.__table__
        q = select(t)
        if run_id is not None:
            q = q.where(t.c.run_id == run_id)
        q = q.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
        async with self._read() as conn:
            return [_rev_view(r) for r in await conn.execute(q)]

    async def undone_revisions(self) -> list[RevisionView]:
        """Every undone revision row: the vetoed pairs."""
        t = MemoryRevision.__table__
        async with self._read() as conn:
            return [_rev_view(r) for r in await conn.execute(select(t).where(t.c.undone_at.is_not(None)))]

    async def undo(self, *, by: str, revision_id: str | None = None, run_id: str | None = None) -> Undone:
        """Undo one revision row, or every row of a run, in one transaction.

        Each retired record returns to the status it had (``live``, back in the
        prompt); the replacing record is left in place; each row is marked
        undone and stands as a veto for its pair forever. Authorization is the
        caller's (``memory.revisions``).

        Raises:
            MemoryStoreError: unknown id or run, already undone, or the record has
                moved on since (nothing is changed then).
        """
        if (revision_id is None) == (run_id is None):
            raise MemoryStoreError("undo one revision id or one run id")
        t = MemoryRevision.__table__
        async with self.transaction() as s:
            q = select(t).with_for_update()
            q = q.where(t.c.id == revision_id) if revision_id is not None else q.where(t.c.run_id == run_id)
            rows = [_rev_view(r) for r in await s.execute(q.order_by(t.c.created_at.desc(), t.c.id.desc()))]
            what = f"revision {revision_id}" if revision_id is not None else f"run {run_id}"
            if not rows:
                raise MemoryStoreError(f"no {what}; see 'goclaw memory revisions'")
            pending = [r for r in rows if r.undone_at is None]
            if not pending:
                raise MemoryStoreError(f"{what} is already undone (its retirements stand as vetoes)")
            now = self.now()
            restored: list[MemoryRecordView] = []
            # Newest first: in a chain (a retired by b, b retired by c) each record is put back
            # before the one that replaced it is looked at.
            for rev in pending:
                rec = await self._locked(s, rev.retired_id)
                if rec.status != "superseded" or rec.superseded_by != rev.replacing_id:
                    raise MemoryStoreError(
                        f"cannot undo {rev.id}: record {rec.id} is {rec.status}"
                        + (f" (by {rec.superseded_by})" if rec.superseded_by else "")
                        + " since; nothing was changed"
                    )
                back = rev.prior_status or "live"
                await s.execute(
                    update(MemoryRecord)
                    .where(MemoryRecord.id == rec.id)
                    .values(status=back, superseded_by=None)
                    .execution_options(synchronize_session=False)
                )
                if back == "live" and rec.scope == "agent_notes":
                    s.add_all(_postings(rec))
                await s.execute(
                    update(MemoryRevision)
                    .where(MemoryRevision.id == rev.id, MemoryRevision.undone_at.is_(None))
                    .values(undone_at=now, undone_by=by)
                    .execution_options(synchronize_session=False)
                )
                await s.flush()
                restored.append(await self._reread(s, rec.id))
            done = [_rev_view(r) for r in await s.execute(select(t).where(t.c.id.in_([r.id for r in pending])))]
            return Undone(tuple(done), tuple(restored))

    # ---- reads ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self._engine.connect() as conn:
            yield conn

    async def get(self, record_id: str) -> MemoryRecordView | None:
        """One record by id, or None."""
        async with self._read() as conn:
            row = (await conn.execute(_BY_ID, {"id": record_id})).first()
        return _view(row) if row else None

    async def list_records(
        self,
        *,
        scope: str | None = None,
        owner_user_id: str | None = None,
        statuses: Iterable[str] | None = None,
        include_history: bool = False,
        limit: int = 500,
    ) -> list[MemoryRecordView]:
        """Records, newest said first: live only unless ``statuses`` or ``include_history`` say otherwise.

        Raises:
            MemoryStoreError: an unknown scope or status.
        """
        if scope is not None and scope not in SCOPES:
            raise MemoryStoreError(f"unknown scope {scope!r}: use one of {', '.join(SCOPES)}")
        wanted = tuple(statuses) if statuses is not None else (STATUSES if include_history else ("live",))
        bad = [x for x in wanted if x not in STATUSES]
        if bad:
            raise MemoryStoreError(f"unknown status {bad[0]!r}: use one of {', '.join(STATUSES)}")
        q = select(MemoryRecord.__table__).where(R.status.in_(wanted))
        if scope is not None:
            q = q.where(R.scope == scope)
        if owner_user_id is not None:
            q = q.where(R.owner_user_id == owner_user_id)
        elif scope is not None and scope != "personal":
            # True of every shared record (``_add`` stores them ownerless), and it lets the read seek
            # (scope, owner, status, said_at) newest first. On (scope) alone SQLite walked every live
            # record of every scope newest first to find these: the identity lines every prompt has
            # took 170 ms at 100,000 records (``bench/memory_prompt.py``).
            q = q.where(R.owner_user_id.is_(None))
        q = q.order_by(R.said_at.desc(), R.id).limit(limit)
        async with self._read() as conn:
            return [_view(r) for r in await conn.execute(q)]

    async def search(
        self,
        query: str,
        *,
        scopes: Sequence[str] = ("personal", "agent_notes"),
        owner_user_id: str | None = None,
        any_owner: bool = False,
        statuses: Iterable[str] | None = None,
        limit: int = 50,
    ) -> list[MemoryRecordView]:
        """Records whose subject or content share words with ``query``, history included.

        Personal records are searched only for ``owner_user_id`` (the asking
        person), unless ``any_owner`` (the operator's CLI). Best match first,
        then newest said.
        """
        words = list(dict.fromkeys(terms(query)))[:16]
        if not words:
            return []
        scope_conds: list[ColumnElement[bool]] = []
        for scope in scopes:
            if scope == "personal":
                if any_owner:
                    scope_conds.append(R.scope == "personal")
                elif owner_user_id:
                    scope_conds.append(and_(R.scope == "personal", R.owner_user_id == owner_user_id))
            else:
                scope_conds.append(R.scope == scope)
        if not scope_conds:
            return []
        haystack = func.lower(R.subject_key + " " + R.content)
        q = (
            select(MemoryRecord.__table__)
            .where(or_(*scope_conds), or_(*(haystack.contains(w, autoescape=True) for w in words)))
            .order_by(R.said_at.desc(), R.id)
            .limit(limit * 8)
        )
        if statuses is not None:
            q = q.where(R.status.in_(tuple(statuses)))
        async with self._read() as conn:
            rows = [_view(r) for r in await conn.execute(q)]

        def hits(v: MemoryRecordView) -> int:
            have = set(terms(v.subject + " " + v.content))
            return sum(1 for w in words if w in have)

        ranked = sorted(rows, key=lambda v: (-hits(v), -v.said_at.timestamp(), v.id))
        return ranked[:limit]

    async def live_notes(self, *, now: datetime | None = None, limit: int = 500) -> list[MemoryRecordView]:
        """Current operational notes: live agent_notes not past their review-by date, newest first.

        Consolidation reads every one (``limit=1_000_000``) on each run, every five minutes, on
        a thread of the serving process: on the raw driver when the store has one, the rows are
        decoded as the turn's candidates are (``_row_view``), not through SQLAlchemy's result
        processing, which took 257 ms of that thread's CPU at 10,000 notes.
        """
        return await self._record_views(_live_notes_statement(), {"now": now or self.now(), "limit": limit})

    async def live_note_ids(self, *, now: datetime | None = None, limit: int = 500) -> list[str]:
        """The ids ``live_notes`` would answer, in its order: all consolidation reads of a settled store."""
        params = {"now": now or self.now(), "limit": limit}
        if self._raw is None:
            async with self._read() as conn:
                return list((await conn.execute(_live_notes_statement(True), params)).scalars())
        return [r[0] for r in await self._raw_select(_live_notes_statement(True), params, (None,))]

    async def personal_for(self, user_id: str, *, limit: int = 500) -> list[MemoryRecordView]:
        """One person's live personal records, newest first (belief revision's candidates for a personal write)."""
        return await self._record_views(_personal_statement(limit), {"owner": user_id})

    async def _record_views(self, statement: Any, params: Mapping[str, Any]) -> list[MemoryRecordView]:
        """The records a select of every ``memory_records`` column finds, on the raw driver when the store has one."""
        if self._raw is None:
            async with self._read() as conn:
                return [_view(r) for r in await conn.execute(statement, params)]
        return [_row_view(r) for r in await self._raw_select(statement, params, _RECORD_KINDS)]

    async def _raw_select(
        self, statement: Any, params: Mapping[str, Any], kinds: Sequence[str | None]
    ) -> list[tuple[Any, ...]]:
        """``statement`` on the raw driver, compiled once per shape (``_driver_sql``), values decoded by ``kinds``."""
        assert self._raw is not None
        compiled = _driver_sql(self._engine.dialect, statement, params)
        return await self._raw.select(compiled.sql, compiled.args(params), kinds)

    async def revisions_for(self, record_id: str) -> list[RevisionView]:
        """Every revision row that retired this record or was retired by it, oldest first."""
        t = MemoryRevision.__table__
        q = (
            select(t)
            .where(or_(t.c.retired_id == record_id, t.c.replacing_id == record_id))
            .order_by(t.c.created_at, t.c.id)
        )
        async with self._read() as conn:
            return [_rev_view(r) for r in await conn.execute(q)]

    async def records_by_id(self, ids: Sequence[str]) -> list[MemoryRecordView]:
        """The records with these ids, whatever their status, in no particular order (unknown ids: none)."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return []
        if self._raw is not None:
            return await self._raw_records(ids)
        out: list[MemoryRecordView] = []
        async with self._read() as conn:
            for start in range(0, len(ids), _ID_BUCKETS[-1]):
                found = await conn.execute(_records_statement(), {"ids": ids[start : start + _ID_BUCKETS[-1]]})
                out.extend(_view(r) for r in found)
        return out

    async def _raw_records(self, ids: Sequence[str]) -> list[MemoryRecordView]:
        """Whole records by id on the raw driver, a few statement shapes (``_ID_BUCKETS``) for any number of ids."""
        assert self._raw is not None
        out: list[MemoryRecordView] = []
        for start in range(0, len(ids), _ID_BUCKETS[-1]):
            chunk = list(ids[start : start + _ID_BUCKETS[-1]])
            size = next(b for b in _ID_BUCKETS if b >= len(chunk))
            sql = _records_sql(self._engine.dialect, size)
            fetched = await self._raw.select(sql, chunk + [chunk[-1]] * (size - len(chunk)), _RECORD_KINDS)
            out.extend(_row_view(r) for r in fetched)
        return out

    async def _candidate_rows(
        self, with_words: bool, with_user: bool, n_words: int, params: dict[str, Any], matched_limit: int
    ) -> list[tuple[Any, float, str]]:
        """The rows of ``_candidates_statement`` as (record, score, part): on the raw driver when given one.

        A ``common`` row is (the word, its count, "common"): a word left out of the match.

        The statement gives each candidate's id, status and superseded_by; the rest of a record
        is fixed at insert, so it is read (``_records_statement``) only for ids not seen before.
        """
        rows: list[tuple[Any, ...]]
        if self._raw is None:
            async with self._read() as conn:
                statement = _candidates_statement(with_words, with_user, matched_limit)
                rows = [tuple(r) for r in await conn.execute(statement, params)]
                missing = self._missing(rows)
                if missing:
                    found = await conn.execute(_records_statement(), {"ids": missing})
                    self._keep(_view(r) for r in found)
        else:
            sql, names, fixed = _candidates_sql(self._engine.dialect, with_words, with_user, n_words, matched_limit)
            values = fixed | params | {f"words_{i}": w for i, w in enumerate(params.get("words", ()), 1)}
            rows = await self._raw.select(sql, [values[n] for n in names], _CANDIDATE_KINDS)
            self._keep(await self._raw_records(self._missing(rows)))
        out = []
        for rid, status, superseded_by, score, part in rows:
            if part == "common":
                out.append((rid, score, part))  # a word left out, and its count
                continue
            view = self._views.get(rid)
            if view is None:
                continue  # gone between the two reads (records are never deleted; kept for safety)
            self._views.move_to_end(rid)
            if view.status != status or view.superseded_by != superseded_by:
                view = replace(view, status=status, superseded_by=superseded_by)
                self._views[rid] = view
            out.append((view, score, part))
        while len(self._views) > _KEPT_VIEWS:
            self._views.popitem(last=False)
        return out

    def _not_common(self, words: list[str], match_word_postings: int) -> list[str]:
        """``words`` less those this store found in more than ``match_word_postings`` notes lately."""
        at = time.monotonic()
        kept = []
        for w in words:
            found = self._common.get(w)
            if found is not None:
                if found[0] <= at:
                    del self._common[w]  # found long enough ago: counted again
                elif found[1] > match_word_postings:
                    continue
            kept.append(w)
        return kept

    def _found_common(self, word: str, count: int) -> None:
        if len(self._common) >= _COMMON_WORDS_KEPT:
            self._common.clear()
        self._common[word] = (time.monotonic() + COMMON_WORD_TTL_S, count)

    def _missing(self, rows: Sequence[Sequence[Any]]) -> list[str]:
        return list(dict.fromkeys(r[0] for r in rows if r[4] != "common" and r[0] not in self._views))

    def _keep(self, views: Iterable[MemoryRecordView]) -> None:
        for v in views:
            self._views[v.id] = v

    async def prompt_candidates(
        self,
        *,
        user_id: str | None,
        query_terms: Sequence[str],
        now: datetime,
        matched_limit: int = 48,
        recent_limit: int = 24,
        personal_limit: int = 200,
        match_word_postings: int = MATCH_WORD_POSTINGS,
    ) -> PromptCandidates:
        """The bounded candidate set a turn's prompt chooses from, in ONE statement.

        Three parts, each an indexed query with its own limit, joined by UNION ALL
        (on SQLite most of a read's cost is the round trip, not the query); it runs on the
        hot store's driver (``_candidates_sql``):

        - ``match``: live, current notes sharing terms with the conversation, scored
          in SQL as the sum of ``1/df`` over the shared terms (an idf weight: rare
          words count more), ranked and limited on ``memory_terms`` alone (each
          posting carries its note's ``said_at`` and ``review_by``, on one covering
          index), then joined to the records by primary key. A term in more than
          ``match_word_postings`` notes (:data:`MATCH_WORD_POSTINGS`) is left out,
          and this store leaves it out of its next statements for a while;
        - ``recent``: the newest live, current notes (``said_at`` order of the
          ``(scope, owner_user_id, status, said_at)`` index);
        - ``personal``: the person's own live personal records, newest first (same index).

        The statement answers each candidate's id, status and superseded_by (all that
        changes after insert); the store keeps the views it has built (``_KEPT_VIEWS``,
        least recently used dropped) and reads whole records, in a second statement,
        only for ids it has not seen.
        """
        words = list(dict.fromkeys(query_terms))
        if self._common:
            words = self._not_common(words, match_word_postings)
        params: dict[str, Any] = {"now": now, "recent_limit": recent_limit}
        if words:
            params.update(words=words, match_word_postings=match_word_postings)
        if user_id:
            params.update(user_id=user_id, personal_limit=personal_limit)
        matched: list[tuple[MemoryRecordView, float]] = []
        recent: list[MemoryRecordView] = []
        personal: list[MemoryRecordView] = []
        rows = await self._candidate_rows(bool(words), bool(user_id), len(words), params, matched_limit)
        for view, score, part in rows:
            if part == "match":
                matched.append((view, float(score)))
            elif part == "recent":
                recent.append(view)
            elif part == "common":
                self._found_common(view, int(score))
            else:
                personal.append(view)
        # UNION ALL keeps no order across parts; each part's own order is restored here.
        matched.sort(key=lambda p: (-p[1], -p[0].said_at.timestamp(), p[0].id))
        recent.sort(key=lambda v: (-v.said_at.timestamp(), v.id))
        personal.sort(key=lambda v: (-v.said_at.timestamp(), v.id))
        return PromptCandidates(matched, recent, personal)
