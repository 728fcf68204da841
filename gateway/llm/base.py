"""The one interface every LLM provider implements, and the types it speaks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from msgspec import Struct

from pairing.principal import Principal


class ToolCall(Struct, frozen=True):
    """A model's request to run a tool."""

    id: str
    name: str
    arguments: Mapping[str, Any]


class ChatMessage(Struct, frozen=True):
    """One message of a conversation sent to a model."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # for role "tool"
    name: str | None = None  # tool name for role "tool"


class Completion(Struct, frozen=True):
    """A model's answer: text, tool calls, or both."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


class JsonSchema(Struct, frozen=True):
    """A structured-output request (OpenAI ``response_format`` json_schema)."""

    name: str  # e.g. "extraction_result"
    schema: Mapping[str, Any]


class LLMUnavailable(Exception):
    """The model could not answer after retries (timeouts, 429/5xx, connection errors)."""


DeltaSink = Callable[[str], Awaitable[None]]
"""Receives a reply's text as the model produces it, one piece at a time, in order."""

ToolHandler = Callable[[Principal, Mapping[str, Any]], Awaitable[str]]
ToolAuthorizer = Callable[[Principal], str | None]
"""Returns why the principal may not use the tool, or None."""


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: its JSON schema, who may use it, what it does."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler
    authorize: ToolAuthorizer = field(default=lambda _p: None)


class LLMProvider(Protocol):
    """What the turn handler and the memory worker need from a model."""

    name: str  # "builtin" | "openai" | "anthropic"
    model: str

    async def start(self) -> None:
        """Open clients (no I/O in __init__)."""

    async def stop(self) -> None:
        """Close clients."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool] = (),
        json_schema: JsonSchema | None = None,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        """One model call; raises LLMUnavailable after retries.

        With ``on_delta`` the call streams: each piece of the answer's text is
        awaited through ``on_delta`` as it arrives, and the returned Completion is
        the whole answer (text, assembled tool calls, usage) as without it. Only a
        failure before the first piece is retried; after it, a retry would send the
        person text twice, so the call raises LLMUnavailable. Without ``on_delta``
        the call is the plain, non-streaming request (the cheap path for callers
        with nobody watching: POST /v1/chat, Discord, Teams, SOP runs, jobs); callers
        pass ``on_delta`` only when they have a sink, so a provider that never
        streams may leave it out.
        """
