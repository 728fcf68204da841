"""Audit and undo: every retirement is a ``memory_revisions`` row, and an admin can take it back.

policy: "Every retirement -- by a subject rule, by the judge, or by a
consolidation merge -- is a row in memory_revisions ... An admin undoes one
record (``goclaw memory revisions undo <id>``) or a whole run (``--run``). The
record returns to the prompt, and the undone row stands as a veto: the same
record never replaces the same record again, whichever rule or judge proposes
it. The replacing record is left in place; if it is wrong, it is deleted
separately."

The rows are written by the store (``MemoryStore._retire``, the one place a
record is retired); this module lists them and undoes them, for human admins
only (:func:`authorize_undo`). The veto itself is enforced by the store on
every retirement.
"""

from __future__ import annotations

from memory.store import MemoryStore, MemoryStoreError, RevisionView, Undone
from pairing.principal import Principal, is_human_admin

REFUSE_UNDO = "Undoing a memory revision requires an administrator; nothing was changed."


class UndoRefused(MemoryStoreError):
    """The principal may not undo revisions (only human admins may)."""


def authorize_undo(principal: Principal) -> str | None:
    """Why ``principal`` may not undo a revision, or None when they may (human admins only).

    Autonomous runs are not admins (policy: ``isHumanAdmin`` excludes them), so
    no run can take back what an admin's knowledge replaced.
    """
    return None if is_human_admin(principal) else REFUSE_UNDO


def _who(principal: Principal) -> str:
    return principal.user_id or principal.display_name or "unknown"


async def list_revisions(store: MemoryStore, *, run_id: str | None = None, limit: int = 1000) -> list[RevisionView]:
    """Revision rows, newest first; one run's if ``run_id`` is given."""
    return await store.list_revisions(run_id=run_id, limit=limit)


async def undo_revision(store: MemoryStore, revision_id: str, *, principal: Principal) -> Undone:
    """Undo one retirement: the retired record returns to live, the row becomes a veto.

    Raises:
        UndoRefused: ``principal`` is not a human admin.
        MemoryStoreError: unknown revision, already undone, or its record has
            moved on since; nothing is changed.
    """
    refusal = authorize_undo(principal)
    if refusal:
        raise UndoRefused(refusal)
    return await store.undo(revision_id=revision_id, by=_who(principal))


async def undo_revision_run(store: MemoryStore, run_id: str, *, principal: Principal) -> Undone:
    """Undo every retirement of one run (a relearn, a belief revision, a consolidation), in one transaction.

    Rows of the run that were undone before are left as they are.

    Raises:
        UndoRefused: ``principal`` is not a human admin.
        MemoryStoreError: unknown run, or every row already undone; nothing is changed.
    """
    refusal = authorize_undo(principal)
    if refusal:
        raise UndoRefused(refusal)
    return await store.undo(run_id=run_id, by=_who(principal))


undo_run = undo_revision_run
"""Alias of :func:`undo_revision_run`."""
