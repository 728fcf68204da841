"""The person being paired is told so, and as what: from the CLI's process or an admin's DM, through the adapter.

End to end with real discord.py against the fake Discord, the real CLI in its own
process on the same SQLite file, and the running gateway's outbox delivery.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from channels.base import OutboundMessage
from channels.discord import DiscordAdapter
from gateway.app import Gateway
from gateway.config import Config
from gateway.notices import NoticeDelivery
from pairing import PairingStore
from pairing.notices import MAX_ATTEMPTS, NoticeOutbox
from tests.gateway.scripted import ScriptedProvider
from tests.peers.fake_discord import FakeDiscord, running_fake_discord


@dataclass
class World:
    peer: FakeDiscord
    gw: Gateway
    adapter: DiscordAdapter
    config: Path


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    config = tmp_path / "config.yaml"
    config.write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    url = f"sqlite+aiosqlite:///{tmp_path / 'data' / 'goclaw.db'}"
    gw = Gateway(Config.model_validate({"database": {"url": url}}), provider=ScriptedProvider())
    await gw.start(channels=False, worker=False)
    async with running_fake_discord() as peer:
        adapter = peer.make_adapter(gw.dispatcher.handle)
        await adapter.start()
        # As _build_channels does for an enabled channel; then delivery starts with the channels.
        gw.adapters["discord"] = adapter
        gw.notices = NoticeDelivery(NoticeOutbox(gw.engine), lambda: gw.adapters, poll_seconds=0.2)
        await gw.notices.start()
        try:
            yield World(peer, gw, adapter, config)
        finally:
            await gw.notices.stop()
            gw.adapters.clear()
            await adapter.stop()
    await gw.stop()


async def _cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cli_approval_in_another_process_tells_the_person_on_their_channel(world: World) -> None:
    peer = world.peer
    await peer.dispatch_message(peer.dm_channel_id, peer.alice, "hello?")
    (code_reply,) = await peer.wait_for_posts(peer.dm_channel_id, 1)
    (pending,) = await world.gw.pairing.list_pending()
    assert pending.code in code_reply.content

    rc, out, err = await _cli(
        "pairing", "approve", "discord", pending.code, "--role", "admin", "--config", str(world.config), cwd=Path("/")
    )
    assert rc == 0, err
    assert "they are told on their channel" in out
    told = (await peer.wait_for_posts(peer.dm_channel_id, 2, timeout=30))[1]
    alice = await world.gw.pairing.resolve("discord", str(peer.alice.id))
    assert alice is not None and alice.user_id is not None
    assert "You are paired" in told.content
    assert f"{alice.user_id}, role admin" in told.content
    assert "@notes:" in told.content  # an admin is told what an admin can do
    # The outbox row is marked sent after the platform accepted the post: the person may see it first.
    outbox, want = NoticeOutbox(world.gw.engine), [("discord", "sent", told.content)]
    deadline = asyncio.get_running_loop().time() + 30
    while await outbox.status(alice.user_id) != want and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert await outbox.status(alice.user_id) == want


async def test_dm_approval_tells_the_person_as_what_and_their_help_lists_only_their_commands(world: World) -> None:
    peer = world.peer
    await world.gw.pairing.add_user("Bob", "admin", links=[f"discord:{peer.bob.id}"])
    await peer.dispatch_message(peer.dm_channel_id, peer.alice, "hello?")
    await peer.wait_for_posts(peer.dm_channel_id, 1)
    (pending,) = await world.gw.pairing.list_pending()

    await peer.dispatch_message(peer.dm_channel_id, peer.bob, f"/pair approve {pending.code} user")
    posts = await peer.wait_for_posts(peer.dm_channel_id, 3, timeout=30)
    told = next(p for p in posts if "You are paired" in p.content)
    assert "role user" in told.content and "@notes:" not in told.content

    await peer.dispatch_message(peer.dm_channel_id, peer.alice, "/help")
    help_reply = (await peer.wait_for_posts(peer.dm_channel_id, 4, timeout=30))[3]
    assert "/whoami" in help_reply.content
    assert "/pair" not in help_reply.content and "/role" not in help_reply.content


class _Refusing:
    """An adapter whose platform refuses every send (our own seam, at unit level)."""

    name = "discord"

    def __init__(self) -> None:
        self.tries = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> None:
        self.tries += 1
        raise RuntimeError("503 from the platform")


async def _approved_with_notice(engine: AsyncEngine, conversation_id: str | None) -> str:
    store = PairingStore(engine)
    code = (await store.request_code("discord", "42", "Carol", conversation_id=conversation_id)).code
    return (await store.approve("discord", code, by="operator")).id


async def test_a_failing_send_is_retried_then_marked_failed(engine: AsyncEngine) -> None:
    user = await _approved_with_notice(engine, "dm-1")
    refusing = _Refusing()
    outbox = NoticeOutbox(engine)
    delivery = NoticeDelivery(outbox, lambda: {"discord": refusing})
    for _ in range(MAX_ATTEMPTS + 2):
        assert await delivery.deliver_once() == 0
    assert refusing.tries == MAX_ATTEMPTS
    assert [s for _, s, _ in await outbox.status(user)] == ["failed"]


async def test_a_notice_is_claimed_by_one_process_only(engine: AsyncEngine) -> None:
    await _approved_with_notice(engine, "dm-1")
    first, second = NoticeOutbox(engine), NoticeOutbox(engine)
    assert len(await first.claim(frozenset({"discord"}))) == 1
    assert await second.claim(frozenset({"discord"})) == []


async def test_no_conversation_recorded_is_undeliverable_not_retried(engine: AsyncEngine) -> None:
    user = await _approved_with_notice(engine, None)
    refusing = _Refusing()
    outbox = NoticeOutbox(engine)
    await NoticeDelivery(outbox, lambda: {"discord": refusing}).deliver_once()
    assert refusing.tries == 0
    assert [s for _, s, _ in await outbox.status(user)] == ["undeliverable"]
