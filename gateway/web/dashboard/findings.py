"""Findings and obligations: signals (raised, noted, expired, pending) and obligations with resolve.

policy (seed 001, "Intelligence: findings raise obligations, they never
replan"): a finding is routed by code, and an obligation is closed only by a
person's disposition. Resolve calls ``memory.obligations.resolve_obligation``
with the gateway's ``intelligence.resolvers``, what ``goclaw obligation
resolve`` and the ``obligation_resolve`` chat tool call; who may resolve which
severity is its check. "Route now" calls ``route_pending`` (``goclaw signals route``).
"""

from __future__ import annotations

from aiohttp import web

from gateway.web.dashboard import facts_queries
from gateway.web.dashboard.base import DashError, act, action, field, gateway_of, page, render
from gateway.web.dashboard.identity import facts_of
from memory.facts_models import DISPOSITIONS
from memory.obligations import resolve_obligation, resolvers_for, route_pending
from pairing.principal import Principal, is_human_admin

BACK = "/dashboard/findings"


@page
async def findings(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/findings: open obligations (resolve), signals by outcome, resolved obligations."""
    gw = gateway_of(request)
    facts = facts_of(request)
    store = facts.findings
    resolvers = facts.resolvers
    open_ = []
    for o in await store.obligations():  # open ones: the CLI's `goclaw obligations`
        open_.append((o, await store.signal(o.signal_id), resolvers_for(o.severity, resolvers)))
    resolved_after = request.query.get("resolved_after")
    resolved = await facts_queries.resolved_page(gw.engine, after=resolved_after)
    outcome = request.query.get("outcome", "")
    after = request.query.get("after")
    page_ = await facts_queries.signals_page(gw.engine, outcome=outcome, after=after)
    return render(
        request,
        "findings.html",
        {
            "title": "Findings & obligations",
            "open": open_,
            "resolved": resolved,
            "signals": page_,
            "outcome": outcome,
            "outcomes": facts_queries.OUTCOMES,
            "dispositions": DISPOSITIONS,
            "first": bool(after),
            "resolved_first": bool(resolved_after),
        },
    )


@action
async def resolve(request: web.Request) -> web.StreamResponse:
    """POST: resolve an open obligation with a disposition and a rationale."""
    facts = facts_of(request)
    form = await request.post()
    oid = field(form, "id", max_len=40)
    disposition = field(form, "disposition", max_len=24)
    rationale = field(form, "rationale", required=False, max_len=2000)

    async def run(who: Principal) -> str:
        done = await resolve_obligation(
            facts.findings,
            oid,
            by=who,
            disposition=disposition,
            rationale=rationale,
            resolvers=facts.resolvers,
        )
        freed = f"; {done.sop_name} is no longer held by it" if done.blocks else ""
        return f"Resolved {oid} as {disposition}{freed}."

    return await act(request, "obligation resolve", f"{oid} {disposition}: {rationale}", run, back=BACK)


@action
async def route(request: web.Request) -> web.StreamResponse:
    """POST: route every pending signal now (the scheduler does this before each step)."""
    facts = facts_of(request)

    async def run(who: Principal) -> str:
        if not is_human_admin(who):
            raise DashError(403, "only a human admin may route signals by hand")
        done = await route_pending(facts.findings, facts.policy)
        if not done:
            return "No pending signals."
        return "Routed: " + "; ".join(f"{r.signal_id} {r.outcome} ({r.severity})" for r in done)

    return await act(request, "signals route", "route pending signals", run, back=BACK)
