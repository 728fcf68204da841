"""Schedule arithmetic: pure functions of a trigger and the time.

Cron expressions are parsed by croniter (5 fields, evaluated in the SOP's time
zone, so 07:00 Europe/Berlin stays 07:00 across daylight saving); ``every`` is
an interval anchored on the previous due time; ``at`` is one instant.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from msgspec import Struct

CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
_CRON_RANGES = ("0-59", "0-23", "1-31", "1-12 or jan-dec", "0-7 or sun-sat")
_EVERY = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
MIN_EVERY = timedelta(seconds=10)
TIMED_KINDS = ("cron", "every", "at")
TRIGGER_KINDS = ("cron", "every", "at", "manual", "webhook")


def check_cron(expr: str) -> str:
    """``expr`` if it is a valid 5-field cron expression.

    Raises:
        ValueError: naming the field that is wrong (and its allowed range).
    """
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(
            f"cron expression {expr!r} has {len(fields)} field(s); write 5: minute hour day-of-month month day-of-week"
        )
    from croniter import croniter  # here, not at the top: a gateway with no cron SOP never loads it

    # croniter validates the whole expression; each field is checked on its own
    # (the others set to '*') so the error can say which one is wrong.
    for i, value in enumerate(fields):
        probe = ["*"] * 5
        probe[i] = value
        if not croniter.is_valid(" ".join(probe)):
            raise ValueError(
                f"cron expression {expr!r}: the {CRON_FIELDS[i]} field {value!r} is not valid "
                f"(allowed: {_CRON_RANGES[i]}, with * , - /)"
            )
    if not croniter.is_valid(expr):
        raise ValueError(f"cron expression {expr!r} is not valid")
    return expr


def check_tz(name: str) -> ZoneInfo:
    """The time zone called ``name`` (IANA, e.g. Europe/Berlin).

    Raises:
        ValueError: an unknown zone.
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin or UTC") from None


def parse_every(value: str) -> timedelta:
    """An interval such as ``15m``, ``1h30m``, ``2d``, ``45s`` (at least 10 seconds).

    Raises:
        ValueError: not an interval, or shorter than 10 seconds.
    """
    m = _EVERY.match(value.strip().lower()) if value.strip() else None
    if m is None or not any(m.groups()):
        raise ValueError(f"interval {value!r}: write a number with a unit, e.g. 15m, 1h, 1h30m, 2d, 45s")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    delta = timedelta(days=d, hours=h, minutes=mi, seconds=s)
    if delta < MIN_EVERY:
        raise ValueError(f"interval {value!r} is shorter than {int(MIN_EVERY.total_seconds())} seconds")
    return delta


def parse_at(value: str | datetime) -> datetime:
    """An ISO 8601 instant with a UTC offset (``2026-12-01T07:00:00+01:00`` or ``...Z``), in UTC.

    Raises:
        ValueError: not ISO 8601, or without an offset (ambiguous).
    """
    if isinstance(value, datetime):
        when = value
    else:
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"time {value!r} is not ISO 8601; write e.g. 2026-12-01T07:00:00+01:00") from None
    if when.tzinfo is None:
        raise ValueError(f"time {value!s} has no UTC offset; add one, e.g. +01:00 or Z")
    return when.astimezone(UTC)


class Trigger(Struct, frozen=True):
    """A validated trigger: its kind and spec (the stored form)."""

    kind: str  # cron | every | at | manual | webhook
    cron: str | None = None
    tz: str = "UTC"
    every: str | None = None
    at: datetime | None = None

    @property
    def timed(self) -> bool:
        """True for the kinds the scheduler fires (cron, every, at)."""
        return self.kind in TIMED_KINDS

    def spec(self) -> dict[str, object]:
        """The JSON form stored with the SOP."""
        if self.kind == "cron":
            return {"cron": self.cron, "tz": self.tz}
        if self.kind == "every":
            return {"every": self.every}
        if self.kind == "at":
            return {"at": self.at.isoformat() if self.at else None}
        return {self.kind: True}

    def describe(self) -> str:
        """One line for a person: ``cron 0 7 * * 1-5 (Europe/Berlin)``, ``every 15m`` ..."""
        if self.kind == "cron":
            return f"cron {self.cron} ({self.tz})"
        if self.kind == "every":
            return f"every {self.every}"
        if self.kind == "at":
            return f"at {self.at.isoformat() if self.at else '?'}"
        return self.kind

    @classmethod
    def from_spec(cls, kind: str, spec: dict[str, object]) -> Trigger:
        """The inverse of :meth:`spec`."""
        if kind == "cron":
            return cls("cron", cron=str(spec["cron"]), tz=str(spec.get("tz") or "UTC"))
        if kind == "every":
            return cls("every", every=str(spec["every"]))
        if kind == "at":
            return cls("at", at=parse_at(str(spec["at"])))
        return cls(kind)


def make_trigger(
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: str | None = None,
    at: str | datetime | None = None,
    manual: bool = False,
    webhook: bool = False,
) -> Trigger:
    """A trigger from exactly one of its kinds, validated.

    Raises:
        ValueError: none or several kinds, ``tz`` without ``cron``, or a bad value.
    """
    given = [
        k for k, v in (("cron", cron), ("every", every), ("at", at), ("manual", manual), ("webhook", webhook)) if v
    ]
    if len(given) != 1:
        what = "none" if not given else ", ".join(given)
        raise ValueError(f"a trigger needs exactly one of cron, every, at, manual, webhook (got {what})")
    if tz and not cron:
        raise ValueError("tz applies to a cron trigger only")
    kind = given[0]
    if kind == "cron":
        assert cron is not None
        check_tz(tz or "UTC")
        return Trigger("cron", cron=check_cron(" ".join(cron.split())), tz=tz or "UTC")
    if kind == "every":
        assert every is not None
        parse_every(every)
        return Trigger("every", every=every.strip().lower())
    if kind == "at":
        assert at is not None
        return Trigger("at", at=parse_at(at))
    return Trigger(kind)


def first_due(trigger: Trigger, now: datetime) -> datetime | None:
    """The first due time strictly after ``now`` for a new (or newly enabled) SOP; None if never."""
    if trigger.kind == "at":
        return trigger.at if trigger.at is not None and trigger.at > now else None
    return next_after(trigger, now, anchor=now)


def next_after(trigger: Trigger, now: datetime, *, anchor: datetime) -> datetime | None:
    """The first due time strictly after ``now``.

    Args:
        trigger: The SOP's trigger.
        now: The current time (UTC).
        anchor: For ``every``: a due time of the series (intervals count from it).
    """
    if trigger.kind == "cron":
        assert trigger.cron is not None
        tz = check_tz(trigger.tz)
        from croniter import croniter

        nxt = croniter(trigger.cron, now.astimezone(tz)).get_next(datetime)
        return nxt.astimezone(UTC)
    if trigger.kind == "every":
        assert trigger.every is not None
        step = parse_every(trigger.every)
        if anchor > now:
            return anchor
        periods = (now - anchor) // step + 1
        return anchor + step * periods
    return None  # at fires once; manual and webhook are never due


def latest_due(trigger: Trigger, due: datetime, now: datetime) -> datetime:
    """The latest due time of the series starting at ``due`` that is not after ``now`` (``due`` <= ``now``)."""
    if trigger.kind == "cron":
        assert trigger.cron is not None
        tz = check_tz(trigger.tz)
        from croniter import croniter

        # croniter's get_prev is strictly before its start: start a second later so
        # a due time equal to ``now`` counts.
        prev = croniter(trigger.cron, (now + timedelta(seconds=1)).astimezone(tz)).get_prev(datetime).astimezone(UTC)
        return max(prev, due)
    if trigger.kind == "every":
        assert trigger.every is not None
        step = parse_every(trigger.every)
        return due + step * ((now - due) // step)
    return due


class DueDecision(Struct, frozen=True):
    """What the scheduler does for one SOP at one step."""

    due_at: datetime | None  # the due time to claim, None when nothing is due
    run: bool  # run it (False: record it as skipped, catch_up: skip)
    missed: int  # due times that passed without a run (the gateway was down)
    next_due: datetime | None  # what next_due_at becomes


def decide_due(
    trigger: Trigger, next_due: datetime | None, now: datetime, *, catch_up: str, grace: timedelta
) -> DueDecision:
    """Whether a timed SOP is due at ``now``, and what to do about runs missed while down.

    policy (issue 10): ``catch_up: once`` (the default) makes one run for all
    that were missed; ``skip`` runs none of them. A due time is "missed" when
    it is more than ``grace`` in the past (the gateway was not running then).
    """
    if next_due is None or next_due > now:
        return DueDecision(None, False, 0, next_due)
    last = latest_due(trigger, next_due, now)
    late = now - last > grace
    missed = _count(trigger, next_due, last) - (0 if late else 1)
    nxt = next_after(trigger, now, anchor=last)
    if not late:
        return DueDecision(last, True, missed, nxt)
    return DueDecision(last, catch_up == "once", missed, nxt)


def _count(trigger: Trigger, first: datetime, last: datetime, cap: int = 100_000) -> int:
    """How many due times from ``first`` to ``last`` inclusive (capped)."""
    if trigger.kind == "every":
        assert trigger.every is not None
        return int((last - first) // parse_every(trigger.every)) + 1
    if trigger.kind == "cron":
        assert trigger.cron is not None
        tz = check_tz(trigger.tz)
        from croniter import croniter

        it = croniter(trigger.cron, (first - timedelta(seconds=1)).astimezone(tz))
        n = 0
        while n < cap and it.get_next(datetime).astimezone(UTC) <= last:
            n += 1
        return n
    return 1
