"""Explicit writes and reads: ``memory_write``, ``memory_search`` and the ``@notes:`` directive.

Plain async functions over the writer/store, for the gateway to wrap as LLM
tools and as the directive handler. Each returns the text the person (or the
model) sees. Every write goes through the one gate (``MemoryWriter``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from memory.models import SCOPES
from memory.rules import operational_subject
from memory.store import MemoryRecordView, MemoryStore
from memory.writer import MemoryWriter
from pairing.principal import Principal, is_human_admin

DEFAULT_MAX_CHARS = 2000

MEMORY_WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scope": {
            "type": "string",
            "enum": list(SCOPES),
            "description": (
                "personal: a fact about the person you are talking to (their own memory). "
                "agent_notes: the organisation's operational knowledge (administrators only). "
                "global / agent_config: the agent's identity, never written here, by anyone: "
                "propose a change with propose_policy_change."
            ),
        },
        "subject": {"type": "string", "description": "A short, stable topic, e.g. 'report data source'."},
        "content": {"type": "string", "description": "The fact, written so it can be acted on later."},
    },
    "required": ["scope", "subject", "content"],
    "additionalProperties": False,
}
"""JSON schema of the ``memory_write`` tool's arguments."""

MEMORY_WRITE_DESCRIPTION = (
    "Save a fact to memory. Use scope='personal' for facts about the person you are talking to; "
    "agent_notes (operational knowledge) can be written only by administrators."
)

MEMORY_SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "Words to look for."}},
    "required": ["query"],
    "additionalProperties": False,
}
"""JSON schema of the ``memory_search`` tool's arguments."""

MEMORY_SEARCH_DESCRIPTION = (
    "Search memory: your operational notes and the current person's own memory, including older "
    "values that were replaced, each with its date and status."
)

_NOTES = re.compile(r"^\s*@notes\s*:", re.IGNORECASE)


async def memory_write(
    writer: MemoryWriter,
    principal: Principal,
    args: Mapping[str, Any],
    *,
    said_at: datetime,
    session_id: str | None,
    message_id: str | None,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str:
    """The ``memory_write`` tool: save one fact to a scope, if the gate allows it.

    Returns:
        What was saved (and what it replaced), or an error/refusal a person can act on.
    """
    scope = str(args.get("scope") or "").strip()
    if scope not in SCOPES:
        return f"error: unknown scope {scope!r}; use one of: {', '.join(SCOPES)}. Nothing was saved."
    content = str(args.get("content") or "").strip()
    if not content:
        return "error: content is empty. Nothing was saved."
    if len(content) > max_chars:
        return f"error: content is {len(content)} characters; the limit is {max_chars}. Nothing was saved."
    subject = str(args.get("subject") or "").strip() or (
        operational_subject(content) if scope == "agent_notes" else content[:60]
    )
    result = await writer.write(
        principal,
        scope,
        "memory_write",
        subject=subject,
        content=content,
        said_at=said_at,
        owner_user_id=principal.user_id if scope == "personal" else None,
        session_id=session_id,
        evidence=[message_id] if message_id else [],
    )
    if result.record is None:
        return result.decision.message
    if result.duplicate:
        return f"Already remembered ({result.record.id}, subject '{result.record.subject}'); nothing new was saved."
    return _saved(result.record, result.retired)


def _saved(record: MemoryRecordView, retired: tuple[str, ...]) -> str:
    where = "your personal memory" if record.scope == "personal" else record.scope
    text = f"Saved to {where} ({record.id}, subject '{record.subject}')."
    if retired:
        text += f" It replaces {', '.join(retired)} (kept as history)."
    if record.status == "superseded":
        text += f" A newer value on this subject is current ({record.superseded_by}); this one is kept as history."
    if record.review_by is not None:
        text += f" Review by {record.review_by:%Y-%m-%d}."
    return text


async def handle_notes_directive(
    writer: MemoryWriter,
    principal: Principal,
    text: str,
    *,
    said_at: datetime,
    session_id: str | None,
    message_id: str | None,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str | None:
    """Handle a message that starts with ``@notes:``.

    Admins: the rest is saved to agent_notes and the reply confirms it. Anyone
    else (regular users, unpaired senders, autonomous runs, whatever
    ``memory.write_access`` lists): refused, nothing saved.

    Returns:
        The reply, or None when the text is not a directive.
    """
    match = _NOTES.match(text)
    if not match:
        return None
    content = text[match.end() :].strip()
    decision = writer.decide(principal, "agent_notes", "directive")
    if not decision.writes:
        # policy: "`@notes:` is for admins only" -- "operational changes require an administrator".
        return decision.message
    if not content:
        return "Nothing to note: write @notes: followed by the fact to remember."
    if len(content) > max_chars:
        return f"That note is {len(content)} characters; the limit is {max_chars}. Nothing was saved."
    result = await writer.write(
        principal,
        "agent_notes",
        "directive",
        subject=operational_subject(content),
        content=content,
        said_at=said_at,
        session_id=session_id,
        evidence=[message_id] if message_id else [],
    )
    if result.record is None:
        return result.decision.message
    if result.duplicate:
        return f"Already noted ({result.record.id}); nothing new was saved."
    return "Noted. " + _saved(result.record, result.retired)


def _line(record: MemoryRecordView, now: datetime) -> str:
    who = record.author_user_id or "unknown"
    if record.author_role:
        who += f" ({record.author_role})"
    status = record.effective_status(now)
    extra = f"; review by {record.review_by:%Y-%m-%d}" if record.review_by and record.scope == "agent_notes" else ""
    if status == "superseded" and record.superseded_by:
        extra += f"; replaced by {record.superseded_by}"
    return (
        f"- [{record.scope}] {record.subject}: {record.content} "
        f"(said {record.said_at:%Y-%m-%d} by {who}; {status}{extra}; {record.id})"
    )


async def memory_search(store: MemoryStore, principal: Principal, args: Mapping[str, Any], *, limit: int = 20) -> str:
    """The ``memory_search`` tool: the speaker's own personal memory and agent_notes, history included.

    Personal memory is searched only for a paired person, and only their own;
    autonomous runs and unpaired senders see operational notes only. Quarantined
    (``unverified``) and rejected records are shown to admins only.
    """
    query = str(args.get("query") or "").strip()
    if not query:
        return "error: give a query (words to look for)."
    statuses = ["live", "superseded", "retracted", "expired"]
    if is_human_admin(principal):
        statuses += ["unverified", "rejected"]
    owner = principal.user_id if principal.is_human else None
    found = await store.search(
        query,
        scopes=("personal", "agent_notes"),
        owner_user_id=owner,
        statuses=statuses,
        limit=limit,
    )
    if not found:
        return f"No memory matches {query!r}."
    now = store.now()
    return f"{len(found)} memory record(s) match {query!r}:\n" + "\n".join(_line(r, now) for r in found)
