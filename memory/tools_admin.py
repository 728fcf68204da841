"""Admin tools for the model: ``review_learned`` and ``notes_distill``.

Plain async functions for the gateway to wrap as LLM tools (like
``memory.tools``), each with its JSON schema, a description, and an
``authorize_*(principal) -> str | None`` that says why a principal may not use
it (human admins only: an autonomous run is never an admin). Each function
checks its own authorization too, so a tool wired without ``authorize`` still
refuses.

Wiring (in the gateway)::

    Tool("review_learned", REVIEW_LEARNED_DESCRIPTION, REVIEW_LEARNED_SCHEMA,
         lambda p, a: review_learned(writer, p, a, reviser=reviser), authorize_review_learned)
    Tool("notes_distill", NOTES_DISTILL_DESCRIPTION, NOTES_DISTILL_SCHEMA,
         lambda p, a: notes_distill(p, a, run=scheduler.notes_distill), authorize_notes_distill)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from memory.review import (
    REVIEW_LEARNED_DESCRIPTION,
    REVIEW_LEARNED_SCHEMA,
    authorize_review,
    review_learned,
)
from pairing.principal import Principal, is_human_admin

REFUSE_DISTILL = "Merging operational notes on request requires an administrator."

NOTES_DISTILL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}
"""JSON schema of the ``notes_distill`` tool's arguments (none)."""

NOTES_DISTILL_DESCRIPTION = (
    "Administrators only: merge operational notes that say the same thing into one now "
    "(a consolidation run; each merge can be undone with 'goclaw memory revisions undo --run')."
)

DistillRun = Callable[[Principal], Awaitable[str]]
"""Runs one consolidation as the given principal and returns its summary (``Scheduler.notes_distill``)."""


def authorize_review_learned(principal: Principal) -> str | None:
    """Why ``principal`` may not use ``review_learned``, or None (human admins only)."""
    return authorize_review(principal)


def authorize_notes_distill(principal: Principal) -> str | None:
    """Why ``principal`` may not use ``notes_distill``, or None (human admins only)."""
    return None if is_human_admin(principal) else REFUSE_DISTILL


async def notes_distill(principal: Principal, args: Mapping[str, Any], *, run: DistillRun) -> str:
    """The ``notes_distill`` tool: one consolidation run now, as the asking admin.

    Args:
        principal: Who asks (a human admin; anyone else is refused).
        args: The tool's arguments (none are used).
        run: Runs the consolidation (the scheduler's, which holds the singleton lock).
    """
    del args
    refusal = authorize_notes_distill(principal)
    if refusal:
        return refusal
    return await run(principal)


__all__ = [
    "NOTES_DISTILL_DESCRIPTION",
    "NOTES_DISTILL_SCHEMA",
    "REVIEW_LEARNED_DESCRIPTION",
    "REVIEW_LEARNED_SCHEMA",
    "DistillRun",
    "authorize_notes_distill",
    "authorize_review_learned",
    "notes_distill",
    "review_learned",
]
