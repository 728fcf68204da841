"""The builtin classifier and the subject rule held to a corpus: no wrong retirement, every intended one.

Each pair of the corpus is learned as the gateway learns it: an ``@notes:``
line through the directive, anything else through ``process_slice`` with the
builtin extractor (so the gate, ``handle_fact_extract`` and the subject rule
all run), then belief revision with the builtin judge, as after every live write.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.db import make_engine, upgrade
from memory import handle_notes_directive, process_slice
from memory.belief_revision import BeliefReviser
from memory.rules import builtin_extract, builtin_revision_judgement
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from pairing.principal import Principal
from tests.conftest import Clock
from tests.memory.conftest import ALICE, BOB, T0, msg
from tests.memory.subject_corpus import CORPUS, KEEP, SAME, SUPERSEDE, Pair

SPEAKERS = {"admin": ALICE, "user": BOB}


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file, copied for each pair (migrating per pair would dominate the run)."""
    path = tmp_path_factory.mktemp("corpus") / "template.db"

    async def migrate() -> None:
        eng = make_engine(f"sqlite+aiosqlite:///{path}")
        try:
            await upgrade(eng)
        finally:
            await eng.dispose()

    asyncio.run(migrate())
    return path


class Learner:
    """Learns one person's phrasings the way the gateway does."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.writer = MemoryWriter(store)

        async def judge(system: str, user: str) -> str:
            return builtin_revision_judgement(system, user)

        self.reviser = BeliefReviser(store, judge, judge_model="builtin-offline")
        self.n = 0

    async def learn(self, speaker: Principal, text: str, minute: int) -> list[str]:
        """Learn ``text``; return the ids of the records it wrote."""
        self.n += 1
        before = {r.id for r in await self.store.list_records(include_history=True)}
        said_at = T0 + timedelta(minutes=minute)
        if text.startswith("@notes:"):
            reply = await handle_notes_directive(
                self.writer, speaker, text, said_at=said_at, session_id="s_corpus", message_id=f"m{self.n}"
            )
            assert reply is not None and not reply.startswith("Only"), reply
        else:
            assert speaker.user_id is not None

            async def model(system: str, user: str) -> str:
                return builtin_extract(system, user)

            line = msg(f"m{self.n}", speaker.user_id, speaker.stored_role, text, minute=minute)
            await process_slice(self.writer, model, slice=[line], turn_principal=speaker, session_id="s_corpus")
        written = [r for r in await self.store.list_records(include_history=True) if r.id not in before]
        await self.reviser.revise_many([r.id for r in written if r.status == "live"], cause="live")
        return [r.id for r in written]


@pytest.fixture
async def learner(template_db: Path, tmp_path: Path, clock: Clock) -> AsyncIterator[Learner]:
    db = tmp_path / "corpus.db"
    shutil.copy(template_db, db)
    eng = make_engine(f"sqlite+aiosqlite:///{db}")
    try:
        yield Learner(MemoryStore(eng, clock=clock))
    finally:
        await eng.dispose()


def test_the_corpus_is_big_enough_and_covers_every_outcome() -> None:
    phrasings = {p.first for p in CORPUS} | {p.later for p in CORPUS}
    assert len(phrasings) >= 60
    for speaker in ("admin", "user"):
        assert {p.expect for p in CORPUS if p.speaker == speaker} == {SUPERSEDE, KEEP, SAME}


@pytest.mark.parametrize("pair", CORPUS, ids=[f"{p.expect}-{p.why}" for p in CORPUS])
async def test_learning_the_later_phrasing_retires_exactly_what_it_should(learner: Learner, pair: Pair) -> None:
    speaker = SPEAKERS[pair.speaker]
    first = await learner.learn(speaker, pair.first, 0)
    assert first, f"nothing was learned from {pair.first!r}: the pair tests nothing"
    before = {i: await learner.store.get(i) for i in first}
    later = await learner.learn(speaker, pair.later, 60)
    after = {i: await learner.store.get(i) for i in first}
    statuses = {before[i].content: after[i].status for i in first if before[i] and after[i]}  # type: ignore[union-attr]

    if pair.expect == SUPERSEDE:
        assert later, f"nothing was learned from {pair.later!r}"
        assert set(statuses.values()) == {"superseded"}, f"{pair.why}: {statuses}"
    elif pair.expect == KEEP:
        assert set(statuses.values()) == {"live"}, f"{pair.why}: wrongly retired {statuses}"
    else:
        assert set(statuses.values()) == {"live"}, f"{pair.why}: a paraphrase retired {statuses}"
        new = [await learner.store.get(i) for i in later]
        assert not [r for r in new if r and r.status == "live"], f"{pair.why}: the paraphrase was written too"
        assert [r.content for r in before.values() if r] == [r.content for r in after.values() if r]
    assert await learner.store.list_revisions() == [] or pair.expect == SUPERSEDE
