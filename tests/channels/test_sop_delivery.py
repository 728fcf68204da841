"""An SOP's reply delivered proactively: to Teams (after a restart, from stored references) and to Discord."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.app import Gateway
from gateway.automation import api
from gateway.config import Config
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider
from tests.peers.fake_discord import running_fake_discord
from tests.peers.fake_teams import PERSONAL_CHAT_ID, FakeConnector, teams_activity


def config(url: str, sops: list[dict[str, Any]], *, teams: bool = False, service_url: str = "") -> Config:
    # Teams sends only to allowed service URLs (issue 9 item 6): the local connector is listed.
    allowed = [service_url] if service_url else []
    teams_cfg = {"enabled": teams, **({"allowed_service_urls": allowed} if allowed else {})}
    return Config.model_validate(
        {"database": {"url": url}, "channels": {"teams": teams_cfg}, "automation": {"sops": sops}}
    )


def report(target: str) -> dict[str, Any]:
    return {"name": "report", "instruction": "Post the report.", "trigger": {"manual": True}, "deliver_to": target}


async def test_teams_delivery_survives_a_restart(db_url: str, clock: Clock) -> None:
    sops = [report(f"teams:{PERSONAL_CHAT_ID}")]
    with FakeConnector() as connector:
        # The conversation talks to the bot once (here: an unpaired user, who gets a pairing code) ...
        gw = Gateway(
            config(db_url, sops, teams=True, service_url=connector.service_url),
            provider=ScriptedProvider(),
            clock=clock,
        )
        await gw.start(channels=True, worker=False)
        server = TestServer(gw.web, host="127.0.0.1")
        await server.start_server()
        async with ClientSession() as http:
            body = teams_activity("personal", service_url=connector.service_url, text="hi")
            async with http.post(str(server.make_url("/api/messages")), json=body) as r:
                assert r.status == 200
        await gw.adapters["teams"].drain()  # type: ignore[attr-defined]
        await server.close()
        await gw.stop()
        before = len(connector.messages)

        # ... and after a restart, with nothing in memory, the SOP's reply still reaches it.
        gw = Gateway(
            config(db_url, sops, teams=True, service_url=connector.service_url),
            provider=ScriptedProvider(lambda _m: "Report: 3 open"),
            clock=clock,
        )
        await gw.start(channels=True, worker=False)
        try:
            run = await api.run_now(gw.automation.runner, "report")
        finally:
            await gw.stop()
        assert (run.status, run.delivered_to, run.error) == ("ok", f"teams:{PERSONAL_CHAT_ID}", None)
        (sent,) = connector.messages[before:]
        assert (sent.conversation_id, sent.text) == (PERSONAL_CHAT_ID, "Report: 3 open")


async def test_delivery_to_a_conversation_never_seen_is_a_failed_run_with_the_reason(
    sqlite_url: str, clock: Clock
) -> None:
    gw = Gateway(config(sqlite_url, [report("teams:19:never-seen@thread.v2")], teams=True), provider=ScriptedProvider())
    await gw.start(channels=True, worker=False)
    try:
        run = await api.run_now(gw.automation.runner, "report")
    finally:
        await gw.stop()
    assert run.status == "failed" and run.reply
    assert "delivery to teams:19:never-seen@thread.v2 failed" in (run.error or "")
    assert "no activity seen from conversation" in (run.error or "")


async def test_delivery_to_a_channel_that_is_not_enabled_names_it(sqlite_url: str, clock: Clock) -> None:
    gw = Gateway(config(sqlite_url, [report("discord:123456789")]), provider=ScriptedProvider(), clock=clock)
    await gw.start(channels=False, worker=False)
    try:
        run = await api.run_now(gw.automation.runner, "report")
    finally:
        await gw.stop()
    assert run.status == "failed"
    assert "channel discord is not enabled here (set channels.discord.enabled: true)" in (run.error or "")


async def test_discord_delivery_posts_to_the_channel(sqlite_url: str, clock: Clock) -> None:
    async with running_fake_discord() as peer:
        sops = [report(f"discord:{peer.text_channel_id}")]
        gw = Gateway(config(sqlite_url, sops), provider=ScriptedProvider(lambda _m: "Report: all green"), clock=clock)
        await gw.start(channels=False, worker=False)
        adapter = peer.make_adapter(gw.dispatcher.handle)
        await adapter.start()
        gw.adapters["discord"] = adapter
        try:
            run = await api.run_now(gw.automation.runner, "report")
            (post,) = await peer.wait_for_posts(peer.text_channel_id, 1)
        finally:
            await gw.stop()
    assert (run.status, run.delivered_to) == ("ok", f"discord:{peer.text_channel_id}")
    assert post.content == "Report: all green"
