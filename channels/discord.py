"""Discord adapter: discord.py in, InboundMessage out; reply text in, Discord messages out.

Everything Discord-specific stays in this module (CONVENTIONS: one adapter per
platform, converting once at the edge). The gateway sees only
:class:`~channels.base.InboundMessage` and hands back reply text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Sequence

import aiohttp
import discord

from channels.base import (
    ConversationKind,
    InboundMessage,
    MessageHandler,
    OutboundMessage,
    split_text,
)

__all__ = [
    "DISCORD_MESSAGE_LIMIT",
    "DiscordAdapter",
    "DiscordDeliveryError",
    "DiscordStartError",
    "default_intents",
    "reply_parts",
    "to_inbound",
]

_log = logging.getLogger(__name__)

DISCORD_MESSAGE_LIMIT = 2000
"""Discord rejects message content longer than this many characters."""

# Only what people type: joins, pins, boosts and thread-created notices are not speech.
_SPOKEN_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})

# Reply text comes from a model: it must never ping @everyone, @here or a role.
_REPLY_MENTIONS = discord.AllowedMentions(everyone=False, roles=False, users=True, replied_user=True)

_MENTION = re.compile(r"<(@[!&]?|#)(\d+)>")


class DiscordStartError(RuntimeError):
    """The adapter could not log in or connect to the Discord gateway."""


class DiscordDeliveryError(RuntimeError):
    """A reply could not be delivered after all retries.

    Attributes:
        conversation_id: The channel (or thread) the reply was for.
        parts_sent: How many parts had been delivered before giving up.
        parts_total: How many parts the reply was split into.
    """

    def __init__(self, conversation_id: str, parts_sent: int, parts_total: int, cause: BaseException) -> None:
        super().__init__(
            f"Discord reply to conversation {conversation_id} failed after "
            f"{parts_sent}/{parts_total} parts were delivered: {cause!r}"
        )
        self.conversation_id = conversation_id
        self.parts_sent = parts_sent
        self.parts_total = parts_total


def default_intents() -> discord.Intents:
    """The gateway intents the adapter needs, and no more.

    ``guilds`` keeps the channel and thread cache (thread parents, channel names);
    ``guild_messages`` and ``dm_messages`` deliver MESSAGE_CREATE;
    ``message_content`` (privileged) is what makes ``content`` non-empty for guild
    messages that do not mention the bot. ``members`` is not needed: every guild
    message carries its author's and mentioned users' member data.
    """
    return discord.Intents(guilds=True, guild_messages=True, dm_messages=True, message_content=True)


def _should_ignore(message: discord.Message, bot_user_id: int) -> str | None:
    """Why ``message`` is not for the handler, or None if it is."""
    if message.author.id == bot_user_id:
        return "own message"
    if message.author.bot:
        # Bot-to-bot loops are the classic way two chat bots burn a quota overnight.
        return "sent by another bot"
    if message.type not in _SPOKEN_TYPES:
        return f"system message ({message.type.name})"
    if not message.content.strip() and not message.attachments:
        return "empty (no text, no attachments)"
    return None


def _render_text(message: discord.Message, bot_user_id: int) -> str:
    """The message text with the bot's mention removed and other mentions made readable."""
    users = {user.id: user for user in message.mentions}
    roles = {role.id: role for role in message.role_mentions}
    channels = {channel.id: channel for channel in message.channel_mentions}

    def replace(match: re.Match[str]) -> str:
        sigil, raw_id = match[1], int(match[2])
        if sigil in ("@", "@!"):
            if raw_id == bot_user_id:
                return ""
            user = users.get(raw_id)
            return f"@{user.display_name}" if user else match[0]
        if sigil == "@&":
            role = roles.get(raw_id)
            return f"@{role.name}" if role else match[0]
        channel = channels.get(raw_id)
        return f"#{channel.name}" if channel else match[0]

    text = _MENTION.sub(replace, message.content)
    # Removing "<@bot> " from the middle of a sentence leaves a double space.
    text = re.sub(r"[ \t]{2,}", " ", text).strip()
    lines = [text] if text else []
    lines.extend(f"[attachment: {attachment.filename}]" for attachment in message.attachments)
    return "\n".join(lines)


def to_inbound(message: discord.Message, bot_user_id: int) -> InboundMessage:
    """Convert a discord.py message into the gateway's :class:`InboundMessage`.

    Args:
        message: The message as discord.py parsed it from MESSAGE_CREATE.
        bot_user_id: The bot's own user id, whose mentions are stripped.

    Returns:
        The message, converted once. For a thread, ``conversation_id`` and
        ``thread_id`` are the thread's id and ``conversation_ids`` also holds the
        parent channel and guild ids. ``attachments`` holds the attachment URLs;
        their file names are appended to ``text`` as ``[attachment: name]``.
    """
    channel = message.channel
    channel_id = str(channel.id)
    thread_id: str | None = None
    ids: list[str] = [channel_id]

    if isinstance(channel, discord.Thread):
        thread_id = channel_id
        ids.append(str(channel.parent_id))
    guild_id = message.guild.id if message.guild else getattr(channel, "guild_id", None)
    if guild_id is not None:
        ids.append(str(guild_id))

    if isinstance(channel, discord.DMChannel):
        kind = ConversationKind.DIRECT
    elif isinstance(channel, discord.GroupChannel):
        kind = ConversationKind.GROUP
    elif guild_id is not None:
        kind = ConversationKind.CHANNEL
    else:
        # A channel discord.py has not cached and that carries no guild id is a DM.
        kind = ConversationKind.DIRECT

    return InboundMessage(
        channel="discord",
        conversation_id=channel_id,
        thread_id=thread_id,
        sender_id=str(message.author.id),
        display_name=message.author.display_name,
        text=_render_text(message, bot_user_id),
        timestamp=message.created_at,
        message_id=str(message.id),
        is_direct=kind is ConversationKind.DIRECT,
        mentions_bot=any(user.id == bot_user_id for user in message.mentions),
        kind=kind,
        conversation_ids=tuple(dict.fromkeys(ids)),
        attachments=tuple(attachment.url for attachment in message.attachments),
    )


def reply_parts(text: str) -> list[str]:
    """Split reply text into Discord-sized parts, never cutting a word unless it alone exceeds the limit."""
    return split_text(text, DISCORD_MESSAGE_LIMIT)


def _is_transient(exc: BaseException) -> bool:
    """Whether sending again may succeed.

    discord.py already sleeps out a 429 with a proper ``retry_after`` and repeats
    the request itself, so a 429 only reaches us when Cloudflare answered it. A
    403 or 404 (missing permission, deleted channel) or a 400 will not change
    by asking again.
    """
    if isinstance(exc, discord.DiscordServerError):
        return True
    if isinstance(exc, discord.HTTPException):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, aiohttp.ClientError | OSError | asyncio.TimeoutError)


class _LastFailure(logging.Handler):
    """Remembers the last error discord.py logged, so a start timeout can say what went wrong."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.record: logging.LogRecord | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.record = record

    def describe(self) -> str:
        """`` (last error: ...)`` for appending to a message, or "" when nothing was logged."""
        if self.record is None:
            return ""
        exc = self.record.exc_info[1] if self.record.exc_info else None
        detail = f": {exc!r}" if exc else ""
        return f" (last error: {self.record.getMessage()}{detail})"


class DiscordAdapter:
    """Connects one Discord bot to the gateway's message handler.

    Uses a real :class:`discord.Client` (an :class:`discord.AutoShardedClient`
    when ``shard_ids`` or ``shard_count`` is given) and lets discord.py do
    heartbeating, reconnecting, RESUME and REST rate limits.

    Gateway intents (see :func:`default_intents`): ``guilds``, ``guild_messages``,
    ``dm_messages`` and the privileged ``message_content``, which must be
    switched on for the bot in the Discord Developer Portal (Bot -> Privileged
    Gateway Intents -> Message Content); without it start() fails with
    :class:`DiscordStartError`. The privileged ``members`` intent is not needed.

    The bot needs the channel permissions View Channel, Send Messages, Send
    Messages in Threads and Read Message History (replies reference the
    message they answer).

    A RESUME after a lost connection may redeliver a message; ``message_id``
    is Discord's own snowflake, so it is stable and the gateway dedups on it.
    """

    name = "discord"

    def __init__(
        self,
        token: str,
        handler: MessageHandler,
        *,
        shard_ids: list[int] | None = None,
        shard_count: int | None = None,
        intents: discord.Intents | None = None,
        ready_timeout: float = 30.0,
        guild_ready_timeout: float = 2.0,
        send_retry_delays: Sequence[float] = (1.0, 2.0, 4.0),
        stop_timeout: float = 10.0,
    ) -> None:
        """Store settings only; no I/O happens until :meth:`start`.

        Args:
            token: The bot token (without the ``Bot`` prefix).
            handler: Called with each message for the bot; returns reply text or None.
            shard_ids: Shards this process runs; needs ``shard_count``.
            shard_count: Total shards of the bot; with ``shard_ids`` None, this
                process runs all of them.
            intents: Gateway intents; defaults to :func:`default_intents`.
            ready_timeout: Seconds start() waits for login and READY.
            guild_ready_timeout: Seconds discord.py waits after the last
                GUILD_CREATE before it declares READY.
            send_retry_delays: Pause before each retry of a failed send; its
                length is the number of retries.
            stop_timeout: Seconds stop() lets in-flight handlers and sends finish.

        Raises:
            ValueError: ``shard_ids`` without ``shard_count``, or an id outside it.
        """
        if shard_ids is not None:
            if shard_count is None:
                raise ValueError("shard_ids needs shard_count (the bot's total number of shards)")
            if not shard_ids or any(not 0 <= shard_id < shard_count for shard_id in shard_ids):
                raise ValueError(f"shard_ids {shard_ids} must be non-empty and within 0..{shard_count - 1}")
        self._token = token
        self._handler = handler
        self._shard_ids = list(shard_ids) if shard_ids is not None else None
        self._shard_count = shard_count
        self._intents = intents if intents is not None else default_intents()
        self._ready_timeout = ready_timeout
        self._guild_ready_timeout = guild_ready_timeout
        self._send_retry_delays = tuple(send_retry_delays)
        self._stop_timeout = stop_timeout

        self._client: discord.Client | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._in_flight: set[asyncio.Task[object]] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def bot_user_id(self) -> int | None:
        """The bot's Discord user id, known once start() has returned."""
        client = self._client
        return client.user.id if client is not None and client.user is not None else None

    def _build_client(self) -> discord.Client:
        # The bot never joins voice: discord.py's "PyNaCl/davey is not installed" warnings are noise.
        discord.VoiceClient.warn_nacl = False
        discord.VoiceClient.warn_dave = False
        client: discord.Client
        if self._shard_ids is not None or self._shard_count is not None:
            client = discord.AutoShardedClient(
                # None means "all shards": discord.py reads it with kwargs.pop("shard_ids", None).
                shard_ids=self._shard_ids,  # type: ignore[arg-type]
                shard_count=self._shard_count,
                intents=self._intents,
                guild_ready_timeout=self._guild_ready_timeout,
                chunk_guilds_at_startup=False,
                allowed_mentions=_REPLY_MENTIONS,
            )
        else:
            client = discord.Client(
                intents=self._intents,
                guild_ready_timeout=self._guild_ready_timeout,
                # Member data arrives with every message; a member list is never read.
                chunk_guilds_at_startup=False,
                allowed_mentions=_REPLY_MENTIONS,
            )
        # discord.py finds listeners as attributes named on_<event>.
        client.on_ready = self._on_ready  # type: ignore[attr-defined]
        client.on_message = self._on_message  # type: ignore[attr-defined]
        return client

    async def start(self) -> None:
        """Log in, connect in a background task, and return once Discord has sent READY.

        Raises:
            DiscordStartError: The token was rejected, a privileged intent is not
                enabled, or the gateway closed the connection before READY.
            TimeoutError: No READY within ``ready_timeout`` seconds.
            RuntimeError: Already started.
        """
        if self._client is not None:
            raise RuntimeError("DiscordAdapter is already started")
        self._stopping = False
        self._ready = asyncio.Event()
        client = self._client = self._build_client()
        deadline = time.monotonic() + self._ready_timeout
        failures = _LastFailure()
        discord_logger = logging.getLogger("discord")
        discord_logger.addHandler(failures)
        try:
            try:
                await asyncio.wait_for(client.login(self._token), timeout=self._ready_timeout)
            except discord.LoginFailure as exc:
                raise DiscordStartError("Discord rejected the bot token (GET /users/@me answered 401)") from exc
            except TimeoutError as exc:
                raise TimeoutError(
                    f"Discord login (GET /users/@me) did not answer within {self._ready_timeout:.1f}s"
                ) from exc
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                raise DiscordStartError(f"Discord login failed: {exc!r}") from exc

            connect_task = self._connect_task = asyncio.create_task(
                client.connect(reconnect=True), name="discord-gateway"
            )
            ready_task = asyncio.create_task(self._ready.wait(), name="discord-wait-ready")
            done, _ = await asyncio.wait(
                {connect_task, ready_task},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            ready_task.cancel()
            await asyncio.wait({ready_task})
            if self._ready.is_set():
                connect_task.add_done_callback(self._log_connection_end)
                _log.info("Discord connected as %s (id %s)", client.user, self.bot_user_id)
                return
            if connect_task in done:
                raise DiscordStartError(self._explain_connect_end(connect_task) + failures.describe())
            raise TimeoutError(
                f"Discord gateway {discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY} did not send READY "
                f"within {self._ready_timeout:.1f}s of login as {client.user}{failures.describe()}"
            )
        except BaseException:
            await self._close_client()
            raise
        finally:
            discord_logger.removeHandler(failures)

    @staticmethod
    def _explain_connect_end(task: asyncio.Task[None]) -> str:
        exc = task.exception() if not task.cancelled() else None
        if isinstance(exc, discord.PrivilegedIntentsRequired):
            return (
                "Discord refused a privileged intent (close code 4014): enable Message Content "
                "for this bot in the Developer Portal, Bot -> Privileged Gateway Intents"
            )
        if isinstance(exc, discord.ConnectionClosed):
            return f"Discord gateway closed the connection with code {exc.code} before READY: {exc.reason or exc}"
        if exc is not None:
            # discord.py 2.7 fails with AttributeError (self.ws is None) when the very first
            # gateway connect fails; the logged error before it says what really went wrong.
            return f"Discord gateway connection failed before READY: {exc!r}"
        return "Discord gateway connection ended before READY"

    def _log_connection_end(self, task: asyncio.Task[None]) -> None:
        # After READY nobody awaits the connect task: a fatal close would go unseen.
        if self._stopping or task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            _log.error("Discord gateway connection ended and will not reconnect: %r", exc, exc_info=exc)
        else:
            _log.warning("Discord gateway connection ended")

    async def stop(self) -> None:
        """Stop taking messages, let in-flight replies finish, then close the connection."""
        if self._client is None:
            return
        self._stopping = True
        pending = {task for task in self._in_flight if task is not asyncio.current_task()}
        if pending:
            _, still_running = await asyncio.wait(pending, timeout=self._stop_timeout)
            for task in still_running:
                task.cancel()
            if still_running:
                _log.warning(
                    "Discord adapter stopped with %d message(s) still being handled; their replies are dropped",
                    len(still_running),
                )
                await asyncio.wait(still_running)
        await self._close_client()

    async def _close_client(self) -> None:
        client, task = self._client, self._connect_task
        self._client = None
        self._connect_task = None
        if client is not None:
            await client.close()
        if task is not None:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                # Any error here was logged by _log_connection_end or raised by start().
                await task

    # ---- inbound -----------------------------------------------------------------------------

    async def _on_ready(self) -> None:
        self._ready.set()

    async def _on_message(self, message: discord.Message) -> None:
        """Handle one MESSAGE_CREATE; discord.py runs each in its own task."""
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            await self._handle(message)
        except Exception:
            # Never let an error escape into discord.py's event loop plumbing.
            _log.exception("Discord message %s in conversation %s could not be handled", message.id, message.channel.id)
        finally:
            if task is not None:
                self._in_flight.discard(task)

    async def _handle(self, message: discord.Message) -> None:
        bot_user_id = self.bot_user_id
        if self._stopping or bot_user_id is None:
            return
        reason = _should_ignore(message, bot_user_id)
        if reason is not None:
            _log.debug("Discord message %s ignored: %s", message.id, reason)
            return
        inbound = to_inbound(message, bot_user_id)
        if not inbound.text:
            _log.debug("Discord message %s ignored: nothing left after removing the bot mention", message.id)
            return

        async with contextlib.AsyncExitStack() as typing:
            try:
                await typing.enter_async_context(message.channel.typing())
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                # The indicator is a courtesy; a failure must not cost the reply.
                _log.warning("Discord typing indicator failed in %s: %r", inbound.conversation_id, exc)
            reply = await self._handler(inbound)

        if not reply:
            return
        try:
            await self.send(
                OutboundMessage(
                    channel=self.name,
                    conversation_id=inbound.conversation_id,
                    text=reply,
                    thread_id=inbound.thread_id,
                    reply_to=inbound.message_id,
                )
            )
        except DiscordDeliveryError as exc:
            _log.error("%s", exc)

    # ---- outbound ----------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> None:
        """Send reply text to a channel, thread or DM, split into parts of at most 2000 characters.

        The first part is a Discord reply to ``reply_to`` when it is set. Each part
        keeps one nonce across its retries, so Discord itself drops a duplicate if a
        failed attempt had in fact been stored.

        Raises:
            DiscordDeliveryError: A part still failed after the retries; later parts
                are not sent, so the conversation never shows a reply with a hole.
            RuntimeError: The adapter is not started.
        """
        client = self._client
        if client is None:
            raise RuntimeError("DiscordAdapter.send() before start()")
        target_id = int(message.thread_id or message.conversation_id)
        cached = client.get_channel(target_id)
        # An uncached channel (or a DM) still takes POST /channels/{id}/messages.
        channel = cached if isinstance(cached, discord.abc.Messageable) else client.get_partial_messageable(target_id)
        reference = (
            discord.MessageReference(message_id=int(message.reply_to), channel_id=target_id, fail_if_not_exists=False)
            if message.reply_to
            else None
        )
        parts = reply_parts(message.text)
        for index, part in enumerate(parts):
            try:
                await self._send_part(channel, part, reference if index == 0 else None)
            except Exception as exc:
                raise DiscordDeliveryError(str(target_id), index, len(parts), exc) from exc

    async def _send_part(
        self,
        channel: discord.abc.Messageable,
        content: str,
        reference: discord.MessageReference | None,
    ) -> None:
        nonce = secrets.randbits(63)
        for attempt in range(len(self._send_retry_delays) + 1):
            try:
                if reference is None:
                    await channel.send(content, nonce=nonce)
                else:
                    await channel.send(content, nonce=nonce, reference=reference)
                return
            except Exception as exc:
                if attempt == len(self._send_retry_delays) or not _is_transient(exc):
                    raise
                delay = self._send_retry_delays[attempt]
                _log.warning(
                    "Discord send to %s failed (%r); retry %d/%d in %.2fs",
                    getattr(channel, "id", "?"),
                    exc,
                    attempt + 1,
                    len(self._send_retry_delays),
                    delay,
                )
                await asyncio.sleep(delay)
