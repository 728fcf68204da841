"""A paraphrase of a live fact is no new value; anything that changes a value, a name or a negation is."""

from __future__ import annotations

import pytest

from memory.paraphrase import same_fact
from memory.writer import MemoryWriter
from tests.memory.conftest import ALICE, T0


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("the daily report uses table example_orders", "The daily report is produced from example_orders"),
        ("Wants answers in English", "Prefers answers in English"),
        ("The staging server is db2.example.internal", "Our staging server is db2.example.internal"),
        ("Always use `example_orders`", "always use example_orders"),
    ],
)
def test_restatements_are_the_same_fact(earlier: str, later: str) -> None:
    assert same_fact(earlier, later)


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("use example_orders", "do not use example_orders"),
        ("always use example_orders, not example_archive", "always use example_archive, not example_orders"),
        ("the daily report uses table example_orders", "the daily report uses table example_orders_v2"),
        ("refreshed at 06:00", "refreshed at 07:30"),
        ("Wants answers in English", "Wants answers in French"),
        ("a", "b"),  # no meaningful words: only an exact repeat is the same
        ("the daily report uses example_orders", "the weekly report uses example_orders"),
    ],
)
def test_a_changed_value_name_or_negation_is_a_new_fact(earlier: str, later: str) -> None:
    assert not same_fact(earlier, later)


async def test_an_extracted_paraphrase_keeps_the_directive_wording(writer: MemoryWriter) -> None:
    subject = "daily report data source"
    first = await writer.write(
        ALICE,
        "agent_notes",
        "directive",
        subject=subject,
        content="the daily report uses table example_orders",
        said_at=T0,
    )
    again = await writer.write(
        ALICE,
        "agent_notes",
        "live",
        subject=subject,
        content="The daily report is produced from example_orders",
        said_at=T0.replace(hour=9),
    )
    assert first.record is not None and again.duplicate and again.record is not None
    assert again.record.id == first.record.id
    (live,) = await writer.store.list_records(scope="agent_notes")
    assert live.content == "the daily report uses table example_orders"
    assert await writer.store.list_revisions() == []


async def test_an_admin_rewording_by_directive_is_still_theirs_to_make(writer: MemoryWriter) -> None:
    subject = "daily report data source"
    await writer.write(
        ALICE,
        "agent_notes",
        "live",
        subject=subject,
        content="The daily report is produced from example_orders",
        said_at=T0,
    )
    reworded = await writer.write(
        ALICE,
        "agent_notes",
        "directive",
        subject=subject,
        content="the daily report uses table example_orders",
        said_at=T0.replace(hour=9),
    )
    assert reworded.written and len(reworded.retired) == 1
