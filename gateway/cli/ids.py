"""Ids as the operator types them: a whole id, or a unique prefix of at least 6 characters.

Tables print ids whole (never cut), and every CLI command that takes an id
resolves it here first, so what is copied from one command works in the next.
The decision is pure (:func:`choose`); the lookup (:func:`resolve_id`) is one
indexed ``LIKE 'prefix%'`` query on the id column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.errors import GoclawError

MIN_PREFIX = 6
_SHOWN = 5  # candidates named in an "ambiguous" error


class IdError(GoclawError):
    """An id that matches no row, or several."""


def choose(given: str, matches: Sequence[str], *, kind: str, hint: str) -> str:
    """The one id ``given`` stands for among the ids that start with it.

    Args:
        given: what the operator typed.
        matches: ids in the table that start with ``given`` (the exact id included, if it exists).
        kind: what an id names, for the error ("memory record", "user").
        hint: the command that lists them, for the error.

    Raises:
        IdError: no such id, a prefix shorter than :data:`MIN_PREFIX`, or an ambiguous prefix.
    """
    if given in matches:
        return given
    if not matches:
        raise IdError(f"no {kind} {given}: see '{hint}'")
    if len(given) < MIN_PREFIX:
        raise IdError(f"{given!r} is too short to stand for a {kind}: give at least {MIN_PREFIX} characters of the id")
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:_SHOWN]) + (", ..." if len(matches) > _SHOWN else "")
        count = f"more than {_SHOWN}" if len(matches) > _SHOWN else str(len(matches))
        raise IdError(f"{given!r} matches {count} {kind}s ({shown}): give more characters")
    return matches[0]


def _like_prefix(given: str) -> str:
    # The id alphabets have no % or _ besides the kind's own "m_", so escape both.
    return given.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


async def resolve_id(engine: AsyncEngine, columns: Sequence[Any], given: str, *, kind: str, hint: str) -> str:
    """The full id in any of ``columns`` that ``given`` (an id or a unique prefix) names.

    Raises:
        IdError: see :func:`choose`.
    """
    given = given.strip()
    matches: set[str] = set()
    async with engine.connect() as conn:
        for column in columns:
            rows = await conn.execute(
                select(column)
                .distinct()
                .where(column.like(_like_prefix(given), escape="\\"))
                .order_by(column)
                .limit(_SHOWN + 1)
            )
            matches.update(r[0] for r in rows if r[0] is not None)
    return choose(given, sorted(matches), kind=kind, hint=hint)


async def user_id(engine: AsyncEngine, given: str) -> str:
    """A unified user id from an id or a unique prefix."""
    from memory.models import MemoryRecord
    from pairing.models import User

    # Someone may own memory without a users row (the dashboard's "admin"): still a person.
    columns = [User.id, MemoryRecord.owner_user_id]
    return await resolve_id(engine, columns, given, kind="user", hint="goclaw users list")


async def record_id(engine: AsyncEngine, given: str) -> str:
    """A memory record id from an id or a unique prefix."""
    from memory.models import MemoryRecord

    return await resolve_id(engine, [MemoryRecord.id], given, kind="memory record", hint="goclaw memory list --all")


async def revision_id(engine: AsyncEngine, given: str) -> str:
    """A memory revision id from an id or a unique prefix."""
    from memory.models import MemoryRevision

    return await resolve_id(engine, [MemoryRevision.id], given, kind="revision", hint="goclaw memory revisions")


async def proposal_id(engine: AsyncEngine, given: str) -> str:
    """An identity proposal id from an id or a unique prefix."""
    from memory.facts_models import IdentityProposal

    return await resolve_id(
        engine, [IdentityProposal.id], given, kind="proposal", hint="goclaw identity proposals --all"
    )


async def obligation_id(engine: AsyncEngine, given: str) -> str:
    """An obligation id from an id or a unique prefix."""
    from memory.facts_models import Obligation

    return await resolve_id(engine, [Obligation.id], given, kind="obligation", hint="goclaw obligations --all")
