"""The identity and findings pages' long lists: keyset pages over memory's insert-only fact tables (read-only).

The short action lists (open proposals, open obligations) come from the
stores' own functions, the ones the CLI prints; these pages only read the
histories, newest first, keyset-paged so they stay cheap as they grow.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from msgspec import Struct
from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.web.dashboard.base import PAGE_SIZE, DashError, Page, decode_cursor, keyset_page
from memory.facts_models import (
    IdentityDecision,
    IdentityProposal,
    IntelligenceSignal,
    Obligation,
    ObligationDisposition,
    SignalRouting,
)
from memory.identity import DecisionView, ProposalView, _decision_view
from memory.intelligence import SignalView
from memory.obligations import DispositionView, ObligationView, RoutingView, _signal

P = IdentityProposal.__table__.c
D = IdentityDecision.__table__.c
S = IntelligenceSignal.__table__.c
RT = SignalRouting.__table__.c
O = Obligation.__table__.c  # noqa: E741
OD = ObligationDisposition.__table__.c
OUTCOMES = ("raised", "noted", "expired", "pending")


class Decided(Struct, frozen=True):
    """One row of the decision history: the decision and the proposal it decided (None: written directly)."""

    decision: DecisionView
    proposal: ProposalView | None


class SignalRow(Struct, frozen=True):
    """A signal and its routing (None while pending)."""

    signal: SignalView
    routing: RoutingView | None

    @property
    def outcome(self) -> str:
        """``raised`` (routed to obligations), ``noted``, ``expired`` or ``pending``."""
        return self.routing.outcome if self.routing else "pending"


def _newest_first(q: Any, at: Any, key: Any, cursor: tuple[Any, ...] | None, limit: int) -> Any:
    if cursor is not None:
        c_at, c_id = cursor
        q = q.where(or_(at < c_at, and_(at == c_at, key < c_id)))
    return q.order_by(at.desc(), key.desc()).limit(limit + 1)


async def decisions_page(engine: AsyncEngine, *, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """Identity decisions newest first (accepted, rejected, written directly), each with its proposal."""
    cols = [c.label(f"p_{c.key}") for c in IdentityProposal.__table__.c]
    q = select(IdentityDecision.__table__, *cols).outerjoin(IdentityProposal.__table__, P.id == D.proposal_id)
    q = _newest_first(q, D.at, D.id, decode_cursor(after, (datetime, str)), limit)
    out: list[Decided] = []
    async with engine.connect() as conn:
        for row in await conn.execute(q):
            m = row._mapping
            proposal = None
            if m["p_id"] is not None:
                fields = {k: m[f"p_{k}"] for k in ProposalView.__struct_fields__ if k != "decision"}
                proposal = ProposalView(**fields)
            out.append(Decided(_decision_view(row), proposal))
    return keyset_page(out, limit, lambda d: (d.decision.at, d.decision.id))


async def signals_page(engine: AsyncEngine, *, outcome: str, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """Signals newest recorded first, with their routing; ``outcome`` filters (empty: all)."""
    if outcome and outcome not in OUTCOMES:
        raise DashError(400, f"unknown outcome {outcome!r}: use one of {', '.join(OUTCOMES)}")
    cols = [c.label(f"r_{c.key}") for c in SignalRouting.__table__.c]
    q = select(IntelligenceSignal.__table__, *cols).outerjoin(SignalRouting.__table__, RT.signal_id == S.id)
    if outcome == "pending":
        q = q.where(RT.signal_id.is_(None))
    elif outcome:
        q = q.where(RT.outcome == outcome)
    q = _newest_first(q, S.recorded_at, S.id, decode_cursor(after, (datetime, str)), limit)
    out: list[SignalRow] = []
    async with engine.connect() as conn:
        for row in await conn.execute(q):
            m = row._mapping
            routing = None
            if m["r_signal_id"] is not None:
                routing = RoutingView(
                    m["r_signal_id"],
                    m["r_routed_at"],
                    m["r_severity"],
                    m["r_outcome"],
                    m["r_reason"],
                    tuple(m["r_floors"] or ()),
                )
            out.append(SignalRow(_signal(row), routing))
    return keyset_page(out, limit, lambda r: (r.signal.recorded_at, r.signal.id))


async def resolved_page(engine: AsyncEngine, *, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """Resolved obligations, newest disposition first, each with the signal it came from."""
    cols = [c.label(f"d_{c.key}") for c in ObligationDisposition.__table__.c]
    scols = [c.label(f"s_{c.key}") for c in IntelligenceSignal.__table__.c]
    q = (
        select(Obligation.__table__, *cols, *scols)
        .join(ObligationDisposition.__table__, OD.obligation_id == O.id)
        .join(IntelligenceSignal.__table__, S.id == O.signal_id)
    )
    q = _newest_first(q, OD.at, O.id, decode_cursor(after, (datetime, str)), limit)
    out: list[tuple[ObligationView, SignalView]] = []
    async with engine.connect() as conn:
        for row in await conn.execute(q):
            m = row._mapping
            d = DispositionView(
                m["d_obligation_id"], m["d_disposition"], m["d_by_user_id"], m["d_by_role"], m["d_at"], m["d_rationale"]
            )
            ob = ObligationView(
                m["id"], m["signal_id"], m["sop_name"], m["severity"], bool(m["blocks"]), m["opened_at"], m["reason"], d
            )
            out.append((ob, _signal(_Prefixed(m, "s_"))))
    return keyset_page(out, limit, lambda r: (r[0].disposition.at, r[0].id))


class _Prefixed:
    """A row's ``s_``-labelled columns seen as the signal row ``_signal`` reads."""

    def __init__(self, m: Any, prefix: str) -> None:
        self._mapping = {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)}


__all__ = ["OUTCOMES", "Decided", "SignalRow", "decisions_page", "resolved_page", "signals_page"]
