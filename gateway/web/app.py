"""The aiohttp application: health, metrics, HTTP API, WebSocket and the web chat."""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.sessions import SessionKey, SessionStore, SpeakerGone
from gateway.turn import ChunkSink, TurnHandler, TurnRequest, TurnResult
from gateway.web.api_error import ApiError
from gateway.web.auth import SESSIONS, OperatorSessions, operator_nonce, operator_session, origin_middleware
from gateway.web.tokens import metrics_refusal, tokens_match
from gateway.web.validation import check_session_name, parse_chat, parse_frame, query_int, validate_chat
from gateway.write_health import RETRY_AFTER_S, STORAGE_MESSAGE, WriteHealth, storage_reason
from pairing.principal import Principal, Role, is_human_admin
from pairing.store import PairingError, PairingStore

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
DASHBOARD_USER = "admin"  # policy: "The dashboard stores its messages with the user ID admin"


@dataclass
class WebContext:
    """What the handlers need; set on the app."""

    config: Config
    pairing: PairingStore
    sessions: SessionStore
    turns: TurnHandler
    metrics: Metrics
    channel_status: Callable[[], dict[str, str]] = field(default=lambda: {})
    extra_ready: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    write_health: WriteHealth | None = None  # built on the sessions' engine when not given
    # An API user's principal as their last turn ran as it, by user id: a turn reads the role again where
    # it stores its message (Principal.from_users), so the request that starts one need not read it first.
    turn_principals: dict[str, Principal] = field(default_factory=dict)


CTX = web.AppKey("goclaw_ctx", WebContext)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def operator_principal() -> Principal:
    """The operator: the admin user the dashboard token stands for."""
    return Principal.human(DASHBOARD_USER, Role.ADMIN, "Dashboard")


async def authenticate(ctx: WebContext, token: str | None, *, for_turn: bool = False) -> tuple[Principal, str]:
    """The principal of a bearer token and the channel its messages are stored under.

    API tokens map to unified users (their role comes from the pairing store);
    the dashboard token is the operator, stored as user ``admin``. With ``for_turn``
    (the request is a turn and nothing else) an API user's principal may be the one
    their last turn ran as: the turn reads the role again in the transaction that
    stores its message and runs as that (``SessionStore.begin_turn``), so no turn
    runs with a role changed since. Anything else reads the role here.
    """
    cfg = ctx.config
    dash = cfg.server.dashboard_token
    if token and dash is not None and tokens_match(token, dash):
        return operator_principal(), "web"
    if token:
        for api_user in cfg.server.api_users:
            if tokens_match(token, api_user.token):
                if for_turn and (kept := ctx.turn_principals.get(api_user.user)) is not None:
                    return kept, "api"
                try:
                    principal = await ctx.pairing.principal_for_user(api_user.user)
                except PairingError:
                    raise _unknown_user(api_user.user) from None
                if for_turn:
                    ctx.turn_principals[api_user.user] = principal
                return principal, "api"
    raise ApiError(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'")


def _unknown_user(user_id: str | None) -> ApiError:
    return ApiError(403, f"this token's user {user_id} is not a known user")


def ran_as(ctx: WebContext, result: TurnResult) -> None:
    """Keep the principal an API user's turn ran as, for their next turn's request (``authenticate``)."""
    p = result.principal
    if p is not None and p.from_users and p.user_id is not None and p.user_id in ctx.turn_principals:
        ctx.turn_principals[p.user_id] = p


async def run_turn(ctx: WebContext, req: TurnRequest, on_chunk: ChunkSink | None = None) -> TurnResult:
    """``ctx.turns.handle``; a speaker who has no users row any more is a 403 (nothing was stored)."""
    try:
        result = await ctx.turns.handle(req, on_chunk=on_chunk)
    except SpeakerGone as exc:
        if exc.user_id is not None:
            ctx.turn_principals.pop(exc.user_id, None)
        raise _unknown_user(exc.user_id) from None
    ran_as(ctx, result)
    return result


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def _conversation(principal: Principal, channel: str, session: str) -> SessionKey:
    # Each caller's session names are their own: one user can never post into, or
    # read, another's session by guessing its name.
    owner = principal.user_id or "anonymous"
    return SessionKey(channel, f"{owner}/{session}")


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """JSON errors; never a traceback in a response."""
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response({"error": exc.message}, status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason}, status=exc.status)
    except Exception as exc:
        reason = storage_reason(exc)
        if reason is not None:
            return storage_unavailable(request.app[CTX], reason)
        log.exception("unhandled error on %s %s", request.method, request.path)
        return web.json_response({"error": "internal error; it has been logged"}, status=500)


def storage_unavailable(ctx: WebContext, reason: str) -> web.Response:
    """503 with Retry-After for a write the database refused; logged once per burst."""
    assert ctx.write_health is not None
    ctx.write_health.failed(reason)
    return web.json_response(
        {"error": STORAGE_MESSAGE.format(reason=reason)},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def healthz(_: web.Request) -> web.Response:
    """The process is up."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """The database answers and enabled channels have started."""
    ctx = request.app[CTX]
    status: dict[str, Any] = {}
    ready = True
    assert ctx.write_health is not None
    # A real write (a heartbeat row, cached ~1 s): a read-only database still answers SELECT 1.
    problem = await ctx.write_health.probe()
    if problem is None:
        status["database"] = "ok"
    else:
        status["database"] = f"cannot store messages: {problem}"
        ready = False
    channels = ctx.channel_status()
    status["channels"] = channels
    if any(v != "started" for v in channels.values()):
        ready = False
    return web.json_response({"ready": ready, **status}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format."""
    ctx = request.app[CTX]
    refusal = metrics_refusal(
        loopback_host=_is_loopback(ctx.config.server.host),
        metrics_token=ctx.config.server.metrics_token,
        given=_bearer(request),
    )
    if refusal is not None:
        raise ApiError(401, refusal)
    ctx.metrics.queue_depth.set(await ctx.sessions.pending_jobs())
    return web.Response(body=ctx.metrics.render(), content_type="text/plain", charset="utf-8")


async def chat(request: web.Request) -> web.Response:
    """POST /v1/chat: one message in, the reply out."""
    ctx = request.app[CTX]
    principal, channel = await authenticate(ctx, _bearer(request), for_turn=True)
    raw = await request.read()
    if len(raw) > ctx.config.server.max_message_chars * 4 + 4096:
        raise ApiError(
            413, f"the request is larger than server.max_message_chars ({ctx.config.server.max_message_chars})"
        )
    session, text, message_id = parse_chat(raw, ctx.config.server.max_message_chars)
    result = await run_turn(
        ctx,
        TurnRequest(
            key=_conversation(principal, channel, session),
            principal=principal,
            text=text,
            message_id=message_id or "api-" + secrets.token_hex(8),
            said_at=datetime.now(UTC),
            display_name=principal.display_name,
        ),
    )
    assert ctx.write_health is not None
    ctx.write_health.succeeded()  # the message (and its reply) were stored
    payload: dict[str, Any] = {"session": session, "reply": result.reply}
    if result.duplicate:
        payload["duplicate"] = True
    if result.failed:
        payload["error"] = "model unavailable"
        return web.json_response(payload, status=503)
    return web.json_response(payload)


PAGE_DEFAULT = 500
"""Messages ``GET /v1/sessions/{id}/messages`` answers without ``?limit=`` (``before`` names the next page)."""
PAGE_MAX = 1000


async def session_messages(request: web.Request) -> web.Response:
    """GET /v1/sessions/{id}/messages: a participant's (or an admin's) view of a session."""
    ctx = request.app[CTX]
    principal, channel = await authenticate(ctx, _bearer(request))
    name = check_session_name(request.match_info["id"], field="id")
    session_id = await ctx.sessions.find_session(_conversation(principal, channel, name))
    if session_id is None and (is_human_admin(principal) or principal.user_id):
        # An internal session id: admins may read any; others only where they spoke.
        row = await ctx.sessions.get_session(name)
        if row is not None and (
            is_human_admin(principal) or (principal.user_id and await ctx.sessions.took_part(row.id, principal.user_id))
        ):
            session_id = row.id
    if session_id is None:
        raise ApiError(404, f"no session {name!r} that you can read")
    # A page at a time, newest first in pages, each oldest first: a long session's whole history,
    # built on this loop, held every turn up for seconds (2 s at 100,000 messages).
    limit = query_int(request.query, "limit", default=PAGE_DEFAULT, low=1, high=PAGE_MAX)
    before = query_int(request.query, "before", default=None, low=1, high=2**62)
    assert limit is not None
    messages, more = await ctx.sessions.newest_messages(session_id, limit, before=before)
    body: dict[str, Any] = {"session": name, "messages": [m.as_json() for m in messages]}
    if more:
        body["before"] = str(messages[0].id)  # the next page: ?before=<this>
    return web.json_response(body)


async def websocket(request: web.Request) -> web.StreamResponse:
    """GET /v1/ws: token as ?token= or in the first frame; then {"session","text"} frames."""
    ctx = request.app[CTX]
    token = request.query.get("token")
    principal: Principal | None = None
    channel = "api"
    # The operator's browser is admin by its session cookie only (issue 9: never by a frame's say-so).
    by_cookie = operator_nonce(request) is not None
    if by_cookie:
        principal, channel = operator_principal(), "web"
    elif token:
        try:
            principal, channel = await authenticate(ctx, token)
        except ApiError as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
    ws = web.WebSocketResponse(heartbeat=30, max_msg_size=ctx.config.server.max_message_chars * 4 + 4096)
    await ws.prepare(request)
    if by_cookie and principal is not None:
        await ws.send_json({"type": "ready", "user": principal.user_id, "role": principal.stored_role})
    async for frame in ws:
        if frame.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            continue
        try:
            body = parse_frame(frame.data)
        except ApiError as exc:
            await ws.send_json({"type": "error", "error": exc.message, "status": exc.status})
            continue
        if principal is None:
            try:
                tok = body.get("token") if isinstance(body, dict) else None
                principal, channel = await authenticate(ctx, tok if isinstance(tok, str) else None)
            except ApiError as exc:
                await ws.send_json({"type": "error", "error": exc.message, "status": exc.status})
                await ws.close()
                break
            await ws.send_json({"type": "ready", "user": principal.user_id, "role": principal.stored_role})
            continue
        try:
            session, text, message_id = validate_chat(body, ctx.config.server.max_message_chars, what="the frame")
        except ApiError as exc:
            await ws.send_json({"type": "error", "error": exc.message, "status": exc.status})
            continue

        relay = _ChunkRelay(ws)
        try:
            result = await run_turn(
                ctx,
                TurnRequest(
                    key=_conversation(principal, channel, session),
                    principal=principal,
                    text=text,
                    message_id=message_id or "ws-" + secrets.token_hex(8),
                    said_at=datetime.now(UTC),
                    display_name=principal.display_name,
                ),
                on_chunk=relay.send,
            )
        except ApiError as exc:  # the token's user is gone: this socket speaks for nobody now
            await ws.send_json({"type": "error", "error": exc.message, "status": exc.status})
            await ws.close()
            break
        except Exception as exc:
            reason = storage_reason(exc)
            if reason is not None:
                assert ctx.write_health is not None
                ctx.write_health.failed(reason)
                error = STORAGE_MESSAGE.format(reason=reason)
                await ws.send_json({"type": "error", "error": error, "status": 503, "retry_after": RETRY_AFTER_S})
                continue
            log.exception("websocket turn failed")
            if ws.closed:
                break
            await ws.send_json({"type": "error", "error": "internal error; it has been logged", "status": 500})
            continue
        principal = result.principal or principal  # as the person is now (the role read by this turn)
        reply_frame: dict[str, Any] = {
            "type": "reply",
            "session": session,
            "reply": result.reply,
            "failed": result.failed,
            "chunks_match": relay.spelled().strip() == (result.reply or ""),
        }
        if by_cookie and result.turn_record_id is not None:
            reply_frame["explain"] = f"/dashboard/turns/{result.turn_record_id}"
        try:
            await ws.send_json(reply_frame)
        except ConnectionError:
            # The client left while its reply streamed (it is stored): not a storage failure.
            break
    return ws


class _ChunkRelay:
    """One turn's chunks to a WebSocket as ``{"type": "chunk"}`` frames, as they come.

    They are the model's text as it streams (every tool round's, see
    gateway.llm.loop); the turn's ``reply`` frame follows with the stored reply,
    and its ``chunks_match`` false tells the client that the chunks did not spell
    what was stored (text of a round that then called tools, a fallback, a failure
    notice after some text), so it should show ``reply`` instead.
    """

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws
        self._sent: list[str] = []

    async def send(self, chunk: str) -> None:
        """One chunk frame; a client that left is not an error (the turn still stores its reply)."""
        self._sent.append(chunk)
        if self._ws.closed:
            return
        try:
            await self._ws.send_json({"type": "chunk", "text": chunk})
        except ConnectionError:
            log.info("websocket closed while a reply streamed; the reply is still stored")

    def spelled(self) -> str:
        """What the chunks sent so far spell."""
        return "".join(self._sent)


def build_web_app(ctx: WebContext) -> web.Application:
    """The aiohttp application with every route."""
    app = web.Application(
        middlewares=[errors_middleware, origin_middleware(ctx.config.server.allowed_origins), operator_session],
        client_max_size=ctx.config.server.max_message_chars * 4 + 65536,
    )
    if ctx.write_health is None:
        ctx.write_health = WriteHealth(ctx.sessions.engine)
    app[CTX] = ctx
    dash = ctx.config.server.dashboard_token
    app[SESSIONS] = OperatorSessions(dash.get_secret_value() if dash is not None else None, engine=ctx.sessions.engine)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat", chat)
    app.router.add_get("/v1/sessions/{id}/messages", session_messages)
    app.router.add_get("/v1/ws", websocket)
    app.router.add_static("/static/", STATIC)
    if ctx.config.server.openai_compat:
        from gateway.web.openai_compat import add_routes

        add_routes(app)
    return app
