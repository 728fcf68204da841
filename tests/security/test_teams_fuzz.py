"""Hypothesis over /api/messages (Teams, Emulator mode on loopback): never a 5xx, never a traceback,
nothing stored for a refused activity, and nothing ever sent to a service URL that is not allowed.

One gateway (real aiohttp app, real botbuilder CloudAdapter, the dispatcher and
the turn on a SQLite file) serves every example; the allowed connector is the
local fake, and a trap listener stands for every other service URL.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from channels.teams import TeamsAdapter
from gateway.app import Gateway
from gateway.config import Config
from gateway.models import Message
from tests.gateway.scripted import ScriptedProvider
from tests.peers.fake_teams import BOT_NAME, FakeConnector, teams_activity
from tests.security.test_teams_limits import Trap

MAX_CHARS = 300

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "type",
    "id",
    "text",
    "serviceUrl",
    "from",
    "conversation",
    "recipient",
    "timestamp",
    "entities",
    "attachments",
    "channelData",
    "replyToId",
    "textFormat",
    "value",
    "channelId",
]


def service_urls(connector: str, trap: str) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            connector,
            trap,
            trap.replace("http://127.0.0.1", "http://localhost"),
            trap.replace("http://", "https://smba.trafficmanager.net@"),
            "redis://127.0.0.1:6379",
            "https://smba.trafficmanager.net:1/",
            "not a url",
            "",
        ]
    ) | st.text(max_size=30)


@st.composite
def activities(draw: st.DrawFn, connector: str, trap: str) -> Any:
    """A real Teams activity with some fields replaced by anything, or a body that is no activity at all."""
    kind = draw(st.sampled_from(["personal", "groupChat", "channel"]))
    text = draw(st.text(max_size=20) | st.just("x" * (MAX_CHARS + 1)) | st.just("y" * MAX_CHARS))
    body: dict[str, Any] = teams_activity(
        kind, service_url=draw(service_urls(connector, trap)), text=text, mention=draw(st.booleans())
    )
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        if draw(st.booleans()):
            body.pop(name, None)
        else:
            body[name] = draw(json_values)
    return draw(st.just(body) | json_values)


class World:
    """The gateway, its HTTP server, the connector and the trap, on one event loop."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def open(self) -> None:
        self.connector = FakeConnector().__enter__()
        self.trap = Trap()
        cfg = Config.model_validate(
            {
                "database": {"url": f"sqlite+aiosqlite:///{self.folder / 'fuzz.db'}"},
                "server": {"max_message_chars": MAX_CHARS},
                "channels": {
                    "teams": {
                        "enabled": True,
                        "dm_policy": "open",
                        "require_mention": False,
                        "allowed_service_urls": [self.connector.service_url],
                    }
                },
            }
        )
        self.gw = Gateway(cfg, provider=ScriptedProvider())
        await self.gw.start(channels=True, worker=False)
        adapter = self.gw.adapters["teams"]
        assert isinstance(adapter, TeamsAdapter)
        self.adapter = adapter
        self.server = TestServer(self.gw.web, host="127.0.0.1")
        await self.server.start_server()
        self.http = ClientSession()
        self.url = str(self.server.make_url("/api/messages"))

    async def close(self) -> None:
        await self.http.close()
        await self.server.close()
        await self.gw.stop()
        self.trap.close()
        self.connector.__exit__(None, None, None)

    async def stored(self) -> int:
        async with self.gw.engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(Message))).scalar_one())

    async def check(self, body: Any, raw: bool, content_type: str) -> None:
        before = await self.stored()
        data = body if raw else json.dumps(body)
        async with self.http.post(self.url, data=data, headers={"Content-Type": content_type}) as r:
            status, text = r.status, await r.text()
        await self.adapter.drain()
        assert status < 500, (status, text, body)
        assert "Traceback" not in text and 'File "' not in text, text
        if status != 200:
            assert await self.stored() == before, f"refused with {status} but something was stored"
        text_in = body.get("text") if isinstance(body, dict) else None
        # The limit counts what would be stored: the text with the bot's mention taken out.
        if isinstance(text_in, str) and len(text_in.replace(f"<at>{BOT_NAME}</at>", "").strip()) > MAX_CHARS:
            assert await self.stored() == before, "an over-long message was stored"
        assert self.trap.connections == 0, "the gateway connected to a service URL that is not allowed"


def test_fuzzed_activities_never_5xx_never_leak_and_store_nothing_when_refused() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp))
        world.run(world.open())
        try:
            connector, trap = world.connector.service_url, f"http://127.0.0.1:{world.trap.port}/"

            @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
            @given(
                body=activities(connector, trap),
                raw=st.booleans() | st.just(False),
                content_type=st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1"]),
                garbage=st.binary(max_size=40),
            )
            def prop(body: Any, raw: bool, content_type: str, garbage: bytes) -> None:
                payload = garbage if raw else body
                world.run(world.check(payload, raw, content_type))

            prop()
            # Not vacuous: some generated activities were served, stored and answered.
            assert world.run(world.stored()) > 0
            assert world.connector.messages
        finally:
            world.run(world.close())
            world.loop.close()
