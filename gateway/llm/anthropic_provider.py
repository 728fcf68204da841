"""Anthropic's Messages API.

The one network chokepoint to Anthropic: the official ``anthropic`` SDK's
``AsyncAnthropic`` (``base_url`` configurable, so tests point it at a local
server), with its own retries off so that ``gateway.llm.retry`` decides.

With a delta sink the call streams (``"stream": true``): the SDK decodes the
events (message_start, content_block_start / _delta / _stop, message_delta,
message_stop); ``text_delta`` pieces go to the sink as they arrive and
``input_json_delta`` pieces are joined into each ``tool_use`` block's input.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import anthropic

from gateway.llm.base import ChatMessage, Completion, DeltaSink, JsonSchema, Tool, ToolCall
from gateway.llm.retry import is_retryable_status
from gateway.llm.sdk import SdkProvider

try:  # the HTTP library the SDK is built on (httpx2 in recent releases, httpx before)
    from httpx2 import RequestError as _HttpRequestError
except ImportError:  # pragma: no cover - older SDKs
    from httpx import RequestError as _HttpRequestError  # type: ignore[no-redef,unused-ignore]

log = logging.getLogger(__name__)

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _is_retryable(exc: BaseException) -> bool:
    # APITimeoutError is a subclass of APIConnectionError; 529 "overloaded" is a 5xx.
    if isinstance(exc, anthropic.APIConnectionError):
        return True
    return isinstance(exc, anthropic.APIStatusError) and is_retryable_status(exc.status_code)


def strip_json_answer(text: str) -> str:
    """The JSON document in a model's answer: code fences and any prose around it removed."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    if stripped and stripped[0] not in "{[":
        # "Here is the JSON: {...}" -- keep the outermost object.
        start, end = stripped.find("{"), stripped.rfind("}")
        if 0 <= start < end:
            stripped = stripped[start : end + 1]
    return stripped


def json_instruction(schema: JsonSchema) -> str:
    """The system-prompt instruction standing in for OpenAI's ``response_format``."""
    return (
        f"Answer with only a JSON document (named {schema.name}) that matches this JSON Schema. "
        "No prose before or after it and no code fences.\n"
        f"JSON Schema:\n{json.dumps(dict(schema.schema), indent=2, sort_keys=True)}"
    )


def _tool_call_as_text(call: ToolCall) -> str:
    return f"[called tool {call.name} with {json.dumps(dict(call.arguments), sort_keys=True)}]"


def messages_to_wire(messages: Sequence[ChatMessage], *, tools_offered: bool) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` text and the ``messages`` list of a Messages API request.

    System messages go to ``system`` (the API has no system role). Tool results
    become ``tool_result`` blocks in a user turn. Consecutive turns of one role are
    merged, since every tool_result answering an assistant turn must sit in the
    single user turn that follows it. When no tools are offered (the tool loop's
    last, text-only call), tool blocks are written as text instead: the API refuses
    tool_use/tool_result blocks in a request that defines no tools.
    """
    system_parts: list[str] = []
    wire: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})

    def text_block(text: str) -> list[dict[str, Any]]:
        # The API rejects empty text blocks.
        return [{"type": "text", "text": text}] if text.strip() else []

    for message in messages:
        if message.role == "system":
            if message.content.strip():
                system_parts.append(message.content)
        elif message.role == "user":
            add("user", text_block(message.content))
        elif message.role == "assistant":
            blocks = text_block(message.content)
            for call in message.tool_calls:
                if tools_offered:
                    blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)})
                else:
                    blocks.extend(text_block(_tool_call_as_text(call)))
            add("assistant", blocks)
        elif tools_offered:
            add(
                "user",
                [{"type": "tool_result", "tool_use_id": message.tool_call_id or "", "content": message.content}],
            )
        else:
            add("user", text_block(f"[result of tool {message.name or message.tool_call_id}: {message.content}]"))
    return "\n\n".join(system_parts), wire


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """One Tool in the Messages API ``tools`` format."""
    return {"name": tool.name, "description": tool.description, "input_schema": dict(tool.parameters)}


class AnthropicProvider(SdkProvider[anthropic.AsyncAnthropic]):
    """A Claude model behind the Messages API (``POST /v1/messages``).

    ``base_url`` is the API root without ``/v1``. ``temperature`` is accepted for a
    uniform constructor and not sent: the installed SDK's ``messages.create`` no
    longer takes it. ``max_tokens`` is required by the API.
    """

    name = "anthropic"

    sdk_errors = (anthropic.AnthropicError,)
    # The SDK's stream iterator lets its HTTP library's read errors through unwrapped.
    stream_errors = (_HttpRequestError,)

    def _make_client(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key=self._api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,  # gateway.llm.retry decides, the same way for every provider
        )

    @staticmethod
    def _is_retryable(exc: BaseException) -> bool:
        return _is_retryable(exc)

    def _request(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool], json_schema: JsonSchema | None
    ) -> dict[str, Any]:
        system, wire = messages_to_wire(messages, tools_offered=bool(tools))
        if json_schema is not None:
            system = f"{system}\n\n{json_instruction(json_schema)}" if system else json_instruction(json_schema)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": wire,
            "max_tokens": self.max_tokens,
        }
        if system:
            request["system"] = system
        if tools:
            request["tools"] = [tool_to_wire(t) for t in tools]
        return request

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool] = (),
        json_schema: JsonSchema | None = None,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        """One Messages API call (streamed to ``on_delta`` when given); raises LLMUnavailable after retries.

        With ``json_schema``, the schema is put in the system prompt (the API has no
        ``response_format``) and the answer's text is reduced to the JSON document.
        """
        client = self._require_client()
        request = self._request(messages, tools, json_schema)
        if on_delta is not None:
            completion = await self._call_streaming(lambda sink: self._read_stream(client, request, sink), on_delta)
            if json_schema is not None:
                return Completion(
                    strip_json_answer(completion.text),
                    completion.tool_calls,
                    completion.model,
                    completion.input_tokens,
                    completion.output_tokens,
                )
            return completion
        response = await self._call(lambda: client.messages.create(**request))
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in response.content or []:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                arguments = block.input if isinstance(block.input, dict) else {}
                calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
        text = "".join(texts)
        if json_schema is not None:
            text = strip_json_answer(text)
        usage = response.usage
        return Completion(
            text=text,
            tool_calls=tuple(calls),
            model=response.model or self.model,
            input_tokens=(usage.input_tokens or 0) if usage else 0,
            output_tokens=(usage.output_tokens or 0) if usage else 0,
        )

    async def _read_stream(
        self, client: anthropic.AsyncAnthropic, request: dict[str, Any], sink: DeltaSink
    ) -> Completion:
        """One streamed attempt, read to its end: text to ``sink``, tool_use blocks and usage assembled."""
        stream = await client.messages.create(**request, stream=True)
        texts: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}  # tool_use blocks by index: id, name, input JSON pieces
        model = self.model
        input_tokens = output_tokens = 0
        try:
            async for event in stream:
                kind = event.type
                if kind == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta":
                        if delta.text:
                            texts.append(delta.text)
                            await sink(delta.text)
                    elif delta.type == "input_json_delta" and event.index in blocks:
                        blocks[event.index]["json"].append(delta.partial_json)
                elif kind == "content_block_start":
                    block = event.content_block
                    if block.type == "tool_use":
                        blocks[event.index] = {"id": block.id, "name": block.name, "json": []}
                elif kind == "message_start":
                    model = event.message.model or model
                    usage = event.message.usage
                    input_tokens = (usage.input_tokens or 0) if usage else 0
                    output_tokens = (usage.output_tokens or 0) if usage else 0
                elif kind == "message_delta" and event.usage is not None:
                    # Cumulative: the count so far, not an increment.
                    output_tokens = event.usage.output_tokens or output_tokens
        finally:
            await stream.close()
        calls = [
            ToolCall(id=b["id"], name=b["name"], arguments=_tool_input("".join(b["json"]), b["name"]))
            for _index, b in sorted(blocks.items())
        ]
        return Completion(
            text="".join(texts),
            tool_calls=tuple(calls),
            model=model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )


def _tool_input(raw: str, tool_name: str) -> dict[str, Any]:
    """A streamed tool_use block's input; malformed JSON becomes ``{}`` so the turn goes on."""
    if not raw.strip():
        return {}  # a tool called with no arguments streams no input_json_delta at all
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("model sent malformed input for tool %s: %.200r; using {}", tool_name, raw)
        return {}
    return value if isinstance(value, dict) else {}
