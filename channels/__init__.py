"""One adapter per platform. Knows nothing of memory; no platform type leaves this package."""

from channels.base import ChannelAdapter, ConversationKind, InboundMessage, MessageHandler, OutboundMessage, split_text

__all__ = ["ChannelAdapter", "ConversationKind", "InboundMessage", "MessageHandler", "OutboundMessage", "split_text"]
