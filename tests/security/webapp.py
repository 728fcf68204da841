"""The real aiohttp app on 127.0.0.1 over a real database, for the security tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.app import Gateway
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.llm.base import LLMProvider
from pairing import PairingStore

ALICE_TOKEN = "alice-token-0123456789"
DASH_TOKEN = "dashboard-token-0123456789"
METRICS_TOKEN = "metrics-token-0123456789"


@dataclass
class Web:
    """A running gateway web app and a client for it."""

    gw: Gateway
    engine: AsyncEngine
    base: str
    http: ClientSession
    alice: str

    def auth(self, token: str = ALICE_TOKEN) -> dict[str, str]:
        """Bearer header for ``token``."""
        return {"Authorization": f"Bearer {token}"}

    @property
    def ws_url(self) -> str:
        """The WebSocket URL, authenticated as Alice."""
        return f"{self.base}/v1/ws?token={ALICE_TOKEN}"

    async def stored(self) -> tuple[int, int]:
        """How many messages and sessions the database holds."""
        async with self.engine.connect() as conn:
            messages = (await conn.execute(text("SELECT count(*) FROM messages"))).scalar_one()
            sessions = (await conn.execute(text("SELECT count(*) FROM sessions"))).scalar_one()
        return int(messages), int(sessions)


@asynccontextmanager
async def running_web(db_url: str, provider: LLMProvider | None = None, **server: object) -> AsyncIterator[Web]:
    """The gateway's web app on 127.0.0.1 over ``db_url``; ``provider`` None means the builtin model."""
    engine = make_engine(db_url)
    await upgrade(engine)
    alice = (await PairingStore(engine).add_user("Alice", "user")).id
    cfg = Config.model_validate(
        {
            "server": {
                "dashboard_token": DASH_TOKEN,
                "api_users": [{"token": ALICE_TOKEN, "user": alice}],
                **server,
            }
        }
    )
    gw = Gateway(cfg, engine=engine, provider=provider)
    await gw.start(channels=False, worker=False)
    srv = TestServer(gw.web, host="127.0.0.1")
    await srv.start_server()
    try:
        async with ClientSession() as http:
            yield Web(gw, engine, str(srv.make_url("")).rstrip("/"), http, alice)
    finally:
        await srv.close()
        await gw.stop()
        await engine.dispose()
