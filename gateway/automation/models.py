"""Tables of automation: SOP definitions, run history, Teams conversation references."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gateway.models import GatewayBase
from pairing.models import UTCDateTime


class Sop(GatewayBase):
    """A standing procedure: what to do, when, and where the reply goes.

    ``next_due_at`` is the schedule's state (the next due time not yet claimed),
    so a restart resumes where it stopped and can catch up missed runs.
    """

    __tablename__ = "sops"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    instruction: Mapped[str] = mapped_column(Text)
    trigger_kind: Mapped[str] = mapped_column(String(16))
    trigger_spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    webhook_secret: Mapped[str | None] = mapped_column(Text, nullable=True)
    deliver_to: Mapped[str | None] = mapped_column(String(400), nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    research: Mapped[bool] = mapped_column(Boolean, default=False)
    scope_tags: Mapped[list[str]] = mapped_column(JSON)
    catch_up: Mapped[str] = mapped_column(String(8), default="once")
    origin: Mapped[str] = mapped_column(String(8))  # yaml | cli
    next_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SopRun(GatewayBase):
    """One run (or a due run that did not start: skipped, held).

    A scheduled run is claimed by inserting its (sop, due time) row: the unique
    constraint makes it fire exactly once across gateway processes. A webhook
    run's ``Idempotency-Key`` is unique per SOP the same way.
    """

    __tablename__ = "sop_runs"
    __table_args__ = (
        UniqueConstraint("sop_name", "due_at", name="uq_sop_runs_due"),
        UniqueConstraint("sop_name", "idempotency_key", name="uq_sop_runs_idempotency"),
        Index("ix_sop_runs_sop_created", "sop_name", "created_at"),
        Index("ix_sop_runs_status", "sop_name", "status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    sop_name: Mapped[str] = mapped_column(String(64))
    trigger: Mapped[str] = mapped_column(String(16))  # cron | every | at | manual | webhook
    principal: Mapped[str] = mapped_column(String(32))  # cron-system | sop-system | webhook-system
    due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    status: Mapped[str] = mapped_column(String(16))  # running | ok | failed | skipped | held
    held_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    reply: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_calls: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    delivered_to: Mapped[str | None] = mapped_column(String(400), nullable=True)
    session_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class TeamsConversationRef(GatewayBase):
    """A Teams conversation reference (what a proactive send needs), kept across restarts."""

    __tablename__ = "teams_conversation_refs"

    conversation_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    reference: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
