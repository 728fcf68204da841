"""The OpenAI provider's own HTTP: what the SDK used to do for it, against local peers over real HTTP.

``tests/gateway/test_llm_providers.py`` holds the behaviour both providers
share against well-behaved peers; here are the answers a real server sends on
a bad day (bodies that are not JSON, cut streams, resets, error events) from
``tests.peers.raw_openai``, and the transport's own duties (keep-alive, the
configured URL and headers).
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from gateway.llm.base import ChatMessage, LLMUnavailable, Tool
from gateway.llm.openai_provider import OpenAIProvider, SseEvents
from pairing.principal import Principal
from tests.peers.fake_openai import FakeOpenAI
from tests.peers.raw_openai import LAST_CHUNK, RawOpenAI, chunked, delta_event, http_response, sse_head

CONVERSATION = [ChatMessage(role="user", content="Where does the daily report come from?")]
ANSWER = {
    "model": "gpt-test",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "From the warehouse."}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 4},
}
USAGE_EVENT = b'data: {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 3}}\n\n'
DONE = b"data: [DONE]\n\n"


class Recorder:
    """Retry sleeps, recorded instead of slept."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.sleeps.append(delay)


class Sink:
    """Collects streamed pieces."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    async def __call__(self, text: str) -> None:
        self.pieces.append(text)


@pytest.fixture
async def peer() -> AsyncIterator[RawOpenAI]:
    async with RawOpenAI() as raw:
        yield raw


@pytest.fixture
def sleeps() -> Recorder:
    return Recorder()


@pytest.fixture
async def provider(peer: RawOpenAI, sleeps: Recorder) -> AsyncIterator[OpenAIProvider]:
    async with OpenAIProvider(
        model="gpt-test", base_url=peer.base_url, api_key="sk-test", timeout=5.0, max_retries=2, sleep=sleeps
    ) as started:
        yield started


def _json(status: int, body: object, **kwargs: object) -> bytes:
    return http_response(status, json.dumps(body).encode(), **kwargs)  # type: ignore[arg-type]


# ---- bodies that are not what they say ----------------------------------------------------------


async def test_an_error_body_that_is_not_json_is_still_retried_and_named_by_its_status(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(http_response(500, b"<html><body>upstream exploded</body></html>", content_type="text/html"))
    peer.reply(_json(200, ANSWER))

    assert (await provider.complete(CONVERSATION)).text == "From the warehouse."
    assert len(peer.requests) == 2
    assert len(sleeps.sleeps) == 1


async def test_a_client_error_with_a_plain_text_body_is_not_retried(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(http_response(400, b"bad request, and not JSON", content_type="text/plain"))

    with pytest.raises(LLMUnavailable) as caught:
        await provider.complete(CONVERSATION)

    # No server message to quote: the description is the status alone.
    assert str(caught.value) == "openai model 'gpt-test' unavailable: the model rejected the request (400)"
    assert len(peer.requests) == 1
    assert sleeps.sleeps == []


async def test_a_200_labelled_json_that_is_not_json_makes_the_model_unavailable_without_a_retry(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(http_response(200, b'{"choices": [', content_type="application/json"))
    peer.reply(_json(200, ANSWER))  # what a retry would get

    with pytest.raises(LLMUnavailable, match="not JSON"):
        await provider.complete(CONVERSATION)

    assert len(peer.requests) == 1
    assert sleeps.sleeps == []


async def test_a_200_not_labelled_json_is_taken_as_no_answer(peer: RawOpenAI, provider: OpenAIProvider) -> None:
    peer.reply(http_response(200, b"hello from a proxy page", content_type="text/html"))

    completion = await provider.complete(CONVERSATION)

    assert completion.text == ""
    assert completion.tool_calls == ()


# ---- connections that fail ---------------------------------------------------------------------


async def test_a_connection_reset_mid_body_is_retried_and_described_as_a_connection_failure(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    whole = _json(200, ANSWER)
    peer.reply(whole[: len(whole) - 20], close=True)  # the Content-Length promised more
    peer.reply(whole[: len(whole) - 20], close=True)
    peer.reply(whole[: len(whole) - 20], close=True)

    cut_short = r"after 3 attempts: could not connect \(Response payload is not completed"
    with pytest.raises(LLMUnavailable, match=cut_short):
        await provider.complete(CONVERSATION)

    assert len(peer.requests) == 3
    assert len(sleeps.sleeps) == 2


async def test_a_server_that_closes_without_answering_is_retried(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(close=True)
    peer.reply(_json(200, ANSWER))

    assert (await provider.complete(CONVERSATION)).text == "From the warehouse."
    assert len(sleeps.sleeps) == 1


async def test_a_reply_that_is_not_http_is_retried_as_a_connection_failure(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", close=True)
    peer.reply(_json(200, ANSWER))

    assert (await provider.complete(CONVERSATION)).text == "From the warehouse."
    assert len(sleeps.sleeps) == 1


async def test_calls_reuse_one_kept_alive_connection(peer: RawOpenAI, provider: OpenAIProvider) -> None:
    peer.reply(_json(200, ANSWER))
    peer.reply(sse_head(), chunked(delta_event({"content": "streamed"}) + DONE), LAST_CHUNK)
    peer.reply(_json(200, ANSWER))

    await provider.complete(CONVERSATION)
    await provider.complete(CONVERSATION, on_delta=Sink())
    await provider.complete(CONVERSATION)

    # One TCP connection carried all three, the streamed one included (read to its end after [DONE]).
    assert len(set(peer.connections)) == 1


async def _never_called(_p: Principal, _args: Mapping[str, Any]) -> str:
    raise AssertionError("the peer never asks for a tool here")


async def test_a_call_waiting_for_its_answer_no_longer_holds_the_request_it_sent(peer: RawOpenAI) -> None:
    """Under load hundreds of turns wait on the model at once, and each garbage collection walks what they hold.

    Once encoded, the request's dicts and lists (three for each tool offered) are freed: only its
    bytes wait out the model's time.
    """
    whole = _json(200, ANSWER)
    cut = whole.index(b"\r\n") + 2
    peer.reply(whole[:cut], whole[cut:], pause=2.0)  # the status line, then two seconds of thinking
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    tools = [Tool(f"lookup_{i}", "Looks a thing up.", schema, _never_called) for i in range(5)]
    # The peer, the provider and the heap's walk below share this loop, and the reply comes 2 s after
    # its status line: with the fixture's 5 s read timeout a stall of 3 s (in a whole CI run on a shared
    # 2-core machine) timed the call out, and its retry found no reply scripted. What is tested is what
    # the waiting call holds, not how long it waits: no timeout a stall can reach, and no retry.
    async with OpenAIProvider(
        model="gpt-test", base_url=peer.base_url, api_key="sk-test", timeout=3600.0, max_retries=0
    ) as provider:
        call = asyncio.create_task(provider.complete(CONVERSATION, tools=tools))
        while not peer.requests and not call.done():  # sent: the provider now waits for the rest of the answer
            await asyncio.sleep(0.01)
        assert peer.requests, f"the call ended before its request arrived: {call.exception()!r}"
        received = {id(t) for t in peer.requests[0]["tools"]}  # the peer's own parsed copies
        held = [
            o
            for o in gc.get_objects()
            if isinstance(o, dict) and o.get("type") == "function" and id(o) not in received
            and str(o.get("function", {}).get("name", "")).startswith("lookup_")
        ]  # fmt: skip
        assert not call.done()  # looked at while the call was still waiting
        assert held == []
        assert (await call).text == "From the warehouse."
    assert [t["function"]["name"] for t in peer.requests[0]["tools"]] == [f"lookup_{i}" for i in range(5)]


# ---- Retry-After -------------------------------------------------------------------------------


async def test_a_429_with_retry_after_waits_what_the_server_asked(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(_json(429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "3"}))
    peer.reply(_json(429, {"error": {"message": "Rate limit reached"}}, headers={"Retry-After-Ms": "1500"}))
    peer.reply(_json(200, ANSWER))

    assert (await provider.complete(CONVERSATION)).text == "From the warehouse."
    # Header names are case-insensitive; retry-after-ms is OpenAI's finer-grained form.
    assert sleeps.sleeps == [3.0, 1.5]


async def test_a_429_asking_for_a_long_pause_is_not_waited_for(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(_json(429, {"error": {"message": "Rate limit reached"}}, headers={"Retry-After": "120"}))

    with pytest.raises(LLMUnavailable, match=r"429 Too Many Requests: Rate limit reached \(the server asks to wait"):
        await provider.complete(CONVERSATION)

    assert sleeps.sleeps == []


# ---- streams ------------------------------------------------------------------------------------


async def test_sse_lines_cut_across_reads_are_put_back_together(peer: RawOpenAI, provider: OpenAIProvider) -> None:
    body = (
        delta_event({"role": "assistant", "content": ""})
        + delta_event({"content": "Caf\u00e9 "})  # a two-byte character, cut in the middle below
        + delta_event({"content": "au lait \u2603"})
        + USAGE_EVENT
        + DONE
    ).replace(b"\n", b"\r\n")  # CRLF line ends, so some cuts fall between CR and LF
    pieces = [chunked(body[i : i + 5]) for i in range(0, len(body), 5)]
    peer.reply(sse_head(), *pieces, LAST_CHUNK, pause=0.002)
    sink = Sink()

    completion = await provider.complete(CONVERSATION, on_delta=sink)

    assert sink.pieces == ["Caf\u00e9 ", "au lait \u2603"]
    assert completion.text == "Caf\u00e9 au lait \u2603"
    assert (completion.input_tokens, completion.output_tokens) == (8, 3)


async def test_sse_comments_named_events_and_empty_events_are_ignored(
    peer: RawOpenAI, provider: OpenAIProvider
) -> None:
    body = (
        b": keep-alive\n\n"
        + b"event: ping\ndata: {}\n\n"
        + b"id: 7\nretry: 1000\n\n"  # no data: not an event at all
        + delta_event({"content": "hello"})
        + DONE
    )
    peer.reply(sse_head(), chunked(body), LAST_CHUNK)
    sink = Sink()

    assert (await provider.complete(CONVERSATION, on_delta=sink)).text == "hello"
    assert sink.pieces == ["hello"]


async def test_an_error_event_before_any_text_is_reported_and_not_retried(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    body = b'data: {"error": {"message": "The server is overloaded", "type": "server_error"}}\n\n'
    peer.reply(sse_head(), chunked(body), LAST_CHUNK)

    with pytest.raises(LLMUnavailable) as caught:
        await provider.complete(CONVERSATION, on_delta=Sink())

    assert str(caught.value) == "openai model 'gpt-test' unavailable: APIError: The server is overloaded"
    assert len(peer.requests) == 1
    assert sleeps.sleeps == []


async def test_a_stream_reset_before_any_text_is_retried(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(sse_head(), chunked(delta_event({"role": "assistant", "content": ""})), close=True)
    peer.reply(sse_head(), chunked(delta_event({"content": "second try"}) + DONE), LAST_CHUNK)
    sink = Sink()

    assert (await provider.complete(CONVERSATION, on_delta=sink)).text == "second try"
    assert sink.pieces == ["second try"]
    assert len(sleeps.sleeps) == 1


async def test_a_stream_cut_mid_line_after_text_is_not_retried_and_the_text_is_not_sent_again(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(sse_head(), chunked(delta_event({"content": "one "}) + b'data: {"choices": [{"del'), close=True)
    peer.reply(sse_head(), chunked(delta_event({"content": "one two"}) + DONE), LAST_CHUNK)
    sink = Sink()

    with pytest.raises(LLMUnavailable, match=r"could not connect .* \(the stream broke after part of the answer"):
        await provider.complete(CONVERSATION, on_delta=sink)

    assert sink.pieces == ["one "]
    assert len(peer.requests) == 1
    assert sleeps.sleeps == []


async def test_bad_json_in_a_stream_after_text_is_reported_without_sending_anything_twice(
    peer: RawOpenAI, provider: OpenAIProvider, sleeps: Recorder
) -> None:
    peer.reply(sse_head(), chunked(delta_event({"content": "one "}) + b"data: {not json\n\n"), LAST_CHUNK)
    sink = Sink()

    with pytest.raises(LLMUnavailable, match=r"not JSON.*\(the stream broke after part of the answer was sent\)"):
        await provider.complete(CONVERSATION, on_delta=sink)

    assert sink.pieces == ["one "]
    assert len(peer.requests) == 1
    assert sleeps.sleeps == []


async def test_a_stream_that_ends_without_done_keeps_what_came(peer: RawOpenAI, provider: OpenAIProvider) -> None:
    peer.reply(sse_head(), chunked(delta_event({"content": "all of it"})), LAST_CHUNK)

    assert (await provider.complete(CONVERSATION, on_delta=Sink())).text == "all of it"


async def test_a_failing_sink_is_the_callers_error_not_the_models(peer: RawOpenAI, provider: OpenAIProvider) -> None:
    # The person's connection closing while text goes out is not a model failure: it
    # propagates as it is, with no retry and no "model unavailable".
    peer.reply(sse_head(), chunked(delta_event({"content": "one "})), chunked(DONE), LAST_CHUNK)

    async def gone(_text: str) -> None:
        raise ConnectionResetError("the person's WebSocket closed")

    with pytest.raises(ConnectionResetError):
        await provider.complete(CONVERSATION, on_delta=gone)
    assert len(peer.requests) == 1


# ---- the SSE decoder, every cut ----------------------------------------------------------------


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_sse_events_are_the_same_wherever_the_bytes_are_cut(line_end: bytes) -> None:
    stream = (b'data: {"a": 1}\n\n: comment\nevent: x\ndata: line one\ndata: line two\n\ndata: [DONE]\n\n').replace(
        b"\n", line_end
    )
    expected = [b'{"a": 1}', b"line one\nline two", b"[DONE]"]
    for cut in range(len(stream) + 1):
        for second_cut in (cut, min(len(stream), cut + 1), min(len(stream), cut + 7)):
            events = SseEvents()
            got = events.feed(stream[:cut]) + events.feed(stream[cut:second_cut]) + events.feed(stream[second_cut:])
            assert got == expected, (cut, second_cut)


# ---- where requests go and what they carry -------------------------------------------------------


async def test_the_request_is_a_json_post_with_the_bearer_key_and_a_trailing_slash_is_harmless() -> None:
    async with FakeOpenAI() as fake:
        fake.reply_text("hi")
        # A trailing slash on base_url does not double the path separator.
        async with OpenAIProvider(model="gpt-test", base_url=fake.base_url + "/", api_key="sk-test") as provider:
            assert (await provider.complete(CONVERSATION)).text == "hi"
    (sent,) = fake.headers
    assert sent["authorization"] == "Bearer sk-test"
    assert sent["content-type"] == "application/json"
    assert fake.rejections == []


async def test_without_base_url_openai_base_url_from_the_environment_is_used(
    peer: RawOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", peer.base_url)
    monkeypatch.setenv("OPENAI_ORG_ID", "org-test")
    monkeypatch.delenv("OPENAI_PROJECT_ID", raising=False)
    peer.reply(_json(200, ANSWER))
    async with OpenAIProvider(model="gpt-test", api_key="sk-test") as provider:
        assert (await provider.complete(CONVERSATION)).text == "From the warehouse."
    assert peer.requests[0]["model"] == "gpt-test"
    assert peer.headers[0]["openai-organization"] == "org-test"
    assert "openai-project" not in peer.headers[0]


async def test_the_configured_timeout_bounds_each_read_of_a_stream(peer: RawOpenAI) -> None:
    # The stream stalls after its first piece for longer than the timeout: one attempt, no
    # retry (text went out), described as a timeout.
    peer.reply(sse_head() + chunked(delta_event({"content": "one "})), chunked(DONE), LAST_CHUNK, pause=30)
    sleeps = Recorder()
    sink = Sink()
    async with OpenAIProvider(
        model="gpt-test", base_url=peer.base_url, api_key="k", timeout=1.0, sleep=sleeps
    ) as provider:
        with pytest.raises(LLMUnavailable, match=r"the request timed out \(the stream broke after part"):
            await provider.complete(CONVERSATION, on_delta=sink)
    assert sink.pieces == ["one "]
    assert sleeps.sleeps == []


async def test_a_refused_connection_is_described_as_could_not_connect() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Recorder()
    async with OpenAIProvider(
        model="gpt-test", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, sleep=sleeps
    ) as provider:
        with pytest.raises(LLMUnavailable, match=r"unavailable after 1 attempt: could not connect \(\[Errno \d+\]"):
            await provider.complete(CONVERSATION, on_delta=Sink())


async def test_stop_closes_the_session_and_a_later_call_says_to_start(peer: RawOpenAI) -> None:
    provider = OpenAIProvider(model="gpt-test", base_url=peer.base_url, api_key="k")
    await provider.start()
    session = provider._client
    await provider.stop()
    assert session is not None and session.closed
    with pytest.raises(RuntimeError, match=r"start\(\)"):
        await asyncio.wait_for(provider.complete(CONVERSATION), 5)
