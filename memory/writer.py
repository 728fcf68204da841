"""The writer: the way into memory that always asks the gate first.

``MemoryWriter.write(principal, scope, source, ...)`` calls
:func:`memory.gate.decide` and writes only what it allows. ``batch()`` groups
several writes into one transaction (a trimmed slice's extraction is committed
whole or not at all); ``batch(rollback=True)`` is a dry run. ``confirm`` and
``reject`` (review of quarantined records) ask the gate for source ``confirm``
too: every path that changes what memory holds goes through it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta

from msgspec import Struct
from sqlalchemy.ext.asyncio import AsyncSession

from memory.gate import NO_EXTRA_WRITERS, OPERATIONAL_SCOPE, GateDecision, WriteAccess, decide
from memory.personal import personal_data
from memory.store import MAX_REVIEW_DAYS, MemoryRecordView, MemoryStore, MemoryStoreError, Merge
from pairing.principal import Principal


class WriteResult(Struct, frozen=True):
    """The gate's decision and, when it allowed a write, the record and what it retired."""

    decision: GateDecision
    record: MemoryRecordView | None = None
    retired: tuple[str, ...] = ()
    duplicate: bool = False

    @property
    def written(self) -> bool:
        """True when a new record was written (not when the same fact was already known)."""
        return self.record is not None and not self.duplicate


class MemoryWriter:
    """Writes memory through the one gate.

    Args:
        store: The memory store.
        write_access: The operator's ``memory.write_access``.
        notes_review_days: When agent_notes come up for review when the writer gives no
            review-by (``@notes:``, extraction, relearn): 1 to 90 days, or ValueError. Never clamped.
    """

    def __init__(
        self,
        store: MemoryStore,
        *,
        write_access: WriteAccess = NO_EXTRA_WRITERS,
        notes_review_days: int = MAX_REVIEW_DAYS,
    ) -> None:
        self.store = store
        self.write_access = write_access
        if not 1 <= notes_review_days <= MAX_REVIEW_DAYS:
            # Seed 001: "at most 90 days out" -- refused, not silently clamped.
            raise ValueError(f"notes_review_days is {notes_review_days}; use 1 to {MAX_REVIEW_DAYS}")
        self.notes_review_days = notes_review_days

    def default_review_by(self) -> datetime:
        """The review-by of a note whose writer gave none: ``notes_review_days`` from now."""
        return self.store.now() + timedelta(days=self.notes_review_days)

    def decide(
        self,
        principal: Principal,
        scope: str,
        source: str,
        *,
        owner_user_id: str | None = None,
        trusted: bool | None = None,
        content: str | None = None,
    ) -> GateDecision:
        """The gate's answer with this writer's ``write_access`` (nothing is written).

        ``content``, when given for agent_notes, is checked for personal data
        (``memory.personal.personal_data``), an input to the gate's decision.
        """
        found = personal_data(content) if content is not None and scope == OPERATIONAL_SCOPE else None
        return decide(
            principal,
            scope,
            source,
            write_access=self.write_access,
            owner_user_id=owner_user_id,
            trusted=trusted,
            personal_data=found,
        )

    async def write(
        self,
        principal: Principal,
        scope: str,
        source: str,
        *,
        subject: str,
        content: str,
        said_at: datetime,
        owner_user_id: str | None = None,
        trusted: bool | None = None,
        session_id: str | None = None,
        evidence: Sequence[str] = (),
        run_id: str | None = None,
        merge: Merge | None = None,
        review_by: datetime | None = None,
        applies_to: Sequence[str] = (),
        citations: Sequence[str] = (),
    ) -> WriteResult:
        """Ask the gate, then write (in its own transaction) what it allows."""
        async with self.batch() as batch:
            return await batch.write(
                principal,
                scope,
                source,
                subject=subject,
                content=content,
                said_at=said_at,
                owner_user_id=owner_user_id,
                trusted=trusted,
                session_id=session_id,
                evidence=evidence,
                run_id=run_id,
                merge=merge,
                review_by=review_by,
                applies_to=applies_to,
                citations=citations,
            )

    @asynccontextmanager
    async def batch(self, *, rollback: bool = False) -> AsyncIterator[WriteBatch]:
        """Several gated writes in one transaction: all committed, or none (always none if ``rollback``)."""
        async with self.store.transaction(rollback=rollback) as session:
            yield WriteBatch(self, session)

    async def confirm(self, principal: Principal, record_id: str, *, run_id: str | None = None) -> WriteResult:
        """Ask the gate (source ``confirm``), then make a quarantined record live.

        The record keeps its own ``said_at``: confirmed, it is ordered by when it
        was said, so an older one becomes history instead of retiring a newer value.

        Raises:
            MemoryStoreError: unknown record, or not awaiting review.
        """
        record = await self.store.get(record_id)
        if record is None:
            raise MemoryStoreError(f"no memory record {record_id!r}")
        decision = self.decide(principal, record.scope, "confirm")
        if not decision.writes:
            return WriteResult(decision)
        added = await self.store.confirm(decision, record_id, run_id=run_id)
        return WriteResult(decision, added.record, added.retired)

    async def reject(self, principal: Principal, record_id: str, *, reason: str = "") -> WriteResult:
        """Ask the gate (the reviewer's authority is the ``confirm`` one), then keep the record as ``rejected``.

        Raises:
            MemoryStoreError: unknown record, or not awaiting review.
        """
        record = await self.store.get(record_id)
        if record is None:
            raise MemoryStoreError(f"no memory record {record_id!r}")
        decision = self.decide(principal, record.scope, "confirm")
        if not decision.writes:
            return WriteResult(decision)
        return WriteResult(decision, await self.store.reject(decision, record_id, reason=reason))


class WriteBatch:
    """Gated writes inside one transaction (from :meth:`MemoryWriter.batch`)."""

    def __init__(self, writer: MemoryWriter, session: AsyncSession) -> None:
        self._writer = writer
        self._session = session

    @property
    def write_access(self) -> WriteAccess:
        """The operator's ``memory.write_access``."""
        return self._writer.write_access

    @property
    def session(self) -> AsyncSession:
        """This batch's transaction, for a caller that records its own event with the writes (an identity decision)."""
        return self._session

    def decide(
        self,
        principal: Principal,
        scope: str,
        source: str,
        *,
        owner_user_id: str | None = None,
        trusted: bool | None = None,
        content: str | None = None,
    ) -> GateDecision:
        """The gate's answer (nothing is written)."""
        return self._writer.decide(
            principal, scope, source, owner_user_id=owner_user_id, trusted=trusted, content=content
        )

    async def write(
        self,
        principal: Principal,
        scope: str,
        source: str,
        *,
        subject: str,
        content: str,
        said_at: datetime,
        owner_user_id: str | None = None,
        trusted: bool | None = None,
        session_id: str | None = None,
        evidence: Sequence[str] = (),
        run_id: str | None = None,
        merge: Merge | None = None,
        review_by: datetime | None = None,
        applies_to: Sequence[str] = (),
        citations: Sequence[str] = (),
    ) -> WriteResult:
        """Ask the gate, then write what it allows in this batch's transaction.

        An agent note with no ``review_by`` gets the writer's default
        (``notes_review_days`` from now); one that is given is checked by the
        store as it is (in the future, at most 90 days out), never clamped.
        """
        decision = self.decide(principal, scope, source, owner_user_id=owner_user_id, trusted=trusted, content=content)
        if not decision.writes:
            return WriteResult(decision)
        added = await self._writer.store.add(
            decision,
            subject=subject,
            content=content,
            said_at=said_at,
            session_id=session_id,
            evidence=evidence,
            run_id=run_id,
            review_by=review_by or (self._writer.default_review_by() if scope == OPERATIONAL_SCOPE else None),
            applies_to=applies_to,
            citations=citations,
            merge=merge,
            session=self._session,
        )
        return WriteResult(decision, added.record, added.retired, added.duplicate)
