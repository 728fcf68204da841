"""A logged-in dashboard client over real HTTP on 127.0.0.1, for the page tests of SOPs, identity and findings."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientSession, CookieJar
from aiohttp.test_utils import TestServer

from gateway.app import Gateway
from gateway.config import Config

TOKEN = "dashboard-token-for-dashboard-page-tests-0123456789"


@dataclass
class Dash:
    gw: Gateway
    base: str
    http: ClientSession
    csrf: str = ""

    async def post(self, path: str, *, csrf: bool = True, **data: str) -> tuple[int, str]:
        """POST a form (with this session's CSRF token) and follow the redirect: (status, final page)."""
        r = await self.http.post(self.base + path, data={"csrf": self.csrf, **data} if csrf else data)
        return r.status, await r.text()

    async def get(self, path: str) -> tuple[int, str]:
        r = await self.http.get(self.base + path)
        return r.status, await r.text()


@asynccontextmanager
async def dashboard(db_url: str, extra: dict[str, Any] | None = None, **gw_setup: Any) -> AsyncIterator[Dash]:
    """A started gateway (no channels, no worker) with its dashboard served and logged in.

    ``gw_setup`` attributes are set on the gateway before it starts (``sop_holds=...``).
    """
    cfg = Config.model_validate({"database": {"url": db_url}, "server": {"dashboard_token": TOKEN}, **(extra or {})})
    gw = Gateway(cfg)
    for k, v in gw_setup.items():
        setattr(gw, k, v)
    await gw.start(channels=False, worker=False)
    srv = TestServer(gw.web, host="127.0.0.1")
    await srv.start_server()
    try:
        async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
            d = Dash(gw, str(srv.make_url("")).rstrip("/"), http)
            await http.get(f"{d.base}/?token={TOKEN}")
            page = await (await http.get(f"{d.base}/dashboard/")).text()
            m = re.search(r'name="csrf" value="([^"]+)"', page)
            assert m, "not logged in"
            d.csrf = m.group(1)
            yield d
    finally:
        await srv.close()
        await gw.stop()


def audit_rows(rows: list[Any]) -> set[tuple[str, str, str, str]]:
    """(via, who, action, outcome) of the audit log."""
    return {tuple(a[1:5]) for a in rows}  # type: ignore[misc]
