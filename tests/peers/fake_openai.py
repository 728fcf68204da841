"""A local OpenAI-compatible server speaking the real chat.completions wire format.

Tests script its answers in order and read back every request it received::

    async with FakeOpenAI() as peer:
        peer.reply_error(429, retry_after=2)
        peer.reply_tool_calls(("lookup", {"q": "report"}))
        peer.reply_text("It comes from the warehouse.")
        provider = OpenAIProvider(model="gpt-test", base_url=peer.base_url, api_key="sk-test")
        ...
        assert peer.requests[1]["messages"][-1]["role"] == "tool"

Each POST /v1/chat/completions takes the next scripted reply: JSON for a normal
request, SSE ``data: {...}`` chunks ending ``data: [DONE]`` when the body says
``"stream": true`` -- text as ``delta.content`` pieces, tool calls as
``delta.tool_calls`` pieces (the first of each with its index, id and name, then
its arguments cut into several pieces), and a last chunk with ``usage`` and no
choices when ``stream_options.include_usage`` asks for it. A streamed reply can
wait ``token_delay`` seconds between pieces (``FakeOpenAI(token_delay=...)`` for
every reply), hold its last text piece until an ``asyncio.Event`` is set
(``hold=``: a test proves the pieces reached it before the model finished), or
drop the connection after ``fail_after`` text pieces. It fails loudly: a request the real API would refuse (a tool
call left unanswered, an unknown role) or one with no reply left scripted gets a
400 whose message says why, and the reason is kept in ``rejections``.
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
    401: "invalid_request_error",
    403: "permission_denied",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}

ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


class FakeOpenAI(ScriptedPeer):
    """An aiohttp server on 127.0.0.1 (a free port) implementing POST /v1/chat/completions."""

    PATH = "/v1/chat/completions"
    RETRY_AFTER = "Retry-After"

    def _endpoint(self) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        return self._chat_completions

    def _call_id(self, n: int) -> str:
        return f"call_{n}"

    @property
    def base_url(self) -> str:
        """What a client passes as ``base_url`` (ends in ``/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ---- the endpoint -----------------------------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
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
            return self._reject("fake_openai: no scripted reply left for this request")
        reply = self._script.popleft()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return _error(reply.status, reply.error_message, reply.headers)
        model = reply.model or body["model"]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = await self._stream(request, reply, model, include_usage)
            return response
        return web.json_response(_completion(reply, model))

    def _reject(self, problem: str) -> web.Response:
        self.rejections.append(problem)
        return _error(400, problem, {})

    async def _stream(
        self, request: web.Request, reply: ScriptedReply, model: str, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        base = {"id": f"chatcmpl-fake{time.monotonic_ns()}", "object": "chat.completion.chunk", "created": 0}
        base["model"] = model
        pause = self.token_delay if reply.token_delay is None else reply.token_delay

        async def send(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        pieces = reply.chunks if reply.chunks is not None else (split_for_stream(reply.text) if reply.text else [])
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
            await send({"content": piece})
        for index, (call_id, name, arguments) in enumerate(reply.tool_calls):
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
            head = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            await send({"tool_calls": [head]})
            for start in range(0, len(raw), 7):  # arguments cut anywhere, as servers do
                if pause:
                    await asyncio.sleep(pause)
                await send({"tool_calls": [{"index": index, "function": {"arguments": raw[start : start + 7]}}]})
        await send({}, "tool_calls" if reply.tool_calls else "stop")
        if include_usage:
            prompt, completion = reply.usage
            usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
            await response.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.streams_finished += 1
        return response


def _error(status: int, message: str, headers: dict[str, str]) -> web.Response:
    error_type = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": error_type, "param": None, "code": ERROR_CODES.get(status)}}
    return web.json_response(body, status=status, headers=headers)


def _completion(reply: ScriptedReply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for call_id, name, arguments in reply.tool_calls
        ]
    prompt, completion = reply.usage
    return {
        "id": f"chatcmpl-fake{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _validate(body: Any) -> str | None:
    """What the real API would refuse in this request body, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty array"
    for tool in body.get("tools") or []:
        if tool.get("type") != "function" or not isinstance(tool.get("function", {}).get("name"), str):
            return f"tools: invalid tool {tool!r}"
    unanswered: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{i}].role: unknown role {role!r}"
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in unanswered:
                return f"messages[{i}]: tool message answers {call_id!r}, which no preceding tool_calls asked for"
            unanswered.remove(call_id)
            continue
        if unanswered:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. Missing: {', '.join(unanswered)}"
            )
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                try:
                    json.loads(call["function"]["arguments"])
                except (KeyError, TypeError, json.JSONDecodeError):
                    return f"messages[{i}].tool_calls: arguments must be a JSON string"
                unanswered.append(call["id"])
    if unanswered:
        return f"tool_calls without tool messages: {', '.join(unanswered)}"
    return None
