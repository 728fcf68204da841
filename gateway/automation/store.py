"""Where SOPs, their runs and Teams conversation references are kept (SQLAlchemy, SQLite and PostgreSQL)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from msgspec import Struct
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.automation.models import Sop, SopRun, TeamsConversationRef
from gateway.automation.schedule import Trigger, first_due
from gateway.db import dialect_insert
from gateway.errors import GoclawError

STALE_AFTER = timedelta(hours=1)
"""A run still ``running`` after this is taken to have died with its process (no longer blocks the SOP)."""
RUN_STATUSES = ("running", "ok", "failed", "skipped", "held")


class SopError(GoclawError):
    """An SOP action that cannot be done; the message says why and what to do."""


class SopDefinition(Struct, frozen=True):
    """What defines an SOP (from YAML or the CLI)."""

    name: str
    instruction: str
    trigger: Trigger
    deliver_to: str | None = None
    enabled: bool = True
    research: bool = False
    scope: tuple[str, ...] = ()
    catch_up: str = "once"
    secret: str | None = None  # webhook triggers only


class SopView(Struct, frozen=True):
    """An SOP as stored."""

    name: str
    instruction: str
    trigger: Trigger
    deliver_to: str | None
    enabled: bool
    research: bool
    scope: tuple[str, ...]
    catch_up: str
    origin: str
    next_due_at: datetime | None
    has_secret: bool
    created_at: datetime
    updated_at: datetime

    @property
    def next_run(self) -> datetime | None:
        """When it runs next on its schedule (None: disabled, manual, webhook or done)."""
        return self.next_due_at if self.enabled and self.trigger.timed else None

    def as_json(self) -> dict[str, Any]:
        """The CLI / dashboard shape (never the secret)."""
        return {
            "name": self.name,
            "instruction": self.instruction,
            "trigger": {"kind": self.trigger.kind, **self.trigger.spec()},
            "deliver_to": self.deliver_to,
            "enabled": self.enabled,
            "research": self.research,
            "scope": list(self.scope),
            "catch_up": self.catch_up,
            "origin": self.origin,
            "next_run": self.next_run.isoformat() if self.next_run else None,
        }


class RunView(Struct, frozen=True):
    """One row of run history."""

    id: str
    sop_name: str
    trigger: str
    principal: str
    status: str
    due_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    reply: str | None
    model_calls: int
    error: str | None
    held_by: str | None
    delivered_to: str | None
    idempotency_key: str | None
    session_id: str | None

    def as_json(self) -> dict[str, Any]:
        """The CLI / dashboard / webhook shape."""
        iso = lambda d: d.isoformat() if d else None  # noqa: E731
        return {
            "id": self.id,
            "sop": self.sop_name,
            "trigger": self.trigger,
            "principal": self.principal,
            "status": self.status,
            "due_at": iso(self.due_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "reply": self.reply,
            "model_calls": self.model_calls,
            "error": self.error,
            "held_by": self.held_by,
            "delivered_to": self.delivered_to,
        }


class Claim(Struct, frozen=True):
    """The outcome of claiming a run: the new row, or the row that already had the claim."""

    run: RunView | None = None  # the row this call inserted
    existing: RunView | None = None  # the (sop, due) or (sop, idempotency key) row another call inserted

    @property
    def won(self) -> bool:
        """True when this call inserted the row."""
        return self.run is not None


def _sop_view(r: Sop) -> SopView:
    return SopView(
        name=r.name,
        instruction=r.instruction,
        trigger=Trigger.from_spec(r.trigger_kind, r.trigger_spec),
        deliver_to=r.deliver_to,
        enabled=r.enabled,
        research=r.research,
        scope=tuple(r.scope_tags or ()),
        catch_up=r.catch_up,
        origin=r.origin,
        next_due_at=r.next_due_at,
        has_secret=bool(r.webhook_secret),
        created_at=r.created_at,
        updated_at=r.updated_at,
    )


def _run_view(r: SopRun) -> RunView:
    return RunView(
        r.id,
        r.sop_name,
        r.trigger,
        r.principal,
        r.status,
        r.due_at,
        r.created_at,
        r.started_at,
        r.finished_at,
        r.reply,
        r.model_calls,
        r.error,
        r.held_by,
        r.delivered_to,
        r.idempotency_key,
        r.session_id,
    )


@dataclass
class AutomationStore:
    """SOPs, runs and Teams references on the gateway's database."""

    engine: AsyncEngine
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._dialect = self.engine.dialect.name

    def _insert(self, table: Any) -> Any:
        return dialect_insert(self._dialect, table)

    # ---- definitions --------------------------------------------------------------------

    async def get(self, name: str) -> SopView | None:
        """One SOP, or None."""
        async with self._sessions() as s:
            row = await s.get(Sop, name)
            return _sop_view(row) if row else None

    async def require(self, name: str) -> SopView:
        """One SOP.

        Raises:
            SopError: no SOP of that name.
        """
        sop = await self.get(name)
        if sop is None:
            raise SopError(f"no SOP named {name!r}; see 'goclaw sop list'")
        return sop

    async def all(self) -> list[SopView]:
        """Every SOP, by name."""
        async with self._sessions() as s:
            return [_sop_view(r) for r in (await s.scalars(select(Sop).order_by(Sop.name))).all()]

    async def secret_of(self, name: str) -> str | None:
        """The webhook secret of an SOP (never shown; used to check signatures)."""
        async with self._sessions() as s:
            row = await s.get(Sop, name)
            return row.webhook_secret if row else None

    async def add(self, d: SopDefinition, *, origin: str = "cli") -> SopView:
        """Add an SOP.

        Raises:
            SopError: one of that name exists.
        """
        now = self.clock()
        async with self._sessions.begin() as s:
            if await s.get(Sop, d.name) is not None:
                raise SopError(f"an SOP named {d.name!r} already exists; remove it first or choose another name")
            s.add(self._new_row(d, origin, now))
        return await self.require(d.name)

    def _new_row(self, d: SopDefinition, origin: str, now: datetime) -> Sop:
        return Sop(
            name=d.name,
            instruction=d.instruction,
            trigger_kind=d.trigger.kind,
            trigger_spec=d.trigger.spec(),
            webhook_secret=d.secret,
            deliver_to=d.deliver_to,
            enabled=d.enabled,
            research=d.research,
            scope_tags=list(d.scope),
            catch_up=d.catch_up,
            origin=origin,
            next_due_at=first_due(d.trigger, now) if d.enabled else None,
            created_at=now,
            updated_at=now,
        )

    async def sync_yaml(self, defs: Sequence[SopDefinition]) -> None:
        """Upsert the YAML-defined SOPs; drop YAML SOPs no longer in the file.

        A SOP whose trigger is unchanged keeps its schedule state (``next_due_at``),
        so a restart catches up what it missed instead of starting afresh.

        Raises:
            SopError: a YAML SOP has the name of one added with the CLI.
        """
        now = self.clock()
        names = {d.name for d in defs}
        async with self._sessions.begin() as s:
            rows = {r.name: r for r in (await s.scalars(select(Sop).with_for_update())).all()}
            for d in defs:
                row = rows.get(d.name)
                if row is None:
                    stmt = self._insert(Sop).values(**_columns(self._new_row(d, "yaml", now))).on_conflict_do_nothing()
                    await s.execute(stmt)  # another process may insert it at the same moment
                    continue
                if row.origin != "yaml":
                    raise SopError(
                        f"automation.sops: {d.name!r} is also an SOP added with the CLI; "
                        f"rename one, or 'goclaw sop remove {d.name}'"
                    )
                changed_schedule = row.trigger_kind != d.trigger.kind or row.trigger_spec != d.trigger.spec()
                changed_enabled = row.enabled != d.enabled
                row.instruction = d.instruction
                row.trigger_kind = d.trigger.kind
                row.trigger_spec = d.trigger.spec()
                row.webhook_secret = d.secret
                row.deliver_to = d.deliver_to
                row.enabled = d.enabled
                row.research = d.research
                row.scope_tags = list(d.scope)
                row.catch_up = d.catch_up
                if changed_schedule or changed_enabled:
                    row.next_due_at = first_due(d.trigger, now) if d.enabled else None
                    row.updated_at = now
            for name, row in rows.items():
                if row.origin == "yaml" and name not in names:
                    await s.delete(row)

    async def set_enabled(self, name: str, enabled: bool) -> SopView:
        """Enable or disable an SOP; enabling starts its schedule from now (no catch-up for the disabled time).

        Raises:
            SopError: no SOP of that name.
        """
        now = self.clock()
        async with self._sessions.begin() as s:
            row = await s.get(Sop, name, with_for_update=True)
            if row is None:
                raise SopError(f"no SOP named {name!r}; see 'goclaw sop list'")
            if row.enabled != enabled:
                row.enabled = enabled
                trigger = Trigger.from_spec(row.trigger_kind, row.trigger_spec)
                row.next_due_at = first_due(trigger, now) if enabled else None
                row.updated_at = now
        return await self.require(name)

    async def remove(self, name: str) -> None:
        """Remove an SOP (its run history stays).

        Raises:
            SopError: no such SOP, or it is defined in the YAML (it would come back at the next start).
        """
        async with self._sessions.begin() as s:
            row = await s.get(Sop, name)
            if row is None:
                raise SopError(f"no SOP named {name!r}; see 'goclaw sop list'")
            if row.origin == "yaml":
                raise SopError(
                    f"SOP {name!r} is defined in the config (automation.sops); remove it there, "
                    f"or 'goclaw sop disable {name}'"
                )
            await s.delete(row)

    async def timed_due(self, now: datetime) -> list[SopView]:
        """Enabled SOPs with a schedule whose next due time has come."""
        async with self._sessions() as s:
            rows = await s.scalars(
                select(Sop).where(Sop.enabled.is_(True), Sop.next_due_at.is_not(None), Sop.next_due_at <= now)
            )
            return [_sop_view(r) for r in rows.all()]

    async def advance(self, name: str, old: datetime | None, new: datetime | None) -> bool:
        """Move an SOP's next due time from ``old`` to ``new``, unless another process already did."""
        async with self._sessions.begin() as s:
            result = await s.execute(
                update(Sop).where(Sop.name == name, Sop.next_due_at == old).values(next_due_at=new)
            )
            return bool(getattr(result, "rowcount", 0))

    # ---- runs ---------------------------------------------------------------------------

    async def claim(
        self,
        sop: str,
        *,
        trigger: str,
        principal: str,
        due_at: datetime | None = None,
        idempotency_key: str | None = None,
        held_by: str | None = None,
        status: str | None = None,
        error: str | None = None,
    ) -> Claim:
        """Insert the run row: ``running`` if it may start, else ``held`` / ``skipped``.

        The SOP's row is locked while this looks for a run in progress, so two
        processes never both start one; the unique (sop, due time) and (sop,
        idempotency key) rows make a due run, or a retried webhook, a no-op the
        second time.
        """
        now = self.clock()
        run_id = "r_" + secrets.token_hex(8)
        async with self._sessions.begin() as s:
            await s.get(Sop, sop, with_for_update=True)
            if status is None:
                if held_by:
                    status, error = "held", f"held by obligation {held_by} until an admin dispositions it"
                elif await self._running(s, sop, now):
                    status, error = "skipped", "another run of this SOP was still running"
                else:
                    status = "running"
            stmt = (
                self._insert(SopRun)
                .values(
                    id=run_id,
                    sop_name=sop,
                    trigger=trigger,
                    principal=principal,
                    due_at=due_at,
                    idempotency_key=idempotency_key,
                    status=status,
                    held_by=held_by,
                    error=error,
                    model_calls=0,
                    created_at=now,
                    started_at=now if status == "running" else None,
                    finished_at=None if status == "running" else now,
                )
                .on_conflict_do_nothing()
            )
            inserted = bool(getattr(await s.execute(stmt), "rowcount", 0))
        if inserted:
            return Claim(run=await self.run(run_id))
        return Claim(existing=await self._conflicting(sop, due_at, idempotency_key))

    async def _running(self, s: AsyncSession, sop: str, now: datetime) -> bool:
        rows = (await s.scalars(select(SopRun).where(SopRun.sop_name == sop, SopRun.status == "running"))).all()
        alive = False
        for r in rows:
            if r.started_at is not None and now - r.started_at > STALE_AFTER:
                # Its process died mid-run: record it, and let this one start.
                r.status, r.finished_at = "failed", now
                r.error = "interrupted: the gateway process stopped during the run"
            else:
                alive = True
        return alive

    async def _conflicting(self, sop: str, due_at: datetime | None, key: str | None) -> RunView | None:
        async with self._sessions() as s:
            if key is not None:
                row = (
                    await s.scalars(select(SopRun).where(SopRun.sop_name == sop, SopRun.idempotency_key == key))
                ).first()
                if row is not None:
                    return _run_view(row)
            if due_at is not None:
                row = (await s.scalars(select(SopRun).where(SopRun.sop_name == sop, SopRun.due_at == due_at))).first()
                if row is not None:
                    return _run_view(row)
        return None

    async def by_idempotency_key(self, sop: str, key: str) -> RunView | None:
        """The run a webhook with this ``Idempotency-Key`` started, if any."""
        return await self._conflicting(sop, None, key)

    async def finish(
        self,
        run_id: str,
        *,
        status: str,
        reply: str | None = None,
        model_calls: int = 0,
        error: str | None = None,
        delivered_to: str | None = None,
        session_id: str | None = None,
    ) -> RunView:
        """Record how a run ended."""
        async with self._sessions.begin() as s:
            row = await s.get(SopRun, run_id)
            assert row is not None, run_id
            row.status = status
            row.reply = reply
            row.model_calls = model_calls
            row.error = error
            row.delivered_to = delivered_to
            row.session_id = session_id
            row.finished_at = self.clock()
        run = await self.run(run_id)
        assert run is not None
        return run

    async def run(self, run_id: str) -> RunView | None:
        """One run, or None."""
        async with self._sessions() as s:
            row = await s.get(SopRun, run_id)
            return _run_view(row) if row else None

    async def runs(self, sop: str | None = None, *, limit: int = 50) -> list[RunView]:
        """Run history, newest first."""
        q = select(SopRun).order_by(SopRun.created_at.desc(), SopRun.id.desc()).limit(limit)
        if sop is not None:
            q = q.where(SopRun.sop_name == sop)
        async with self._sessions() as s:
            return [_run_view(r) for r in (await s.scalars(q)).all()]

    # ---- Teams conversation references (channels.teams.ConversationReferences) -------------

    async def load(self, conversation_id: str) -> dict[str, Any] | None:
        """A stored Teams conversation reference."""
        async with self._sessions() as s:
            row = await s.get(TeamsConversationRef, conversation_id)
            return dict(row.reference) if row else None

    async def save(self, conversation_id: str, reference: dict[str, Any]) -> None:
        """Store (or refresh) a Teams conversation reference."""
        now = self.clock()
        stmt = self._insert(TeamsConversationRef).values(
            conversation_id=conversation_id, reference=reference, updated_at=now
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["conversation_id"], set_={"reference": reference, "updated_at": now}
        )
        async with self._sessions.begin() as s:
            await s.execute(stmt)


def _columns(row: Sop) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in Sop.__table__.columns}
