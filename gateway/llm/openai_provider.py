"""OpenAI-compatible chat completions (OpenAI, Ollama, vLLM, LM Studio, llama.cpp).

The one network chokepoint to such a server: the Chat Completions wire format
spoken directly over one long-lived ``aiohttp.ClientSession`` (keep-alive, a
connection limit, the configured timeout), with ``gateway.llm.retry`` applying
the one retry policy every provider shares.

Not through the ``openai`` SDK: even its lower-level ``client.post`` spent most
of a call's CPU building an httpx request (URL parsing and quoting, option
models, header merging), passing it through httpx's auth and redirect layers and
adapting it to aiohttp (bench/provider_cpu.py measures both, same run). Here the
URL and headers are computed once at ``start()``, the body is encoded once (by
``orjson``: the same bytes as the ``json`` module's compact form, in a twentieth of
its time), and the answer is ``json.loads``-ed from the bytes read.

What the SDK did for us is done here, the same way, so the retry policy and the
descriptions in ``gateway.llm.retry`` read the same errors: a status outside
2xx is an :class:`APIStatusError` (``status_code``, ``response.headers`` for
Retry-After, ``body`` the decoded error object or the raw text); a timeout is an
:class:`APITimeoutError`, anything else from the transport (refused, reset,
cut short, not HTTP) an :class:`APIConnectionError`, both chained to
aiohttp's own error; an ``error`` object inside a stream is an
:class:`APIError`. A 2xx body that says it is JSON and is not is a
:class:`MalformedResponseError` (the SDK let the ``json`` module's error out
uncaught, which failed the turn instead of reporting the model unavailable);
one that does not say JSON is taken as no answer, as the SDK did.

With a delta sink the same request goes out with ``"stream": true`` (and
``stream_options.include_usage`` for the token counts). The server-sent events
are parsed as they arrive (lines may end in LF, CRLF or CR and may be cut
anywhere between reads; ``data:`` lines of one event are joined; comments,
``event:``, ``id:`` and ``retry:`` lines are ignored; ``data: [DONE]`` ends the
answer), text deltas go to the sink at once, and tool-call deltas are assembled
by their ``index`` into whole calls.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from msgspec import Struct
from yarl import URL

from gateway.llm.base import ChatMessage, Completion, DeltaSink, JsonSchema, Tool, ToolCall
from gateway.llm.retry import is_retryable_status
from gateway.llm.sdk import SdkProvider

log = logging.getLogger(__name__)

# Local servers (Ollama, vLLM, llama.cpp) ignore the key, but some proxies insist on one.
NO_API_KEY = "not-needed"

# The vendor's own endpoint when llm.base_url is not set (OPENAI_BASE_URL overrides it, as in the SDK).
DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Connections to the model server: no cap of their own (0). The calls in flight are bounded by
# llm.max_concurrent_calls (gateway/llm/limit.py); a second, lower cap here would queue calls past
# that setting without a word.
MAX_CONNECTIONS = 0

# Idle connections are closed after this long: shorter than the common servers' own
# keep-alive (uvicorn's 5 s), so a request is not sent down a connection the server is closing.
KEEPALIVE_SECONDS = 4.0

# After ``data: [DONE]``, how long the rest of the body (the chunked terminator) may take
# to arrive before the connection is dropped instead of kept for the next call.
DRAIN_SECONDS = 0.1

USER_AGENT = "goclaw (openai-compatible)"


class APIError(Exception):
    """The model server failed a call (the base of this module's errors)."""

    def __init__(self, message: str, *, body: object | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.body = body


class ErrorResponse(Struct, frozen=True):
    """What the retry policy reads of a failed response: its status line and headers."""

    status_code: int
    reason_phrase: str
    headers: Mapping[str, str]  # case-insensitive (aiohttp's CIMultiDictProxy)


class APIStatusError(APIError):
    """The server answered with a status outside 2xx."""

    def __init__(self, message: str, *, response: ErrorResponse, body: object | None) -> None:
        super().__init__(message, body=body)
        self.response = response
        self.status_code = response.status_code


class APIConnectionError(APIError):
    """No answer: the connection failed, was refused, reset or cut short (the cause is aiohttp's error)."""

    def __init__(self, message: str = "Connection error.") -> None:
        super().__init__(message)


class APITimeoutError(APIConnectionError):
    """No answer within the timeout (connecting, or between two reads)."""

    def __init__(self) -> None:
        super().__init__("Request timed out.")


class MalformedResponseError(APIError):
    """A 2xx answer that is not the JSON it says it is."""


def _is_retryable(exc: BaseException) -> bool:
    # APITimeoutError is a subclass of APIConnectionError.
    if isinstance(exc, APIConnectionError):
        return True
    return isinstance(exc, APIStatusError) and is_retryable_status(exc.status_code)


def message_to_wire(message: ChatMessage) -> dict[str, Any]:
    """One ChatMessage in the chat.completions ``messages`` format."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            # The API takes null content beside tool calls; some local servers reject "".
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """One Tool in the chat.completions ``tools`` format."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }


def parse_arguments(raw: str | None, tool_name: str) -> Mapping[str, Any]:
    """A tool call's arguments; malformed JSON becomes ``{}`` so the turn goes on.

    The tool's handler then sees missing arguments and answers with an error the
    model can correct, which is better than failing the person's whole turn.
    """
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("model sent malformed arguments for tool %s: %.200r; using {}", tool_name, raw)
        return {}
    if not isinstance(value, dict):
        log.warning("model sent non-object arguments for tool %s: %.200r; using {}", tool_name, raw)
        return {}
    return value


@functools.cache
def _orjson_dumps() -> Callable[[Any], bytes]:
    """``orjson.dumps``, imported with the first body: its import costs about 20 ms, which start-up need not pay."""
    import orjson

    return orjson.dumps


def encode_body(request: Mapping[str, Any]) -> bytes:
    """A request body as the SDK wrote it: compact UTF-8 JSON, no NaN.

    ``orjson`` writes the bytes the ``json`` module's compact form writes
    (``tests/gateway/test_openai_body.py`` checks that), about 3 µs for a 30-message
    history against 57 µs. What it will not write (a lone surrogate, a key that is
    not a string, an integer past 64 bits: its ``JSONEncodeError`` is a TypeError)
    goes to the ``json`` module, which writes it or raises as it always did. NaN,
    which orjson would write as null, has no way in: the temperature is validated
    to 0-2, and schemas are the code's.
    """
    try:
        return _orjson_dumps()(request)
    except TypeError:
        return json.dumps(request, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def status_error(status: int, reason: str | None, headers: Mapping[str, str], raw: bytes) -> APIStatusError:
    """The error for a non-2xx answer, built from its body as the SDK built it.

    ``body`` is the decoded ``error`` object (or the whole JSON body when it has
    none), or the raw text when the body is not JSON; the message names the
    server's own ``message`` when there is one.
    """
    text = raw.decode("utf-8", "replace").strip()
    body: object = text
    message = f"Error code: {status}"
    try:
        body = json.loads(text)
    except ValueError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
    if isinstance(body, Mapping):
        body = body.get("error", body)
    if not reason:
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = ""
    return APIStatusError(message, response=ErrorResponse(status, reason, headers), body=body)


def _stream_error(event: Mapping[str, Any]) -> APIError:
    """The error an ``{"error": ...}`` event in a stream stands for (the SDK's wording)."""
    error = event["error"]
    message = error.get("message") if isinstance(error, Mapping) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return APIError(message, body=error)


def _not_json(exc: ValueError, raw: bytes) -> MalformedResponseError:
    return MalformedResponseError(f"the model server's answer is not JSON ({exc}): {raw[:200]!r}")


def _base_url(configured: str | None) -> str:
    return (configured or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


class OpenAIProvider(SdkProvider[aiohttp.ClientSession]):
    """A model behind any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    name = "openai"

    sdk_errors = (APIError,)

    _url: URL

    def _make_client(self) -> aiohttp.ClientSession:
        self._url = URL(_base_url(self.base_url) + "/chat/completions")
        headers = {
            "Authorization": f"Bearer {self._api_key or NO_API_KEY}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        # The SDK read these from the environment; an operator relying on them keeps them.
        for header, variable in (("OpenAI-Organization", "OPENAI_ORG_ID"), ("OpenAI-Project", "OPENAI_PROJECT_ID")):
            if os.environ.get(variable):
                headers[header] = os.environ[variable]
        # HTTP(S)_PROXY / NO_PROXY, read once (a session that trusts the environment reads
        # them, and ~/.netrc, again on every request).
        try:
            proxy, proxy_auth = get_env_proxy_for_url(self._url)
        except LookupError:
            proxy, proxy_auth = None, None
        # The timeout as the SDK applied it: for connecting (a free connection included)
        # and for each read, not for the whole answer, so a long stream is not cut.
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout, sock_connect=self.timeout, sock_read=self.timeout
        )
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_SECONDS),
            headers=headers,
            timeout=timeout,
            proxy=proxy,
            proxy_auth=proxy_auth,
        )

    @staticmethod
    def _is_retryable(exc: BaseException) -> bool:
        return _is_retryable(exc)

    def _base_request(self, messages: Sequence[ChatMessage]) -> dict[str, Any]:
        # max_tokens (not max_completion_tokens): the name every compatible server knows.
        return {
            "model": self.model,
            "messages": [message_to_wire(m) for m in messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool] = (),
        json_schema: JsonSchema | None = None,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        """One chat completion (streamed to ``on_delta`` when given); raises LLMUnavailable after retries."""
        session = self._require_client()
        # Only the encoded bytes wait out the model's time: the request's dict, its lists and three
        # dicts per tool offered (the collector tracks those; a message's dict of strings it does not)
        # are freed first, not walked by each collection while hundreds of turns wait on the model.
        body = encode_body(self._request(messages, tools, json_schema, stream=on_delta is not None))
        if on_delta is not None:
            return await self._call_streaming(lambda sink: self._read_stream(session, body, sink), on_delta)
        response = await self._call(lambda: self._post_json(session, body))
        return self._parse(response)

    def _request(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool], json_schema: JsonSchema | None, *, stream: bool
    ) -> dict[str, Any]:
        """The chat.completions request for one call, as a dict to encode."""
        request = self._base_request(messages)
        if tools:
            request["tools"] = [tool_to_wire(t) for t in tools]
        if json_schema is not None:
            # strict False: strict mode needs additionalProperties false everywhere, which
            # callers' schemas need not state, and local servers often reject it.
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": json_schema.name, "schema": dict(json_schema.schema), "strict": False},
            }
        if stream:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        return request

    async def _open(self, session: aiohttp.ClientSession, body: bytes) -> aiohttp.ClientResponse:
        """POST the body; the response once its status is 2xx (its body not yet read)."""
        try:
            response = await session.post(self._url, data=body)
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors (before ClientError: both)
            raise APITimeoutError() from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise APIConnectionError() from exc
        if 200 <= response.status < 300:
            return response
        try:
            raw = await _read(response)
        finally:
            response.release()
        raise status_error(response.status, response.reason, response.headers, raw)

    async def _post_json(self, session: aiohttp.ClientSession, body: bytes) -> Any:
        """One non-streaming attempt: the decoded JSON body (or its text, when it is not labelled JSON)."""
        response = await self._open(session, body)
        try:
            raw = await _read(response)
        finally:
            response.release()
        # As the SDK did: a body not labelled JSON is handed back as text, which _parse takes as no answer.
        content_type = response.headers.get("Content-Type", "*").split(";", 1)[0]
        if not content_type.endswith("json"):
            return raw.decode("utf-8", "replace")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise _not_json(exc, raw) from exc

    def _parse(self, response: Any) -> Completion:
        if not isinstance(response, Mapping):
            log.warning("%s answered with a non-object body: %.200r", self._label, response)
            return Completion(text="", model=self.model)
        model = response.get("model") or self.model
        choices = response.get("choices") or []
        if not choices or not isinstance(choices[0], Mapping):
            log.warning("%s answered with no choices", self._label)
            return Completion(text="", model=model)
        message = choices[0].get("message") or {}
        text = message.get("content") or message.get("refusal") or ""
        calls: list[ToolCall] = []
        for raw_call in message.get("tool_calls") or []:
            function = raw_call.get("function") if isinstance(raw_call, Mapping) else None
            if not isinstance(function, Mapping) or not function.get("name"):
                # Custom (non-function) tool calls are not something the gateway offers.
                kind = raw_call.get("type", "?") if isinstance(raw_call, Mapping) else "?"
                log.warning("%s sent a %r tool call; ignored", self._label, kind)
                continue
            calls.append(
                ToolCall(
                    id=raw_call.get("id") or f"call_{len(calls)}",
                    name=str(function["name"]),
                    arguments=parse_arguments(function.get("arguments"), str(function["name"])),
                )
            )
        usage = response.get("usage") or {}
        return Completion(
            text=text if isinstance(text, str) else str(text),
            tool_calls=tuple(calls),
            model=model,
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
        )

    async def _read_stream(self, session: aiohttp.ClientSession, body: bytes, sink: DeltaSink) -> Completion:
        """One streamed attempt, read to its end: text to ``sink``, tool calls and usage assembled.

        Only the reads are translated into this module's errors: what the sink
        raises (the person's connection closing) is the caller's, as it was with the SDK.
        """
        response = await self._open(session, body)
        texts: list[str] = []
        refusals: list[str] = []
        # Tool calls arrive in pieces keyed by index: the first names the call, the
        # rest add to its arguments (a JSON string cut anywhere).
        calls: dict[int, dict[str, Any]] = {}
        model = self.model
        usage: Mapping[str, Any] = {}
        events = SseEvents()
        done = False
        try:
            while not done:
                chunk = await _read_any(response)
                if not chunk:
                    break  # the body ended without [DONE]: what came is the answer, as with the SDK
                for data in events.feed(chunk):
                    if data.startswith(b"[DONE]"):
                        done = True
                        break
                    try:
                        event = json.loads(data)
                    except ValueError as exc:
                        raise _not_json(exc, data) from exc
                    if not isinstance(event, Mapping):
                        continue
                    if event.get("error"):
                        raise _stream_error(event)
                    model = event.get("model") or model
                    if event.get("usage"):
                        usage = event["usage"]
                    for choice in event.get("choices") or ():
                        delta = choice.get("delta") if isinstance(choice, Mapping) else None
                        if not isinstance(delta, Mapping):
                            continue
                        text = delta.get("content")
                        if text:
                            texts.append(text)
                            await sink(text)
                        if delta.get("refusal"):
                            refusals.append(delta["refusal"])
                        for position, piece in enumerate(delta.get("tool_calls") or ()):
                            if isinstance(piece, Mapping):
                                _add_call_piece(calls, piece, position)
            if done:
                await _drain(response)
        except BaseException:
            response.close()  # a connection left mid-body cannot carry the next request
            raise
        finally:
            response.release()
        return self._parse(
            {
                "model": model,
                "choices": [
                    {
                        "message": {
                            "content": "".join(texts),
                            "refusal": "".join(refusals) or None,
                            "tool_calls": [calls[i] for i in sorted(calls)],
                        }
                    }
                ],
                "usage": usage,
            }
        )


class SseEvents:
    """Server-sent events from bytes read in pieces: the ``data`` of each complete event, in order.

    Lines end in LF, CRLF or CR; a CR that ends one read ends its line at once,
    and an LF starting the next read is then the rest of that CRLF. An event is
    the lines up to a blank line; its ``data:`` lines are joined with LF; an
    event without data is not dispatched (the SSE spec), and every other field
    is ignored, as the SDK ignored them.
    """

    __slots__ = ("_data", "_skip_lf", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._skip_lf = False
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events that ``chunk`` completes."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._tail = lines.pop()
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    joined = data[0] if len(data) == 1 else b"\n".join(data)
                    data.clear()
                    if joined:
                        out.append(joined)
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
        return out


async def _read(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, with the transport's failures as this module's errors."""
    try:
        return await response.read()
    except TimeoutError as exc:
        raise APITimeoutError() from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise APIConnectionError() from exc


async def _read_any(response: aiohttp.ClientResponse) -> bytes:
    """The next bytes of a streamed body (b"" at its end), with failures as this module's errors."""
    try:
        return await response.content.readany()
    except TimeoutError as exc:
        raise APITimeoutError() from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise APIConnectionError() from exc


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read what follows ``[DONE]`` so the connection can be reused; drop it if that takes long or fails.

    The answer is complete by now: nothing here may turn it into an error.
    """
    if response.content.at_eof():
        return
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while await response.content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError, OSError):
        response.close()


def _add_call_piece(calls: dict[int, dict[str, Any]], piece: Mapping[str, Any], position: int) -> None:
    """Fold one streamed tool-call delta into ``calls`` (wire-format tool calls, by index)."""
    index = piece.get("index")
    index = index if isinstance(index, int) else position
    call = calls.setdefault(index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    if piece.get("id"):
        call["id"] = piece["id"]
    if piece.get("type"):
        call["type"] = piece["type"]
    function = piece.get("function")
    if isinstance(function, Mapping):
        if function.get("name") and not call["function"]["name"]:
            call["function"]["name"] = function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]
