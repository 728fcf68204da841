"""What every adapter speaks: InboundMessage in, reply text out."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from msgspec import Struct, field


class ConversationKind(StrEnum):
    """Where a message was said."""

    DIRECT = "direct"
    GROUP = "group"  # a group chat (Teams groupChat, Discord group DM)
    CHANNEL = "channel"  # a guild / team channel or a thread in one


class InboundMessage(Struct, frozen=True):
    """A platform event, converted once at the edge.

    ``conversation_ids`` holds every id the conversation is known by (channel,
    parent channel, guild / team) so group allowlists can match any of them.
    """

    channel: str  # "discord", "teams", "web", "api"
    conversation_id: str
    thread_id: str | None
    sender_id: str  # the platform user id
    display_name: str
    text: str  # bot mention stripped
    timestamp: datetime  # the platform's, timezone-aware UTC
    message_id: str  # the platform's, for idempotency
    is_direct: bool
    mentions_bot: bool
    kind: ConversationKind
    conversation_ids: tuple[str, ...] = ()
    tenant_id: str | None = None
    attachments: tuple[str, ...] = field(default=())


class OutboundMessage(Struct, frozen=True):
    """A reply or proactive message to a conversation."""

    channel: str
    conversation_id: str
    text: str
    thread_id: str | None = None
    reply_to: str | None = None


MessageHandler = Callable[[InboundMessage], Awaitable[str | None]]
"""The gateway's entry point: returns the reply to send, or None for silence."""


class ChannelAdapter(Protocol):
    """The small protocol every platform adapter implements."""

    name: str

    async def start(self) -> None:
        """Connect to the platform and begin delivering messages to the handler."""

    async def stop(self) -> None:
        """Disconnect; pending sends are finished or logged."""

    async def send(self, message: OutboundMessage) -> None:
        """Send text to a conversation (split to the platform limit)."""


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_text(text: str, limit: int) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters.

    Splits on paragraph boundaries first, then sentences, then words; a single
    word longer than the limit is the only thing ever cut mid-word.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    parts: list[str] = []

    def pieces(block: str) -> list[str]:
        if len(block) <= limit:
            return [block]
        sentences = _SENTENCE_END.split(block)
        if len(sentences) > 1:
            return [p for s in sentences for p in pieces(s)]
        words = block.split(" ")
        if len(words) > 1:
            return words
        return [block[i : i + limit] for i in range(0, len(block), limit)]

    def pack(units: list[str], sep: str) -> None:
        current = ""
        for unit in units:
            candidate = f"{current}{sep}{unit}" if current else unit
            if len(candidate) <= limit:
                current = candidate
                continue
            if current:
                parts.append(current)
            if len(unit) <= limit:
                current = unit
            else:
                sub = pieces(unit)
                sub_sep = " "
                current = ""
                for s in sub:
                    cand = f"{current}{sub_sep}{s}" if current else s
                    if len(cand) <= limit:
                        current = cand
                    else:
                        if current:
                            parts.append(current)
                        current = s
        if current:
            parts.append(current)

    pack([p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()], "\n\n")
    return parts
