"""The pure parts of intelligence: validating a report, deriving severity, routing (seed 001's five steps)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.llm.scripted import scripted_findings
from memory.intelligence import (
    SHIPPED_FLOORS,
    Floor,
    ReportError,
    RoutingPolicy,
    SignalView,
    derive_severity,
    parse_report,
    route,
    route_one,
)
from memory.obligations import authorize_resolve, may_resolve_any
from pairing.principal import Principal, Role

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
POLICY = RoutingPolicy()
GOOD: dict[str, Any] = {
    "subject": "orders export",
    "claim": "The export drops refunds",
    "observation": "vendor/export.py skips negative totals",
    "evidence": ["vendor/export.py:88"],
    "confidence": "high",
    "reported_severity": "advisory",
    "affected_sops": ["daily-report"],
}


def signal(n: int = 1, **changes: Any) -> SignalView:
    fields: dict[str, Any] = {
        "id": f"sg_{n}",
        "sop_name": "vendor-watch",
        "run_id": "run-1",
        "reporter": "sop-system",
        "subject": "orders export",
        "claim": "The export drops refunds",
        "observation": "negative totals skipped",
        "rationale": "",
        "evidence": ("vendor/export.py:88",),
        "confidence": "high",
        "reported_severity": "advisory",
        "affected_sops": ("daily-report",),
        "observed_at": NOW,
        "expires_at": None,
        "recorded_at": NOW + timedelta(seconds=n),
        **changes,
    }
    return SignalView(**fields)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"evidence": []}, "evidence needs at least one reference"),
        ({"evidence": "   "}, "evidence needs at least one reference"),
        ({"claim": ""}, "claim is required"),
        ({"confidence": "certain"}, "confidence must be one of low, medium, high"),
        ({"reported_severity": "urgent"}, "reported_severity must be one of info, advisory, blocking, critical"),
        ({"affected_sops": ["daily report; rm -rf"]}, "is not an SOP name"),
        ({"observed_at": "2027-01-01"}, "is in the future"),
        ({"expires_at": "next week"}, "is not an ISO date or time"),
        ({"evidence": [1, 2]}, "evidence must be a list of strings"),
    ],
)
def test_a_malformed_report_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_report({**GOOD, **change}, now=NOW)


def test_a_good_report_is_parsed_with_defaults() -> None:
    report = parse_report({**GOOD, "expires_at": "2026-12-31", "affected_sops": ["a", "a", "b"]}, now=NOW)
    assert report.affected_sops == ("a", "b")
    assert report.observed_at is None  # the store stamps now
    assert report.expires_at == datetime(2026, 12, 31, tzinfo=UTC)


def test_floors_test_subject_observation_and_rationale_never_the_claim() -> None:
    assert derive_severity(signal(subject="INV-004 helper"), POLICY)[0] == "blocking"
    assert derive_severity(signal(observation="touches agent_config"), POLICY)[0] == "blocking"
    assert derive_severity(signal(rationale="the identity would change"), POLICY)[0] == "blocking"
    assert derive_severity(signal(claim="INV-004 global identity agent_config"), POLICY) == ("advisory", ())
    # A floor only raises: a critical finding stays critical.
    assert derive_severity(signal(reported_severity="critical", subject="INV-001"), POLICY)[0] == "critical"
    custom = RoutingPolicy(floors=(Floor(r"payroll", "critical", "money"),))
    assert derive_severity(signal(subject="Payroll export"), custom) == ("critical", ("money -> at least critical",))


def test_the_five_steps() -> None:
    info = route_one(signal(reported_severity="info"), POLICY, NOW)
    assert (info.outcome, info.obligations) == ("noted", ())
    assert "below the owed line" in info.reason
    stale = route_one(signal(reported_severity="critical", expires_at=NOW - timedelta(minutes=1)), POLICY, NOW)
    assert (stale.outcome, stale.obligations) == ("expired", ())
    fresh = route_one(signal(expires_at=NOW + timedelta(days=1)), POLICY, NOW)
    assert fresh.outcome == "raised"
    two = route_one(signal(affected_sops=("a", "b")), POLICY, NOW)
    assert two.obligations == (("a", False), ("b", False))
    own = route_one(signal(affected_sops=(), reported_severity="blocking"), POLICY, NOW)
    assert own.obligations == (("vendor-watch", True),)
    lower = RoutingPolicy(blocks_at="advisory", owed_at="info")
    assert route_one(signal(reported_severity="info"), lower, NOW).outcome == "raised"
    assert route_one(signal(), lower, NOW).obligations == (("daily-report", True),)


def test_route_is_in_recorded_order_and_pure() -> None:
    signals = [signal(3), signal(1), signal(2)]
    assert [r.signal_id for r in route(signals, POLICY, NOW)] == ["sg_1", "sg_2", "sg_3"]
    assert route(signals, POLICY, NOW) == route(signals, POLICY, NOW)


def test_shipped_floors_name_invariants_and_identity() -> None:
    assert [f.at_least for f in SHIPPED_FLOORS] == ["blocking", "blocking"]
    assert SHIPPED_FLOORS[0].matches("breaks inv-004")
    assert not SHIPPED_FLOORS[0].matches("INV-04 or INV-0042x")


def test_who_may_resolve_is_the_policy_and_the_pairing_role() -> None:
    alice, bob = Principal.human("u_a", Role.ADMIN), Principal.human("u_b", Role.USER)
    policy = {"advisory": ("admin", "user"), "blocking": ("admin",)}
    assert authorize_resolve(alice, "blocking", policy) is None
    assert authorize_resolve(bob, "advisory", policy) is None
    assert "needs role admin" in (authorize_resolve(bob, "blocking", policy) or "")
    assert "needs role admin" in (authorize_resolve(bob, "critical", policy) or "")  # unnamed: admins
    for nobody in (Principal.unpaired(), Principal.system("sop-system")):
        assert "only a paired person" in (authorize_resolve(nobody, "info", policy) or "")
    assert may_resolve_any(bob, policy) and not may_resolve_any(bob)


def test_scripted_finding_lines_become_report_arguments() -> None:
    text = (
        "[sop-system · unpaired] Check the helpers.\n"
        'FINDING severity=blocking affects=daily-report,billing subject="left-pad" claim="It is a modified copy" '
        'evidence="vendor/left-pad.js; diff against 1.3.0" expires=2026-12-31\n'
        "no finding here\n"
        'FINDING severity=info claim="unbalanced'
    )
    first, second = scripted_findings(text)
    assert first == {
        "subject": "left-pad",
        "claim": "It is a modified copy",
        "observation": "It is a modified copy",
        "evidence": ["vendor/left-pad.js", "diff against 1.3.0"],
        "confidence": "medium",
        "reported_severity": "blocking",
        "affected_sops": ["daily-report", "billing"],
        "expires_at": "2026-12-31",
    }
    assert parse_report(first, now=NOW).reported_severity == "blocking"
    with pytest.raises(ReportError, match="evidence"):
        parse_report(second, now=NOW)
