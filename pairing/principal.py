"""Principals: who a turn runs as, and the one authority check."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    """A paired person's role. Given at pairing, changed only by an admin or operator."""

    ADMIN = "admin"
    USER = "user"

    @classmethod
    def parse(cls, value: str) -> Role:
        """Parse a role name, with an error a person can act on."""
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ValueError(f"unknown role {value!r}: use 'admin' or 'user'") from None


class PrincipalKind(StrEnum):
    """The three kinds of speaker the gateway knows."""

    HUMAN = "human"
    UNPAIRED = "unpaired"
    SYSTEM = "system"


SYSTEM_PRINCIPALS: tuple[str, ...] = ("cron-system", "sop-system", "webhook-system")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a turn runs as.

    A paired human has a unified user id and the role stored for them; an
    unpaired sender (let in by ``allow_from`` or an open policy) has neither; a
    system principal names an autonomous run.
    """

    kind: PrincipalKind
    user_id: str | None = None
    role: Role | None = None
    display_name: str = ""
    system_name: str | None = None
    from_users: bool = field(default=False, compare=False)
    """Read from the pairing store's users table: every turn reads the role again where it stores the
    message (``gateway.sessions.SessionStore.begin_turn``), so a principal kept between turns (an open
    WebSocket, ``goclaw chat --as``) never carries a role that has since changed."""

    @classmethod
    def human(cls, user_id: str, role: Role, display_name: str = "", *, from_users: bool = False) -> Principal:
        """A paired person, with the role the pairing store holds for them."""
        return cls(
            PrincipalKind.HUMAN, user_id=user_id, role=Role(role), display_name=display_name, from_users=from_users
        )

    @classmethod
    def unpaired(cls, display_name: str = "") -> Principal:
        """A sender who is served but not paired: no user id, no authority."""
        return cls(PrincipalKind.UNPAIRED, display_name=display_name)

    @classmethod
    def system(cls, name: str) -> Principal:
        """An autonomous run (``cron-system``, ``sop-system``, ``webhook-system``)."""
        if name not in SYSTEM_PRINCIPALS:
            raise ValueError(f"unknown system principal {name!r}: use one of {', '.join(SYSTEM_PRINCIPALS)}")
        return cls(PrincipalKind.SYSTEM, display_name=name, system_name=name)

    @property
    def is_human(self) -> bool:
        """True for a paired person."""
        return self.kind is PrincipalKind.HUMAN

    @property
    def is_system(self) -> bool:
        """True for an autonomous run."""
        return self.kind is PrincipalKind.SYSTEM

    @property
    def stored_role(self) -> str | None:
        """The role a message from this principal is stored with.

        ``admin``/``user`` for people, the system principal's name for runs,
        and none for an unpaired sender.
        """
        if self.kind is PrincipalKind.HUMAN:
            return self.role.value if self.role else None
        if self.kind is PrincipalKind.SYSTEM:
            return self.system_name
        return None


def is_human_admin(principal: Principal | None) -> bool:
    """True only for a paired human whose stored role is admin.

    policy: "Authorization is enforced by code (isHumanAdmin, derived from the
    pairing role)". System principals and unpaired senders are never admins,
    and nothing in a message's text reaches this function.
    """
    return (
        principal is not None
        and principal.kind is PrincipalKind.HUMAN
        and principal.user_id is not None
        and principal.role is Role.ADMIN
    )
