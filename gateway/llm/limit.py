"""A bound on model calls in flight, for every model call a gateway process makes.

The model server's capacity is what needs protecting, so the bound is on calls
in flight, not on sessions: a session that waits for its model holds no slot
while it stores messages, renders memory or runs a tool, and no database
connection is held across the call (the stores open one per transaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.llm.base import ChatMessage, Completion, DeltaSink, JsonSchema, LLMProvider, Tool


class ModelCallLimit:
    """At most ``limit`` model calls in flight; the rest wait in arrival order (asyncio.Semaphore is FIFO)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.peak = 0  # the most calls ever in flight at once (metrics, tests)

    def bound(self, provider: LLMProvider) -> LLMProvider:
        """``provider`` with each call counted against this limit."""
        return BoundedProvider(provider, self)

    async def __aenter__(self) -> ModelCallLimit:
        await self._slots.acquire()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.in_flight -= 1
        self._slots.release()


class BoundedProvider:
    """An LLM provider whose every ``complete`` takes a slot of a :class:`ModelCallLimit`.

    A streaming call holds its slot until its last piece has been handed on: the
    model server is working on it all that time.
    """

    def __init__(self, inner: LLMProvider, limit: ModelCallLimit) -> None:
        self.inner = inner
        self.limit = limit
        self.name = inner.name
        self.model = inner.model

    async def start(self) -> None:
        """Start the wrapped provider."""
        await self.inner.start()

    async def stop(self) -> None:
        """Stop the wrapped provider."""
        await self.inner.stop()

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool] = (),
        json_schema: JsonSchema | None = None,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        """One model call (streamed or not), once a slot is free."""
        async with self.limit:
            if on_delta is None:
                return await self.inner.complete(messages, tools=tools, json_schema=json_schema)
            return await self.inner.complete(messages, tools=tools, json_schema=json_schema, on_delta=on_delta)
