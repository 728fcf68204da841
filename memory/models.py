"""Tables of the memory store: records, their retirements, and the live-notes term index."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from pairing.models import UTCDateTime

SCOPES: tuple[str, ...] = ("personal", "agent_notes", "global", "agent_config")
STATUSES: tuple[str, ...] = ("live", "superseded", "unverified", "rejected", "retracted", "expired")
SOURCES: tuple[str, ...] = ("live", "relearn", "memory_write", "directive", "confirm", "consolidate", "decision")
VIAS: tuple[str, ...] = ("subject_rule", "belief_revision", "consolidation")
CAUSES: tuple[str, ...] = ("live", "relearn", "confirm", "revise", "consolidate", "decision")


class MemoryBase(DeclarativeBase):
    """Declarative base of the memory tables."""


class MemoryRecord(MemoryBase):
    """One thing the agent remembers, with who taught it and when it was said.

    Append-only: after insert only ``status`` and ``superseded_by`` change, and
    every retirement is a row in ``memory_revisions``.
    """

    __tablename__ = "memory_records"
    __table_args__ = (
        # Prompt rendering and listing: one person's live records, newest first.
        Index("ix_memory_records_scope_owner_status", "scope", "owner_user_id", "status", "said_at"),
        # The subject rule and the write's subject read: one owner's records on one subject (the
        # owner is NULL for the shared scopes). Without the owner every write read each owner's
        # history on a shared subject ("timezone", "conversation summary"); see migration 0018.
        Index("ix_memory_records_subject", "scope", "subject_key", "owner_user_id", "status", "said_at"),
        # The dashboard's keyset pages: newest said first, across scopes or within one status.
        Index("ix_memory_records_said_at", "said_at", "id"),
        Index("ix_memory_records_status_said_at", "status", "said_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    owner_user_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    subject: Mapped[str] = mapped_column(String(200))
    subject_key: Mapped[str] = mapped_column(String(200))
    content: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    said_at: Mapped[datetime] = mapped_column(UTCDateTime())
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())
    review_by: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    source: Mapped[str] = mapped_column(String(16))
    author_user_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    author_role: Mapped[str | None] = mapped_column(String(32), nullable=True)
    session_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    evidence: Mapped[list[Any]] = mapped_column(JSON)
    run_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    superseded_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    status_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why the gate wrote it ``unverified`` (quarantined for review), when it did."""
    applies_to: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    """agent_notes: the SOP names / tags the fact is for (None: every conversation and run)."""
    citations: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    """What the writer cited (free text from a model or person; ``evidence`` is what the host stamped)."""


class MemoryRevision(MemoryBase):
    """One retirement: which record replaced which, why, how it was decided, and by which run.

    ``undone_at``/``undone_by`` are set by undo; an undone row is a veto for
    that pair of records. ``prior_status`` is what the retired record was
    before (``live`` when None), so an undo puts it back exactly there.
    """

    __tablename__ = "memory_revisions"
    __table_args__ = (
        # The undone rows, the vetoes every distillation reads: few among a row for every retirement.
        # Migration 0021 makes it WHERE undone_at IS NOT NULL. Not said here: the schema is Alembic's,
        # and the dialects' where= options would load both dialects' modules at import (a plain
        # SQLite start loads no PostgreSQL code: tests/gateway/test_startup_imports.py).
        Index("ix_memory_revisions_undone", "undone_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    retired_id: Mapped[str] = mapped_column(ForeignKey("memory_records.id"), index=True)
    replacing_id: Mapped[str | None] = mapped_column(ForeignKey("memory_records.id"), nullable=True, index=True)
    reason: Mapped[str] = mapped_column(Text)
    via: Mapped[str] = mapped_column(String(24))
    cause: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    judge_model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    prompt_version: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    undone_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    undone_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    prior_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """The retired record's status before this retirement (what an undo returns it to); None means live."""


REVIEW_ACTIONS: tuple[str, ...] = ("confirm", "reject", "retract")


class MemoryReview(MemoryBase):
    """A person's decision on one record: confirm or reject a quarantined one, retract a note.

    Append-only: the record's status says where it stands, this row says who
    decided it, when and why (policy: "A retraction by a named admin is a later
    event; nothing is deleted").
    """

    __tablename__ = "memory_reviews"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    record_id: Mapped[str] = mapped_column(ForeignKey("memory_records.id"), index=True)
    action: Mapped[str] = mapped_column(String(16))
    by_user_id: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text)


class MemoryTerm(MemoryBase):
    """The words of each live, current agent note: a derived index for choosing notes by relevance.

    Kept in the same transaction as the record's status: a note's terms are
    added when it is written live and removed when it leaves ``live``. A note
    past its review-by date stays ``live`` (its record is not changed; a fact
    still true is recorded again), and the job worker deletes its terms when it is
    idle (``MemoryStore.prune_expired_postings``): each turn's match walks the
    postings of its words, and an organisation's expired notes only grow. It holds
    nothing that is not in ``memory_records``.

    Each posting also carries its note's ``said_at`` and ``review_by`` (both
    fixed when the note is written: after insert only a record's ``status`` and
    ``superseded_by`` change), so the prompt's match ranks and bounds notes from
    postings alone, on one covering index, and reads only the chosen records.
    """

    __tablename__ = "memory_terms"
    __table_args__ = (
        # The prompt's match: a term's postings with what ranking and the current-note filter read.
        Index("ix_memory_terms_rank", "term", "record_id", "said_at", "review_by"),
        # The job worker's prune: the postings of notes past their review-by date (migration 0022).
        Index("ix_memory_terms_review_by", "review_by"),
    )

    term: Mapped[str] = mapped_column(String(64), primary_key=True)
    record_id: Mapped[str] = mapped_column(
        ForeignKey("memory_records.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    said_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """The note's ``said_at`` (ties in the match's score go newest first)."""
    review_by: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    """The note's ``review_by``: a posting of a note past it is not a candidate."""
