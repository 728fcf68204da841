"""Login and logout: the dashboard token is exchanged for a session cookie, never kept in a URL."""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.web.auth import SESSIONS, operator_nonce, set_session_cookie
from gateway.web.dashboard.base import action, clear_session, redirect, render

log = logging.getLogger(__name__)


def _login_page(request: web.Request, message: str = "", status: int = 200) -> web.Response:
    sessions = request.app[SESSIONS]
    return render(
        request, "login.html", {"title": "Log in", "message": message, "enabled": sessions.enabled}, status=status
    )


async def root(request: web.Request) -> web.StreamResponse:
    """``/``: exchange ``?token=`` for a session, then go to the dashboard; else the login page."""
    sessions = request.app[SESSIONS]
    token = request.query.get("token")
    if token is not None:
        if not sessions.token_matches(token):
            log.warning("refused a dashboard login with a wrong token from %s", request.remote)
            return _login_page(request, "That login link's token is wrong or out of date. Paste the token below.", 401)
        # The token leaves the address bar at once: the browser is sent on to a URL without it.
        resp = web.HTTPSeeOther("/dashboard/")
        set_session_cookie(resp, request, sessions.issue())
        raise resp
    if operator_nonce(request) is not None:
        raise web.HTTPSeeOther("/dashboard/")
    return _login_page(request)


async def login(request: web.Request) -> web.StreamResponse:
    """POST ``/login``: the token typed into the form (the Origin check already ran)."""
    sessions = request.app[SESSIONS]
    form = await request.post()
    token = form.get("token")
    if not isinstance(token, str) or not token.strip():
        return _login_page(request, "Enter the dashboard token.", 400)
    if not sessions.token_matches(token.strip()):
        log.warning("refused a dashboard login with a wrong token from %s", request.remote)
        return _login_page(
            request, "Wrong token. Use the one the server printed at start, or server.dashboard_token.", 401
        )
    resp = web.HTTPSeeOther("/dashboard/")
    set_session_cookie(resp, request, sessions.issue())
    raise resp


@action
async def logout(request: web.Request) -> web.StreamResponse:
    """POST ``/logout``: the session ends here and its cookie is dropped."""
    nonce = operator_nonce(request)
    if nonce is not None:
        await request.app[SESSIONS].log_out(nonce)  # for every process, and after a restart
    resp = redirect("/", flash="You are logged out.")
    clear_session(resp)
    raise resp
