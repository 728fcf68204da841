"""Operator login: the dashboard token, the session cookie, CSRF tokens and the Origin check.

Admin access in the browser always needs a secret (issue 9, item 1). When the
operator configured no ``server.dashboard_token``, ``serve`` generates one at
first start, keeps it in the data folder (mode 0600) and prints a login URL, as
Jupyter does. The ``?token=`` of that URL (or the login form) is exchanged for
a session cookie (HttpOnly, SameSite=Strict) and the browser is sent on to a
URL without the token.

The session cookie is stateless and signed with a key derived from the
dashboard token, so every gateway process sharing the token accepts it and a
new token logs everyone out. Logout drops the cookie and keeps its nonce in
the database (``operator_logouts``, until the cookie would have expired), so
every process refuses it from then on, restarted or not.

Cross-site requests: every state-changing request and every WebSocket upgrade
whose ``Origin`` is not the server's own (or listed in
``server.allowed_origins``) is refused with 403, before any handler runs.
Requests without an ``Origin`` (API clients, the Bot Framework) are not
browsers acting for the operator; forms additionally carry a CSRF token tied to
the session.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from msgspec import Struct

from gateway.config import Config

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

COOKIE = "goclaw_session"
SESSION_SECONDS = 12 * 3600
TOKEN_FILE = "dashboard_token"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OPERATOR_USER = "admin"  # policy: "The dashboard stores its messages with the user ID admin"


# ---- the token: configured, or generated at first start --------------------------------------


def data_dir(cfg: Config) -> Path:
    """The data folder: next to the SQLite database, else ``./data``."""
    url = cfg.database.url
    prefix = "sqlite+aiosqlite:///"
    if url.startswith(prefix):
        path = url[len(prefix) :].split("?", 1)[0]
        if path and path != ":memory:":
            return Path(path).parent
    return Path("data")


def _read_token_file(path: Path) -> str | None:
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        # The secret must be the operator's alone: tighten it rather than refuse to start.
        log.warning("%s was readable by others; its mode is now 0600", path)
        path.chmod(0o600)
    return token if len(token) >= 32 else None


def load_or_create_token(folder: Path) -> tuple[str, Path, bool]:
    """The dashboard token kept in ``folder``: (token, its file, whether it was created now).

    Created with ``secrets.token_urlsafe(32)`` (32 random bytes), written with
    mode 0600 from the first byte (``O_EXCL``: two processes starting at once
    agree on one token).
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TOKEN_FILE
    existing = _read_token_file(path)
    if existing is not None:
        return existing, path, False
    token = secrets.token_urlsafe(32)
    path.unlink(missing_ok=True)  # an empty or short file is not a secret
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        again = _read_token_file(path)
        if again is None:
            raise
        return again, path, False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token, path, True


class TokenSource(Struct, frozen=True):
    """Where the running dashboard token came from."""

    generated_file: Path | None  # None: the operator configured server.dashboard_token


def with_dashboard_token(cfg: Config) -> tuple[Config, TokenSource]:
    """``cfg`` with a dashboard token: the configured one, or the one kept in the data folder."""
    if cfg.server.dashboard_token is not None:
        return cfg, TokenSource(None)
    from pydantic import SecretStr

    token, path, created = load_or_create_token(data_dir(cfg))
    if created:
        log.info("generated a dashboard token in %s (mode 0600)", path)
    server = cfg.server.model_copy(update={"dashboard_token": SecretStr(token)})
    return cfg.model_copy(update={"server": server}), TokenSource(path)


def login_url(host: str, port: int, token: str) -> str:
    """The URL that logs the operator in (a wildcard bind address is reached on loopback)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/?token={token}"


# ---- sessions and CSRF ------------------------------------------------------------------------


class OperatorSessions:
    """Signs and checks the operator's session cookie and its CSRF token."""

    def __init__(
        self,
        dashboard_token: str | None,
        *,
        clock: Callable[[], float] = time.time,
        engine: AsyncEngine | None = None,
    ) -> None:
        self._token = dashboard_token
        self._engine = engine  # where logouts are kept for every process (operator_logouts); None: this one only
        self._key = (
            hmac.new(dashboard_token.encode(), b"goclaw dashboard session v1", hashlib.sha256).digest()
            if dashboard_token
            else None
        )
        self._clock = clock
        # Nonces logged out, with when their cookie is past SESSION_SECONDS however early it was issued:
        # refused by age from then on, so forgotten then (a set grew by a nonce a logout, forever).
        self._revoked: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        """False when no dashboard token is set: nobody can log in."""
        return self._key is not None

    def token_matches(self, candidate: str) -> bool:
        """Whether ``candidate`` is the dashboard token (constant time; any text is safe to pass)."""
        if not self._token or not candidate:
            return False
        return hmac.compare_digest(candidate.encode("utf-8", "surrogatepass"), self._token.encode())

    def _sign(self, payload: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        """A new session cookie value."""
        payload = f"v1.{int(self._clock())}.{secrets.token_urlsafe(16)}"
        return f"{payload}.{self._sign(payload)}"

    def check(self, value: str | None) -> str | None:
        """The session's nonce when ``value`` is a valid, unexpired, unrevoked cookie; else None."""
        if not value or self._key is None:
            return None
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit():
            return None
        payload = ".".join(parts[:3])
        if not hmac.compare_digest(parts[3].encode("ascii", "replace"), self._sign(payload).encode()):
            return None
        age = self._clock() - int(parts[1])
        if age < 0 or age > SESSION_SECONDS or parts[2] in self._revoked:
            return None
        return parts[2]

    async def log_out(self, nonce: str) -> None:
        """Log one session out for every process sharing the database, restarted or not.

        The row is kept until the cookie would have expired anyway; older rows go here too.
        """
        self._revoke(nonce)
        if self._engine is None:
            return
        from sqlalchemy import delete

        from gateway.db import dialect_insert
        from gateway.models import OperatorLogout

        now = datetime.fromtimestamp(self._clock(), UTC)
        row = {"nonce": nonce, "logged_out_at": now, "expires_at": now + timedelta(seconds=SESSION_SECONDS)}
        insert = dialect_insert(self._engine.dialect.name, OperatorLogout).values(**row)
        async with self._engine.begin() as conn:
            await conn.execute(insert.on_conflict_do_nothing(index_elements=["nonce"]))
            await conn.execute(delete(OperatorLogout).where(OperatorLogout.expires_at < now))

    async def check_everywhere(self, value: str | None) -> str | None:
        """``check``, and not logged out in any process (the database's logouts): the nonce, else None."""
        nonce = self.check(value)
        if nonce is None or self._engine is None:
            return nonce
        from sqlalchemy import select

        from gateway.models import OperatorLogout

        async with self._engine.connect() as conn:
            found = await conn.scalar(select(OperatorLogout.nonce).where(OperatorLogout.nonce == nonce))
        if found is not None:
            self._revoke(nonce)  # from now on ``check`` refuses it in this process too
            return None
        return nonce

    def _revoke(self, nonce: str) -> None:
        """Refuse ``nonce`` in this process until its cookie is too old anyway, and forget those that are."""
        now = self._clock()
        for gone in [n for n, until in self._revoked.items() if until < now]:
            del self._revoked[gone]
        self._revoked[nonce] = now + SESSION_SECONDS

    def csrf_for(self, nonce: str) -> str:
        """The CSRF token of one session: every form and POST of the dashboard carries it."""
        return self._sign("csrf." + nonce)[:40]

    def csrf_ok(self, nonce: str, candidate: str | None) -> bool:
        """Whether ``candidate`` is this session's CSRF token."""
        if not candidate:
            return False
        return hmac.compare_digest(candidate.encode("utf-8", "replace"), self.csrf_for(nonce).encode())


SESSIONS = web.AppKey("goclaw_operator_sessions", OperatorSessions)


@web.middleware
async def operator_session(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Check a request's session cookie against every process's logouts, before any handler reads it.

    One read of ``operator_logouts`` for a request that carries a valid cookie (API calls carry
    none); a cookie logged out anywhere is then refused here too (``OperatorSessions.check``).
    """
    cookie = request.cookies.get(COOKIE)
    if cookie:
        await request.app[SESSIONS].check_everywhere(cookie)
    return await handler(request)


def operator_nonce(request: web.Request) -> str | None:
    """The nonce of the request's operator session, or None when not logged in.

    Signature, age and logouts: the ``operator_session`` middleware has already looked up
    this cookie in the database's logouts, so one made in another process counts here.
    """
    return request.app[SESSIONS].check(request.cookies.get(COOKIE))


def set_session_cookie(response: web.StreamResponse, request: web.Request, value: str) -> None:
    """Attach the session cookie: HttpOnly, SameSite=Strict, Secure over https."""
    response.set_cookie(
        COOKIE,
        value,
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


# ---- Origin ------------------------------------------------------------------------------------


def own_origin(request: web.Request) -> str:
    """The origin this request was addressed to (scheme and Host header)."""
    return f"{request.scheme}://{request.host}".lower()


def origin_allowed(request: web.Request, allowed: frozenset[str]) -> bool:
    """True when the request has no ``Origin`` (not a browser) or its ``Origin`` is ours or allowed."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    origin = origin.strip().rstrip("/").lower()
    return origin == own_origin(request) or origin in allowed


def origin_middleware(allowed_origins: list[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse cross-origin state-changing requests and WebSocket upgrades with 403."""
    allowed = frozenset(o.strip().rstrip("/").lower() for o in allowed_origins)

    @web.middleware
    async def check_origin(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if (request.method in STATE_CHANGING or upgrade) and not origin_allowed(request, allowed):
            log.warning(
                "refused a cross-origin %s %s from Origin %r", request.method, request.path, request.headers["Origin"]
            )
            return web.json_response(
                {
                    "error": "cross-origin request refused: this Origin is not the server's own and not in "
                    "server.allowed_origins"
                },
                status=403,
            )
        return await handler(request)

    return check_origin
