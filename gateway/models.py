"""Tables of the gateway: sessions, messages, archives, durable jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from pairing.models import UTCDateTime


class GatewayBase(DeclarativeBase):
    """Declarative base of the gateway tables."""


class Session(GatewayBase):
    """A conversation: (channel, conversation, thread). ``thread_id`` is '' when there is none."""

    __tablename__ = "sessions"
    __table_args__ = (UniqueConstraint("channel", "conversation_id", "thread_id", name="uq_sessions_key"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    channel: Mapped[str] = mapped_column(String(32))
    conversation_id: Mapped[str] = mapped_column(String(300))
    thread_id: Mapped[str] = mapped_column(String(300), default="")
    parent_conversation_id: Mapped[str | None] = mapped_column(String(300), nullable=True)
    previous_context: Mapped[str] = mapped_column(Text, default="")
    # The newest message id already handed to an extraction job (idle sweep or trim).
    extracted_through: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Message(GatewayBase):
    """A person's or the agent's message, stored once with the speaker and role it came with."""

    __tablename__ = "messages"
    __table_args__ = (
        # Inbound ids and the agent's reply ids live in separate namespaces (is_agent):
        # no client id, whatever a channel's alphabet allows, can collide with a reply.
        UniqueConstraint("session_id", "is_agent", "platform_message_id", name="uq_messages_platform_id"),
        Index("ix_messages_session_live", "session_id", "archive_id", "id"),
        # Replies only: migration 0016 makes it WHERE reply_to_id IS NOT NULL (a person's message has no
        # entry). Not said here: the schema is Alembic's, and the dialects' where= options would load
        # both dialects' modules at import (a plain SQLite start loads no PostgreSQL code).
        Index("uq_messages_reply_to", "reply_to_id", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    platform_message_id: Mapped[str] = mapped_column(String(300))
    speaker_user_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    stored_role: Mapped[str | None] = mapped_column(String(32), nullable=True)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    text: Mapped[str] = mapped_column(Text)
    said_at: Mapped[datetime] = mapped_column(UTCDateTime())
    is_agent: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    archive_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # The agent's reply points at the message it answers: one reply per message.
    reply_to_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE", name="fk_messages_reply_to"), nullable=True
    )
    # Whether the sender asked for an answer (store-only group messages did not).
    reply_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The lease of the turn answering this message (gateway/ordering.py); None when nobody is.
    answering_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Heartbeat(GatewayBase):
    """One row per gateway process, written by ``/readyz`` to prove writes work."""

    __tablename__ = "gateway_heartbeat"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class Archive(GatewayBase):
    """A trimmed slice of history as a markdown document with a ``**Trust**:`` line."""

    __tablename__ = "archives"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    start_at: Mapped[datetime] = mapped_column(UTCDateTime())
    end_at: Mapped[datetime] = mapped_column(UTCDateTime())
    trust: Mapped[str] = mapped_column(String(16))
    message_count: Mapped[int] = mapped_column(Integer)
    summary: Mapped[str] = mapped_column(Text)
    markdown: Mapped[str] = mapped_column(Text)


class Job(GatewayBase):
    """A durable background job (extraction of a trimmed slice, ...)."""

    __tablename__ = "jobs"
    # The claim walks (status, id): the oldest runnable job without sorting every pending one (migration 0017).
    __table_args__ = (Index("ix_jobs_claim", "status", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|running|done|failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_after: Mapped[datetime] = mapped_column(UTCDateTime())
    locked_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    locked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    raw_answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class TurnRecord(GatewayBase):
    """What one answered turn's prompt held, written with the reply (the dashboard's "explain a turn").

    Stored at turn time, in the reply's transaction, so the explanation is what
    the model was given, not a recomputation from memory as it stands later.
    """

    __tablename__ = "turn_records"
    __table_args__ = (Index("ix_turn_records_session", "session_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    message_id: Mapped[str] = mapped_column(String(300))
    reply_message_id: Mapped[str] = mapped_column(String(300), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    speaker_user_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    stored_role: Mapped[str | None] = mapped_column(String(32), nullable=True)
    memory: Mapped[list[Any]] = mapped_column(JSON)  # [{"id", "why"}] in prompt order
    sections: Mapped[dict[str, Any]] = mapped_column(JSON)  # prompt section -> tokens
    model_calls: Mapped[dict[str, Any]] = mapped_column(JSON)  # provider, model, steps, tools, tokens


class OperatorLogout(GatewayBase):
    """A dashboard session its operator logged out of: the cookie is refused by every process, restarted or not.

    Kept until the cookie would have expired anyway (``expires_at``), then dropped.
    """

    __tablename__ = "operator_logouts"

    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    logged_out_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
