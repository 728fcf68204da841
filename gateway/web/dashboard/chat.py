"""The operator's chat (history shown on reload, admin slash commands) and "explain a turn"."""

from __future__ import annotations

from aiohttp import web

from gateway.sessions import SessionKey
from gateway.web.app import DASHBOARD_USER
from gateway.web.dashboard import queries
from gateway.web.dashboard.base import VIA, DashError, action, field, gateway_of, operator, page, render, with_query
from pairing.commands import handle_command, parse_command

CHAT_SESSION = "dashboard"
HISTORY_SHOWN = 200


def chat_key() -> SessionKey:
    """The session the dashboard chat writes to: the same one the WebSocket uses for the operator."""
    return SessionKey("web", f"{DASHBOARD_USER}/{CHAT_SESSION}")


@page
async def chat(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/chat: the web chat as the operator, with the session's history."""
    gw = gateway_of(request)
    session_id = await gw.sessions.find_session(chat_key())
    history = (await gw.sessions.newest_messages(session_id, HISTORY_SHOWN))[0] if session_id else []
    replies = [m.platform_message_id for m in history if m.is_agent]
    explain = await queries.turn_ids_by_reply(gw.engine, session_id, replies) if session_id else {}
    return render(
        request,
        "chat.html",
        {
            "title": "Chat",
            "history": history,
            "explain": explain,
            "session": CHAT_SESSION,
            "session_id": session_id,
            "model": f"{gw.provider.name}/{gw.config.llm.model}",
            "max_chars": gw.config.server.max_message_chars,
        },
    )


@action
async def command(request: web.Request) -> web.StreamResponse:
    """POST /dashboard/chat/command: an admin slash command, answered as in a Discord or Teams DM.

    ``{"command": false}`` means the text is not a command: the page sends it to the model instead.
    """
    gw = gateway_of(request)
    form = await request.post()
    text = field(form, "text", max_len=gw.config.server.max_message_chars)
    parsed = parse_command(text)
    if parsed is None:
        return web.json_response({"command": False})
    who = operator()
    reply: str | None
    if parsed.name == "whoami" and await gw.pairing.find_user(DASHBOARD_USER) is None:
        # The operator is the dashboard token's admin, not a paired person with a users row.
        await gw.pairing.audit(VIA, DASHBOARD_USER, "whoami", "ok", "")
        reply = "You are the operator (user admin, role admin), logged in with the dashboard token."
    else:
        reply = await handle_command(
            gw.pairing, channel=VIA, platform_user_id=DASHBOARD_USER, principal=who, text=text, is_direct=True
        )
    return web.json_response({"command": True, "reply": reply})


@page
async def turns(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/turns: answered turns, newest first (one session's with ?session=)."""
    gw = gateway_of(request)
    session_id = request.query.get("session", "").strip() or None
    if session_id and len(session_id) > 40:
        raise DashError(400, "the session id is longer than 40 characters")
    result = await queries.turns_page(gw.engine, session_id=session_id, after=request.query.get("after"))
    return render(
        request,
        "turns.html",
        {
            "title": "Turns",
            "page": result,
            "session_id": session_id,
            "next_url": with_query(request, after=result.next_after) if result.next_after else None,
        },
    )


@page
async def explain(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/turns/{id}: what went into one turn's prompt, as stored when it was answered."""
    gw = gateway_of(request)
    raw = request.match_info["id"]
    if not raw.isdigit() or len(raw) > 18:
        raise DashError(400, f"turn id {raw[:40]!r} is not a number")
    turn = await queries.get_turn(gw.engine, int(raw))
    if turn is None:
        raise DashError(404, f"no turn {raw}; see the Turns page")
    recs = await queries.records_by_id(gw.engine, [str(m.get("id")) for m in turn.memory])
    return render(
        request,
        "explain.html",
        {
            "title": f"Turn {turn.id}",
            "t": turn,
            "recs": recs,
            "total_tokens": sum(int(v) for v in turn.sections.values()),
            "now": gw.clock(),
        },
    )
