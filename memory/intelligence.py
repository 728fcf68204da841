"""Intelligence: findings reported by research SOP runs, and the pure router over them.

Seed 001: "Intelligence raises an obligation and never replans." A research
run calls ``report_intelligence``; the tool validates the fields, the host
stamps the SOP, run and time, and it appends a signal -- nothing else. The
router (:func:`route`, pure) then decides what each signal means:

1. the severity is derived: the reported one, raised by the policy's floors,
   which are tested against the subject, observation and rationale -- never the
   claim (the shipped floors raise anything naming an invariant ``INV-nnn`` or
   the identity scopes to at least ``blocking``);
2. below the owed line (``advisory`` and up is owed) it is noted, with why it
   raised nothing;
3. a finding whose ``expires_at`` has passed when it is routed is noted as
   expired and raises nothing;
4. otherwise one obligation per affected SOP, or one on the reporting SOP when
   none is named;
5. at or above ``blocks_at`` (default ``blocking``) each obligation holds its SOP.

``memory.obligations`` stores signals and obligations and applies the outcomes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from msgspec import Struct, field

from memory.facts_models import CONFIDENCES, SEVERITIES

MAX_FIELD_CHARS = 2000
MAX_EVIDENCE = 20
MAX_AFFECTED = 20
_SOP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# A report may say it was observed a little ahead of the host's clock (clock skew), not more.
_FUTURE_SLACK = timedelta(minutes=5)

REFUSE_REPORT = (
    "report_intelligence is only for runs of research SOPs (an SOP with research: true); nothing was recorded."
)

REPORT_INTELLIGENCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "subject": {"type": "string", "description": "What the finding is about: a dependency, a platform, ..."},
        "claim": {"type": "string", "description": "The finding, in one or two sentences."},
        "observation": {"type": "string", "description": "What was read or measured that supports the claim."},
        "evidence": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "At least one reference: the files, versions, pages or dates the claim rests on.",
        },
        "confidence": {"type": "string", "enum": list(CONFIDENCES)},
        "reported_severity": {"type": "string", "enum": list(SEVERITIES)},
        "affected_sops": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The SOP names the finding bears on; empty if none.",
        },
        "rationale": {"type": "string", "description": "Why this severity (optional)."},
        "observed_at": {"type": "string", "description": "ISO time it was observed (default: now)."},
        "expires_at": {"type": "string", "description": "ISO time it stops being current (optional)."},
    },
    "required": ["subject", "claim", "observation", "evidence", "confidence", "reported_severity"],
    "additionalProperties": False,
}
REPORT_INTELLIGENCE_DESCRIPTION = (
    "Report a finding that bears on work in progress (research SOP runs only). It is appended as a "
    "signal; the router decides whether it raises obligations on the affected SOPs. It changes nothing else."
)


def severity_rank(severity: str) -> int:
    """The order of severities: info < advisory < blocking < critical."""
    return SEVERITIES.index(severity)


class Floor(Struct, frozen=True):
    """A policy floor: a finding whose subject, observation or rationale matches is at least ``at_least``."""

    pattern: str
    at_least: str = "blocking"
    why: str = ""

    def matches(self, *texts: str) -> bool:
        """True when the (case-insensitive) pattern is found in any of ``texts``."""
        rx = re.compile(self.pattern, re.IGNORECASE)
        return any(rx.search(t) for t in texts)


SHIPPED_FLOORS: tuple[Floor, ...] = (
    Floor(r"\bINV-\d{3}\b", "blocking", "names an invariant"),
    Floor(r"\b(?:global|agent_config|identity)\b", "blocking", "names the agent's identity"),
)


class RoutingPolicy(Struct, frozen=True):
    """The routing policy (config ``intelligence``)."""

    floors: tuple[Floor, ...] = SHIPPED_FLOORS
    owed_at: str = "advisory"
    blocks_at: str = "blocking"


class Report(Struct, frozen=True):
    """The fields the model supplies, validated."""

    subject: str
    claim: str
    observation: str
    evidence: tuple[str, ...]
    confidence: str
    reported_severity: str
    affected_sops: tuple[str, ...] = ()
    rationale: str = ""
    observed_at: datetime | None = None
    expires_at: datetime | None = None


class SignalView(Struct, frozen=True):
    """A stored signal: the report plus what the host stamped."""

    id: str
    sop_name: str
    run_id: str
    reporter: str
    subject: str
    claim: str
    observation: str
    rationale: str
    evidence: tuple[str, ...]
    confidence: str
    reported_severity: str
    affected_sops: tuple[str, ...]
    observed_at: datetime
    expires_at: datetime | None
    recorded_at: datetime

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "sop": self.sop_name,
            "run_id": self.run_id,
            "reporter": self.reporter,
            "subject": self.subject,
            "claim": self.claim,
            "observation": self.observation,
            "rationale": self.rationale,
            "evidence": list(self.evidence),
            "confidence": self.confidence,
            "reported_severity": self.reported_severity,
            "affected_sops": list(self.affected_sops),
            "observed_at": self.observed_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "recorded_at": self.recorded_at.isoformat(),
        }


class Routing(Struct, frozen=True):
    """What the router decided for one signal."""

    signal_id: str
    severity: str
    outcome: str  # noted | expired | raised
    reason: str
    floors: tuple[str, ...] = ()
    obligations: tuple[tuple[str, bool], ...] = field(default=())
    """(sop name, blocks) for each obligation to open."""

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "signal_id": self.signal_id,
            "severity": self.severity,
            "outcome": self.outcome,
            "reason": self.reason,
            "floors": list(self.floors),
            "obligations": [{"sop": sop, "blocks": blocks} for sop, blocks in self.obligations],
        }


class ReportError(ValueError):
    """A report the tool refuses; the message says what to fix."""


def _text(args: Mapping[str, Any], name: str, *, required: bool = True) -> str:
    value = args.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise ReportError(f"{name} is required")
        return ""
    if not isinstance(value, str):
        raise ReportError(f"{name} must be a string")
    value = " ".join(value.split()) if name == "subject" else value.strip()
    if len(value) > MAX_FIELD_CHARS:
        raise ReportError(f"{name} is {len(value)} characters; the limit is {MAX_FIELD_CHARS}")
    return value


def _strings(args: Mapping[str, Any], name: str, limit: int) -> tuple[str, ...]:
    value = args.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ReportError(f"{name} must be a list of strings")
    items = tuple(dict.fromkeys(v.strip() for v in value if v.strip()))
    if len(items) > limit:
        raise ReportError(f"{name} has {len(items)} entries; at most {limit}")
    if any(len(v) > MAX_FIELD_CHARS for v in items):
        raise ReportError(f"an entry of {name} is longer than {MAX_FIELD_CHARS} characters")
    return items


def _time(args: Mapping[str, Any], name: str) -> datetime | None:
    value = args.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise ReportError(f"{name} must be an ISO date or time, e.g. 2026-12-31 or 2026-12-31T09:00:00Z")
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"{name} {value!r} is not an ISO date or time, e.g. 2026-12-31T09:00:00Z") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def parse_report(args: Mapping[str, Any], *, now: datetime) -> Report:
    """Validate ``report_intelligence`` arguments (pure).

    Raises:
        ReportError: a missing or malformed field, named.
    """
    evidence = _strings(args, "evidence", MAX_EVIDENCE)
    if not evidence:
        raise ReportError("evidence needs at least one reference (a file, version, page or date)")
    confidence = _text(args, "confidence").lower()
    if confidence not in CONFIDENCES:
        raise ReportError(f"confidence must be one of {', '.join(CONFIDENCES)}, not {confidence!r}")
    severity = _text(args, "reported_severity").lower()
    if severity not in SEVERITIES:
        raise ReportError(f"reported_severity must be one of {', '.join(SEVERITIES)}, not {severity!r}")
    affected = _strings(args, "affected_sops", MAX_AFFECTED)
    bad = [a for a in affected if not _SOP_NAME.match(a)]
    if bad:
        raise ReportError(f"affected_sops: {bad[0]!r} is not an SOP name (letters, digits, '-', '_', '.')")
    observed = _time(args, "observed_at")
    if observed is not None and observed > now + _FUTURE_SLACK:
        raise ReportError(f"observed_at {observed.isoformat()} is in the future")
    return Report(
        subject=_text(args, "subject")[:200],
        claim=_text(args, "claim"),
        observation=_text(args, "observation"),
        evidence=evidence,
        confidence=confidence,
        reported_severity=severity,
        affected_sops=affected,
        rationale=_text(args, "rationale", required=False),
        observed_at=observed,
        expires_at=_time(args, "expires_at"),
    )


def derive_severity(signal: SignalView, policy: RoutingPolicy) -> tuple[str, tuple[str, ...]]:
    """The reported severity raised by every floor that matches; and why (the floors that raised it).

    Seed 001: floors "are tested against the message's subject, observation and
    rationale (the claim is not tested)".
    """
    severity = signal.reported_severity
    raised: list[str] = []
    for floor in policy.floors:
        if not floor.matches(signal.subject, signal.observation, signal.rationale):
            continue
        if severity_rank(floor.at_least) > severity_rank(severity):
            severity = floor.at_least
            raised.append(f"{floor.why or floor.pattern} -> at least {floor.at_least}")
    return severity, tuple(raised)


def route_one(signal: SignalView, policy: RoutingPolicy, now: datetime) -> Routing:
    """Route one signal (pure): the derived severity, and noted, expired, or the obligations to open."""
    severity, floors = derive_severity(signal, policy)
    because = f" ({'; '.join(floors)})" if floors else ""
    if severity_rank(severity) < severity_rank(policy.owed_at):
        return Routing(
            signal.id,
            severity,
            "noted",
            f"{severity} is below the owed line ({policy.owed_at} and up raise obligations): noted, raised nothing",
            floors,
        )
    if signal.expires_at is not None and signal.expires_at <= now:
        return Routing(
            signal.id,
            severity,
            "expired",
            f"expired at {signal.expires_at:%Y-%m-%d %H:%M} UTC before it was routed: stale evidence raises nothing",
            floors,
        )
    # One obligation per affected SOP, so each hold lands on the SOP it concerns; none named:
    # on the reporting SOP itself.
    targets = list(dict.fromkeys(signal.affected_sops)) or [signal.sop_name]
    blocks = severity_rank(severity) >= severity_rank(policy.blocks_at)
    hold = f"; holds at {policy.blocks_at} and up" if blocks else "; owed, holds nothing"
    return Routing(
        signal.id,
        severity,
        "raised",
        f"{severity}{because}: one obligation on each of {', '.join(targets)}{hold}",
        floors,
        tuple((t, blocks) for t in targets),
    )


def route(signals: Sequence[SignalView], policy: RoutingPolicy, now: datetime) -> list[Routing]:
    """Route unrouted signals in the order they were recorded (pure)."""
    ordered = sorted(signals, key=lambda s: (s.recorded_at, s.id))
    return [route_one(s, policy, now) for s in ordered]
