"""A scripted in-process model for turn tests (our own seam, not a library mock)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence

from gateway.llm.base import ChatMessage, Completion, DeltaSink, JsonSchema, LLMUnavailable, Tool


class ScriptedProvider:
    """Answers with ``answer(messages)``; records every call; streams word by word to a sink."""

    name = "scripted"
    model = "scripted-1"

    def __init__(
        self,
        answer: Callable[[Sequence[ChatMessage]], Awaitable[str] | str] | None = None,
        *,
        fail: bool = False,
    ) -> None:
        self.calls: list[list[ChatMessage]] = []
        self._answer = answer
        self.fail = fail

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool] = (),
        json_schema: JsonSchema | None = None,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        self.calls.append(list(messages))
        if self.fail:
            raise LLMUnavailable("model unavailable after 4 attempts: 503 Service Unavailable")
        if self._answer is None:
            last = next(m.content for m in reversed(messages) if m.role == "user")
            text = f"echo: {last}"
        else:
            out = self._answer(messages)
            if asyncio.iscoroutine(out):
                out = await out
            text = str(out)
        if on_delta is not None:
            for word in re.findall(r"\S+\s*|\s+", text):
                await on_delta(word)
        return Completion(text, model=self.model)
