"""DiscordAdapter with real discord.py logged in to a fake Discord on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC

import pytest

from channels.base import ConversationKind, InboundMessage, OutboundMessage
from channels.discord import DISCORD_MESSAGE_LIMIT, DiscordAdapter, DiscordStartError
from tests.peers.fake_discord import FakeDiscord, running_fake_discord


class Recorder:
    """A handler that keeps every InboundMessage and answers with ``reply(message)``."""

    def __init__(self, reply: Callable[[InboundMessage], str | None] = lambda m: f"echo: {m.text}") -> None:
        self.messages: list[InboundMessage] = []
        self._reply = reply

    async def __call__(self, message: InboundMessage) -> str | None:
        self.messages.append(message)
        return self._reply(message)


@pytest.fixture
async def discord_peer() -> AsyncIterator[FakeDiscord]:
    async with running_fake_discord() as peer:
        yield peer


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


StartAdapter = Callable[..., Awaitable[DiscordAdapter]]


@pytest.fixture
async def start_adapter(discord_peer: FakeDiscord) -> AsyncIterator[StartAdapter]:
    """Start adapters against the fake; every one is stopped after the test."""
    started: list[DiscordAdapter] = []

    async def start(handler: Callable[[InboundMessage], Awaitable[str | None]], **options: object) -> DiscordAdapter:
        adapter = discord_peer.make_adapter(handler, **options)
        await adapter.start()
        started.append(adapter)
        return adapter

    yield start
    for adapter in started:
        await adapter.stop()


@pytest.fixture
async def adapter(start_adapter: StartAdapter, recorder: Recorder) -> DiscordAdapter:
    return await start_adapter(recorder)


async def wait_for_messages(recorder: Recorder, count: int, timeout: float = 2.0) -> list[InboundMessage]:
    async with asyncio.timeout(timeout):
        while len(recorder.messages) < count:
            await asyncio.sleep(0.005)
    return recorder.messages


# ---- conversion ------------------------------------------------------------------------------


async def test_direct_message_becomes_direct_inbound_message(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    message_id = await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "hello there")

    [sent] = await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)
    [inbound] = recorder.messages
    assert inbound.channel == "discord"
    assert inbound.is_direct and inbound.kind is ConversationKind.DIRECT
    assert inbound.conversation_id == str(discord_peer.dm_channel_id)
    assert inbound.thread_id is None
    assert inbound.sender_id == str(discord_peer.alice.id)
    assert inbound.display_name == "Alice"
    assert inbound.text == "hello there"
    assert inbound.message_id == str(message_id)
    assert inbound.timestamp.tzinfo is not None and inbound.timestamp.utcoffset() == UTC.utcoffset(None)
    assert not inbound.mentions_bot
    assert sent.content == "echo: hello there"
    assert sent.message_reference is not None and str(sent.message_reference["message_id"]) == str(message_id)


async def test_guild_message_strips_bot_mention_and_renders_other_mentions(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    peer = discord_peer
    content = f"<@{peer.bot.id}> ask <@!{peer.bob.id}> and <@&{peer.role_id}> about <#{peer.text_channel_id}>"
    await peer.dispatch_message(
        peer.text_channel_id, peer.alice, content, mentions=[peer.bot, peer.bob], mention_roles=[peer.role_id]
    )

    await peer.wait_for_posts(peer.text_channel_id, 1)
    [inbound] = recorder.messages
    assert inbound.text == "ask @Bob and @Helpers about #general"
    assert inbound.mentions_bot
    assert inbound.display_name == "Ali"  # the member's guild nickname
    assert inbound.kind is ConversationKind.CHANNEL and not inbound.is_direct
    assert inbound.conversation_id == str(peer.text_channel_id)
    assert inbound.conversation_ids == (str(peer.text_channel_id), str(peer.guild_id))


async def test_thread_message_carries_thread_and_parent_ids(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    peer = discord_peer
    await peer.dispatch_message(peer.thread_id, peer.alice, f"<@!{peer.bot.id}> status?", mentions=[peer.bot])

    [sent] = await peer.wait_for_posts(peer.thread_id, 1)
    [inbound] = recorder.messages
    assert inbound.text == "status?"
    assert inbound.mentions_bot
    assert inbound.conversation_id == inbound.thread_id == str(peer.thread_id)
    assert inbound.conversation_ids == (str(peer.thread_id), str(peer.text_channel_id), str(peer.guild_id))
    assert inbound.kind is ConversationKind.CHANNEL
    assert sent.content == "echo: status?"
    assert peer.posts_to(peer.text_channel_id) == []  # the reply stays in the thread


async def test_own_and_other_bots_messages_are_ignored(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    peer = discord_peer
    await peer.dispatch_message(peer.text_channel_id, peer.bot, "I said this")
    await peer.dispatch_message(peer.text_channel_id, peer.other_bot, f"<@{peer.bot.id}> hi", mentions=[peer.bot])
    # Events are handled in order, so once this one is answered the two above were seen.
    await peer.dispatch_message(peer.text_channel_id, peer.alice, "first")
    await peer.wait_for_posts(peer.text_channel_id, 1)
    # The fake echoes the bot's reply back as MESSAGE_CREATE, as Discord does.
    await peer.dispatch_message(peer.text_channel_id, peer.alice, "second")
    await peer.wait_for_posts(peer.text_channel_id, 2)

    assert [m.text for m in recorder.messages] == ["first", "second"]


async def test_attachment_only_message_lists_the_attachment(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "", attachments=["q3.pdf"])

    await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)
    [inbound] = recorder.messages
    assert inbound.text == "[attachment: q3.pdf]"
    assert len(inbound.attachments) == 1 and inbound.attachments[0].endswith("/q3.pdf")


async def test_text_and_attachments_are_kept_together(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    await discord_peer.dispatch_message(
        discord_peer.dm_channel_id, discord_peer.alice, "see these", attachments=["a.png", "b.csv"]
    )

    await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)
    assert recorder.messages[0].text == "see these\n[attachment: a.png]\n[attachment: b.csv]"


async def test_empty_message_and_bare_mention_are_ignored(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    peer = discord_peer
    await peer.dispatch_message(peer.text_channel_id, peer.alice, "")
    await peer.dispatch_message(peer.text_channel_id, peer.alice, f"<@{peer.bot.id}>", mentions=[peer.bot])
    await peer.dispatch_message(peer.text_channel_id, peer.alice, "real question")

    await peer.wait_for_posts(peer.text_channel_id, 1)
    assert [m.text for m in recorder.messages] == ["real question"]


async def test_message_in_unknown_channel_is_handled(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    peer = discord_peer
    unknown_channel, unknown_guild = peer.text_channel_id + 1000, peer.guild_id + 1000
    await peer.dispatch_message(unknown_channel, peer.alice, "anyone here?", guild_id=unknown_guild)

    [sent] = await peer.wait_for_posts(unknown_channel, 1)
    [inbound] = recorder.messages
    assert inbound.kind is ConversationKind.CHANNEL
    assert inbound.conversation_ids == (str(unknown_channel), str(unknown_guild))
    assert inbound.display_name == "Ali"  # the member data travels with the message
    assert sent.content == "echo: anyone here?"


# ---- replies -----------------------------------------------------------------------------------


def _sentences(length: int) -> str:
    sentence = "The quarterly report comes from the warehouse ledger and is checked by finance. "
    return (sentence * (length // len(sentence) + 1))[:length].rsplit(" ", 1)[0] + "."


async def test_long_reply_is_split_at_word_boundaries_and_sent_in_order(
    discord_peer: FakeDiscord, start_adapter: StartAdapter
) -> None:
    reply = _sentences(4500)
    await start_adapter(Recorder(lambda m: reply))
    message_id = await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "report?")

    await discord_peer.wait_until(lambda: sum(len(s.content) for s in discord_peer.sent) >= len(reply) - 10)
    parts = [s.content for s in discord_peer.posts_to(discord_peer.dm_channel_id)]
    assert len(parts) == 3
    assert all(0 < len(part) <= DISCORD_MESSAGE_LIMIT for part in parts)
    assert " ".join(parts).split() == reply.split()  # in order, nothing lost, no word cut
    assert all(part.endswith(".") for part in parts)  # split between sentences
    references = [s.message_reference for s in discord_peer.sent]
    assert references[0] is not None and str(references[0]["message_id"]) == str(message_id)
    assert references[1:] == [None, None]


async def test_rate_limited_send_is_delivered_exactly_once(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    discord_peer.fail_next_posts(discord_peer.dm_channel_id, 1, status=429)
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "hi")

    await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "again")
    sent = await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 2)
    assert [s.content for s in sent] == ["echo: hi", "echo: again"]
    assert [a.status for a in discord_peer.post_attempts] == [429, 200, 200]


async def test_server_errors_are_retried_then_delivered_once(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    discord_peer.fail_next_posts(discord_peer.dm_channel_id, 2, status=503)
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "hi")

    [sent] = await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)
    assert sent.content == "echo: hi"
    assert [a.status for a in discord_peer.post_attempts] == [503, 503, 200]


async def test_retry_after_a_lost_answer_does_not_duplicate_the_message(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder
) -> None:
    # Discord stored the message but the answer was a 503: the retry reuses the nonce.
    discord_peer.fail_next_posts(discord_peer.dm_channel_id, 1, status=503, stored=True)
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "hi")

    await discord_peer.wait_until(lambda: len(discord_peer.post_attempts) == 2)
    assert [s.content for s in discord_peer.sent] == ["echo: hi"]


async def test_send_that_keeps_failing_is_logged_with_conversation_id(
    discord_peer: FakeDiscord, adapter: DiscordAdapter, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    discord_peer.fail_next_posts(discord_peer.dm_channel_id, 4, status=503)
    with caplog.at_level(logging.ERROR, logger="channels.discord"):
        await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "hi")
        await discord_peer.wait_until(lambda: len(discord_peer.post_attempts) == 4)
        # The adapter keeps working: the next message is answered.
        await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "still there?")
        [sent] = await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)

    assert sent.content == "echo: still there?"
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failures) == 1 and str(discord_peer.dm_channel_id) in failures[0]


async def test_typing_indicator_is_shown_while_the_handler_runs(
    discord_peer: FakeDiscord, start_adapter: StartAdapter
) -> None:
    typing_seen_by_handler: list[list[int]] = []

    def reply(message: InboundMessage) -> str:
        typing_seen_by_handler.append(list(discord_peer.typing))
        return "done"

    await start_adapter(Recorder(reply))
    await discord_peer.dispatch_message(discord_peer.thread_id, discord_peer.alice, "work on it")

    await discord_peer.wait_for_posts(discord_peer.thread_id, 1)
    assert typing_seen_by_handler == [[discord_peer.thread_id]]


async def test_handler_returning_none_sends_nothing(discord_peer: FakeDiscord, start_adapter: StartAdapter) -> None:
    await start_adapter(Recorder(lambda m: "pong" if m.text == "ping" else None))
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "just saying")
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "ping")

    sent = await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)
    assert [s.content for s in sent] == ["pong"]
    assert len(discord_peer.post_attempts) == 1


async def test_handler_error_is_logged_and_does_not_stop_the_adapter(
    discord_peer: FakeDiscord, start_adapter: StartAdapter, caplog: pytest.LogCaptureFixture
) -> None:
    def reply(message: InboundMessage) -> str:
        if message.text == "boom":
            raise ValueError("handler bug")
        return "fine"

    await start_adapter(Recorder(reply))
    with caplog.at_level(logging.ERROR, logger="channels.discord"):
        await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "boom")
        await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "ok?")
        sent = await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)

    assert [s.content for s in sent] == ["fine"]
    [failure] = [r for r in caplog.records if r.exc_info]
    assert isinstance(failure.exc_info[1], ValueError)  # type: ignore[index]
    assert str(discord_peer.dm_channel_id) in failure.getMessage()


async def test_reply_cannot_ping_everyone_or_roles(discord_peer: FakeDiscord, start_adapter: StartAdapter) -> None:
    await start_adapter(Recorder(lambda m: "@everyone look"))
    await discord_peer.dispatch_message(discord_peer.text_channel_id, discord_peer.alice, "say it")

    [sent] = await discord_peer.wait_for_posts(discord_peer.text_channel_id, 1)
    assert sent.allowed_mentions is not None
    assert "everyone" not in sent.allowed_mentions["parse"] and "roles" not in sent.allowed_mentions["parse"]


async def test_send_delivers_a_proactive_message_to_a_thread(
    discord_peer: FakeDiscord, adapter: DiscordAdapter
) -> None:
    await adapter.send(
        OutboundMessage(
            channel="discord",
            conversation_id=str(discord_peer.thread_id),
            thread_id=str(discord_peer.thread_id),
            text="Nightly job finished.",
        )
    )

    assert [(s.channel_id, s.content, s.message_reference) for s in discord_peer.sent] == [
        (discord_peer.thread_id, "Nightly job finished.", None)
    ]


# ---- connection -------------------------------------------------------------------------------


async def test_resume_replay_redelivers_the_same_message_id(
    discord_peer: FakeDiscord, start_adapter: StartAdapter
) -> None:
    seen: set[str] = set()

    def dedup(message: InboundMessage) -> str | None:
        # What the gateway does: a message id already answered is not answered again.
        if message.message_id in seen:
            return None
        seen.add(message.message_id)
        return "once"

    recorder = Recorder(dedup)
    await start_adapter(recorder)
    message_id = await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "hello")
    await discord_peer.wait_for_posts(discord_peer.dm_channel_id, 1)

    await discord_peer.drop_connection(replay=[message_id])
    await wait_for_messages(recorder, 2)

    assert len(discord_peer.resumes) == 1 and len(discord_peer.identifies) == 1  # resumed, not re-identified
    assert [m.message_id for m in recorder.messages] == [str(message_id)] * 2
    assert recorder.messages[0] == recorder.messages[1]
    assert [s.content for s in discord_peer.sent] == ["once"]
    # Still connected after the resume.
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "after")
    await wait_for_messages(recorder, 3)


async def test_sharded_adapter_identifies_with_its_shard(
    discord_peer: FakeDiscord, start_adapter: StartAdapter, recorder: Recorder
) -> None:
    shard = discord_peer.guild_shard(2)
    await start_adapter(recorder, shard_ids=[shard], shard_count=2)
    await discord_peer.dispatch_message(discord_peer.text_channel_id, discord_peer.alice, "sharded hello")

    await discord_peer.wait_for_posts(discord_peer.text_channel_id, 1)
    assert [i["shard"] for i in discord_peer.identifies] == [[shard, 2]]
    assert recorder.messages[0].conversation_ids == (str(discord_peer.text_channel_id), str(discord_peer.guild_id))


async def test_stop_lets_an_in_flight_reply_finish(discord_peer: FakeDiscord, start_adapter: StartAdapter) -> None:
    started = asyncio.Event()

    async def slow(message: InboundMessage) -> str:
        started.set()
        await asyncio.sleep(0.1)
        return "finished"

    adapter = await start_adapter(slow)
    await discord_peer.dispatch_message(discord_peer.dm_channel_id, discord_peer.alice, "take your time")
    await asyncio.wait_for(started.wait(), 2)
    await adapter.stop()

    assert [s.content for s in discord_peer.sent] == ["finished"]


async def test_start_rejects_a_bad_token(discord_peer: FakeDiscord) -> None:
    adapter = DiscordAdapter("not-the-token", Recorder(), ready_timeout=2)

    with pytest.raises(DiscordStartError, match="token"):
        await adapter.start()
    await adapter.stop()  # harmless after a failed start


async def test_start_times_out_when_ready_never_comes(discord_peer: FakeDiscord) -> None:
    discord_peer.hold_ready = True
    adapter = discord_peer.make_adapter(Recorder(), ready_timeout=0.3)

    with pytest.raises(TimeoutError, match=r"did not send READY within 0\.3s"):
        await adapter.start()


async def test_start_explains_a_missing_message_content_intent(discord_peer: FakeDiscord) -> None:
    discord_peer.close_identify_with = 4014
    adapter = discord_peer.make_adapter(Recorder())

    with pytest.raises(DiscordStartError, match="Message Content"):
        await adapter.start()


async def test_start_twice_is_refused(adapter: DiscordAdapter) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        await adapter.start()


def test_shard_ids_need_a_shard_count() -> None:
    with pytest.raises(ValueError, match="shard_count"):
        DiscordAdapter("token", Recorder(), shard_ids=[0])
    with pytest.raises(ValueError, match=re.escape("0..1")):
        DiscordAdapter("token", Recorder(), shard_ids=[2], shard_count=2)


def test_construction_does_no_io() -> None:
    # No event loop is running here: anything touching the network would fail.
    adapter = DiscordAdapter("token", Recorder(), shard_count=4)
    assert adapter.name == "discord" and adapter.bot_user_id is None
