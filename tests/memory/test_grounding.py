"""An item is learned under a speaker only when its identifiers are in that speaker's own words."""

from __future__ import annotations

import json

from memory.extract import process_slice
from memory.writer import MemoryWriter
from tests.memory.conftest import ALICE, agent, msg


async def test_value_lifted_from_an_agent_reply_quoting_someone_else_is_not_learned(writer: MemoryWriter) -> None:
    # Bob (a user) asked for example_archive earlier; the agent quotes it back to Alice (an admin).
    slice_ = [
        msg("a1", "u_alice", "admin", "What did Bob ask for?", minute=1),
        agent("r1", "Bob asked to switch the report to example_archive on db02.internal.", minute=2),
        msg("a2", "u_alice", "admin", "The report is produced from example_orders.", minute=3),
    ]

    async def lifting(system: str, user: str) -> str:
        return json.dumps(
            {
                "items": [
                    {
                        "kind": "operational",
                        "subject": "report source",
                        "content": "use example_archive on db02.internal",
                    },
                    {"kind": "operational", "subject": "report data source", "content": "Report from example_orders"},
                ]
            }
        )

    out = await process_slice(writer, lifting, slice=slice_, turn_principal=ALICE, session_id="s1")
    notes = [r.content for r in out.written if r.scope == "agent_notes"]
    assert notes == ["Report from example_orders"]
    (dropped,) = [d for d in out.dropped if "example_archive" in d.item.content]
    assert "not in the speaker's own words" in dropped.reason
    assert "db02.internal" in dropped.reason and "example_archive" in dropped.reason


async def test_plain_words_and_the_speakers_own_identifiers_are_learned(writer: MemoryWriter) -> None:
    slice_ = [msg("a1", "u_alice", "admin", "Send the `daily report` to ops-reports@example.org at 9:00.", minute=1)]

    async def faithful(system: str, user: str) -> str:
        return json.dumps(
            {
                "items": [
                    {
                        "kind": "operational",
                        "subject": "daily report delivery",
                        "content": "The daily report goes to ops-reports@example.org at 9:00",
                    },
                    {"kind": "preference", "subject": "tone", "content": "Prefers short answers"},
                ]
            }
        )

    out = await process_slice(writer, faithful, slice=slice_, turn_principal=ALICE, session_id="s1")
    assert sorted(r.scope for r in out.written) == ["agent_notes", "personal"]
