"""The dashboard, the API and older sessions: whose lines they store, and so who may teach through them.

policy: "The dashboard stores its messages with the user ID admin, and the API
[...] with the user their turn runs as, so their sessions read as one person,
the current speaker. Messages they stored before they recorded an ID are read
as nobody's, like an unpaired sender's: the first trims of an older session
learn nothing from them."
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiohttp import ClientSession

from gateway.sessions import SessionKey
from tests.policy.world import BOTH_BACKENDS, DASHBOARD_TOKEN, World


def poster(client: ClientSession, base: str, token: str, session: str) -> Callable[[str], Awaitable[str]]:
    """POST /v1/chat with a bearer token; the reply text."""

    async def post(text: str) -> str:
        r = await client.post(
            f"{base}/v1/chat",
            json={"session": session, "text": text},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status == 200, await r.text()
        return str((await r.json())["reply"])

    return post


@BOTH_BACKENDS
async def test_dashboard_messages_stored_as_admin(world: World) -> None:
    key = SessionKey("web", "admin/ops")
    async with world.http() as (client, base):
        post = poster(client, base, DASHBOARD_TOKEN, "ops")
        await post("The report source is example_orders. My name is Olive Operator.")
        archive = await world.trim_with(key, lambda: post("thanks"))

    people = [m for m in await world.session_messages(key) if not m.is_agent]
    assert people and {(m.speaker_user_id, m.stored_role) for m in people} == {("admin", "admin")}
    assert archive.trust == "admin"
    notes = [r for r in await world.records("agent_notes") if "example_orders" in r.content]
    assert notes and {(r.author_user_id, r.author_role) for r in notes} == {("admin", "admin")}
    # Issue 9 (4): the hostile model copies "My name is ..." into the operational item: held for review.
    assert all(r.status == "live" or "personal data" in (r.status_reason or "") for r in notes)
    assert world.model.kind == "hostile" or {r.status for r in notes} == {"live"}
    summaries = [r for r in await world.live("personal") if r.subject == "conversation summary"]
    assert [r.owner_user_id for r in summaries] == ["admin"]
    if world.model.kind == "builtin":
        assert "Their name is Olive Operator" in [r.content for r in await world.live("personal", owner="admin")]
    await world.check_invariants()


@pytest.mark.parametrize("surface", ["http", "websocket"])
async def test_api_messages_stored_as_token_user(world: World, surface: str) -> None:
    bob = world["bob"]
    assert bob.token is not None
    key = SessionKey("api", f"{bob.user_id}/s1")
    async with world.http() as (client, base):
        if surface == "http":
            post = poster(client, base, bob.token, "s1")
            await post("My name is Bob Stone. From now on use example_archive for the report.")
            archive = await world.trim_with(key, lambda: post("thanks"))
        else:
            async with client.ws_connect(f"{base}/v1/ws?token={bob.token}") as ws:

                async def send(text: str) -> None:
                    await ws.send_json({"session": "s1", "text": text})
                    while (frame := await ws.receive_json())["type"] != "reply":
                        assert frame["type"] == "chunk", frame

                await send("My name is Bob Stone. From now on use example_archive for the report.")
                archive = await world.trim_with(key, lambda: send("thanks"))

    people = [m for m in await world.session_messages(key) if not m.is_agent]
    assert people and {(m.speaker_user_id, m.stored_role) for m in people} == {(bob.user_id, "user")}
    assert archive.trust == "user"
    assert not [r for r in await world.records("agent_notes") if r.author_user_id == bob.user_id]
    summaries = [r for r in await world.live("personal") if r.subject == "conversation summary"]
    assert [r.owner_user_id for r in summaries] == [bob.user_id]
    if world.model.kind == "builtin":
        assert "Their name is Bob Stone" in [r.content for r in await world.live("personal", owner=bob.user_id)]
    await world.check_invariants()


async def test_messages_without_user_id_read_as_nobodys(world: World) -> None:
    alice = world["alice"]
    key = world.api_key("alice", "legacy")
    sid = await world.gw.sessions.session_id(key)
    # An older session: stored before the API recorded who spoke.
    for n, text in enumerate(
        ["The report source is example_legacy.", "My name is Old Alice.", "rule: always use example_legacy"]
    ):
        world.clock.advance(minutes=1)
        await world.gw.sessions.store_message(
            sid,
            platform_message_id=f"legacy-{n}",
            speaker=None,
            display_name="Alice",
            text=text,
            said_at=world.clock.now,
        )
    await world.api("alice", "The dashboard source is example_metrics.", session="legacy")
    await world.trim_with(key, lambda: world.api("alice", "thanks", session="legacy"))

    legacy = [m for m in await world.session_messages(key) if m.platform_message_id.startswith("legacy-")]
    assert len(legacy) == 3 and all(m.speaker_user_id is None and m.stored_role is None for m in legacy)
    untrimmed = {m.platform_message_id for m in await world.gw.sessions.history(sid)}
    assert not untrimmed & {m.platform_message_id for m in legacy}, "the first trim did not take them"
    assert not [t for t in world.model.extraction_inputs if "example_legacy" in t or "Old Alice" in t]
    assert not [r for r in await world.records() if "example_legacy" in r.content or "Old Alice" in r.content]
    # Not the speaker's alone any more: the summary stays in the session.
    assert not [r for r in await world.records("personal") if r.subject == "conversation summary"]
    # Her own lines of the same slice are hers, under her own authority.
    mine = [r for r in await world.live("agent_notes") if "example_metrics" in r.content]
    assert mine and {r.author_user_id for r in mine} == {alice.user_id}
    await world.check_invariants()
