"""What the SDK-backed providers share: settings, the client's lifecycle, and one retry policy."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from gateway.llm.base import DeltaSink
from gateway.llm.retry import describe_failure, with_retries

ClientT = TypeVar("ClientT")
T = TypeVar("T")


class SdkProvider(Generic[ClientT]):
    """A provider over an official SDK client: no I/O until ``start()``, retries by ``gateway.llm.retry``.

    Subclasses name the provider and say how to make the client, which SDK
    errors are theirs, and which of those are worth retrying.
    """

    name = "sdk"
    sdk_errors: tuple[type[BaseException], ...] = ()
    # What a failure while reading a stream may raise besides sdk_errors (an SDK that
    # does not wrap its HTTP library's read errors); connection errors, so retryable.
    stream_errors: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        temperature: float = 0.2,
        max_tokens: int = 1024,
        *,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 8.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        """Hold settings only; ``start()`` opens the client.

        Args:
            model: Model name as the server knows it.
            base_url: Server URL; None for the vendor's own.
            api_key: The key; None for a local server that needs none.
            timeout: Seconds for one HTTP attempt.
            max_retries: Retries after the first attempt (429, 5xx, timeouts, connection errors).
            temperature: Sampling temperature (where the SDK takes one).
            max_tokens: Cap on the answer's length.
            retry_base_delay: First backoff step in seconds.
            retry_max_delay: Cap on one backoff step.
            sleep: Waits between retries (tests pass a recorder).
        """
        self.model = model
        self.base_url = base_url
        self._api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._retry_base_delay = retry_base_delay
        self._retry_max_delay = retry_max_delay
        self._sleep = sleep
        self._client: ClientT | None = None

    def _make_client(self) -> ClientT:
        raise NotImplementedError

    @staticmethod
    def _is_retryable(exc: BaseException) -> bool:
        raise NotImplementedError

    async def start(self) -> None:
        """Create the HTTP client (no request is made)."""
        if self._client is None:
            self._client = self._make_client()

    async def stop(self) -> None:
        """Close the HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()  # type: ignore[attr-defined]

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def _label(self) -> str:
        return f"{self.name} model {self.model!r}"

    def _require_client(self) -> ClientT:
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__} used before start(): call `await provider.start()` first")
        return self._client

    async def _call(self, request: Callable[[], Awaitable[Any]]) -> Any:
        return await with_retries(
            request,
            attempts=self.max_retries + 1,
            base_delay=self._retry_base_delay,
            max_delay=self._retry_max_delay,
            sleep=self._sleep,
            is_retryable=self._is_retryable,
            errors=self.sdk_errors,
            describe=describe_failure,
            label=self._label,
        )

    async def _call_streaming(self, attempt: Callable[[DeltaSink], Awaitable[T]], on_delta: DeltaSink) -> T:
        """Run one streaming ``attempt`` under the retry policy, retrying only before any text went out.

        ``attempt`` opens the stream, reads it to the end and returns the whole
        answer, passing each piece of text to the sink it is given. Once a piece
        has reached ``on_delta`` a failure is not retried: the person has seen
        that text, and a second attempt would send it again.
        """
        sent = False

        async def forward(text: str) -> None:
            nonlocal sent
            sent = True
            await on_delta(text)

        def retryable(exc: BaseException) -> bool:
            return not sent and (isinstance(exc, self.stream_errors) or self._is_retryable(exc))

        def describe(exc: BaseException) -> str:
            reason = describe_failure(exc)
            return f"{reason} (the stream broke after part of the answer was sent)" if sent else reason

        return await with_retries(
            lambda: attempt(forward),
            attempts=self.max_retries + 1,
            base_delay=self._retry_base_delay,
            max_delay=self._retry_max_delay,
            sleep=self._sleep,
            is_retryable=retryable,
            errors=(*self.sdk_errors, *self.stream_errors),
            describe=describe,
            label=self._label,
        )
