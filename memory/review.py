"""Review of quarantined learning: ``review_learned`` (list, confirm, reject) and retraction.

policy: "The ``review_learned`` admin tool and the ``unverified`` exclusion
remain available for other/manual uses. An unverified record retires nothing;
confirming it queues belief revision." A relearn of an archive without admin
trust quarantines its operational items as ``unverified``; they are never put
in a prompt and retire nothing until a human admin confirms them.

- **confirm** asks the write gate (source ``confirm``: human admins only), makes
  the record live, applies the subject rule by its own ``said_at`` (an older
  record becomes history rather than retiring a newer value), then runs belief
  revision for it (cause ``confirm``);
- **reject** keeps it as ``rejected`` (nothing is deleted);
- **retract** takes a live agent note out of use: "A retraction by a named
  admin is a later event; nothing is deleted."

Who decided what, and when, is kept in ``memory_reviews``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from memory.belief_revision import BeliefReviser, RevisionOutcome
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError, new_run_id
from memory.writer import MemoryWriter
from pairing.principal import Principal, is_human_admin

REFUSE_REVIEW = "Reviewing learned facts requires an administrator; nothing was changed."
REFUSE_RETRACT = "Retracting an operational note requires an administrator; nothing was changed."
MAX_LISTED = 50

REVIEW_LEARNED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": ["list", "confirm", "reject"],
            "description": "list: the quarantined facts; confirm/reject: decide one by its id.",
        },
        "id": {"type": "string", "description": "The record id (m_...) for confirm or reject."},
        "reason": {"type": "string", "description": "Why it is rejected (optional)."},
    },
    "required": ["action"],
    "additionalProperties": False,
}
"""JSON schema of the ``review_learned`` tool's arguments."""

REVIEW_LEARNED_DESCRIPTION = (
    "Administrators only: review facts learned without admin trust (quarantined as unverified). "
    "action='list' shows them with their evidence; 'confirm' with an id makes one live; "
    "'reject' with an id keeps it out for good."
)


def authorize_review(principal: Principal) -> str | None:
    """Why ``principal`` may not review learned facts, or None (human admins only)."""
    return None if is_human_admin(principal) else REFUSE_REVIEW


class Confirmed(Struct, frozen=True):
    """What a confirm did: the record as it now stands, what it retired, and its belief revision."""

    record: MemoryRecordView
    retired: tuple[str, ...]
    revision: RevisionOutcome | None
    run_id: str

    def text(self) -> str:
        """What the admin is told."""
        r = self.record
        if r.status == "superseded":
            return (
                f"Confirmed {r.id}. It was said {r.said_at:%Y-%m-%d}, before the current value "
                f"({r.superseded_by}), so it is kept as history and replaces nothing."
            )
        retired = list(self.retired) + (list(self.revision.retired) if self.revision else [])
        text = f"Confirmed {r.id} ('{r.subject}'): it is live and used from now on."
        if retired:
            text += f" It replaces {', '.join(dict.fromkeys(retired))} (kept as history)."
        if self.revision and self.revision.replaced_by:
            text += f" A later record replaces it ({self.revision.replaced_by}); it is kept as history."
        return text


async def list_unverified(store: MemoryStore, *, limit: int = 500) -> list[MemoryRecordView]:
    """Quarantined records awaiting review, newest said first."""
    return await store.list_records(statuses=["unverified"], limit=limit)


async def confirm_learned(
    writer: MemoryWriter,
    principal: Principal,
    record_id: str,
    *,
    reviser: BeliefReviser | None = None,
) -> Confirmed:
    """Confirm a quarantined record through the gate (source ``confirm``), then revise beliefs for it.

    Args:
        writer: The gated writer.
        principal: Who confirms (a human admin; anyone else is refused by the gate).
        record_id: The unverified record.
        reviser: Belief revision to run for the record (cause ``confirm``); None
            leaves it to the caller (e.g. a queued job).

    Raises:
        MemoryStoreError: refused by the gate, unknown record, or not awaiting review.
    """
    run_id = new_run_id("cf")
    result = await writer.confirm(principal, record_id, run_id=run_id)
    if result.record is None:
        raise MemoryStoreError(result.decision.message)
    revision = None
    if reviser is not None and result.record.status == "live":
        # policy: "confirming it queues belief revision" -- weighed both ways, by its own said_at.
        revision = await reviser.revise(record_id, cause="confirm", run_id=run_id)
    record = await writer.store.get(record_id) or result.record
    return Confirmed(record, result.retired, revision, run_id)


async def reject_learned(
    writer: MemoryWriter, principal: Principal, record_id: str, *, reason: str = ""
) -> MemoryRecordView:
    """Reject a quarantined record: it is kept as ``rejected``, never used, never deleted.

    Raises:
        MemoryStoreError: refused, unknown record, or not awaiting review.
    """
    if authorize_review(principal):
        raise MemoryStoreError(REFUSE_REVIEW)
    result = await writer.reject(principal, record_id, reason=reason)
    if result.record is None:
        raise MemoryStoreError(result.decision.message)
    return result.record


async def retract_note(store: MemoryStore, principal: Principal, record_id: str, *, reason: str) -> MemoryRecordView:
    """Retract a live agent note, by a named human admin, with a reason; nothing is deleted.

    Raises:
        MemoryStoreError: not an admin, unknown record, not a live agent note, or no reason.
    """
    if not is_human_admin(principal) or not principal.user_id:
        raise MemoryStoreError(REFUSE_RETRACT)
    return await store.retract(record_id, by_user_id=principal.user_id, reason=reason)


def _line(r: MemoryRecordView) -> str:
    who = r.author_user_id or "unknown"
    if r.author_role:
        who += f" ({r.author_role})"
    evidence = ", ".join(r.evidence) if r.evidence else "none"
    held = f"; held because: {r.status_reason}" if r.status_reason else ""
    return (
        f"- {r.id} [{r.subject}] {r.content} (said {r.said_at:%Y-%m-%d %H:%M} UTC by {who}; "
        f"source {r.source}; session {r.session_id or '-'}; evidence: {evidence}{held})"
    )


async def review_learned(
    writer: MemoryWriter,
    principal: Principal,
    args: Mapping[str, Any],
    *,
    reviser: BeliefReviser | None = None,
) -> str:
    """The ``review_learned`` tool: list quarantined facts, or confirm / reject one (human admins only).

    Returns:
        The text the admin (or the model) sees; a refusal for anyone else.
    """
    refusal = authorize_review(principal)
    if refusal:
        return refusal
    action = str(args.get("action") or "list").strip().lower()
    if action == "list":
        pending = await list_unverified(writer.store)
        if not pending:
            return "Nothing is awaiting review."
        shown = pending[:MAX_LISTED]
        more = f"\n({len(pending) - len(shown)} more not shown.)" if len(pending) > len(shown) else ""
        return f"{len(pending)} learned fact(s) await review:\n" + "\n".join(_line(r) for r in shown) + more
    record_id = str(args.get("id") or "").strip()
    if action not in ("confirm", "reject"):
        return f"error: unknown action {action!r}; use list, confirm or reject."
    if not record_id:
        return f"error: give the id of the record to {action}."
    try:
        if action == "confirm":
            return (await confirm_learned(writer, principal, record_id, reviser=reviser)).text()
        rejected = await reject_learned(writer, principal, record_id, reason=str(args.get("reason") or ""))
    except MemoryStoreError as exc:
        return f"error: {exc}. Nothing was changed."
    return f"Rejected {rejected.id}: it is kept as rejected and never used."
