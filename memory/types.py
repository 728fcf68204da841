"""What memory sees of the outside world: stored messages and the model seam."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from msgspec import Struct

ExtractorModel = Callable[[str, str], Awaitable[str]]
"""A model call for structured output: (system prompt, user content) -> raw JSON text.

The gateway adapts its LLM provider to this (the openai provider sends
``response_format`` json_schema named ``extraction_result``); tests script it.
"""


class SliceMessage(Struct, frozen=True):
    """One stored message of a trimmed slice, as the gateway stored it.

    ``user_id`` is the unified user id the channel stored with the message (None
    for an unpaired sender, or a message stored before ids were recorded);
    ``stored_role`` is the role it was stored with: ``admin``, ``user``, a system
    principal name, or None. The speaker is never taken from the text.
    """

    message_id: str
    user_id: str | None
    stored_role: str | None
    display_name: str
    text: str
    said_at: datetime
    is_agent: bool = False


KINDS: tuple[str, ...] = ("identity", "preference", "operational", "request", "task")
"""What an extracted item can be (the extractor prompt explains each)."""


class ExtractedItem(Struct, frozen=True):
    """One item the extractor found in a speaker's lines.

    ``kind`` is the classification (soft, the model's); what happens to the
    item is decided in code by ``handle_fact_extract`` through the write gate.
    """

    kind: str
    subject: str
    content: str
