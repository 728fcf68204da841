"""Memory wired into the gateway: prompt sections, tools, ``@notes:``, archive trust, the extraction job.

Everything memory-related the turn does goes through :class:`GatewayMemory`;
every write it causes goes through memory's one gate (``MemoryWriter``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gateway.facts_glue import FactsGlue
from gateway.hotstore import hot_store
from gateway.idle import messages_between
from gateway.llm.base import Tool
from gateway.models import Job
from gateway.revise_job import REVISE_JOB, TURN_SOURCES, revise_job, revision_enqueuer
from gateway.scheduler import Scheduler, consolidation_model, extraction_model, judge_model
from gateway.sessions import SessionStore, StoredMessage, principal_from_json, summarize
from gateway.turn import MemoryContext, RunContext
from gateway.worker import JobHandler, ParkableError
from memory import (
    MEMORY_SEARCH_SCHEMA,
    MEMORY_WRITE_SCHEMA,
    MalformedExtraction,
    MemoryStore,
    MemoryWriter,
    SliceMessage,
    WriteAccess,
    archive_trust,
    handle_notes_directive,
    memory_search,
    memory_sections,
    memory_write,
    process_slice,
    summary_owner,
)
from memory.belief_revision import BeliefReviser
from memory.extract import ExtractOutcome
from memory.identity import IdentityStore
from memory.notes import BY_HAND, CONVERSATION, Audience
from memory.obligations import FindingsStore
from memory.render import IDENTITY_SCOPES_RENDERED, identity_lines
from memory.retract import MEMORY_RETRACT_DESCRIPTION, MEMORY_RETRACT_SCHEMA, authorize_retract, memory_retract_tool
from memory.revisions import authorize_undo, list_revisions, undo_revision, undo_revision_run
from memory.store import MemoryStoreError, new_run_id
from memory.tools import MEMORY_SEARCH_DESCRIPTION, MEMORY_WRITE_DESCRIPTION
from memory.tools_admin import (
    NOTES_DISTILL_DESCRIPTION,
    NOTES_DISTILL_SCHEMA,
    REVIEW_LEARNED_DESCRIPTION,
    REVIEW_LEARNED_SCHEMA,
    DistillRun,
    authorize_notes_distill,
    authorize_review_learned,
    notes_distill,
    review_learned,
)
from memory.types import ExtractorModel
from memory.writer import WriteResult
from pairing.principal import Principal
from pairing.store import PairingError, PairingStore

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger(__name__)
IDENTITY_TTL_S = 30.0

_BY_HAND: ContextVar[bool] = ContextVar("goclaw_run_by_hand", default=False)


@contextmanager
def run_by_hand() -> Iterator[None]:
    """Turns inside this block are a run by hand (``goclaw chat``): they see every current note.

    Seed 001: "A session run by hand with no leased unit has no unit type, so it
    sees every current entry, scoped or not."
    """
    token = _BY_HAND.set(True)
    try:
        yield
    finally:
        _BY_HAND.reset(token)


def principal_lookup(pairing: PairingStore) -> Callable[[str], Awaitable[Principal | None]]:
    """The pairing store's principal for a unified user id, or None when nobody is paired by it."""

    async def lookup(user_id: str) -> Principal | None:
        try:
            return await pairing.principal_for_user(user_id)
        except PairingError:
            return None

    return lookup


def mark_run_by_hand() -> None:
    """From here on in this task's context, turns are a run by hand (``goclaw chat``'s loop)."""
    _BY_HAND.set(True)


def audience_of(run: RunContext | None) -> Audience:
    """Who a turn's prompt is for: an SOP run (name, tags), a run by hand, or a conversation."""
    if run is not None and run.sop_name:
        return Audience(sop_name=run.sop_name, tags=tuple(run.scope_tags))
    return BY_HAND if _BY_HAND.get() else CONVERSATION


MEMORY_REVISIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["list", "undo"], "description": "list the newest, or undo one"},
        "revision_id": {"type": "string", "description": "undo: the revision row to undo"},
        "run_id": {"type": "string", "description": "list: one run's rows; undo: every row of that run"},
    },
    "required": ["action"],
    "additionalProperties": False,
}
MEMORY_REVISIONS_DESCRIPTION = (
    "Administrators: list recent memory retirements (who replaced what, how and why), or undo one "
    "(revision_id) or a whole run (run_id). An undone retirement is a veto: it never happens again."
)


async def memory_revisions_tool(store: MemoryStore, principal: Principal, args: Mapping[str, Any]) -> str:
    """The ``memory_revisions`` admin tool: the same actions as ``goclaw memory revisions``."""
    refusal = authorize_undo(principal)
    if refusal:
        return refusal
    action, rev, run = args.get("action"), args.get("revision_id"), args.get("run_id")
    try:
        if action == "list":
            rows = await list_revisions(store, run_id=str(run) if run else None, limit=20)
            if not rows:
                return "No retirements recorded."
            return "\n".join(
                f"- {r.id}: {r.retired_id} retired by {r.replacing_id or '-'} via {r.via} ({r.cause}, run {r.run_id})"
                + (f"; undone by {r.undone_by}" if r.undone_at else "")
                for r in rows
            )
        if action == "undo" and (rev or run):
            if rev:
                done = await undo_revision(store, str(rev), principal=principal)
            else:
                done = await undo_revision_run(store, str(run), principal=principal)
            restored = ", ".join(r.id for r in done.restored) or "none"
            return f"Undone {len(done.revisions)} retirement(s); back in memory: {restored}. They stand as vetoes."
    except MemoryStoreError as exc:
        return f"error: {exc}"
    return "error: use action 'list', or 'undo' with revision_id or run_id."


SUMMARY_SUBJECT = "conversation summary"


_RUN_PREFIX = {"memory_write": "mw", "directive": "nt", "live": "ex"}


class RevisingWriter(MemoryWriter):
    """The gated writer, followed by belief revision for every new live record it writes.

    policy: beyond exact subject matches, the judge decides whether a new record
    replaces related older ones. The subject rule already ran inside the write.
    """

    reviser: BeliefReviser | None = None
    on_identity_write: Callable[[], None] | None = None
    # Set by the gateway: a turn's writes are revised by the worker (gateway.revise_job), not in the turn.
    defer_revision: Callable[[str, str | None], Awaitable[None]] | None = None

    async def write(self, principal: Principal, scope: str, source: str, **kwargs: Any) -> WriteResult:
        """Write through the gate, then revise what was written, all under one run id.

        Issue 11: every retirement from the live path carries its run id, so the
        subject rule's retirements (inside the write) and the judge's (after it)
        are undone together by ``goclaw memory revisions undo --run``.
        """
        kwargs["run_id"] = kwargs.get("run_id") or new_run_id(_RUN_PREFIX.get(source, "lv"))
        result = await super().write(principal, scope, source, **kwargs)
        if result.written and scope in IDENTITY_SCOPES_RENDERED and self.on_identity_write is not None:
            self.on_identity_write()
        record = result.record if result.written else None
        if self.reviser is not None and record is not None and record.status == "live":
            # A person's turn defers the judge; an autonomous run (cron, SOP, webhook) has nobody
            # waiting and keeps it inline, so the run ends with its memory revised.
            if self.defer_revision is not None and source in TURN_SOURCES and principal.is_human:
                # Only the judge is slow; a record with nothing related needs no judge and no job.
                if await self.reviser.candidates(record):
                    await self.defer_revision(record.id, kwargs["run_id"])
            else:
                # The write applied the subject rule already, in its own transaction.
                await self.reviser.revise(record.id, cause="live", run_id=kwargs["run_id"], written=record)
        return result


class GatewayMemory:
    """The turn's view of memory (implements ``gateway.turn.MemoryGlue``)."""

    def __init__(
        self,
        *,
        store: MemoryStore,
        writer: MemoryWriter,
        sessions: SessionStore,
        extractor: ExtractorModel,
        reviser: BeliefReviser,
        scheduler: Scheduler,
        token_budget: int,
        max_chars: int,
    ) -> None:
        self.store = store
        self.writer = writer
        self.sessions = sessions
        self.extractor = extractor
        self.reviser = reviser
        self.scheduler = scheduler
        # Where notes_distill runs: here by default; ``goclaw serve`` hands it to its job process
        # (gateway/jobproc.py), whose consolidator is warm and whose CPU is not the turns' loop's.
        self.run_distill: DistillRun = scheduler.notes_distill
        self.token_budget = token_budget
        self.max_chars = max_chars
        self._identity: tuple[float, str] | None = None
        self.facts: FactsGlue | None = None  # identity proposals, intelligence, obligations (build_memory sets it)

    def forget_identity(self) -> None:
        """Drop the cached identity lines (an admin changed them)."""
        self._identity = None

    async def identity(self) -> str:
        """Live identity records, cached for IDENTITY_TTL_S: they change rarely and every prompt has them.

        A write through this process clears the cache at once; another gateway
        process sharing the database sees the change within the TTL.
        """
        now = time.monotonic()
        if self._identity is None or now - self._identity[0] > IDENTITY_TTL_S:
            self._identity = (now, "\n".join(await identity_lines(self.store)))
        return self._identity[1]

    async def context(
        self, principal: Principal, conversation_text: str | Sequence[str], *, run: RunContext | None = None
    ) -> MemoryContext:
        """The speaker's own personal memory (humans only) and the current operational notes for this turn."""
        sections = await memory_sections(
            self.store, principal, conversation_text, token_budget=self.token_budget, audience=audience_of(run)
        )
        return MemoryContext(
            sections.operational, sections.personal, sections.used_ids, await self.identity(), why=sections.why
        )

    def tools(
        self,
        principal: Principal,
        *,
        session_id: str,
        message_id: str,
        said_at: datetime,
        run: RunContext | None = None,
        said_text: str = "",
    ) -> list[Tool]:
        """``memory_write``, ``memory_search``; for admins ``review_learned`` and ``notes_distill``.

        The gate inside each write decides what it may do; the admin tools also
        check the principal before they run (``authorize``).
        """

        audience = audience_of(run)

        async def write(p: Principal, args: Mapping[str, Any]) -> str:
            return await memory_write(
                self.writer,
                p,
                args,
                said_at=said_at,
                session_id=session_id,
                message_id=message_id,
                max_chars=self.max_chars,
                # The host stamps the run (an SOP run's own id); the model never supplies provenance.
                run_id=run.run_id if run is not None and run.run_id else None,
            )

        async def search(p: Principal, args: Mapping[str, Any]) -> str:
            return await memory_search(self.store, p, args, audience=audience)

        async def retract(p: Principal, args: Mapping[str, Any]) -> str:
            return await memory_retract_tool(self.store, p, args)

        async def review(p: Principal, args: Mapping[str, Any]) -> str:
            return await review_learned(self.writer, p, args, reviser=self.reviser)

        async def distill(p: Principal, args: Mapping[str, Any]) -> str:
            return await notes_distill(p, args, run=self.run_distill)

        async def revisions(p: Principal, args: Mapping[str, Any]) -> str:
            return await memory_revisions_tool(self.store, p, args)

        return [
            Tool("memory_write", MEMORY_WRITE_DESCRIPTION, MEMORY_WRITE_SCHEMA, write),
            Tool("memory_search", MEMORY_SEARCH_DESCRIPTION, MEMORY_SEARCH_SCHEMA, search),
            Tool("review_learned", REVIEW_LEARNED_DESCRIPTION, REVIEW_LEARNED_SCHEMA, review, authorize_review_learned),
            Tool("notes_distill", NOTES_DISTILL_DESCRIPTION, NOTES_DISTILL_SCHEMA, distill, authorize_notes_distill),
            Tool("memory_revisions", MEMORY_REVISIONS_DESCRIPTION, MEMORY_REVISIONS_SCHEMA, revisions, authorize_undo),
            Tool("memory_retract", MEMORY_RETRACT_DESCRIPTION, MEMORY_RETRACT_SCHEMA, retract, authorize_retract),
            *(
                self.facts.tools(principal, session_id=session_id, message_id=message_id, run=run, said_text=said_text)
                if self.facts
                else []
            ),
        ]

    async def directive(
        self, principal: Principal, text: str, *, session_id: str, message_id: str, said_at: datetime
    ) -> str | None:
        """The reply to ``@notes: ...`` (saved for admins, refused for everyone else)."""
        return await handle_notes_directive(
            self.writer,
            principal,
            text,
            said_at=said_at,
            session_id=session_id,
            message_id=message_id,
            max_chars=self.max_chars,
        )

    def trust_of(self, messages: Sequence[SliceMessage]) -> str:
        """``admin`` only when everyone in the slice may author operational knowledge."""
        return archive_trust(messages)

    async def extract_job(self, job: Job) -> None:
        """Run extraction on a trimmed slice; raise to have the worker retry (then park) it."""
        payload = job.payload
        archive_id = payload.get("archive_id")
        turn_principal = _job_principal(payload)
        whole, stored = await self._job_messages(payload)
        slice_ = [m.as_slice() for m in stored]
        if not slice_:
            # A trim whose messages the idle sweep extracted already: only its summary is left.
            log.info("job %s: nothing new to extract in %s", job.id, archive_id or "the idle slice")
        outcome = ExtractOutcome()
        # One run id for the whole slice: its records, the subject rule's and the judge's retirements.
        run_id = new_run_id("ex")
        try:
            if slice_:
                outcome = await process_slice(
                    self.writer,
                    self.extractor,
                    slice=slice_,
                    turn_principal=turn_principal,
                    session_id=payload["session_id"],
                    archive_id=archive_id,
                    source="live",
                    run_id=run_id,
                )
        except MalformedExtraction as exc:
            raise ParkableError(f"malformed extractor answer ({exc.problem})", exc.raw) from None
        # The subject rule ran inside each write; the judge looks further. A failing
        # judge retires nothing and does not fail the job.
        await self.reviser.revise_many(
            [r.id for r in outcome.written if r.status == "live"], cause="live", run_id=run_id
        )
        # policy: the summary goes to personal memory only when every message in the
        # slice was the current speaker's; a shared thread's summary stays in the session.
        # The summary is the trimmed slice's (the whole of it, whoever extracted which part);
        # an idle slice is still in the history and gets none.
        owner = summary_owner([m.as_slice() for m in whole], turn_principal) if archive_id else None
        # The personal copy is made of the owner's own lines only: an agent reply at
        # the slice's edge may answer someone else and must not carry them along.
        own = [m for m in whole if m.speaker_user_id == owner and not m.is_agent] if owner else []
        summary = summarize(own) if own else ""
        if owner is not None and summary:
            await self.writer.write(
                turn_principal,
                "personal",
                "live",
                subject=SUMMARY_SUBJECT,
                content=summary,
                said_at=whole[-1].said_at,
                owner_user_id=owner,
                session_id=payload["session_id"],
                evidence=(str(archive_id),),
                run_id=run_id,
            )
        log.info(
            "job %s: %s: %d written, %d operational dropped, %d model calls",
            job.id,
            archive_id or "idle slice",
            len(outcome.written),
            outcome.dropped_operational,
            outcome.model_calls,
        )

    async def _job_messages(self, payload: Mapping[str, Any]) -> tuple[list[StoredMessage], list[StoredMessage]]:
        """The job's whole slice, and the part of it to extract (what lies after the session's mark)."""
        after = int(payload.get("after_message_id") or 0)
        if payload.get("archive_id"):
            whole = await self.sessions.archive_messages(payload["archive_id"])
        else:
            whole = await messages_between(
                self.sessions.engine, payload["session_id"], after, int(payload["through_message_id"])
            )
        return whole, [m for m in whole if m.id > after]


def _job_principal(payload: Mapping[str, Any]) -> Principal:
    """The trim's turn principal; for an idle slice, nobody's turn.

    policy: "For anyone else in the thread it is the role their messages were
    stored with". An idle slice has no running turn, so everyone in it is
    read that way: an unpaired principal is the speaker of no line.
    """
    raw = payload.get("turn_principal")
    return principal_from_json(raw) if raw else Principal.unpaired("idle extraction")


def build_memory(gw: Gateway) -> tuple[GatewayMemory, dict[str, JobHandler]]:
    """The memory glue for a started gateway, and the job handlers it brings."""
    cfg = gw.config.memory
    store = MemoryStore(gw.engine, clock=gw.clock, raw=hot_store(gw.engine))
    writer = RevisingWriter(
        store,
        write_access=WriteAccess(users=cfg.write_access.users, roles=cfg.write_access.roles),
        notes_review_days=cfg.notes_review_days,
    )
    reviser = BeliefReviser(store, judge_model(gw.provider), judge_model=gw.provider.model)
    writer.reviser = reviser
    scheduler = Scheduler(
        engine=gw.engine,
        writer=writer,
        model=consolidation_model(gw.provider),
        model_name=gw.provider.model,
        consolidation_time=cfg.consolidation_time,
        auto_distill=cfg.auto_distill,
        clock=gw.clock,
    )
    glue = GatewayMemory(
        store=store,
        writer=writer,
        sessions=gw.sessions,
        extractor=extraction_model(gw.provider),
        reviser=reviser,
        scheduler=scheduler,
        token_budget=cfg.prompt_token_budget,
        max_chars=cfg.max_content_chars,
    )
    writer.on_identity_write = glue.forget_identity
    glue.facts = FactsGlue(
        identity=IdentityStore(gw.engine, clock=gw.clock),
        findings=FindingsStore(gw.engine, clock=gw.clock),
        writer=writer,
        config=gw.config.intelligence,
        clock=gw.clock,
        on_identity_change=glue.forget_identity,
    )
    writer.defer_revision = revision_enqueuer(gw.sessions, lambda: gw.wake_worker())
    return glue, {"extract": glue.extract_job, REVISE_JOB: revise_job(reviser)}
