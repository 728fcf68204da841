"""The web chat in Debian's Chromium, driven by Playwright, against a real gateway on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.app import Gateway
from gateway.config import Config
from gateway.llm.openai_provider import OpenAIProvider
from gateway.sessions import SessionKey
from tests.peers.fake_openai import FakeOpenAI

CHROMIUM = os.environ.get("GOCLAW_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
TOKEN = "webchat-browser-token-0123456789abcdef"
pytestmark = pytest.mark.browser


def _require_chromium() -> None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        reason = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


async def _serve(gw: Gateway) -> AsyncIterator[tuple[Gateway, str]]:
    await gw.start(channels=False, worker=False)
    runner = web.AppRunner(gw.web)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield gw, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await gw.stop()


@pytest.fixture
async def served(sqlite_url: str) -> AsyncIterator[tuple[Gateway, str]]:
    _require_chromium()
    cfg = Config.model_validate({"database": {"url": sqlite_url}, "server": {"dashboard_token": TOKEN}})
    async for s in _serve(Gateway(cfg)):
        yield s


@pytest.fixture
async def peer() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as p:
        yield p


@pytest.fixture
async def streamed(sqlite_url: str, peer: FakeOpenAI) -> AsyncIterator[tuple[Gateway, str]]:
    """The gateway on the real OpenAI provider, pointed at the local streaming peer."""
    _require_chromium()
    cfg = Config.model_validate({"database": {"url": sqlite_url}, "server": {"dashboard_token": TOKEN}})
    provider = OpenAIProvider(model="gpt-test", base_url=peer.base_url, api_key="sk-test", max_retries=0)
    async for s in _serve(Gateway(cfg, provider=provider)):
        yield s


async def test_operator_chats_with_offline_model_in_the_browser(served: tuple[Gateway, str], tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    gw, base = served
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page()
            # The login URL serve prints: the token is exchanged for a session cookie.
            await page.goto(f"{base}/?token={TOKEN}")
            assert "token=" not in page.url
            await page.goto(base + "/dashboard/chat")
            await page.wait_for_selector("#composer:not([hidden])", timeout=10_000)
            await page.fill("#text", "What do you know about the daily report?")
            await page.click("#send")
            reply = page.locator(".msg.agent .bubble").last
            await reply.wait_for(timeout=10_000)
            await page.wait_for_function(
                "document.querySelector('.msg.agent .bubble').textContent.includes('Memory used')", timeout=10_000
            )
            text = await reply.text_content()
            assert text is not None and "[offline model]" in text
            assert "connected as admin" in (await page.text_content("#status") or "")
            await page.screenshot(path=str(tmp_path / "webchat.png"))
            # History is shown on reload, with a link explaining the reply.
            await page.reload()
            await page.wait_for_selector(".msg.agent a.explain", timeout=10_000)
            assert "What do you know about the daily report?" in (await page.text_content("#log") or "")
        finally:
            await browser.close()
    sid = await gw.sessions.find_session(SessionKey("web", "admin/dashboard"))
    assert sid is not None
    first = (await gw.sessions.all_messages(sid))[0]
    assert (first.speaker_user_id, first.stored_role, first.text) == (
        "admin",
        "admin",
        "What do you know about the daily report?",
    )


async def test_a_partial_reply_shows_while_the_model_is_still_answering(
    streamed: tuple[Gateway, str], peer: FakeOpenAI
) -> None:
    from playwright.async_api import async_playwright

    _gw, base = streamed
    hold = asyncio.Event()
    peer.reply_text("The daily report comes from example_orders.", hold=hold)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{base}/?token={TOKEN}")
            await page.goto(base + "/dashboard/chat")
            await page.wait_for_selector("#composer:not([hidden])", timeout=10_000)
            await page.fill("#text", "Where does the daily report come from?")
            await page.click("#send")
            # A function, not an expression: the page's CSP forbids Playwright's eval of a string.
            shows = "(want) => document.querySelector('.msg.agent .bubble')?.textContent === want"
            # Every word but the last, which the peer holds: the browser shows them before the model is done.
            await page.wait_for_function(shows, arg="The daily report comes from ")
            assert peer.streams_finished == 0
            assert await page.is_disabled("#send")  # the turn is not over
            hold.set()
            await page.wait_for_function(shows, arg="The daily report comes from example_orders.")
            await page.wait_for_function("() => !document.querySelector('#send').disabled")
        finally:
            hold.set()  # a failed check must not leave the turn waiting on the peer
            await browser.close()
