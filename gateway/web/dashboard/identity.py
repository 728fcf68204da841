"""Identity: the current identity records, open proposals with accept / reject, the decision history.

policy (seed 001, "Identity changes only by a person's decision"): the agent's
identity is never written, only decided. Accept and reject call
``memory.identity.accept_proposal`` / ``reject_proposal``, what ``goclaw
identity accept|reject`` and the ``identity_decide`` chat tool call; their
``authorize_decide`` is the check (a paired admin), and a rationale is required
by them, not by this page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from gateway.web.dashboard import facts_queries
from gateway.web.dashboard.base import DashError, act, action, field, gateway_of, page, render
from memory.identity import LIST_LIMIT, accept_proposal, reject_proposal
from pairing.principal import Principal

if TYPE_CHECKING:
    from gateway.facts_glue import FactsGlue

IDENTITY_SCOPES = ("agent_config", "global")
BACK = "/dashboard/identity"


def facts_of(request: web.Request) -> FactsGlue:
    """The gateway's identity / findings glue (``gw.memory.facts``), or a 409 when memory has none."""
    facts: FactsGlue | None = getattr(gateway_of(request).memory, "facts", None)
    if facts is None:
        raise DashError(409, "this gateway has no identity and findings store (memory.facts is not set up)")
    return facts


@page
async def identity(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/identity: what the identity says now and how each item came to be; proposals; decisions."""
    gw = gateway_of(request)
    facts = facts_of(request)
    how = await facts.identity.provenance()
    current = [
        (rec, how.get(rec.id)) for scope in IDENTITY_SCOPES for rec in await gw.memory.store.list_records(scope=scope)
    ]
    proposals = await facts.identity.proposals(limit=LIST_LIMIT)
    # A listing stops at its limit: how many wait in all, so the page says when it shows only the oldest.
    waiting = await facts.identity.count() if len(proposals) >= LIST_LIMIT else len(proposals)
    after = request.query.get("after")
    history = await facts_queries.decisions_page(gw.engine, after=after)
    return render(
        request,
        "identity.html",
        {
            "title": "Identity",
            "current": current,
            "proposals": proposals,
            "waiting": waiting,
            "history": history,
            "first": bool(after),
        },
    )


async def _decide(request: web.Request, verb: str) -> web.StreamResponse:
    gw = gateway_of(request)
    facts = facts_of(request)
    form = await request.post()
    pid = field(form, "id", max_len=40)
    rationale = field(form, "rationale", required=False, max_len=4000)

    async def run(who: Principal) -> str:
        if verb == "accept":
            done = await accept_proposal(
                facts.identity,
                facts.writer,
                pid,
                by=who,
                rationale=rationale,
            )
            gw.memory.forget_identity()  # as the chat tool does: the next prompt has the new identity
            retired = f"; it retires {', '.join(done.retired)}" if done.retired else ""
            return f"Accepted {pid}: identity record {done.record.id} is now in every prompt{retired}."
        await reject_proposal(facts.identity, pid, by=who, rationale=rationale)
        return f"Rejected {pid}; it stays on record with your rationale."

    return await act(request, f"identity {verb}", f"{pid}: {rationale}", run, back=BACK)


@action
async def accept(request: web.Request) -> web.StreamResponse:
    """POST: accept an open proposal (it becomes the identity record through the one write gate)."""
    return await _decide(request, "accept")


@action
async def reject(request: web.Request) -> web.StreamResponse:
    """POST: reject an open proposal (it stays on record with the decision)."""
    return await _decide(request, "reject")
