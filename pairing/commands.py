"""Admin commands by DM: ``/pair``, ``/role``, ``/link``, ``/whoami``.

The platform adapters pass every DM here first; a message that is not a
command returns None and goes on to the turn. Authorization is
:func:`refusal_for`, a pure function of the principal and the command.
"""

from __future__ import annotations

import logging

from msgspec import Struct

from pairing.principal import Principal, Role, is_human_admin
from pairing.store import PairingError, PairingStore

log = logging.getLogger(__name__)

ADMIN_COMMANDS = frozenset({"pair", "role"})
PAIRED_COMMANDS = frozenset({"link", "whoami"})
HELP = (
    "Commands: /pair list · /pair approve CODE [user|admin] · /pair reject CODE · "
    "/role USER_ID admin|user · /link (get a code to link another channel) · /link CODE · /whoami"
)
USER_HELP = (
    "Commands: /whoami (who I know you as, and your role) · "
    "/link (get a code to link another channel) · /link CODE · /help"
)
UNPAIRED_HELP = (
    "You are not paired yet: ask an administrator to approve your pairing code. /link CODE links this account."
)


def help_for(principal: Principal | None) -> str:
    """The commands ``principal`` may run, and only those (admin commands only for admins)."""
    if is_human_admin(principal):
        return HELP
    if principal is not None and principal.is_human:
        return USER_HELP
    return UNPAIRED_HELP


class Command(Struct, frozen=True):
    """A parsed slash command."""

    name: str
    args: tuple[str, ...]


def parse_command(text: str) -> Command | None:
    """A known slash command, or None for ordinary text."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    words = stripped[1:].split()
    if not words:
        return None
    name = words[0].lower()
    if name not in ADMIN_COMMANDS | PAIRED_COMMANDS | {"help"}:
        return None
    return Command(name, tuple(words[1:]))


def refusal_for(principal: Principal | None, command: Command) -> str | None:
    """Why ``principal`` may not run ``command``, or None if they may.

    policy: authority comes only from the pairing role, never from the message.
    """
    if command.name in ADMIN_COMMANDS and not is_human_admin(principal):
        return f"/{command.name} is for administrators; your pairing role does not allow it."
    if command.name == "link" and not command.args and (principal is None or not principal.is_human):
        return "You are not paired yet; ask an administrator to approve your pairing code first."
    if command.name == "whoami" and (principal is None or not principal.is_human):
        return "You are not paired."
    return None


async def handle_command(
    store: PairingStore,
    *,
    channel: str,
    platform_user_id: str,
    principal: Principal | None,
    text: str,
    is_direct: bool,
) -> str | None:
    """Run a pairing command and return the reply, or None if ``text`` is not one.

    Commands are answered only in direct messages; in a group they are ordinary text.
    """
    command = parse_command(text)
    if command is None or not is_direct:
        return None
    actor = principal.user_id if principal and principal.user_id else f"{channel}:{platform_user_id}"
    refusal = refusal_for(principal, command)
    if refusal is not None:
        log.warning("refused /%s from %s on %s", command.name, actor, channel)
        await store.audit(channel, actor, command.name, "refused", " ".join(command.args))
        return refusal
    try:
        reply = await _run(store, command, channel=channel, platform_user_id=platform_user_id, principal=principal)
    except (PairingError, ValueError) as exc:
        await store.audit(channel, actor, command.name, "error", str(exc))
        return f"Could not do that: {exc}"
    await store.audit(channel, actor, command.name, "ok", " ".join(command.args))
    return reply


async def _run(
    store: PairingStore, command: Command, *, channel: str, platform_user_id: str, principal: Principal | None
) -> str:
    args = command.args
    by = principal.user_id if principal and principal.user_id else f"{channel}:{platform_user_id}"
    if command.name == "help":
        return help_for(principal)
    if command.name == "whoami":
        assert principal is not None and principal.user_id is not None
        user = await store.get_user(principal.user_id)
        return f"You are {user.display_name} ({user.id}), role {user.role.value}; linked: {', '.join(user.identities)}"
    if command.name == "pair":
        sub = args[0].lower() if args else "list"
        if sub == "list":
            pending = await store.list_pending()
            if not pending:
                return "No pending pairing requests."
            return "Pending pairing requests:\n" + "\n".join(
                f"- {p.code} · {p.channel}:{p.platform_user_id} · {p.display_name} · expires {p.expires_at:%H:%M} UTC"
                for p in pending
            )
        if sub == "approve" and len(args) in (2, 3):
            role = Role.parse(args[2]) if len(args) == 3 else Role.USER
            user = await store.approve(None, args[1], role=role, by=by)
            return f"Approved: {user.display_name} is now {user.id} with role {user.role.value}."
        if sub == "reject" and len(args) == 2:
            req = await store.reject(None, args[1], by=by)
            return f"Rejected pairing code {req.code} from {req.display_name}."
        return "Usage: /pair list · /pair approve CODE [user|admin] · /pair reject CODE"
    if command.name == "role":
        if len(args) != 2:
            return "Usage: /role USER_ID admin|user"
        user = await store.set_role(args[0], Role.parse(args[1]), by=by)
        return f"{user.display_name} ({user.id}) now has role {user.role.value}."
    if command.name == "link":
        if not args:
            assert principal is not None and principal.user_id is not None
            code, expires = await store.create_link_code(principal.user_id, channel)
            return (
                f"Your link code is {code}. Send '/link {code}' to me from the other channel "
                f"before {expires:%H:%M} UTC to make both accounts one."
            )
        user = await store.redeem_link_code(channel, platform_user_id, args[0])
        return f"Linked: this {channel} account is now {user.display_name} ({user.id})."
    raise AssertionError(command.name)  # parse_command admits only the names above
