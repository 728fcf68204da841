"""What the local model peers share: the scripted replies, their lifecycle on 127.0.0.1, the scripting calls.

``tests.peers.fake_openai`` and ``tests.peers.fake_anthropic`` each add their
own wire format (the endpoint, error bodies, stream events) on top.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web


def split_for_stream(text: str) -> list[str]:
    """Word-sized chunks (each keeping its trailing space), as a server would stream them."""
    return re.findall(r"\S+\s*|\s+", text) or [text]


@dataclass
class ScriptedReply:
    """One answer the fake will give, in order."""

    text: str = ""
    chunks: list[str] | None = None
    tool_calls: list[tuple[str, str, Any]] = field(default_factory=list)  # (id, name, arguments or input)
    status: int = 200
    error_message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    usage: tuple[int, int] = (12, 7)
    model: str | None = None
    token_delay: float | None = None  # None: the peer's own token_delay
    hold: asyncio.Event | None = None  # the last text piece waits for it
    fail_after: int | None = None  # drop the connection after this many text pieces


class ScriptedPeer:
    """An aiohttp server on 127.0.0.1 (a free port) answering ``PATH`` from a script, in order."""

    PATH = ""  # the endpoint (set by the subclass)
    RETRY_AFTER = "Retry-After"  # the header name the real API sends

    def __init__(self, *, token_delay: float = 0.0) -> None:
        """Prepare an empty script; ``start()`` binds the port.

        Args:
            token_delay: Seconds between the pieces of every streamed reply.
        """
        self.token_delay = token_delay
        self.streams_finished = 0  # streamed replies sent to their end
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # lower-cased names
        self.rejections: list[str] = []
        self._script: deque[ScriptedReply] = deque()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def _endpoint(self) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        raise NotImplementedError

    def _call_id(self, n: int) -> str:
        raise NotImplementedError

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on 127.0.0.1, on a port the OS picks."""
        app = web.Application()
        app.router.add_post(self.PATH, self._endpoint())
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Close the listener and every connection."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- scripting --------------------------------------------------------------------

    def reply_text(
        self,
        text: str,
        *,
        chunks: list[str] | None = None,
        delay: float = 0.0,
        usage: tuple[int, int] = (12, 7),
        model: str | None = None,
        token_delay: float | None = None,
        hold: asyncio.Event | None = None,
        fail_after: int | None = None,
    ) -> None:
        """Answer the next request with text (streamed as ``chunks``, default word by word).

        ``delay`` is before the answer starts; the others shape a streamed answer
        (see the peer's module doc).
        """
        self._script.append(
            ScriptedReply(
                text=text,
                chunks=chunks,
                delay=delay,
                usage=usage,
                model=model,
                token_delay=token_delay,
                hold=hold,
                fail_after=fail_after,
            )
        )

    def reply_tool_calls(self, *calls: tuple[str, Any], text: str = "") -> list[str]:
        """Answer the next request with tool calls, each ``(name, arguments)``; returns their ids, in order.

        For the OpenAI peer ``arguments`` is a dict (sent JSON-encoded, as the API
        does) or a raw string (to send malformed JSON); Anthropic's is the ``input``.
        """
        scripted = [(self._call_id(next(self._ids)), name, arguments) for name, arguments in calls]
        self._script.append(ScriptedReply(text=text, tool_calls=scripted))
        return [call_id for call_id, _, _ in scripted]

    def reply_error(self, status: int, message: str | None = None, *, retry_after: float | str | None = None) -> None:
        """Answer the next request with an HTTP error in the API's error body shape."""
        headers = {self.RETRY_AFTER: str(retry_after)} if retry_after is not None else {}
        self._script.append(
            ScriptedReply(status=status, error_message=message or f"fake error {status}", headers=headers)
        )

    @property
    def pending(self) -> int:
        """Scripted replies not yet used."""
        return len(self._script)
