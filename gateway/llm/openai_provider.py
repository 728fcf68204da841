"""OpenAI-compatible chat completions (OpenAI, Ollama, vLLM, LM Studio, llama.cpp).

The one network chokepoint to such a server: the official ``openai`` SDK's
``AsyncOpenAI``, pointed at ``base_url``, with its own retries off so that
``gateway.llm.retry`` applies one policy to every provider.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import openai

from gateway.llm.base import ChatMessage, Completion, JsonSchema, LLMUnavailable, Tool, ToolCall
from gateway.llm.retry import describe_failure, is_retryable_status, with_retries

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


class OpenAIProvider:
    """A model behind any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    name = "openai"

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
            model: Model name as the server knows it (``gpt-4o-mini``, ``llama3.1``).
            base_url: Server URL ending in ``/v1``; None for api.openai.com.
            api_key: Bearer key; None for a local server that needs none.
            timeout: Seconds for one HTTP attempt.
            max_retries: Retries after the first attempt (429, 5xx, timeouts, connection errors).
            temperature: Sampling temperature.
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
        self._client: openai.AsyncOpenAI | None = None

    async def start(self) -> None:
        """Create the HTTP client (no request is made)."""
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key or NO_API_KEY,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,  # gateway.llm.retry decides, the same way for every provider
            )

    async def stop(self) -> None:
        """Close the HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> OpenAIProvider:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def _label(self) -> str:
        return f"{self.name} model {self.model!r}"

    def _require_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            raise RuntimeError("OpenAIProvider used before start(): call `await provider.start()` first")
        return self._client

    async def _call(self, request: Callable[[], Awaitable[Any]]) -> Any:
        return await with_retries(
            request,
            attempts=self.max_retries + 1,
            base_delay=self._retry_base_delay,
            max_delay=self._retry_max_delay,
            sleep=self._sleep,
            is_retryable=_is_retryable,
            errors=(openai.OpenAIError,),
            describe=describe_failure,
            label=self._label,
        )

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
        response = await self._call(lambda: client.chat.completions.create(**request))
        return self._parse(response)

    def _parse(self, response: Any) -> Completion:
        choices = response.choices or []
        if not choices:
            log.warning("%s answered with no choices", self._label)
            return Completion(text="", model=response.model or self.model)
        message = choices[0].message
        text = message.content or getattr(message, "refusal", None) or ""
        calls: list[ToolCall] = []
        for raw_call in message.tool_calls or []:
            function = getattr(raw_call, "function", None)
            if function is None:
                # Custom (non-function) tool calls are not something the gateway offers.
                log.warning("%s sent a %r tool call; ignored", self._label, getattr(raw_call, "type", "?"))
                continue
            calls.append(
                ToolCall(
                    id=raw_call.id or f"call_{len(calls)}",
                    name=function.name,
                    arguments=parse_arguments(function.arguments, function.name),
                )
            )
        usage = response.usage
        return Completion(
            text=text,
            tool_calls=tuple(calls),
            model=response.model or self.model,
            input_tokens=(usage.prompt_tokens or 0) if usage else 0,
            output_tokens=(usage.completion_tokens or 0) if usage else 0,
        )

    async def stream(self, messages: Sequence[ChatMessage]) -> AsyncGenerator[str, None]:
        """Text chunks of a reply without tools.

        Only opening the stream is retried: once text has gone out to the person,
        a retry would repeat it, so a failure mid-stream raises LLMUnavailable.
        """
        client = self._require_client()
        request = {**self._base_request(messages), "stream": True}
        stream = await self._call(lambda: client.chat.completions.create(**request))
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
