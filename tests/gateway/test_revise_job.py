"""Belief revision after a turn's ``memory_write`` / ``@notes:`` runs from a durable job (issue 14, target 3)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from gateway.app import Gateway
from gateway.config import Config
from gateway.llm.base import ChatMessage, Completion, JsonSchema, Tool, ToolCall
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from memory.belief_revision import REVISION_SCHEMA_NAME
from pairing.principal import Principal
from tests.conftest import Clock

OLD = "the daily report is built from the example_orders table"
NEW = "the daily report is built from the warehouse_orders table now"


class WritingModel:
    """Calls ``memory_write`` once per chat turn; as the judge, says the new record replaces every candidate."""

    name = "writing"
    model = "writing-1"

    def __init__(self) -> None:
        self.judge_calls: list[dict[str, Any]] = []
        self.chat_calls = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def complete(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), json_schema: JsonSchema | None = None
    ) -> Completion:
        if json_schema is not None and json_schema.name == REVISION_SCHEMA_NAME:
            shown = json.loads(messages[-1].content)
            self.judge_calls.append(shown)
            decisions = [{"record_id": c["id"], "relation": "replaces", "reason": "newer"} for c in shown["candidates"]]
            return Completion(json.dumps({"decisions": decisions}), model=self.model)
        if json_schema is not None:
            return Completion(json.dumps({"items": []}), model=self.model)
        self.chat_calls += 1
        if messages[-1].role == "tool":
            return Completion("noted", model=self.model)
        args = {"scope": "agent_notes", "subject": "daily report data source", "content": NEW, "review_by": "30d"}
        return Completion("", tool_calls=(ToolCall("c1", "memory_write", args),), model=self.model)


async def _gateway(db_url: str, clock: Clock) -> tuple[Gateway, Principal, WritingModel]:
    model = WritingModel()
    gw = Gateway(Config.model_validate({"database": {"url": db_url}}), provider=model, clock=clock)  # type: ignore[arg-type]
    await gw.start(channels=False, worker=False)
    admin = await gw.pairing.principal_for_user((await gw.pairing.add_user("Alice", "admin")).id)
    return gw, admin, model


async def test_the_judge_runs_from_the_job_after_the_turn_and_its_retirement_has_cause_live(
    db_url: str, clock: Clock
) -> None:
    gw, admin, model = await _gateway(db_url, clock)
    try:
        old = await gw.memory.writer.write(
            admin, "agent_notes", "live", subject="report source", content=OLD, said_at=clock.now - timedelta(days=1)
        )
        assert old.record is not None
        judged_before = len(model.judge_calls)
        result = await gw.turns.handle(
            TurnRequest(SessionKey("api", "room"), admin, "remember the new report source", "m1", clock.now, "Alice")
        )
        assert result.reply == "noted"
        # The turn wrote the note and queued its revision; the judge has not run yet.
        assert len(model.judge_calls) == judged_before
        assert (await gw.memory.store.get(old.record.id)).status == "live"  # type: ignore[union-attr]
        (job,) = [j for j in await gw.sessions.jobs() if j.kind == "revise"]
        assert job.status == "pending"
        assert await gw.worker.drain() == 1
        (shown,) = model.judge_calls[judged_before:]
        assert shown["record"]["content"] == NEW
        assert [c["id"] for c in shown["candidates"]] == [old.record.id]
        (rev,) = await gw.memory.store.list_revisions()
        assert (rev.retired_id, rev.via, rev.cause) == (old.record.id, "belief_revision", "live")
        assert (await gw.memory.store.get(old.record.id)).status == "superseded"  # type: ignore[union-attr]
        # Done, the job is gone: the revision row is its record.
        assert [j for j in await gw.sessions.jobs() if j.kind == "revise"] == []
    finally:
        await gw.stop()


async def test_a_notes_directive_is_revised_by_the_job_too(db_url: str, clock: Clock) -> None:
    gw, admin, model = await _gateway(db_url, clock)
    try:
        old = await gw.memory.writer.write(
            admin, "agent_notes", "live", subject="report source", content=OLD, said_at=clock.now - timedelta(days=1)
        )
        assert old.record is not None
        judged_before = len(model.judge_calls)
        await gw.turns.handle(TurnRequest(SessionKey("api", "room"), admin, f"@notes: {NEW}", "m1", clock.now, "Alice"))
        assert model.chat_calls == 0 and len(model.judge_calls) == judged_before
        assert await gw.worker.drain() == 1
        (rev,) = await gw.memory.store.list_revisions()
        assert (rev.retired_id, rev.cause) == (old.record.id, "live")
    finally:
        await gw.stop()


async def test_an_autonomous_run_revises_in_place_so_the_run_ends_with_its_memory_revised(
    db_url: str, clock: Clock
) -> None:
    gw, admin, _model = await _gateway(db_url, clock)
    try:
        old = await gw.memory.writer.write(
            admin, "agent_notes", "live", subject="report source", content=OLD, said_at=clock.now - timedelta(days=1)
        )
        assert old.record is not None
        run = Principal.system("sop-system")
        new = await gw.memory.writer.write(
            run, "agent_notes", "memory_write", subject="daily report data source", content=NEW, said_at=clock.now
        )
        assert new.record is not None and new.record.status == "live"
        (rev,) = await gw.memory.store.list_revisions()
        assert (rev.retired_id, rev.replacing_id, rev.cause) == (old.record.id, new.record.id, "live")
        assert [j for j in await gw.sessions.jobs() if j.kind == "revise"] == []
    finally:
        await gw.stop()
