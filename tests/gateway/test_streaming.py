"""Real streaming (issue 14, target 4): the model's tokens reach the client as they arrive.

The gateway runs on 127.0.0.1 with the real OpenAI or Anthropic provider pointed at
the local wire-format peer, which streams SSE and can hold its last token until the
test says so: a client that sees the first tokens while the peer still holds the last
one has been streamed to, whatever the machine's speed. The WebSocket client is
aiohttp's, the OpenAI-compatible endpoint's client the real ``openai`` library.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from aiohttp import ClientSession, ClientWebSocketResponse, ClientWSTimeout, web

from gateway.app import Gateway
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.llm.anthropic_provider import AnthropicProvider
from gateway.llm.loop import ROUND_BREAK
from gateway.llm.openai_provider import OpenAIProvider
from gateway.sessions import SessionKey
from gateway.turn import UNAVAILABLE_REPLY
from gateway.web.app import CTX
from pairing import PairingStore
from tests.peers.fake_anthropic import FakeAnthropic
from tests.peers.fake_openai import FakeOpenAI
from tests.security.test_faults_storage import Fault

TOKEN = "stream-user-token-0123456789"
WAIT = 30.0  # seconds: generous, only so a broken gateway fails instead of hanging


@dataclass
class Served:
    gw: Gateway
    peer: FakeOpenAI | FakeAnthropic
    base: str
    user: str
    db_url: str

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base}/v1", api_key=TOKEN, max_retries=0, timeout=WAIT)

    async def stored(self, session: str) -> list[tuple[bool, str]]:
        sid = await self.gw.sessions.find_session(SessionKey("api", f"{self.user}/{session}"))
        assert sid is not None
        return [(m.is_agent, m.text) for m in await self.gw.sessions.all_messages(sid)]


async def _served(sqlite_url: str, kind: str, retries: int = 3) -> AsyncIterator[Served]:
    engine = make_engine(sqlite_url)
    await upgrade(engine)
    user = (await PairingStore(engine).add_user("Bob", "user")).id
    cfg = Config.model_validate({"server": {"api_users": [{"token": TOKEN, "user": user}], "openai_compat": True}})
    peer: FakeOpenAI | FakeAnthropic = FakeOpenAI() if kind == "openai" else FakeAnthropic()
    # No pause between retries: the policy's timing is tested in test_llm_providers.
    settings: dict[str, Any] = {"base_url": peer.base_url, "timeout": WAIT, "max_retries": retries}
    settings |= {"retry_base_delay": 0.0, "retry_max_delay": 0.0}
    async with peer:
        settings["base_url"] = peer.base_url
        provider = (
            OpenAIProvider(model="gpt-test", api_key="sk-test", **settings)
            if kind == "openai"
            else AnthropicProvider(model="claude-test", api_key="sk-ant-test", **settings)
        )
        gw = Gateway(cfg, engine=engine, provider=provider)
        await gw.start(channels=False, worker=False)
        # Served as `goclaw serve` does (an AppRunner: a client that leaves does not cancel its turn).
        runner = web.AppRunner(gw.web, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield Served(gw, peer, f"http://127.0.0.1:{port}", user, sqlite_url)
        finally:
            await runner.cleanup()
            await gw.stop()
            await engine.dispose()


@pytest.fixture(params=["openai", "anthropic"])
async def served(request: pytest.FixtureRequest, sqlite_url: str) -> AsyncIterator[Served]:
    async for s in _served(sqlite_url, request.param):
        yield s


@pytest.fixture
async def openai_served(sqlite_url: str) -> AsyncIterator[Served]:
    async for s in _served(sqlite_url, "openai"):
        yield s


async def _frame(ws: ClientWebSocketResponse) -> dict[str, Any]:
    frame: dict[str, Any] = await asyncio.wait_for(ws.receive_json(), timeout=WAIT)
    return frame


async def test_websocket_gets_tokens_before_the_model_finishes_through_a_tool_round(served: Served) -> None:
    peer = served.peer
    peer.reply_tool_calls(("memory_search", {"query": "daily report"}), text="Let me check my notes.")
    hold = asyncio.Event()
    peer.reply_text("It comes from the warehouse.", hold=hold)

    async with ClientSession() as http, http.ws_connect(f"{served.base}/v1/ws?token={TOKEN}") as ws:
        await ws.send_json({"session": "s", "text": "where does the daily report come from?"})
        chunks: list[str] = []
        # Every token but the last, which the peer holds: they came while the model was still answering.
        while "".join(chunks) != "Let me check my notes." + ROUND_BREAK + "It comes from the ":
            frame = await _frame(ws)
            assert frame["type"] == "chunk", frame
            chunks.append(frame["text"])
        assert peer.streams_finished == 1  # the tool round; the answer is still streaming
        hold.set()
        while (frame := await _frame(ws))["type"] == "chunk":
            chunks.append(frame["text"])

    assert frame["type"] == "reply"
    assert "".join(chunks) == "Let me check my notes." + ROUND_BREAK + "It comes from the warehouse."
    # The stored reply is the answer's text, as without streaming; the frame says the chunks differ.
    assert frame["reply"] == "It comes from the warehouse."
    assert frame["chunks_match"] is False
    assert await served.stored("s") == [
        (False, "where does the daily report come from?"),
        (True, "It comes from the warehouse."),
    ]
    assert peer.rejections == []


async def test_websocket_chunks_spell_the_stored_reply_when_there_is_no_tool_round(served: Served) -> None:
    served.peer.reply_text("The report comes from example_orders.")

    async with ClientSession() as http, http.ws_connect(f"{served.base}/v1/ws?token={TOKEN}") as ws:
        await ws.send_json({"session": "plain", "text": "and the report?"})
        chunks: list[str] = []
        while (frame := await _frame(ws))["type"] == "chunk":
            chunks.append(frame["text"])

    assert chunks == ["The ", "report ", "comes ", "from ", "example_orders."]
    assert frame["chunks_match"] is True
    assert "".join(chunks) == frame["reply"] == (await served.stored("plain"))[-1][1]


async def test_a_stream_broken_after_its_first_tokens_sends_them_once_and_fails_the_turn(served: Served) -> None:
    served.peer.reply_text("one two three four", fail_after=2)
    served.peer.reply_text("one two three four")  # what a retry would stream again

    async with ClientSession() as http, http.ws_connect(f"{served.base}/v1/ws?token={TOKEN}") as ws:
        await ws.send_json({"session": "broken", "text": "count for me"})
        chunks: list[str] = []
        while (frame := await _frame(ws))["type"] == "chunk":
            chunks.append(frame["text"])

    assert chunks == ["one ", "two ", "\n\n" + UNAVAILABLE_REPLY]
    assert frame["failed"] is True
    assert frame["reply"] == UNAVAILABLE_REPLY
    assert frame["chunks_match"] is False
    assert len(served.peer.requests) == 1  # not retried: the tokens had gone out
    # The message is kept for a retry; no partial reply is stored.
    assert await served.stored("broken") == [(False, "count for me")]


async def test_openai_client_gets_sse_deltas_as_they_arrive(openai_served: Served) -> None:
    peer = openai_served.peer
    hold = asyncio.Event()
    peer.reply_text("Streaming through the gateway works.", hold=hold)

    stream = await openai_served.client().chat.completions.create(
        model="goclaw", user="sse", stream=True, messages=[{"role": "user", "content": "does streaming work?"}]
    )
    pieces: list[str] = []
    finishes: list[str | None] = []
    async for chunk in stream:
        pieces.append(chunk.choices[0].delta.content or "")
        finishes.append(chunk.choices[0].finish_reason)
        if "".join(pieces) == "Streaming through the gateway ":
            assert peer.streams_finished == 0  # the model has not finished: these came as they arrived
            hold.set()

    assert hold.is_set()
    assert "".join(pieces) == "Streaming through the gateway works."
    assert finishes[-1] == "stop"
    assert (await openai_served.stored("sse"))[-1] == (True, "Streaming through the gateway works.")


async def test_openai_sse_through_a_tool_round_ends_with_the_stored_reply(openai_served: Served) -> None:
    peer = openai_served.peer
    peer.reply_tool_calls(("memory_search", {"query": "report"}), text="Checking.")
    peer.reply_text("")  # the model says nothing more: the stored reply is the loop's fallback

    stream = await openai_served.client().chat.completions.create(
        model="goclaw", user="tools", stream=True, messages=[{"role": "user", "content": "the report?"}]
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream])

    stored = (await openai_served.stored("tools"))[-1][1]
    assert stored.startswith("Sorry")
    # What the client saw, then what was stored, so its text ends with the stored reply.
    assert text == "Checking." + ROUND_BREAK + stored


async def test_openai_sse_broken_after_its_first_tokens_raises_in_the_client(openai_served: Served) -> None:
    openai_served.peer.reply_text("one two three four", fail_after=2)
    openai_served.peer.reply_text("one two three four")

    stream = await openai_served.client().chat.completions.create(
        model="goclaw", user="broken", stream=True, messages=[{"role": "user", "content": "count"}]
    )
    pieces: list[str] = []

    async def read_all() -> None:
        async for chunk in stream:
            pieces.append(chunk.choices[0].delta.content or "")

    with pytest.raises(openai.APIError, match="unavailable"):
        await read_all()

    assert "".join(pieces) == "one two "
    assert len(openai_served.peer.requests) == 1


async def test_openai_sse_failing_before_any_token_is_a_503(sqlite_url: str) -> None:
    async for served in _served(sqlite_url, "openai", retries=0):
        served.peer.reply_error(500, "upstream exploded")
        with pytest.raises(openai.APIStatusError) as down:
            await served.client().chat.completions.create(
                model="goclaw", user="down", stream=True, messages=[{"role": "user", "content": "hello?"}]
            )
        assert down.value.status_code == 503


async def test_a_websocket_client_leaving_mid_stream_still_gets_its_reply_stored(served: Served) -> None:
    hold = asyncio.Event()
    served.peer.reply_text("An answer nobody waits for.", hold=hold)

    # The server answers no close frame while its turn runs: don't wait long for one.
    quick_close = ClientWSTimeout(ws_close=1.0)
    async with (
        ClientSession() as http,
        http.ws_connect(f"{served.base}/v1/ws?token={TOKEN}", timeout=quick_close) as ws,
    ):
        await ws.send_json({"session": "left", "text": "answer me later"})
        assert (await _frame(ws))["type"] == "chunk"
    # The client is gone; the model finishes its answer.
    hold.set()
    for _ in range(600):
        if len(await served.stored("left")) == 2:
            break
        await asyncio.sleep(0.05)
    assert await served.stored("left") == [(False, "answer me later"), (True, "An answer nobody waits for.")]
    write_health = served.gw.web[CTX].write_health
    assert write_health is not None and write_health._burst is None  # a closed socket is not a storage failure


async def test_a_storage_failure_after_the_first_tokens_ends_the_sse_stream_with_an_error(
    openai_served: Served,
) -> None:
    hold = asyncio.Event()
    openai_served.peer.reply_text("one two three", hold=hold)
    fault = Fault("sqlite-readonly", openai_served.gw, openai_served.db_url)

    stream = await openai_served.client().chat.completions.create(
        model="goclaw", user="fault", stream=True, messages=[{"role": "user", "content": "count"}]
    )
    pieces: list[str] = []

    async def read_all() -> None:
        async for chunk in stream:
            pieces.append(chunk.choices[0].delta.content or "")
            if "".join(pieces) == "one two " and not hold.is_set():
                await fault.set(True)  # the reply cannot be stored now
                hold.set()

    with pytest.raises(openai.APIError, match="cannot store"):
        await read_all()
    await fault.set(False)
    assert "".join(pieces) == "one two three"
