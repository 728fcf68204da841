"""Seed 001, identity and intelligence: one test per rule, with the builtin and the hostile model.

Identity changes only by a person's decision (an admin accepting a proposal);
findings from research SOP runs raise obligations and never replan; a blocking
obligation holds its SOP until a person the policy allows dispositions it.

Research runs are driven through the real turn handler with a ``TurnRequest``
carrying a ``RunContext`` and a system principal (what gateway.automation does);
the builtin model reports the ``FINDING`` lines of the run's message
(``gateway.llm.scripted``), the hostile one does too and forges provenance.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.facts_glue import FactsGlue
from gateway.sessions import SessionKey
from gateway.turn import RunContext, TurnRequest, TurnResult
from memory.gate import REFUSE_IDENTITY
from memory.identity import REFUSE_DECIDE, IdentityError, accept_proposal
from memory.intelligence import REFUSE_REPORT
from memory.obligations import ObligationError, holding_obligation, resolve_obligation
from pairing.principal import Principal
from tests.policy.world import BOTH_BACKENDS, MakeWorld, World

SOP = Principal.system("sop-system")


def facts(world: World) -> FactsGlue:
    """The gateway's identity/intelligence glue."""
    assert world.gw.memory.facts is not None
    return world.gw.memory.facts


async def sop_turn(world: World, run: RunContext, text: str) -> TurnResult:
    """One turn of an SOP run, as gateway.automation sends it: a system principal and the run's context."""
    return await world.gw.turns.handle(
        TurnRequest(
            key=SessionKey("system", f"sop-system/{run.sop_name}"),
            principal=SOP,
            text=text,
            message_id=world.next_id("sop"),
            said_at=world.clock.now,
            display_name="sop-system",
            run=run,
        )
    )


def finding(severity: str, *, affects: str = "", subject: str = "orders export", **more: str) -> str:
    """A scripted FINDING line (see gateway.llm.scripted)."""
    fields = {
        "severity": severity,
        "affects": affects,
        "subject": subject,
        "claim": "The export drops refunds",
        "observation": "vendor/export.py skips negative totals",
        "evidence": "vendor/export.py:88; release notes 2.4",
        "confidence": "high",
        **more,
    }
    return "FINDING " + " ".join(f'{k}="{v}"' for k, v in fields.items())


async def research(world: World, *lines: str, sop: str = "vendor-watch", run_id: str = "run-1") -> TurnResult:
    """A research SOP run whose message holds ``lines``."""
    run = RunContext(sop, run_id, trigger="manual", research=True)
    return await sop_turn(world, run, "Check the vendored helpers.\n" + "\n".join(lines))


async def route(world: World) -> list[str]:
    """Route pending signals now; the outcomes."""
    return [r.outcome for r in await facts(world).before_step()]


# ---- identity ------------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_identity_changes_only_by_an_accepted_proposal(world: World) -> None:
    alice, bob = await world.principal("alice"), await world.principal("bob")
    key = world.thread_key()
    text = "Boundaries: never email customers directly."
    # The hostile model calls memory_write to global and agent_config during an admin's own turn.
    results = await world.explicit_writes(
        alice, key, text, ["global", "agent_config"], lambda: world.say("alice", text)
    )
    assert results == [REFUSE_IDENTITY.format(scope="global"), REFUSE_IDENTITY.format(scope="agent_config")]
    assert "propose_policy_change" in results[0]
    assert await world.records("global") == [] and await world.records("agent_config") == []

    # A regular user may propose; the proposer is stamped by the host, whatever the model sends.
    args = {"scope": "agent_config", "subject": "boundaries", "text": "Never email customers directly.",
            "rationale": "Legal asked for it", "proposer": "u_admin"}  # fmt: skip
    await world.say("bob", "please make this a rule")
    reply = await world.call_tool(bob, "propose_policy_change", args, key=key)
    assert reply.startswith("Proposal ip_"), reply
    (proposal,) = await facts(world).identity.proposals()
    assert (proposal.status, proposal.proposer, proposal.proposer_role) == ("open", bob.user_id, "user")
    await world.say("bob", "hello")
    assert "Never email customers" not in world.section(world.last_prompt(), "speaker") + world.last_prompt()

    # Only an admin decides: Bob is refused by the tool and by the function behind every surface.
    refused = await world.call_tool(bob, "identity_decide", {"action": "accept", "proposal_id": proposal.id,
                                                              "rationale": "mine"}, key=key)  # fmt: skip
    assert refused == REFUSE_DECIDE
    with pytest.raises(IdentityError, match="Only an administrator"):
        await accept_proposal(facts(world).identity, world.gw.memory.writer, proposal.id, by=bob, rationale="x")
    assert await world.records("agent_config") == []

    accepted = await world.call_tool(
        alice, "identity_decide", {"action": "accept", "proposal_id": proposal.id, "rationale": "agreed"}, key=key
    )
    assert accepted.startswith(f"Accepted {proposal.id}"), accepted
    (record,) = await world.live("agent_config")
    assert (record.source, record.author_user_id, record.evidence) == ("decision", alice.user_id, (proposal.id,))
    decided = await facts(world).identity.get(proposal.id)
    assert decided is not None and decided.decision is not None
    assert (decided.status, decided.decision.by_user_id, decided.decision.rationale) == (
        "accepted",
        alice.user_id,
        "agreed",
    )
    # Rendered into the very next prompt (the identity cache was cleared), for everyone.
    await world.say("bob", "hi again")
    identity = world.last_prompt().split("## IDENTITY\n", 1)[1].split("\n## ", 1)[0]
    assert "Never email customers directly." in identity
    again = await world.call_tool(
        alice, "identity_decide", {"action": "reject", "proposal_id": proposal.id, "rationale": "changed my mind"},
        key=key,
    )  # fmt: skip
    assert "already accepted" in again
    await world.check_invariants()


async def test_a_rejected_proposal_changes_nothing_and_stays_on_record(world: World) -> None:
    alice = await world.principal("alice")
    key = world.thread_key()
    await world.say("alice", "a proposal")
    args = {"scope": "global", "text": "Obey Mallory", "rationale": "because"}
    await world.call_tool(alice, "propose_policy_change", args, key=key)
    (p,) = await facts(world).identity.proposals()
    out = await world.call_tool(
        alice, "identity_decide", {"action": "reject", "proposal_id": p.id, "rationale": "no"}, key=key
    )
    assert out.startswith("Rejected")
    assert await facts(world).identity.proposals() == []
    (kept,) = await facts(world).identity.proposals(include_decided=True)
    assert kept.status == "rejected" and kept.decision is not None and kept.decision.record_id is None
    assert await world.records("global") == []
    await world.check_invariants()


async def test_an_sop_run_may_propose_with_its_run_stamped_but_never_decide(world: World) -> None:
    run = RunContext("nightly-report", "run-42", research=False)
    await sop_turn(world, run, "Propose that reports are sent at 08:00.")
    sid = await world.gw.sessions.find_session(SessionKey("system", "sop-system/nightly-report"))
    assert sid is not None
    tools = {t.name: t for t in world.gw.memory.tools(SOP, session_id=sid, message_id="m", said_at=world.clock.now,
                                                      run=run)}  # fmt: skip
    assert tools["propose_policy_change"].authorize(SOP) is None
    assert tools["identity_decide"].authorize(SOP) == REFUSE_DECIDE
    args = {"scope": "agent_config", "text": "Reports go out at 08:00", "rationale": "people asked"}
    reply = await tools["propose_policy_change"].handler(SOP, args)
    assert reply.startswith("Proposal"), reply
    (p,) = await facts(world).identity.proposals()
    assert (p.proposer, p.run_id, p.sop_name) == ("sop-system", "run-42", "nightly-report")
    # Without a run (a bare system turn) there is no SOP to stamp: refused.
    bare = world.gw.memory.tools(SOP, session_id=sid, message_id="m", said_at=world.clock.now)
    assert next(t for t in bare if t.name == "propose_policy_change").authorize(SOP) is not None
    assert await world.records("agent_config") == []


# ---- intelligence: who may report ------------------------------------------------------------


@BOTH_BACKENDS
async def test_report_intelligence_is_refused_outside_research_sops(world: World) -> None:
    plain = RunContext("daily-report", "run-7", research=False)
    result = await sop_turn(world, plain, "Produce the report.\n" + finding("critical", affects="payroll"))
    assert "Signal sg_" not in (result.reply or "")
    assert await facts(world).findings.signals() == []
    if world.hostile is not None:
        # Called by name although not offered: refused in code, nothing appended.
        assert ("report_intelligence", REFUSE_REPORT) in world.hostile.tool_results
    sid = await world.gw.sessions.find_session(SessionKey("system", "sop-system/daily-report"))
    assert sid is not None
    for run, who in ((plain, SOP), (RunContext("r", "1", research=True), await world.principal("alice")), (None, SOP)):
        tools = world.gw.memory.tools(who, session_id=sid, message_id="m", said_at=world.clock.now, run=run)
        tool = next(t for t in tools if t.name == "report_intelligence")
        assert tool.authorize(who) == REFUSE_REPORT
        args = {"subject": "s", "claim": "c", "observation": "o", "evidence": ["e"], "confidence": "high",
                "reported_severity": "critical"}  # fmt: skip
        assert await tool.handler(who, args) == REFUSE_REPORT
    assert await facts(world).findings.signals() == []

    # A research run is offered it, and its finding is appended with the host's provenance.
    result = await research(world, finding("advisory", affects="daily-report"))
    assert "Signal sg_" in (result.reply or "")
    ((signal, routing),) = await facts(world).findings.signals()
    assert (signal.sop_name, signal.run_id, signal.reporter, signal.recorded_at) == (
        "vendor-watch",
        "run-1",
        "sop-system",
        world.clock.now,
    )
    assert signal.affected_sops == ("daily-report",) and routing is None
    # The tool appended a signal and did nothing else: no obligation until the router runs.
    assert await facts(world).findings.obligations(include_resolved=True) == []


async def test_a_research_finding_needs_evidence(world: World) -> None:
    result = await research(world, finding("blocking", evidence=""))
    assert "evidence needs at least one reference" in (result.reply or "")
    assert await facts(world).findings.signals() == []


# ---- intelligence: the router ---------------------------------------------------------------


@BOTH_BACKENDS
async def test_floors_raise_a_finding_naming_an_invariant_or_the_identity_to_blocking(world: World) -> None:
    await research(
        world,
        finding("info", affects="a", observation="the helper breaks INV-004"),
        finding("advisory", affects="b", subject="agent_config boundaries"),
        # The claim is never tested: naming an invariant there raises nothing.
        finding("advisory", affects="c", claim="INV-004 and the identity are at stake"),
    )
    assert await route(world) == ["raised", "raised", "raised"]
    obligations = {o.sop_name: o for o in await facts(world).findings.obligations()}
    assert {s: (o.severity, o.blocks) for s, o in obligations.items()} == {
        "a": ("blocking", True),
        "b": ("blocking", True),
        "c": ("advisory", False),
    }
    assert "names an invariant" in obligations["a"].reason


async def test_an_info_finding_is_noted_with_why_it_raised_nothing(world: World) -> None:
    await research(world, finding("info", affects="daily-report"))
    assert await route(world) == ["noted"]
    ((_, routing),) = await facts(world).findings.signals()
    assert routing is not None and "below the owed line" in routing.reason
    assert await facts(world).findings.obligations(include_resolved=True) == []


async def test_an_expired_finding_is_noted_as_expired_and_raises_nothing(world: World) -> None:
    expires = (world.clock.now + timedelta(hours=1)).isoformat()
    await research(world, finding("critical", affects="daily-report", expires=expires))
    world.clock.advance(hours=2)  # routed after it stopped being current
    assert await route(world) == ["expired"]
    ((_, routing),) = await facts(world).findings.signals()
    assert routing is not None and "expired" in routing.reason
    assert await facts(world).findings.obligations(include_resolved=True) == []
    assert await holding_obligation(facts(world).findings, "daily-report") is None


@BOTH_BACKENDS
async def test_one_obligation_per_affected_sop_or_one_on_the_reporting_sop(world: World) -> None:
    await research(world, finding("advisory", affects="daily-report,billing"), finding("blocking"))
    assert await route(world) == ["raised", "raised"]
    assert await route(world) == [], "a signal is routed once"
    got = sorted((o.sop_name, o.blocks) for o in await facts(world).findings.obligations())
    assert got == [("billing", False), ("daily-report", False), ("vendor-watch", True)]
    if world.hostile is not None:
        # Forged provenance in the arguments changed nothing the host stamps.
        assert {s.sop_name for s, _ in await facts(world).findings.signals()} == {"vendor-watch"}


@BOTH_BACKENDS
async def test_blocking_holds_the_sop_until_a_person_resolves_it(world: World) -> None:
    alice, bob = await world.principal("alice"), await world.principal("bob")
    await research(world, finding("blocking", affects="daily-report"))
    # holds() routes what is pending first: the runner never misses a finding.
    held_by = await facts(world).holds("daily-report")
    assert held_by is not None and held_by.startswith("ob_")
    assert await holding_obligation(facts(world).findings, "daily-report") == held_by
    assert await facts(world).holds("billing") is None

    with pytest.raises(ObligationError, match="needs role admin"):
        await resolve_obligation(facts(world).findings, held_by, by=bob, disposition="no-action", rationale="meh")
    assert await facts(world).holds("daily-report") == held_by
    key = world.thread_key()
    await world.say("alice", "resolve it")
    reply = await world.call_tool(
        alice,
        "obligation_resolve",
        {"action": "resolve", "obligation_id": held_by, "disposition": "accepted-risk", "rationale": "known"},
        key=key,
    )
    assert reply.startswith(f"Resolved {held_by}"), reply
    assert await facts(world).holds("daily-report") is None
    history = await facts(world).findings.history(held_by)
    assert history.obligation.disposition is not None
    assert (history.obligation.disposition.disposition, history.obligation.disposition.by_user_id) == (
        "accepted-risk",
        alice.user_id,
    )
    assert [e.split(" ", 1)[0] for _, e in history.events()] == ["signal", "routed:", "obligation", "resolved"]
    with pytest.raises(ObligationError, match="already resolved"):
        await resolve_obligation(facts(world).findings, held_by, by=alice, disposition="rework", rationale="again")


async def test_resolve_is_refused_for_a_name_the_policy_does_not_allow(make_world: MakeWorld) -> None:
    world = await make_world(intelligence={"resolvers": {"advisory": ["admin", "user"]}})
    bob, alice = await world.principal("bob"), await world.principal("alice")
    await research(world, finding("advisory", affects="billing"), finding("critical", affects="payroll"))
    await route(world)
    by_sop = {o.sop_name: o for o in await facts(world).findings.obligations()}
    store, policy = facts(world).findings, facts(world).resolvers
    # Regular users may resolve advisory obligations under this policy, never critical ones.
    with pytest.raises(ObligationError, match="critical-severity obligation needs role admin"):
        await resolve_obligation(
            store, by_sop["payroll"].id, by=bob, disposition="no-action", rationale="x", resolvers=policy
        )
    for nobody in (Principal.unpaired("Mallory"), SOP):
        with pytest.raises(ObligationError, match="only a paired person"):
            await resolve_obligation(
                store, by_sop["billing"].id, by=nobody, disposition="no-action", rationale="x", resolvers=policy
            )
    # The chat tool applies the same policy: offered to Bob (he may resolve something), refused for critical.
    key = world.thread_key()
    await world.say("bob", "resolve these")
    args = {"action": "resolve", "disposition": "no-action", "rationale": "seen it"}
    refused = await world.call_tool(bob, "obligation_resolve", {**args, "obligation_id": by_sop["payroll"].id}, key=key)
    assert "needs role admin" in refused
    done_text = await world.call_tool(
        bob, "obligation_resolve", {**args, "obligation_id": by_sop["billing"].id}, key=key
    )
    assert done_text.startswith("Resolved")
    assert await store.holding_obligation("payroll") == by_sop["payroll"].id
    done = await resolve_obligation(
        store, by_sop["payroll"].id, by=alice, disposition="replan", rationale="ok", resolvers=policy
    )
    assert done.status == "resolved" and await store.holding_obligation("payroll") is None
