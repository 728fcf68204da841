"""The automation object a Gateway owns: store, runner, scheduler, and the YAML SOPs synced at start."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.automation.api import definition_from_config
from gateway.automation.config import AutomationConfig
from gateway.automation.payload import PayloadGuard
from gateway.automation.runner import Deliver, Holds, SopRunner
from gateway.automation.scheduler import Hook, SopScheduler
from gateway.automation.store import AutomationStore
from gateway.turn import TurnHandler


class Automation:
    """SOPs for one gateway process. No I/O until :meth:`sync_config` / :meth:`start`.

    Args:
        config: ``automation:`` of the config.
        max_message_chars: ``server.max_message_chars`` (the webhook body limit is 4x it unless set).
        engine: The gateway's database.
        turns: The one turn handler.
        clock: The gateway's clock (injected in tests).
        guard: The turn's memory wrapper that keeps webhook payloads out of memory_write.
        holds: Which obligation holds an SOP (memory's router); default: none ever.
        before_step: Hooks called before each scheduler step.
        deliver: How a reply reaches ``discord:<id>`` / ``teams:<id>``.
    """

    def __init__(
        self,
        *,
        config: AutomationConfig,
        max_message_chars: int,
        engine: AsyncEngine,
        turns: TurnHandler,
        clock: Callable[[], datetime],
        guard: PayloadGuard | None = None,
        holds: Holds | None = None,
        before_step: list[Hook] | None = None,
        deliver: Deliver | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = AutomationStore(engine, clock)
        self.runner = SopRunner(store=self.store, turns=turns, clock=clock, guard=guard, holds=holds, deliver=deliver)
        self.scheduler = SopScheduler(
            store=self.store,
            runner=self.runner,
            clock=clock,
            poll_seconds=config.poll_seconds,
            before_step=before_step,
        )
        self.webhook_max_bytes = config.webhook_max_bytes or max_message_chars * 4

    async def sync_config(self) -> None:
        """Upsert the SOPs of ``automation.sops`` (a restart keeps each one's schedule state)."""
        await self.store.sync_yaml([definition_from_config(s) for s in self.config.sops])

    async def start(self) -> None:
        """Start the scheduler loop."""
        await self.scheduler.start()

    async def stop(self) -> None:
        """Stop the loop, then the runs in progress."""
        await self.scheduler.stop()
        await self.runner.stop()
