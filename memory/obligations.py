"""Signals and obligations on the database: append, route, hold, resolve.

- :meth:`FindingsStore.append_signal` is all ``report_intelligence`` does;
- :func:`route_pending` runs the pure router (``memory.intelligence.route``)
  over every signal not yet routed and records each outcome and the
  obligations it opens, in one transaction (PostgreSQL: under an advisory
  lock, so two gateway processes never route one signal twice);
- :func:`holding_obligation` is the hook the SOP runner asks before it starts
  a run: the id of an open blocking obligation on that SOP, or None;
- :func:`resolve_obligation` records a person's disposition as a later event,
  if the interaction policy (``intelligence.resolvers``) lets them resolve that
  severity.

Everything is insert-only (see ``memory.facts_models``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from msgspec import Struct
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from memory.facts_models import (
    DISPOSITIONS,
    SEVERITIES,
    IntelligenceSignal,
    Obligation,
    ObligationDisposition,
    OpenObligation,
    SignalRouting,
    UnroutedSignal,
)
from memory.intelligence import (
    REFUSE_REPORT,
    Report,
    ReportError,
    Routing,
    RoutingPolicy,
    SignalView,
    parse_report,
    route,
)
from memory.store import MemoryStoreError
from pairing.principal import Principal, PrincipalKind

ROUTER_LOCK = 0x676F636C61770007  # "goclaw" + the revision: one router at a time on PostgreSQL
DEFAULT_RESOLVERS: Mapping[str, tuple[str, ...]] = {s: ("admin",) for s in SEVERITIES}

S = IntelligenceSignal.__table__.c
RT = SignalRouting.__table__.c
U = UnroutedSignal.__table__.c
UNROUTED = S.id.in_(select(U.signal_id))
"""The signals without a routing: in the queue the triggers keep (``UnroutedSignal``)."""
O = Obligation.__table__.c  # noqa: E741
OD = ObligationDisposition.__table__.c
OO = OpenObligation.__table__.c


class ObligationError(MemoryStoreError):
    """An obligation action that cannot be done; the message says why."""


class DispositionView(Struct, frozen=True):
    """A person's disposition of an obligation."""

    obligation_id: str
    disposition: str
    by_user_id: str
    by_role: str
    at: datetime
    rationale: str

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "disposition": self.disposition,
            "by": self.by_user_id,
            "by_role": self.by_role,
            "at": self.at.isoformat(),
            "rationale": self.rationale,
        }


class ObligationView(Struct, frozen=True):
    """An obligation and, once dispositioned, its disposition (``status`` is derived)."""

    id: str
    signal_id: str
    sop_name: str
    severity: str
    blocks: bool
    opened_at: datetime
    reason: str
    disposition: DispositionView | None = None

    @property
    def status(self) -> str:
        """``open`` until dispositioned, then ``resolved``."""
        return "resolved" if self.disposition else "open"

    @property
    def holds(self) -> bool:
        """True while it holds its SOP's runs (blocking and not yet dispositioned)."""
        return self.blocks and self.disposition is None

    def as_json(self, resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS) -> dict[str, Any]:
        """The JSON shape the CLI prints; ``owed_to`` is who may resolve it under the policy."""
        return {
            "id": self.id,
            "status": self.status,
            "sop": self.sop_name,
            "severity": self.severity,
            "blocks": self.blocks,
            "holds": self.holds,
            "owed_to": list(resolvers_for(self.severity, resolvers)),
            "signal_id": self.signal_id,
            "opened_at": self.opened_at.isoformat(),
            "reason": self.reason,
            "disposition": self.disposition.as_json() if self.disposition else None,
        }


class RoutingView(Struct, frozen=True):
    """A recorded routing outcome."""

    signal_id: str
    routed_at: datetime
    severity: str
    outcome: str
    reason: str
    floors: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "signal_id": self.signal_id,
            "routed_at": self.routed_at.isoformat(),
            "severity": self.severity,
            "outcome": self.outcome,
            "reason": self.reason,
            "floors": list(self.floors),
        }


class ObligationHistory(Struct, frozen=True):
    """``goclaw obligation show``: the obligation, the signal it came from, and everything since."""

    obligation: ObligationView
    signal: SignalView
    routing: RoutingView | None
    siblings: tuple[ObligationView, ...]
    """The other obligations the same signal opened (one per affected SOP)."""

    def events(self) -> list[tuple[datetime, str]]:
        """What happened, oldest first."""
        s, o = self.signal, self.obligation
        out = [(s.recorded_at, f"signal {s.id} reported by {s.sop_name} (run {s.run_id}): {s.claim}")]
        if self.routing:
            r = self.routing
            out.append((r.routed_at, f"routed: {r.outcome}, severity {r.severity}: {r.reason}"))
        out.append((o.opened_at, f"obligation {o.id} opened on {o.sop_name}" + (" (holds it)" if o.blocks else "")))
        for sib in self.siblings:
            if sib.disposition:
                d = sib.disposition
                out.append((d.at, f"sibling {sib.id} on {sib.sop_name} resolved {d.disposition} by {d.by_user_id}"))
        if o.disposition:
            d = o.disposition
            out.append((d.at, f"resolved {d.disposition} by {d.by_user_id} ({d.by_role}): {d.rationale}"))
        return sorted(out, key=lambda e: e[0])

    def as_json(self, resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "obligation": self.obligation.as_json(resolvers),
            "signal": self.signal.as_json(),
            "routing": self.routing.as_json() if self.routing else None,
            "siblings": [x.as_json(resolvers) for x in self.siblings],
            "events": [{"at": at.isoformat(), "event": what} for at, what in self.events()],
        }


def resolvers_for(severity: str, resolvers: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The roles that may resolve an obligation of ``severity`` (admins when the policy names none)."""
    return tuple(resolvers.get(severity) or ("admin",))


def authorize_resolve(
    principal: Principal, severity: str, resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS
) -> str | None:
    """Why ``principal`` may not resolve an obligation of ``severity``, or None (pure).

    Seed 001: "The interaction policy decides whether <who> may resolve that
    severity." Only a paired person counts, by the role the pairing store holds.
    """
    allowed = resolvers_for(severity, resolvers)
    if principal.kind is not PrincipalKind.HUMAN or not principal.user_id or principal.role is None:
        return f"only a paired person can resolve an obligation; {severity} needs one of: {', '.join(allowed)}"
    if principal.role.value not in allowed:
        return (
            f"{principal.user_id} has role {principal.role.value}; resolving a {severity}-severity obligation "
            f"needs role {' or '.join(allowed)} (intelligence.resolvers)"
        )
    return None


def may_resolve_any(principal: Principal, resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS) -> bool:
    """True when the policy lets this principal resolve obligations of some severity (the chat tool is offered)."""
    return any(authorize_resolve(principal, s, resolvers) is None for s in SEVERITIES)


def _signal(row: Any) -> SignalView:
    m = row._mapping
    return SignalView(
        id=m["id"],
        sop_name=m["sop_name"],
        run_id=m["run_id"],
        reporter=m["reporter"],
        subject=m["subject"],
        claim=m["claim"],
        observation=m["observation"],
        rationale=m["rationale"],
        evidence=tuple(str(e) for e in m["evidence"] or ()),
        confidence=m["confidence"],
        reported_severity=m["reported_severity"],
        affected_sops=tuple(str(a) for a in m["affected_sops"] or ()),
        observed_at=m["observed_at"],
        expires_at=m["expires_at"],
        recorded_at=m["recorded_at"],
    )


def signals_by_id(ids: Sequence[str]) -> Any:
    """The signals with these ids: the router's read, after it read their ids from the queue.

    The router looks every 15 s and nearly always finds the queue empty, and then this is not
    run. It reads the queue and then the signals by id, each an index search, and not
    the two joined in one statement. SQLite, with no statistics, joined them the other way
    round and scanned every signal to probe the queue (15 ms at 200,000 signals,
    ``bench/signal_routing.py``). PostgreSQL merge-joined the queue with the signals' primary
    key, walking it from the first id to the largest one waiting.
    """
    return select(IntelligenceSignal.__table__).where(S.id.in_(ids))


def _chunks(ids: list[str], size: int = 500) -> list[list[str]]:
    """``ids`` in lists of at most ``size``: SQLite limits the parameters a statement takes."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def open_obligation_ids(*, sop_name: str | None = None, obligation_id: str | None = None) -> Any:
    """The open obligations' ids, oldest first (``opened_at``, then id): the open listing's first read.

    It reads the queue the triggers keep (``OpenObligation``), then the obligations by id
    (:func:`obligations_by_id`), each an index search, and not the two joined in one
    statement, which both databases may drive from the obligations (migration 0019's
    lesson: SQLite, with no statistics, scanned every signal to probe its queue;
    PostgreSQL merge-joined along the whole primary key).
    """
    q = select(OO.obligation_id).order_by(OO.opened_at, OO.obligation_id)
    if sop_name is not None:
        q = q.where(OO.sop_name == sop_name)
    if obligation_id is not None:
        q = q.where(OO.obligation_id == obligation_id)
    return q


def obligations_by_id(ids: Sequence[str], *, signal_id: str | None = None) -> Any:
    """The obligations with these ids (of ``signal_id`` only, if given): the open listing's second read."""
    q = select(Obligation.__table__).where(O.id.in_(ids))
    if signal_id is not None:
        q = q.where(O.signal_id == signal_id)
    return q


def _obligation(row: Any, disposition: DispositionView | None = None) -> ObligationView:
    m = row._mapping
    return ObligationView(
        m["id"], m["signal_id"], m["sop_name"], m["severity"], bool(m["blocks"]), m["opened_at"], m["reason"],
        disposition,
    )  # fmt: skip


def _routing(row: Any) -> RoutingView:
    m = row._mapping
    return RoutingView(
        m["signal_id"], m["routed_at"], m["severity"], m["outcome"], m["reason"], tuple(m["floors"] or ())
    )


def _disposition(row: Any) -> DispositionView:
    m = row._mapping
    return DispositionView(**{k: m[k] for k in DispositionView.__struct_fields__})


class FindingsStore:
    """Intelligence signals, their routing, obligations and dispositions (insert-only)."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], datetime] | None = None) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or (lambda: datetime.now(UTC))

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock()

    async def append_signal(self, report: Report, *, sop_name: str, run_id: str, reporter: str) -> SignalView:
        """Append one signal; the host's values (SOP, run, reporter, time) are the arguments, not the report's."""
        now = self.now()
        row = IntelligenceSignal(
            id="sg_" + secrets.token_hex(8),
            sop_name=sop_name,
            run_id=run_id,
            reporter=reporter,
            subject=report.subject,
            claim=report.claim,
            observation=report.observation,
            rationale=report.rationale,
            evidence=list(report.evidence),
            confidence=report.confidence,
            reported_severity=report.reported_severity,
            affected_sops=list(report.affected_sops),
            observed_at=report.observed_at or now,
            expires_at=report.expires_at,
            recorded_at=now,
        )
        async with self._sessions.begin() as s:
            s.add(row)
        found = await self.signal(row.id)
        assert found is not None
        return found

    async def signal(self, signal_id: str) -> SignalView | None:
        """One signal, or None."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(IntelligenceSignal.__table__).where(S.id == signal_id))).first()
        return _signal(row) if row else None

    async def signals(self, *, unrouted_only: bool = False, limit: int = 1000) -> list[tuple[SignalView, Any]]:
        """Signals oldest first, each with its routing (None when not yet routed)."""
        q = (
            select(IntelligenceSignal.__table__, *[c.label(f"r_{c.key}") for c in SignalRouting.__table__.c])
            .outerjoin(SignalRouting.__table__, RT.signal_id == S.id)
            .order_by(S.recorded_at, S.id)
            .limit(limit)
        )
        if unrouted_only:
            q = q.where(UNROUTED)
        out: list[tuple[SignalView, Any]] = []
        async with self._engine.connect() as conn:
            for row in await conn.execute(q):
                m = row._mapping
                routing = None
                if m["r_signal_id"] is not None:
                    routing = RoutingView(
                        m["r_signal_id"], m["r_routed_at"], m["r_severity"], m["r_outcome"], m["r_reason"],
                        tuple(m["r_floors"] or ()),
                    )  # fmt: skip
                out.append((_signal(row), routing))
        return out

    async def route_pending(self, policy: RoutingPolicy, now: datetime | None = None) -> list[Routing]:
        """Route every unrouted signal and record the outcomes and obligations, in one transaction."""
        at = now or self.now()
        try:
            async with self._sessions.begin() as s:
                if self._engine.dialect.name == "postgresql":
                    await s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ROUTER_LOCK})
                ids = list((await s.execute(select(U.signal_id))).scalars())
                pending = [_signal(r) for chunk in _chunks(ids) for r in await s.execute(signals_by_id(chunk))]
                outcomes = route(pending, policy, at)
                for r in outcomes:
                    s.add(
                        SignalRouting(
                            signal_id=r.signal_id, routed_at=at, severity=r.severity, outcome=r.outcome,
                            reason=r.reason, floors=list(r.floors),
                        )
                    )  # fmt: skip
                    for sop, blocks in r.obligations:
                        s.add(
                            Obligation(
                                id="ob_" + secrets.token_hex(8), signal_id=r.signal_id, sop_name=sop,
                                severity=r.severity, blocks=blocks, opened_at=at, reason=r.reason,
                            )
                        )  # fmt: skip
                await s.flush()
        except IntegrityError:
            # Another process (SQLite has no advisory lock) routed them first: its outcome stands.
            return []
        return outcomes

    async def obligations(
        self,
        *,
        include_resolved: bool = False,
        sop_name: str | None = None,
        signal_id: str | None = None,
        obligation_id: str | None = None,
    ) -> list[ObligationView]:
        """Obligations oldest first, open ones only unless ``include_resolved``.

        The open ones are read from the queue the database keeps (``OpenObligation``), so
        the dashboard, the findings page and ``goclaw obligations`` cost what is open, not
        every obligation ever opened; with ``include_resolved``, every one is read.
        """
        if not include_resolved:
            return await self._open_obligations(sop_name=sop_name, signal_id=signal_id, obligation_id=obligation_id)
        q = (
            select(Obligation.__table__, *[c.label(f"d_{c.key}") for c in ObligationDisposition.__table__.c])
            .outerjoin(ObligationDisposition.__table__, OD.obligation_id == O.id)
            .order_by(O.opened_at, O.id)
        )
        if sop_name is not None:
            q = q.where(O.sop_name == sop_name)
        if signal_id is not None:
            q = q.where(O.signal_id == signal_id)
        if obligation_id is not None:
            q = q.where(O.id == obligation_id)
        out: list[ObligationView] = []
        async with self._engine.connect() as conn:
            for row in await conn.execute(q):
                m = row._mapping
                disp = None
                if m["d_obligation_id"] is not None:
                    disp = DispositionView(
                        m["d_obligation_id"], m["d_disposition"], m["d_by_user_id"], m["d_by_role"], m["d_at"],
                        m["d_rationale"],
                    )  # fmt: skip
                out.append(_obligation(row, disp))
        return out

    async def _open_obligations(
        self, *, sop_name: str | None, signal_id: str | None, obligation_id: str | None
    ) -> list[ObligationView]:
        """The open obligations, oldest first: the queue's ids, then those obligations by id."""
        async with self._engine.connect() as conn:
            queue = open_obligation_ids(sop_name=sop_name, obligation_id=obligation_id)
            ids = list((await conn.execute(queue)).scalars())
            found = {
                row.id: _obligation(row)
                for chunk in _chunks(ids)
                for row in await conn.execute(obligations_by_id(chunk, signal_id=signal_id))
            }
        return [found[i] for i in ids if i in found]

    async def obligation(self, obligation_id: str) -> ObligationView | None:
        """One obligation, or None."""
        found = await self.obligations(include_resolved=True, obligation_id=obligation_id)
        return found[0] if found else None

    async def history(self, obligation_id: str) -> ObligationHistory:
        """The obligation, the signal it came from, its routing, and its siblings.

        Raises:
            ObligationError: unknown obligation.
        """
        ob = await self.obligation(obligation_id)
        if ob is None:
            raise ObligationError(f"no obligation {obligation_id!r}; see 'goclaw obligations --all'")
        signal = await self.signal(ob.signal_id)
        assert signal is not None
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(SignalRouting.__table__).where(RT.signal_id == ob.signal_id))).first()
        siblings = [o for o in await self.obligations(include_resolved=True, signal_id=ob.signal_id) if o.id != ob.id]
        return ObligationHistory(ob, signal, _routing(row) if row else None, tuple(siblings))

    async def holding_obligation(self, sop_name: str) -> str | None:
        """The oldest open blocking obligation on ``sop_name``, or None (the SOP may run).

        Asked before every run starts. It reads the queue the database keeps
        (``OpenObligation``), whose index ``(sop_name, blocks, opened_at, obligation_id)``
        answers alone: one index search, however many obligations the SOP had. The
        anti-join of the obligations with their dispositions it replaced read every
        obligation the SOP ever had (66 ms a call at 200,000 on SQLite, 52 ms on PostgreSQL;
        0.3 and 0.6 ms from the queue: ``bench/sop_hold.py``).
        """
        q = (
            select(OO.obligation_id)
            .where(OO.sop_name == sop_name, OO.blocks.is_(True))
            .order_by(OO.opened_at, OO.obligation_id)
            .limit(1)
        )
        async with self._engine.connect() as conn:
            return (await conn.execute(q)).scalar_one_or_none()

    async def resolve(
        self,
        obligation_id: str,
        *,
        by: Principal,
        disposition: str,
        rationale: str,
        resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS,
    ) -> ObligationView:
        """Record a disposition, if the policy lets ``by`` resolve this severity.

        Raises:
            ObligationError: unknown or already resolved, a disposition not in the list,
                no rationale, or ``by`` may not resolve this severity.
        """
        if disposition not in DISPOSITIONS:
            raise ObligationError(f"disposition must be one of {', '.join(DISPOSITIONS)}, not {disposition!r}")
        why = rationale.strip()
        if not why:
            raise ObligationError("a disposition needs a rationale (--rationale)")
        ob = await self.obligation(obligation_id)
        if ob is None:
            raise ObligationError(f"no obligation {obligation_id!r}; see 'goclaw obligations'")
        refusal = authorize_resolve(by, ob.severity, resolvers)
        if refusal:
            raise ObligationError(f"cannot resolve {obligation_id}: {refusal}")
        if ob.disposition is not None:
            d = ob.disposition
            raise ObligationError(f"obligation {obligation_id} is already resolved ({d.disposition} by {d.by_user_id})")
        assert by.user_id is not None and by.role is not None
        try:
            async with self._sessions.begin() as s:
                s.add(
                    ObligationDisposition(
                        obligation_id=obligation_id, disposition=disposition, by_user_id=by.user_id,
                        by_role=by.role.value, at=self.now(), rationale=why[:2000],
                    )
                )  # fmt: skip
        except IntegrityError:
            raise ObligationError(f"obligation {obligation_id} was resolved by someone else just now") from None
        done = await self.obligation(obligation_id)
        assert done is not None
        return done


async def route_pending(store: FindingsStore, policy: RoutingPolicy, now: datetime | None = None) -> list[Routing]:
    """Route every signal not yet routed (``goclaw signals route``, and before each scheduler step)."""
    return await store.route_pending(policy, now)


async def holding_obligation(store: FindingsStore, sop_name: str) -> str | None:
    """The id of the open blocking obligation holding ``sop_name``, or None: the automation runner's hook."""
    return await store.holding_obligation(sop_name)


async def resolve_obligation(
    store: FindingsStore,
    obligation_id: str,
    *,
    by: Principal,
    disposition: str,
    rationale: str,
    resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS,
) -> ObligationView:
    """A person dispositions an obligation (CLI, dashboard and chat tool all call this)."""
    return await store.resolve(obligation_id, by=by, disposition=disposition, rationale=rationale, resolvers=resolvers)


# ---- the chat tools -------------------------------------------------------------------------


def authorize_report(principal: Principal, *, research: bool) -> str | None:
    """Why this turn may not report intelligence, or None: an autonomous run of a research SOP only.

    Seed 001 leaves this to the profile ("The tool trusts the profile"); here the
    tool checks the run itself, so listing it by mistake cannot open it.
    """
    if principal.kind is PrincipalKind.SYSTEM and research:
        return None
    return REFUSE_REPORT


async def report_intelligence(
    store: FindingsStore,
    principal: Principal,
    args: Mapping[str, Any],
    *,
    research: bool,
    sop_name: str | None,
    run_id: str | None,
) -> str:
    """The ``report_intelligence`` tool: validate, stamp, append one signal -- and nothing else."""
    refusal = authorize_report(principal, research=research)
    if refusal or not sop_name or not run_id:
        return refusal or REFUSE_REPORT
    try:
        report = parse_report(args, now=store.now())
    except ReportError as exc:
        return f"error: {exc}. Nothing was recorded."
    sig = await store.append_signal(
        report, sop_name=sop_name, run_id=run_id, reporter=principal.system_name or "unknown"
    )
    affects = ", ".join(sig.affected_sops) or f"{sig.sop_name} (no SOP named)"
    return (
        f"Signal {sig.id} recorded: {sig.reported_severity} finding on '{sig.subject}', affecting {affects}. "
        "The router decides what it means; nothing else was changed."
    )


RESOLVE_OBLIGATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["list", "resolve"]},
        "obligation_id": {"type": "string", "description": "resolve: the obligation (ob_...)."},
        "disposition": {"type": "string", "enum": list(DISPOSITIONS)},
        "rationale": {"type": "string", "description": "resolve: why (kept with the disposition)."},
    },
    "required": ["action"],
    "additionalProperties": False,
}
RESOLVE_OBLIGATION_DESCRIPTION = (
    "Administrators (and the roles intelligence.resolvers names): list open obligations raised by "
    "intelligence findings, or resolve one with a disposition and a rationale; a blocking one holds its SOP until then."
)


def obligation_line(o: ObligationView) -> str:
    """One obligation for a person to read."""
    hold = "HOLDS" if o.holds else ("blocking" if o.blocks else "owed")
    text = f"- {o.id} [{o.status}, {o.severity}, {hold}] on {o.sop_name} (signal {o.signal_id}): {o.reason}"
    if o.disposition:
        text += f"; {o.disposition.disposition} by {o.disposition.by_user_id}: {o.disposition.rationale}"
    return text


async def obligation_tool(
    store: FindingsStore,
    principal: Principal,
    args: Mapping[str, Any],
    *,
    resolvers: Mapping[str, Sequence[str]] = DEFAULT_RESOLVERS,
) -> str:
    """The ``obligation_resolve`` chat tool: list open obligations, or resolve one as the asking person."""
    if not may_resolve_any(principal, resolvers):
        return "Resolving obligations needs an administrator (intelligence.resolvers); nothing was changed."
    action = str(args.get("action") or "")
    try:
        if action == "list":
            open_ = await store.obligations()
            return "\n".join(obligation_line(o) for o in open_) if open_ else "No open obligations."
        oid = str(args.get("obligation_id") or "").strip()
        if action == "resolve" and oid:
            done = await resolve_obligation(
                store,
                oid,
                by=principal,
                disposition=str(args.get("disposition") or ""),
                rationale=str(args.get("rationale") or ""),
                resolvers=resolvers,
            )
            return f"Resolved {done.id} as {done.disposition.disposition if done.disposition else '?'}."
    except ObligationError as exc:
        return f"error: {exc}"
    return "error: use action 'list', or 'resolve' with obligation_id, disposition and rationale."
