"""OpenAI-compatible chat completions (OpenAI, Ollama, vLLM, LM Studio, llama.cpp).

The one network chokepoint to such a server: the official ``openai`` SDK's
``AsyncOpenAI``, pointed at ``base_url``, with its own retries off so that
``gateway.llm.retry`` applies one policy to every provider.

Requests go through the client's lower-level ``post`` with the wire-format body
this module builds, not through ``chat.completions.create``: ``create`` runs the
SDK's TypedDict transform over every message and tool on each call, which cost
about 8 ms of CPU for a 30-message history (bench/provider_cpu.py), several times
the rest of a turn. The SDK still owns the HTTP client, timeouts, the error
classes (status, headers, body) that the retry policy reads, and SSE decoding.

With a delta sink the same request goes out with ``"stream": true`` (and
``stream_options.include_usage`` for the token counts); the SDK's ``AsyncStream``
decodes the SSE events into plain dicts (``cast_to=object``, no model objects),
text deltas go to the sink as they arrive, and tool-call deltas are assembled by
their ``index`` into whole calls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import openai

from gateway.llm.base import ChatMessage, Completion, DeltaSink, JsonSchema, Tool, ToolCall
from gateway.llm.retry import is_retryable_status
from gateway.llm.sdk import SdkProvider

log = logging.getLogger(__name__)

# Local servers (Ollama, vLLM, llama.cpp) ignore the key, but the SDK insists on one.
NO_API_KEY = "not-needed"


def _is_retryable(exc: BaseException) -> bool:
    # APITimeoutError is a subclass of APIConnectionError.
    if isinstance(exc, openai.APIConnectionError):
        return True
    return isinstance(exc, openai.APIStatusError) and is_retryable_status(exc.status_code)


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


class OpenAIProvider(SdkProvider[openai.AsyncOpenAI]):
    """A model behind any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    name = "openai"

    sdk_errors = (openai.OpenAIError,)

    def _make_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=self._api_key or NO_API_KEY,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,  # gateway.llm.retry decides, the same way for every provider
            # The SDK's aiohttp transport: its default (httpx) pool scans every connection for each
            # request, which with hundreds of model calls in flight was most of a turn's CPU.
            http_client=openai.DefaultAioHttpClient(timeout=self.timeout),
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
        client = self._require_client()
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
        if on_delta is not None:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
            return await self._call_streaming(lambda sink: self._read_stream(client, request, sink), on_delta)
        response = await self._call(lambda: self._post_json(client, request))
        return self._parse(response)

    async def _post_json(self, client: openai.AsyncOpenAI, request: dict[str, Any]) -> Any:
        # cast_to=object: the SDK returns the decoded JSON body as is (no model
        # construction); status errors are still raised as openai.APIStatusError.
        return await client.post("/chat/completions", body=request, cast_to=object)

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

    async def _read_stream(self, client: openai.AsyncOpenAI, request: dict[str, Any], sink: DeltaSink) -> Completion:
        """One streamed attempt, read to its end: text to ``sink``, tool calls and usage assembled."""
        stream = await client.post(
            "/chat/completions",
            body=request,
            cast_to=object,
            stream=True,
            stream_cls=openai.AsyncStream[object],
        )
        texts: list[str] = []
        refusals: list[str] = []
        # Tool calls arrive in pieces keyed by index: the first names the call, the
        # rest add to its arguments (a JSON string cut anywhere).
        calls: dict[int, dict[str, Any]] = {}
        model = self.model
        usage: Mapping[str, Any] = {}
        try:
            async for chunk in stream:
                if not isinstance(chunk, Mapping):
                    continue
                model = chunk.get("model") or model
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
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
        finally:
            await stream.close()
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
