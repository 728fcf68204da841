"""Identity changes only by a person's decision: proposals, and an admin's accept or reject.

Seed 001: identity (the ``global`` and ``agent_config`` scopes: invariants,
glossary, boundaries) is written "only by the S5 decision path, when a named
person accepts a proposal", and "a unit can only propose a change". So:

- ``memory_write`` to an identity scope is refused for everyone (``memory.gate``);
- ``propose_policy_change`` (paired humans and SOP runs) records a proposal
  with its proposer stamped by the host (user id, or system principal + run);
- a human admin accepts (the proposal becomes the identity record, written
  through the one gate with source ``decision``) or rejects it; the decision
  (who, when, rationale) is a row of its own, and nothing is edited in place.

The CLI (``goclaw identity``), the dashboard and the ``identity_decide`` chat
tool all call :func:`accept_proposal` / :func:`reject_proposal`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from msgspec import Struct
from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from memory.facts_models import IdentityDecision, IdentityProposal
from memory.gate import IDENTITY_SCOPES
from memory.store import MemoryRecordView, MemoryStoreError
from memory.writer import MemoryWriter
from pairing.principal import Principal, PrincipalKind, is_human_admin

MAX_TEXT_CHARS = 2000
LIST_LIMIT = 500
"""The most proposals ``identity_decide list`` shows, oldest first (it says when there are more)."""
REFUSE_PROPOSE = "Proposing a change to the agent's identity is for paired people and SOP runs; nothing was recorded."
REFUSE_DECIDE = "Only an administrator can accept or reject an identity proposal; nothing was changed."

PROPOSE_POLICY_CHANGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scope": {
            "type": "string",
            "enum": list(IDENTITY_SCOPES),
            "description": "global: the agent's invariants and glossary; agent_config: its boundaries and persona.",
        },
        "subject": {"type": "string", "description": "What it is about, e.g. 'boundaries' (optional)."},
        "text": {"type": "string", "description": "The proposed identity text, as it would be rendered."},
        "rationale": {"type": "string", "description": "Why the agent's identity should say this."},
    },
    "required": ["scope", "text", "rationale"],
    "additionalProperties": False,
}
PROPOSE_POLICY_CHANGE_DESCRIPTION = (
    "Propose a change to the agent's identity (a rule that should hold for every conversation and run, "
    "indefinitely). It is recorded as an open proposal; only an administrator can accept it."
)
IDENTITY_DECIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["list", "accept", "reject"]},
        "proposal_id": {"type": "string", "description": "accept/reject: the proposal (ip_...)."},
        "rationale": {"type": "string", "description": "accept/reject: why (kept with the decision)."},
    },
    "required": ["action"],
    "additionalProperties": False,
}
IDENTITY_DECIDE_DESCRIPTION = (
    "Administrators only: list open identity proposals, or accept / reject one with a rationale. "
    "An accepted proposal becomes part of the agent's identity in every prompt."
)


class IdentityError(MemoryStoreError):
    """An identity action that cannot be done; the message says why."""


class DecisionView(Struct, frozen=True):
    """How an identity record came to be, or what became of a proposal."""

    id: str
    proposal_id: str | None
    record_id: str | None
    decision: str
    by_user_id: str
    at: datetime
    rationale: str

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "proposal_id": self.proposal_id,
            "record_id": self.record_id,
            "decision": self.decision,
            "by": self.by_user_id,
            "at": self.at.isoformat(),
            "rationale": self.rationale,
        }


class ProposalView(Struct, frozen=True):
    """A proposal with its decision, if any (``status`` is derived: open until decided)."""

    id: str
    scope: str
    subject: str
    content: str
    rationale: str
    proposer: str
    proposer_role: str | None
    run_id: str | None
    sop_name: str | None
    session_id: str | None
    message_id: str | None
    created_at: datetime
    decision: DecisionView | None = None

    @property
    def status(self) -> str:
        """``open``, ``accepted`` or ``rejected``."""
        return self.decision.decision if self.decision else "open"

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "id": self.id,
            "status": self.status,
            "scope": self.scope,
            "subject": self.subject,
            "text": self.content,
            "rationale": self.rationale,
            "proposer": self.proposer,
            "proposer_role": self.proposer_role,
            "run_id": self.run_id,
            "sop_name": self.sop_name,
            "session_id": self.session_id,
            "message_id": self.message_id,
            "created_at": self.created_at.isoformat(),
            "decision": self.decision.as_json() if self.decision else None,
        }


class Accepted(Struct, frozen=True):
    """What an accept did: the proposal as decided, the identity record, and the records it retired."""

    proposal: ProposalView
    record: MemoryRecordView
    retired: tuple[str, ...]


def authorize_propose(principal: Principal, *, run_id: str | None) -> str | None:
    """Why ``principal`` may not propose, or None: paired people, and SOP runs (a system principal with a run)."""
    if principal.kind is PrincipalKind.HUMAN and principal.user_id:
        return None
    if principal.kind is PrincipalKind.SYSTEM and run_id:
        return None
    return REFUSE_PROPOSE


def authorize_decide(principal: Principal) -> str | None:
    """Why ``principal`` may not decide a proposal, or None (a paired human whose stored role is admin)."""
    return None if is_human_admin(principal) else REFUSE_DECIDE


def _decision_view(row: Any) -> DecisionView:
    m = row._mapping
    return DecisionView(**{k: m[k] for k in DecisionView.__struct_fields__})


def _joined_decision(row: Any) -> DecisionView | None:
    """The decision of a ``proposals_query`` row (its ``d_`` columns), or None while the proposal is open."""
    m = row._mapping
    if m["d_id"] is None:
        return None
    return DecisionView(**{k: m[f"d_{k}"] for k in DecisionView.__struct_fields__})


def _proposal_view(row: Any, decision: DecisionView | None) -> ProposalView:
    m = row._mapping
    fields = {k: m[k] for k in ProposalView.__struct_fields__ if k != "decision"}
    return ProposalView(**fields, decision=decision)


P = IdentityProposal.__table__.c
D = IdentityDecision.__table__.c
_WITH_DECISION = IdentityProposal.__table__.outerjoin(IdentityDecision.__table__, D.proposal_id == P.id)
_OPEN = D.proposal_id.is_(None)  # no decision row has its id (one at most: the index is unique)


class IdentityStore:
    """Proposals and decisions on SQLite or PostgreSQL (insert-only)."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], datetime] | None = None) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or (lambda: datetime.now(UTC))

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock()

    async def propose(
        self,
        principal: Principal,
        *,
        scope: str,
        content: str,
        rationale: str,
        subject: str = "",
        run_id: str | None = None,
        sop_name: str | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
    ) -> ProposalView:
        """Record an open proposal; the proposer is the principal (and run), never what the model says.

        Raises:
            IdentityError: not allowed, or the values are unusable.
        """
        refusal = authorize_propose(principal, run_id=run_id)
        if refusal:
            raise IdentityError(refusal)
        if scope not in IDENTITY_SCOPES:
            raise IdentityError(f"scope must be one of {', '.join(IDENTITY_SCOPES)}, not {scope!r}")
        content, rationale = content.strip(), rationale.strip()
        if not content:
            raise IdentityError("the proposed text is empty")
        if not rationale:
            raise IdentityError("a proposal needs a rationale (why the identity should say this)")
        for name, value in (("text", content), ("rationale", rationale)):
            if len(value) > MAX_TEXT_CHARS:
                raise IdentityError(f"the {name} is {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
        row = IdentityProposal(
            id="ip_" + secrets.token_hex(8),
            scope=scope,
            subject=(subject.strip() or content[:60])[:200],
            content=content,
            rationale=rationale,
            proposer=principal.user_id or principal.system_name or "unknown",
            proposer_role=principal.stored_role,
            run_id=run_id,
            sop_name=sop_name,
            session_id=session_id,
            message_id=message_id,
            created_at=self.now(),
        )
        async with self._sessions.begin() as s:
            s.add(row)
        found = await self.get(row.id)
        assert found is not None
        return found

    async def get(self, proposal_id: str) -> ProposalView | None:
        """One proposal with its decision, or None."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(IdentityProposal.__table__).where(P.id == proposal_id))).first()
            if row is None:
                return None
            dec = (await conn.execute(select(IdentityDecision.__table__).where(D.proposal_id == proposal_id))).first()
        return _proposal_view(row, _decision_view(dec) if dec else None)

    def proposals_query(self, *, include_decided: bool = False, limit: int = 500) -> Select[Any]:
        """``proposals``' statement: each proposal with its decision's columns (``d_...``, NULL while open).

        Open or decided is settled in SQL, before the limit: limited first and filtered
        after, the 500 oldest proposals, once decided, hid every newer open one from the
        dashboard, the CLI and the chat tool, and a proposal nobody sees is never decided
        (seed 001: identity changes only by a person's decision on a proposal). Each
        proposal's decision is found on the unique index on ``proposal_id`` (SQLite, and
        PostgreSQL for the decided ones too), or PostgreSQL hashes the decisions once for
        an anti-join: never every decision for each proposal.
        """
        q = (
            select(IdentityProposal.__table__, *[c.label(f"d_{c.key}") for c in IdentityDecision.__table__.c])
            .select_from(_WITH_DECISION)
            .order_by(P.created_at, P.id)
            .limit(limit)
        )
        return q if include_decided else q.where(_OPEN)

    async def proposals(self, *, include_decided: bool = False, limit: int = 500) -> list[ProposalView]:
        """Proposals, oldest first, at most ``limit``: open ones only unless ``include_decided``."""
        async with self._engine.connect() as conn:
            rows = (await conn.execute(self.proposals_query(include_decided=include_decided, limit=limit))).all()
        return [_proposal_view(r, _joined_decision(r)) for r in rows]

    async def count(self, *, include_decided: bool = False) -> int:
        """How many proposals ``proposals`` would list without its limit: the open ones unless ``include_decided``."""
        if include_decided:
            q = select(func.count()).select_from(IdentityProposal.__table__)
        else:
            q = select(func.count()).select_from(_WITH_DECISION).where(_OPEN)
        async with self._engine.connect() as conn:
            return int((await conn.execute(q)).scalar_one())

    async def provenance(self) -> dict[str, DecisionView]:
        """For each identity record that has one, how it came to be (accepted proposal, or ``direct``)."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(select(IdentityDecision.__table__).where(D.record_id.is_not(None)))
            return {r.record_id: _decision_view(r) for r in rows}

    async def _open_locked(self, s: AsyncSession, proposal_id: str) -> Any:
        row = (await s.execute(select(IdentityProposal.__table__).where(P.id == proposal_id).with_for_update())).first()
        if row is None:
            raise IdentityError(f"no identity proposal {proposal_id!r}; see 'goclaw identity proposals'")
        dec = (await s.execute(select(IdentityDecision.__table__).where(D.proposal_id == proposal_id))).first()
        if dec is not None:
            raise IdentityError(f"proposal {proposal_id} is already {dec.decision} (by {dec.by_user_id})")
        return row

    def _decision(
        self, proposal_id: str, decision: str, by: Principal, rationale: str, record_id: str | None
    ) -> IdentityDecision:
        return IdentityDecision(
            id="id_" + secrets.token_hex(8),
            proposal_id=proposal_id,
            record_id=record_id,
            decision=decision,
            by_user_id=by.user_id or "unknown",
            at=self.now(),
            rationale=rationale,
        )


def _rationale(text: str) -> str:
    text = text.strip()
    if not text:
        raise IdentityError("a decision needs a rationale (--rationale): it is kept with the decision")
    if len(text) > MAX_TEXT_CHARS:
        raise IdentityError(f"the rationale is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    return text


async def accept_proposal(
    identity: IdentityStore, writer: MemoryWriter, proposal_id: str, *, by: Principal, rationale: str
) -> Accepted:
    """An admin accepts an open proposal: it becomes the identity record, and the decision is kept.

    One transaction: the identity record (through the one gate, source
    ``decision``) and the decision row commit together, or neither does. A
    second decision on the same proposal is refused (and a concurrent one
    fails on the unique key).

    Raises:
        IdentityError: not an admin, unknown or decided proposal, no rationale.
    """
    refusal = authorize_decide(by)
    if refusal:
        raise IdentityError(refusal)
    why = _rationale(rationale)
    try:
        async with writer.batch() as batch:
            row = await identity._open_locked(batch.session, proposal_id)
            result = await batch.write(
                by,
                row.scope,
                "decision",
                subject=row.subject,
                content=row.content,
                said_at=identity.now(),
                session_id=row.session_id,
                evidence=[row.id],
            )
            if result.record is None:
                raise IdentityError(result.decision.message)
            batch.session.add(identity._decision(row.id, "accepted", by, why, result.record.id))
            await batch.session.flush()
    except IntegrityError:
        raise IdentityError(f"proposal {proposal_id} was decided by someone else just now") from None
    proposal = await identity.get(proposal_id)
    assert proposal is not None
    return Accepted(proposal, result.record, result.retired)


async def reject_proposal(identity: IdentityStore, proposal_id: str, *, by: Principal, rationale: str) -> ProposalView:
    """An admin rejects an open proposal; it stays on record with the decision.

    Raises:
        IdentityError: not an admin, unknown or decided proposal, no rationale.
    """
    refusal = authorize_decide(by)
    if refusal:
        raise IdentityError(refusal)
    why = _rationale(rationale)
    try:
        async with identity._sessions.begin() as s:
            row = await identity._open_locked(s, proposal_id)
            s.add(identity._decision(row.id, "rejected", by, why, None))
    except IntegrityError:
        raise IdentityError(f"proposal {proposal_id} was decided by someone else just now") from None
    proposal = await identity.get(proposal_id)
    assert proposal is not None
    return proposal


# ---- the chat tools -------------------------------------------------------------------------


async def propose_policy_change(
    identity: IdentityStore,
    principal: Principal,
    args: Mapping[str, Any],
    *,
    run_id: str | None,
    sop_name: str | None,
    session_id: str | None,
    message_id: str | None,
) -> str:
    """The ``propose_policy_change`` tool: record an open proposal (host-stamped proposer)."""
    try:
        p = await identity.propose(
            principal,
            scope=str(args.get("scope") or "").strip(),
            subject=str(args.get("subject") or ""),
            content=str(args.get("text") or ""),
            rationale=str(args.get("rationale") or ""),
            run_id=run_id,
            sop_name=sop_name,
            session_id=session_id,
            message_id=message_id,
        )
    except IdentityError as exc:
        return f"error: {exc}. Nothing was recorded."
    return (
        f"Proposal {p.id} recorded ({p.scope}, subject '{p.subject}'); it is open until an administrator "
        "accepts or rejects it. Nothing about the agent's identity has changed yet."
    )


def proposal_line(p: ProposalView) -> str:
    """One proposal for a person to read."""
    who = p.proposer + (f" ({p.proposer_role})" if p.proposer_role else "")
    if p.run_id:
        who += f", run {p.run_id}" + (f" of {p.sop_name}" if p.sop_name else "")
    text = f"- {p.id} [{p.status}] {p.scope} / {p.subject}: {p.content} (proposed by {who}; why: {p.rationale})"
    if p.decision:
        text += f"; {p.decision.decision} by {p.decision.by_user_id}: {p.decision.rationale}"
    return text


async def identity_decide(
    identity: IdentityStore,
    writer: MemoryWriter,
    principal: Principal,
    args: Mapping[str, Any],
    *,
    on_accept: Callable[[], None] | None = None,
) -> str:
    """The ``identity_decide`` admin tool: list open proposals, accept or reject one, as the asking admin."""
    refusal = authorize_decide(principal)
    if refusal:
        return refusal
    action = str(args.get("action") or "")
    pid = str(args.get("proposal_id") or "").strip()
    why = str(args.get("rationale") or "")
    try:
        if action == "list":
            open_ = await identity.proposals(limit=LIST_LIMIT)
            if not open_:
                return "No open identity proposals."
            lines = [proposal_line(p) for p in open_]
            if len(open_) == LIST_LIMIT and (waiting := await identity.count()) > LIST_LIMIT:
                lines.append(f"(the oldest {LIST_LIMIT} of {waiting} open proposals; decide these to see the rest)")
            return "\n".join(lines)
        if action == "accept" and pid:
            done = await accept_proposal(identity, writer, pid, by=principal, rationale=why)
            if on_accept is not None:
                on_accept()
            return f"Accepted {pid}: identity record {done.record.id} is now in every prompt."
        if action == "reject" and pid:
            await reject_proposal(identity, pid, by=principal, rationale=why)
            return f"Rejected {pid}; it stays on record with your rationale."
    except IdentityError as exc:
        return f"error: {exc}"
    return "error: use action 'list', or 'accept' / 'reject' with proposal_id and rationale."
