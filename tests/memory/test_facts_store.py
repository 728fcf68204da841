"""Identity proposals, signals and obligations on real SQLite and PostgreSQL: schema, migration, races."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

import memory.facts_models as fm
from gateway.db import make_engine, upgrade
from memory.identity import (
    LIST_LIMIT,
    IdentityError,
    IdentityStore,
    accept_proposal,
    identity_decide,
    reject_proposal,
)
from memory.intelligence import RoutingPolicy, parse_report
from memory.models import MemoryBase
from memory.obligations import FindingsStore, holding_obligation, route_pending
from memory.render import identity_lines
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from pairing.models import UTCDateTime
from tests.conftest import Clock, pg_rows_visited, pg_scans, query_plan
from tests.memory.conftest import ALICE, BOB, CAROL, SOP, bulk_proposals

FACT_TABLES = {
    t.__tablename__
    for t in (
        fm.IdentityProposal,
        fm.IdentityDecision,
        fm.IntelligenceSignal,
        fm.SignalRouting,
        fm.UnroutedSignal,
        fm.OpenObligation,
        fm.Obligation,
        fm.ObligationDisposition,
    )
}


async def test_migration_and_models_agree(engine: AsyncEngine) -> None:
    def diff(conn: Connection) -> list[object]:
        def include(obj: object, name: str | None, type_: str, _reflected: bool, _other: object) -> bool:
            table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
            return table in FACT_TABLES

        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": include})
        return list(compare_metadata(ctx, MemoryBase.metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(diff) == []


async def test_identity_written_before_decisions_is_kept_and_marked_as_written_directly(db_url: str) -> None:
    eng = make_engine(db_url)
    try:
        await upgrade(eng, "0004_memory_time")
        async with eng.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO memory_records (id, scope, subject, subject_key, content, status, said_at, "
                    "recorded_at, source, author_user_id, author_role, evidence) VALUES ('m_old', 'agent_config', "
                    "'boundaries', 'boundaries', 'Never email customers', 'live', :t, :t, 'memory_write', "
                    "'u_alice', 'admin', '[]')"
                ).bindparams(bindparam("t", type_=UTCDateTime())),
                {"t": datetime(2026, 11, 1, 8, 0, tzinfo=UTC)},
            )
        await upgrade(eng)
        how = await IdentityStore(eng).provenance()
        assert set(how) == {"m_old"}
        assert (how["m_old"].decision, how["m_old"].by_user_id, how["m_old"].proposal_id) == (
            "direct",
            "u_alice",
            None,
        )
        store = MemoryStore(eng)
        (line,) = await identity_lines(store)
        assert "Never email customers" in line  # still rendered, untouched
        rec = await store.get("m_old")
        assert rec is not None and (rec.source, rec.status) == ("memory_write", "live")
    finally:
        await eng.dispose()


async def test_an_accepted_proposal_replaces_the_identity_on_its_subject_as_a_revision(
    engine: AsyncEngine, clock: Clock
) -> None:
    identity, store = IdentityStore(engine, clock=clock), MemoryStore(engine, clock=clock)
    writer = MemoryWriter(store)
    first = await identity.propose(BOB, scope="agent_config", subject="boundaries", content="A", rationale="r")
    done = await accept_proposal(identity, writer, first.id, by=ALICE, rationale="ok")
    clock.advance(minutes=5)
    second = await identity.propose(SOP, scope="agent_config", subject="Boundaries", content="B", rationale="r",
                                    run_id="run-9", sop_name="policy-review")  # fmt: skip
    again = await accept_proposal(identity, writer, second.id, by=CAROL, rationale="newer")
    assert again.retired == (done.record.id,)
    (live,) = await store.list_records(scope="agent_config")
    assert (live.content, live.author_user_id, live.source) == ("B", "u_carol", "decision")
    old = await store.get(done.record.id)
    assert old is not None and old.status == "superseded"  # kept as history, never edited
    (rev,) = await store.revisions_for(done.record.id)
    assert rev.cause == "decision"


async def test_a_proposal_is_decided_once_even_when_two_admins_race(engine: AsyncEngine) -> None:
    identity, writer = IdentityStore(engine), MemoryWriter(MemoryStore(engine))
    p = await identity.propose(BOB, scope="global", content="Glossary: SOP = standing procedure", rationale="r")
    outcomes = await asyncio.gather(
        accept_proposal(identity, writer, p.id, by=ALICE, rationale="yes"),
        reject_proposal(identity, p.id, by=CAROL, rationale="no"),
        return_exceptions=True,
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], IdentityError), outcomes
    decided = await identity.get(p.id)
    assert decided is not None and decided.status in ("accepted", "rejected")
    live = await MemoryStore(engine).list_records(scope="global")
    assert len(live) == (1 if decided.status == "accepted" else 0)


async def test_proposals_refuse_bad_input(engine: AsyncEngine) -> None:
    identity = IdentityStore(engine)
    for kwargs, message in (
        ({"scope": "agent_notes"}, "scope must be one of"),
        ({"content": " "}, "the proposed text is empty"),
        ({"rationale": ""}, "needs a rationale"),
    ):
        args = {"scope": "global", "content": "x", "rationale": "r", **kwargs}
        with pytest.raises(IdentityError, match=message):
            await identity.propose(BOB, **args)
    with pytest.raises(IdentityError, match="SOP runs"):
        await identity.propose(SOP, scope="global", content="x", rationale="r")  # no run to stamp
    assert await identity.proposals(include_decided=True) == []


async def test_concurrent_routers_route_each_signal_once(engine: AsyncEngine, clock: Clock) -> None:
    store = FindingsStore(engine, clock=clock)
    args = {"subject": "s", "claim": "c", "observation": "o", "evidence": ["e"], "confidence": "low",
            "reported_severity": "blocking", "affected_sops": ["a", "b"]}  # fmt: skip
    for i in range(5):
        await store.append_signal(parse_report(args, now=clock.now), sop_name="r", run_id=f"run-{i}", reporter="x")
    policy = RoutingPolicy()
    results = await asyncio.gather(*(route_pending(store, policy, clock.now) for _ in range(4)))
    assert sum(len(r) for r in results) == 5
    assert len(await store.obligations()) == 10
    assert all(r is not None for _, r in await store.signals())


async def test_a_disposition_is_a_later_event_and_the_obligation_row_is_unchanged(
    engine: AsyncEngine, clock: Clock
) -> None:
    store = FindingsStore(engine, clock=clock)
    args = {"subject": "s", "claim": "c", "observation": "o", "evidence": ["e"], "confidence": "low",
            "reported_severity": "critical"}  # fmt: skip
    await store.append_signal(parse_report(args, now=clock.now), sop_name="r", run_id="run-1", reporter="x")
    await route_pending(store, RoutingPolicy())
    held = await holding_obligation(store, "r")
    assert held is not None

    async def row() -> tuple[object, ...]:
        async with engine.connect() as conn:
            return tuple((await conn.execute(select(fm.Obligation.__table__))).one())

    before = await row()
    clock.advance(hours=1)
    done = await store.resolve(held, by=ALICE, disposition="rework", rationale="fix the export")
    assert await row() == before
    assert done.disposition is not None and done.disposition.at == clock.now
    assert await holding_obligation(store, "r") is None
    assert [o.id for o in await store.obligations(include_resolved=True)] == [held]
    assert await store.obligations() == []
    with pytest.raises(Exception, match="disposition must be one of"):
        await store.resolve(held, by=ALICE, disposition="ignore", rationale="x")
    assert clock.now - done.opened_at == timedelta(hours=1)


async def test_an_open_proposal_is_listed_however_many_were_decided_before_it(
    engine: AsyncEngine, clock: Clock
) -> None:
    identity = IdentityStore(engine, clock=clock)
    await bulk_proposals(engine, 501, before=clock.now, decided=True)
    clock.advance(minutes=1)
    fresh = await identity.propose(BOB, scope="global", content="Glossary: SOP = standing procedure", rationale="r")
    (listed,) = await identity.proposals()
    assert (listed.id, listed.status) == (fresh.id, "open")
    assert await identity.count() == 1
    assert await identity.count(include_decided=True) == 502


async def test_the_limit_counts_what_the_caller_asked_for_oldest_first(engine: AsyncEngine, clock: Clock) -> None:
    identity = IdentityStore(engine, clock=clock)
    decided = await bulk_proposals(engine, 3, before=clock.now, decided=True)
    opened = []
    for i in range(3):
        clock.advance(minutes=1)
        opened.append((await identity.propose(BOB, scope="global", content=f"Rule {i}", rationale="r")).id)
    assert [p.id for p in await identity.proposals(limit=2)] == opened[:2]
    both = await identity.proposals(include_decided=True, limit=4)
    assert [p.id for p in both] == [*decided, opened[0]]
    first = both[0].decision
    assert first is not None and (first.proposal_id, first.decision, first.by_user_id) == (
        decided[0],
        "rejected",
        "u_alice",
    )
    assert both[0].status == "rejected" and both[3].decision is None
    assert await identity.count() == 3


async def test_listing_open_proposals_does_not_read_every_decision_for_each_proposal(
    engine: AsyncEngine, clock: Clock
) -> None:
    identity = IdentityStore(engine, clock=clock)
    await bulk_proposals(engine, 600, before=clock.now, decided=True)
    clock.advance(minutes=1)
    for i in range(3):
        await identity.propose(BOB, scope="global", content=f"Rule {i}", rationale="r")
    for include_decided in (False, True):
        plan = await query_plan(engine, identity.proposals_query(include_decided=include_decided))
        if engine.dialect.name == "sqlite":
            steps = [line for line in plan.splitlines() if " identity_decisions " in f"{line} "]
            assert steps and all(
                line.startswith("SEARCH identity_decisions USING") and "ix_identity_decisions_proposal_id" in line
                for line in steps
            ), plan
        else:
            # A probe of the unique index a proposal, or one hash of the decisions for an
            # anti-join: each decision read at most once, not once for each proposal.
            scans = pg_scans(plan, "identity_decisions")
            assert scans and pg_rows_visited(scans) <= 603, plan


async def test_the_list_tool_shows_a_new_open_proposal_and_says_when_there_are_more(
    engine: AsyncEngine, clock: Clock
) -> None:
    identity, writer = IdentityStore(engine, clock=clock), MemoryWriter(MemoryStore(engine))
    await bulk_proposals(engine, LIST_LIMIT + 1, before=clock.now, decided=True)
    clock.advance(minutes=1)
    fresh = await identity.propose(BOB, scope="global", content="Glossary: SOP = standing procedure", rationale="r")
    (line,) = (await identity_decide(identity, writer, ALICE, {"action": "list"})).splitlines()
    assert line.startswith(f"- {fresh.id} [open]"), line

    await bulk_proposals(engine, LIST_LIMIT, before=clock.now, decided=False)  # older than fresh
    lines = (await identity_decide(identity, writer, ALICE, {"action": "list"})).splitlines()
    assert len(lines) == LIST_LIMIT + 1 and all(f"- {fresh.id} " not in x for x in lines)
    assert lines[-1] == (f"(the oldest {LIST_LIMIT} of {LIST_LIMIT + 1} open proposals; decide these to see the rest)")
