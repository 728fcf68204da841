"""Issue 9 items 7 and 9: reply ids in their own namespace; an interrupted turn is answered on retry or at start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.app import Gateway
from gateway.config import Config
from gateway.llm.base import ChatMessage
from gateway.models import Message
from gateway.resume import resume_unanswered
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest, TurnResult
from pairing import PairingStore, Role
from tests.gateway.scripted import ScriptedProvider
from tests.gateway.test_web import ALICE_TOKEN, Web, _web
from tests.peers.fake_discord import running_fake_discord


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    async for w in _web(db_url):
        yield w


async def chat(web: Web, text: str, message_id: str, session: str = "s1") -> tuple[int, dict[str, object]]:
    r = await web.http.post(
        f"{web.base}/v1/chat",
        json={"session": session, "text": text, "message_id": message_id},
        headers=web.auth(ALICE_TOKEN),
    )
    return r.status, await r.json()


async def messages(web: Web, session: str = "s1") -> list[dict[str, object]]:
    r = await web.http.get(f"{web.base}/v1/sessions/{session}/messages", headers=web.auth(ALICE_TOKEN))
    return list((await r.json())["messages"])


# ---- item 7: client ids never collide with the gateway's reply ids ---------------------------


async def _turn(web: Web, text: str, message_id: str) -> TurnResult:
    # Straight through the one turn handler, as a Teams or Discord activity would arrive:
    # platform ids are not limited to the API's alphabet, so the namespaces must be structural.
    alice = await web.gw.pairing.principal_for_user(web.alice)
    return await web.gw.turns.handle(
        TurnRequest(SessionKey("teams", "conv-1"), alice, text, message_id, datetime.now(UTC), "Alice")
    )


async def _stored(web: Web) -> list[tuple[str | None, str, bool]]:
    async with web.gw.engine.connect() as conn:
        rows = (await conn.execute(select(Message).order_by(Message.id))).all()
    return [(r.speaker_user_id, r.text, r.is_agent) for r in rows]


async def test_api_refuses_a_client_id_shaped_like_a_reply_id(web: Web) -> None:
    status, body = await chat(web, "first", "X:reply")
    assert status == 400 and "message_id" in str(body["error"])
    assert await _stored(web) == []  # nothing stored for a refused request


async def test_platform_id_shaped_like_a_reply_id_after_its_message_is_not_a_duplicate(web: Web) -> None:
    await _turn(web, "first", "X")
    second = await _turn(web, "second", "X:reply")
    assert not second.duplicate
    assert second.reply == f"echo: [Alice · {web.alice}] second"
    stored = await _stored(web)
    assert (web.alice, "second", False) in stored
    assert len([row for row in stored if row[2]]) == 2


async def test_platform_id_shaped_like_a_reply_id_before_its_message_leaves_the_reply_stored(web: Web) -> None:
    await _turn(web, "sneaky", "Y:reply")
    real = await _turn(web, "real", "Y")
    assert real.reply == f"echo: [Alice · {web.alice}] real"
    assert await _stored(web) == [
        (web.alice, "sneaky", False),
        (None, f"echo: [Alice · {web.alice}] sneaky", True),
        (web.alice, "real", False),
        (None, f"echo: [Alice · {web.alice}] real", True),
    ]
    # A retry of Y sees Y's own reply, not the "Y:reply" line.
    again = await _turn(web, "real", "Y")
    assert again.duplicate and again.reply == f"echo: [Alice · {web.alice}] real"


# ---- item 9: a stored, unanswered message is answered on retry, exactly once ----------------


async def test_retry_of_a_stored_but_unanswered_message_runs_the_turn(web: Web) -> None:
    provider = web.gw.provider
    assert isinstance(provider, ScriptedProvider)
    provider.fail = True
    status, body = await chat(web, "are you there?", "m-1")
    assert status == 503  # stored, not answered
    assert [m["text"] for m in await messages(web)] == ["are you there?"]

    provider.fail = False
    status, body = await chat(web, "are you there?", "m-1")
    assert status == 200
    assert body == {"session": "s1", "reply": f"echo: [Alice · {web.alice}] are you there?"}
    status, again = await chat(web, "are you there?", "m-1")
    assert again == {**body, "duplicate": True}
    stored = await messages(web)
    assert [m["speaker"] for m in stored] == [web.alice, "agent"]  # the message once, one reply
    assert len(provider.calls) == 2  # the failed call and the retry; the answered retry made none


async def test_two_racing_retries_make_one_model_call_and_both_get_the_reply(web: Web) -> None:
    provider = web.gw.provider
    assert isinstance(provider, ScriptedProvider)
    provider.fail = True
    await chat(web, "hello", "m-2")
    provider.fail = False
    gate = asyncio.Event()

    async def slow(msgs: Sequence[ChatMessage]) -> str:
        await gate.wait()
        return "the answer"

    provider._answer = slow
    calls_before = len(provider.calls)
    first = asyncio.create_task(chat(web, "hello", "m-2"))
    second = asyncio.create_task(chat(web, "hello", "m-2"))
    async with asyncio.timeout(30):
        while len(provider.calls) == calls_before:
            await asyncio.sleep(0.01)
    gate.set()
    (s1, b1), (s2, b2) = await asyncio.gather(first, second)
    assert (s1, s2) == (200, 200)
    assert b1["reply"] == b2["reply"] == "the answer"
    assert len(provider.calls) == calls_before + 1
    assert [m["speaker"] for m in await messages(web)] == [web.alice, "agent"]


async def test_group_message_that_asked_for_no_answer_is_not_answered_on_redelivery(db_url: str) -> None:
    from gateway.sessions import SessionKey
    from gateway.turn import TurnRequest
    from pairing.principal import Principal

    cfg = Config.model_validate({"database": {"url": db_url}})
    provider = ScriptedProvider()
    gw = Gateway(cfg, provider=provider)
    await gw.start(channels=False, worker=False)
    try:
        req = TurnRequest(
            key=SessionKey("teams", "group-1"),
            principal=Principal.human("u_a", Role.USER, "A"),
            text="just chatting",
            message_id="g-1",
            said_at=gw.clock(),
            reply=False,
        )
        assert (await gw.turns.handle(req)).reply is None
        again = await gw.turns.handle(req)
        assert again.duplicate and again.reply is None
        assert provider.calls == []
        assert await resume_unanswered(gw) == 0  # store-only: nothing is owed
    finally:
        await gw.stop()


# ---- item 9: at start, what a crash left unanswered is answered on its channel ---------------


async def test_restart_answers_an_api_message_left_unanswered_so_a_retry_sees_the_reply(db_url: str) -> None:
    async for first in _web(db_url, provider=ScriptedProvider(fail=True)):
        status, _ = await chat(first, "still there?", "m-3")
        assert status == 503
    async for second in _web_again(db_url):
        assert await resume_unanswered(second.gw) == 1
        assert len(second.gw.provider.calls) == 1  # type: ignore[attr-defined]
        status, body = await chat(second, "still there?", "m-3")
        assert (status, body["duplicate"]) == (200, True)
        assert body["reply"] == f"echo: [Alice · {second.alice}] still there?"
        assert len(second.gw.provider.calls) == 1  # type: ignore[attr-defined]
        assert await resume_unanswered(second.gw) == 0


async def _web_again(db_url: str) -> AsyncIterator[Web]:
    """The same database as a fresh process would see it (users already exist)."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from gateway.db import make_engine

    engine = make_engine(db_url)
    users = {u.display_name: u.id for u in await PairingStore(engine).list_users()}
    cfg = Config.model_validate(
        {
            "server": {
                "max_message_chars": 200,
                "api_users": [{"token": ALICE_TOKEN, "user": users["Alice"]}],
            }
        }
    )
    gw = Gateway(cfg, engine=engine, provider=ScriptedProvider())
    await gw.start(channels=False, worker=False)
    server = TestServer(gw.web, host="127.0.0.1")
    await server.start_server()
    async with ClientSession() as http:
        yield Web(gw, str(server.make_url("")).rstrip("/"), http, users["Alice"], users["Bob"])
    await server.close()
    await gw.stop()
    await engine.dispose()


async def test_restart_sends_a_discord_message_left_unanswered_through_the_adapter(sqlite_url: str) -> None:
    cfg = Config.model_validate({"database": {"url": sqlite_url}})
    async with running_fake_discord() as peer:
        down = Gateway(cfg, provider=ScriptedProvider(fail=True))
        await down.start(channels=False, worker=False)
        await down.pairing.add_user("Alice", "user", links=[f"discord:{peer.alice.id}"])
        adapter = peer.make_adapter(down.dispatcher.handle)
        await adapter.start()
        await peer.dispatch_message(peer.dm_channel_id, peer.alice, "what is on today?")
        (sorry,) = await peer.wait_for_posts(peer.dm_channel_id, 1, timeout=30)
        assert "unavailable" in sorry.content
        await adapter.stop()
        await down.stop()

        up = Gateway(cfg, provider=ScriptedProvider(lambda _m: "today: the daily report"))
        await up.start(channels=False, worker=False)
        adapter = peer.make_adapter(up.dispatcher.handle)
        await adapter.start()
        up.adapters["discord"] = adapter
        try:
            assert await resume_unanswered(up) == 1
            posts = await peer.wait_for_posts(peer.dm_channel_id, 2, timeout=30)
            assert posts[1].content == "today: the daily report"
            async with up.engine.connect() as conn:
                rows = (await conn.execute(select(Message.is_agent, Message.text).order_by(Message.id))).all()
            assert [tuple(r) for r in rows] == [(False, "what is on today?"), (True, "today: the daily report")]
        finally:
            await adapter.stop()
            await up.stop()


async def test_retries_racing_in_two_processes_store_one_reply_and_both_answer_with_it(engine: AsyncEngine) -> None:
    """Two gateways on one database (two TurnHandlers: no shared lock) answer the same retry."""
    from gateway.sessions import SessionKey, SessionStore
    from gateway.turn import TurnHandler, TurnRequest
    from pairing.principal import Principal

    cfg = Config()
    sessions = SessionStore(engine)
    req = TurnRequest(
        key=SessionKey("api", "u_a/race"),
        principal=Principal.human("u_a", Role.USER, "A"),
        text="which one?",
        message_id="r-1",
        said_at=sessions.now(),
    )
    down = TurnHandler(config=cfg, sessions=sessions, provider=ScriptedProvider(fail=True))
    assert (await down.handle(req)).failed
    gates = {"A": asyncio.Event(), "B": asyncio.Event()}
    started: list[str] = []

    def model(name: str) -> ScriptedProvider:
        async def answer(_m: Sequence[ChatMessage]) -> str:
            started.append(name)
            await gates[name].wait()
            return f"answer {name}"

        return ScriptedProvider(answer)

    a = TurnHandler(config=cfg, sessions=sessions, provider=model("A"))
    b = TurnHandler(config=cfg, sessions=sessions, provider=model("B"))
    ta, tb = asyncio.create_task(a.handle(req)), asyncio.create_task(b.handle(req))
    async with asyncio.timeout(30):
        while len(started) < 2:
            await asyncio.sleep(0.01)
    gates["A"].set()
    first = await ta
    gates["B"].set()
    second = await tb
    assert first.reply == second.reply == "answer A"
    replies = [m for m in await sessions.all_messages(first.session_id) if m.is_agent]
    assert [m.text for m in replies] == ["answer A"]
