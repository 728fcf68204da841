"""Tables of identity proposals and decisions, intelligence signals, their routing, and obligations.

Seed 001: "All three are append-only. Nothing in any of them is ever edited in
place; a retraction, a disposition or a decision is recorded as a later
event." So every record table here is insert-only: a proposal's status is derived
from whether a decision row exists for it, a signal is unrouted until it has a
routing row, and an obligation is open until it has a disposition row. The
unique keys (one decision per proposal, one routing per signal, one disposition
per obligation) make a second, concurrent decision fail instead of overwriting.
``unrouted_signals`` (the router's queue) and ``open_obligations`` (the hold
check's) are not records but derived from the records by triggers: their rows
come and go, the records' never change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from memory.models import MemoryBase
from pairing.models import UTCDateTime

SEVERITIES: tuple[str, ...] = ("info", "advisory", "blocking", "critical")
CONFIDENCES: tuple[str, ...] = ("low", "medium", "high")
DISPOSITIONS: tuple[str, ...] = ("no-action", "accepted-risk", "rework", "replan", "research-requested", "rejected")
DECISIONS: tuple[str, ...] = ("accepted", "rejected", "direct")
ROUTING_OUTCOMES: tuple[str, ...] = ("noted", "expired", "raised")


class IdentityProposal(MemoryBase):
    """A proposed change to the agent's identity (``propose_policy_change``), with its host-stamped proposer."""

    __tablename__ = "identity_proposals"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    subject: Mapped[str] = mapped_column(String(200))
    content: Mapped[str] = mapped_column(Text)
    rationale: Mapped[str] = mapped_column(Text)
    proposer: Mapped[str] = mapped_column(String(200))
    """The paired person's user id, or the system principal's name."""
    proposer_role: Mapped[str | None] = mapped_column(String(32), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    sop_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    session_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    message_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class IdentityDecision(MemoryBase):
    """How an identity record came to be: a person's decision on a proposal, or ``direct`` (before decisions).

    ``accepted`` names the identity record the proposal became; ``rejected``
    names none; ``direct`` (written by the 0007 migration) marks an identity
    record written by ``memory_write`` before identity changed only by decision.
    """

    __tablename__ = "identity_decisions"
    __table_args__ = (Index("ix_identity_decisions_proposal_id", "proposal_id", unique=True),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    proposal_id: Mapped[str | None] = mapped_column(ForeignKey("identity_proposals.id"), nullable=True)
    record_id: Mapped[str | None] = mapped_column(ForeignKey("memory_records.id"), nullable=True, index=True)
    decision: Mapped[str] = mapped_column(String(16))
    by_user_id: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    rationale: Mapped[str] = mapped_column(Text)


class IntelligenceSignal(MemoryBase):
    """A finding reported by a research SOP run (``report_intelligence``); the host stamped sop, run and time."""

    __tablename__ = "intelligence_signals"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    sop_name: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[str] = mapped_column(String(64))
    reporter: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(200))
    claim: Mapped[str] = mapped_column(Text)
    observation: Mapped[str] = mapped_column(Text)
    rationale: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]] = mapped_column(JSON)
    confidence: Mapped[str] = mapped_column(String(8))
    reported_severity: Mapped[str] = mapped_column(String(16))
    affected_sops: Mapped[list[Any]] = mapped_column(JSON)
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class SignalRouting(MemoryBase):
    """What the router made of one signal: its derived severity and outcome (noted, expired, raised), and why."""

    __tablename__ = "signal_routings"

    signal_id: Mapped[str] = mapped_column(ForeignKey("intelligence_signals.id"), primary_key=True)
    routed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    severity: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    floors: Mapped[list[Any]] = mapped_column(JSON)


class UnroutedSignal(MemoryBase):
    """A signal with no routing yet: the router's queue, kept by the database (migration 0019).

    Not a record: a derived index of "the signals without a routing row", which a
    trigger adds each signal to as it is inserted and another takes it out of as its
    routing is inserted, whichever code inserts them (an older process's included).
    The router reads this and not an anti-join of every signal ever reported, so
    what it costs follows the signals waiting, not the history (``bench/signal_routing.py``).
    """

    __tablename__ = "unrouted_signals"

    signal_id: Mapped[str] = mapped_column(ForeignKey("intelligence_signals.id"), primary_key=True)


class Obligation(MemoryBase):
    """An obligation the router opened on one SOP for one signal; ``blocks`` holds that SOP's runs."""

    __tablename__ = "obligations"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    signal_id: Mapped[str] = mapped_column(ForeignKey("intelligence_signals.id"), index=True)
    sop_name: Mapped[str] = mapped_column(String(200), index=True)
    severity: Mapped[str] = mapped_column(String(16))
    blocks: Mapped[bool] = mapped_column(Boolean)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text)


class OpenObligation(MemoryBase):
    """An obligation with no disposition yet: the hold check's queue, kept by the database (migration 0020).

    Not a record: a derived index of "the obligations without a disposition row", which
    a trigger adds each obligation to as it is inserted and another takes it out of as
    its disposition is inserted, whichever code inserts them (an older process's
    included). It carries what the hold check filters and orders by, so
    ``ix_open_obligations_hold`` answers "the oldest open blocking obligation on this
    SOP" alone. The hold check and the open listing read this and not an anti-join of
    every obligation ever opened, so what they cost follows the open obligations, not
    the history (``bench/sop_hold.py``).
    """

    __tablename__ = "open_obligations"
    __table_args__ = (Index("ix_open_obligations_hold", "sop_name", "blocks", "opened_at", "obligation_id"),)

    obligation_id: Mapped[str] = mapped_column(ForeignKey("obligations.id"), primary_key=True)
    sop_name: Mapped[str] = mapped_column(String(200))
    blocks: Mapped[bool] = mapped_column(Boolean)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ObligationDisposition(MemoryBase):
    """A person's disposition of an obligation: a later event; the obligation row is never changed."""

    __tablename__ = "obligation_dispositions"

    obligation_id: Mapped[str] = mapped_column(ForeignKey("obligations.id"), primary_key=True)
    disposition: Mapped[str] = mapped_column(String(24))
    by_user_id: Mapped[str] = mapped_column(String(200))
    by_role: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    rationale: Mapped[str] = mapped_column(Text)
