"""A small world for the dashboard's browser tests and screenshots: people, codes, memory, a revision, turns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiohttp import web

from gateway.app import Gateway
from gateway.automation import api
from gateway.config import Config
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from memory.identity import accept_proposal
from memory.intelligence import Report
from pairing.principal import Principal, Role

TOKEN = "dashboard-browser-token-0123456789abcdef"
SOPS = [
    {"name": "summary", "instruction": "Summarise yesterday's open questions.", "trigger": {"manual": True}},
    {
        "name": "daily-report",
        "instruction": "Produce the daily report from the daily report data source.",
        "trigger": {"cron": "0 7 * * 1-5", "tz": "Europe/Berlin"},
    },
    {"name": "queue-check", "instruction": "Check the import queue.", "trigger": {"every": "15m"}, "enabled": False},
    {
        "name": "vendor-watch",
        "instruction": "Check the vendored export helper.",
        "trigger": {"cron": "30 6 * * *"},
        "research": True,
    },
]
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@dataclass
class World:
    gw: Gateway
    base: str
    alice: str
    bob: str
    carol: str
    dana_code: str
    old_note: str  # retired by new_note (a revision to undo)
    new_note: str
    revision: str
    unverified: str
    proposal: str  # an open identity proposal
    obligation: str  # an open blocking obligation holding daily-report


async def seed(gw: Gateway) -> World:
    """People, two pending codes, notes with a retirement, a quarantined record, personal memory, turns."""
    pairing = gw.pairing
    alice = (await pairing.add_user("Alice Martin", "user", links=["discord:1001"])).id
    bob = (await pairing.add_user("Bob Chen", "user", links=["teams:29:bob"])).id
    carol = (await pairing.add_user("Carol Diaz", "admin", links=["discord:1003", "teams:29:carol"])).id
    dana = await pairing.request_code("discord", "2004", "Dana Okafor")
    await pairing.request_code("teams", "29:erin", "Erin Walsh")
    carol_p = Principal.human(carol, Role.ADMIN, "Carol Diaz")
    bob_p = Principal.human(bob, Role.USER, "Bob Chen")
    alice_p = Principal.human(alice, Role.USER, "Alice Martin")
    writer = gw.memory.writer
    old = await writer.write(
        carol_p,
        "agent_notes",
        "directive",
        subject="daily report data source",
        content="The daily report uses example_metrics",
        said_at=T0,
        session_id="s_seed",
    )
    new = await writer.write(
        carol_p,
        "agent_notes",
        "directive",
        subject="daily report data source",
        content="The daily report uses example_orders",
        said_at=T0 + timedelta(days=3),
        session_id="s_seed",
    )
    await writer.write(
        carol_p,
        "agent_notes",
        "directive",
        subject="deploy window",
        content="Deploys happen on Tuesdays after 14:00 UTC",
        said_at=T0 + timedelta(days=1),
    )
    quarantined = await writer.write(
        bob_p,
        "agent_notes",
        "relearn",
        subject="weekly report source",
        content="The weekly report uses example_archive",
        said_at=T0 + timedelta(days=2),
        evidence=("a_seedarchive",),
    )
    await writer.write(
        alice_p,
        "personal",
        "live",
        subject="preferred name",
        content="Alice prefers to be called Ali",
        said_at=T0 + timedelta(days=2),
        owner_user_id=alice,
    )
    assert old.record and new.record and quarantined.record
    revs = await gw.memory.store.revisions_for(old.record.id)
    assert revs, "the second note should have retired the first"
    for i, text in enumerate(["What is the daily report data source?", "When do deploys happen?"]):
        await gw.turns.handle(
            TurnRequest(
                key=SessionKey("web", "admin/dashboard"),
                principal=Principal.human("admin", Role.ADMIN, "Dashboard"),
                text=text,
                message_id=f"seed-{i}",
                said_at=T0 + timedelta(days=4, minutes=i),
                display_name="Dashboard",
            )
        )
    await api.run_now(gw.automation.runner, "daily-report")  # a run in its history
    proposal, obligation = await seed_facts(gw, carol_p, bob_p)
    return World(
        gw,
        "",
        alice,
        bob,
        carol,
        dana.code,
        old.record.id,
        new.record.id,
        revs[0].id,
        quarantined.record.id,
        proposal,
        obligation,
    )


async def seed_facts(gw: Gateway, carol: Principal, bob: Principal) -> tuple[str, str]:
    """An accepted and an open identity proposal; findings routed to a noted signal and a holding obligation."""
    facts = gw.memory.facts
    assert facts is not None
    first = await facts.identity.propose(
        carol, scope="agent_config", subject="tone", content="Answer in plain English.", rationale="house style"
    )
    await accept_proposal(facts.identity, facts.writer, first.id, by=carol, rationale="agreed in the team meeting")
    open_ = await facts.identity.propose(
        bob,
        scope="agent_config",
        subject="boundaries",
        content="Never email customers directly.",
        rationale="Legal asked for it",
    )
    for severity, claim, observation in (
        ("info", "The export helper is slower since 2.4", "runs take 40 s instead of 25 s"),
        ("advisory", "The export drops refunds since 2.4", "skips negative totals, against INV-002"),
    ):
        report = Report(
            subject="orders export",
            claim=claim,
            observation=observation,
            evidence=("vendor/export.py:88", "vendor CHANGELOG 2.4"),
            confidence="high",
            reported_severity=severity,
            affected_sops=("daily-report",),
        )
        await facts.findings.append_signal(report, sop_name="vendor-watch", run_id="r_seed", reporter="cron-system")
    await facts.before_step()
    [ob] = await facts.findings.obligations()
    return open_.id, ob.id


@asynccontextmanager
async def served_world(sqlite_url: str) -> AsyncIterator[World]:
    """A seeded gateway serving on 127.0.0.1 (an ephemeral port)."""
    cfg = Config.model_validate(
        {"database": {"url": sqlite_url}, "server": {"dashboard_token": TOKEN}, "automation": {"sops": SOPS}}
    )
    gw = Gateway(cfg)
    await gw.start(channels=False, worker=False)
    world = await seed(gw)
    runner = web.AppRunner(gw.web)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    world.base = f"http://127.0.0.1:{port}"
    try:
        yield world
    finally:
        await runner.cleanup()
        await gw.stop()
