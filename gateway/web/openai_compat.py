"""The OpenAI-compatible endpoint: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Off by default (``server.openai_compat: true``). Many tools speak only the
OpenAI API; this lets them talk to the agent. It adds no second way in: each
request is one ordinary turn of the bearer token's user (``server.api_users``)
through the same :class:`~gateway.turn.TurnHandler` as ``/v1/chat``, with the
same memory, write gate and tools.

Only the last user message of a request is new input. The earlier messages are
the client's own copy of the conversation: they are not stored, and are never
taken as said by anyone (policy: who said what comes from the platform, never
from what a message claims). The session is the request's ``user`` field or the
``X-Goclaw-Session`` header (the same sessions as ``/v1/chat``), else a new one
per request.

Errors come in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
with 4xx statuses for bad requests, so OpenAI clients show them as they are.

With ``"stream": true`` the model's text goes out as ``chat.completion.chunk``
events as it arrives (the turn streams every tool round's text; see
``gateway.llm.loop``), then a stop chunk and ``data: [DONE]``. The response
starts with the first piece, so a request that fails before any (the model
unavailable, a redelivery still being answered) still gets its ordinary error
status; a model that fails after some text ends the stream with an error event,
which OpenAI clients raise. When the stored reply is not what the deltas spelled
(a fallback after tool rounds, say), it follows as one more delta.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gateway.prompt import estimate_tokens
from gateway.turn import GatewayNotice, TurnRequest, TurnResult
from gateway.web.app import CTX, ApiError, WebContext, _bearer, _conversation, authenticate, run_turn
from gateway.web.validation import MESSAGE_ID_RULE, check_message_id, parse_json
from gateway.write_health import STORAGE_MESSAGE, storage_reason

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Goclaw-Session"
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class OpenAIError(Exception):
    """An error answered in OpenAI's JSON shape."""

    def __init__(self, status: int, message: str, *, type_: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def response(self) -> web.Response:
        """The JSON error response."""
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


def _invalid(message: str, param: str | None = None, status: int = 400) -> OpenAIError:
    return OpenAIError(status, message, type_="invalid_request_error", code="invalid_request", param=param)


def model_id(ctx: WebContext) -> str:
    """The one model this endpoint serves: the agent, by name."""
    return ctx.config.agent.name


def _text_of(content: Any, index: int) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _invalid(
                    f"messages[{index}].content: only text parts are supported ({{'type': 'text', 'text': '...'}})",
                    f"messages[{index}].content",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    if content is None:
        return ""
    raise _invalid(f"messages[{index}].content must be a string or a list of text parts", f"messages[{index}].content")


def parse_completion_request(body: Any, *, model: str, max_chars: int) -> tuple[str, bool, str | None]:
    """Validate a chat completion request: (the last user message's text, stream, session from ``user``).

    Pure; raises :class:`OpenAIError` naming the field that is wrong.
    """
    if not isinstance(body, dict):
        raise _invalid('the body must be a JSON object: {"model": "...", "messages": [...]}')
    requested = body.get("model")
    if not isinstance(requested, str) or not requested:
        raise _invalid(f"field 'model' is missing: use {model!r} (see GET /v1/models)", "model")
    if requested != model:
        raise OpenAIError(
            404,
            f"the model {requested!r} is not served here; use {model!r} (see GET /v1/models)",
            type_="invalid_request_error",
            code="model_not_found",
            param="model",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("field 'messages' must be a non-empty list of {'role', 'content'} objects", "messages")
    last_user: str | None = None
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _invalid(f"messages[{i}] needs a role: one of {', '.join(sorted(_ROLES))}", f"messages[{i}].role")
        text = _text_of(m.get("content"), i)
        if m["role"] == "user":
            last_user = text
    if last_user is None or not last_user.strip():
        raise _invalid("the request has no user message with text: the last user message is what is answered")
    if len(last_user) > max_chars:
        raise _invalid(
            f"the last user message is longer than server.max_message_chars ({max_chars} characters)",
            "messages",
            status=413,
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _invalid("field 'stream' must be true or false", "stream")
    n = body.get("n", 1)
    if n != 1:
        raise _invalid("field 'n' must be 1: the agent gives one answer per turn", "n")
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or not user.strip() or len(user) > 200):
        raise _invalid("field 'user' (the session) must be a non-empty string of at most 200 characters", "user")
    return last_user, stream, user.strip() if isinstance(user, str) else None


async def _caller(request: web.Request, *, for_turn: bool = False) -> Any:
    ctx = request.app[CTX]
    try:
        principal, channel = await authenticate(ctx, _bearer(request), for_turn=for_turn)
    except ApiError as exc:
        code = "invalid_api_key" if exc.status == 401 else "forbidden"
        raise OpenAIError(exc.status, exc.message, type_="invalid_request_error", code=code) from None
    if channel != "api":
        # The dashboard's token is the operator's login, not an API caller's.
        raise OpenAIError(
            401, "use a token from server.api_users", type_="invalid_request_error", code="invalid_api_key"
        )
    return principal


def _openai_errors(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response()
        except web.HTTPException as exc:  # e.g. a body larger than client_max_size
            if exc.status < 400:
                raise
            status = exc.status if exc.status < 500 else 400
            return OpenAIError(status, exc.reason, type_="invalid_request_error", code="invalid_request").response()

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


@_openai_errors
async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the agent, as the one model."""
    ctx = request.app[CTX]
    await _caller(request)
    entry = {"id": model_id(ctx), "object": "model", "created": 0, "owned_by": "goclaw"}
    return web.json_response({"object": "list", "data": [entry]})


@_openai_errors
async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions: one turn of the token's user; the reply as a completion (or SSE)."""
    ctx = request.app[CTX]
    principal = await _caller(request, for_turn=True)
    try:
        # The one safe JSON reader every chat surface uses: bounded depth, no huge integers.
        body = parse_json(await request.read() or b"null")
    except ApiError as exc:
        raise _invalid(exc.message) from None
    text, stream, user_session = parse_completion_request(
        body, model=model_id(ctx), max_chars=ctx.config.server.max_message_chars
    )
    header_session = request.headers.get(SESSION_HEADER, "").strip()
    if len(header_session) > 200:
        raise _invalid(f"the {SESSION_HEADER} header must be at most 200 characters")
    # A client's Idempotency-Key makes its retries one turn, as message_id does on /v1/chat.
    key = request.headers.get("Idempotency-Key", "").strip()
    try:
        check_message_id(key or None, field="Idempotency-Key")
    except ApiError:
        raise _invalid(f"the Idempotency-Key header must be {MESSAGE_ID_RULE}") from None
    # Without a named session, a retry must still land in the session of its first try.
    keyed = "openai-key-" + hashlib.sha256(key.encode()).hexdigest()[:16] if key else ""
    session = header_session or user_session or keyed or "openai-" + secrets.token_hex(8)
    completion_id = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())
    headers = {SESSION_HEADER: session}
    sse = _SseReply(request, completion_id, created, model_id(ctx), headers) if stream else None
    try:
        result: TurnResult = await run_turn(
            ctx,
            TurnRequest(
                key=_conversation(principal, "api", session),
                principal=principal,
                text=text,
                message_id=f"openai-{key}" if key else "openai-" + secrets.token_hex(8),
                said_at=datetime.now(UTC),
                display_name=principal.display_name,
            ),
            on_chunk=sse.delta if sse is not None else None,
        )
    except ApiError as exc:  # the token's user is gone (nothing was stored): as a wrong key would be
        raise OpenAIError(exc.status, exc.message, type_="invalid_request_error", code="forbidden") from None
    except Exception as exc:
        if sse is None or not sse.started:
            raise  # the status is still ours to choose (errors_middleware: 503 for storage, else 500)
        # Tokens are out, so no status can be sent: end the stream with an error event.
        reason = storage_reason(exc)
        if reason is not None:
            assert ctx.write_health is not None
            ctx.write_health.failed(reason)
            message = STORAGE_MESSAGE.format(reason=reason)
        else:
            log.exception("streamed completion failed")
            message = "internal error; it has been logged"
        return await sse.fail(OpenAIError(503, message, type_="server_error", code="unavailable"))
    if sse is not None and sse.started:
        return await sse.finish(result)
    if result.duplicate and result.reply is None:
        raise OpenAIError(
            409,
            "this request (Idempotency-Key) is being answered; retry in a moment",
            type_="invalid_request_error",
            code="duplicate",
        )
    # A retry of an answered request gets the same answer again (the stored reply), not a new turn.
    if result.failed:
        raise _unavailable()
    reply = result.reply or ""
    if sse is not None:
        return await sse.finish(result)
    prompt_tokens, completion_tokens = estimate_tokens(text), estimate_tokens(reply)
    return web.json_response(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model_id(ctx),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        },
        headers=headers,
    )


def _unavailable() -> OpenAIError:
    return OpenAIError(503, "the model is unavailable; try again later", type_="server_error", code="unavailable")


class _SseReply:
    """Server-sent events of one completion, opened by its first piece of text.

    A role delta, the content as the turn streams it, a stop, then ``data: [DONE]``.
    """

    def __init__(
        self, request: web.Request, completion_id: str, created: int, model: str, headers: dict[str, str]
    ) -> None:
        self._request = request
        self._base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._headers = headers
        self._response: web.StreamResponse | None = None
        self._sent: list[str] = []
        self._gone = False  # the client went away: the turn goes on, nothing more is written

    @property
    def started(self) -> bool:
        """Whether the SSE response has begun (a status can no longer be chosen)."""
        return self._response is not None

    async def delta(self, text: str) -> None:
        """The turn's chunk sink: one content delta (the gateway's own failure notice is not content)."""
        if isinstance(text, GatewayNotice) or not text:
            return
        if self._response is None:
            self._response = web.StreamResponse(
                status=200,
                headers={**self._headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            )
            await self._response.prepare(self._request)
            await self._event({"role": "assistant", "content": ""})
        self._sent.append(text)
        await self._event({"content": text})

    async def finish(self, result: TurnResult) -> web.StreamResponse:
        """End the stream: what the stored reply adds, a stop (or an error event), ``[DONE]``."""
        reply = result.reply or ""
        if self._response is None:
            # Nothing streamed (a redelivery answered before, a directive's reply came whole).
            await self.delta(reply)
        elif not result.failed and not "".join(self._sent).rstrip().endswith(reply):
            await self.delta("\n\n" + reply)
        if result.failed:
            return await self.fail(_unavailable())
        await self._event({}, finish="stop")
        await self._write(b"data: [DONE]\n\n")
        return await self._end()

    async def fail(self, error: OpenAIError) -> web.StreamResponse:
        """End a started stream with the error event an OpenAI client raises (its status is long sent)."""
        body = {"error": {"message": error.message, "type": error.type, "param": None, "code": error.code}}
        await self._write(f"data: {json.dumps(body)}\n\n".encode())
        return await self._end()

    async def _end(self) -> web.StreamResponse:
        assert self._response is not None
        if not self._gone:
            await self._response.write_eof()
        return self._response

    async def _event(self, delta: dict[str, str], finish: str | None = None) -> None:
        chunk = {**self._base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        await self._write(f"data: {json.dumps(chunk)}\n\n".encode())

    async def _write(self, data: bytes) -> None:
        assert self._response is not None
        if self._gone:
            return
        try:
            await self._response.write(data)
        except ConnectionError:
            self._gone = True
            log.info("client left while a completion streamed; the turn still stores its reply")


def add_routes(app: web.Application) -> None:
    """Mount the endpoint (``server.openai_compat: true``)."""
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
