"""The web chat in Debian's Chromium, driven by Playwright, against a real gateway on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.app import Gateway
from gateway.config import Config
from gateway.sessions import SessionKey

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


@pytest.fixture
async def served(sqlite_url: str) -> AsyncIterator[tuple[Gateway, str]]:
    _require_chromium()
    cfg = Config.model_validate({"database": {"url": sqlite_url}, "server": {"dashboard_token": TOKEN}})
    gw = Gateway(cfg)
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
