"""What is still owed an answer: a stored message's reply, and the messages a crash left unanswered.

A message is acknowledged once it is stored; its reply is a separate row linked
by ``reply_to_id``. A retry of a message stored without a reply (the process
died mid-turn, the model was down) must be answered, and at start the gateway
answers what the last process left open.
"""

from __future__ import annotations

from datetime import datetime

from msgspec import Struct
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import aliased

from gateway.models import Message, Session


class Unanswered(Struct, frozen=True):
    """A stored message that asked for an answer and has none."""

    channel: str
    conversation_id: str
    thread_id: str
    parent_conversation_id: str | None
    message_id: str
    speaker_user_id: str | None
    stored_role: str | None
    display_name: str
    text: str
    said_at: datetime


async def find_unanswered(engine: AsyncEngine, *, since: datetime, limit: int = 1000) -> list[Unanswered]:
    """Messages stored after ``since`` that asked for an answer and never got one, oldest first."""
    reply = aliased(Message)
    q = (
        select(
            Session.channel,
            Session.conversation_id,
            Session.thread_id,
            Session.parent_conversation_id,
            Message.platform_message_id,
            Message.speaker_user_id,
            Message.stored_role,
            Message.display_name,
            Message.text,
            Message.said_at,
        )
        .join(Session, Session.id == Message.session_id)
        .outerjoin(reply, reply.reply_to_id == Message.id)
        .where(
            Message.is_agent.is_(False),
            Message.reply_requested.is_(True),
            Message.created_at >= since,
            reply.id.is_(None),
        )
        .order_by(Message.id)
        .limit(limit)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return [
        Unanswered(
            channel=r.channel,
            conversation_id=r.conversation_id,
            thread_id=r.thread_id,
            parent_conversation_id=r.parent_conversation_id,
            message_id=r.platform_message_id,
            speaker_user_id=r.speaker_user_id,
            stored_role=r.stored_role,
            display_name=r.display_name,
            text=r.text,
            said_at=r.said_at,
        )
        for r in rows
    ]
