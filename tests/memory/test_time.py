"""Time: a record's time is when it was said; the newer by said_at wins, never by write order.

policy ("Time: when a fact was said, not when it was written"): "The subject
rules and belief revision replace the older value with the newer by that time.
A relearned or confirmed record older than the live value on its subject
becomes history itself; it does not retire the newer value."

On real SQLite and real PostgreSQL.
"""

from __future__ import annotations

from datetime import timedelta

from memory.store import MemoryStore
from memory.writer import MemoryWriter
from tests.memory.conftest import ALICE, BOB, T0

DAY = timedelta(days=1)


async def _live(store: MemoryStore) -> list[str]:
    return [r.content for r in await store.live_notes()]


async def test_older_relearned_value_becomes_history_and_the_newer_stays_live(writer: MemoryWriter) -> None:
    live = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="use example_archive", said_at=T0
    )
    old = await writer.write(
        ALICE, "agent_notes", "relearn", subject="Report data source", content="use example_orders",
        said_at=T0 - 30 * DAY, trusted=True,
    )  # fmt: skip
    assert live.record and old.record
    assert old.record.status == "superseded" and old.record.superseded_by == live.record.id
    assert old.retired == ()
    assert await _live(writer.store) == ["use example_archive"]
    (rev,) = await writer.store.revisions_for(old.record.id)
    assert (rev.retired_id, rev.replacing_id, rev.via, rev.cause) == (
        old.record.id,
        live.record.id,
        "subject_rule",
        "relearn",
    )


async def test_newer_relearned_value_retires_the_older_live_one(writer: MemoryWriter) -> None:
    live = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="use example_orders", said_at=T0
    )
    new = await writer.write(
        ALICE, "agent_notes", "relearn", subject="report data source", content="use example_archive",
        said_at=T0 + DAY, trusted=True,
    )  # fmt: skip
    assert live.record and new.record and new.record.status == "live"
    assert new.retired == (live.record.id,)
    assert await _live(writer.store) == ["use example_archive"]
    (rev,) = await writer.store.revisions_for(live.record.id)
    assert (rev.replacing_id, rev.cause, rev.prior_status) == (new.record.id, "relearn", "live")


async def test_write_order_does_not_decide_the_live_value(writer: MemoryWriter) -> None:
    # Written second but said first: history, whatever the source.
    await writer.write(
        ALICE, "agent_notes", "live", subject="s", content="said at noon", said_at=T0 + timedelta(hours=4)
    )
    late_write = await writer.write(ALICE, "agent_notes", "live", subject="s", content="said at eight", said_at=T0)
    assert late_write.record and late_write.record.status == "superseded"
    assert await _live(writer.store) == ["said at noon"]


async def test_the_same_saying_is_not_written_again_in_any_status(writer: MemoryWriter) -> None:
    # A relearn run twice finds the history it wrote the first time.
    newer = await writer.write(ALICE, "agent_notes", "live", subject="s", content="new", said_at=T0)
    first = await writer.write(
        ALICE, "agent_notes", "relearn", subject="s", content="old", said_at=T0 - DAY, trusted=True
    )
    again = await writer.write(
        ALICE, "agent_notes", "relearn", subject="s", content="old", said_at=T0 - DAY, trusted=True
    )
    assert newer.record and first.record and first.record.status == "superseded"
    assert again.duplicate and again.record and again.record.id == first.record.id
    assert len(await writer.store.list_records(include_history=True)) == 2
    # Said again at another time, it is a new saying (and the newest value).
    later = await writer.write(ALICE, "agent_notes", "live", subject="s", content="old", said_at=T0 + DAY)
    assert later.written and later.record and later.record.status == "live"


async def test_a_rejected_record_is_not_quarantined_again_by_a_rerun(writer: MemoryWriter) -> None:
    q = await writer.write(BOB, "agent_notes", "relearn", subject="s", content="bob's way", said_at=T0)
    assert q.record and q.record.status == "unverified"
    await writer.reject(ALICE, q.record.id, reason="no")
    again = await writer.write(BOB, "agent_notes", "relearn", subject="s", content="bob's way", said_at=T0)
    assert again.duplicate and again.record and again.record.status == "rejected"


async def test_confirmed_record_older_than_the_live_value_becomes_history(writer: MemoryWriter) -> None:
    q = await writer.write(BOB, "agent_notes", "relearn", subject="report data source", content="orders", said_at=T0)
    live = await writer.write(
        ALICE, "agent_notes", "live", subject="report data source", content="archive", said_at=T0 + DAY
    )
    assert q.record and live.record
    confirmed = await writer.confirm(ALICE, q.record.id)
    assert confirmed.record and confirmed.record.status == "superseded"
    assert confirmed.record.superseded_by == live.record.id and confirmed.retired == ()
    assert await _live(writer.store) == ["archive"]
    (rev,) = await writer.store.revisions_for(q.record.id)
    assert (rev.retired_id, rev.replacing_id, rev.cause) == (q.record.id, live.record.id, "confirm")


async def test_confirmed_record_newer_than_the_live_value_retires_it(writer: MemoryWriter) -> None:
    live = await writer.write(ALICE, "agent_notes", "live", subject="report data source", content="orders", said_at=T0)
    q = await writer.write(
        BOB, "agent_notes", "relearn", subject="report data source", content="archive", said_at=T0 + DAY
    )
    assert q.record and live.record
    confirmed = await writer.confirm(ALICE, q.record.id)
    assert confirmed.record and confirmed.record.status == "live"
    assert confirmed.retired == (live.record.id,)
    (rev,) = await writer.store.revisions_for(live.record.id)
    assert rev.cause == "confirm"
    (review,) = await writer.store.reviews_for(q.record.id)
    assert (review.action, review.by_user_id) == ("confirm", "u_alice")
