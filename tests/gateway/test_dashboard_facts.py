"""The identity and findings pages over real HTTP on SQLite and PostgreSQL.

Every decision goes through memory's functions (the CLI's and the chat
tools'): a missing rationale, a second decision, a disposition not in the list
and a severity the resolvers policy keeps from admins are their refusals, shown
as a 400 and audited, and nothing changes.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from gateway.automation import api
from gateway.facts_glue import FactsGlue
from gateway.web.dashboard.base import PAGE_SIZE
from memory.intelligence import Report
from pairing.principal import Principal, Role
from tests.gateway.dashboard_http import Dash, audit_rows, dashboard
from tests.memory.conftest import bulk_proposals

SOPS: dict[str, Any] = {
    "automation": {
        "sops": [
            {"name": "daily-report", "instruction": "Write the daily orders report.", "trigger": {"manual": True}},
            {
                "name": "vendor-watch",
                "instruction": "Check the vendored export helper.",
                "trigger": {"manual": True},
                "research": True,
            },
        ]
    }
}


def _facts(d: Dash) -> FactsGlue:
    assert d.gw.memory.facts is not None
    return d.gw.memory.facts


def _flash(page: str) -> str:
    m = re.search(r'class="flash [a-z]+"[^>]*>([^<]+)<', page)
    return m.group(1) if m else ""


@pytest.fixture
async def dash(db_url: str) -> AsyncIterator[Dash]:
    async with dashboard(db_url, SOPS) as d:
        yield d


async def _bob(d: Dash) -> Principal:
    bob = await d.gw.pairing.add_user("Bob Chen", "user")
    return Principal.human(bob.id, Role.USER, "Bob Chen")


async def test_accepting_a_proposal_makes_it_the_identity_with_the_decision_kept(dash: Dash) -> None:
    facts = _facts(dash)
    status, page = await dash.get("/dashboard/identity")
    assert status == 200 and 'id="identity-empty"' in page and 'id="proposals-empty"' in page
    p = await facts.identity.propose(
        await _bob(dash),
        scope="agent_config",
        subject="boundaries",
        content="Never email customers directly.",
        rationale="Legal asked for it",
    )
    _, page = await dash.get("/dashboard/identity")
    assert f'class="proposal" data-id="{p.id}"' in page and "Legal asked for it" in page
    _, overview = await dash.get("/dashboard/")
    assert "1 identity proposal(s) await a decision" in overview

    # No rationale: the function refuses (a decision keeps its why); nothing changes.
    status, page = await dash.post("/dashboard/identity/accept", id=p.id, rationale="")
    assert status == 400 and "rationale" in page
    assert (await facts.identity.get(p.id)).status == "open"  # type: ignore[union-attr]

    status, page = await dash.post("/dashboard/identity/accept", id=p.id, rationale="agreed with legal")
    assert status == 200 and f"Accepted {p.id}" in _flash(page)
    decided = await facts.identity.get(p.id)
    assert decided is not None and decided.decision is not None
    assert (decided.status, decided.decision.by_user_id, decided.decision.rationale) == (
        "accepted",
        "admin",
        "agreed with legal",
    )
    record = decided.decision.record_id
    current = re.search(r'id="current">(.*?)</section>', page, re.S)
    assert current and f'data-id="{record}"' in current.group(1) and "accepted by admin" in current.group(1)
    assert f'class="proposal" data-id="{p.id}"' not in page
    assert f'class="decision" data-proposal="{p.id}"' in page
    # In the very next prompt: the cache was cleared, as the chat tool does.
    assert "Never email customers directly." in await dash.gw.memory.identity()

    status, page = await dash.post("/dashboard/identity/accept", id=p.id, rationale="again")
    assert status == 400 and "already accepted" in page
    rows = audit_rows(await dash.gw.pairing.audit_log())
    assert {("dashboard", "admin", "identity accept", "ok"), ("dashboard", "admin", "identity accept", "error")} <= rows


async def test_every_open_proposal_is_counted_and_a_new_one_is_listed_after_hundreds_decided(dash: Dash) -> None:
    facts = _facts(dash)
    await bulk_proposals(dash.gw.engine, 501, before=facts.identity.now(), decided=True)
    p = await facts.identity.propose(
        await _bob(dash), scope="global", content="Glossary: SOP = standing procedure", rationale="r"
    )
    _, page = await dash.get("/dashboard/identity")
    assert f'class="proposal" data-id="{p.id}"' in page
    _, overview = await dash.get("/dashboard/")
    assert "1 identity proposal(s) await a decision" in overview
    # More open than a listing holds: the warning still counts them all.
    await bulk_proposals(dash.gw.engine, 600, before=facts.identity.now(), decided=False)
    _, overview = await dash.get("/dashboard/")
    assert "601 identity proposal(s) await a decision" in overview
    _, page = await dash.get("/dashboard/identity")  # the page lists the oldest 500 and says so
    assert page.count('class="proposal" data-id=') == 500
    assert "The oldest 500 of 601 open proposals: decide these to see the rest." in page


async def test_rejected_proposals_stay_on_record_and_the_history_is_keyset_paged(dash: Dash) -> None:
    facts = _facts(dash)
    bob = await _bob(dash)
    made = []
    for i in range(PAGE_SIZE + 3):
        p = await facts.identity.propose(bob, scope="global", content=f"Rule number {i}", rationale="why not")
        made.append(p.id)
    status, page = await dash.post("/dashboard/identity/reject", id=made[0], rationale="a preference, not a rule")
    assert status == 200 and f"Rejected {made[0]}" in _flash(page)
    assert (await facts.identity.get(made[0])).status == "rejected"  # type: ignore[union-attr]
    assert await dash.gw.memory.store.list_records(scope="global") == []
    for pid in made[1:]:
        await dash.post("/dashboard/identity/reject", id=pid, rationale="no")
    _, first = await dash.get("/dashboard/identity")
    seen = re.findall(r'class="decision" data-proposal="([^"]+)"', first)
    nxt = re.search(r'href="\?after=([^"#]+)#decisions"', first)
    assert len(seen) == PAGE_SIZE and nxt
    _, second = await dash.get(f"/dashboard/identity?after={nxt.group(1)}")
    more = re.findall(r'class="decision" data-proposal="([^"]+)"', second)
    assert len(more) == 3 and set(seen) | set(more) == set(made) and not set(seen) & set(more)
    status, page = await dash.get("/dashboard/identity?after=nonsense")
    assert status == 400 and "cursor" in page
    status, page = await dash.post("/dashboard/identity/reject", id="ip_nope", rationale="x")
    assert status == 400 and "ip_nope" in page


async def _report(facts: FactsGlue, severity: str, claim: str, **extra: Any) -> str:
    args = {
        "subject": "orders export",
        "claim": claim,
        "observation": extra.pop("observation", "vendor/export.py skips negative totals"),
        "evidence": ("vendor/export.py:88",),
        "confidence": "high",
        "reported_severity": severity,
        "affected_sops": ("daily-report",),
    }
    s = await facts.findings.append_signal(
        Report(**{**args, **extra}), sop_name="vendor-watch", run_id="r_test", reporter="sop-system"
    )
    return s.id


async def test_findings_are_routed_and_a_resolved_obligation_frees_its_sop(dash: Dash) -> None:
    facts = _facts(dash)
    raised = await _report(
        facts, "advisory", "The export drops refunds", observation="skips negative totals, against INV-002"
    )
    noted = await _report(facts, "info", "The export is slow")
    past = facts.findings.now() - timedelta(days=1)
    expired = await _report(facts, "blocking", "Old news", expires_at=past)
    _, page = await dash.get("/dashboard/findings")
    assert page.count('data-outcome="pending"') == 3

    status, page = await dash.post("/dashboard/findings/route")
    assert status == 200 and "Routed" in _flash(page)
    outcomes = dict(re.findall(r'class="signal" data-id="([^"]+)" data-outcome="([^"]+)"', page))
    assert outcomes == {raised: "raised", noted: "noted", expired: "expired"}
    _, only_noted = await dash.get("/dashboard/findings?outcome=noted")
    assert re.findall(r'class="signal" data-id="([^"]+)"', only_noted) == [noted]
    [ob] = await facts.findings.obligations()
    assert ob.signal_id == raised and ob.holds and ob.severity == "blocking"
    assert f'class="obligation" id="{ob.id}"' in page and f"holds {ob.sop_name}" in page
    _, overview = await dash.get("/dashboard/")
    assert f"SOP daily-report is held by obligation {ob.id}" in overview

    # The SOP page shows the obligation holding it; a run now is recorded held.
    _, sop_page = await dash.get("/dashboard/sops/daily-report")
    assert f'class="held-by">{ob.id}<' in sop_page and "names an invariant" in sop_page
    _, after_run = await dash.post("/dashboard/sops/run", name="daily-report")
    assert f"held by obligation {ob.id}" in _flash(after_run)

    # Refusals are the function's: a disposition not in the list, no rationale.
    status, page = await dash.post("/dashboard/findings/resolve", id=ob.id, disposition="ignore", rationale="x")
    assert status == 400 and "accepted-risk" in page
    status, page = await dash.post("/dashboard/findings/resolve", id=ob.id, disposition="rework", rationale="")
    assert status == 400 and "rationale" in page
    assert (await facts.findings.obligation(ob.id)).holds  # type: ignore[union-attr]

    status, page = await dash.post(
        "/dashboard/findings/resolve", id=ob.id, disposition="accepted-risk", rationale="refunds reconciled by hand"
    )
    assert status == 200 and f"Resolved {ob.id} as accepted-risk" in _flash(page)
    done = await facts.findings.obligation(ob.id)
    assert done is not None and done.disposition is not None and not done.holds
    assert (done.disposition.by_user_id, done.disposition.by_role) == ("admin", "admin")
    assert 'id="obligations-empty"' in page and f'class="resolved" data-id="{ob.id}"' in page
    _, after_run = await dash.post("/dashboard/sops/run", name="daily-report")
    assert "Ran daily-report" in _flash(after_run)
    runs = await api.list_runs(dash.gw.automation.store, "daily-report")
    assert [r.status for r in runs] == ["ok", "held"]
    rows = audit_rows(await dash.gw.pairing.audit_log())
    assert {("dashboard", "admin", "obligation resolve", "ok"), ("dashboard", "admin", "signals route", "ok")} <= rows
    assert ("dashboard", "admin", "obligation resolve", "error") in rows
    status, page = await dash.get("/dashboard/findings?outcome=lost")
    assert status == 400 and "raised, noted, expired, pending" in page


@pytest.fixture
async def users_resolve(db_url: str) -> AsyncIterator[Dash]:
    cfg = {**SOPS, "intelligence": {"resolvers": {"blocking": ["user"]}}}
    async with dashboard(db_url, cfg) as d:
        yield d


async def test_who_may_resolve_is_the_resolvers_policy_not_the_page(users_resolve: Dash) -> None:
    facts = _facts(users_resolve)
    await _report(facts, "blocking", "The export drops refunds")
    await users_resolve.post("/dashboard/findings/route")
    [ob] = await facts.findings.obligations()
    status, page = await users_resolve.post(
        "/dashboard/findings/resolve", id=ob.id, disposition="rework", rationale="fix it"
    )
    assert status == 400 and "needs role user" in page and "intelligence.resolvers" in page
    assert (await facts.findings.obligation(ob.id)).disposition is None  # type: ignore[union-attr]


async def test_resolved_obligations_and_signals_are_keyset_paged(dash: Dash) -> None:
    facts = _facts(dash)
    admin = Principal.human("admin", Role.ADMIN, "Dashboard")
    for i in range(PAGE_SIZE + 2):
        await _report(facts, "blocking", f"Finding {i}")
    await facts.before_step()
    made = {o.id for o in await facts.findings.obligations()}
    assert len(made) == PAGE_SIZE + 2
    for oid in made:
        await facts.findings.resolve(oid, by=admin, disposition="no-action", rationale="fine")
    _, first = await dash.get("/dashboard/findings")
    seen = re.findall(r'class="resolved" data-id="([^"]+)"', first)
    nxt = re.search(r'href="\?resolved_after=([^"#]+)#resolved"', first)
    assert len(seen) == PAGE_SIZE and nxt and 'id="obligations-empty"' in first
    _, second = await dash.get(f"/dashboard/findings?resolved_after={nxt.group(1)}")
    more = re.findall(r'class="resolved" data-id="([^"]+)"', second)
    assert len(more) == 2 and set(seen) | set(more) == made
    assert "Finding " in second  # each row names the claim it came from
    signals = re.findall(r'class="signal" data-id="([^"]+)"', first)
    nxt = re.search(r'href="\?outcome=&amp;after=([^"#]+)#signals"', first)
    assert len(signals) == PAGE_SIZE and nxt
    _, second = await dash.get(f"/dashboard/findings?outcome=&after={nxt.group(1)}")
    rest = re.findall(r'class="signal" data-id="([^"]+)"', second)
    assert len(rest) == 2 and not set(signals) & set(rest)
