"""A local Discord (REST + gateway websocket) on 127.0.0.1 that real discord.py logs in to.

Tests drive a real :class:`discord.Client` against it; nothing in discord.py is
mocked. Two class attributes point discord.py here, and
:func:`running_fake_discord` sets and restores them::

    async with running_fake_discord() as discord_peer:
        adapter = discord_peer.make_adapter(handler)
        await adapter.start()
        await discord_peer.dispatch_message(discord_peer.text_channel_id, ALICE, "hi <@BOT>",
                                            mentions=[discord_peer.bot])
        sent = await discord_peer.wait_for_posts(discord_peer.text_channel_id, 1)
        await adapter.stop()

What it speaks: login (GET /users/@me, GET /oauth2/applications/@me), GET
/gateway/bot, POST /channels/{id}/messages (honouring ``enforce_nonce``),
POST /channels/{id}/typing, GET /channels/{id}, POST /users/@me/channels; on the
websocket HELLO, heartbeat ACK, IDENTIFY -> READY + GUILD_CREATE (echoing the
shard), RESUME -> replayed events + RESUMED, and MESSAGE_CREATE for every message
it dispatches or stores (so the bot sees its own replies, as on Discord).

It fails loudly: a request for a route it does not know answers 404 and is kept
in ``unexpected_requests``; a wrong token answers 401 (REST) or closes the
gateway with 4004.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import discord
import yarl
from aiohttp import WSMsgType, web

from channels.base import MessageHandler
from channels.discord import DiscordAdapter

DISCORD_EPOCH_MS = 1_420_070_400_000

RATE_LIMIT_BODY = {"message": "You are being rate limited.", "retry_after": 0.05, "global": False}


def snowflake(at: datetime | None = None, *, sequence: int = 0) -> int:
    """A Discord id whose embedded time is ``at`` (default: now)."""
    ms = int((at or datetime.now(UTC)).timestamp() * 1000)
    return ((ms - DISCORD_EPOCH_MS) << 22) | (sequence & 0xFFF)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _snowflake_time(snowflake_id: int) -> datetime:
    return datetime.fromtimestamp(((snowflake_id >> 22) + DISCORD_EPOCH_MS) / 1000, tz=UTC)


@dataclass(frozen=True)
class FakeUser:
    """A Discord user as the fake describes it in payloads."""

    id: int
    username: str
    global_name: str | None = None
    nick: str | None = None  # guild nickname, sent in the member sub-payload
    bot: bool = False

    def payload(self) -> dict[str, Any]:
        """The user object."""
        return {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "bot": self.bot,
        }

    def member_payload(self) -> dict[str, Any]:
        """The guild member object without ``user`` (as in MESSAGE_CREATE ``member``)."""
        # discord.py needs "flags", or it silently keeps the author a plain User.
        return {
            "nick": self.nick,
            "roles": [],
            "joined_at": "2025-01-01T00:00:00+00:00",
            "deaf": False,
            "mute": False,
            "flags": 0,
            "avatar": None,
        }


@dataclass
class SentMessage:
    """A message the bot created with POST /channels/{id}/messages."""

    id: int
    channel_id: int
    content: str
    nonce: str | None
    message_reference: dict[str, Any] | None
    allowed_mentions: dict[str, Any] | None


@dataclass
class PostAttempt:
    """One POST /channels/{id}/messages, whatever was answered."""

    channel_id: int
    content: str
    status: int


@dataclass
class _Failure:
    status: int
    stored: bool  # the message is kept although an error is answered (a write that timed out)


@dataclass
class _Session:
    session_id: str
    shard: tuple[int, int] | None
    ws: web.WebSocketResponse | None = None
    seq: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class FakeDiscord:
    """Discord's REST API and gateway on 127.0.0.1 (a free port), with one guild and one DM channel.

    The guild has a text channel (type 0) and a thread in it (type 11); the DM
    channel (type 1) is with :attr:`alice`.
    """

    def __init__(self, *, token: str = "fake-bot-token") -> None:
        """Prepare the fake's world; ``start()`` binds the port."""
        self.token = token
        self.application_id = snowflake(datetime(2025, 1, 1, tzinfo=UTC), sequence=1)
        self.bot = FakeUser(snowflake(datetime(2025, 1, 1, tzinfo=UTC), sequence=2), "goclaw", "GoClaw", bot=True)
        self.alice = FakeUser(snowflake(datetime(2025, 1, 2, tzinfo=UTC), sequence=3), "alice", "Alice", nick="Ali")
        self.bob = FakeUser(snowflake(datetime(2025, 1, 2, tzinfo=UTC), sequence=4), "bob", "Bob")
        self.other_bot = FakeUser(snowflake(datetime(2025, 1, 2, tzinfo=UTC), sequence=5), "otherbot", bot=True)
        self.guild_id = snowflake(datetime(2025, 1, 3, tzinfo=UTC), sequence=6)
        self.text_channel_id = snowflake(datetime(2025, 1, 3, tzinfo=UTC), sequence=7)
        self.thread_id = snowflake(datetime(2025, 1, 3, tzinfo=UTC), sequence=8)
        self.dm_channel_id = snowflake(datetime(2025, 1, 3, tzinfo=UTC), sequence=9)
        self.role_id = snowflake(datetime(2025, 1, 3, tzinfo=UTC), sequence=10)

        self.sent: list[SentMessage] = []
        self.post_attempts: list[PostAttempt] = []
        self.typing: list[int] = []
        self.identifies: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.unexpected_requests: list[str] = []

        self.hold_ready = False
        """When True, IDENTIFY is answered with nothing (to test the READY timeout)."""
        self.close_identify_with: int | None = None
        """When set, IDENTIFY is answered by closing the gateway with this code (4014: intents)."""
        self.echo_sent_messages = True
        """Whether stored bot messages come back as MESSAGE_CREATE, as on Discord."""

        self._failures: dict[int, deque[_Failure]] = {}
        self._sessions: dict[str, _Session] = {}
        self._replay: dict[str, list[dict[str, Any]]] = {}
        self._messages: dict[int, dict[str, Any]] = {}
        self._nonces: dict[tuple[int, str], dict[str, Any]] = {}
        self._sockets: set[web.WebSocketResponse] = set()
        self._ids = itertools.count(100)
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Bind 127.0.0.1 on a free port and serve."""
        app = web.Application()
        api = "/api/v10"
        app.router.add_get(f"{api}/users/@me", self._get_me)
        app.router.add_get(f"{api}/oauth2/applications/@me", self._get_application)
        app.router.add_get(f"{api}/gateway/bot", self._get_gateway_bot)
        app.router.add_get(f"{api}/gateway", self._get_gateway_bot)
        app.router.add_get(f"{api}/channels/{{channel_id}}", self._get_channel)
        app.router.add_post(f"{api}/channels/{{channel_id}}/messages", self._post_message)
        app.router.add_post(f"{api}/channels/{{channel_id}}/typing", self._post_typing)
        app.router.add_post(f"{api}/users/@me/channels", self._create_dm)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Close every gateway connection and the server."""
        for ws in list(self._sockets):
            await ws.close(code=1001, message=b"fake Discord stopping")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (the REST API lives under ``/api/v10``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def gateway_url(self) -> yarl.URL:
        """The websocket URL discord.py connects to."""
        return yarl.URL(f"ws://127.0.0.1:{self.port}/gateway")

    @contextlib.contextmanager
    def patch_discord_py(self) -> Iterator[None]:
        """Point discord.py's REST base and default gateway here; restore them on exit."""
        with discord_py_pointed_at(self.base_url, self.gateway_url):
            yield

    def make_adapter(self, handler: MessageHandler, **overrides: Any) -> DiscordAdapter:
        """A DiscordAdapter for this fake's token, with test-sized timeouts (override any option)."""
        options: dict[str, Any] = {
            "ready_timeout": 5.0,
            "guild_ready_timeout": 0.05,
            "send_retry_delays": (0.01, 0.02, 0.04),
            "stop_timeout": 2.0,
        }
        options.update(overrides)
        return DiscordAdapter(self.token, handler, **options)

    # ---- what tests do ----------------------------------------------------------------

    def guild_shard(self, shard_count: int) -> int:
        """The shard that receives the guild's events, by Discord's formula."""
        return (self.guild_id >> 22) % shard_count

    async def dispatch_message(
        self,
        channel_id: int,
        author: FakeUser,
        content: str = "",
        *,
        mentions: Sequence[FakeUser] = (),
        mention_roles: Sequence[int] = (),
        attachments: Sequence[str] = (),
        guild_id: int | None = None,
        message_id: int | None = None,
    ) -> int:
        """Send MESSAGE_CREATE over the gateway; return the message id.

        ``guild_id`` defaults to the fake guild for its text channel and thread;
        ``attachments`` are file names.
        """
        if guild_id is None and channel_id in (self.text_channel_id, self.thread_id):
            guild_id = self.guild_id
        message_id = message_id or snowflake(sequence=next(self._ids))
        data: dict[str, Any] = {
            "id": str(message_id),
            "channel_id": str(channel_id),
            "author": author.payload(),
            "content": content,
            "timestamp": _iso(_snowflake_time(message_id)),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [
                {**user.payload(), **({"member": user.member_payload()} if guild_id else {})} for user in mentions
            ],
            "mention_roles": [str(role) for role in mention_roles],
            "attachments": [self._attachment(channel_id, name) for name in attachments],
            "embeds": [],
            "pinned": False,
            "type": 0,
            "flags": 0,
        }
        if guild_id is not None:
            data["guild_id"] = str(guild_id)
            data["member"] = author.member_payload()
        self._messages[message_id] = data
        await self._dispatch("MESSAGE_CREATE", data, guild_id=guild_id)
        return message_id

    def fail_next_posts(self, channel_id: int, count: int = 1, *, status: int = 429, stored: bool = False) -> None:
        """Answer the next ``count`` POST /channels/{id}/messages with ``status``.

        429 comes with Discord's body and headers (``retry_after`` 0.05 s).
        ``stored=True`` keeps the message although the error is answered, as when
        a write succeeds but its answer is lost. Prefer 503 to 500 in fast tests:
        discord.py itself retries 500/502/504 with 1 s+ sleeps.
        """
        queue = self._failures.setdefault(channel_id, deque())
        queue.extend(_Failure(status, stored) for _ in range(count))

    async def drop_connection(self, *, replay: Sequence[int] = (), code: int = 4000) -> None:
        """Close every gateway connection with ``code``; a RESUME then replays ``replay`` (message ids).

        Discord replays the events a resuming client missed; replaying one it has
        already seen models a RESUME from a sequence number taken before the
        message (the redelivery the gateway must dedup).
        """
        for session in self._sessions.values():
            self._replay[session.session_id] = [self._messages[message_id] for message_id in replay]
            ws, session.ws = session.ws, None
            if ws is not None:
                await ws.close(code=code, message=b"fake Discord dropped the connection")

    def posts_to(self, channel_id: int) -> list[SentMessage]:
        """The messages stored in ``channel_id``, in order."""
        return [message for message in self.sent if message.channel_id == channel_id]

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 2.0) -> None:
        """Wait until ``condition()`` holds, re-checking whenever the fake sees a request."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def wait_for_posts(self, channel_id: int, count: int, timeout: float = 2.0) -> list[SentMessage]:
        """Wait until ``channel_id`` holds at least ``count`` bot messages; return them."""
        await self.wait_until(lambda: len(self.posts_to(channel_id)) >= count, timeout)
        return self.posts_to(channel_id)

    # ---- payloads ---------------------------------------------------------------------

    def _attachment(self, channel_id: int, filename: str) -> dict[str, Any]:
        attachment_id = snowflake(sequence=next(self._ids))
        url = f"https://cdn.discordapp.com/attachments/{channel_id}/{attachment_id}/{filename}"
        return {"id": str(attachment_id), "filename": filename, "size": 1024, "url": url, "proxy_url": url}

    def _channels(self) -> dict[int, dict[str, Any]]:
        guild = str(self.guild_id)
        return {
            self.text_channel_id: {
                "id": str(self.text_channel_id),
                "type": 0,
                "guild_id": guild,
                "name": "general",
                "position": 0,
                "permission_overwrites": [],
                "nsfw": False,
                "parent_id": None,
                "topic": None,
                "rate_limit_per_user": 0,
            },
            self.thread_id: {
                "id": str(self.thread_id),
                "type": 11,
                "guild_id": guild,
                "name": "release-planning",
                "parent_id": str(self.text_channel_id),
                "owner_id": str(self.alice.id),
                "message_count": 0,
                "member_count": 2,
                "rate_limit_per_user": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": "2025-01-03T00:00:00+00:00",
                    "locked": False,
                },
            },
            self.dm_channel_id: {
                "id": str(self.dm_channel_id),
                "type": 1,
                "recipients": [self.alice.payload()],
                "last_message_id": None,
            },
        }

    def _guild_payload(self) -> dict[str, Any]:
        channels = self._channels()
        role = {"hoist": False, "managed": False, "mentionable": True, "flags": 0, "color": 0, "icon": None}
        return {
            "id": str(self.guild_id),
            "name": "Fake Guild",
            "icon": None,
            "owner_id": str(self.alice.id),
            "roles": [
                {**role, "id": str(self.guild_id), "name": "@everyone", "permissions": "3072", "position": 0},
                {**role, "id": str(self.role_id), "name": "Helpers", "permissions": "0", "position": 1},
            ],
            "emojis": [],
            "stickers": [],
            "features": [],
            "member_count": 3,
            "members": [{**user.member_payload(), "user": user.payload()} for user in (self.bot, self.alice)],
            "channels": [channels[self.text_channel_id]],
            "threads": [channels[self.thread_id]],
            "voice_states": [],
            "presences": [],
            "large": False,
            "unavailable": False,
            "joined_at": "2025-01-03T00:00:00+00:00",
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "nsfw_level": 0,
        }

    # ---- REST -------------------------------------------------------------------------

    @staticmethod
    def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        # Exactly "application/json": discord.py compares the header verbatim and
        # reads a body with "; charset=utf-8" as plain text.
        return web.Response(
            status=status,
            body=json.dumps(data).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    def _unauthorized(self) -> web.Response:
        return self._json({"message": "401: Unauthorized", "code": 0}, status=401)

    def _touch(self) -> None:
        self._changed.set()

    async def _get_me(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return self._json({**self.bot.payload(), "verified": True, "mfa_enabled": False, "flags": 0})

    async def _get_application(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return self._json(
            {
                "id": str(self.application_id),
                "name": "goclaw",
                "icon": None,
                "description": "",
                "bot_public": False,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "flags": 0,
                "owner": self.alice.payload(),
                "team": None,
            }
        )

    async def _get_gateway_bot(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return self._json(
            {
                "url": str(self.gateway_url),
                "shards": 1,
                "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1},
            }
        )

    async def _get_channel(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        channel = self._channels().get(int(request.match_info["channel_id"]))
        if channel is None:
            return self._json({"message": "Unknown Channel", "code": 10003}, status=404)
        return self._json(channel)

    async def _create_dm(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        body = await request.json()
        if str(body.get("recipient_id")) != str(self.alice.id):
            return self._json({"message": "Unknown User", "code": 10013}, status=404)
        return self._json(self._channels()[self.dm_channel_id])

    async def _post_typing(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        self.typing.append(int(request.match_info["channel_id"]))
        self._touch()
        return web.Response(status=204)

    async def _post_message(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        channel_id = int(request.match_info["channel_id"])
        body = await request.json()
        content = body.get("content") or ""
        nonce = body.get("nonce")
        failure = self._failures.get(channel_id)
        planned = failure.popleft() if failure else None
        self.post_attempts.append(PostAttempt(channel_id, content, planned.status if planned else 200))
        self._touch()

        if planned is not None and not planned.stored:
            return self._error(planned.status)
        if not content:
            return self._json({"message": "Cannot send an empty message", "code": 50006}, status=400)
        if len(content) > 2000:
            return self._json(
                {"message": "Invalid Form Body", "code": 50035, "errors": {"content": "Must be 2000 or fewer."}},
                status=400,
            )

        existing = self._nonces.get((channel_id, str(nonce))) if body.get("enforce_nonce") and nonce else None
        if existing is not None:
            # Discord: the same nonce within minutes returns the first message, no new one.
            data = existing
        else:
            data = await self._store(channel_id, body)
        if planned is not None:
            return self._error(planned.status)
        return self._json(data)

    async def _store(self, channel_id: int, body: dict[str, Any]) -> dict[str, Any]:
        message_id = snowflake(sequence=next(self._ids))
        reference = body.get("message_reference")
        guild_id = self.guild_id if channel_id in (self.text_channel_id, self.thread_id) else None
        data: dict[str, Any] = {
            "id": str(message_id),
            "channel_id": str(channel_id),
            "author": self.bot.payload(),
            "content": body["content"],
            "timestamp": _iso(_snowflake_time(message_id)),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 19 if reference else 0,
            "flags": 0,
            "nonce": body.get("nonce"),
        }
        if reference:
            data["message_reference"] = {"type": 0, "channel_id": str(channel_id), **reference}
        if guild_id is not None:
            data["guild_id"] = str(guild_id)
        if body.get("nonce") is not None:
            self._nonces[(channel_id, str(body["nonce"]))] = data
        self.sent.append(
            SentMessage(
                id=message_id,
                channel_id=channel_id,
                content=body["content"],
                nonce=body.get("nonce"),
                message_reference=reference,
                allowed_mentions=body.get("allowed_mentions"),
            )
        )
        self._messages[message_id] = data
        self._touch()
        if self.echo_sent_messages:
            echo = {**data, **({"member": self.bot.member_payload()} if guild_id else {})}
            await self._dispatch("MESSAGE_CREATE", echo, guild_id=guild_id)
        return data

    def _error(self, status: int) -> web.Response:
        if status == 429:
            # discord.py honours retry_after only with "Via" (else it assumes a Cloudflare ban).
            return self._json(
                RATE_LIMIT_BODY,
                status=429,
                headers={
                    "Retry-After": "1",
                    "Via": "1.1 google",
                    "X-RateLimit-Limit": "5",
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset-After": str(RATE_LIMIT_BODY["retry_after"]),
                    "X-RateLimit-Bucket": "fake-channel-messages",
                    "X-RateLimit-Scope": "user",
                },
            )
        return self._json({"message": f"{status}: fake Discord failure", "code": 0}, status=status)

    async def _unknown(self, request: web.Request) -> web.Response:
        self.unexpected_requests.append(f"{request.method} {request.path}")
        return self._json({"message": "404: Not Found", "code": 0}, status=404)

    # ---- gateway ----------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.add(ws)
        try:
            await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 41250}, "s": None, "t": None}))
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                payload = json.loads(frame.data)
                op, data = payload.get("op"), payload.get("d")
                if op == 1:
                    await ws.send_str(json.dumps({"op": 11, "d": None, "s": None, "t": None}))
                elif op == 2:
                    await self._identify(ws, data)
                elif op == 6:
                    await self._resume(ws, data)
        finally:
            self._sockets.discard(ws)
            self._touch()
        return ws

    async def _identify(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        self.identifies.append(data)
        self._touch()
        if data.get("token") != self.token:
            await ws.close(code=4004, message=b"Authentication failed.")
            return
        if self.close_identify_with is not None:
            await ws.close(code=self.close_identify_with, message=b"Disallowed intent(s).")
            return
        if self.hold_ready:
            return
        shard = tuple(data["shard"]) if data.get("shard") else None
        session = _Session(session_id=secrets.token_hex(16), shard=shard, ws=ws)  # type: ignore[arg-type]
        self._sessions[session.session_id] = session
        ready: dict[str, Any] = {
            "v": 10,
            "user": {**self.bot.payload(), "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [],
            "session_id": session.session_id,
            "resume_gateway_url": str(self.gateway_url),
            "application": {"id": str(self.application_id), "flags": 0},
        }
        owns_guild = shard is None or self.guild_shard(shard[1]) == shard[0]
        if owns_guild:
            ready["guilds"] = [{"id": str(self.guild_id), "unavailable": True}]
        if shard is not None:
            ready["shard"] = list(shard)
        await self._send_event(session, "READY", ready)
        if owns_guild:
            await self._send_event(session, "GUILD_CREATE", self._guild_payload())

    async def _resume(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        self.resumes.append(data)
        self._touch()
        session = self._sessions.get(data.get("session_id", ""))
        if session is None or data.get("token") != self.token:
            await ws.send_str(json.dumps({"op": 9, "d": False, "s": None, "t": None}))
            return
        session.ws = ws
        for event in self._replay.pop(session.session_id, []):
            await self._send_event(session, "MESSAGE_CREATE", event)
        await self._send_event(session, "RESUMED", {})

    async def _send_event(self, session: _Session, name: str, data: dict[str, Any]) -> None:
        async with session.lock:
            if session.ws is None or session.ws.closed:
                return
            session.seq += 1
            await session.ws.send_str(json.dumps({"op": 0, "t": name, "s": session.seq, "d": data}))

    async def _dispatch(self, name: str, data: dict[str, Any], *, guild_id: int | None) -> None:
        # Discord routes a guild's events to shard (guild_id >> 22) % count, DMs to shard 0.
        for session in list(self._sessions.values()):
            if session.shard is not None:
                shard_id, count = session.shard
                wanted = (guild_id >> 22) % count if guild_id is not None else 0
                if shard_id != wanted:
                    continue
            await self._send_event(session, name, data)


@contextlib.contextmanager
def discord_py_pointed_at(base_url: str, gateway_url: yarl.URL) -> Iterator[None]:
    """Make discord.py use ``base_url`` for REST and ``gateway_url`` for the gateway, then restore."""
    old_base = discord.http.Route.BASE
    old_gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE = f"{base_url}/api/v10"
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = gateway_url
    try:
        yield
    finally:
        discord.http.Route.BASE = old_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old_gateway


@contextlib.asynccontextmanager
async def running_fake_discord(*, token: str = "fake-bot-token") -> AsyncIterator[FakeDiscord]:
    """A started FakeDiscord with discord.py pointed at it; both undone on exit."""
    async with FakeDiscord(token=token) as peer:
        with peer.patch_discord_py():
            yield peer
