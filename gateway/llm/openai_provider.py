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
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

from gateway.llm.base import ChatMessage, Completion, JsonSchema, LLMUnavailable, Tool, ToolCall
from gateway.llm.retry import describe_failure, is_retryable_status
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
    ) -> Completion:
        """One chat completion; raises LLMUnavailable after retries."""
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

    async def stream(self, messages: Sequence[ChatMessage]) -> AsyncGenerator[str, None]:
        """Text chunks of a reply without tools.

        Only opening the stream is retried: once text has gone out to the person,
        a retry would repeat it, so a failure mid-stream raises LLMUnavailable.
        """
        client = self._require_client()
        request = {**self._base_request(messages), "stream": True}
        stream = await self._call(
            lambda: client.post(
                "/chat/completions",
                body=request,
                cast_to=ChatCompletionChunk,
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )
        )
        try:
            async for chunk in stream:
                for choice in chunk.choices or []:
                    delta = choice.delta.content if choice.delta else None
                    if delta:
                        yield delta
        except openai.OpenAIError as exc:
            raise LLMUnavailable(f"{self._label} stream interrupted: {describe_failure(exc)}") from exc
        finally:
            await stream.close()
