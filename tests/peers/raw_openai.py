"""A local HTTP/1.1 server on 127.0.0.1 that answers chat.completions with scripted raw bytes.

For what a well-behaved server never sends, and ``tests.peers.fake_openai``
therefore cannot: a body that is not JSON, a stream whose lines are cut at
chosen bytes, a connection reset mid-body, an ``error`` event inside a stream.
Each request (read off the socket: request line, headers, a Content-Length
body) takes the next scripted reply, a list of byte pieces written in order
with an optional pause between them, after which the connection is kept for
the next request or closed::

    async with RawOpenAI() as peer:
        peer.reply(http_response(200, b"{not json", content_type="application/json"))
        provider = OpenAIProvider(model="m", base_url=peer.base_url, api_key="k")

A request with no reply left scripted gets a 400 and the reason is kept in
``rejections``, so a test fails loudly rather than hanging.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self


def http_response(
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
    reason: str = "",
) -> bytes:
    """A whole HTTP/1.1 response with a Content-Length body."""
    lines = [f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'Status')}", f"Content-Type: {content_type}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def sse_head() -> bytes:
    """The status line and headers of a chunked ``text/event-stream`` answer."""
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(data: bytes) -> bytes:
    """One HTTP chunk carrying ``data``."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def delta_event(delta: dict[str, Any], *, model: str = "gpt-test") -> bytes:
    """One ``data:`` event of a chat.completion.chunk carrying ``delta``."""
    chunk = {"object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": delta}]}
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"


_REASONS = {200: "OK", 400: "Bad Request", 429: "Too Many Requests", 500: "Internal Server Error"}


@dataclass
class RawReply:
    """One scripted answer: the pieces to write, the pause before each after the first, and what then."""

    pieces: list[bytes]
    pause: float = 0.0
    close: bool = False  # close the connection after the last piece (a reset mid-body when it was cut short)


class RawOpenAI:
    """The server; ``base_url`` ends in ``/v1`` as a client's does."""

    def __init__(self) -> None:
        """An empty script; ``start()`` binds the port."""
        self.requests: list[Any] = []  # the JSON bodies received, in order
        self.headers: list[dict[str, str]] = []  # each request's headers, names lower-cased
        self.connections: list[tuple[str, int]] = []  # the client address of each request
        self.rejections: list[str] = []
        self._script: deque[RawReply] = deque()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        """What a client passes as ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def reply(self, *pieces: bytes, pause: float = 0.0, close: bool = False) -> None:
        """Answer the next request with ``pieces``, written in order ``pause`` seconds apart."""
        self._script.append(RawReply(list(pieces), pause, close))

    async def start(self) -> None:
        """Listen on 127.0.0.1, on a port the OS picks."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Close the listener and every connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # stop() ends a reply still pausing; the task ends normally (asyncio's server logs a
            # cancelled connection task as an error).
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and write its reply; whether the connection stays open."""
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(json.loads(body) if body else None)
        self.headers.append(headers)
        self.connections.append(writer.get_extra_info("peername")[:2])
        if not request_line.startswith("POST /v1/chat/completions "):
            self.rejections.append(f"unexpected request {request_line!r}")
            writer.write(http_response(404, b'{"error": {"message": "not found"}}'))
            return True
        if not self._script:
            self.rejections.append("raw_openai: no scripted reply left for this request")
            writer.write(http_response(400, b'{"error": {"message": "raw_openai: no scripted reply left"}}'))
            return True
        reply = self._script.popleft()
        for i, piece in enumerate(reply.pieces):
            if i and reply.pause:
                await asyncio.sleep(reply.pause)
            writer.write(piece)
            await writer.drain()
        if reply.close:
            writer.transport.abort()  # no FIN handshake wait: the client sees the body cut short
            return False
        return True
