"""One SOP run, through the one turn handler, as the system principal its trigger gives it.

policy ("Autonomous runs"): a run carries ``cron-system`` (schedules),
``sop-system`` (run by hand) or ``webhook-system`` (webhooks); none of them is
a human admin. It runs in the SOP's own session ``sop:<name>`` (kept across
runs, trimmed like any other), with the SOP's instruction as the message and a
:class:`~gateway.turn.RunContext` naming the SOP, so memory scopes its notes
and tools to it. What such a run may write is the memory gate's decision, not
this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from gateway.automation.payload import PayloadGuard, wrap_payload
from gateway.automation.store import AutomationStore, Claim, RunView, SopView
from gateway.sessions import SessionKey
from gateway.turn import RunContext, TurnHandler, TurnRequest, TurnResult
from pairing.principal import Principal

log = logging.getLogger(__name__)

Holds = Callable[[str], Awaitable[str | None]]
"""The id of an obligation holding the SOP called so, or None (memory's router decides)."""
Deliver = Callable[[str, str], Awaitable[None]]
"""Send text to a target such as ``discord:<channel id>`` or ``teams:<conversation id>``."""

PRINCIPAL_OF = {
    "cron": "cron-system",
    "every": "cron-system",
    "at": "cron-system",
    "manual": "sop-system",
    "webhook": "webhook-system",
}


async def never_held(_sop: str) -> str | None:
    """The default holds check: nothing holds any SOP."""
    return None


def session_key(sop_name: str) -> SessionKey:
    """The SOP's own session: ``sop:<name>``, kept across its runs."""
    return SessionKey("sop", sop_name)


class SopRunner:
    """Claims runs, runs them (in the background when asked), records how they ended."""

    def __init__(
        self,
        *,
        store: AutomationStore,
        turns: TurnHandler,
        clock: Callable[[], datetime],
        guard: PayloadGuard | None = None,
        holds: Holds | None = None,
        deliver: Deliver | None = None,
    ) -> None:
        self.store = store
        self.turns = turns
        self.clock = clock
        self.guard = guard
        self.holds: Holds = holds or never_held
        self.deliver = deliver
        self._tasks: set[asyncio.Task[RunView]] = set()

    async def claim(
        self,
        sop: SopView,
        *,
        trigger: str,
        due_at: datetime | None = None,
        idempotency_key: str | None = None,
        status: str | None = None,
        error: str | None = None,
    ) -> Claim:
        """Insert the run's row (``running``, or ``held`` / ``skipped`` when it may not start)."""
        held_by: str | None = None
        if status is None:
            try:
                held_by = await self.holds(sop.name)
            except Exception as exc:
                # A hold that cannot be checked is not a reason to run anyway.
                log.exception("sop %s: holds check failed", sop.name)
                status, error = "failed", f"could not check whether an obligation holds this SOP: {exc}"
        return await self.store.claim(
            sop.name,
            trigger=trigger,
            principal=PRINCIPAL_OF[trigger],
            due_at=due_at,
            idempotency_key=idempotency_key,
            held_by=held_by,
            status=status,
            error=error,
        )

    def in_background(self, sop: SopView, run: RunView, payload: str | None = None) -> asyncio.Task[RunView]:
        """Run a claimed run in a task (webhooks, schedules); :meth:`drain` waits for them."""
        task = asyncio.create_task(self.execute(sop, run, payload), name=f"sop-run-{run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run_now(self, sop: SopView) -> RunView:
        """Run an SOP now as ``sop-system`` and wait for it (``goclaw sop run``)."""
        claim = await self.claim(sop, trigger="manual")
        assert claim.run is not None  # a manual run has no due time or key to conflict on
        if claim.run.status != "running":
            return claim.run
        return await self.execute(sop, claim.run)

    async def execute(self, sop: SopView, run: RunView, payload: str | None = None) -> RunView:
        """The turn of a claimed run; a failure is recorded, never raised."""
        principal = Principal.system(run.principal)
        text = sop.instruction if payload is None else wrap_payload(sop.instruction, payload)
        context = RunContext(
            sop_name=sop.name, run_id=run.id, trigger=run.trigger, research=sop.research, scope_tags=sop.scope
        )
        if payload is not None and self.guard is not None:
            self.guard.payloads[run.id] = payload
        result: TurnResult | None = None
        try:
            result = await self.turns.handle(
                TurnRequest(
                    key=session_key(sop.name),
                    principal=principal,
                    text=text,
                    message_id=f"sop-{run.id}",
                    said_at=self.clock(),
                    display_name=principal.display_name,
                    run=context,
                )
            )
        except asyncio.CancelledError:
            await self.store.finish(run.id, status="failed", error="interrupted: the gateway stopped during the run")
            raise
        except Exception as exc:
            log.exception("sop %s: run %s failed", sop.name, run.id)
            return await self.store.finish(run.id, status="failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            if self.guard is not None:
                self.guard.payloads.pop(run.id, None)
        if result.failed:
            return await self.store.finish(
                run.id,
                status="failed",
                reply=result.reply,
                model_calls=result.model_calls,
                error="the model was unavailable",
                session_id=result.session_id,
            )
        status, error, delivered = "ok", None, None
        if sop.deliver_to and result.reply:
            try:
                if self.deliver is None:
                    raise RuntimeError("no channel is running in this process")
                await self.deliver(sop.deliver_to, result.reply)
                delivered = sop.deliver_to
            except Exception as exc:
                log.error("sop %s: delivery to %s failed: %s", sop.name, sop.deliver_to, exc)
                status, error = "failed", f"delivery to {sop.deliver_to} failed: {exc}"
        finished = await self.store.finish(
            run.id,
            status=status,
            reply=result.reply,
            model_calls=result.model_calls,
            error=error,
            delivered_to=delivered,
            session_id=result.session_id,
        )
        log.info("sop %s: run %s (%s) %s", sop.name, run.id, run.trigger, status)
        return finished

    async def drain(self) -> None:
        """Wait for every background run."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def stop(self) -> None:
        """Cancel runs still going (their rows stay ``running`` until found stale)."""
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
