"""The scheduler loop: each step fires the SOPs whose due time has come, exactly once across processes.

A step (1) calls every ``before_step`` hook (memory's intelligence router goes
there), (2) reads the enabled SOPs whose ``next_due_at`` has passed, (3) for
each, claims its (sop, due time) run row (the unique row is the claim: with
several ``goclaw serve`` processes on one PostgreSQL database only one insert
succeeds) and (4) moves ``next_due_at`` on, compare-and-set. Claim before
advance: a process that dies between the two leaves a claimed run, never a
lost one. The run itself goes on in the background, so a slow run never
delays another SOP.

Time comes from the injected clock; the loop's waits from the injected
``sleep``. Tests call :meth:`SopScheduler.step` after moving the clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from gateway.automation.runner import SopRunner
from gateway.automation.schedule import decide_due
from gateway.automation.store import AutomationStore, RunView
from gateway.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]
MIN_GRACE = timedelta(seconds=60)


class SopScheduler:
    """Fires due SOP runs. No I/O until :meth:`start`."""

    def __init__(
        self,
        *,
        store: AutomationStore,
        runner: SopRunner,
        clock: Callable[[], datetime],
        poll_seconds: float = 15.0,
        before_step: list[Hook] | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.store = store
        self.runner = runner
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.before_step: list[Hook] = before_step if before_step is not None else []
        self.sleep: Sleep = sleep or asyncio.sleep
        # A due time further back than this was missed (the gateway was down), not merely reached late.
        self.grace = max(MIN_GRACE, timedelta(seconds=2 * poll_seconds))
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def step(self) -> list[RunView]:
        """One pass: hooks, then every due SOP. Returns the runs this process claimed."""
        for hook in list(self.before_step):
            try:
                await hook()
            except Exception:
                log.exception("sop scheduler: a before-step hook failed")
        now = self.clock()
        claimed: list[RunView] = []
        for sop in await self.store.timed_due(now):
            decision = decide_due(sop.trigger, sop.next_due_at, now, catch_up=sop.catch_up, grace=self.grace)
            if decision.due_at is None:
                continue
            kind = sop.trigger.kind
            if decision.run:
                claim = await self.runner.claim(sop, trigger=kind, due_at=decision.due_at)
            else:
                claim = await self.runner.claim(
                    sop,
                    trigger=kind,
                    due_at=decision.due_at,
                    status="skipped",
                    error=f"missed {decision.missed} due run(s) while the gateway was down (catch_up: skip)",
                )
            await self.store.advance(sop.name, sop.next_due_at, decision.next_due)
            if claim.run is None:
                continue  # another process claimed this due time
            if decision.run and decision.missed:
                log.info("sop %s: %d missed run(s) caught up by one (catch_up: once)", sop.name, decision.missed)
            claimed.append(claim.run)
            if claim.run.status == "running":
                self.runner.in_background(sop, claim.run)
            else:
                log.info(
                    "sop %s: due run %s recorded as %s: %s", sop.name, claim.run.id, claim.run.status, claim.run.error
                )
        return claimed

    async def start(self) -> None:
        """Start the loop."""
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._loop(), name="sop-scheduler")

    async def stop(self) -> None:
        """Stop the loop between steps (runs in progress are the runner's to stop).

        A step is never cut between claiming a run and starting it: that would
        leave a claimed run that never ran.
        """
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=30)
        except TimeoutError:
            await cancel_and_wait(task)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._task is not None

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.step()
            except Exception:
                # A database hiccup must not end the schedule; the next step tries again.
                log.exception("sop scheduler: step failed")
            wait = asyncio.ensure_future(self.sleep(self.poll_seconds))
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_and_wait(wait, stop)
