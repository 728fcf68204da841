"""From a platform message to a turn: identity, admission, pairing, commands, group rules."""

from __future__ import annotations

import logging

from msgspec import Struct, field

from channels.base import InboundMessage
from gateway.sessions import SessionKey
from gateway.turn import TurnHandler, TurnRequest
from gateway.write_health import WriteHealth, storage_reason
from pairing.admission import Admission, DmPolicy, GroupPolicy, admit_direct, admit_group
from pairing.commands import handle_command, parse_command
from pairing.principal import Principal
from pairing.store import PairingError, PairingStore

log = logging.getLogger(__name__)


class ChannelRules(Struct, frozen=True):
    """A channel's admission settings (from its config section)."""

    dm_policy: DmPolicy = DmPolicy.PAIRING
    allow_from: frozenset[str] = field(default_factory=frozenset)
    group_policy: GroupPolicy = GroupPolicy.OPEN
    allow_channels: frozenset[str] = field(default_factory=frozenset)
    require_mention: bool = True


STORAGE_REPLY = "Sorry, I cannot store messages right now, so I did not keep yours. Please send it again in a minute."


def too_long_reply(limit: int, length: int) -> str:
    """What the sender of an over-long message is told (nothing of it is stored)."""
    return (
        f"Your message is {length:,} characters long; the limit is {limit:,} (server.max_message_chars). "
        "I did not keep it: please send it in shorter parts."
    )


def pairing_reply(code: str, channel: str) -> str:
    """What an unknown sender is told: their code and nothing else."""
    return (
        f"Hi! I don't know you yet. Your pairing code is {code}. "
        f"Ask an administrator to approve it (for example '/pair approve {code}' by DM to me, or "
        f"'goclaw pairing approve {channel} {code}'). The code is valid for one hour."
    )


class Dispatcher:
    """The MessageHandler every platform adapter calls."""

    def __init__(
        self,
        *,
        pairing: PairingStore,
        turns: TurnHandler,
        rules: dict[str, ChannelRules],
        max_message_chars: int | None = None,
        write_health: WriteHealth | None = None,
    ) -> None:
        self.pairing = pairing
        self.turns = turns
        self.rules = rules
        self.max_message_chars = max_message_chars
        self.write_health = write_health

    async def handle(self, msg: InboundMessage) -> str | None:
        """Decide what to do with one platform message; return the reply to send, if any."""
        try:
            return await self._handle(msg)
        except Exception as exc:
            reason = storage_reason(exc)
            if reason is None:
                raise
            # The platform has no retry of its own here: tell the sender, log once per burst.
            if self.write_health is not None:
                self.write_health.failed(reason)
            return STORAGE_REPLY

    async def _handle(self, msg: InboundMessage) -> str | None:
        rules = self.rules.get(msg.channel, ChannelRules())
        principal = await self.pairing.resolve(msg.channel, msg.sender_id, msg.display_name)
        if msg.is_direct:
            return await self._direct(msg, rules, principal)
        return await self._group(msg, rules, principal)

    async def _direct(self, msg: InboundMessage, rules: ChannelRules, principal: Principal | None) -> str | None:
        command = parse_command(msg.text)
        # An unpaired sender may redeem a link code, and nothing else, before admission.
        if command is not None and (principal is not None or (command.name == "link" and command.args)):
            if rules.dm_policy is DmPolicy.DISABLED:
                return None
            return await handle_command(
                self.pairing,
                channel=msg.channel,
                platform_user_id=msg.sender_id,
                principal=principal,
                text=msg.text,
                is_direct=True,
            )
        admission = admit_direct(
            rules.dm_policy, paired=principal is not None, platform_user_id=msg.sender_id, allow_from=rules.allow_from
        )
        if admission is Admission.DENY:
            log.info("%s: DM from %s not admitted (dm_policy %s)", msg.channel, msg.sender_id, rules.dm_policy)
            return None
        if admission is Admission.PAIR:
            try:
                issued = await self.pairing.request_code(
                    msg.channel, msg.sender_id, msg.display_name, conversation_id=msg.conversation_id
                )
            except PairingError as exc:
                return f"I can't pair you right now: {exc}."
            return pairing_reply(issued.code, msg.channel)
        return await self._turn(msg, principal or Principal.unpaired(msg.display_name), reply=True)

    async def _group(self, msg: InboundMessage, rules: ChannelRules, principal: Principal | None) -> str | None:
        ids = (msg.conversation_id, *msg.conversation_ids)
        if admit_group(rules.group_policy, conversation_ids=ids, allow_channels=rules.allow_channels) is Admission.DENY:
            return None
        addressed = msg.mentions_bot or not rules.require_mention
        if principal is None:
            # An unpaired sender in a group is stored (nobody's line) and answered only
            # when the DM policy would serve them too.
            served = admit_direct(
                rules.dm_policy, paired=False, platform_user_id=msg.sender_id, allow_from=rules.allow_from
            )
            addressed = addressed and served is Admission.SERVE
        return await self._turn(msg, principal or Principal.unpaired(msg.display_name), reply=addressed)

    async def _turn(self, msg: InboundMessage, principal: Principal, *, reply: bool) -> str | None:
        # Adapters already note attachments in the text as [attachment: name].
        text = msg.text.strip()
        if not text:
            return None
        if self.max_message_chars is not None and len(text) > self.max_message_chars:
            # One limit on every surface: the web and API answer 413, a platform sender gets this reply.
            log.info(
                "%s: message %s of %d characters refused (limit %d)",
                msg.channel,
                msg.message_id,
                len(text),
                self.max_message_chars,
            )
            return too_long_reply(self.max_message_chars, len(text)) if reply else None
        parent = next((c for c in msg.conversation_ids if c != msg.conversation_id), None) if msg.thread_id else None
        result = await self.turns.handle(
            TurnRequest(
                key=SessionKey(msg.channel, msg.conversation_id, msg.thread_id or "", parent),
                principal=principal,
                text=text,
                message_id=msg.message_id,
                said_at=msg.timestamp,
                display_name=msg.display_name,
                reply=reply,
            )
        )
        # A platform's redelivery of an answered message is not answered twice.
        return None if result.duplicate else result.reply
