"""Operational memory as dated facts: review-by, scope, and who sees which entry.

Seed 001 ("Operational memory"): an entry holds a subject, a note, evidence,
an optional scope and a ``review_by`` date, which "is required, in the future
and at most 90 days out"; the host stamps who, when and the session/run.
"When reviewBy passes, the entry is expired. The read model still shows it,
and no unit receives it." "An entry with a scope is rendered only to units of
those types, and an entry without a scope is rendered to every unit ... A
session run by hand ... sees every current entry, scoped or not."

In the gateway a "unit" is an SOP run (``gateway.turn.RunContext``: its SOP
name and scope tags), and a run by hand is ``goclaw chat``. These functions
are pure; the store refuses an entry :func:`review_by_problem` objects to, and
rendering and ``memory_search`` keep only what :func:`applies` allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time, timedelta

from msgspec import Struct

MAX_REVIEW_DAYS = 90
"""Seed 001: review-by is at most 90 days out (a fact meant to hold longer is a rule: propose it)."""

REVIEW_BY_HELP = "an ISO date like 2027-01-15, or days from now like 30d; in the future, at most 90 days out"
_DAYS = re.compile(r"^\s*(?P<n>[+-]?\d{1,6})\s*d(?:ays?)?\s*$", re.IGNORECASE)
MAX_SCOPE_NAMES = 20
MAX_SCOPE_CHARS = 100


class ReviewByError(ValueError):
    """A review-by date that is missing, unreadable, in the past or too far out; the message says which."""


def days_out(review_by: datetime, now: datetime) -> int:
    """Whole calendar days from ``now`` to ``review_by`` (UTC dates)."""
    return (review_by.astimezone(UTC).date() - now.astimezone(UTC).date()).days


def review_by_problem(review_by: datetime | None, now: datetime) -> str | None:
    """Why the store refuses this review-by, or None when it is in the future and at most 90 days out."""
    if review_by is None:
        return f"review_by is required for an operational note: {REVIEW_BY_HELP}"
    if review_by.tzinfo is None:
        return "review_by must be timezone-aware (UTC)"
    if review_by <= now:
        return f"review_by {review_by:%Y-%m-%d} is not in the future; a fact already stale is not worth recording"
    out = days_out(review_by, now)
    if out > MAX_REVIEW_DAYS:
        return f"review_by {review_by:%Y-%m-%d} is {out} days out; at most {MAX_REVIEW_DAYS}"
    return None


def parse_review_by(value: str | date | datetime, now: datetime) -> datetime:
    """Read a review-by as the tools and ``@notes[...]`` take it, and check it (no clamping).

    ``30d`` is 30 days from ``now``; an ISO date ``2027-01-15`` is the start of
    that day (UTC): the fact is current until then; an ISO time is taken as is.

    Raises:
        ReviewByError: unreadable, not in the future, or more than 90 days out.
    """
    at: datetime
    if isinstance(value, datetime):
        at = value if value.tzinfo else value.replace(tzinfo=UTC)
    elif isinstance(value, date):
        at = datetime.combine(value, time(0), tzinfo=UTC)
    else:
        text = str(value).strip()
        days = _DAYS.match(text)
        if days:
            at = now + timedelta(days=int(days.group("n")))
        else:
            try:
                at = datetime.combine(date.fromisoformat(text), time(0), tzinfo=UTC)
            except ValueError:
                try:
                    at = datetime.fromisoformat(text)
                except ValueError:
                    raise ReviewByError(f"review_by {text!r} is not a date: {REVIEW_BY_HELP}") from None
                at = at if at.tzinfo else at.replace(tzinfo=UTC)
    problem = review_by_problem(at, now)
    if problem:
        raise ReviewByError(problem)
    return at


def is_expired(review_by: datetime | None, now: datetime) -> bool:
    """True when a note's review-by has passed (a note with none never expires: older records)."""
    return review_by is not None and review_by <= now


def clean_scope(names: Iterable[str] | None) -> tuple[str, ...]:
    """SOP names / tags an entry is scoped to: trimmed, lowercased, distinct, sorted; () is unscoped.

    Raises:
        ValueError: too many names, or one too long.
    """
    out: set[str] = set()
    for raw in names or ():
        name = " ".join(str(raw).split()).lower()
        if not name:
            continue
        if len(name) > MAX_SCOPE_CHARS:
            raise ValueError(f"scope name {name[:20]!r}... is longer than {MAX_SCOPE_CHARS} characters")
        out.add(name)
    if len(out) > MAX_SCOPE_NAMES:
        raise ValueError(f"a note can be scoped to at most {MAX_SCOPE_NAMES} SOP names or tags")
    return tuple(sorted(out))


class Audience(Struct, frozen=True):
    """Who a prompt is for, as far as scoped notes are concerned.

    ``sop_name``/``tags``: an SOP run (its name and scope tags); both empty: a
    person's conversation; ``everything``: a run by hand (``goclaw chat``).
    """

    sop_name: str | None = None
    tags: tuple[str, ...] = ()
    everything: bool = False

    @property
    def names(self) -> frozenset[str]:
        """The lowercased SOP name and tags this audience answers to."""
        return frozenset(clean_scope([*([self.sop_name] if self.sop_name else []), *self.tags]))


CONVERSATION = Audience()
"""A person's conversation: unscoped notes only."""
BY_HAND = Audience(everything=True)
"""A run by hand (``goclaw chat``): every current note, scoped or not."""


def applies(scope: Sequence[str], audience: Audience) -> bool:
    """Whether a note scoped to ``scope`` is for ``audience``.

    Unscoped -> everyone; scoped -> only runs of those SOPs (by name or tag),
    and a run by hand.
    """
    if not scope or audience.everything:
        return True
    return bool(audience.names & set(scope))
