"""Issue 9 item 11: a read-only database or a full disk answers 503 + Retry-After, /readyz 503, then recovers.

How the fault is made (the tests run as root, where ``chmod`` does not stop
SQLite from writing): each new connection of the gateway's own engine is put
into the fault with SQLite's own switches, so the writes fail inside SQLite
with its real error codes, through the real driver, SQLAlchemy and handlers:

- read-only: ``PRAGMA query_only=ON`` (SQLITE_READONLY, "attempt to write a readonly database");
- disk full: ``PRAGMA max_page_count`` = the file's current size (SQLITE_FULL, "database or disk is full");
- PostgreSQL read-only: ``ALTER DATABASE ... SET default_transaction_read_only`` (SQLSTATE 25006),
  as after a failover to a standby.

The pool is then emptied so the gateway reconnects into the fault, and
emptied again after the fault is lifted (an operator freeing the disk).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from sqlalchemy import event
from sqlalchemy.engine import make_url

from gateway.app import Gateway
from gateway.config import Config
from gateway.db import make_engine, upgrade
from pairing import PairingStore
from tests.gateway.scripted import ScriptedProvider
from tests.gateway.test_web import ALICE_TOKEN, Web

FAULTS = ["sqlite-readonly", "sqlite-full", "postgres-readonly"]


class Mono:
    """A monotonic clock for WriteHealth that the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Fault:
    """Puts the gateway's database into a write fault and takes it out again."""

    def __init__(self, kind: str, gw: Gateway, url: str) -> None:
        self.kind, self.gw, self.url = kind, gw, url
        self.on = False
        if kind.startswith("sqlite"):
            event.listen(gw.engine.sync_engine, "connect", self._sqlite_connect)

    def _sqlite_connect(self, dbapi_conn: Any, _record: Any) -> None:
        if not self.on:
            return
        cur = dbapi_conn.cursor()
        if self.kind == "sqlite-readonly":
            cur.execute("PRAGMA query_only=ON")
        else:
            cur.execute("PRAGMA page_count")
            (pages,) = cur.fetchone()
            cur.execute(f"PRAGMA max_page_count={pages}")
        cur.close()

    async def _pg(self, sql: str) -> None:
        name = make_url(self.url).database
        conn = await asyncpg.connect(self.url.replace("postgresql+asyncpg://", "postgresql://").rsplit("/", 1)[0])
        try:
            await conn.execute(sql.format(name=name))
        finally:
            await conn.close()

    async def set(self, on: bool) -> None:
        self.on = on
        if self.kind == "postgres-readonly":
            value = "on" if on else "off"
            await self._pg(f'ALTER DATABASE "{{name}}" SET default_transaction_read_only = {value}')
        await self.gw.engine.dispose()  # reconnect into (or out of) the fault


@pytest.fixture(params=FAULTS)
def fault_db(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, str]:
    kind = request.param
    if kind.startswith("sqlite"):
        return kind, f"sqlite+aiosqlite:///{tmp_path / 'goclaw.db'}"
    return kind, request.getfixturevalue("pg_url")


@pytest.fixture
async def faulty(fault_db: tuple[str, str]) -> AsyncIterator[tuple[Web, Fault, Mono]]:
    kind, url = fault_db
    engine = make_engine(url)
    await upgrade(engine)
    alice = (await PairingStore(engine).add_user("Alice", "user")).id
    cfg = Config.model_validate(
        {"server": {"max_message_chars": 8000, "api_users": [{"token": ALICE_TOKEN, "user": alice}]}}
    )
    gw = Gateway(cfg, engine=engine, provider=ScriptedProvider())
    await gw.start(channels=False, worker=False)
    mono = Mono()
    gw.write_health.clock = mono
    server = TestServer(gw.web, host="127.0.0.1")
    await server.start_server()
    fault = Fault(kind, gw, url)
    try:
        async with ClientSession() as http:
            yield Web(gw, str(server.make_url("")).rstrip("/"), http, alice, ""), fault, mono
    finally:
        await fault.set(False)
        await server.close()
        await gw.stop()
        await engine.dispose()


async def post(web: Web, text: str, message_id: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    r = await web.http.post(
        f"{web.base}/v1/chat",
        json={"session": "s", "text": text, "message_id": message_id},
        headers=web.auth(ALICE_TOKEN),
    )
    raw = await r.text()
    assert "Traceback" not in raw
    return r.status, await r.json(), dict(r.headers)


async def ready(web: Web) -> tuple[int, dict[str, Any]]:
    r = await web.http.get(f"{web.base}/readyz")
    return r.status, await r.json()


async def test_write_faults_answer_503_readyz_tells_and_everything_recovers(
    faulty: tuple[Web, Fault, Mono], caplog: pytest.LogCaptureFixture
) -> None:
    web, fault, mono = faulty
    # Large enough that a full file cannot take it in a free corner of a page.
    big = "report line. " * 400
    assert (await post(web, "before " + big, "ok-1"))[0] == 200
    assert (await ready(web))[0] == 200

    await fault.set(True)
    mono.t += 2  # past the readiness cache
    with caplog.at_level(logging.INFO):
        refused = [await post(web, f"during {i} " + big, f"f-{i}") for i in range(5)]
        status, body = await ready(web)
    for code, payload, headers in refused:
        assert code == 503, payload
        assert "cannot store messages right now" in payload["error"]
        assert headers["Retry-After"].isdigit()
    assert status == 503 and "cannot store messages" in body["database"]
    # Once per burst, not a traceback per request.
    failing = [r for r in caplog.records if "writes are failing" in r.getMessage()]
    assert len(failing) == 1
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]

    await fault.set(False)
    mono.t += 11  # the failure requests saw is no longer recent; the probe alone decides
    status, body = await ready(web)
    assert (status, body["database"]) == (200, "ok")
    # The client retries what was refused, with the same ids: each is stored and answered once.
    for i in range(5):
        code, payload, _ = await post(web, f"during {i} " + big, f"f-{i}")
        assert code == 200 and "duplicate" not in payload
        assert payload["reply"].endswith(f"during {i} " + big.strip())
    r = await web.http.get(f"{web.base}/v1/sessions/s/messages", headers=web.auth(ALICE_TOKEN))
    stored = (await r.json())["messages"]
    people = [m["id"] for m in stored if m["speaker"] != "agent"]
    assert people == ["ok-1", *(f"f-{i}" for i in range(5))]
    assert len([m for m in stored if m["speaker"] == "agent"]) == 6
    assert len([r for r in caplog.records if "writes work again" in r.getMessage()]) <= 1


async def test_websocket_write_fault_is_an_error_frame_and_the_socket_stays_open(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    await upgrade(engine)
    alice = (await PairingStore(engine).add_user("Alice", "user")).id
    cfg = Config.model_validate({"server": {"api_users": [{"token": ALICE_TOKEN, "user": alice}]}})
    gw = Gateway(cfg, engine=engine, provider=ScriptedProvider())
    await gw.start(channels=False, worker=False)
    server = TestServer(gw.web, host="127.0.0.1")
    await server.start_server()
    fault = Fault("sqlite-readonly", gw, sqlite_url)
    try:
        async with ClientSession() as http, http.ws_connect(server.make_url(f"/v1/ws?token={ALICE_TOKEN}")) as ws:
            await fault.set(True)
            await ws.send_json({"session": "w", "text": "hello", "message_id": "w-1"})
            frame = await ws.receive_json(timeout=30)
            assert frame["type"] == "error" and frame["status"] == 503
            assert "cannot store messages right now" in frame["error"]
            await fault.set(False)
            await ws.send_json({"session": "w", "text": "hello", "message_id": "w-1"})
            while (frame := await ws.receive_json(timeout=30))["type"] == "chunk":
                pass
            assert frame["type"] == "reply" and frame["reply"] == f"echo: [Alice · {alice}] hello"
    finally:
        await fault.set(False)
        await server.close()
        await gw.stop()
        await engine.dispose()


async def test_teams_write_fault_tells_the_sender_and_stores_nothing(sqlite_url: str) -> None:
    from sqlalchemy import func, select

    from gateway.dispatch import STORAGE_REPLY
    from gateway.models import Message
    from tests.peers.fake_teams import FakeConnector, teams_activity

    with FakeConnector() as connector:
        teams = {"enabled": True, "dm_policy": "open", "allowed_service_urls": [connector.service_url]}
        gw = Gateway(
            Config.model_validate({"database": {"url": sqlite_url}, "channels": {"teams": teams}}),
            provider=ScriptedProvider(),
        )
        await gw.start(channels=True, worker=False)
        server = TestServer(gw.web, host="127.0.0.1")
        await server.start_server()
        fault = Fault("sqlite-readonly", gw, sqlite_url)
        try:
            async with ClientSession() as http:
                await fault.set(True)
                body = teams_activity(service_url=connector.service_url, text="note this")
                async with http.post(server.make_url("/api/messages"), json=body) as r:
                    assert r.status == 200
                await gw.adapters["teams"].drain()  # type: ignore[attr-defined]
                assert [m.text for m in connector.messages] == [STORAGE_REPLY]
                await fault.set(False)
                async with gw.engine.connect() as conn:
                    assert (await conn.execute(select(func.count()).select_from(Message))).scalar_one() == 0
        finally:
            await fault.set(False)
            await server.close()
            await gw.stop()
