"""The turn: store the message, answer it, then trim the history. One path for every channel."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from msgspec import Struct, field
from msgspec.structs import replace

from gateway.config import Config
from gateway.explain import TurnExplanation, directive_explanation, explain_turn
from gateway.kept import Kept
from gateway.llm.base import ChatMessage, DeltaSink, LLMProvider, LLMUnavailable, Tool
from gateway.llm.limit import ModelCallLimit
from gateway.llm.loop import ToolLoopResult, ToolSource, run_tool_loop
from gateway.metrics import Metrics
from gateway.ordering import AnswerOrder
from gateway.prompt import PromptBudgets, build_system_prompt, estimate_tokens, learning_line, safe_name
from gateway.sessions import SessionKey, SessionStore, StoredMessage, TrimResult
from gateway.turnstile import turnstile
from memory.types import SliceMessage
from pairing.principal import SYSTEM_PRINCIPALS, Principal

log = logging.getLogger(__name__)

SYSTEM_NAMES = frozenset(SYSTEM_PRINCIPALS)

UNAVAILABLE_REPLY = "Sorry, the model is unavailable right now. Your message is kept; please try again in a moment."


class MemoryContext(Struct, frozen=True):
    """What memory puts into one prompt."""

    operational: str = ""
    personal: str = ""
    used_ids: tuple[str, ...] = ()
    identity: str = ""  # live global / agent_config records set by admins
    why: tuple[str, ...] = ()  # why each of used_ids was chosen (kept in the turn record)


class RunContext(Struct, frozen=True):
    """The standing procedure (SOP) an autonomous turn runs for; None for people's turns.

    Set by gateway.automation on the TurnRequest; memory reads it to scope
    operational notes to this SOP and to decide which tools the run's profile
    grants (``report_intelligence`` for research SOPs only).
    """

    sop_name: str
    run_id: str
    trigger: str = "manual"  # cron | every | at | manual | webhook
    research: bool = False
    scope_tags: tuple[str, ...] = ()


class MemoryGlue(Protocol):
    """What the turn needs from memory (implemented in gateway.memory_glue)."""

    async def context(
        self, principal: Principal, conversation_text: str | Sequence[str], *, run: RunContext | None = None
    ) -> MemoryContext:
        """Memory sections for the prompt."""

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
        """Memory tools offered in this turn."""

    async def directive(
        self, principal: Principal, text: str, *, session_id: str, message_id: str, said_at: datetime
    ) -> str | None:
        """The reply to an ``@notes:`` directive, or None if ``text`` is not one."""

    def trust_of(self, messages: Sequence[SliceMessage]) -> str:
        """The archive trust of a slice."""


class NoMemory:
    """Memory switched off: nothing rendered, nothing written (unit tests of the turn)."""

    async def context(
        self, principal: Principal, conversation_text: str | Sequence[str], *, run: RunContext | None = None
    ) -> MemoryContext:
        """Nothing."""
        return MemoryContext()

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
        """No tools."""
        return []

    async def directive(
        self, principal: Principal, text: str, *, session_id: str, message_id: str, said_at: datetime
    ) -> str | None:
        """Not a directive."""
        return None

    def trust_of(self, messages: Sequence[SliceMessage]) -> str:
        """Nobody is vouched for."""
        return "none"


class TurnRequest(Struct, frozen=True):
    """One incoming message, with the principal the gateway resolved for its sender."""

    key: SessionKey
    principal: Principal
    text: str
    message_id: str
    said_at: datetime
    display_name: str = ""
    reply: bool = True  # False: store only (a group message that did not mention the agent)
    run: RunContext | None = None  # the SOP an autonomous run is for


class TurnResult(Struct):
    """What came of a turn."""

    session_id: str
    reply: str | None
    duplicate: bool = False
    failed: bool = False
    trimmed: TrimResult | None = None  # set once the trim after the reply is done
    used_memory: tuple[str, ...] = field(default=())
    turn_record_id: int | None = None  # the stored explanation of this turn (dashboard: explain a turn)
    model_calls: int = 0  # model requests this turn made (tool rounds included); SOP run history shows it
    # Who the turn ran as: the request's principal, or the same person with the role read when their
    # message was stored (``Principal.from_users``); a caller that keeps a principal keeps this one.
    principal: Principal | None = None


ChunkSink = Callable[[str], Awaitable[None]]
"""Receives a reply as it is made: the model's text as it streams, or a whole reply in one piece."""


class GatewayNotice(str):
    """A chunk the gateway says in place of the model's answer (the unavailable reply).

    A plain ``str`` to every sink; one that must tell it from the model's text
    (the OpenAI-compatible endpoint answers a failure with an error, not as content)
    checks ``isinstance(chunk, GatewayNotice)``.
    """

    __slots__ = ()


def _history_line(m: StoredMessage) -> ChatMessage:
    """A stored message as the model is shown it."""
    if m.is_agent:
        return ChatMessage("assistant", m.text)
    # A run's own lines are stored with its system name as the role and no user id.
    who = m.speaker_user_id or (m.stored_role if m.stored_role in SYSTEM_NAMES else None) or "unpaired"
    return ChatMessage("user", f"[{safe_name(m.display_name or who)} · {who}] {m.text}")


_Early = tuple["asyncio.Task[MemoryContext]", Principal, list[str]]
"""An early memory read (``TurnHandler._early_memory``): its task, and the speaker and texts it read for."""

_TAILS = 16_384
"""Sessions whose last texts a turn handler keeps (``_remember_tail``); the least recently answered goes first."""


class TurnHandler:
    """Handles messages of one session in order, different sessions concurrently."""

    def __init__(
        self,
        *,
        config: Config,
        sessions: SessionStore,
        provider: LLMProvider,
        memory: MemoryGlue | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] | None = None,
        on_trim: Callable[[TrimResult | None], None] | None = None,
        trim_jobs: bool = False,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.provider = provider
        self.memory: MemoryGlue = memory or NoMemory()
        self.metrics = metrics or Metrics()
        # Each turn counts itself: a labelled child is looked up once (``labels()`` validates and locks).
        self._counters: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._clock = clock or (lambda: datetime.now(UTC))
        self._on_trim = on_trim
        # Trims as durable ``trim`` jobs, run where the other jobs run (the job process, ``goclaw worker``),
        # never on this loop: ``goclaw serve`` sets it; ``on_trim`` is called with None once one is queued.
        self.trim_jobs = trim_jobs
        self._locks: dict[SessionKey, asyncio.Lock] = {}
        self._waiting: dict[SessionKey, int] = {}
        # Bounds model calls in flight, never a whole turn: a session waiting for the
        # model holds no slot while others store messages or run their tools.
        self.model_calls = ModelCallLimit(config.llm.max_concurrent_calls)
        self._trims: set[asyncio.Task[None]] = set()
        # PostgreSQL: each session's last texts, so its next turn reads memory beside its history (_early_memory).
        self._tails: dict[SessionKey, tuple[str, ...]] | None = {} if sessions.remote else None
        self._early: set[asyncio.Task[MemoryContext]] = set()
        # Each history line the model is shown, made once per stored message (gateway/kept.py); its tokens are
        # counted again each turn (a length), so what is kept is the line alone, no (line, tokens) pair.
        self._lines: Kept[StoredMessage, ChatMessage] = Kept()
        self.budgets = PromptBudgets(memory=config.memory.prompt_token_budget)
        # Across processes, a session's earlier message still being answered elsewhere goes first.
        sessions.answer_lease_s = config.session.answer_lease_seconds  # begin_turn's insert takes the lease
        self.order = AnswerOrder(sessions.engine, lease_s=config.session.answer_lease_seconds, clock=sessions.now)

    async def handle(self, req: TurnRequest, *, on_chunk: ChunkSink | None = None) -> TurnResult:
        """Store ``req`` (once) and answer it if asked; trim the session's history after the reply.

        The trim runs once this returns (the reply is sent), still holding the
        session's lock, so the session's next message waits for it and sees the
        trimmed history. It is one transaction: a crash before it only means the
        next turn of the session trims. ``result.trimmed`` is set when it is done
        (``await settled()`` waits for every pending trim).

        With ``trim_jobs`` the same moment only queues a ``trim`` job (one short
        insert), and the job process or ``goclaw worker`` trims: the trim's CPU (about
        a millisecond, the slice's archive and summary) is then never on this loop,
        where it fell into the latency of every turn in flight beside it.
        ``result.trimmed`` stays None; the session's next turn may still see the
        history untrimmed, and the trim the job makes is the same one transaction.
        """
        started = time.perf_counter()
        # The place in line is taken before the first await, so messages of one
        # session are handled in the order they arrived (asyncio.Lock is FIFO).
        key = req.key
        self._waiting[key] = self._waiting.get(key, 0) + 1
        lock = self._locks.setdefault(key, asyncio.Lock())
        self.metrics.in_flight.inc()
        outcome = "ok"
        try:
            await lock.acquire()
            try:
                result, trim_needed = await self._handle_locked(req, on_chunk)
            except BaseException:
                lock.release()
                raise
            if trim_needed:
                # The lock passes to the trim, which releases it: the session keeps its place.
                self._waiting[key] += 1
                task = asyncio.create_task(self._trim_after_reply(key, lock, result, result.principal or req.principal))
                self._trims.add(task)
                task.add_done_callback(self._trims.discard)
            else:
                lock.release()
            outcome = "duplicate" if result.duplicate else ("failed" if result.failed else "ok")
            return result
        except Exception:
            outcome = "error"
            raise
        finally:
            self.metrics.in_flight.dec()
            self._leave(key)
            self._counter(self.metrics.turns, req.key.channel, outcome).inc()
            self.metrics.turn_seconds.observe(time.perf_counter() - started)

    def _counter(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once."""
        counter = self._counters.get((metric, labels))
        if counter is None:
            counter = self._counters[(metric, labels)] = metric.labels(*labels)
        return counter

    async def settled(self) -> None:
        """Wait until every trim started by a finished turn is done (shutdown, tests)."""
        while self._trims:
            await asyncio.gather(*self._trims, return_exceptions=True)

    def _leave(self, key: SessionKey) -> None:
        self._waiting[key] -= 1
        if not self._waiting[key]:
            del self._waiting[key]
            self._locks.pop(key, None)

    async def _trim_after_reply(
        self, key: SessionKey, lock: asyncio.Lock, result: TurnResult, principal: Principal
    ) -> None:
        try:
            if self.trim_jobs:
                await self.sessions.queue_trim(result.session_id, principal)
                if self._on_trim:
                    self._on_trim(None)
            else:
                result.trimmed = await self.trim(result.session_id, principal)
        except Exception:
            # Nothing is lost: the history stays as it was and the next turn trims.
            log.exception("session %s: trim failed; the next turn will trim", result.session_id)
        finally:
            lock.release()
            self._leave(key)

    async def _handle_locked(self, req: TurnRequest, on_chunk: ChunkSink | None) -> tuple[TurnResult, bool]:
        """The turn up to its reply, and whether the history now needs a trim."""
        # A burst of turns is spread over the loop's passes, its sockets read between them (gateway/turnstile.py).
        await turnstile()
        early = self._early_memory(req)
        start = await self.sessions.begin_turn(
            req.key,
            platform_message_id=req.message_id,
            speaker=req.principal,
            display_name=req.display_name or req.principal.display_name,
            text=req.text,
            said_at=req.said_at,
            # Trimming keeps history below max_messages, so this reads all of it.
            history_limit=self.config.session.max_messages + 2,
            reply_requested=req.reply,
        )
        if start.speaker is not None and start.speaker is not req.principal:
            # The role changed since the caller read it: the turn runs as the person is now.
            req = replace(req, principal=start.speaker)
        session_id = start.session_id
        if start.stored is None:
            # An answered redelivery gets the stored reply again, never a second model call.
            log.info("session %s: message %s already handled; ignoring redelivery", session_id, req.message_id)
            return TurnResult(session_id, start.reply, duplicate=True, principal=req.principal), False
        if start.resumed:
            log.info(
                "session %s: message %s was stored but never answered; answering it now", session_id, req.message_id
            )
        result = TurnResult(session_id, None, principal=req.principal)
        if not req.reply:
            return result, len(start.history) > self.config.session.max_messages or start.resumed
        # ordering (gateway/ordering.py): this turn's lease, and its place behind earlier messages elsewhere.
        lease = self.order.hold(start.stored.id)
        failed = True
        try:
            if start.resumed:
                await self.order.take(start.stored.id)
            if start.waiting_on:
                start = await self.order.wait(start, history_limit=self.config.session.max_messages + 2)
            assert start.stored is not None
            result = await self._answer(
                session_id, req, start.stored, start.history, start.previous_context, on_chunk, early
            )
            result.principal = req.principal
            failed = result.failed
        finally:
            await lease.end(clear=failed)
        live = len(start.history) + 1  # the stored reply
        return result, live > self.config.session.max_messages or start.resumed

    async def _answer(
        self,
        session_id: str,
        req: TurnRequest,
        stored: StoredMessage,
        history: list[StoredMessage],
        previous_context: str,
        on_chunk: ChunkSink | None,
        early: _Early | None = None,
    ) -> TurnResult:
        directive_reply = await self.memory.directive(
            req.principal, req.text, session_id=session_id, message_id=req.message_id, said_at=req.said_at
        )
        if directive_reply is not None:
            directive_reply, record_id = await self._store_reply(
                session_id, req, stored, directive_reply, directive_explanation(self.provider.name)
            )
            if on_chunk:
                await on_chunk(directive_reply)
            return TurnResult(session_id, directive_reply, turn_record_id=record_id)

        # The last six messages' texts (memory reads them as joined by spaces; gateway/kept.py keeps the strings).
        texts = [m.text for m in history[-6:]]
        mem = await self._memory_context(req, texts, early)
        system = build_system_prompt(
            persona=self.config.agent.persona,
            agent_name=self.config.agent.name,
            principal=req.principal,
            operational=mem.operational,
            personal=mem.personal,
            identity_notes=mem.identity,
            previous_context=previous_context,
            budgets=self.budgets,
            learning=learning_line(self.config.session.idle_extract_seconds, self.config.session.max_messages),
        )
        lines, history_tokens = self._history_messages(history, stored)
        messages = [ChatMessage("system", system), *lines]
        # The turn's tools, made by the loop when it needs them (gateway/llm/loop.py): not held while the model answers.
        tools = partial(
            self.memory.tools,
            req.principal,
            session_id=session_id,
            message_id=req.message_id,
            said_at=req.said_at,
            run=req.run,
            said_text=req.text,  # the person's own words: decision tools act only on them
        )
        # The model's text goes to on_chunk as it streams, through every tool round
        # (gateway.llm.loop), before the reply is stored; the stored reply is the last
        # round's text, so a surface's final frame carries it for its client to reconcile.
        streamed = False

        async def forward(text: str) -> None:
            nonlocal streamed
            assert on_chunk is not None
            streamed = True
            await on_chunk(text)

        try:
            reply, loop = await self._call_model(messages, tools, req.principal, forward if on_chunk else None)
        except LLMUnavailable as exc:
            self.metrics.llm_errors.labels(self.provider.name).inc()
            log.error("session %s: model unavailable: %s", session_id, exc)
            if on_chunk:
                # One piece, set apart from any text that went out before the failure
                # (which is not sent again: the provider does not retry after it).
                await on_chunk(GatewayNotice("\n\n" + UNAVAILABLE_REPLY if streamed else UNAVAILABLE_REPLY))
            return TurnResult(session_id, UNAVAILABLE_REPLY, failed=True)
        await turnstile()  # the model's answer: the rest of the turn is a piece of its own
        explanation = explain_turn(
            messages=messages,
            history_tokens=history_tokens,
            used_ids=mem.used_ids,
            why=mem.why,
            provider=self.provider.name,
            model=loop.model or getattr(self.provider, "model", ""),
            steps=loop.steps,
            tools=[name for name, _args, _result in loop.tool_calls_made],
            input_tokens=loop.input_tokens,
            output_tokens=loop.output_tokens,
        )
        reply, record_id = await self._store_reply(session_id, req, stored, reply, explanation)
        if self._tails is not None:
            self._remember_tail(req.key, texts, reply)
        return TurnResult(session_id, reply, used_memory=mem.used_ids, turn_record_id=record_id, model_calls=loop.steps)

    def _early_memory(self, req: TurnRequest) -> _Early | None:
        """On PostgreSQL, the turn's memory read, started beside ``begin_turn`` from the texts this process last saw.

        Memory is chosen by the last six messages' texts (the new one included), which
        this process knows when it answered the session's previous message: its last five
        texts and the reply (``_remember_tail``). The read then runs on a second connection
        while the message is stored, and the turn waits for one round trip, not two. It is
        used only if the history ``begin_turn`` reads ends in exactly those texts and the
        speaker is the same principal (``_memory_context``); otherwise (another process
        answered meanwhile, a trim, a role changed) memory is read again as always, and
        the early read's result is dropped. It writes nothing.
        """
        if self._tails is None or not req.reply or len(self._locks) > 1:
            return None
        tail = self._tails.get(req.key)
        if tail is None:
            return None
        texts = [*tail, req.text]
        task = asyncio.create_task(self.memory.context(req.principal, texts, run=req.run))
        self._early.add(task)
        task.add_done_callback(self._early_finished)
        return task, req.principal, texts

    def _early_finished(self, task: asyncio.Task[MemoryContext]) -> None:
        self._early.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a read that failed or was not used is not an unhandled error

    async def _memory_context(self, req: TurnRequest, texts: list[str], early: _Early | None) -> MemoryContext:
        """The turn's memory: the early read's (``_early_memory``) when it read for these texts and speaker."""
        if early is not None:
            task, principal, assumed = early
            if principal is req.principal and assumed == texts:
                try:
                    return await task
                except Exception:  # read again below, where a fault is the turn's as always
                    log.debug("early memory read failed; reading again", exc_info=True)
        return await self.memory.context(req.principal, texts, run=req.run)

    def _remember_tail(self, key: SessionKey, texts: list[str], reply: str) -> None:
        """The session's last five texts after this reply: what its next turn's memory read starts from."""
        tails = self._tails
        assert tails is not None
        tails.pop(key, None)  # the newest last, so the oldest goes first below
        tails[key] = (*texts[-4:], reply)
        if len(tails) > _TAILS:
            del tails[next(iter(tails))]

    async def _call_model(
        self, messages: list[ChatMessage], tools: ToolSource, principal: Principal, on_delta: DeltaSink | None
    ) -> tuple[str, ToolLoopResult]:
        self._counter(self.metrics.llm_calls, self.provider.name).inc()
        result = await run_tool_loop(
            self.model_calls.bound(self.provider),
            messages,
            tools,
            principal,
            max_steps=self.config.llm.max_tool_steps,
            on_delta=on_delta,
        )
        text = result.text.strip()
        return text or "(the model gave no answer)", result

    def _history_messages(self, history: list[StoredMessage], current: StoredMessage) -> tuple[list[ChatMessage], int]:
        """Newest history that fits the budget, and its tokens; people's lines carry their stored identity."""
        budget = self.config.session.history_token_budget
        lines = self._lines
        out: list[ChatMessage] = []
        used = 0
        for m in reversed(history):
            msg = lines.get(m.id, m) or lines.put(m.id, m, _history_line(m))
            cost = estimate_tokens(msg.content)
            if used + cost > budget and out:
                break
            used += cost
            out.append(msg)
        out.reverse()
        if not out or out[-1].content.find(current.text) < 0:
            out.append(ChatMessage("user", current.text))
            used += estimate_tokens(current.text)
        return out, used

    async def _store_reply(
        self,
        session_id: str,
        req: TurnRequest,
        stored: StoredMessage,
        text: str,
        explanation: TurnExplanation | None = None,
    ) -> tuple[str, int | None]:
        """Store the reply, with the turn's explanation in the same transaction.

        Returns the reply actually stored (another process may have answered
        first) and the id of the stored explanation.
        """
        row = await self.sessions.store_message(
            session_id,
            # A display id only: the reply's identity is its link to ``stored`` and its
            # own namespace (is_agent), so a client id "X:reply" is never confused with it.
            platform_message_id=f"{req.message_id}:reply",
            reply_to=stored.id,
            speaker=None,
            display_name=self.config.agent.name,
            text=text,
            said_at=self._clock(),
            is_agent=True,
            explanation=explanation,
            answers=req.message_id,
            answered=req.principal,
        )
        if row is None:
            return await self.sessions.stored_reply(stored.id) or text, None
        return text, row.turn_record_id

    async def trim(self, session_id: str, principal: Principal) -> TrimResult | None:
        """Trim the session now if its history passed ``max_messages`` (after a reply, or a ``trim`` job)."""
        result = await self.sessions.trim(
            session_id,
            max_messages=self.config.session.max_messages,
            keep_messages=self.config.session.keep_messages,
            turn_principal=principal,
            trust_of=self.memory.trust_of,
        )
        if result is not None:
            log.info("session %s: trimmed %d messages into %s", session_id, result.message_count, result.archive_id)
            if self._on_trim:
                self._on_trim(result)
        return result
