"""The extraction job end to end: trim, durable job, worker, memory; and a misbehaving model."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.app import Gateway
from gateway.config import Config
from gateway.llm.base import ChatMessage, Completion, JsonSchema, Tool
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from pairing import Principal
from tests.conftest import Clock


class GarbledExtractor:
    """Chats normally, but answers every extraction request with something that is not the shape."""

    name = "garbled"
    model = "garbled-1"

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.extraction_calls = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def complete(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Tool] = (), json_schema: JsonSchema | None = None
    ) -> Completion:
        if json_schema is not None:
            self.extraction_calls += 1
            return Completion(self.answer, model=self.model)
        return Completion("ok", model=self.model)


async def _run(sqlite_url: str, clock: Clock, provider: object) -> tuple[Gateway, Principal]:
    cfg = Config.model_validate({"database": {"url": sqlite_url}, "session": {"max_messages": 4, "keep_messages": 1}})
    gw = Gateway(cfg, provider=provider, clock=clock)  # type: ignore[arg-type]
    await gw.start(channels=False, worker=False)
    admin = await gw.pairing.principal_for_user((await gw.pairing.add_user("Alice", "admin")).id)
    for i, text in enumerate(["answer me in English", "the report is produced from example_orders", "thanks"]):
        clock.advance(seconds=10)
        await gw.turns.handle(TurnRequest(SessionKey("api", "room"), admin, text, f"m{i}", clock.now, "Alice"))
    await gw.turns.settled()  # the trim runs after the reply
    return gw, admin


async def test_malformed_extractor_answer_is_retried_then_parked_with_raw_answer(sqlite_url: str, clock: Clock) -> None:
    provider = GarbledExtractor("Sure! Here are the facts: the report uses example_orders.")
    gw, _ = await _run(sqlite_url, clock, provider)
    try:
        worker = gw.worker
        for _ in range(worker.max_attempts):
            assert await worker.run_once()
            clock.advance(hours=2)  # past any backoff
        assert not await worker.run_once()
        (job,) = await gw.sessions.jobs()
        assert job.status == "failed"
        assert job.attempts == worker.max_attempts
        assert job.raw_answer == "Sure! Here are the facts: the report uses example_orders."
        assert "malformed extractor answer" in (job.last_error or "")
        assert provider.extraction_calls >= worker.max_attempts
        # Never half-written: nothing of the slice reached memory.
        assert await gw.memory.store.list_records(include_history=True) == []
    finally:
        await gw.stop()


async def test_wrong_shape_json_is_malformed_too(sqlite_url: str, clock: Clock) -> None:
    provider = GarbledExtractor('{"items": [{"kind": "rumour", "subject": "x", "content": "y"}]}')
    gw, _ = await _run(sqlite_url, clock, provider)
    try:
        assert await gw.worker.run_once()
        (job,) = await gw.sessions.jobs()
        assert job.status == "pending" and job.attempts == 1  # retried later, with backoff
        assert job.run_after > clock.now
        assert await gw.memory.store.list_records(include_history=True) == []
    finally:
        await gw.stop()


async def test_builtin_extraction_job_learns_from_admin_and_summarises_single_speaker(
    sqlite_url: str, clock: Clock
) -> None:
    from gateway.llm.builtin import BuiltinProvider

    gw, admin = await _run(sqlite_url, clock, BuiltinProvider())
    try:
        assert await gw.worker.drain() == 1
        (job,) = await gw.sessions.jobs()
        assert job.status == "done"
        records = await gw.memory.store.list_records(include_history=True)
        by_scope = {(r.scope, r.subject) for r in records}
        assert ("agent_notes", "report data source") in by_scope
        assert ("personal", "reply language") in by_scope
        # The whole slice was Alice's, so its summary went to her personal memory.
        summaries = [r for r in records if r.subject == "conversation summary"]
        assert len(summaries) == 1 and summaries[0].owner_user_id == admin.user_id
        # Running the job's work again writes nothing new.
        before = len(records)
        await gw.memory.extract_job(job)
        assert len(await gw.memory.store.list_records(include_history=True)) == before
    finally:
        await gw.stop()
