"""What every dashboard page shares: the nav, rendering, login and CSRF checks, keyset pages, actions.

Pages register nothing of their own here: a new page (SOPs, identity,
findings) adds a :class:`NavEntry` to ``NAV`` and its routes in its module.
Every action goes through :func:`act`: it runs the same function the CLI and
the chat tools call, as the operator principal, and writes an audit row that
says ``via dashboard`` and who.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from msgspec import Struct

from gateway.automation.store import SopError
from gateway.web.app import DASHBOARD_USER, operator_principal
from gateway.web.auth import COOKIE, SESSIONS, operator_nonce
from memory.store import MemoryStoreError
from pairing.principal import Principal
from pairing.store import PairingError

if TYPE_CHECKING:
    import jinja2

    from gateway.app import Gateway

log = logging.getLogger(__name__)

FLASH_COOKIE = "goclaw_flash"
PAGE_SIZE = 50
VIA = "dashboard"
SECURITY_HEADERS = {
    # Everything the dashboard loads is its own: no CDN, no inline script, never framed.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes Chromium send Origin: null on forms
    "Cache-Control": "no-store",
}


class NavEntry(Struct, frozen=True):
    """One entry of the top navigation."""

    path: str
    label: str


NAV: list[NavEntry] = [
    NavEntry("/dashboard/", "Overview"),
    NavEntry("/dashboard/people", "Pairing & people"),
    NavEntry("/dashboard/memory", "Memory"),
    NavEntry("/dashboard/memory/review", "Review"),
    NavEntry("/dashboard/chat", "Chat"),
    NavEntry("/dashboard/turns", "Turns"),
    NavEntry("/dashboard/sops", "SOPs"),
    NavEntry("/dashboard/identity", "Identity"),
    NavEntry("/dashboard/findings", "Findings"),
]

GW = web.AppKey("goclaw_dashboard_gateway", object)
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def _fmt_time(value: object) -> str:
    return f"{value:%Y-%m-%d %H:%M} UTC" if isinstance(value, datetime) else ("-" if value is None else str(value))


class Templates:
    """The dashboard's Jinja2 environment, made at the first page rendered (Jinja2 is not loaded at start)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._env: jinja2.Environment | None = None

    def environment(self) -> jinja2.Environment:
        """The environment: autoescaped, strict about undefined names, with the ``when`` filter."""
        if self._env is None:
            import jinja2

            env = jinja2.Environment(
                loader=jinja2.FileSystemLoader(self.folder),
                autoescape=True,  # every value is escaped; nothing a person typed is ever markup
                undefined=jinja2.StrictUndefined,
            )
            env.filters["when"] = _fmt_time
            self._env = env
        return self._env


TEMPLATE_ENGINE = web.AppKey("goclaw_dashboard_templates", Templates)


def gateway_of(request: web.Request) -> Gateway:
    """The running gateway the dashboard acts on."""
    return request.app[GW]  # type: ignore[return-value]


class DashError(Exception):
    """A request the dashboard answers with a page naming what was wrong (4xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ---- rendering ---------------------------------------------------------------------------------


def _flash_of(request: web.Request) -> dict[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(raw.encode()).decode())
        return {"kind": str(data["kind"]), "text": str(data["text"])}
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None


def render(request: web.Request, template: str, context: dict[str, Any], *, status: int = 200) -> web.Response:
    """A page: the template inside the base layout, with nav, CSRF token and the pending flash message."""
    nonce = operator_nonce(request)
    csrf = request.app[SESSIONS].csrf_for(nonce) if nonce else ""
    ctx = {
        "title": "Dashboard",
        "nav": NAV,
        "path": request.path,
        "csrf": csrf,
        "logged_in": nonce is not None,
        "agent": gateway_of(request).config.agent.name,
        "flash": _flash_of(request),
        **context,
    }
    html = request.app[TEMPLATE_ENGINE].environment().get_template(template).render(ctx)
    response = web.Response(text=html, status=status, content_type="text/html", charset="utf-8")
    response.headers.update(SECURITY_HEADERS)
    if ctx["flash"]:
        response.del_cookie(FLASH_COOKIE, path="/")
    return response


def redirect(location: str, *, flash: str | None = None, kind: str = "ok") -> web.HTTPSeeOther:
    """A 303 to ``location`` (post/redirect/get), carrying a one-time message."""
    resp = web.HTTPSeeOther(location)
    if flash:
        value = base64.urlsafe_b64encode(json.dumps({"kind": kind, "text": flash[:600]}).encode()).decode()
        resp.set_cookie(FLASH_COOKIE, value, path="/", httponly=True, samesite="Strict", max_age=60)
    return resp


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    """A page that says what was wrong and what to do; never a traceback."""
    return render(request, "error.html", {"status": status, "message": message}, status=status)


# ---- handlers: login, CSRF, errors -------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def page(handler: Handler) -> Handler:
    """A dashboard GET page: the operator must be logged in; errors become a readable 4xx page."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        if operator_nonce(request) is None:
            raise web.HTTPSeeOther("/")
        try:
            return await handler(request)
        except DashError as exc:
            return error_page(request, exc.status, exc.message)

    return wrapped


def action(handler: Handler) -> Handler:
    """A dashboard POST: logged in, with this session's CSRF token; errors become a readable 4xx page."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        nonce = operator_nonce(request)
        if nonce is None:
            return web.json_response({"error": "log in first: open the login URL the server printed"}, status=401)
        form = await request.post()
        token = form.get("csrf") or request.headers.get("X-CSRF-Token")
        if not request.app[SESSIONS].csrf_ok(nonce, token if isinstance(token, str) else None):
            log.warning("refused a dashboard POST %s without a valid CSRF token", request.path)
            return error_page(request, 403, "This form has no valid CSRF token. Reload the page and try again.")
        try:
            return await handler(request)
        except DashError as exc:
            return error_page(request, exc.status, exc.message)

    return wrapped


def operator() -> Principal:
    """The principal every dashboard action runs as: the admin user the dashboard token stands for."""
    return operator_principal()


async def act(
    request: web.Request,
    name: str,
    detail: str,
    run: Callable[[Principal], Awaitable[str]],
    *,
    back: str,
) -> web.StreamResponse:
    """Run one action as the operator, audit it (``via dashboard``, who), and redirect with its outcome.

    ``run`` calls the same function the CLI and the chat tools call; the
    authorization is that function's (or the pairing command's) check in code.
    A refusal or a bad value is answered 400 with the message, and audited.
    """
    gw = gateway_of(request)
    who = operator()
    try:
        message = await run(who)
    except DashError as exc:
        await gw.pairing.audit(VIA, DASHBOARD_USER, name, "refused", f"{detail}: {exc.message}"[:2000])
        raise
    except (PairingError, MemoryStoreError, SopError, ValueError) as exc:
        await gw.pairing.audit(VIA, DASHBOARD_USER, name, "error", f"{detail}: {exc}"[:2000])
        raise DashError(400, str(exc)) from None
    await gw.pairing.audit(VIA, DASHBOARD_USER, name, "ok", detail[:2000])
    raise redirect(back, flash=message)


def field(form: Any, name: str, *, required: bool = True, max_len: int = 2000) -> str:
    """One form field as stripped text, or a 400 naming it."""
    value = form.get(name)
    if value is None or not isinstance(value, str) or not value.strip():
        if required:
            raise DashError(400, f"the form field '{name}' is missing or empty")
        return ""
    value = value.strip()
    if len(value) > max_len:
        raise DashError(400, f"the form field '{name}' is longer than {max_len} characters")
    if "\x00" in value:
        raise DashError(400, f"the form field '{name}' contains a NUL character")
    return value


# ---- keyset pages ------------------------------------------------------------------------------


def encode_cursor(values: Sequence[Any]) -> str:
    """An opaque cursor for the row after which the next page starts."""
    plain = [v.isoformat() if isinstance(v, datetime) else v for v in values]
    return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")


def decode_cursor(raw: str | None, kinds: Sequence[type]) -> tuple[Any, ...] | None:
    """The values of a cursor made by :func:`encode_cursor`; a 400 for one this server did not make."""
    if not raw:
        return None
    try:
        values = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode())
        if not isinstance(values, list) or len(values) != len(kinds):
            raise ValueError
        out: list[Any] = []
        for kind, v in zip(kinds, values, strict=True):
            if kind is datetime:
                parsed = datetime.fromisoformat(v)
                if parsed.tzinfo is None:
                    raise ValueError
                out.append(parsed)
            elif kind is int:
                if not isinstance(v, int) or isinstance(v, bool):
                    raise ValueError
                out.append(v)
            else:
                if not isinstance(v, str):
                    raise ValueError
                out.append(v)
        return tuple(out)
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error):
        raise DashError(400, "the page cursor 'after' is not one this server made; go back to the first page") from None


class Page(Struct, frozen=True):
    """One keyset page: its rows and the cursor of the next page (None on the last)."""

    rows: list[Any]
    next_after: str | None
    scanned_only: int = 0  # a search page cut short by its scan window (the next page goes on)


def keyset_page(rows: Sequence[Any], limit: int, key: Callable[[Any], Sequence[Any]]) -> Page:
    """Cut ``limit + 1`` fetched rows to a page; the extra row says whether there is a next one."""
    shown = list(rows[:limit])
    more = len(rows) > limit
    return Page(shown, encode_cursor(key(shown[-1])) if more and shown else None)


def with_query(request: web.Request, **changes: str | None) -> str:
    """The current URL with some query parameters changed (None drops one)."""
    query = dict(request.query)
    for k, v in changes.items():
        if v is None:
            query.pop(k, None)
        else:
            query[k] = v
    return str(request.rel_url.with_query(query))


def clear_session(response: web.StreamResponse) -> None:
    """Drop the session cookie from the browser."""
    response.del_cookie(COOKIE, path="/")
