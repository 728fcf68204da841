"""The Teams adapter: botbuilder's real CloudAdapter against a local connector and token service."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from botbuilder.schema import Activity
from cryptography.hazmat.primitives.asymmetric import rsa

from channels.base import ConversationKind, InboundMessage, OutboundMessage
from channels.teams import (
    TEAMS_TEXT_LIMIT,
    TeamsAdapter,
    TeamsSendError,
    UnknownConversationError,
    activity_to_inbound,
)
from tests.peers.fake_teams import (
    APP_ID,
    APP_PASSWORD,
    BOT_ID,
    CHANNEL_ID,
    GROUP_CHAT_ID,
    HTML_DUPLICATE,
    OTHER_TENANT_ID,
    PERSONAL_CHAT_ID,
    TEAM_ID,
    TENANT_ID,
    USER_AAD_ID,
    USER_ID,
    USER_NAME,
    BotFrameworkIdentity,
    FakeConnector,
    auth_headers,
    file_attachment,
    make_teams_adapter,
    teams_activity,
)

# ---- harness ----------------------------------------------------------------------------


class RecordingHandler:
    """The gateway stand-in: records every InboundMessage, answers ``reply``."""

    def __init__(self, reply: str | None = "noted") -> None:
        self.reply = reply
        self.seen: list[InboundMessage] = []

    async def __call__(self, message: InboundMessage) -> str | None:
        self.seen.append(message)
        return self.reply


@dataclass
class Bot:
    """A started TeamsAdapter behind its real aiohttp route."""

    adapter: TeamsAdapter
    client: TestClient[web.Request, web.Application]
    handler: RecordingHandler
    sleeps: list[float] = field(default_factory=list)

    async def post(self, payload: object, *, token: str | None = None, raw: bytes | None = None) -> ClientResponse:
        """POST an activity (or raw bytes) and wait until its turn is over."""
        data = raw if raw is not None else json.dumps(payload).encode()
        response = await self.client.post("/api/messages", data=data, headers=auth_headers(token))
        await response.read()
        await self.adapter.drain()
        return response


MakeBot = Callable[..., Awaitable[Bot]]


@pytest.fixture
def connector() -> Iterator[FakeConnector]:
    """The Bot Framework connector the bot replies to."""
    with FakeConnector() as peer:
        yield peer


@pytest.fixture
def identity(monkeypatch: pytest.MonkeyPatch) -> Iterator[BotFrameworkIdentity]:
    """The token service (OpenID, JWKS, client credentials), trusted through REQUESTS_CA_BUNDLE."""
    with BotFrameworkIdentity() as peer:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", peer.ca_bundle)
        yield peer


@pytest.fixture
async def make_bot(connector: FakeConnector) -> AsyncIterator[MakeBot]:
    """Build started bots (allowed to reply to the local connector); stopped and closed at teardown."""
    async with AsyncExitStack() as stack:

        async def make(
            handler: RecordingHandler | None = None,
            *,
            app_id: str = "",
            app_password: str = "",
            **kwargs: Any,
        ) -> Bot:
            handler = handler or RecordingHandler()
            sleeps: list[float] = []

            async def record_sleep(seconds: float) -> None:
                sleeps.append(seconds)

            kwargs.setdefault("allowed_service_urls", [connector.service_url])
            adapter = TeamsAdapter(app_id, app_password, handler, sleep=record_sleep, **kwargs)
            app = web.Application()
            adapter.add_routes(app)
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            client = await stack.enter_async_context(TestClient(TestServer(app, host="127.0.0.1")))
            return Bot(adapter, client, handler, sleeps)

        yield make


@pytest.fixture
async def bot(make_bot: MakeBot) -> Bot:
    """A bot with auth off (Emulator mode) answering "noted"."""
    return await make_bot()


@pytest.fixture
async def secured_bot(make_bot: MakeBot, identity: BotFrameworkIdentity) -> Bot:
    """A bot with an app id and password: every request must carry a valid token."""
    return await make_bot(app_id=APP_ID, app_password=APP_PASSWORD, auth_overrides=identity.auth_overrides())


# ---- conversations ---------------------------------------------------------------------


async def test_personal_message_reaches_handler_and_reply_is_posted(bot: Bot, connector: FakeConnector) -> None:
    activity = teams_activity("personal", service_url=connector.service_url, text=" what's on today? ")

    response = await bot.post(activity)

    assert response.status == 200
    [message] = bot.handler.seen
    assert message.channel == "teams"
    assert message.kind is ConversationKind.DIRECT
    assert message.is_direct
    assert message.conversation_id == PERSONAL_CHAT_ID
    assert message.thread_id is None
    assert message.sender_id == USER_AAD_ID
    assert message.display_name == USER_NAME
    assert message.tenant_id == TENANT_ID
    assert message.text == "what's on today?"
    assert message.message_id == activity["id"]
    assert message.timestamp == datetime(2026, 11, 30, 9, 15, 42, 123000, tzinfo=UTC)
    assert message.timestamp.utcoffset() is not None
    assert not message.mentions_bot
    [reply] = connector.messages
    assert reply.text == "noted"
    assert reply.conversation_id == PERSONAL_CHAT_ID
    assert reply.reply_to_id == activity["id"]
    assert reply.activity["from"]["id"] == BOT_ID
    assert reply.authorization is None  # auth off: no token on outbound calls


async def test_typing_indicator_is_sent_before_the_reply(bot: Bot, connector: FakeConnector) -> None:
    await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert [p.type for p in connector.posted] == ["typing", "message"]


async def test_group_chat_mention_is_stripped_once(bot: Bot, connector: FakeConnector) -> None:
    activity = teams_activity(
        "groupChat",
        service_url=connector.service_url,
        text="<at>goclaw</at> ask goclaw about X",
        mention=True,
        attachments=[HTML_DUPLICATE, file_attachment("report.pdf")],
    )

    await bot.post(activity)

    [message] = bot.handler.seen
    assert message.text == "ask goclaw about X\n[attachment: report.pdf]"
    assert message.mentions_bot
    assert message.kind is ConversationKind.GROUP
    assert not message.is_direct
    assert message.conversation_id == GROUP_CHAT_ID
    assert message.attachments == ("https://contoso.sharepoint.test/report.pdf",)
    assert [m.conversation_id for m in connector.messages] == [GROUP_CHAT_ID]


async def test_mention_in_the_middle_leaves_one_space(bot: Bot, connector: FakeConnector) -> None:
    await bot.post(
        teams_activity("groupChat", service_url=connector.service_url, text="hey <at>goclaw</at>  do X", mention=True)
    )

    assert bot.handler.seen[0].text == "hey do X"


async def test_group_message_without_mention_still_reaches_handler(bot: Bot, connector: FakeConnector) -> None:
    # Whether to answer unmentioned group messages is the gateway's decision.
    await bot.post(teams_activity("groupChat", service_url=connector.service_url, text="lunch, goclaw?"))

    [message] = bot.handler.seen
    assert not message.mentions_bot
    assert message.text == "lunch, goclaw?"


async def test_mention_of_someone_else_is_not_a_bot_mention(bot: Bot, connector: FakeConnector) -> None:
    activity = teams_activity("groupChat", service_url=connector.service_url, text="<at>Grace</at> see this")
    activity["entities"].append({"type": "mention", "text": "<at>Grace</at>", "mentioned": {"id": "29:grace"}})

    await bot.post(activity)

    [message] = bot.handler.seen
    assert not message.mentions_bot
    assert message.text == "<at>Grace</at> see this"


async def test_channel_reply_chain_gives_thread_and_every_conversation_id(bot: Bot, connector: FakeConnector) -> None:
    activity = teams_activity(
        "channel", service_url=connector.service_url, mention=True, text="status?", reply_chain_id="1700000000123"
    )

    await bot.post(activity)

    [message] = bot.handler.seen
    threaded = f"{CHANNEL_ID};messageid=1700000000123"
    assert message.kind is ConversationKind.CHANNEL
    assert message.conversation_id == threaded
    assert message.thread_id == "1700000000123"
    assert message.conversation_ids == (threaded, CHANNEL_ID, TEAM_ID)
    assert message.text == "status?"
    [reply] = connector.messages
    assert reply.conversation_id == threaded  # the reply stays in the thread


async def test_handler_returning_none_sends_nothing(make_bot: MakeBot, connector: FakeConnector) -> None:
    bot = await make_bot(RecordingHandler(reply=None))

    await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert len(bot.handler.seen) == 1
    assert connector.messages == []


async def test_handler_failure_is_logged_not_a_500(
    make_bot: MakeBot, connector: FakeConnector, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(RecordingHandler):
        async def __call__(self, message: InboundMessage) -> str | None:
            raise RuntimeError("model offline")

    bot = await make_bot(Broken())

    response = await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert response.status == 200
    assert connector.messages == []
    assert any("handler failed" in r.getMessage() and PERSONAL_CHAT_ID in r.getMessage() for r in caplog.records)


# ---- what is acknowledged and dropped ---------------------------------------------------


async def test_other_tenant_is_acknowledged_and_ignored(
    make_bot: MakeBot, connector: FakeConnector, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await make_bot(allowed_tenants=[TENANT_ID])

    response = await bot.post(teams_activity("personal", service_url=connector.service_url, tenant_id=OTHER_TENANT_ID))

    assert response.status == 200
    assert bot.handler.seen == []
    assert connector.posted == []
    assert any(OTHER_TENANT_ID in r.getMessage() for r in caplog.records)


async def test_allowed_tenant_is_served(make_bot: MakeBot, connector: FakeConnector) -> None:
    bot = await make_bot(allowed_tenants=[TENANT_ID.upper()])

    await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert len(bot.handler.seen) == 1


async def test_tenant_is_read_from_the_conversation_when_channel_data_lacks_it(
    make_bot: MakeBot, connector: FakeConnector
) -> None:
    bot = await make_bot(allowed_tenants=[TENANT_ID])
    activity = teams_activity("personal", service_url=connector.service_url)
    activity["channelData"] = {}

    await bot.post(activity)

    assert bot.handler.seen[0].tenant_id == TENANT_ID


@pytest.mark.parametrize(
    "activity_type", ["conversationUpdate", "typing", "messageReaction", "installationUpdate", "invoke"]
)
async def test_non_message_activities_are_acknowledged_and_ignored(
    bot: Bot, connector: FakeConnector, activity_type: str
) -> None:
    response = await bot.post(
        teams_activity("personal", service_url=connector.service_url, activity_type=activity_type)
    )

    assert response.status == 200
    assert bot.handler.seen == []
    assert connector.posted == []


# ---- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"", b"[1, 2]", b'"message"'])
async def test_malformed_body_is_400(bot: Bot, raw: bytes) -> None:
    response = await bot.post(None, raw=raw)

    assert response.status == 400
    body = json.loads(await response.text())
    assert body["error"]
    assert "Traceback" not in body["error"]
    assert bot.handler.seen == []


@pytest.mark.parametrize(
    ("field", "named"),
    [("from", "from"), ("conversation", "conversation"), ("serviceUrl", "serviceUrl"), ("type", "type")],
)
async def test_activity_missing_a_required_field_is_400(
    bot: Bot, connector: FakeConnector, field: str, named: str
) -> None:
    activity = teams_activity("personal", service_url=connector.service_url)
    del activity[field]

    response = await bot.post(activity)

    assert response.status == 400
    assert named in (await response.json())["error"]
    assert bot.handler.seen == []


async def test_activity_with_a_mistyped_field_is_400(bot: Bot, connector: FakeConnector) -> None:
    activity = teams_activity("personal", service_url=connector.service_url, extra={"timestamp": "yesterday-ish"})

    response = await bot.post(activity)

    assert response.status == 400
    assert "schema" in (await response.json())["error"]
    assert bot.handler.seen == []


# ---- sending ------------------------------------------------------------------------------


async def test_long_reply_is_split_into_ordered_parts(make_bot: MakeBot, connector: FakeConnector) -> None:
    paragraphs = [f"part {i}: " + "word " * 3000 for i in range(12)]  # ~15 KB each, ~180 KB in all
    bot = await make_bot(RecordingHandler(reply="\n\n".join(paragraphs)))

    await bot.post(teams_activity("personal", service_url=connector.service_url))

    texts = [m.text or "" for m in connector.messages]
    assert len(texts) > 1
    assert all(len(t) <= TEAMS_TEXT_LIMIT for t in texts)
    joined = "\n\n".join(texts)
    assert [joined.index(f"part {i}:") for i in range(12)] == sorted(joined.index(f"part {i}:") for i in range(12))
    assert joined == "\n\n".join(p.strip() for p in paragraphs)


async def test_throttled_reply_is_retried_after_retry_after_and_delivered_once(
    bot: Bot, connector: FakeConnector
) -> None:
    connector.fail_next(1, status=429, retry_after="7")

    await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert [m.text for m in connector.messages] == ["noted"]
    assert bot.sleeps == [7.0]


async def test_server_errors_back_off_then_give_up_and_log(
    bot: Bot, connector: FakeConnector, caplog: pytest.LogCaptureFixture
) -> None:
    connector.fail_next(10, status=503)

    response = await bot.post(teams_activity("groupChat", service_url=connector.service_url))

    assert response.status == 200
    assert connector.messages == []
    assert bot.sleeps == [1.0, 2.0, 4.0]  # 3 retries, doubling, no Retry-After
    assert any(
        r.levelno == logging.ERROR and GROUP_CHAT_ID in r.getMessage() and "503" in r.getMessage()
        for r in caplog.records
    )


async def test_retry_after_beyond_a_minute_is_not_waited_for(bot: Bot, connector: FakeConnector) -> None:
    connector.fail_next(1, status=429, retry_after="3600")

    response = await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert response.status == 200
    assert connector.messages == []
    assert bot.sleeps == []


async def test_client_errors_are_not_retried(bot: Bot, connector: FakeConnector) -> None:
    connector.fail_next(1, status=403)

    await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert connector.messages == []
    assert bot.sleeps == []


async def test_proactive_send_reaches_a_remembered_conversation(bot: Bot, connector: FakeConnector) -> None:
    await bot.post(teams_activity("personal", service_url=connector.service_url))

    await bot.adapter.send(OutboundMessage(channel="teams", conversation_id=PERSONAL_CHAT_ID, text="reminder: standup"))

    proactive = connector.messages[-1]
    assert proactive.text == "reminder: standup"
    assert proactive.conversation_id == PERSONAL_CHAT_ID
    assert proactive.reply_to_id is None
    assert proactive.activity["recipient"]["id"] == USER_ID


async def test_proactive_send_into_a_channel_thread(bot: Bot, connector: FakeConnector) -> None:
    await bot.post(teams_activity("channel", service_url=connector.service_url, reply_chain_id="111"))

    await bot.adapter.send(OutboundMessage(channel="teams", conversation_id=CHANNEL_ID, thread_id="222", text="done"))
    await bot.adapter.send(OutboundMessage(channel="teams", conversation_id=CHANNEL_ID, text="new post"))

    assert [(m.conversation_id, m.text) for m in connector.messages[-2:]] == [
        (f"{CHANNEL_ID};messageid=222", "done"),
        (CHANNEL_ID, "new post"),
    ]


async def test_proactive_send_to_an_unknown_conversation_is_a_clear_error(bot: Bot) -> None:
    with pytest.raises(UnknownConversationError, match="19:never-seen"):
        await bot.adapter.send(OutboundMessage(channel="teams", conversation_id="19:never-seen", text="hi"))


async def test_proactive_send_that_keeps_failing_raises(bot: Bot, connector: FakeConnector) -> None:
    await bot.post(teams_activity("personal", service_url=connector.service_url))
    connector.fail_next(10, status=500)

    with pytest.raises(TeamsSendError, match=PERSONAL_CHAT_ID):
        await bot.adapter.send(OutboundMessage(channel="teams", conversation_id=PERSONAL_CHAT_ID, text="hi"))


# ---- authentication ------------------------------------------------------------------


async def test_valid_token_is_accepted_and_reply_carries_the_bots_token(
    secured_bot: Bot, connector: FakeConnector, identity: BotFrameworkIdentity
) -> None:
    token = identity.mint_token(service_url=connector.service_url)

    response = await secured_bot.post(teams_activity("personal", service_url=connector.service_url), token=token)

    assert response.status == 200
    assert len(secured_bot.handler.seen) == 1
    [reply] = connector.messages
    assert reply.text == "noted"
    assert (reply.authorization or "").startswith("Bearer bot-token-")
    assert identity.token_requests[0].form["client_id"] == APP_ID
    assert identity.token_requests[0].form["grant_type"] == "client_credentials"


async def test_bot_token_is_fetched_once_for_many_turns(
    secured_bot: Bot, connector: FakeConnector, identity: BotFrameworkIdentity
) -> None:
    for _ in range(3):
        token = identity.mint_token(service_url=connector.service_url)
        await secured_bot.post(teams_activity("personal", service_url=connector.service_url), token=token)

    assert len(connector.messages) == 3
    assert len(identity.token_requests) == 1


async def test_proactive_send_with_auth_on_uses_the_bots_token(
    secured_bot: Bot, connector: FakeConnector, identity: BotFrameworkIdentity
) -> None:
    token = identity.mint_token(service_url=connector.service_url)
    await secured_bot.post(teams_activity("personal", service_url=connector.service_url), token=token)

    await secured_bot.adapter.send(OutboundMessage(channel="teams", conversation_id=PERSONAL_CHAT_ID, text="ping"))

    assert connector.messages[-1].text == "ping"
    assert (connector.messages[-1].authorization or "").startswith("Bearer bot-token-")


_FORGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.mark.parametrize(
    "make_token",
    [
        pytest.param(lambda idp, url: None, id="missing-header"),
        pytest.param(lambda idp, url: "not-a-jwt", id="not-a-jwt"),
        pytest.param(lambda idp, url: idp.mint_token(service_url=url, expired=True), id="expired"),
        pytest.param(lambda idp, url: idp.mint_token(service_url=url, audience="some-other-bot"), id="wrong-audience"),
        pytest.param(lambda idp, url: idp.mint_token(service_url=url, issuer="https://evil.test"), id="wrong-issuer"),
        pytest.param(lambda idp, url: idp.mint_token(service_url=url, signing_key=_FORGER), id="forged-signature"),
        pytest.param(lambda idp, url: idp.mint_token(service_url="https://elsewhere.test/"), id="other-service-url"),
    ],
)
async def test_bad_credentials_are_401_and_never_reach_the_handler(
    secured_bot: Bot,
    connector: FakeConnector,
    identity: BotFrameworkIdentity,
    make_token: Callable[[BotFrameworkIdentity, str], str | None],
) -> None:
    token = make_token(identity, connector.service_url)

    response = await secured_bot.post(teams_activity("personal", service_url=connector.service_url), token=token)

    assert response.status == 401
    assert "error" in await response.json()
    assert secured_bot.handler.seen == []
    assert connector.posted == []


async def test_bad_token_on_a_non_message_activity_is_401(
    secured_bot: Bot, connector: FakeConnector, identity: BotFrameworkIdentity
) -> None:
    expired = identity.mint_token(service_url=connector.service_url, expired=True)

    response = await secured_bot.post(
        teams_activity("personal", service_url=connector.service_url, activity_type="conversationUpdate"), token=expired
    )

    assert response.status == 401


async def test_auth_off_accepts_unauthenticated_requests_and_warns_at_start(
    make_bot: MakeBot, connector: FakeConnector, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="channels.teams"):
        bot = await make_bot()

    response = await bot.post(teams_activity("personal", service_url=connector.service_url))

    assert response.status == 200
    assert len(bot.handler.seen) == 1
    assert any("NOT authenticated" in r.getMessage() for r in caplog.records)


async def test_auth_off_ignores_a_token_it_cannot_check(bot: Bot, connector: FakeConnector) -> None:
    # Emulator mode has no app id to check a token against; botbuilder would
    # otherwise fetch Microsoft's signing keys over the internet.
    response = await bot.post(teams_activity("personal", service_url=connector.service_url), token="whatever")

    assert response.status == 200
    assert len(bot.handler.seen) == 1


# ---- construction and lifecycle ----------------------------------------------------------


def test_half_configured_credentials_are_rejected() -> None:
    with pytest.raises(ValueError, match="both"):
        TeamsAdapter(APP_ID, "", RecordingHandler())


def test_unknown_auth_override_is_rejected() -> None:
    with pytest.raises(ValueError, match="TO_BOT_FROM_NOWHERE"):
        TeamsAdapter("", "", RecordingHandler(), auth_overrides={"TO_BOT_FROM_NOWHERE": "x"})


async def test_peer_helper_builds_a_secured_adapter(identity: BotFrameworkIdentity) -> None:
    adapter = make_teams_adapter(RecordingHandler(), identity)

    assert adapter.auth_enabled
    assert not make_teams_adapter(RecordingHandler()).auth_enabled


async def test_requests_before_start_are_503(connector: FakeConnector) -> None:
    adapter = TeamsAdapter("", "", RecordingHandler())
    app = web.Application()
    adapter.add_routes(app)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.post(
            "/api/messages", json=teams_activity("personal", service_url=connector.service_url)
        )
        assert response.status == 503


# ---- the conversion on its own -------------------------------------------------------------


def test_sender_falls_back_to_the_teams_user_id_without_aad_object_id() -> None:
    raw = teams_activity("personal", service_url="http://127.0.0.1:9/", sender_aad_id=None)

    assert activity_to_inbound(Activity().deserialize(raw)).sender_id == USER_ID


def test_missing_timestamp_falls_back_to_an_aware_now() -> None:
    raw = teams_activity("personal", service_url="http://127.0.0.1:9/")
    del raw["timestamp"]
    before = datetime.now(UTC)

    stamp = activity_to_inbound(Activity().deserialize(raw)).timestamp

    assert stamp.tzinfo is not None
    assert stamp >= before


def test_offset_timestamp_is_converted_to_utc() -> None:
    raw = teams_activity("personal", service_url="http://127.0.0.1:9/", timestamp="2026-11-30T10:00:00+01:00")

    assert activity_to_inbound(Activity().deserialize(raw)).timestamp == datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def test_attachment_without_a_name_is_noted_by_its_type() -> None:
    raw = teams_activity(
        "personal",
        service_url="http://127.0.0.1:9/",
        text="",
        attachments=[HTML_DUPLICATE, {"contentType": "image/png", "contentUrl": "https://x.test/i.png"}],
    )

    message = activity_to_inbound(Activity().deserialize(raw))

    assert message.text == "[attachment: image/png]"
    assert message.attachments == ("https://x.test/i.png",)
