"""At start, answer what the last process left unanswered (it died mid-turn)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from channels.base import OutboundMessage
from gateway.replies import Unanswered, find_unanswered
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from pairing.principal import Principal, Role
from pairing.store import PairingError, PairingStore

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger(__name__)

DASHBOARD_USER = "admin"  # the web chat's operator (gateway.web.app stores it so)
SKIPPED_CHANNELS = frozenset({"system"})  # autonomous runs have their own run history and retries


async def principal_of(pairing: PairingStore, u: Unanswered) -> Principal | None:
    """Who to answer: the speaker's current principal (a demotion since then holds), or None to skip."""
    if u.speaker_user_id is None:
        return None if u.stored_role else Principal.unpaired(u.display_name)
    try:
        return await pairing.principal_for_user(u.speaker_user_id)
    except PairingError:
        if u.speaker_user_id == DASHBOARD_USER and u.stored_role == Role.ADMIN.value:
            return Principal.human(DASHBOARD_USER, Role.ADMIN, "Dashboard")
        log.warning("resume: user %s of message %s no longer exists; not answering", u.speaker_user_id, u.message_id)
        return None


async def resume_unanswered(gw: Gateway) -> int:
    """Answer messages younger than ``session.resume_unanswered_seconds`` that never got their reply.

    The reply is stored (so an API client's retry or GET sees it) and, for a
    platform channel, sent through its adapter. Runs through the one turn
    handler, so a client retry racing with it waits and gets the stored reply.

    Returns:
        How many messages were answered.
    """
    window = gw.config.session.resume_unanswered_seconds
    if window <= 0:
        return 0
    pending = await find_unanswered(gw.engine, since=gw.clock() - timedelta(seconds=window))
    answered = 0
    for u in pending:
        if u.channel in SKIPPED_CHANNELS:
            continue
        principal = await principal_of(gw.pairing, u)
        if principal is None:
            continue
        key = SessionKey(u.channel, u.conversation_id, u.thread_id, u.parent_conversation_id)
        try:
            result = await gw.turns.handle(
                TurnRequest(
                    key=key,
                    principal=principal,
                    text=u.text,
                    message_id=u.message_id,
                    said_at=u.said_at,
                    display_name=u.display_name,
                )
            )
        except Exception as exc:
            log.error("resume: message %s in %s could not be answered: %s", u.message_id, u.channel, exc)
            continue
        if result.duplicate or result.failed or not result.reply:
            continue  # answered meanwhile (a client retry), or the model is still down: the retry will do
        answered += 1
        adapter = gw.adapters.get(u.channel)
        if adapter is None:
            continue
        try:
            await adapter.send(
                OutboundMessage(
                    u.channel, u.conversation_id, result.reply, thread_id=u.thread_id or None, reply_to=u.message_id
                )
            )
        except Exception as exc:
            log.error("resume: reply to message %s could not be sent on %s: %s", u.message_id, u.channel, exc)
    if pending:
        log.info("resume: %d of %d unanswered messages answered after restart", answered, len(pending))
    return answered
