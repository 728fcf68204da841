"""The pairing store: unified users, platform identities, pairing codes, roles."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from msgspec import Struct
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from pairing.models import Identity, LinkCode, PairingAudit, PairingNotice, PairingRequest, RoleChange, User
from pairing.notices import paired_text
from pairing.principal import Principal, Role

log = logging.getLogger(__name__)

# No look-alikes: no 0/O, no 1/I/L.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL = timedelta(hours=1)
LINK_CODE_TTL = timedelta(minutes=15)
MAX_PENDING_PER_CHANNEL = 3


class PairingError(Exception):
    """A pairing operation that cannot be done; the message says what to do instead."""


class UserView(Struct, frozen=True):
    """A unified user with their linked identities."""

    id: str
    display_name: str
    role: Role
    created_at: datetime
    identities: tuple[str, ...]  # "channel:platform_user_id"

    def as_json(self) -> dict[str, object]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "name": self.display_name,
            "role": self.role.value,
            "created_at": self.created_at.isoformat(),
            "identities": list(self.identities),
        }


class PendingView(Struct, frozen=True):
    """A pending pairing request."""

    channel: str
    code: str
    platform_user_id: str
    display_name: str
    created_at: datetime
    expires_at: datetime

    def as_json(self) -> dict[str, object]:
        """The JSON shape the CLI prints."""
        return {
            "channel": self.channel,
            "code": self.code,
            "platform_user_id": self.platform_user_id,
            "name": self.display_name,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
        }


class CodeIssued(Struct, frozen=True):
    """The answer to an unknown sender: their code, and whether it is new."""

    code: str
    expires_at: datetime
    new: bool


def parse_identity(spec: str) -> tuple[str, str]:
    """Split ``CHANNEL:PLATFORM_ID`` into its parts."""
    channel, sep, platform_id = spec.partition(":")
    if not sep or not channel.strip() or not platform_id.strip():
        raise PairingError(f"identity {spec!r} is not CHANNEL:PLATFORM_ID (for example discord:123456789)")
    return channel.strip().lower(), platform_id.strip()


def new_code() -> str:
    """A fresh code from the look-alike-free alphabet."""
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def _norm_code(code: str) -> str:
    return code.strip().upper().replace("-", "").replace(" ", "")


class RoleReads(Protocol):
    """The two reads of a role that every message makes (the gateway gives its raw-driver hot store)."""

    async def user_role(self, user_id: str) -> tuple[str, str] | None:
        """(role, display name) of a unified user, read now (never cached), or None."""

    async def identity_role(self, channel: str, platform_user_id: str) -> tuple[str, str, str] | None:
        """(user id, role, display name) of the person behind a platform identity, or None."""


class OrmRoleReads:
    """``RoleReads`` through SQLAlchemy: the CLI's and the tests' stores (cold paths)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def user_role(self, user_id: str) -> tuple[str, str] | None:
        """(role, display name), or None."""
        async with self._sessions() as s:
            row = (await s.execute(select(User.role, User.display_name).where(User.id == user_id))).first()
        return None if row is None else (row.role, row.display_name)

    async def identity_role(self, channel: str, platform_user_id: str) -> tuple[str, str, str] | None:
        """(user id, role, display name), or None."""
        async with self._sessions() as s:
            row = (
                await s.execute(
                    select(User.id, User.role, User.display_name)
                    .join(Identity, Identity.user_id == User.id)
                    .where(Identity.channel == channel, Identity.platform_user_id == platform_user_id)
                )
            ).first()
        return None if row is None else (row.id, row.role, row.display_name)


class PairingStore:
    """Reads and writes who people are and what role they hold.

    Every write happens in one transaction; a failed operation leaves nothing
    half-written. The role reads of every message go through ``roles``: the
    gateway passes its hot store (``gateway.hotstore``, the raw driver); without
    one they run through SQLAlchemy. Either way the role is read on every
    request, never cached.
    """

    def __init__(
        self, engine: AsyncEngine, *, clock: Callable[[], datetime] | None = None, roles: RoleReads | None = None
    ) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._roles: RoleReads = roles or OrmRoleReads(self._sessions)

    def now(self) -> datetime:
        """The store's clock (injectable for tests)."""
        return self._clock()

    # ---- users -------------------------------------------------------------

    async def add_user(
        self, name: str, role: Role | str, *, links: Sequence[str] = (), by: str = "operator"
    ) -> UserView:
        """Create a person with a role, optionally linked to platform identities."""
        name = name.strip()
        if not name:
            raise PairingError("a user needs a name: pass --name")
        role = Role.parse(role) if isinstance(role, str) else role
        parsed = [parse_identity(spec) for spec in links]
        now = self.now()
        user_id = "u_" + secrets.token_hex(6)
        async with self._sessions.begin() as s:
            for channel, pid in parsed:
                await self._ensure_unlinked(s, channel, pid)
            s.add(User(id=user_id, display_name=name, role=role.value, created_at=now))
            await s.flush()
            for channel, pid in parsed:
                s.add(Identity(channel=channel, platform_user_id=pid, user_id=user_id, linked_at=now))
            s.add(RoleChange(user_id=user_id, old_role=None, new_role=role.value, changed_by=by, changed_at=now))
        return await self.get_user(user_id)

    async def get_user(self, user_id: str) -> UserView:
        """One person, or an error naming the unknown id."""
        async with self._sessions() as s:
            user = await s.get(User, user_id)
            if user is None:
                raise PairingError(f"no user {user_id!r}: see 'goclaw users list'")
            return await self._view(s, user)

    async def find_user(self, user_id: str) -> UserView | None:
        """One person, or None."""
        async with self._sessions() as s:
            user = await s.get(User, user_id)
            return None if user is None else await self._view(s, user)

    async def list_users(self) -> list[UserView]:
        """Everyone, oldest first."""
        async with self._sessions() as s:
            users = (await s.scalars(select(User).order_by(User.created_at, User.id))).all()
            idents = (await s.scalars(select(Identity))).all()
            by_user: dict[str, list[str]] = {}
            for ident in idents:
                by_user.setdefault(ident.user_id, []).append(f"{ident.channel}:{ident.platform_user_id}")
            return [
                UserView(u.id, u.display_name, Role(u.role), u.created_at, tuple(sorted(by_user.get(u.id, []))))
                for u in users
            ]

    async def set_role(self, user_id: str, role: Role | str, *, by: str) -> UserView:
        """Change a person's role, recording who did it and when."""
        role = Role.parse(role) if isinstance(role, str) else role
        async with self._sessions.begin() as s:
            user = await s.get(User, user_id, with_for_update=True)
            if user is None:
                raise PairingError(f"no user {user_id!r}: see 'goclaw users list'")
            if user.role != role.value:
                s.add(
                    RoleChange(
                        user_id=user_id, old_role=user.role, new_role=role.value, changed_by=by, changed_at=self.now()
                    )
                )
                user.role = role.value
        return await self.get_user(user_id)

    async def role_history(self, user_id: str) -> list[tuple[str | None, str, str, datetime]]:
        """(old role, new role, changed by, when) for one person, oldest first."""
        async with self._sessions() as s:
            rows = (
                await s.scalars(select(RoleChange).where(RoleChange.user_id == user_id).order_by(RoleChange.id))
            ).all()
            return [(r.old_role, r.new_role, r.changed_by, r.changed_at) for r in rows]

    async def link(self, user_id: str, spec: str) -> UserView:
        """Link a platform identity (``CHANNEL:PLATFORM_ID``) to an existing person."""
        channel, pid = parse_identity(spec)
        async with self._sessions.begin() as s:
            if await s.get(User, user_id) is None:
                raise PairingError(f"no user {user_id!r}: see 'goclaw users list'")
            await self._ensure_unlinked(s, channel, pid)
            s.add(Identity(channel=channel, platform_user_id=pid, user_id=user_id, linked_at=self.now()))
        return await self.get_user(user_id)

    async def resolve(self, channel: str, platform_user_id: str, display_name: str = "") -> Principal | None:
        """The paired person behind a platform identity, with their stored role; None if unpaired.

        Read on every message, never cached: a role change takes effect at once.
        """
        row = await self._roles.identity_role(channel, platform_user_id)
        if row is None:
            return None
        user_id, role, name = row
        return Principal.human(user_id, Role(role), display_name or name, from_users=True)

    async def principal_for_user(self, user_id: str) -> Principal:
        """The principal of a unified user id (API tokens, `goclaw chat --as`).

        Read here, and read again by every turn it speaks in (``Principal.from_users``): a role
        change takes effect at the person's next message.
        """
        row = await self._roles.user_role(user_id)
        if row is None:
            raise PairingError(f"no user {user_id!r}: see 'goclaw users list'")
        return Principal.human(user_id, Role(row[0]), row[1], from_users=True)

    # ---- pairing codes -------------------------------------------------------

    async def request_code(
        self, channel: str, platform_user_id: str, display_name: str, *, conversation_id: str | None = None
    ) -> CodeIssued:
        """Give an unknown sender a pairing code; a repeat DM gets the same code back.

        ``conversation_id`` is where they asked (their DM with the bot): where
        they are told once an admin approves the code.
        """
        now = self.now()
        async with self._sessions.begin() as s:
            pending = (
                await s.scalars(
                    select(PairingRequest).where(
                        PairingRequest.channel == channel,
                        PairingRequest.status == "pending",
                        PairingRequest.expires_at > now,
                    )
                )
            ).all()
            for req in pending:
                if req.platform_user_id == platform_user_id:
                    if conversation_id:
                        req.conversation_id = conversation_id
                    return CodeIssued(req.code, req.expires_at, new=False)
            if len(pending) >= MAX_PENDING_PER_CHANNEL:
                raise PairingError(
                    f"too many pending pairing requests on {channel} (at most {MAX_PENDING_PER_CHANNEL}); "
                    "ask an admin to approve or reject them, or wait an hour"
                )
            req = PairingRequest(
                channel=channel,
                code=new_code(),
                platform_user_id=platform_user_id,
                display_name=display_name or platform_user_id,
                created_at=now,
                expires_at=now + CODE_TTL,
                status="pending",
                conversation_id=conversation_id,
            )
            s.add(req)
        log.info("pairing code issued on %s for %s", channel, platform_user_id)
        return CodeIssued(req.code, req.expires_at, new=True)

    async def list_pending(self, channel: str | None = None) -> list[PendingView]:
        """Unexpired pending requests, oldest first."""
        now = self.now()
        async with self._sessions() as s:
            q = select(PairingRequest).where(PairingRequest.status == "pending", PairingRequest.expires_at > now)
            if channel:
                q = q.where(PairingRequest.channel == channel)
            rows = (await s.scalars(q.order_by(PairingRequest.created_at, PairingRequest.id))).all()
            return [
                PendingView(r.channel, r.code, r.platform_user_id, r.display_name, r.created_at, r.expires_at)
                for r in rows
            ]

    async def approve(
        self, channel: str | None, code: str, *, role: Role | str = Role.USER, user_id: str | None = None, by: str
    ) -> UserView:
        """Approve a pending code: a new person with ``role``, or linked to ``user_id``.

        ``channel`` None accepts a code from any channel (an admin approving by DM).
        Every approval (CLI, DM command, dashboard) comes through here, and in the
        same transaction records a :class:`PairingNotice` telling the person they
        are paired and as what; a running gateway delivers it on their channel.
        """
        role = Role.parse(role) if isinstance(role, str) else role
        now = self.now()
        async with self._sessions.begin() as s:
            req = await self._pending_request(s, channel, code, now)
            await self._ensure_unlinked(s, req.channel, req.platform_user_id)
            if user_id is not None:
                user = await s.get(User, user_id)
                if user is None:
                    raise PairingError(f"no user {user_id!r}: see 'goclaw users list'")
            else:
                user = User(
                    id="u_" + secrets.token_hex(6), display_name=req.display_name, role=role.value, created_at=now
                )
                s.add(user)
                await s.flush()
                s.add(RoleChange(user_id=user.id, old_role=None, new_role=role.value, changed_by=by, changed_at=now))
            s.add(Identity(channel=req.channel, platform_user_id=req.platform_user_id, user_id=user.id, linked_at=now))
            req.status, req.decided_by, req.decided_at, req.user_id = "approved", by, now, user.id
            s.add(
                PairingNotice(
                    channel=req.channel,
                    platform_user_id=req.platform_user_id,
                    conversation_id=req.conversation_id,
                    user_id=user.id,
                    text=paired_text(user.display_name, user.id, Role(user.role), linked=user_id is not None),
                    created_at=now,
                    attempts=0,
                    status="pending",
                    detail="",
                )
            )
            uid = user.id
        log.info("pairing %s approved by %s as %s", _norm_code(code), by, uid)
        return await self.get_user(uid)

    async def reject(self, channel: str | None, code: str, *, by: str) -> PendingView:
        """Reject a pending code; the sender stays unpaired."""
        now = self.now()
        async with self._sessions.begin() as s:
            req = await self._pending_request(s, channel, code, now)
            req.status, req.decided_by, req.decided_at = "rejected", by, now
            return PendingView(
                req.channel, req.code, req.platform_user_id, req.display_name, req.created_at, req.expires_at
            )

    # ---- cross-channel links ------------------------------------------------------

    async def create_link_code(self, user_id: str, channel: str) -> tuple[str, datetime]:
        """A code a paired person sends from another channel to link it to themselves."""
        now = self.now()
        async with self._sessions.begin() as s:
            if await s.get(User, user_id) is None:
                raise PairingError(f"no user {user_id!r}")
            code = new_code()
            s.add(LinkCode(code=code, user_id=user_id, channel=channel, created_at=now, expires_at=now + LINK_CODE_TTL))
        return code, now + LINK_CODE_TTL

    async def redeem_link_code(self, channel: str, platform_user_id: str, code: str) -> UserView:
        """Link the sender's identity on ``channel`` to the person who asked for ``code``."""
        now = self.now()
        async with self._sessions.begin() as s:
            link = await s.get(LinkCode, _norm_code(code), with_for_update=True)
            if link is None or link.used_at is not None:
                raise PairingError("unknown or used link code: send /link on a channel where you are paired to get one")
            if link.expires_at <= now:
                raise PairingError("that link code has expired: send /link again to get a new one")
            if link.channel == channel:
                raise PairingError(f"send this code from another channel than {channel}, where you are not yet linked")
            await self._ensure_unlinked(s, channel, platform_user_id)
            s.add(Identity(channel=channel, platform_user_id=platform_user_id, user_id=link.user_id, linked_at=now))
            # Pending pairing requests by this sender are answered by the link.
            for req in (
                await s.scalars(
                    select(PairingRequest).where(
                        PairingRequest.channel == channel,
                        PairingRequest.platform_user_id == platform_user_id,
                        PairingRequest.status == "pending",
                    )
                )
            ).all():
                req.status, req.decided_by, req.decided_at, req.user_id = "approved", "link", now, link.user_id
            link.used_at = now
            uid = link.user_id
        return await self.get_user(uid)

    # ---- audit -----------------------------------------------------------------

    async def audit(self, channel: str, actor: str, action: str, outcome: str, detail: str = "") -> None:
        """Record an admin command or a refusal."""
        async with self._sessions.begin() as s:
            s.add(
                PairingAudit(at=self.now(), channel=channel, actor=actor, action=action, outcome=outcome, detail=detail)
            )

    async def audit_log(self, limit: int = 100) -> list[tuple[datetime, str, str, str, str, str]]:
        """The newest audit rows: (at, channel, actor, action, outcome, detail)."""
        async with self._sessions() as s:
            rows = (await s.scalars(select(PairingAudit).order_by(PairingAudit.id.desc()).limit(limit))).all()
            return [(r.at, r.channel, r.actor, r.action, r.outcome, r.detail) for r in rows]

    # ---- helpers -----------------------------------------------------------------

    async def _view(self, s: AsyncSession, user: User) -> UserView:
        idents = (await s.scalars(select(Identity).where(Identity.user_id == user.id))).all()
        return UserView(
            user.id,
            user.display_name,
            Role(user.role),
            user.created_at,
            tuple(sorted(f"{i.channel}:{i.platform_user_id}" for i in idents)),
        )

    async def _ensure_unlinked(self, s: AsyncSession, channel: str, platform_user_id: str) -> None:
        existing = await s.get(Identity, (channel, platform_user_id))
        if existing is not None:
            raise PairingError(f"{channel}:{platform_user_id} is already linked to user {existing.user_id}")

    async def _pending_request(self, s: AsyncSession, channel: str | None, code: str, now: datetime) -> PairingRequest:
        norm = _norm_code(code)
        rows = (
            await s.scalars(
                select(PairingRequest).where(func.upper(PairingRequest.code) == norm).order_by(PairingRequest.id.desc())
            )
        ).all()
        if not rows:
            raise PairingError(f"no pairing code {norm}: see 'goclaw pairing list' (codes are case-insensitive)")
        same_channel = [r for r in rows if channel is None or r.channel == channel]
        if not same_channel:
            raise PairingError(f"code {norm} belongs to channel {rows[0].channel}, not {channel}")
        req = same_channel[0]
        if req.status == "approved":
            raise PairingError(f"code {norm} was already approved (user {req.user_id})")
        if req.status == "rejected":
            raise PairingError(f"code {norm} was rejected; the person can message again for a new code")
        if req.expires_at <= now:
            raise PairingError(
                f"code {norm} expired at {req.expires_at:%Y-%m-%d %H:%M} UTC; ask the person to message again"
            )
        return req


__all__ = [
    "CODE_ALPHABET",
    "CODE_LENGTH",
    "CODE_TTL",
    "MAX_PENDING_PER_CHANNEL",
    "CodeIssued",
    "PairingError",
    "PairingStore",
    "PendingView",
    "UserView",
    "parse_identity",
]
