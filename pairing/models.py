"""Tables of the pairing store."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, ForeignKey, Index, String, Text, TypeDecorator
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use datetime.now(UTC)")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class PairingBase(DeclarativeBase):
    """Declarative base of the pairing tables."""


class User(PairingBase):
    """A unified user: one person, whatever channels they reach the agent on."""

    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    display_name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Identity(PairingBase):
    """A platform identity linked to a unified user."""

    __tablename__ = "identities"

    channel: Mapped[str] = mapped_column(String(32), primary_key=True)
    platform_user_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    linked_at: Mapped[datetime] = mapped_column(UTCDateTime())


class PairingRequest(PairingBase):
    """A pairing code sent to an unknown sender, and what became of it."""

    __tablename__ = "pairing_requests"
    # A stranger's DM reads the channel's pending codes not yet expired; an expired code stays
    # 'pending' (the record of one nobody approved), so the expiry is in the index (migration 0021).
    __table_args__ = (Index("ix_pairing_requests_channel_status_expiry", "channel", "status", "expires_at"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(String(32))
    code: Mapped[str] = mapped_column(String(16))
    platform_user_id: Mapped[str] = mapped_column(String(200))
    display_name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending|approved|rejected
    decided_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    user_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Where the code was asked for, so the person can be told when it is approved.
    conversation_id: Mapped[str | None] = mapped_column(String(200), nullable=True)


class PairingNotice(PairingBase):
    """An outbox row: tell a person on their channel that they are paired, and as what.

    Written in the same transaction as the approval; a running gateway delivers it
    through the channel's adapter (``status``: pending, sent, failed, undeliverable).
    """

    __tablename__ = "pairing_notices"
    __table_args__ = (Index("ix_pairing_notices_status", "status", "channel"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(String(32))
    platform_user_id: Mapped[str] = mapped_column(String(200))
    conversation_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    user_id: Mapped[str] = mapped_column(String(40))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")
    status: Mapped[str] = mapped_column(String(16), default="pending", server_default="pending")
    done_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="", server_default="")


class RoleChange(PairingBase):
    """Every role a person was given, by whom and when (pairing included)."""

    __tablename__ = "role_changes"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    old_role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    new_role: Mapped[str] = mapped_column(String(16))
    changed_by: Mapped[str] = mapped_column(String(200))
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LinkCode(PairingBase):
    """A code a paired person asked for on one channel, to link another channel."""

    __tablename__ = "link_codes"

    code: Mapped[str] = mapped_column(String(16), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    channel: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class PairingAudit(PairingBase):
    """Admin commands and refusals, kept for the operator."""

    __tablename__ = "pairing_audit"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    channel: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))  # ok | refused | error
    detail: Mapped[str] = mapped_column(Text, default="")
