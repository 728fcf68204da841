"""The dashboard chat's history over real HTTP on SQLite and PostgreSQL: the newest messages, read alone.

The operator's dashboard chat is one session that never ends. The page built every message of it,
trimmed ones included, as ORM objects and kept the last 200, and read every turn record of the
session for the Explain links: 0.42 s a page at 20,000 messages, 2.3 s at 100,000, on the serving
process's event loop. It now reads the newest 200 and the turn records of the replies among them.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.models import Message, TurnRecord
from gateway.sessions import SessionKey
from gateway.web.dashboard.chat import HISTORY_SHOWN, chat_key
from tests.conftest import captured_reads, explain_captured, pg_rows_visited, pg_scans
from tests.gateway.dashboard_http import Dash, dashboard

OPERATOR_MESSAGES = 3_000
OTHER_MESSAGES = 500  # another session's, older than the operator's
OTHER_TURNS = 50_000  # another session's explanations: the table is not the operator's alone
LIVE = 20  # the operator's untrimmed messages; the rest are in archives of 31, as trims leave them
LONELY_REPLY = max(k for k in range(OPERATOR_MESSAGES) if k % 2 and k % 7 == 3)  # stored without explanation
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
_MSG = re.compile(
    r'<div class="msg (agent|me)"><div class="bubble">(.*?)</div>\s*'
    r'(?:<a class="explain" href="/dashboard/turns/(\d+)">Explain</a>)?</div>',
    re.S,
)


@pytest.fixture
async def dash(db_url: str) -> AsyncIterator[Dash]:
    async with dashboard(db_url) as d:
        yield d


def _row(i: int, session_id: str, platform_id: str, text: str, *, agent: bool, archive: str | None) -> dict[str, Any]:
    return {
        "id": i, "session_id": session_id, "platform_message_id": platform_id,
        "speaker_user_id": None if agent else "admin", "stored_role": None if agent else "admin",
        "display_name": "agent" if agent else "admin", "text": text, "said_at": T0 + timedelta(seconds=i),
        "is_agent": agent, "created_at": T0 + timedelta(seconds=i), "archive_id": archive,
        "reply_to_id": i - 1 if agent else None,
    }  # fmt: skip


def _turn(session_id: str, message_id: str, reply_id: str) -> dict[str, Any]:
    return {
        "session_id": session_id, "message_id": message_id, "reply_message_id": reply_id, "at": T0,
        "speaker_user_id": "admin", "stored_role": "admin", "memory": [], "sections": {"history": 10},
        "model_calls": {},
    }  # fmt: skip


async def _long_chat(d: Dash) -> list[tuple[str, str, int | None]]:
    """The operator's chat, a long one, written in bulk; what the page should show: (kind, text, turn id)."""
    sid = await d.gw.sessions.session_id(chat_key())
    other = await d.gw.sessions.session_id(SessionKey("discord", "guild-1/general"))
    rows = [_row(i + 1, other, f"d-{i}", f"discord {i}", agent=False, archive=None) for i in range(OTHER_MESSAGES)]
    turns = []
    for k in range(OPERATOR_MESSAGES):
        agent = k % 2 == 1
        # The last slice's final reply was cut with its message: trimmed, yet newer than a live message.
        archive = f"a_{k // 31:014x}" if k < OPERATOR_MESSAGES - LIVE or k == OPERATOR_MESSAGES - LIVE + 1 else None
        pid, text = (f"reply-{k}", f"agent reply {k}") if agent else (f"web-{k}", f"operator says {k}")
        rows.append(_row(OTHER_MESSAGES + k + 1, sid, pid, text, agent=agent, archive=archive))
        if agent and k % 7 != 3:  # some replies have no explanation (stored without one)
            turns.append(_turn(sid, f"web-{k - 1}", pid))
    # Another session's record for a reply id of ours that has none: not our reply's explanation.
    turns.append(_turn(other, "d-1", f"reply-{LONELY_REPLY}"))
    engine = d.gw.engine
    async with engine.begin() as conn:
        await conn.execute(Message.__table__.insert(), rows)
        await conn.execute(TurnRecord.__table__.insert(), turns)
        await conn.execute(
            sa.text(
                "INSERT INTO turn_records (session_id, message_id, reply_message_id, at, memory, sections, model_calls)"
                " WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count)"
                " SELECT :sid, 'd-' || i, 'd-reply-' || i, :at, '[]', '{}', '{}' FROM n"
            ),
            {"count": OTHER_TURNS, "sid": other, "at": T0},
        )
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE")  # as autovacuum does after a load
    t = TurnRecord.__table__.c
    async with engine.connect() as conn:
        explained = dict((await conn.execute(select(t.reply_message_id, t.id).where(t.session_id == sid))).all())
    shown = []
    for k in range(OPERATOR_MESSAGES - HISTORY_SHOWN, OPERATOR_MESSAGES):
        if k % 2:
            shown.append(("agent", f"agent reply {k}", explained.get(f"reply-{k}")))
        else:
            shown.append(("me", f"operator says {k}", None))
    return shown


def _history(page: str) -> list[tuple[str, str, int | None]]:
    return [(kind, html.unescape(text), int(turn) if turn else None) for kind, text, turn in _MSG.findall(page)]


async def _rows_read(engine: AsyncEngine, reads: list[tuple[str, Any]]) -> list[int]:
    """How many rows each captured statement returns when run again."""
    counts = []
    async with engine.connect() as conn:
        for statement, params in reads:
            counts.append(len((await conn.exec_driver_sql(statement, params)).all()))
    return counts


async def test_chat_page_shows_the_newest_messages_oldest_first_with_their_explain_links(dash: Dash) -> None:
    shown = await _long_chat(dash)
    engine = dash.gw.engine
    with captured_reads(engine, "messages") as msg_reads, captured_reads(engine, "turn_records") as turn_reads:
        status, page = await dash.get("/dashboard/chat")
    assert status == 200
    history = _history(page)
    assert len(history) == HISTORY_SHOWN
    assert history == shown
    assert history[0] == ("me", f"operator says {OPERATOR_MESSAGES - HISTORY_SHOWN}", None)
    assert history[-1][:2] == ("agent", f"agent reply {OPERATOR_MESSAGES - 1}")
    assert history[LONELY_REPLY - OPERATOR_MESSAGES] == ("agent", f"agent reply {LONELY_REPLY}", None)
    assert sum(turn is not None for _, _, turn in history) > HISTORY_SHOWN // 3
    # Only the rows shown are read: the history's 200 (and one id more: whether older ones are left)
    # and the explanations of the replies among them.
    assert msg_reads and turn_reads
    assert all(n <= HISTORY_SHOWN + 1 for n in await _rows_read(engine, msg_reads)), msg_reads
    assert all(n <= HISTORY_SHOWN // 2 for n in await _rows_read(engine, turn_reads)), turn_reads


async def test_chat_history_reads_seek_rows_instead_of_walking_the_session(dash: Dash) -> None:
    await _long_chat(dash)
    engine = dash.gw.engine
    with captured_reads(engine, "messages") as msg_reads, captured_reads(engine, "turn_records") as turn_reads:
        status, _ = await dash.get("/dashboard/chat")
    assert status == 200 and msg_reads and turn_reads
    for statement, params in msg_reads:
        plan = await explain_captured(engine, statement, params, analyze=True)
        if engine.dialect.name == "sqlite":
            # Before: SEARCH messages USING INDEX ix_messages_session_live (session_id=?), every row of the
            # session read and built. Now the rows are read by id; the session's ids come off the index.
            steps = [line for line in plan.splitlines() if "messages" in line]
            assert steps, plan
            assert all("PRIMARY KEY" in line or "COVERING INDEX" in line for line in steps), plan
        else:
            scans = pg_scans(plan, "messages")
            assert scans and not any(n["Node Type"] == "Seq Scan" for n in scans), plan
            assert pg_rows_visited(scans) <= HISTORY_SHOWN + 1, plan
    for statement, params in turn_reads:
        plan = await explain_captured(engine, statement, params, analyze=True)
        if engine.dialect.name == "sqlite":
            # Before: SEARCH turn_records USING INDEX ix_turn_records_session (session_id=?), every turn.
            steps = [line for line in plan.splitlines() if "turn_records" in line]
            assert steps and all("ix_turn_records_reply_message_id" in line for line in steps), plan
        else:
            scans = pg_scans(plan, "turn_records")
            assert scans and not any(n["Node Type"] == "Seq Scan" for n in scans), plan
            assert pg_rows_visited(scans) <= HISTORY_SHOWN, plan
