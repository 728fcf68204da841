"""Screenshots of every dashboard page into docs/ (docs/dashboard-*.png), at 1280x800 and one on a phone.

Run: PYTHONPATH=. python tests/browser/screenshots.py   (needs /usr/bin/chromium and playwright)
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from playwright.async_api import async_playwright

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.browser.dashboard_world import TOKEN, served_world  # noqa: E402
from tests.browser.test_webchat import CHROMIUM, LAUNCH_ARGS  # noqa: E402


async def main() -> None:
    docs = ROOT / "docs"
    with tempfile.TemporaryDirectory() as tmp:
        async with served_world(f"sqlite+aiosqlite:///{tmp}/shots.db") as w, async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 800})
                await page.goto(w.base + "/")
                await page.screenshot(path=str(docs / "dashboard-login.png"))
                await page.goto(f"{w.base}/?token={TOKEN}")
                shots = {
                    "overview": "/dashboard/",
                    "people": "/dashboard/people",
                    "memory": "/dashboard/memory",
                    "record": f"/dashboard/memory/record/{w.old_note}",
                    "undo": f"/dashboard/memory/undo?revision={w.revision}",
                    "review": "/dashboard/memory/review",
                    "turns": "/dashboard/turns",
                    "explain": "/dashboard/turns/1",
                    "chat": "/dashboard/chat",
                    "sops": "/dashboard/sops",
                    "identity": "/dashboard/identity",
                    "findings": "/dashboard/findings",
                }
                for name, path in shots.items():
                    await page.goto(w.base + path)
                    await page.wait_for_selector("main")
                    if name == "chat":
                        await page.wait_for_selector("#composer:not([hidden])")
                    await page.screenshot(path=str(docs / f"dashboard-{name}.png"), full_page=name != "chat")
                phone = await browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
                await phone.goto(f"{w.base}/?token={TOKEN}")
                await phone.goto(f"{w.base}/dashboard/memory/record/{w.old_note}")
                await phone.screenshot(path=str(docs / "dashboard-phone-record.png"), full_page=True)
            finally:
                await browser.close()
    print("wrote", ", ".join(sorted(p.name for p in docs.glob("dashboard-*.png"))))


if __name__ == "__main__":
    asyncio.run(main())
