"""Where a run's reply goes: ``discord:<channel id>`` or ``teams:<conversation id>``, sent proactively."""

from __future__ import annotations

from collections.abc import Mapping

from channels.base import ChannelAdapter, OutboundMessage
from gateway.automation.config import check_target


class DeliveryError(RuntimeError):
    """A reply could not be delivered; the message names the target and what to do."""


async def deliver(adapters: Mapping[str, ChannelAdapter], target: str, text: str) -> None:
    """Send ``text`` to ``target`` through the running adapter of its channel.

    Raises:
        DeliveryError: the channel is not enabled in this process.
        Exception: whatever the adapter raises (unknown conversation, send failed).
    """
    check_target(target)
    channel, _, conversation = target.partition(":")
    adapter = adapters.get(channel)
    if adapter is None:
        raise DeliveryError(f"channel {channel} is not enabled here (set channels.{channel}.enabled: true)")
    await adapter.send(OutboundMessage(channel=channel, conversation_id=conversation, text=text))
