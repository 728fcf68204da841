"""Telling a person they are paired: the message (pure) and its outbox.

The approval writes a :class:`~pairing.models.PairingNotice` in its own
transaction (``PairingStore.approve``), so whichever process approves (the CLI,
an admin's DM, the dashboard), a running gateway finds the row and delivers it
through the channel's adapter. A row is claimed before it is sent, so several
gateway processes on one database deliver it once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from msgspec import Struct
from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from pairing.models import PairingNotice
from pairing.principal import Role

MAX_ATTEMPTS = 5
CLAIM_TIMEOUT = timedelta(minutes=2)  # a claim by a process that died is taken over after this


def paired_text(display_name: str, user_id: str, role: Role, *, linked: bool = False) -> str:
    """What the person is told once an admin approves their code: that they are paired, and as what."""
    if linked:
        head = f"An administrator linked this account to {display_name} ({user_id}), role {role.value}."
    else:
        head = (
            f"You are paired, {display_name}: an administrator approved your code. "
            f"You are {user_id}, role {role.value}."
        )
    if role is Role.ADMIN:
        what = (
            "As an administrator you can teach me the team's procedures (start a message with @notes:) "
            "and approve pairing codes (/pair)."
        )
    else:
        what = "Tell me about yourself and I will remember it, for you only."
    return f"{head} {what} Send /whoami to see who I know you as, /help for the commands you may run."


class Notice(Struct, frozen=True):
    """A notice to deliver."""

    id: int
    channel: str
    platform_user_id: str
    conversation_id: str | None
    user_id: str
    text: str
    attempts: int


class NoticeOutbox:
    """Claims pending notices and records what became of them."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], datetime] | None = None) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or (lambda: datetime.now(UTC))

    async def claim(self, channels: frozenset[str], *, limit: int = 20) -> list[Notice]:
        """Pending notices for ``channels``, each claimed by this process (unclaimed or abandoned ones only)."""
        now = self._clock()
        stale = now - CLAIM_TIMEOUT
        async with self._sessions() as s:
            rows = (
                await s.scalars(
                    select(PairingNotice)
                    .where(
                        PairingNotice.status == "pending",
                        PairingNotice.channel.in_(channels),
                        or_(PairingNotice.claimed_at.is_(None), PairingNotice.claimed_at < stale),
                    )
                    .order_by(PairingNotice.id)
                    .limit(limit)
                )
            ).all()
        claimed: list[Notice] = []
        for row in rows:
            async with self._sessions.begin() as s:
                # Compare-and-set on the claim: another process that got there first wins.
                result = await s.execute(
                    update(PairingNotice)
                    .where(
                        PairingNotice.id == row.id,
                        PairingNotice.status == "pending",
                        or_(PairingNotice.claimed_at.is_(None), PairingNotice.claimed_at < stale),
                    )
                    .values(claimed_at=now, attempts=PairingNotice.attempts + 1)
                )
            if result.rowcount == 1:  # type: ignore[attr-defined]
                claimed.append(
                    Notice(
                        row.id,
                        row.channel,
                        row.platform_user_id,
                        row.conversation_id,
                        row.user_id,
                        row.text,
                        row.attempts + 1,
                    )
                )
        return claimed

    async def sent(self, notice_id: int) -> None:
        """The adapter delivered it."""
        await self._finish(notice_id, "sent", "")

    async def undeliverable(self, notice_id: int, detail: str) -> None:
        """It can never be delivered (no conversation to send to, a channel with no push)."""
        await self._finish(notice_id, "undeliverable", detail)

    async def retry_later(self, notice: Notice, detail: str) -> None:
        """A send failed: release the claim for a later try, or give up after :data:`MAX_ATTEMPTS`."""
        if notice.attempts >= MAX_ATTEMPTS:
            await self._finish(notice.id, "failed", detail)
            return
        async with self._sessions.begin() as s:
            await s.execute(
                update(PairingNotice).where(PairingNotice.id == notice.id).values(claimed_at=None, detail=detail)
            )

    async def status(self, user_id: str) -> list[tuple[str, str, str]]:
        """(channel, status, text) of every notice for one person, oldest first."""
        async with self._sessions() as s:
            query = select(PairingNotice).where(PairingNotice.user_id == user_id).order_by(PairingNotice.id)
            rows = (await s.scalars(query)).all()
            return [(r.channel, r.status, r.text) for r in rows]

    async def _finish(self, notice_id: int, status: str, detail: str) -> None:
        async with self._sessions.begin() as s:
            await s.execute(
                update(PairingNotice)
                .where(PairingNotice.id == notice_id)
                .values(status=status, done_at=self._clock(), detail=detail)
            )
