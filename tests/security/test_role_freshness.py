"""A role change takes effect at a person's very next message, on every surface (policy: authority is the pairing role).

The role a turn runs with is read in the same statement or transaction that
stores the turn's message, so neither a WebSocket opened before the change, nor
``goclaw chat --as`` started before it, nor the web layer's own memory of a token's
user, can carry the old authority into a turn. Each case changes the role through
the pairing store on a connection of its own, as ``goclaw users role`` does from
another process, and then checks what the agent did (an ``@notes:`` directive
writes an organisation note for an admin only) and what was stored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import WSMsgType
from aiohttp.client_ws import ClientWebSocketResponse
from sqlalchemy import text

from gateway.db import make_engine
from pairing import PairingStore
from tests.security.webapp import ALICE_TOKEN, DASH_TOKEN, Web, running_web


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    async with running_web(db_url) as w:
        yield w


async def set_role_elsewhere(db_url: str, user_id: str, role: str) -> None:
    """``goclaw users role``: another engine, committed and acknowledged before the next message."""
    engine = make_engine(db_url)
    try:
        await PairingStore(engine).set_role(user_id, role, by="operator")
    finally:
        await engine.dispose()


async def notes(web: Web) -> list[str]:
    async with web.engine.connect() as conn:
        rows = await conn.execute(text("SELECT content FROM memory_records WHERE scope = 'agent_notes'"))
        return [r[0] for r in rows]


async def stored_roles(web: Web) -> list[str | None]:
    async with web.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT stored_role FROM messages WHERE is_agent = :f ORDER BY id"), {"f": False}
        )
        return [r[0] for r in rows]


async def ws_turn(ws: ClientWebSocketResponse, session: str, text_: str) -> dict[str, Any]:
    await ws.send_json({"session": session, "text": text_})
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        assert msg.type == WSMsgType.TEXT, f"socket ended: {msg.type} {msg.data!r}"
        frame = json.loads(msg.data)
        if frame["type"] in ("reply", "error"):
            return frame


async def http_turn(web: Web, session: str, text_: str) -> tuple[int, dict[str, Any]]:
    r = await web.http.post(f"{web.base}/v1/chat", json={"session": session, "text": text_}, headers=web.auth())
    return r.status, await r.json()


async def test_an_admin_demoted_while_their_websocket_is_open_cannot_teach_on_it(web: Web, db_url: str) -> None:
    await set_role_elsewhere(db_url, web.alice, "admin")
    async with web.http.ws_connect(f"{web.base}/v1/ws?token={ALICE_TOKEN}") as ws:
        first = await ws_turn(ws, "s", "@notes: deploys happen on tuesdays")
        assert first["type"] == "reply"
        assert await notes(web) == ["deploys happen on tuesdays"]
        await set_role_elsewhere(db_url, web.alice, "user")
        second = await ws_turn(ws, "s", "@notes: deploys happen on fridays")
        assert second["type"] == "reply"
    assert await notes(web) == ["deploys happen on tuesdays"], "a demoted admin's open socket taught a note"
    assert await stored_roles(web) == ["admin", "user"]


async def test_a_person_promoted_while_their_websocket_is_open_is_an_admin_at_their_next_message(
    web: Web, db_url: str
) -> None:
    async with web.http.ws_connect(f"{web.base}/v1/ws?token={ALICE_TOKEN}") as ws:
        await ws_turn(ws, "s", "hello")
        await set_role_elsewhere(db_url, web.alice, "admin")
        await ws_turn(ws, "s", "@notes: the on-call rota is in the wiki")
    assert await notes(web) == ["the on-call rota is in the wiki"]
    assert await stored_roles(web) == ["user", "admin"]


async def test_each_http_message_runs_with_the_role_stored_when_it_arrives(web: Web, db_url: str) -> None:
    # The web layer may remember a token's user between requests: the turn itself must not trust it.
    for i, role in enumerate(["admin", "user", "admin", "user"]):
        await set_role_elsewhere(db_url, web.alice, role)
        status, _ = await http_turn(web, "s", f"@notes: rule number {i} applies")
        assert status == 200
    assert sorted(await notes(web)) == ["rule number 0 applies", "rule number 2 applies"]
    assert await stored_roles(web) == ["admin", "user", "admin", "user"]


async def test_a_demoted_admin_cannot_read_another_session_after_turns_as_admin(web: Web, db_url: str) -> None:
    # The turns' request may reuse the principal a turn ran as; reading a session is not a turn and reads the role.
    status, _ = await http_turn(web, "mine", "hello")
    assert status == 200
    r = await web.http.post(
        f"{web.base}/v1/chat", json={"session": "ops", "text": "status?"}, headers=web.auth(DASH_TOKEN)
    )
    assert r.status == 200
    async with web.engine.connect() as conn:
        ops_id = (await conn.execute(text("SELECT id FROM sessions WHERE conversation_id LIKE '%/ops'"))).scalar_one()
    await set_role_elsewhere(db_url, web.alice, "admin")
    assert (await http_turn(web, "mine", "@notes: admins read every session"))[0] == 200
    assert (await web.http.get(f"{web.base}/v1/sessions/{ops_id}/messages", headers=web.auth())).status == 200
    await set_role_elsewhere(db_url, web.alice, "user")
    r = await web.http.get(f"{web.base}/v1/sessions/{ops_id}/messages", headers=web.auth())
    assert r.status == 404, await r.text()


async def test_a_token_whose_user_is_gone_is_refused_and_stores_nothing(web: Web) -> None:
    assert (await http_turn(web, "s", "hello"))[0] == 200  # the web layer now knows Alice's principal
    async with web.http.ws_connect(f"{web.base}/v1/ws?token={ALICE_TOKEN}") as ws:
        assert (await ws_turn(ws, "w", "hello"))["type"] == "reply"
        before = await web.stored()
        async with web.engine.begin() as conn:
            # No command removes a person; an operator's hand in the database can.
            for table in ("identities", "role_changes", "link_codes"):
                await conn.execute(text(f"DELETE FROM {table} WHERE user_id = :u"), {"u": web.alice})
            await conn.execute(text("DELETE FROM users WHERE id = :u"), {"u": web.alice})
        status, body = await http_turn(web, "s", "hello again")
        assert status == 403 and body == {"error": f"this token's user {web.alice} is not a known user"}
        frame = await ws_turn(ws, "w", "and again")
        assert (frame["type"], frame["status"]) == ("error", 403)
        assert (await ws.receive()).type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
    assert await web.stored() == before
