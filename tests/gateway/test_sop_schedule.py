"""Schedule arithmetic: cron in a time zone, every, at, and what a restart does with missed runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.automation.schedule import (
    check_cron,
    decide_due,
    first_due,
    make_trigger,
    next_after,
    parse_at,
    parse_every,
)

GRACE = timedelta(seconds=60)


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ("61 7 * * *", "minute"),
        ("0 25 * * *", "hour"),
        ("0 7 32 * *", "day of month"),
        ("0 7 * 13 *", "month"),
        ("0 7 * * 8", "day of week"),
        ("0 7 * * mon-xyz", "day of week"),
    ],
)
def test_a_bad_cron_expression_names_the_wrong_field(expr: str, field: str) -> None:
    with pytest.raises(ValueError, match=f"the {field} field"):
        check_cron(expr)


def test_a_cron_expression_needs_five_fields() -> None:
    with pytest.raises(ValueError, match="has 3 field"):
        check_cron("* * *")
    with pytest.raises(ValueError, match="has 6 field"):
        check_cron("0 0 7 * * 1")


def test_cron_in_a_time_zone_keeps_local_time_across_daylight_saving() -> None:
    trigger = make_trigger(cron="0 7 * * 1-5", tz="Europe/Berlin")
    # Friday 2026-10-23, before the clocks go back (CEST, UTC+2) ...
    summer = next_after(trigger, datetime(2026, 10, 23, 4, 0, tzinfo=UTC), anchor=datetime.min.replace(tzinfo=UTC))
    assert summer == datetime(2026, 10, 23, 5, 0, tzinfo=UTC)
    # ... and the Monday after (CET, UTC+1): still 07:00 in Berlin; the weekend is skipped.
    winter = next_after(trigger, summer, anchor=summer)
    assert winter == datetime(2026, 10, 26, 6, 0, tzinfo=UTC)


def test_unknown_time_zone_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        make_trigger(cron="0 7 * * *", tz="Mars/Olympus")


def test_every_parses_units_and_refuses_nonsense() -> None:
    assert parse_every("15m") == timedelta(minutes=15)
    assert parse_every("1h30m") == timedelta(hours=1, minutes=30)
    assert parse_every("2d") == timedelta(days=2)
    for bad in ("", "15", "m15", "1x", "5s"):
        with pytest.raises(ValueError, match="interval"):
            parse_every(bad)


def test_at_needs_an_offset() -> None:
    assert parse_at("2026-12-01T07:00:00+01:00") == datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    assert parse_at("2026-12-01T07:00:00Z") == datetime(2026, 12, 1, 7, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_at("2026-12-01T07:00:00")
    with pytest.raises(ValueError, match="not ISO 8601"):
        parse_at("next tuesday")


def test_exactly_one_trigger_kind() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        make_trigger(every="15m", manual=True)
    with pytest.raises(ValueError, match="exactly one"):
        make_trigger()
    with pytest.raises(ValueError, match="tz applies to a cron trigger only"):
        make_trigger(every="15m", tz="UTC")


def test_at_in_the_past_is_never_due() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert first_due(make_trigger(at="2026-12-01T11:00:00Z"), now) is None
    assert first_due(make_trigger(at="2026-12-01T13:00:00Z"), now) == datetime(2026, 12, 1, 13, 0, tzinfo=UTC)


def test_on_time_run_fires_and_moves_on() -> None:
    trigger = make_trigger(every="15m")
    due = datetime(2026, 12, 1, 9, 15, tzinfo=UTC)
    d = decide_due(trigger, due, due + timedelta(seconds=5), catch_up="once", grace=GRACE)
    assert (d.due_at, d.run, d.missed, d.next_due) == (due, True, 0, due + timedelta(minutes=15))
    not_yet = decide_due(trigger, due, due - timedelta(seconds=1), catch_up="once", grace=GRACE)
    assert not_yet.due_at is None and not_yet.next_due == due


def test_missed_runs_catch_up_once_as_one_run() -> None:
    trigger = make_trigger(every="15m")
    due = datetime(2026, 12, 1, 9, 15, tzinfo=UTC)
    back = datetime(2026, 12, 1, 10, 7, tzinfo=UTC)  # down from 09:10 to 10:07: 9:15, 9:30, 9:45, 10:00 missed
    d = decide_due(trigger, due, back, catch_up="once", grace=GRACE)
    assert d.run and d.missed == 4
    assert d.due_at == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert d.next_due == datetime(2026, 12, 1, 10, 15, tzinfo=UTC)


def test_missed_runs_with_catch_up_skip_run_none() -> None:
    trigger = make_trigger(cron="0 * * * *")
    due = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    back = datetime(2026, 12, 1, 12, 30, tzinfo=UTC)
    d = decide_due(trigger, due, back, catch_up="skip", grace=GRACE)
    assert not d.run and d.missed == 4  # 9, 10, 11 and 12 o'clock
    assert d.next_due == datetime(2026, 12, 1, 13, 0, tzinfo=UTC)


def test_catch_up_skip_still_runs_the_one_due_now() -> None:
    trigger = make_trigger(cron="0 * * * *")
    due = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    back = datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)  # 12:00 is due now, 9-11 were missed
    d = decide_due(trigger, due, back, catch_up="skip", grace=GRACE)
    assert d.run and d.due_at == datetime(2026, 12, 1, 12, 0, tzinfo=UTC) and d.missed == 3
