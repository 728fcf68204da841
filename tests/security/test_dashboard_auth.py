"""Admin access in the browser always needs a secret (issue 9, item 1), through the real app on 127.0.0.1.

The login URL's token is exchanged for an HttpOnly, SameSite=Strict session
cookie and leaves the address bar; the WebSocket is admin by that cookie (or
a bearer token) only, never by a frame saying ``{"dashboard": true}``; a
cross-origin POST or WebSocket upgrade is refused with 403; every dashboard
form needs its session's CSRF token.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import ClientSession, CookieJar, WSMsgType, WSServerHandshakeError
from aiohttp.test_utils import TestServer
from yarl import URL

from gateway.app import Gateway
from gateway.config import Config
from gateway.sessions import SessionKey
from gateway.web.auth import load_or_create_token

TOKEN = "dashboard-token-for-security-tests-0123456789"
EVIL = "http://evil.example"


@dataclass
class Served:
    gw: Gateway
    base: str
    http: ClientSession
    alice: str

    async def login(self) -> str:
        """Log in with the token URL; the CSRF token of the new session."""
        r = await self.http.get(f"{self.base}/?token={TOKEN}", allow_redirects=False)
        assert r.status == 303
        page = await (await self.http.get(f"{self.base}/dashboard/people")).text()
        m = re.search(r'name="csrf" value="([^"]+)"', page)
        assert m, page[:500]
        return m.group(1)


async def _served(sqlite_url: str, **server: object) -> AsyncIterator[Served]:
    cfg = Config.model_validate({"database": {"url": sqlite_url}, "server": {"dashboard_token": TOKEN, **server}})
    gw = Gateway(cfg)
    await gw.start(channels=False, worker=False)
    alice = (await gw.pairing.add_user("Alice", "user")).id
    srv = TestServer(gw.web, host="127.0.0.1")
    await srv.start_server()
    async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
        yield Served(gw, str(srv.make_url("")).rstrip("/"), http, alice)
    await srv.close()
    await gw.stop()


@pytest.fixture
async def served(sqlite_url: str) -> AsyncIterator[Served]:
    async for s in _served(sqlite_url):
        yield s


async def test_login_url_token_becomes_a_strict_httponly_cookie_and_leaves_the_url(served: Served) -> None:
    r = await served.http.get(f"{served.base}/?token={TOKEN}", allow_redirects=False)
    assert r.status == 303
    assert r.headers["Location"] == "/dashboard/"  # no token in the URL after login
    cookie = r.headers["Set-Cookie"]
    assert "goclaw_session=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert TOKEN not in cookie
    page = await served.http.get(f"{served.base}/dashboard/")
    assert page.status == 200
    assert "Overview" in await page.text()


async def test_wrong_token_and_no_cookie_get_no_dashboard(served: Served) -> None:
    r = await served.http.get(f"{served.base}/?token=not-the-token", allow_redirects=False)
    assert r.status == 401
    assert "goclaw_session" not in r.headers.get("Set-Cookie", "")
    r = await served.http.get(f"{served.base}/dashboard/people", allow_redirects=False)
    assert (r.status, r.headers["Location"]) == (303, "/")
    r = await served.http.post(f"{served.base}/dashboard/people/role", data={"user_id": served.alice, "role": "admin"})
    assert r.status == 401
    assert (await served.gw.pairing.get_user(served.alice)).role.value == "user"


async def test_websocket_dashboard_frame_grants_nothing(served: Served) -> None:
    async with served.http.ws_connect(f"{served.base}/v1/ws") as ws:
        await ws.send_json({"dashboard": True})
        err = await ws.receive_json()
        assert err["type"] == "error" and err["status"] == 401
        assert (await ws.receive()).type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
    assert await served.gw.sessions.find_session(SessionKey("web", "admin/dashboard")) is None


async def test_websocket_is_the_operator_by_the_session_cookie(served: Served) -> None:
    await served.login()
    async with served.http.ws_connect(f"{served.base}/v1/ws") as ws:
        assert await ws.receive_json() == {"type": "ready", "user": "admin", "role": "admin"}
        await ws.send_json({"session": "dashboard", "text": "hello"})
        while (frame := await ws.receive_json())["type"] != "reply":
            pass
        assert frame["explain"].startswith("/dashboard/turns/")
    sid = await served.gw.sessions.find_session(SessionKey("web", "admin/dashboard"))
    assert sid is not None
    assert (await served.gw.sessions.all_messages(sid))[0].stored_role == "admin"


async def test_cross_origin_websocket_and_post_are_refused_with_403(served: Served) -> None:
    csrf = await served.login()
    with pytest.raises(WSServerHandshakeError) as refused:
        await served.http.ws_connect(f"{served.base}/v1/ws", headers={"Origin": EVIL})
    assert refused.value.status == 403
    r = await served.http.post(
        f"{served.base}/dashboard/people/role",
        data={"user_id": served.alice, "role": "admin", "csrf": csrf},
        headers={"Origin": EVIL},
    )
    assert r.status == 403
    assert "cross-origin" in (await r.json())["error"]
    assert (await served.gw.pairing.get_user(served.alice)).role.value == "user"
    # The same POST from the server's own origin goes through.
    r = await served.http.post(
        f"{served.base}/dashboard/people/role",
        data={"user_id": served.alice, "role": "admin", "csrf": csrf},
        headers={"Origin": served.base},
    )
    assert r.status == 200
    assert (await served.gw.pairing.get_user(served.alice)).role.value == "admin"


async def test_an_allowed_origin_is_admitted(sqlite_url: str) -> None:
    async for s in _served(sqlite_url, allowed_origins=["https://bot.example.com"]):
        await s.login()
        async with s.http.ws_connect(f"{s.base}/v1/ws", headers={"Origin": "https://bot.example.com"}) as ws:
            assert (await ws.receive_json())["type"] == "ready"
        with pytest.raises(WSServerHandshakeError):
            await s.http.ws_connect(f"{s.base}/v1/ws", headers={"Origin": EVIL})


async def test_post_without_the_csrf_token_is_refused(served: Served) -> None:
    await served.login()
    r = await served.http.post(
        f"{served.base}/dashboard/people/role",
        data={"user_id": served.alice, "role": "admin"},
        headers={"Origin": served.base},
    )
    assert r.status == 403
    assert "CSRF" in await r.text()
    r = await served.http.post(
        f"{served.base}/dashboard/people/role",
        data={"user_id": served.alice, "role": "admin", "csrf": "forged"},
    )
    assert r.status == 403
    assert (await served.gw.pairing.get_user(served.alice)).role.value == "user"


async def test_logout_ends_the_session(served: Served) -> None:
    csrf = await served.login()
    cookie = served.http.cookie_jar.filter_cookies(URL(served.base))["goclaw_session"].value
    r = await served.http.post(f"{served.base}/logout", data={"csrf": csrf}, allow_redirects=False)
    assert r.status == 303
    # Even a copy of the old cookie no longer logs in.
    r = await served.http.get(
        f"{served.base}/dashboard/", headers={"Cookie": f"goclaw_session={cookie}"}, allow_redirects=False
    )
    assert r.status == 303


async def test_bad_form_input_gets_a_clear_4xx(served: Served) -> None:
    csrf = await served.login()
    r = await served.http.post(f"{served.base}/dashboard/people/role", data={"user_id": served.alice, "csrf": csrf})
    assert r.status == 400
    assert "role" in await r.text()
    r = await served.http.post(
        f"{served.base}/dashboard/people/role", data={"user_id": served.alice, "role": "owner", "csrf": csrf}
    )
    assert r.status == 400
    assert "unknown role" in await r.text()
    r = await served.http.post(
        f"{served.base}/dashboard/pairing/approve",
        data={"code": "NOPE", "channel": "discord", "role": "user", "csrf": csrf},
    )
    assert r.status == 400
    assert "no pairing code" in await r.text()
    r = await served.http.get(f"{served.base}/dashboard/memory?after=garbage")
    assert r.status == 400
    r = await served.http.get(f"{served.base}/dashboard/memory?status=bogus")
    assert r.status == 400 and "unknown status" in await r.text()


def test_token_file_is_created_0600_and_reused(tmp_path: Path) -> None:
    token, path, created = load_or_create_token(tmp_path / "data")
    assert created and len(token) >= 43  # 32 random bytes, url-safe
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _, created_again = load_or_create_token(tmp_path / "data")
    assert (again, created_again) == (token, False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", "config.yaml"],
        cwd=tmp_path,
        env={**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_login_url(proc: subprocess.Popen[str], port: int) -> tuple[str, list[str]]:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(rf"http://127\.0\.0\.1:{port}/\?token=([A-Za-z0-9_-]+)", line)
        if m:
            return m.group(1), seen
    raise AssertionError("no login URL printed:\n" + "".join(seen))


async def test_serve_generates_the_token_prints_the_login_url_and_ws_without_cookie_is_not_admin(
    tmp_path: Path,
) -> None:
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    example = (root / "config.example.yaml").read_text().replace("port: 8080", f"port: {port}")
    (tmp_path / "config.yaml").write_text(example)
    proc = _start(tmp_path, port)
    try:
        token, _ = _wait_for_login_url(proc, port)
        token_file = tmp_path / "data" / "dashboard_token"
        assert token_file.read_text().strip() == token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
            base = f"http://127.0.0.1:{port}"
            async with http.ws_connect(f"{base}/v1/ws") as ws:
                await ws.send_json({"dashboard": True})
                assert (await ws.receive_json())["status"] == 401
            r = await http.get(f"{base}/?token={token}", allow_redirects=False)
            assert (r.status, r.headers["Location"]) == (303, "/dashboard/")
            async with http.ws_connect(f"{base}/v1/ws") as ws:
                assert (await ws.receive_json())["role"] == "admin"
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=20)[0]
    assert "Traceback" not in rest
    # A restart keeps the same token (and prints the URL again).
    proc = _start(tmp_path, port)
    try:
        again, _ = _wait_for_login_url(proc, port)
        assert again == token
        async with ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


async def test_a_logout_holds_in_every_process_sharing_the_database_and_after_a_restart(db_url: str) -> None:
    # Two gateways on one database stand for two processes (`serve --workers 2`, or one restarted).
    cfg = Config.model_validate({"database": {"url": db_url}, "server": {"dashboard_token": TOKEN}})
    gateways: list[Gateway] = []
    servers: list[TestServer] = []

    async def start() -> str:
        gw = Gateway(cfg)
        await gw.start(channels=False, worker=False)
        srv = TestServer(gw.web, host="127.0.0.1")
        await srv.start_server()
        gateways.append(gw)
        servers.append(srv)
        return str(srv.make_url("")).rstrip("/")

    async def dashboard_status(base: str, cookie: str) -> int:
        async with ClientSession() as plain:
            r = await plain.get(
                f"{base}/dashboard/", headers={"Cookie": f"goclaw_session={cookie}"}, allow_redirects=False
            )
            return r.status

    try:
        a, b = await start(), await start()
        async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
            await http.get(f"{a}/?token={TOKEN}")
            cookie = http.cookie_jar.filter_cookies(URL(a))["goclaw_session"].value
            page = await (await http.get(f"{a}/dashboard/people")).text()
            m = re.search(r'name="csrf" value="([^"]+)"', page)
            assert m, page[:300]
            assert await dashboard_status(b, cookie) == 200  # the other process takes the session
            r = await http.post(f"{a}/logout", data={"csrf": m.group(1)}, allow_redirects=False)
            assert r.status == 303
        assert await dashboard_status(a, cookie) == 303  # to the login page
        assert await dashboard_status(b, cookie) == 303  # and in the other process, at once
        for srv, gw in zip(servers, gateways, strict=True):
            await srv.close()
            await gw.stop()
        servers.clear()
        gateways.clear()
        assert await dashboard_status(await start(), cookie) == 303  # and after a restart
    finally:
        for srv, gw in zip(servers, gateways, strict=True):
            await srv.close()
            await gw.stop()


async def test_a_logged_out_session_stays_refused_and_is_forgotten_once_its_cookie_is_too_old() -> None:
    # The process kept every logged-out nonce forever; now until the cookie is refused by its age.
    from gateway.web.auth import SESSION_SECONDS, OperatorSessions

    now = [1_000_000.0]
    sessions = OperatorSessions(TOKEN, clock=lambda: now[0])
    cookies = [sessions.issue() for _ in range(3)]
    for cookie in cookies:
        nonce = sessions.check(cookie)
        assert nonce is not None
        await sessions.log_out(nonce)
    assert [sessions.check(c) for c in cookies] == [None, None, None]
    now[0] += SESSION_SECONDS - 1
    assert [sessions.check(c) for c in cookies] == [None, None, None]  # still refused while young enough
    now[0] += 2
    fresh = sessions.issue()
    nonce = sessions.check(fresh)
    assert nonce is not None
    await sessions.log_out(nonce)
    assert len(sessions._revoked) == 1  # the three are forgotten: their cookies are past SESSION_SECONDS
    assert [sessions.check(c) for c in cookies] == [None, None, None]  # and refused by their age
    assert sessions.check(fresh) is None
