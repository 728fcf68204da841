"""A local server speaking Anthropic's Messages API wire format (POST /v1/messages).

Scripted like ``fake_openai``::

    async with FakeAnthropic() as peer:
        peer.reply_error(529, "Overloaded")
        peer.reply_tool_calls(("lookup", {"q": "report"}))
        peer.reply_text("It comes from the warehouse.")
        provider = AnthropicProvider(model="claude-test", base_url=peer.base_url, api_key="sk-ant-test")
        ...
        assert peer.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"

Each request takes the next scripted reply: a ``message`` object with ``text`` and
``tool_use`` content blocks, or, when the body says ``"stream": true``, the SSE
events message_start, content_block_start, content_block_delta (text_delta
for text, input_json_delta for a ``tool_use`` block's input, cut into several
pieces), content_block_stop, message_delta, message_stop. A streamed reply can
wait ``token_delay`` seconds between pieces (``FakeAnthropic(token_delay=...)``
for every reply), hold its last text piece until an ``asyncio.Event`` is set
(``hold=``), or drop the connection after ``fail_after`` text pieces. Errors use the API's body
``{"type": "error", "error": {"type": ..., "message": ...}}``. It fails loudly: what
the real API refuses (a ``system`` role in messages, an unanswered ``tool_use``,
tool blocks without ``tools``, empty text blocks, no ``max_tokens``), or a request
with no reply left scripted, gets a 400 naming the problem, kept in ``rejections``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.peers.scripted_peer import ScriptedPeer, ScriptedReply, split_for_stream

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class FakeAnthropic(ScriptedPeer):
    """An aiohttp server on 127.0.0.1 (a free port) implementing POST /v1/messages."""

    PATH = "/v1/messages"
    RETRY_AFTER = "retry-after"

    def _endpoint(self) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        return self._messages

    def _call_id(self, n: int) -> str:
        return f"toolu_fake{n:04d}"

    @property
    def base_url(self) -> str:
        """What a client passes as ``base_url`` (the SDK appends ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.port}"

    # ---- the endpoint -----------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return self._reject("request body is not JSON")
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        problem = _validate(body)
        if problem:
            return self._reject(problem)
        if not self._script:
            return self._reject("fake_anthropic: no scripted reply left for this request")
        reply = self._script.popleft()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return _error(reply.status, reply.error_message, reply.headers)
        model = reply.model or body["model"]
        if body.get("stream"):
            return await self._stream(request, reply, model)
        return web.json_response(_message(reply, model))

    def _reject(self, problem: str) -> web.Response:
        self.rejections.append(problem)
        return _error(400, problem, {})

    async def _stream(self, request: web.Request, reply: ScriptedReply, model: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        pause = self.token_delay if reply.token_delay is None else reply.token_delay

        async def send(event: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps({'type': event, **data})}\n\n".encode())

        prompt, completion = reply.usage
        started = {**_message(ScriptedReply(usage=(prompt, 1)), model), "stop_reason": None}
        await send("message_start", {"message": started})
        index = 0
        pieces = reply.chunks if reply.chunks is not None else (split_for_stream(reply.text) if reply.text else [])
        if pieces:
            await send("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            await send("ping", {})
            for i, piece in enumerate(pieces):
                if reply.fail_after is not None and i == reply.fail_after:
                    # Mid-body: the client sees its chunked response cut short.
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if i and pause:
                    await asyncio.sleep(pause)
                if reply.hold is not None and i == len(pieces) - 1:
                    await reply.hold.wait()
                await send("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
            await send("content_block_stop", {"index": 0})
            index = 1
        for call_id, name, arguments in reply.tool_calls:
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            await send("content_block_start", {"index": index, "content_block": block})
            raw = json.dumps(arguments)
            for start in range(0, len(raw), 7):  # the input's JSON cut anywhere, as the API does
                if pause:
                    await asyncio.sleep(pause)
                delta = {"type": "input_json_delta", "partial_json": raw[start : start + 7]}
                await send("content_block_delta", {"index": index, "delta": delta})
            await send("content_block_stop", {"index": index})
            index += 1
        stop = "tool_use" if reply.tool_calls else "end_turn"
        await send(
            "message_delta",
            {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": completion}},
        )
        await send("message_stop", {})
        await response.write_eof()
        self.streams_finished += 1
        return response


def _error(status: int, message: str, headers: dict[str, str]) -> web.Response:
    error_type = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": error_type, "message": message}}
    return web.json_response(body, status=status, headers={"request-id": "req_fake", **headers})


def _message(reply: ScriptedReply, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for call_id, name, arguments in reply.tool_calls:
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    prompt, completion = reply.usage
    return {
        "id": f"msg_fake{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _validate(body: Any) -> str | None:
    """What the real API would refuse in this request body, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    temperature = body.get("temperature")
    if temperature is not None and not 0 <= temperature <= 1:
        return "temperature: Input should be less than or equal to 1"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if messages[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    tools_defined = bool(body.get("tools"))
    for tool in body.get("tools") or []:
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            return f"tools: invalid tool {tool!r}"
    unanswered: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f'messages.{i}.role: Input should be "user" or "assistant" (got {role!r}; use the system parameter)'
        blocks = _blocks(message.get("content"))
        if not blocks:
            return f"messages.{i}.content: must not be empty"
        answered = {str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"}
        if unanswered and (role != "user" or not set(unanswered) <= answered):
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                + ", ".join(sorted(set(unanswered) - answered))
            )
        if answered - set(unanswered):
            return (
                f"messages.{i}: unexpected `tool_use_id` in `tool_result` blocks: {sorted(answered - set(unanswered))}"
            )
        unanswered = []
        for j, block in enumerate(blocks):
            kind = block.get("type")
            if kind == "text" and not str(block.get("text", "")).strip():
                return f"messages.{i}.content.{j}: text content blocks must be non-empty"
            if kind in ("tool_use", "tool_result") and not tools_defined:
                return "Requests which include `tool_use` or `tool_result` blocks must define tools."
            if kind == "tool_use":
                if role != "assistant":
                    return f"messages.{i}.content.{j}: tool_use blocks are only allowed in assistant messages"
                unanswered.append(str(block.get("id")))
            if kind == "tool_result" and role != "user":
                return f"messages.{i}.content.{j}: tool_result blocks are only allowed in user messages"
    return None
