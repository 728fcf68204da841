"""The admin dashboard in Debian's Chromium, driven by Playwright, against a real seeded gateway on 127.0.0.1.

One walk through what an admin does (log in, approve a pairing code, change a
role, find a record, open its timeline, undo a revision, confirm an unverified
record, run an SOP, accept an identity proposal, resolve an obligation, log
out), and the cross-site POST that must be refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.automation import api
from tests.browser.dashboard_world import TOKEN, World, served_world
from tests.browser.test_webchat import CHROMIUM, LAUNCH_ARGS, _require_chromium

pytestmark = pytest.mark.browser
WAIT = 15_000


@pytest.fixture
async def world(sqlite_url: str) -> AsyncIterator[World]:
    _require_chromium()
    async with served_world(sqlite_url) as w:
        yield w


async def test_admin_does_the_day_to_day_in_the_browser(world: World) -> None:
    from playwright.async_api import async_playwright

    gw = world.gw
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(WAIT)
            # Log in with the printed URL; the token leaves the address bar.
            await page.goto(f"{world.base}/?token={TOKEN}")
            await page.wait_for_selector("h1:text('Overview')")
            assert "token" not in page.url

            # Approve Dana's pending code as a user.
            await page.click("text=Pairing & people")
            row = page.locator(f".pending-row[data-code='{world.dana_code}']")
            await row.locator("button.approve").click()
            await page.wait_for_selector(".flash:has-text('Approved')")
            assert await gw.pairing.resolve("discord", "2004") is not None

            # Make Alice an admin.
            alice = page.locator(f"tr[data-user='{world.alice}']")
            await alice.locator("select[name=role]").select_option("admin")
            await alice.locator("button.set-role").click()
            await page.wait_for_selector(".flash:has-text('now has role admin')")
            assert (await gw.pairing.get_user(world.alice)).role.value == "admin"
            assert "role" in (await page.text_content("#audit") or "")

            # Find the retired note by a word of its content, open its timeline.
            await page.click("header >> text=Memory")
            await page.fill("#q", "example_metrics")
            await page.click("#search")
            await page.click("a.rec:has-text('daily report data source')")
            await page.wait_for_selector("#timeline .revision")
            assert "superseded" in (await page.text_content("h1") or "")

            # Undo the revision: the confirmation shows what returns, then it is live again.
            await page.click("#timeline a.undo")
            preview = await page.text_content("#undo-preview") or ""
            assert "example_metrics" in preview
            await page.click("#confirm-undo")
            await page.wait_for_selector(".flash:has-text('Undone')")
            await page.wait_for_selector("h1 .badge.s-live")
            assert "a veto" in (await page.text_content("#timeline") or "")
            restored = await gw.memory.store.get(world.old_note)
            assert restored is not None and restored.status == "live"

            # Confirm the quarantined record from the review queue.
            await page.click("header >> text=Review")
            item = page.locator(f".review-item[data-id='{world.unverified}']")
            await item.locator("button.confirm").click()
            await page.wait_for_selector(".flash:has-text('Confirmed')")
            confirmed = await gw.memory.store.get(world.unverified)
            assert confirmed is not None and confirmed.status == "live"

            # Run an SOP now and see its run in the history.
            await page.click("header >> text=SOPs")
            card = page.locator(".sop[data-sop='summary']")
            assert await card.locator(".no-runs").count() == 1
            await card.locator("button.run-now").click()
            await page.wait_for_selector(".flash:has-text('Ran summary')")
            runs = await api.list_runs(gw.automation.store, "summary")
            assert [r.status for r in runs] == ["ok"]
            row = page.locator(f"#history tr.run[data-run='{runs[0].id}']")
            assert "ok" in (await row.locator(".badge").text_content() or "")
            assert (runs[0].reply or "")[:20] in (await row.text_content() or "")

            # Accept the open identity proposal with a rationale: it is the identity now.
            await page.click("header >> text=Identity")
            proposal = page.locator(f".proposal[data-id='{world.proposal}']")
            await proposal.locator("textarea[name=rationale]").fill("Legal's rule; agreed")
            await proposal.locator("button.accept").click()
            await page.wait_for_selector(f".flash:has-text('Accepted {world.proposal}')")
            assert "Never email customers directly." in (await page.text_content("#current") or "")
            assert "Legal's rule; agreed" in (await page.text_content("#decisions") or "")
            assert "Never email customers directly." in await gw.memory.identity()

            # The obligation holds daily-report; resolve it, and the SOP is free again.
            await page.click("header >> text=SOPs")
            assert world.obligation in (await page.text_content(".sop[data-sop='daily-report'] .hold") or "")
            await page.click(f".sop[data-sop='daily-report'] a[href='/dashboard/findings#{world.obligation}']")
            ob = page.locator(f".obligation[data-id='{world.obligation}']")
            await ob.locator("select[name=disposition]").select_option("accepted-risk")
            await ob.locator("textarea[name=rationale]").fill("refunds reconciled by hand this month")
            await ob.locator("button.resolve-btn").click()
            await page.wait_for_selector(f".flash:has-text('Resolved {world.obligation} as accepted-risk')")
            await page.wait_for_selector(f"#resolved tr[data-id='{world.obligation}']")
            assert await gw.automation.runner.holds("daily-report") is None
            await page.click("header >> text=SOPs")
            assert await page.locator(".sop[data-sop='daily-report'] .hold").count() == 0

            # Every action above is in the audit, via dashboard, by admin.
            audit = await gw.pairing.audit_log()
            assert {(a[1], a[2]) for a in audit} == {("dashboard", "admin")}
            assert {a[3] for a in audit} >= {
                "pair approve",
                "role",
                "memory undo",
                "memory confirm",
                "sop run",
                "identity accept",
                "obligation resolve",
            }

            # Log out: the dashboard is gone until the next login.
            await page.click("#logout")
            await page.wait_for_selector("#token")
            await page.goto(f"{world.base}/dashboard/people")
            await page.wait_for_selector("#token")
        finally:
            await browser.close()


async def test_cross_site_post_without_csrf_token_is_refused(world: World) -> None:
    from playwright.async_api import async_playwright

    # A hostile page on another origin posts a role change to the logged-in dashboard.
    evil_html = f"""<!doctype html><form id=f method=post action="{world.base}/dashboard/people/role">
      <input name=user_id value="{world.bob}"><input name=role value=admin></form>
      <script>document.getElementById('f').submit()</script>"""

    async def evil_page(_: web.Request) -> web.Response:
        return web.Response(text=evil_html, content_type="text/html")

    evil = web.Application()
    evil.router.add_get("/", evil_page)
    runner = web.AppRunner(evil)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    evil_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            try:
                page = await browser.new_page()
                page.set_default_timeout(WAIT)
                await page.goto(f"{world.base}/?token={TOKEN}")
                await page.wait_for_selector("h1:text('Overview')")
                await page.goto(f"http://127.0.0.1:{evil_port}/")
                await page.wait_for_selector("text=cross-origin request refused")
                # The same POST from the dashboard's own origin, but without the CSRF token.
                await page.goto(f"{world.base}/dashboard/people")
                status = await page.evaluate(
                    """async (uid) => (await fetch('/dashboard/people/role', {method: 'POST',
                         body: new URLSearchParams({user_id: uid, role: 'admin'})})).status""",
                    world.bob,
                )
                assert status == 403
            finally:
                await browser.close()
    finally:
        await runner.cleanup()
    assert (await world.gw.pairing.get_user(world.bob)).role.value == "user"
