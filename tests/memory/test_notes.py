"""Operational facts' pure rules: review-by reading and bounds, expiry, scope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory.notes import (
    BY_HAND,
    CONVERSATION,
    Audience,
    ReviewByError,
    applies,
    clean_scope,
    is_expired,
    parse_review_by,
    review_by_problem,
)

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30d", NOW + timedelta(days=30)),
        ("1 day", NOW + timedelta(days=1)),
        ("2027-01-15", datetime(2027, 1, 15, tzinfo=UTC)),
        ("2027-03-01", datetime(2027, 3, 1, tzinfo=UTC)),  # 90 calendar days out
    ],
)
def test_review_by_reads_a_date_or_days_from_now(value: str, expected: datetime) -> None:
    assert parse_review_by(value, NOW) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2027-04-01", "review_by 2027-04-01 is 121 days out; at most 90"),
        ("91d", "is 91 days out; at most 90"),
        ("2026-12-01", "is not in the future"),
        ("2026-11-01", "is not in the future"),
        ("-3d", "is not in the future"),
        ("0d", "is not in the future"),
        ("next week", "is not a date"),
    ],
)
def test_review_by_in_the_past_or_past_90_days_is_refused_with_why(value: str, message: str) -> None:
    with pytest.raises(ReviewByError, match=message):
        parse_review_by(value, NOW)


def test_the_store_check_needs_a_review_by() -> None:
    assert "required" in (review_by_problem(None, NOW) or "")
    assert review_by_problem(NOW + timedelta(days=90), NOW) is None


def test_expired_is_when_review_by_has_passed() -> None:
    assert not is_expired(None, NOW)
    assert not is_expired(NOW + timedelta(seconds=1), NOW)
    assert is_expired(NOW, NOW)


def test_scope_applies_to_its_sops_by_name_or_tag_and_to_a_run_by_hand() -> None:
    scope = clean_scope([" Daily-Report ", "daily-report", "finance"])
    assert scope == ("daily-report", "finance")
    assert applies(scope, Audience(sop_name="Daily-Report"))
    assert applies(scope, Audience(sop_name="billing", tags=("finance",)))
    assert not applies(scope, Audience(sop_name="billing"))
    assert not applies(scope, CONVERSATION)
    assert applies(scope, BY_HAND)
    assert applies((), CONVERSATION) and applies((), Audience(sop_name="billing"))
