"""Retraction of an operational fact by a named admin: the CLI, the chat tool and the dashboard call these.

Seed 001: "If a fact turns out to be wrong before then, a person retracts it
... A retraction is appended as a later event, and nothing is deleted. The
<who> must be a person the interaction policy names." Here the interaction
policy is the pairing role: ``--by`` must name a paired person whose stored
role is admin (``is_human_admin``), checked in code.

The event row (``memory_reviews``, action ``retract``: who, when, why) is the
authoritative record of a retraction; the record's ``retracted`` status is
its projection, written in the same transaction so reads need no join.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from memory.review import retract_note
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError
from pairing.principal import Principal, is_human_admin

PrincipalLookup = Callable[[str], Awaitable[Principal | None]]
"""The principal the pairing store gives a unified user id now, or None for nobody paired.

The gateway passes the pairing store's lookup: memory never imports the store itself.
"""

REFUSE_RETRACT_TOOL = "Retracting an operational note requires an administrator; nothing was changed."

MEMORY_RETRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The operational note to retract (m_...)."},
        "reason": {"type": "string", "description": "Why it is wrong (kept with the retraction)."},
    },
    "required": ["id", "reason"],
    "additionalProperties": False,
}
"""JSON schema of the ``memory_retract`` tool's arguments."""

MEMORY_RETRACT_DESCRIPTION = (
    "Administrators only: retract an operational note (agent_notes) that turned out to be wrong. "
    "It is kept, marked retracted under your name with the reason, and never used again."
)


def authorize_retract(principal: Principal) -> str | None:
    """Why ``principal`` may not retract, or None (a paired human admin)."""
    return None if is_human_admin(principal) and principal.user_id else REFUSE_RETRACT_TOOL


async def retract_by(
    store: MemoryStore, lookup: PrincipalLookup, record_id: str, *, by: str, reason: str
) -> MemoryRecordView:
    """Retract a note as the paired person ``by``, refused unless their stored role is admin.

    Args:
        store: The memory store.
        lookup: The pairing store's principal for a user id (None: not paired).
        record_id: The note.
        by: The unified user id of who decides.
        reason: Why (kept with the retraction event).

    Raises:
        MemoryStoreError: ``by`` is not a paired person, not an admin, or the note cannot be retracted.
    """
    principal = await lookup(by.strip()) if by.strip() else None
    if principal is None:
        raise MemoryStoreError(
            f"--by {by!r} is not a paired person; name the admin who decides (see 'goclaw users list'). "
            "Nothing was changed"
        )
    if not is_human_admin(principal):
        role = principal.stored_role or "none"
        raise MemoryStoreError(
            f"{by} is not an admin (role {role}): only a paired admin can retract a note. Nothing was changed"
        )
    return await retract_note(store, principal, record_id, reason=reason)


async def memory_retract_tool(store: MemoryStore, principal: Principal, args: Mapping[str, Any]) -> str:
    """The ``memory_retract`` admin tool: the same retraction as ``goclaw memory retract``, as the turn's admin."""
    refusal = authorize_retract(principal)
    if refusal:
        return refusal
    record_id = str(args.get("id") or "").strip()
    reason = str(args.get("reason") or "").strip()
    if not record_id or not reason:
        return "error: give the note's id and the reason it is retracted. Nothing was changed."
    try:
        rec = await retract_note(store, principal, record_id, reason=reason)
    except MemoryStoreError as exc:
        return f"error: {exc}. Nothing was changed."
    return f"Retracted {rec.id} ('{rec.subject}') as {principal.user_id}: kept as history, never used again."
