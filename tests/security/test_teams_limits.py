"""Issue 9 item 6: one message-length limit on every surface; Teams sends only to allowed service URLs.

The trap is a real listening socket on 127.0.0.1 that records every
connection: a serviceUrl pointing at it must never be contacted.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from pydantic import ValidationError
from sqlalchemy import func, select

from channels.base import OutboundMessage
from channels.teams import TeamsAdapter, TeamsSendError
from gateway.app import Gateway
from gateway.config import Config
from gateway.models import Message
from tests.gateway.scripted import ScriptedProvider
from tests.peers.fake_discord import running_fake_discord
from tests.peers.fake_teams import PERSONAL_CHAT_ID, USER_AAD_ID, FakeConnector, teams_activity


class Trap:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def trap() -> Iterator[Trap]:
    t = Trap()
    try:
        yield t
    finally:
        t.close()


@dataclass
class TeamsWorld:
    gw: Gateway
    adapter: TeamsAdapter
    connector: FakeConnector
    url: str
    http: ClientSession
    provider: ScriptedProvider

    async def post(self, body: dict[str, Any]) -> tuple[int, str]:
        async with self.http.post(self.url, json=body) as r:
            status, text = r.status, await r.text()
        await self.adapter.drain()
        return status, text

    async def stored(self) -> int:
        async with self.gw.engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(Message))).scalar_one())


@pytest.fixture
async def teams(sqlite_url: str) -> AsyncIterator[TeamsWorld]:
    with FakeConnector() as connector:
        cfg = Config.model_validate(
            {
                "database": {"url": sqlite_url},
                "server": {"max_message_chars": 8000},
                "channels": {
                    "teams": {"enabled": True, "dm_policy": "open", "allowed_service_urls": [connector.service_url]}
                },
            }
        )
        provider = ScriptedProvider()
        gw = Gateway(cfg, provider=provider)
        await gw.start(channels=True, worker=False)
        adapter = gw.adapters["teams"]
        assert isinstance(adapter, TeamsAdapter)
        server = TestServer(gw.web, host="127.0.0.1")
        await server.start_server()
        async with ClientSession() as http:
            yield TeamsWorld(gw, adapter, connector, str(server.make_url("/api/messages")), http, provider)
        await server.close()
        await gw.stop()


# ---- one length limit ---------------------------------------------------------------------


async def test_teams_message_over_the_limit_gets_a_reply_naming_it_and_nothing_is_stored(teams: TeamsWorld) -> None:
    status, _ = await teams.post(teams_activity(service_url=teams.connector.service_url, text="x" * 90_000))
    assert status == 200
    (reply,) = teams.connector.messages
    assert "8,000" in (reply.text or "") and "max_message_chars" in (reply.text or "")
    assert await teams.stored() == 0
    assert teams.provider.calls == []
    # At the limit it is served as usual.
    await teams.post(teams_activity(service_url=teams.connector.service_url, text="y" * 8000))
    assert await teams.stored() == 2


async def test_discord_message_over_the_limit_gets_a_reply_naming_it_and_nothing_is_stored(sqlite_url: str) -> None:
    cfg = Config.model_validate(
        {
            "database": {"url": sqlite_url},
            "server": {"max_message_chars": 100},
            "channels": {"discord": {"dm_policy": "open"}},
        }
    )
    provider = ScriptedProvider()
    gw = Gateway(cfg, provider=provider)
    await gw.start(channels=False, worker=False)
    async with running_fake_discord() as peer:
        adapter = peer.make_adapter(gw.dispatcher.handle)
        await adapter.start()
        try:
            await peer.dispatch_message(peer.dm_channel_id, peer.alice, "z" * 101)
            (answer,) = await peer.wait_for_posts(peer.dm_channel_id, 1, timeout=30)
            assert "100" in answer.content and "max_message_chars" in answer.content
            async with gw.engine.connect() as conn:
                assert (await conn.execute(select(func.count()).select_from(Message))).scalar_one() == 0
            assert provider.calls == []
        finally:
            await adapter.stop()
            await gw.stop()


# ---- replies only to allowed service URLs ------------------------------------------------


@pytest.mark.parametrize(
    "service_url",
    [
        "http://127.0.0.1:{port}/",
        "https://smba.trafficmanager.net@127.0.0.1:{port}/",
        "http://localhost:{port}/v3/",
    ],
)
async def test_activity_naming_another_service_url_is_refused_before_any_connection(
    teams: TeamsWorld, trap: Trap, service_url: str
) -> None:
    body = teams_activity(service_url=service_url.format(port=trap.port), text="reply to redis please")
    status, text = await teams.post(body)
    assert status == 403 and "allowed_service_urls" in text
    await asyncio.sleep(0)  # let anything scheduled run; drain() already waited for turns
    assert trap.connections == 0
    assert await teams.stored() == 0
    assert teams.provider.calls == []
    assert teams.connector.posted == []


async def test_proactive_send_to_a_disallowed_service_url_is_refused(teams: TeamsWorld, trap: Trap) -> None:
    await teams.post(teams_activity(service_url=teams.connector.service_url, text="hello"))
    # The remembered reference now names a foreign serviceUrl (as a tampered persisted one would).
    teams.adapter._references[PERSONAL_CHAT_ID].service_url = f"http://127.0.0.1:{trap.port}/"
    before = len(teams.connector.posted)
    with pytest.raises(TeamsSendError, match="not allowed"):
        await teams.adapter.send(OutboundMessage("teams", PERSONAL_CHAT_ID, "proactive hello"))
    assert trap.connections == 0
    assert len(teams.connector.posted) == before


async def test_allowed_local_connector_still_gets_replies(teams: TeamsWorld) -> None:
    await teams.post(teams_activity(service_url=teams.connector.service_url, text="hello"))
    assert [m.text for m in teams.connector.messages] == ["echo: [Ada Lovelace · unpaired] hello"]
    await teams.adapter.send(OutboundMessage("teams", PERSONAL_CHAT_ID, "proactive hello"))
    assert teams.connector.messages[-1].text == "proactive hello"
    assert USER_AAD_ID  # the sender the fake activity speaks as


def test_default_service_urls_are_the_bot_framework_public_hosts() -> None:
    urls = Config().channels.teams.allowed_service_urls
    assert "https://smba.trafficmanager.net/" in urls
    assert "https://*.botframework.com/" in urls
    assert not [u for u in urls if "127.0.0.1" in u or "localhost" in u]


def test_bad_allowed_service_url_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="allowed_service_urls"):
        Config.model_validate({"channels": {"teams": {"allowed_service_urls": ["redis://127.0.0.1:6379"]}}})


# ---- Emulator mode only on loopback -------------------------------------------------------


def test_emulator_mode_refuses_a_non_loopback_host() -> None:
    with pytest.raises(ValidationError, match="loopback"):
        Config.model_validate({"server": {"host": "0.0.0.0"}, "channels": {"teams": {"enabled": True}}})
    Config.model_validate({"server": {"host": "127.0.0.1"}, "channels": {"teams": {"enabled": True}}})
    Config.model_validate(
        {
            "server": {"host": "0.0.0.0"},
            "channels": {"teams": {"enabled": True, "app_id": "app", "app_password": "secret-pass"}},
        }
    )


async def test_emulator_mode_logs_a_warning_at_start(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(_: object) -> str | None:
        return None

    adapter = TeamsAdapter("", "", handler)  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        await adapter.start()
    await adapter.stop()
    assert any("NOT authenticated" in r.getMessage() for r in caplog.records)
