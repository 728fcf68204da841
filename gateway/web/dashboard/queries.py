"""The dashboard's reads: keyset pages over memory, people, the audit and turns (read-only SQL).

Writes never happen here: every action goes through the pairing store and
memory's functions (see ``base.act``). Pages are keyset-paged on indexed
columns, so page 2,000 costs what page 1 costs, at 100,000 records as at 100.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from msgspec import Struct
from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.models import Job, Message, TurnRecord
from gateway.web.dashboard.base import PAGE_SIZE, DashError, Page, decode_cursor, encode_cursor, keyset_page
from memory.models import SCOPES, STATUSES, MemoryRecord, MemoryRevision
from memory.store import MemoryRecordView, RevisionView, _rev_view, _view
from memory.words import terms
from pairing.models import Identity, PairingAudit, User

R = MemoryRecord.__table__.c
MAX_SEARCH_WORDS = 8
TIMELINE_LIMIT = 300
SEARCH_WINDOW = 10_000


class MemoryFilter(Struct, frozen=True):
    """What the memory browser shows."""

    scope: str = ""
    owner: str = ""
    status: str = ""
    q: str = ""

    def check(self) -> MemoryFilter:
        """Itself, or a 400 naming the bad value."""
        if self.scope and self.scope not in SCOPES:
            raise DashError(400, f"unknown scope {self.scope!r}: use one of {', '.join(SCOPES)}")
        if self.status and self.status not in STATUSES:
            raise DashError(400, f"unknown status {self.status!r}: use one of {', '.join(STATUSES)}")
        if len(self.q) > 200 or len(self.owner) > 40:
            raise DashError(400, "the search is longer than 200 characters (or the owner id than 40)")
        return self


async def memory_page(
    engine: AsyncEngine, f: MemoryFilter, *, after: str | None, now: datetime, limit: int = PAGE_SIZE
) -> Page:
    """Records newest said first, filtered, one keyset page (``said_at``, ``id`` descending).

    A word search is a substring match no index serves, so one page looks at
    most ``SEARCH_WINDOW`` records (newest first, from the cursor on): a rare
    word costs the same bounded scan as a common one, and "next page" goes on
    where the window stopped (``Page.scanned_only`` says a page is short for that).
    """
    conds: list[Any] = []
    if f.scope:
        conds.append(R.scope == f.scope)
    if f.owner:
        conds.append(R.owner_user_id == f.owner)
    if f.status == "expired":
        # Expired is a live note past its review-by date (nothing is rewritten when it passes).
        conds += [R.status == "live", R.review_by.is_not(None), R.review_by <= now]
    elif f.status == "live":
        conds += [R.status == "live", or_(R.review_by.is_(None), R.review_by > now)]
    elif f.status:
        conds.append(R.status == f.status)
    cursor = decode_cursor(after, (datetime, str))
    if cursor is not None:
        at, rid = cursor
        # "said_at <= at" first: an index range the planner uses; the OR only breaks ties.
        conds += [R.said_at <= at, or_(R.said_at < at, R.id < rid)]
    order = (R.said_at.desc(), R.id.desc())
    words = list(dict.fromkeys(terms(f.q)))[:MAX_SEARCH_WORDS]
    if f.q.strip() and not words:
        words = [f.q.strip().lower()]
    q = select(MemoryRecord.__table__).where(*conds).order_by(*order)
    async with engine.connect() as conn:
        if not words:
            rows = [_view(r) for r in await conn.execute(q.limit(limit + 1))]
            return keyset_page(rows, limit, lambda r: (r.said_at, r.id))
        # The window's far edge, on the (said_at, id) index: the scan below stops there.
        edge = (
            await conn.execute(
                select(R.said_at, R.id).where(*conds).order_by(*order).offset(SEARCH_WINDOW - 1).limit(1)
            )
        ).first()
        haystack = func.lower(R.subject_key + " " + R.content)
        q = q.where(*(haystack.contains(x, autoescape=True) for x in words))  # every word must appear
        if edge is not None:
            q = q.where(R.said_at >= edge.said_at, or_(R.said_at > edge.said_at, R.id >= edge.id))
        rows = [_view(r) for r in await conn.execute(q.limit(limit + 1))]
    if len(rows) > limit or edge is None:
        return keyset_page(rows, limit, lambda r: (r.said_at, r.id))
    return Page(rows, encode_cursor((edge.said_at, edge.id)), scanned_only=SEARCH_WINDOW)


async def get_record(engine: AsyncEngine, record_id: str) -> MemoryRecordView | None:
    """One record."""
    async with engine.connect() as conn:
        row = (await conn.execute(select(MemoryRecord.__table__).where(R.id == record_id))).first()
    return _view(row) if row else None


async def records_by_id(engine: AsyncEngine, ids: list[str]) -> dict[str, MemoryRecordView]:
    """Records by id (those that exist)."""
    if not ids:
        return {}
    async with engine.connect() as conn:
        rows = await conn.execute(select(MemoryRecord.__table__).where(R.id.in_(ids)))
        return {v.id: v for v in (_view(r) for r in rows)}


class TimelineEntry(Struct, frozen=True):
    """One step of a subject's timeline: a value it had, and the revisions that retired or restored it."""

    record: MemoryRecordView
    revisions: list[RevisionView]


async def subject_timeline(engine: AsyncEngine, record: MemoryRecordView) -> list[TimelineEntry]:
    """Every value ``record``'s subject has had, in ``said_at`` order, each with its revision rows.

    The subject is (scope, owner, subject key), the same the subject rule uses;
    records that a revision links to the subject's records (a belief revision
    or a merge across subjects) are shown in their place too.
    """
    q = select(MemoryRecord.__table__).where(R.scope == record.scope, R.subject_key == record.subject_key)
    q = q.where(R.owner_user_id.is_(None) if record.owner_user_id is None else R.owner_user_id == record.owner_user_id)
    t = MemoryRevision.__table__
    async with engine.connect() as conn:
        recs = {v.id: v for v in (_view(r) for r in await conn.execute(q.limit(TIMELINE_LIMIT)))}
        recs.setdefault(record.id, record)
        ids = list(recs)
        revs = [
            _rev_view(r)
            for r in await conn.execute(
                select(t)
                .where(or_(t.c.retired_id.in_(ids), t.c.replacing_id.in_(ids)))
                .order_by(t.c.created_at, t.c.id)
                .limit(TIMELINE_LIMIT)
            )
        ]
        linked = {x for r in revs for x in (r.retired_id, r.replacing_id) if x and x not in recs}
        if linked:
            for row in await conn.execute(select(MemoryRecord.__table__).where(R.id.in_(list(linked)))):
                v = _view(row)
                recs[v.id] = v
    by_retired: dict[str, list[RevisionView]] = {}
    for rev in revs:
        by_retired.setdefault(rev.retired_id, []).append(rev)
    ordered = sorted(recs.values(), key=lambda v: (v.said_at, v.recorded_at, v.id))
    return [TimelineEntry(v, by_retired.get(v.id, [])) for v in ordered]


async def revisions_of(engine: AsyncEngine, *, revision_id: str | None, run_id: str | None) -> list[RevisionView]:
    """The revision row, or every row of a run, newest first."""
    t = MemoryRevision.__table__
    q = select(t)
    q = q.where(t.c.id == revision_id) if revision_id else q.where(t.c.run_id == run_id)
    async with engine.connect() as conn:
        return [_rev_view(r) for r in await conn.execute(q.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(500))]


async def memory_counts(engine: AsyncEngine) -> dict[str, int]:
    """How many records per stored status."""
    async with engine.connect() as conn:
        rows = await conn.execute(select(R.status, func.count()).group_by(R.status))
        return {str(s): int(n) for s, n in rows}


# ---- people and audit --------------------------------------------------------------------------


class PersonRow(Struct, frozen=True):
    """A person on the people page."""

    id: str
    display_name: str
    role: str
    created_at: datetime
    identities: list[str]


async def people_page(engine: AsyncEngine, *, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """People, oldest first, with their linked identities: one keyset page."""
    u = User.__table__.c
    q = select(User.__table__)
    cursor = decode_cursor(after, (datetime, str))
    if cursor is not None:
        q = q.where(u.created_at >= cursor[0], or_(u.created_at > cursor[0], u.id > cursor[1]))
    q = q.order_by(u.created_at, u.id).limit(limit + 1)
    async with engine.connect() as conn:
        users = list(await conn.execute(q))
        ids = [r.id for r in users]
        idents: dict[str, list[str]] = {}
        if ids:
            i = Identity.__table__.c
            for row in await conn.execute(select(i.user_id, i.channel, i.platform_user_id).where(i.user_id.in_(ids))):
                idents.setdefault(row.user_id, []).append(f"{row.channel}:{row.platform_user_id}")
    rows = [PersonRow(r.id, r.display_name, r.role, r.created_at, sorted(idents.get(r.id, []))) for r in users]
    return keyset_page(rows, limit, lambda p: (p.created_at, p.id))


class AuditRow(Struct, frozen=True):
    """One admin-command audit row."""

    id: int
    at: datetime
    channel: str
    actor: str
    action: str
    outcome: str
    detail: str


async def audit_page(engine: AsyncEngine, *, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """The admin-command audit, newest first: one keyset page."""
    a = PairingAudit.__table__.c
    q = select(PairingAudit.__table__)
    cursor = decode_cursor(after, (int,))
    if cursor is not None:
        q = q.where(a.id < cursor[0])
    async with engine.connect() as conn:
        rows = [
            AuditRow(r.id, r.at, r.channel, r.actor, r.action, r.outcome, r.detail)
            for r in await conn.execute(q.order_by(a.id.desc()).limit(limit + 1))
        ]
    return keyset_page(rows, limit, lambda r: (r.id,))


# ---- jobs and turns ----------------------------------------------------------------------------


async def job_counts(engine: AsyncEngine) -> dict[str, int]:
    """Durable jobs per status (pending, running, done, failed = parked)."""
    j = Job.__table__.c
    async with engine.connect() as conn:
        return {str(s): int(n) for s, n in await conn.execute(select(j.status, func.count()).group_by(j.status))}


class TurnRow(Struct, frozen=True):
    """A stored turn explanation, with the message it answered."""

    id: int
    session_id: str
    message_id: str
    reply_message_id: str
    at: datetime
    speaker_user_id: str | None
    stored_role: str | None
    memory: list[dict[str, Any]]
    sections: dict[str, int]
    model_calls: dict[str, Any]
    text: str
    reply: str


def _turn_query() -> Any:
    t = TurnRecord.__table__
    m = Message.__table__.alias("m")
    r = Message.__table__.alias("r")
    return (
        select(t, m.c.text.label("text"), r.c.text.label("reply"))
        .select_from(
            t.outerjoin(m, and_(m.c.session_id == t.c.session_id, m.c.platform_message_id == t.c.message_id)).outerjoin(
                r, and_(r.c.session_id == t.c.session_id, r.c.platform_message_id == t.c.reply_message_id)
            )
        )
        .order_by(t.c.id.desc())
    )


def _turn_row(r: Any) -> TurnRow:
    return TurnRow(
        r.id,
        r.session_id,
        r.message_id,
        r.reply_message_id,
        r.at,
        r.speaker_user_id,
        r.stored_role,
        list(r.memory or []),
        dict(r.sections or {}),
        dict(r.model_calls or {}),
        r.text or "",
        r.reply or "",
    )


async def turns_page(engine: AsyncEngine, *, session_id: str | None, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """Answered turns, newest first (one session's if given): one keyset page."""
    t = TurnRecord.__table__.c
    q = _turn_query()
    if session_id:
        q = q.where(t.session_id == session_id)
    cursor = decode_cursor(after, (int,))
    if cursor is not None:
        q = q.where(t.id < cursor[0])
    async with engine.connect() as conn:
        rows = [_turn_row(r) for r in await conn.execute(q.limit(limit + 1))]
    return keyset_page(rows, limit, lambda r: (r.id,))


async def get_turn(engine: AsyncEngine, turn_id: int) -> TurnRow | None:
    """One turn explanation."""
    async with engine.connect() as conn:
        row = (await conn.execute(_turn_query().where(TurnRecord.__table__.c.id == turn_id))).first()
    return _turn_row(row) if row else None


async def turn_ids_by_reply(engine: AsyncEngine, session_id: str, reply_ids: Collection[str]) -> dict[str, int]:
    """The explanation id of each of ``reply_ids`` (a session's replies' message ids) that has one."""
    if not reply_ids:
        return {}
    t = TurnRecord.__table__.c
    # Found by reply_message_id alone and kept to the session here: with the session in the WHERE,
    # SQLite (no statistics) seeks ix_turn_records_session and walks every turn of the session.
    q = select(t.session_id, t.reply_message_id, t.id).where(t.reply_message_id.in_(sorted(set(reply_ids))))
    async with engine.connect() as conn:
        rows = await conn.execute(q.order_by(t.id))  # a reply's later record wins
        return {str(rid): int(i) for sid, rid, i in rows if sid == session_id}
