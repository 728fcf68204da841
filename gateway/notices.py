"""Delivering pairing notices: the outbox rows an approval writes, sent through the channel's adapter.

The CLI approves in its own process; the gateway that holds the Discord or Teams
connection is another. A database outbox polled here joins the two without a
socket between them, and survives a restart of either (policy of the issue: the
person being paired is told they are paired, and as what).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from channels.base import ChannelAdapter, OutboundMessage
from gateway.tasks import cancel_and_wait
from pairing.notices import NoticeOutbox

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0


class NoticeDelivery:
    """Polls the outbox and sends each pending notice on its channel. No I/O until ``start``."""

    def __init__(
        self,
        outbox: NoticeOutbox,
        adapters: Callable[[], Mapping[str, ChannelAdapter]],
        *,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self._outbox = outbox
        self._adapters = adapters
        self._poll = poll_seconds
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Begin polling (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="pairing-notices")

    async def stop(self) -> None:
        """Stop polling; a send in progress is cancelled and retried by the next start."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def wake(self) -> None:
        """Deliver now instead of at the next poll (an approval in this process)."""
        self._wake.set()

    async def deliver_once(self) -> int:
        """Send every pending notice whose channel has an adapter here; the number sent."""
        adapters = dict(self._adapters())
        if not adapters:
            return 0
        sent = 0
        for notice in await self._outbox.claim(frozenset(adapters)):
            if not notice.conversation_id:
                await self._outbox.undeliverable(notice.id, "no conversation recorded for this pairing request")
                continue
            try:
                await adapters[notice.channel].send(
                    OutboundMessage(channel=notice.channel, conversation_id=notice.conversation_id, text=notice.text)
                )
            except Exception as exc:  # any adapter failure: keep the row, try again later
                log.warning("pairing notice %s to %s failed: %s", notice.id, notice.channel, exc)
                await self._outbox.retry_later(notice, str(exc)[:500])
                continue
            await self._outbox.sent(notice.id)
            log.info("told %s on %s that they are paired", notice.user_id, notice.channel)
            sent += 1
        return sent

    async def _loop(self) -> None:
        while True:
            try:
                await self.deliver_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pairing notices: delivery round failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll)
            self._wake.clear()
