"""The openai and anthropic providers against local servers speaking their real wire formats."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.llm.anthropic_provider import AnthropicProvider
from gateway.llm.base import ChatMessage, JsonSchema, LLMUnavailable, Tool
from gateway.llm.limit import ModelCallLimit
from gateway.llm.loop import ROUND_BREAK, run_tool_loop
from gateway.llm.openai_provider import OpenAIProvider
from pairing.principal import Principal, Role
from tests.peers.fake_anthropic import FakeAnthropic
from tests.peers.fake_openai import FakeOpenAI

PROVIDERS = ["openai", "anthropic"]
ALICE = Principal.human("u_alice", Role.USER, "Alice")
CONVERSATION = [
    ChatMessage(role="system", content="You are the team's assistant."),
    ChatMessage(role="user", content="Where does the daily report come from?"),
]
LOOKUP_PARAMS = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


@dataclass
class Harness:
    """A provider wired to its fake peer, with retry sleeps recorded instead of slept."""

    kind: str
    peer: FakeOpenAI | FakeAnthropic
    provider: OpenAIProvider | AnthropicProvider
    sleeps: list[float] = field(default_factory=list)

    def tool_result(self, body: Mapping[str, Any]) -> tuple[str, str]:
        """(tool call id, result text) of the last message, read in this provider's wire format."""
        last = body["messages"][-1]
        if self.kind == "openai":
            assert last["role"] == "tool"
            return last["tool_call_id"], last["content"]
        assert last["role"] == "user"
        (block,) = last["content"]
        assert block["type"] == "tool_result"
        return block["tool_use_id"], block["content"]

    def offered_tool_names(self, body: Mapping[str, Any]) -> list[str]:
        """Names of the tools a request offered."""
        if self.kind == "openai":
            return [t["function"]["name"] for t in body.get("tools", [])]
        return [t["name"] for t in body.get("tools", [])]


def _make_provider(
    kind: str, base_url: str, sleeps: list[float], **overrides: Any
) -> OpenAIProvider | AnthropicProvider:
    async def record_sleep(delay: float) -> None:
        sleeps.append(delay)

    settings: dict[str, Any] = {
        "base_url": base_url,
        "timeout": 5.0,
        "max_retries": 3,
        "temperature": 0.2,
        "max_tokens": 256,
        "sleep": record_sleep,
        **overrides,
    }
    if kind == "openai":
        return OpenAIProvider(model="gpt-test", api_key="sk-test", **settings)
    return AnthropicProvider(model="claude-test", api_key="sk-ant-test", **settings)


@pytest.fixture(params=PROVIDERS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """Each provider, started, against its own fake peer."""
    peer: FakeOpenAI | FakeAnthropic = FakeOpenAI() if request.param == "openai" else FakeAnthropic()
    sleeps: list[float] = []
    async with peer:
        provider = _make_provider(request.param, peer.base_url, sleeps)
        async with provider:
            yield Harness(request.param, peer, provider, sleeps)


def _lookup_tool(seen: list[Mapping[str, Any]], answer: str = "the warehouse database") -> Tool:
    async def lookup(principal: Principal, args: Mapping[str, Any]) -> str:
        seen.append(args)
        return answer

    return Tool("lookup", "Look a fact up.", LOOKUP_PARAMS, lookup)


# ---- plain replies --------------------------------------------------------------------------


async def test_plain_reply_returns_text_model_and_usage(harness: Harness) -> None:
    harness.peer.reply_text("From the warehouse database.", usage=(31, 6))

    completion = await harness.provider.complete(CONVERSATION)

    assert completion.text == "From the warehouse database."
    assert completion.tool_calls == ()
    assert completion.model == harness.provider.model
    assert (completion.input_tokens, completion.output_tokens) == (31, 6)
    (body,) = harness.peer.requests
    assert body["max_tokens"] == 256
    assert "tools" not in body


async def test_openai_request_uses_chat_completions_messages_and_bearer_key() -> None:
    async with FakeOpenAI() as peer:
        peer.reply_text("hi")
        async with _make_provider("openai", peer.base_url, []) as provider:
            await provider.complete(CONVERSATION)
    assert peer.requests[0]["messages"] == [
        {"role": "system", "content": "You are the team's assistant."},
        {"role": "user", "content": "Where does the daily report come from?"},
    ]
    assert peer.requests[0]["temperature"] == 0.2
    assert peer.headers[0]["authorization"] == "Bearer sk-test"


async def test_openai_local_server_without_api_key_gets_a_placeholder() -> None:
    async with FakeOpenAI() as peer:
        peer.reply_text("hi from ollama")
        provider = OpenAIProvider(model="llama3.1", base_url=peer.base_url, api_key=None)
        async with provider:
            completion = await provider.complete(CONVERSATION)
    assert completion.text == "hi from ollama"
    assert peer.headers[0]["authorization"] == "Bearer not-needed"


async def test_anthropic_request_puts_system_prompt_in_system_and_sends_api_key() -> None:
    async with FakeAnthropic() as peer:
        peer.reply_text("hi")
        async with _make_provider("anthropic", peer.base_url, []) as provider:
            await provider.complete(CONVERSATION)
    body = peer.requests[0]
    assert body["system"] == "You are the team's assistant."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where does the daily report come from?"}]}
    ]
    # The SDK decides the header (x-api-key, or a bearer token in recent versions).
    sent = peer.headers[0]
    assert sent.get("x-api-key") == "sk-ant-test" or sent.get("authorization") == "Bearer sk-ant-test"
    assert "anthropic-version" in peer.headers[0]


async def test_anthropic_does_not_send_temperature() -> None:
    # The SDK's messages.create takes no temperature any more; sending it would be refused.
    async with FakeAnthropic() as peer:
        peer.reply_text("hi")
        async with _make_provider("anthropic", peer.base_url, [], temperature=1.5) as provider:
            await provider.complete(CONVERSATION)
    assert "temperature" not in peer.requests[0]
    assert peer.rejections == []


# ---- tool calls -----------------------------------------------------------------------------


async def test_tool_call_round_trip_sends_the_result_back_in_wire_format(harness: Harness) -> None:
    seen: list[Mapping[str, Any]] = []
    (call_id,) = harness.peer.reply_tool_calls(("lookup", {"q": "daily report"}))
    harness.peer.reply_text("It comes from the warehouse database.")

    result = await run_tool_loop(harness.provider, CONVERSATION, [_lookup_tool(seen)], ALICE, max_steps=4)

    assert result.text == "It comes from the warehouse database."
    assert result.tool_calls_made == [("lookup", {"q": "daily report"}, "the warehouse database")]
    assert result.steps == 2
    assert result.model == harness.provider.model
    assert seen == [{"q": "daily report"}]
    first, second = harness.peer.requests
    assert harness.offered_tool_names(first) == ["lookup"]
    assert harness.tool_result(second) == (call_id, "the warehouse database")
    assert harness.peer.rejections == []


async def test_openai_tool_wire_format_matches_chat_completions() -> None:
    async with FakeOpenAI() as peer:
        (call_id,) = peer.reply_tool_calls(("lookup", {"q": "x"}))
        peer.reply_text("done")
        async with _make_provider("openai", peer.base_url, []) as provider:
            await run_tool_loop(provider, CONVERSATION, [_lookup_tool([])], ALICE, max_steps=3)
    first, second = peer.requests
    assert first["tools"] == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look a fact up.", "parameters": LOOKUP_PARAMS},
        }
    ]
    assistant = second["messages"][-2]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [
        {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": "x"})}}
    ]


async def test_anthropic_tool_wire_format_uses_tool_use_and_tool_result_blocks() -> None:
    async with FakeAnthropic() as peer:
        first_id, second_id = peer.reply_tool_calls(("lookup", {"q": "a"}), ("lookup", {"q": "b"}), text="Checking.")
        peer.reply_text("done")
        async with _make_provider("anthropic", peer.base_url, []) as provider:
            await run_tool_loop(provider, CONVERSATION, [_lookup_tool([])], ALICE, max_steps=3)
    first, second = peer.requests
    assert first["tools"] == [{"name": "lookup", "description": "Look a fact up.", "input_schema": LOOKUP_PARAMS}]
    assistant, results = second["messages"][-2:]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": first_id, "name": "lookup", "input": {"q": "a"}},
            {"type": "tool_use", "id": second_id, "name": "lookup", "input": {"q": "b"}},
        ],
    }
    # Both results answer the one assistant turn, so they share one user turn.
    assert results["role"] == "user"
    assert [b["tool_use_id"] for b in results["content"]] == [first_id, second_id]
    assert peer.rejections == []


async def test_openai_malformed_tool_arguments_become_empty_and_the_loop_goes_on() -> None:
    seen: list[Mapping[str, Any]] = []
    async with FakeOpenAI() as peer:
        peer.reply_tool_calls(("lookup", '{"q": "unterminated'))
        peer.reply_text("I could not look that up.")
        async with _make_provider("openai", peer.base_url, []) as provider:
            result = await run_tool_loop(provider, CONVERSATION, [_lookup_tool(seen)], ALICE, max_steps=3)
    assert seen == [{}]
    assert result.text == "I could not look that up."
    # What goes back to the server is valid JSON again.
    assert json.loads(peer.requests[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]) == {}


async def test_unauthorized_tool_call_gets_the_refusal_and_the_handler_never_runs(harness: Harness) -> None:
    ran: list[Mapping[str, Any]] = []

    async def distill(principal: Principal, args: Mapping[str, Any]) -> str:
        ran.append(args)
        return "distilled"

    def admins_only(principal: Principal) -> str | None:
        return None if principal.role is Role.ADMIN else "notes_distill is for admins only"

    tools = [_lookup_tool([]), Tool("notes_distill", "Distil notes.", {"type": "object"}, distill, admins_only)]
    # A hostile or confused model calls the tool it was never offered.
    (call_id,) = harness.peer.reply_tool_calls(("notes_distill", {}))
    harness.peer.reply_text("I can't do that for you.")

    result = await run_tool_loop(harness.provider, CONVERSATION, tools, ALICE, max_steps=3)

    assert ran == []
    assert result.tool_calls_made == [("notes_distill", {}, "notes_distill is for admins only")]
    first, second = harness.peer.requests
    assert harness.offered_tool_names(first) == ["lookup"]
    assert harness.tool_result(second) == (call_id, "notes_distill is for admins only")
    assert result.text == "I can't do that for you."


async def test_max_steps_reached_asks_once_more_without_tools_for_a_final_text(harness: Harness) -> None:
    seen: list[Mapping[str, Any]] = []
    harness.peer.reply_tool_calls(("lookup", {"q": "1"}))
    harness.peer.reply_tool_calls(("lookup", {"q": "2"}))
    harness.peer.reply_text("Here is what I found so far.")

    result = await run_tool_loop(harness.provider, CONVERSATION, [_lookup_tool(seen)], ALICE, max_steps=2)

    assert result.text == "Here is what I found so far."
    assert result.steps == 3
    assert len(result.tool_calls_made) == 2
    final = harness.peer.requests[-1]
    assert "tools" not in final
    # The real APIs accept the tool history in a tool-less request (the fakes check it).
    assert harness.peer.rejections == []


async def test_max_steps_with_a_silent_model_gives_a_polite_fallback(harness: Harness) -> None:
    harness.peer.reply_tool_calls(("lookup", {"q": "1"}))
    harness.peer.reply_text("")

    result = await run_tool_loop(harness.provider, CONVERSATION, [_lookup_tool([])], ALICE, max_steps=1)

    assert result.text.startswith("Sorry")
    assert result.steps == 2


# ---- retries and failures -------------------------------------------------------------------


async def test_429_then_success_honours_retry_after(harness: Harness) -> None:
    harness.peer.reply_error(429, "Rate limit reached", retry_after=2)
    harness.peer.reply_text("ok")

    completion = await harness.provider.complete(CONVERSATION)

    assert completion.text == "ok"
    assert len(harness.peer.requests) == 2
    assert harness.sleeps == [2.0]


async def test_503_then_success_backs_off_without_retry_after(harness: Harness) -> None:
    harness.peer.reply_error(503)
    harness.peer.reply_text("ok")

    assert (await harness.provider.complete(CONVERSATION)).text == "ok"
    (delay,) = harness.sleeps
    assert 0.25 <= delay <= 0.5  # half to all of the first 0.5 s step


async def test_500_on_every_attempt_raises_unavailable_naming_the_cause(harness: Harness) -> None:
    for _ in range(4):
        harness.peer.reply_error(500, "upstream exploded")

    with pytest.raises(LLMUnavailable, match=r"unavailable after 4 attempts: 500 Internal Server Error"):
        await harness.provider.complete(CONVERSATION)

    assert len(harness.peer.requests) == 4
    assert len(harness.sleeps) == 3
    assert harness.sleeps[0] < harness.sleeps[2]  # backing off


@pytest.mark.parametrize(
    ("status", "fragment"),
    [
        (401, "the model rejected the API key (401)"),
        (400, "the model rejected the request (400)"),
        (404, "the model or endpoint was not found (404)"),
    ],
)
async def test_client_errors_raise_at_once_without_retrying(harness: Harness, status: int, fragment: str) -> None:
    harness.peer.reply_error(status, "nope")
    harness.peer.reply_text("never sent")

    with pytest.raises(LLMUnavailable) as caught:
        await harness.provider.complete(CONVERSATION)

    assert fragment in str(caught.value)
    assert "nope" in str(caught.value)
    assert len(harness.peer.requests) == 1
    assert harness.sleeps == []


async def test_timeout_is_retried(harness: Harness) -> None:
    # The slow answer is far past the timeout and the second comes at once, so a loaded
    # machine cannot make the second attempt time out too (the peer's shutdown ends the first).
    harness.peer.reply_text("too slow", delay=30)
    harness.peer.reply_text("in time")
    sleeps: list[float] = []

    async with _make_provider(harness.kind, harness.peer.base_url, sleeps, timeout=3.0) as provider:
        assert (await provider.complete(CONVERSATION)).text == "in time"

    assert len(harness.peer.requests) == 2
    assert len(sleeps) == 1


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_connection_refused_raises_unavailable_after_retries(kind: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")
    sleeps: list[float] = []
    async with _make_provider(kind, base_url, sleeps, max_retries=1) as provider:
        with pytest.raises(LLMUnavailable, match=r"after 2 attempts: could not connect"):
            await provider.complete(CONVERSATION)
    assert len(sleeps) == 1


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_complete_before_start_says_to_start(kind: str) -> None:
    provider = _make_provider(kind, "http://127.0.0.1:9/v1", [])
    with pytest.raises(RuntimeError, match=r"start\(\)"):
        await provider.complete(CONVERSATION)


# ---- structured output ----------------------------------------------------------------------

EXTRACTION = JsonSchema(
    name="extraction_result",
    schema={"type": "object", "properties": {"items": {"type": "array"}}, "required": ["items"]},
)


async def test_openai_json_schema_is_sent_as_response_format() -> None:
    async with FakeOpenAI() as peer:
        peer.reply_text('{"items": []}')
        async with _make_provider("openai", peer.base_url, []) as provider:
            completion = await provider.complete(CONVERSATION, json_schema=EXTRACTION)
    assert peer.requests[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "extraction_result", "schema": dict(EXTRACTION.schema), "strict": False},
    }
    assert json.loads(completion.text) == {"items": []}


async def test_anthropic_json_schema_goes_in_the_system_prompt_and_fences_are_stripped() -> None:
    async with FakeAnthropic() as peer:
        peer.reply_text('```json\n{"items": [{"kind": "preference"}]}\n```')
        async with _make_provider("anthropic", peer.base_url, []) as provider:
            completion = await provider.complete(CONVERSATION, json_schema=EXTRACTION)
    body = peer.requests[0]
    assert "response_format" not in body
    assert body["system"].startswith("You are the team's assistant.")
    assert "extraction_result" in body["system"]
    assert json.dumps(dict(EXTRACTION.schema), indent=2, sort_keys=True) in body["system"]
    assert json.loads(completion.text) == {"items": [{"kind": "preference"}]}


# ---- streaming ------------------------------------------------------------------------------


class Sink:
    """Collects streamed pieces; ``first`` is set by the first one."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.first = asyncio.Event()

    async def __call__(self, text: str) -> None:
        self.pieces.append(text)
        self.first.set()


async def test_streaming_sends_each_piece_and_returns_the_whole_answer_with_usage(harness: Harness) -> None:
    harness.peer.reply_text("", chunks=["The report ", "comes from ", "the warehouse."], usage=(40, 9))
    sink = Sink()

    completion = await harness.provider.complete(CONVERSATION, on_delta=sink)

    assert sink.pieces == ["The report ", "comes from ", "the warehouse."]
    assert completion.text == "The report comes from the warehouse."
    assert completion.tool_calls == ()
    assert (completion.input_tokens, completion.output_tokens) == (40, 9)
    (body,) = harness.peer.requests
    assert body["stream"] is True
    if harness.kind == "openai":
        assert body["stream_options"] == {"include_usage": True}
    assert harness.peer.rejections == []


async def test_without_a_sink_the_call_does_not_stream(harness: Harness) -> None:
    harness.peer.reply_text("plain")

    assert (await harness.provider.complete(CONVERSATION)).text == "plain"
    assert "stream" not in harness.peer.requests[0]


async def test_streamed_tool_calls_are_assembled_from_their_pieces(harness: Harness) -> None:
    args = {"q": "daily report", "limit": 3, "tags": ["a", "b"]}
    first_id, second_id = harness.peer.reply_tool_calls(("lookup", args), ("lookup", {"q": "x"}), text="Checking.")
    sink = Sink()

    completion = await harness.provider.complete(CONVERSATION, tools=[_lookup_tool([])], on_delta=sink)

    assert sink.pieces == ["Checking."]
    assert completion.text == "Checking."
    assert [(c.id, c.name, dict(c.arguments)) for c in completion.tool_calls] == [
        (first_id, "lookup", args),
        (second_id, "lookup", {"q": "x"}),
    ]


async def test_tool_loop_streams_every_round_and_keeps_the_last_rounds_text(harness: Harness) -> None:
    seen: list[Mapping[str, Any]] = []
    harness.peer.reply_tool_calls(("lookup", {"q": "daily report"}), text="Let me check.")
    harness.peer.reply_text("It comes from the warehouse.")
    sink = Sink()

    result = await run_tool_loop(
        harness.provider, CONVERSATION, [_lookup_tool(seen)], ALICE, max_steps=4, on_delta=sink
    )

    assert "".join(sink.pieces) == "Let me check." + ROUND_BREAK + "It comes from the warehouse."
    assert result.text == "It comes from the warehouse."
    assert seen == [{"q": "daily report"}]
    assert result.steps == 2
    assert harness.tool_result(harness.peer.requests[1])[1] == "the warehouse database"
    assert harness.peer.rejections == []


async def test_pieces_reach_the_sink_before_the_model_has_finished(harness: Harness) -> None:
    hold = asyncio.Event()
    harness.peer.reply_text("one two three", hold=hold)
    sink = Sink()

    call = asyncio.create_task(harness.provider.complete(CONVERSATION, on_delta=sink))
    await asyncio.wait_for(sink.first.wait(), timeout=30)
    # The peer is still holding its last piece: nothing has finished.
    assert harness.peer.streams_finished == 0
    assert not call.done()
    assert sink.pieces == ["one ", "two "]
    hold.set()

    assert (await asyncio.wait_for(call, timeout=30)).text == "one two three"
    assert sink.pieces == ["one ", "two ", "three"]


async def test_stream_retries_a_429_before_any_text(harness: Harness) -> None:
    harness.peer.reply_error(429, retry_after=1)
    harness.peer.reply_text("Hello there, Alice")
    sink = Sink()

    completion = await harness.provider.complete(CONVERSATION, on_delta=sink)

    assert "".join(sink.pieces) == completion.text == "Hello there, Alice"
    assert harness.sleeps == [1.0]


async def test_stream_dropped_before_any_text_is_retried(harness: Harness) -> None:
    harness.peer.reply_text("never seen", fail_after=0)
    harness.peer.reply_text("second try")
    sink = Sink()

    completion = await harness.provider.complete(CONVERSATION, on_delta=sink)

    assert "".join(sink.pieces) == completion.text == "second try"
    assert len(harness.peer.requests) == 2
    assert len(harness.sleeps) == 1


async def test_stream_dropped_after_text_went_out_is_not_retried_so_nothing_is_sent_twice(harness: Harness) -> None:
    harness.peer.reply_text("one two three four", fail_after=2)
    harness.peer.reply_text("one two three four")  # what a retry would send again
    sink = Sink()

    with pytest.raises(LLMUnavailable, match="after part of the answer was sent"):
        await harness.provider.complete(CONVERSATION, on_delta=sink)

    assert sink.pieces == ["one ", "two "]
    assert len(harness.peer.requests) == 1
    assert harness.peer.pending == 1
    assert harness.sleeps == []
    # The client is still usable after a broken stream.
    assert (await harness.provider.complete(CONVERSATION)).text == "one two three four"


async def test_the_model_call_limit_holds_a_slot_for_the_whole_stream(harness: Harness) -> None:
    hold = asyncio.Event()
    harness.peer.reply_text("slow answer", hold=hold)
    limit = ModelCallLimit(1)
    sink = Sink()

    call = asyncio.create_task(limit.bound(harness.provider).complete(CONVERSATION, on_delta=sink))
    await asyncio.wait_for(sink.first.wait(), timeout=30)
    assert limit.in_flight == 1
    hold.set()
    await asyncio.wait_for(call, timeout=30)

    assert limit.in_flight == 0
    assert limit.peak == 1


async def test_a_silent_tool_round_adds_no_round_break(harness: Harness) -> None:
    harness.peer.reply_tool_calls(("lookup", {"q": "x"}))
    harness.peer.reply_text("done")
    sink = Sink()

    result = await run_tool_loop(harness.provider, CONVERSATION, [_lookup_tool([])], ALICE, max_steps=2, on_delta=sink)

    assert sink.pieces == ["done"]
    assert result.text == "done"
