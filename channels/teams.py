"""Microsoft Teams through the Bot Framework: botbuilder's CloudAdapter behind one aiohttp route.

The gateway mounts :meth:`TeamsAdapter.handle_request` at ``POST /api/messages``.
Each request is authenticated, validated and acknowledged at once; a message
activity then runs as a botbuilder turn in the background (the Bot Framework
expects an answer within 15 seconds, an LLM reply can take longer), the reply
going back through the turn context.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import email.utils
import functools
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import jwt
import requests
from aiohttp import web
from botbuilder.core import TurnContext
from botbuilder.integration.aiohttp import (
    CloudAdapter,
    ConfigurationBotFrameworkAuthentication,
    ConfigurationServiceClientCredentialFactory,
)
from botbuilder.schema import Activity, ActivityTypes, ConversationReference
from botframework.connector.auth import AuthenticateRequestResult, ServiceClientCredentialsFactory
from msrest.authentication import Authentication
from msrest.exceptions import HttpOperationError

from channels.base import ConversationKind, InboundMessage, MessageHandler, OutboundMessage, split_text
from channels.teams_urls import DEFAULT_ALLOWED_SERVICE_URLS, service_url_allowed

log = logging.getLogger(__name__)

TEAMS_TEXT_LIMIT = 28_000
"""Characters per message: Teams refuses messages above about 28 KB."""

MESSAGES_PATH = "/api/messages"

_KINDS = {
    "personal": ConversationKind.DIRECT,
    "groupchat": ConversationKind.GROUP,
    "channel": ConversationKind.CHANNEL,
}
_THREAD_MARKER = ";messageid="
_HTML_DUPLICATE = "text/html"  # Teams mirrors every formatted message as an HTML attachment
_MAX_RETRY_AFTER = 60.0  # a connector asking for longer is treated as down, not as busy
_MAX_REMEMBERED_CONVERSATIONS = 10_000

# The keys of botbuilder's configuration object that select a private cloud
# (token issuer, OpenID metadata, login endpoint). Production leaves them unset;
# tests point them at local peers.
AUTH_OVERRIDE_KEYS = frozenset(
    {
        "CHANNEL_SERVICE",
        "VALIDATE_AUTHORITY",
        "TO_CHANNEL_FROM_BOT_LOGIN_URL",
        "TO_CHANNEL_FROM_BOT_OAUTH_SCOPE",
        "TO_BOT_FROM_CHANNEL_TOKEN_ISSUER",
        "TO_BOT_FROM_CHANNEL_OPENID_METADATA_URL",
        "TO_BOT_FROM_EMULATOR_OPENID_METADATA_URL",
        "OAUTH_URL",
        "CALLER_ID",
    }
)


class UnknownConversationError(LookupError):
    """A proactive send to a conversation the adapter has not seen since it started."""


class ConversationReferences(Protocol):
    """Where the adapter keeps conversation references, so proactive sends survive a restart.

    The gateway implements it on its database; references are the Bot Framework
    JSON form (``ConversationReference.serialize()``).
    """

    async def load(self, conversation_id: str) -> dict[str, Any] | None:
        """The stored reference of a conversation, or None."""

    async def save(self, conversation_id: str, reference: dict[str, Any]) -> None:
        """Store (or refresh) a conversation's reference."""


class TeamsSendError(RuntimeError):
    """The connector refused a message, after the retries for transient errors."""


class _CachingCredentialFactory(ServiceClientCredentialsFactory):
    """botbuilder's credential factory, keeping one credential object per audience.

    botbuilder builds fresh credentials (and so a fresh MSAL token cache) for every
    turn, so each message would fetch a new token, with a blocking call on the
    event loop; kept, MSAL reuses its token until it nears expiry.
    """

    def __init__(self, inner: ServiceClientCredentialsFactory) -> None:
        self._inner = inner
        self._cache: dict[tuple[str, str, str, bool], Authentication] = {}

    async def is_valid_app_id(self, app_id: str) -> bool:
        return await self._inner.is_valid_app_id(app_id)

    async def is_authentication_disabled(self) -> bool:
        return await self._inner.is_authentication_disabled()

    async def create_credentials(
        self, app_id: str, oauth_scope: str, login_endpoint: str, validate_authority: bool
    ) -> Authentication:
        key = (app_id, oauth_scope, login_endpoint, validate_authority)
        if key not in self._cache:
            self._cache[key] = await self._inner.create_credentials(
                app_id, oauth_scope, login_endpoint, validate_authority
            )
        return self._cache[key]


class _BotConfig:
    """The attribute bag botbuilder's ``Configuration*`` classes read with ``getattr``."""

    def __init__(self, values: Mapping[str, object]) -> None:
        for key, value in values.items():
            setattr(self, key, value)


# ---- the platform event, converted once ------------------------------------------------


def activity_to_inbound(activity: Activity) -> InboundMessage:
    """Turn a Bot Framework message activity from Teams into an :class:`InboundMessage`.

    Args:
        activity: A deserialized activity with ``from``, ``conversation`` and
            ``recipient`` (the bot) set.

    Returns:
        The message with the bot's mention stripped once, the sender's AAD object
        id when Teams sent one, and the tenant from ``channelData``. In a channel
        reply chain ``conversation_id`` is the chain's (``<channel>;messageid=<root>``),
        ``thread_id`` the root message id, and ``conversation_ids`` also holds the
        channel and team ids. Shared files are noted in ``text`` as
        ``[attachment: name]``; ``attachments`` holds their URLs.
    """
    sender = activity.from_property
    conversation = activity.conversation
    conversation_id = conversation.id if conversation else ""
    kind = _conversation_kind(activity)
    base_id, _, thread_id = conversation_id.partition(_THREAD_MARKER)
    channel_data = _as_dict(activity.channel_data)
    ids = [
        conversation_id,
        base_id,
        _as_dict(channel_data.get("channel")).get("id"),
        _as_dict(channel_data.get("team")).get("id"),
    ]
    bot_mentions = _bot_mention_texts(activity)
    text = activity.text or ""
    for mention in bot_mentions:
        text = _remove_once(text, mention)
    files = [a for a in activity.attachments or () if a.content_type != _HTML_DUPLICATE]
    # Like every adapter: the files are noted in the text, their URLs kept aside.
    lines = [text.strip()] if text.strip() else []
    lines.extend(f"[attachment: {a.name or a.content_type or 'file'}]" for a in files)
    return InboundMessage(
        channel="teams",
        conversation_id=conversation_id,
        thread_id=thread_id or None,
        sender_id=(sender.aad_object_id or sender.id or "") if sender else "",
        display_name=(sender.name or "") if sender else "",
        text="\n".join(lines),
        timestamp=_utc(activity.timestamp),
        message_id=activity.id or "",
        is_direct=kind is ConversationKind.DIRECT,
        mentions_bot=bool(bot_mentions),
        kind=kind,
        conversation_ids=tuple(dict.fromkeys(i for i in ids if isinstance(i, str) and i)),
        tenant_id=tenant_of(activity),
        attachments=tuple(a.content_url for a in files if a.content_url),
    )


def reply_to_activities(text: str) -> list[Activity]:
    """Turn reply text into the message activities Teams accepts, in order (28 KB each)."""
    return [Activity(type=ActivityTypes.message, text=part) for part in split_text(text, TEAMS_TEXT_LIMIT)]


def tenant_of(activity: Activity) -> str | None:
    """The Azure AD tenant an activity comes from, or None.

    Teams puts it in ``channelData.tenant.id``; botbuilder leaves
    ``conversation.tenant_id`` empty for Teams payloads and keeps the
    conversation's copy in ``additional_properties["tenantId"]``.
    """
    tenant = _as_dict(_as_dict(activity.channel_data).get("tenant")).get("id")
    conversation = activity.conversation
    if not tenant and conversation is not None:
        tenant = conversation.tenant_id or (conversation.additional_properties or {}).get("tenantId")
    return tenant if isinstance(tenant, str) and tenant else None


def _conversation_kind(activity: Activity) -> ConversationKind:
    conversation = activity.conversation
    if conversation is None:
        return ConversationKind.DIRECT
    kind = _KINDS.get((conversation.conversation_type or "").lower())
    if kind is not None:
        return kind
    # The Emulator and older payloads leave conversationType out.
    return ConversationKind.GROUP if conversation.is_group else ConversationKind.DIRECT


def _bot_mention_texts(activity: Activity) -> list[str]:
    """The ``text`` of every mention entity that names the recipient (the bot)."""
    bot_id = activity.recipient.id if activity.recipient else None
    if not bot_id:
        return []
    texts: list[str] = []
    for entity in activity.entities or ():
        if (entity.type or "").lower() != "mention":
            continue
        props = entity.additional_properties or {}
        if _as_dict(props.get("mentioned")).get("id") == bot_id:
            text = props.get("text")
            texts.append(text if isinstance(text, str) else "")
    return texts


def _remove_once(text: str, mention: str) -> str:
    # Only the entity's own text, once: botbuilder's remove_recipient_mention drops
    # every occurrence of the bot's name, so "ask goclaw about X" would lose a word.
    if not mention or mention not in text:
        return text
    before, _, after = text.partition(mention)
    before, after = before.rstrip(), after.lstrip()
    return f"{before} {after}" if before and after else before + after


def _utc(timestamp: datetime | None) -> datetime:
    if timestamp is None:
        return datetime.now(UTC)
    if timestamp.tzinfo is None:  # the Bot Framework speaks UTC even when it omits the offset
        return timestamp.replace(tzinfo=UTC)
    return timestamp.astimezone(UTC)


def _as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _missing_fields(body: Mapping[str, Any]) -> list[str]:
    """Which of the fields this adapter needs are absent (empty list when none)."""
    kind = body.get("type")
    if not isinstance(kind, str) or not kind:
        return ["type"]
    if kind != ActivityTypes.message:
        return []
    missing = []
    for name in ("from", "conversation"):
        value = body.get(name)
        if not isinstance(value, dict):
            missing.append(name)
        elif not isinstance(value.get("id"), str) or not value["id"]:
            missing.append(f"{name}.id")
    if not isinstance(body.get("serviceUrl"), str) or not body["serviceUrl"]:
        missing.append("serviceUrl")
    return missing


def _retry_after(response: Any) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), if any."""
    value = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = (_utc(when) - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


# ---- the adapter ------------------------------------------------------------------------


class TeamsAdapter:
    """The Teams channel: inbound activities to the handler, replies and proactive messages out.

    With ``app_id`` and ``app_password`` set every request must carry a valid Bot
    Framework token; with both empty (local development with the Emulator)
    requests are accepted unauthenticated.

    Message activities are handled after the HTTP request is answered; call
    :meth:`drain` to wait for them (tests) and :meth:`stop` to finish them.
    """

    name = "teams"

    def __init__(
        self,
        app_id: str,
        app_password: str,
        handler: MessageHandler,
        *,
        app_tenant_id: str = "",
        allowed_tenants: Collection[str] = (),
        allowed_service_urls: Collection[str] = DEFAULT_ALLOWED_SERVICE_URLS,
        auth_overrides: Mapping[str, str] | None = None,
        max_send_retries: int = 3,
        retry_base_delay: float = 1.0,
        typing_interval: float = 3.0,
        stop_timeout: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        references: ConversationReferences | None = None,
    ) -> None:
        """Keep the settings; nothing is contacted until :meth:`start`.

        Args:
            app_id: The bot's Microsoft App ID ("" with the Emulator, no auth).
            app_password: The App ID's client secret ("" with the Emulator).
            handler: The gateway's entry point for each message.
            app_tenant_id: The tenant of a single-tenant bot registration.
            allowed_tenants: When not empty, activities from other tenants are
                acknowledged and dropped.
            allowed_service_urls: The only service URLs replies and proactive
                sends may go to (URL prefixes, ``*.`` for subdomains); an
                activity naming another is refused with 403 before any HTTP.
            auth_overrides: Extra keys for botbuilder's configuration object
                (``TO_BOT_FROM_CHANNEL_OPENID_METADATA_URL`` ...); tests point
                them at local peers, production leaves them out.
            max_send_retries: Retries of a send answered 429 or 5xx.
            retry_base_delay: First backoff in seconds (doubled per retry) when
                the connector gives no ``Retry-After``.
            typing_interval: Seconds between typing indicators while the handler runs.
            stop_timeout: Seconds :meth:`stop` waits for turns in progress.
            sleep: Awaited between retries; tests pass a recorder.
            references: Where conversation references are kept across restarts
                (None: in memory only, since start).

        Raises:
            ValueError: Only one of ``app_id`` / ``app_password`` is set, or an
                override key botbuilder does not know.
        """
        if bool(app_id) != bool(app_password):
            raise ValueError("teams: set both app_id and app_password, or neither (local Emulator, no auth)")
        unknown = set(auth_overrides or {}) - AUTH_OVERRIDE_KEYS
        if unknown:
            raise ValueError(f"teams: unknown auth override keys: {', '.join(sorted(unknown))}")
        if app_tenant_id and not app_id:
            raise ValueError("teams: app_tenant_id needs app_id and app_password")
        self._app_id = app_id
        self._app_password = app_password
        self._app_tenant_id = app_tenant_id
        self._handler = handler
        self._allowed_tenants = frozenset(t.lower() for t in allowed_tenants)
        self._allowed_service_urls = tuple(allowed_service_urls)
        self._auth_overrides = dict(auth_overrides or {})
        self._max_send_retries = max_send_retries
        self._retry_base_delay = retry_base_delay
        self._typing_interval = typing_interval
        self._stop_timeout = stop_timeout
        self._sleep = sleep
        self._cloud: CloudAdapter | None = None
        self._references: OrderedDict[str, ConversationReference] = OrderedDict()
        self._reference_store = references
        self._turns: set[asyncio.Task[None]] = set()

    @property
    def auth_enabled(self) -> bool:
        """Whether requests must carry a Bot Framework token."""
        return bool(self._app_id)

    async def start(self) -> None:
        """Build the botbuilder CloudAdapter and begin accepting activities."""
        if self._cloud is not None:
            return
        config: dict[str, object] = {
            "APP_ID": self._app_id,
            "APP_PASSWORD": self._app_password,
            "APP_TYPE": "SingleTenant" if self._app_tenant_id else "MultiTenant",
            "APP_TENANTID": self._app_tenant_id,
            **self._auth_overrides,
        }
        bot_config = _BotConfig(config)
        credentials = _CachingCredentialFactory(ConfigurationServiceClientCredentialFactory(bot_config))
        self._cloud = CloudAdapter(ConfigurationBotFrameworkAuthentication(bot_config, credentials_factory=credentials))
        if not self.auth_enabled:
            log.warning("teams: app_id and app_password are empty: requests are NOT authenticated (Emulator mode)")

    async def stop(self) -> None:
        """Refuse new activities, finish turns in progress (up to ``stop_timeout``)."""
        self._cloud = None
        if not self._turns:
            return
        _, pending = await asyncio.wait(set(self._turns), timeout=self._stop_timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.error("teams: cancelled %d turns still running after %.0fs", len(pending), self._stop_timeout)
            await asyncio.wait(pending)

    async def drain(self) -> None:
        """Wait until every accepted message activity has been handled."""
        while self._turns:
            await asyncio.wait(set(self._turns))

    def add_routes(self, app: web.Application, path: str = MESSAGES_PATH) -> None:
        """Mount :meth:`handle_request` at ``POST /api/messages`` on the gateway's app."""
        app.router.add_post(path, self.handle_request)

    async def handle_request(self, request: web.Request) -> web.Response:
        """Authenticate, validate and acknowledge one activity from the Bot Framework.

        Answers 401 for a missing or invalid token, 400 for a body that is not an
        activity, 200 otherwise (ignored types and other tenants included); never
        a traceback.
        """
        cloud = self._cloud
        if cloud is None:
            return _error(503, "teams adapter is not running")
        auth_header: str | None = request.headers.get("Authorization", "")
        if self.auth_enabled and not auth_header:
            return _error(401, "missing Authorization header", **{"WWW-Authenticate": "Bearer"})
        if not self.auth_enabled:
            # botbuilder treats a None header as "auth disabled"; a token sent anyway
            # would make it fetch Microsoft's keys, which means nothing without an app id.
            auth_header = None

        try:
            body = json.loads(await request.read())
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return _error(400, "body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "activity must be a JSON object")
        missing = _missing_fields(body)
        if missing:
            return _error(400, f"activity is missing required fields: {', '.join(missing)}")
        try:
            activity = Activity().deserialize(body)
        except (ValueError, TypeError, AttributeError):
            return _error(400, "activity does not match the Bot Framework schema")
        if activity.service_url and not service_url_allowed(activity.service_url, self._allowed_service_urls):
            # Checked before anything can contact it: the reply would go there.
            log.warning(
                "teams: refused %s activity naming serviceUrl %r (not in channels.teams.allowed_service_urls)",
                activity.type,
                activity.service_url[:200],
            )
            return _error(
                403, "serviceUrl is not an allowed Bot Framework service (channels.teams.allowed_service_urls)"
            )

        try:
            auth = await cloud.bot_framework_authentication.authenticate_request(activity, auth_header)
        except (PermissionError, jwt.PyJWTError) as exc:
            log.info("teams: unauthorized request: %s", exc)
            return _error(401, "unauthorized", **{"WWW-Authenticate": "Bearer"})
        except requests.RequestException as exc:
            # The signing keys could not be fetched: our problem; the channel retries a 503.
            log.error("teams: cannot verify the token: %s", exc)
            return _error(503, "cannot verify the token now")
        except Exception as exc:
            # botbuilder reports a token signed by an unknown key, a missing claim or
            # a failed endorsement check with IndexError, KeyError or bare Exception.
            log.warning("teams: unauthorized request: %r", exc)
            return _error(401, "unauthorized", **{"WWW-Authenticate": "Bearer"})

        tenant = tenant_of(activity)
        if self._allowed_tenants and (tenant or "").lower() not in self._allowed_tenants:
            log.warning(
                "teams: ignored %s activity from tenant %s (not allowed) in conversation %s",
                activity.type,
                tenant,
                activity.conversation.id if activity.conversation else None,
            )
            return web.Response(status=200)
        await self._persist(self._remember(activity))
        if activity.type != ActivityTypes.message:
            log.debug("teams: acknowledged %s activity", activity.type)
            return web.Response(status=200)

        task = asyncio.create_task(self._run_turn(cloud, auth, activity))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)
        return web.Response(status=200)

    async def send(self, message: OutboundMessage) -> None:
        """Send a proactive message to a conversation the adapter has seen.

        ``conversation_id`` is the Teams conversation id; with ``thread_id`` set
        and a channel id, the message goes into that reply chain.

        Raises:
            UnknownConversationError: No activity from that conversation since start.
            TeamsSendError: The connector refused a part after the retries.
            RuntimeError: The adapter is not running.
        """
        if message.channel != self.name:
            raise ValueError(f"teams: cannot send a {message.channel!r} message")
        cloud = self._cloud
        if cloud is None:
            raise RuntimeError("teams adapter is not running")
        await self._load_references(message.conversation_id, message.thread_id)
        reference = self._reference_for(message.conversation_id, message.thread_id)
        if not service_url_allowed(reference.service_url or "", self._allowed_service_urls):
            log.warning("teams: refused a send to serviceUrl %r (not allowed)", (reference.service_url or "")[:200])
            raise TeamsSendError(f"teams: serviceUrl of conversation {message.conversation_id!r} is not allowed")
        activities = reply_to_activities(message.text)
        if not activities:
            return
        conversation_id = reference.conversation.id

        async def deliver(turn: TurnContext) -> None:
            for activity in activities:
                TurnContext.apply_conversation_reference(activity, reference)
                activity.reply_to_id = message.reply_to
                # adapter.send_activities, not turn.send_activity: the latter would
                # address the reply to the synthetic continuation event.
                sent = await self._send_with_retry(
                    functools.partial(turn.adapter.send_activities, turn, [activity]), conversation_id
                )
                if not sent:
                    raise TeamsSendError(f"teams: could not deliver to conversation {conversation_id}")

        await cloud.continue_conversation(reference, deliver, bot_app_id=self._app_id)

    # ---- turns ----------------------------------------------------------------------

    async def _run_turn(self, cloud: CloudAdapter, auth: AuthenticateRequestResult, activity: Activity) -> None:
        try:
            await cloud.process_activity(auth, activity, self._on_message)
        except Exception:
            log.exception("teams: turn failed in conversation %s", activity.conversation.id)

    async def _on_message(self, turn: TurnContext) -> None:
        activity = turn.activity
        conversation_id = activity.conversation.id
        inbound = activity_to_inbound(activity)
        stop_typing = asyncio.Event()
        typing = asyncio.create_task(self._keep_typing(turn, stop_typing))
        try:
            reply = await self._handler(inbound)
        except Exception:
            log.exception("teams: handler failed on message %s in conversation %s", inbound.message_id, conversation_id)
            reply = None
        finally:
            # Let an indicator in flight land first, so it never follows the reply.
            stop_typing.set()
            await typing
        for part in reply_to_activities(reply or ""):
            if not await self._send_with_retry(functools.partial(turn.send_activity, part), conversation_id):
                return  # later parts would read out of context without this one

    async def _keep_typing(self, turn: TurnContext, stop: asyncio.Event) -> None:
        # At least one indicator, however quick the handler; then one per interval.
        while True:
            try:
                await turn.send_activity(Activity(type=ActivityTypes.typing))
            except Exception as exc:  # an indicator is not worth a retry
                log.debug("teams: typing indicator failed: %r", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._typing_interval)
            if stop.is_set():
                return

    async def _send_with_retry(self, send: Callable[[], Awaitable[object]], conversation_id: str) -> bool:
        """Send, retrying 429 and 5xx with backoff; False (logged) when it never went through."""
        for attempt in range(self._max_send_retries + 1):
            try:
                await send()
                return True
            except HttpOperationError as exc:
                status = getattr(exc.response, "status_code", None)
                transient = status == 429 or (status is not None and status >= 500)
                if not transient or attempt == self._max_send_retries:
                    log.error(
                        "teams: send to conversation %s failed (HTTP %s) after %d attempts",
                        conversation_id,
                        status,
                        attempt + 1,
                    )
                    return False
                delay = _retry_after(exc.response)
                if delay is None:
                    delay = self._retry_base_delay * 2**attempt
                if delay > _MAX_RETRY_AFTER:
                    log.error(
                        "teams: connector asked to wait %.0fs for conversation %s; giving up", delay, conversation_id
                    )
                    return False
                log.warning(
                    "teams: send to conversation %s got HTTP %s, retry %d in %.1fs",
                    conversation_id,
                    status,
                    attempt + 1,
                    delay,
                )
                await self._sleep(delay)
            except Exception:
                log.exception("teams: send to conversation %s failed", conversation_id)
                return False
        return False  # pragma: no cover - the loop always returns

    # ---- conversation references for proactive sends ------------------------------

    def _remember(self, activity: Activity) -> list[str]:
        """Remember the activity's conversation; the keys stored (for :meth:`_persist`)."""
        conversation = activity.conversation
        if conversation is None or not conversation.id or not activity.service_url:
            return []
        reference = TurnContext.get_conversation_reference(activity)
        reference.activity_id = None  # a proactive message starts fresh, it replies to nothing
        self._store(conversation.id, reference)
        base_id, marker, _ = conversation.id.partition(_THREAD_MARKER)
        if marker:
            # Also remember the channel itself, for new posts and other reply chains.
            channel = copy.deepcopy(reference)
            channel.conversation.id = base_id
            self._store(base_id, channel)
            return [conversation.id, base_id]
        return [conversation.id]

    async def _persist(self, keys: list[str]) -> None:
        if self._reference_store is None:
            return
        for key in keys:
            try:
                await self._reference_store.save(key, self._references[key].serialize())
            except Exception:
                # Losing a reference costs only proactive sends to it until it speaks again.
                log.exception("teams: could not store the conversation reference of %s", key)

    async def _load_references(self, conversation_id: str, thread_id: str | None) -> None:
        """Bring stored references of a conversation (and its reply chain) into memory, if not there."""
        if self._reference_store is None:
            return
        keys = [conversation_id]
        if thread_id and _THREAD_MARKER not in conversation_id:
            keys.insert(0, f"{conversation_id}{_THREAD_MARKER}{thread_id}")
        for key in keys:
            if key in self._references:
                continue
            stored = await self._reference_store.load(key)
            if stored is not None:
                self._store(key, ConversationReference().deserialize(stored))

    def _store(self, key: str, reference: ConversationReference) -> None:
        self._references[key] = reference
        self._references.move_to_end(key)
        while len(self._references) > _MAX_REMEMBERED_CONVERSATIONS:
            self._references.popitem(last=False)

    def _reference_for(self, conversation_id: str, thread_id: str | None) -> ConversationReference:
        if thread_id and _THREAD_MARKER not in conversation_id:
            threaded = f"{conversation_id}{_THREAD_MARKER}{thread_id}"
            if threaded in self._references:
                return self._references[threaded]
            if conversation_id in self._references:
                reference = copy.deepcopy(self._references[conversation_id])
                reference.conversation.id = threaded
                return reference
        elif conversation_id in self._references:
            return self._references[conversation_id]
        raise UnknownConversationError(
            f"teams: no activity seen from conversation {conversation_id!r} since start; "
            "the bot can only message conversations that have talked to it"
        )
