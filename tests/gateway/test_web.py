"""The web surfaces over real HTTP on 127.0.0.1: API, WebSocket, health, metrics, bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from aiohttp import ClientSession, WSMsgType
from aiohttp.test_utils import TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.app import Gateway
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.llm.base import LLMProvider
from gateway.models import Message
from gateway.sessions import SessionKey
from pairing import PairingStore
from tests.gateway.scripted import ScriptedProvider

ALICE_TOKEN = "alice-token-0123456789"
BOB_TOKEN = "bob-token-0123456789ab"
DASH_TOKEN = "dashboard-token-0123456789"


@dataclass
class Web:
    gw: Gateway
    base: str
    http: ClientSession
    alice: str
    bob: str

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


async def _web(sqlite_url: str, provider: LLMProvider | None = None, **server: object) -> AsyncIterator[Web]:
    engine: AsyncEngine = make_engine(sqlite_url)
    await upgrade(engine)
    store = PairingStore(engine)
    alice = (await store.add_user("Alice", "user")).id
    bob = (await store.add_user("Bob", "user")).id
    cfg = Config.model_validate(
        {
            "server": {
                "dashboard_token": DASH_TOKEN,
                "max_message_chars": 200,
                "api_users": [{"token": ALICE_TOKEN, "user": alice}, {"token": BOB_TOKEN, "user": bob}],
                **server,
            }
        }
    )
    gw = Gateway(cfg, engine=engine, provider=provider or ScriptedProvider())
    await gw.start(channels=False, worker=False)
    server_ = TestServer(gw.web, host="127.0.0.1")
    await server_.start_server()
    async with ClientSession() as http:
        yield Web(gw, str(server_.make_url("")).rstrip("/"), http, alice, bob)
    await server_.close()
    await gw.stop()
    await engine.dispose()


@pytest.fixture
async def web(sqlite_url: str) -> AsyncIterator[Web]:
    async for w in _web(sqlite_url):
        yield w


async def test_chat_stores_as_the_token_user_and_replies(web: Web) -> None:
    r = await web.http.post(f"{web.base}/v1/chat", json={"session": "s1", "text": "hi"}, headers=web.auth(ALICE_TOKEN))
    assert r.status == 200
    assert await r.json() == {"session": "s1", "reply": "echo: [Alice · " + web.alice + "] hi"}
    m = await web.http.get(f"{web.base}/v1/sessions/s1/messages", headers=web.auth(ALICE_TOKEN))
    body = await m.json()
    assert [(x["speaker"], x["role"], x["text"]) for x in body["messages"]] == [
        (web.alice, "user", "hi"),
        ("agent", None, f"echo: [Alice · {web.alice}] hi"),
    ]


async def test_client_message_id_makes_retries_idempotent(web: Web) -> None:
    body = {"session": "s1", "text": "hi", "message_id": "client-42"}
    first = await (await web.http.post(f"{web.base}/v1/chat", json=body, headers=web.auth(ALICE_TOKEN))).json()
    second = await (await web.http.post(f"{web.base}/v1/chat", json=body, headers=web.auth(ALICE_TOKEN))).json()
    assert first["reply"] and second == {"session": "s1", "reply": first["reply"], "duplicate": True}


@pytest.mark.parametrize(
    ("headers", "body", "status", "message"),
    [
        ({}, {"session": "s", "text": "x"}, 401, "missing or wrong token"),
        ({"Authorization": "Bearer nope"}, {"session": "s", "text": "x"}, 401, "missing or wrong token"),
        (None, "not json{", 400, "not valid JSON"),
        (None, ["a list"], 400, "must be a JSON object"),
        (None, {"text": "x"}, 400, "field 'session' is missing"),
        (None, {"session": "s"}, 400, "field 'text' is missing"),
        (None, {"session": "s", "text": 5}, 400, "field 'text' must be a string"),
        (None, {"session": 5, "text": "x"}, 400, "field 'session' must be"),
        (None, {"session": "s", "text": "   "}, 400, "field 'text' is empty"),
        (None, {"session": "s", "text": "x" * 201}, 413, "max_message_chars (200"),
    ],
)
async def test_bad_requests_get_clear_errors_and_store_nothing(
    web: Web, headers: dict[str, str] | None, body: object, status: int, message: str
) -> None:
    hdrs = web.auth(ALICE_TOKEN) if headers is None else headers
    if isinstance(body, str):
        r = await web.http.post(f"{web.base}/v1/chat", data=body, headers=hdrs)
    else:
        r = await web.http.post(f"{web.base}/v1/chat", json=body, headers=hdrs)
    assert r.status == status
    payload = await r.json()
    assert message in payload["error"]
    assert "Traceback" not in await r.text()
    m = await web.http.get(f"{web.base}/v1/sessions/s/messages", headers=web.auth(ALICE_TOKEN))
    assert m.status == 404


async def test_users_cannot_read_each_others_sessions_but_admin_can(web: Web) -> None:
    r = await web.http.post(
        f"{web.base}/v1/chat", json={"session": "private", "text": "my secret"}, headers=web.auth(ALICE_TOKEN)
    )
    assert r.status == 200
    # Bob naming the same session gets his own (empty) namespace, not Alice's.
    assert (await web.http.get(f"{web.base}/v1/sessions/private/messages", headers=web.auth(BOB_TOKEN))).status == 404
    await web.http.post(f"{web.base}/v1/chat", json={"session": "private", "text": "mine"}, headers=web.auth(BOB_TOKEN))
    bob_view = await (
        await web.http.get(f"{web.base}/v1/sessions/private/messages", headers=web.auth(BOB_TOKEN))
    ).json()
    assert "my secret" not in str(bob_view)
    # The operator (dashboard token) reads any session by its internal id.
    sid = await web.gw.sessions.find_session(SessionKey("api", f"{web.alice}/private"))
    assert sid is not None
    admin_view = await web.http.get(f"{web.base}/v1/sessions/{sid}/messages", headers=web.auth(DASH_TOKEN))
    assert admin_view.status == 200
    assert "my secret" in str(await admin_view.json())
    assert (await web.http.get(f"{web.base}/v1/sessions/{sid}/messages", headers=web.auth(BOB_TOKEN))).status == 404


async def test_unknown_session_is_404(web: Web) -> None:
    r = await web.http.get(f"{web.base}/v1/sessions/nope/messages", headers=web.auth(ALICE_TOKEN))
    assert r.status == 404
    assert "no session 'nope'" in (await r.json())["error"]


async def test_websocket_with_token_in_query_streams_chunks_then_reply(web: Web) -> None:
    async with web.http.ws_connect(f"{web.base}/v1/ws?token={ALICE_TOKEN}") as ws:
        await ws.send_json({"session": "w", "text": "a fairly long message so that the reply comes in several chunks"})
        chunks, final = [], None
        async for frame in ws:
            data = frame.json()
            if data["type"] == "chunk":
                chunks.append(data["text"])
            else:
                final = data
                break
    assert final is not None and final["type"] == "reply"
    assert len(chunks) > 1
    assert "".join(chunks) == final["reply"]


async def test_websocket_token_in_first_frame_and_dashboard_is_admin(web: Web) -> None:
    async with web.http.ws_connect(f"{web.base}/v1/ws") as ws:
        await ws.send_json({"token": DASH_TOKEN})
        ready = await ws.receive_json()
        assert ready == {"type": "ready", "user": "admin", "role": "admin"}
        await ws.send_json({"session": "dashboard", "text": "hello"})
        while (await ws.receive_json())["type"] != "reply":
            pass
    sid = await web.gw.sessions.find_session(SessionKey("web", "admin/dashboard"))
    assert sid is not None
    (msg, _reply) = await web.gw.sessions.all_messages(sid)
    assert (msg.speaker_user_id, msg.stored_role) == ("admin", "admin")


async def test_websocket_bad_token_and_bad_frames(web: Web) -> None:
    r = await web.http.get(f"{web.base}/v1/ws?token=wrong")
    assert r.status == 401
    async with web.http.ws_connect(f"{web.base}/v1/ws") as ws:
        await ws.send_json({"token": "wrong"})
        err = await ws.receive_json()
        assert err["status"] == 401
        closing = await ws.receive()
        assert closing.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
    async with web.http.ws_connect(f"{web.base}/v1/ws?token={ALICE_TOKEN}") as ws:
        await ws.send_str("{nope")
        assert "the frame is not valid JSON" in (await ws.receive_json())["error"]
        await ws.send_json({"session": "w", "text": "x" * 500})
        assert (await ws.receive_json())["status"] == 413


async def test_health_ready_and_metrics(web: Web) -> None:
    assert (await (await web.http.get(f"{web.base}/healthz")).json()) == {"status": "ok"}
    ready = await web.http.get(f"{web.base}/readyz")
    assert ready.status == 200
    assert (await ready.json())["database"] == "ok"
    await web.http.post(f"{web.base}/v1/chat", json={"session": "m", "text": "hi"}, headers=web.auth(ALICE_TOKEN))
    text = await (await web.http.get(f"{web.base}/metrics")).text()
    assert 'goclaw_turns_total{channel="api",outcome="ok"} 1.0' in text
    assert "goclaw_turn_seconds_bucket" in text
    assert "goclaw_queue_depth" in text


async def test_readyz_reports_a_channel_that_failed(web: Web) -> None:
    web.gw.channel_state["discord"] = "failed: bad token"
    r = await web.http.get(f"{web.base}/readyz")
    assert r.status == 503
    assert (await r.json())["channels"] == {"discord": "failed: bad token"}


async def test_model_failure_is_polite_503_and_message_kept(sqlite_url: str) -> None:
    async for w in _web(sqlite_url, provider=ScriptedProvider(fail=True)):
        r = await w.http.post(
            f"{w.base}/v1/chat", json={"session": "s", "text": "keep me"}, headers=w.auth(ALICE_TOKEN)
        )
        assert r.status == 503
        body = await r.json()
        assert "model is unavailable" in body["reply"]
        view = await (await w.http.get(f"{w.base}/v1/sessions/s/messages", headers=w.auth(ALICE_TOKEN))).json()
        assert [m["text"] for m in view["messages"]] == ["keep me"]


async def test_unexpected_error_is_500_json_without_traceback(sqlite_url: str) -> None:
    def explode(_: object) -> str:
        raise RuntimeError("secret internal detail")

    async for w in _web(sqlite_url, provider=ScriptedProvider(explode)):
        r = await w.http.post(f"{w.base}/v1/chat", json={"session": "s", "text": "x"}, headers=w.auth(ALICE_TOKEN))
        assert r.status == 500
        text = await r.text()
        assert "internal error" in text
        assert "secret internal detail" not in text and "Traceback" not in text


async def test_login_page_is_served_and_the_chat_needs_a_login(web: Web) -> None:
    page = await web.http.get(f"{web.base}/")
    assert page.status == 200
    assert 'name="token"' in await page.text()
    chat = await web.http.get(f"{web.base}/dashboard/chat", allow_redirects=False)
    assert (chat.status, chat.headers["Location"]) == (303, "/")


async def test_a_long_sessions_messages_come_a_page_at_a_time(web: Web) -> None:
    # The whole history, built on the serving loop, held every turn up for seconds (2 s at 100,000).
    r = await web.http.post(
        f"{web.base}/v1/chat", json={"session": "long", "text": "hi"}, headers=web.auth(ALICE_TOKEN)
    )
    assert r.status == 200
    session_id = await web.gw.sessions.find_session(SessionKey("api", f"{web.alice}/long"))
    assert session_id is not None
    said = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [
        {"session_id": session_id, "platform_message_id": f"old-{i}", "speaker_user_id": web.alice,
         "stored_role": "user", "display_name": "Alice", "text": f"message {i}", "said_at": said,
         "is_agent": False, "created_at": said, "archive_id": "a_old" if i < 1000 else None}
        for i in range(1200)
    ]  # fmt: skip
    async with web.gw.engine.begin() as conn:
        await conn.execute(Message.__table__.insert(), rows)
    url = f"{web.base}/v1/sessions/long/messages"
    pages: list[list[str]] = []
    query: dict[str, str] = {}
    while True:
        body = await (await web.http.get(url, params=query, headers=web.auth(ALICE_TOKEN))).json()
        pages.append([m["text"] for m in body["messages"]])
        if "before" not in body:
            break
        query = {"before": body["before"]}
    assert [len(p) for p in pages] == [500, 500, 202]  # 1,202 messages, the newest page first
    everything = [t for page in reversed(pages) for t in page]
    assert everything[:2] == ["hi", f"echo: [Alice · {web.alice}] hi"]
    assert everything[2:] == [f"message {i}" for i in range(1200)]
    small = await (await web.http.get(url, params={"limit": "3"}, headers=web.auth(ALICE_TOKEN))).json()
    assert [m["text"] for m in small["messages"]] == ["message 1197", "message 1198", "message 1199"]
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"limit": "ten"}, {"before": "-5"}, {"before": "1e3"}):
        r = await web.http.get(url, params=bad, headers=web.auth(ALICE_TOKEN))
        assert r.status == 400, bad
        (name,) = bad
        assert name in (await r.json())["error"]
