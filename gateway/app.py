"""The composition root: one Gateway object wires config, database, stores, model, memory, web, channels."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from channels.base import ChannelAdapter
from gateway.automation.delivery import deliver
from gateway.automation.payload import PayloadGuard
from gateway.automation.runner import Holds
from gateway.automation.scheduler import Hook
from gateway.automation.service import Automation
from gateway.config import Config, DiscordConfig, TeamsConfig
from gateway.db import make_engine, upgrade
from gateway.dispatch import ChannelRules, Dispatcher
from gateway.hotstore import hot_store
from gateway.idle import IdleExtractor
from gateway.llm.base import LLMProvider
from gateway.memory_glue import GatewayMemory, build_memory
from gateway.metrics import Metrics
from gateway.models import Job
from gateway.notices import NoticeDelivery
from gateway.revise_job import FORGET_DONE
from gateway.sessions import TRIM_JOB, SessionKey, SessionStore, principal_from_json
from gateway.turn import TurnHandler, TurnRequest, TurnResult
from gateway.web.app import WebContext, build_web_app
from gateway.web.dashboard import mount_dashboard
from gateway.web.hooks import add_hook_routes
from gateway.worker import JobWorker
from gateway.write_health import WriteHealth
from pairing.notices import NoticeOutbox
from pairing.principal import Principal
from pairing.store import PairingStore

log = logging.getLogger("goclaw")


def channel_rules(cfg: DiscordConfig | TeamsConfig) -> ChannelRules:
    """A channel config section as admission rules."""
    return ChannelRules(
        dm_policy=cfg.dm_policy,
        allow_from=frozenset(cfg.allow_from),
        group_policy=cfg.group_policy,
        allow_channels=frozenset(cfg.allow_channels),
        require_mention=cfg.require_mention,
    )


class Gateway:
    """Everything one gateway process runs. No I/O until ``start``."""

    def __init__(
        self,
        config: Config,
        *,
        provider: LLMProvider | None = None,
        clock: Callable[[], datetime] | None = None,
        engine: AsyncEngine | None = None,
        inline_driver: bool = False,
        trim_jobs: bool = False,
    ) -> None:
        self.config = config
        # Trims queued as ``trim`` jobs for the job process or ``goclaw worker`` (``goclaw serve`` and the
        # background gateways), or run on this loop after the reply (a gateway embedded in code: the tests).
        self._trim_jobs = trim_jobs
        # The background thread's gateway: on SQLite, its driver calls are made inline
        # (gateway/sqlite_inline.py); nothing on its loop answers a turn.
        self._inline_driver = inline_driver
        self.clock = clock or (lambda: datetime.now(UTC))
        self._provider_override = provider
        self._engine_override = engine
        self.metrics = Metrics()
        self.adapters: dict[str, ChannelAdapter] = {}
        self.channel_state: dict[str, str] = {}
        self.engine: AsyncEngine
        self.pairing: PairingStore
        self.sessions: SessionStore
        self.provider: LLMProvider
        self.memory: GatewayMemory
        self.turns: TurnHandler
        self.dispatcher: Dispatcher
        self.worker: JobWorker
        self.idle: IdleExtractor
        self.notices: NoticeDelivery
        self.web: web.Application
        self.automation: Automation
        # Tests may set these before start(); start() adds memory's obligations and router.
        self.sop_holds: Holds | None = None
        self.sop_before_step: list[Hook] = []
        # Where the background work runs when not here (gateway/background.py): how to wake it.
        self.wake_remote_worker: Callable[[], None] | None = None

    async def start(self, *, channels: bool = True, worker: bool = True) -> None:
        """Migrate the database, open the model, build the turn and web app, start channels and the worker."""
        from gateway.llm.factory import make_provider

        self.engine = self._engine_override or self._make_engine()
        await upgrade(self.engine)
        self.pairing = PairingStore(self.engine, clock=self.clock, roles=hot_store(self.engine))
        self.sessions = SessionStore(self.engine, clock=self.clock)
        self.provider = self._provider_override or make_provider(self.config.llm)
        await self.provider.start()
        self.memory, job_handlers = build_memory(self)
        # seed 001: an obligation at blocking severity holds its SOP's runs, and the router
        # runs before each scheduler step; "gateway/automation asks memory whether an SOP is held".
        facts = self.memory.facts
        assert facts is not None  # build_memory always sets it
        if self.sop_holds is None:
            self.sop_holds = facts.holds

        async def route_findings() -> None:
            await facts.before_step()

        self.sop_before_step.append(route_findings)
        job_handlers[TRIM_JOB] = self._trim_job
        self.worker = JobWorker(
            self.sessions,
            job_handlers,
            metrics=self.metrics,
            lease_s=self.config.session.job_lease_seconds,
            # A done trim job is deleted: its archive and extraction job are its record.
            forget_done=FORGET_DONE | {TRIM_JOB},
            keep_done_s=self.config.worker.keep_done_jobs_days * 86_400,
            # Notes past their review-by date leave the index each turn's match walks.
            upkeep={"expired notes' index terms deleted": self.memory.store.prune_expired_postings},
        )
        self.idle = IdleExtractor(
            self.engine,
            idle_seconds=self.config.session.idle_extract_seconds,
            clock=self.clock,
            on_job=self.wake_worker,
        )
        self.turns = TurnHandler(
            config=self.config,
            sessions=self.sessions,
            provider=self.provider,
            memory=(guard := PayloadGuard(self.memory)),
            metrics=self.metrics,
            clock=self.clock,
            on_trim=lambda _r: self.wake_worker(),
            trim_jobs=self._trim_jobs,
        )
        self.automation = Automation(
            config=self.config.automation,
            max_message_chars=self.config.server.max_message_chars,
            engine=self.engine,
            turns=self.turns,
            clock=self.clock,
            guard=guard,
            holds=self.sop_holds,
            before_step=self.sop_before_step,
            deliver=lambda target, text: deliver(self.adapters, target, text),
        )
        await self.automation.sync_config()
        self.write_health = WriteHealth(self.engine)
        self.dispatcher = Dispatcher(
            pairing=self.pairing,
            turns=self.turns,
            max_message_chars=self.config.server.max_message_chars,
            write_health=self.write_health,
            rules={
                "discord": channel_rules(self.config.channels.discord),
                "teams": channel_rules(self.config.channels.teams),
            },
        )
        self.web = build_web_app(
            WebContext(
                config=self.config,
                pairing=self.pairing,
                sessions=self.sessions,
                turns=self.turns,
                metrics=self.metrics,
                channel_status=lambda: dict(self.channel_state),
                write_health=self.write_health,
            )
        )
        mount_dashboard(self.web, self)
        add_hook_routes(self.web, self.automation)
        self._build_channels()
        self.notices = NoticeDelivery(NoticeOutbox(self.engine, clock=self.clock), lambda: self.adapters)
        if worker:
            await self.worker.start()
            await self.idle.start()
            await self.memory.scheduler.start()
            await self.automation.start()
        if channels:
            await self.start_channels()

    def _build_channels(self) -> None:
        ch = self.config.channels
        if ch.teams.enabled:
            from channels.teams import TeamsAdapter

            teams = TeamsAdapter(
                app_id=ch.teams.app_id,
                app_password=ch.teams.app_password.get_secret_value() if ch.teams.app_password else "",
                handler=self.dispatcher.handle,
                app_tenant_id=ch.teams.app_tenant_id,
                allowed_tenants=ch.teams.allowed_tenants,
                references=self.automation.store,  # proactive sends survive a restart
                allowed_service_urls=ch.teams.allowed_service_urls,
            )
            teams.add_routes(self.web)
            self.adapters["teams"] = teams
            self.channel_state["teams"] = "stopped"
        if ch.discord.enabled:
            from channels.discord import DiscordAdapter

            token = ch.discord.token.get_secret_value() if ch.discord.token else ""
            self.adapters["discord"] = DiscordAdapter(
                token, self.dispatcher.handle, shard_ids=ch.discord.shard_ids, shard_count=ch.discord.shard_count
            )
            self.channel_state["discord"] = "stopped"

    async def _trim_job(self, job: Job) -> None:
        """A ``trim`` job: trim its session now, as the turn that queued it would have (nothing to cut: nothing)."""
        payload = job.payload
        await self.turns.trim(str(payload["session_id"]), principal_from_json(payload["turn_principal"]))

    def wake_worker(self) -> None:
        """Tell the job worker there is work (a trim's extraction job, a deferred revision)."""
        (self.wake_remote_worker or self.worker.wake)()

    async def system_turn(
        self, system_name: str, text: str, *, session: str = "default", message_id: str | None = None
    ) -> TurnResult:
        """Run a turn as an autonomous principal (``cron-system``, ``sop-system``, ``webhook-system``).

        The entry point the scheduler, SOP runs and webhooks use. Such a run
        executes existing procedures: it is not a human admin, has no personal
        memory, and webhook turns are skipped by extraction.
        """
        principal = Principal.system(system_name)
        return await self.turns.handle(
            TurnRequest(
                key=SessionKey("system", f"{system_name}/{session}"),
                principal=principal,
                text=text,
                message_id=message_id or f"{system_name}-{secrets.token_hex(8)}",
                said_at=self.clock(),
                display_name=system_name,
            )
        )

    async def start_channels(self) -> None:
        """Start every enabled adapter; a failure is logged and shown in /readyz, not fatal."""
        for name, adapter in self.adapters.items():
            try:
                await adapter.start()
                self.channel_state[name] = "started"
            except Exception as exc:
                self.channel_state[name] = f"failed: {exc}"
                log.error("channel %s failed to start: %s", name, exc)
        if self.adapters:
            await self.notices.start()  # tell approved people they are paired (approvals from any process)

    async def stop(self) -> None:
        """Stop channels, the worker and the model; close the database."""
        if hasattr(self, "notices"):
            await self.notices.stop()
        for name, adapter in self.adapters.items():
            try:
                await adapter.stop()
            except Exception as exc:
                log.warning("channel %s did not stop cleanly: %s", name, exc)
            self.channel_state[name] = "stopped"
        if hasattr(self, "turns"):
            await self.turns.settled()  # a trim in flight finishes (it would be redone at the next turn)
        if hasattr(self, "idle"):
            await self.idle.stop()
        if hasattr(self, "automation"):
            await self.automation.stop()
        if hasattr(self, "worker"):
            await self.worker.stop()
        if hasattr(self, "memory"):
            await self.memory.scheduler.stop()
        if hasattr(self, "provider"):
            await self.provider.stop()
        if hasattr(self, "engine") and self._engine_override is None:
            await self.engine.dispose()

    def _make_engine(self) -> AsyncEngine:
        db = self.config.database
        if self._inline_driver and db.url.startswith("sqlite"):
            from gateway.sqlite_inline import make_inline_engine

            return make_inline_engine(db.url, echo=db.echo, wal_limit_bytes=db.wal_limit_bytes)
        return make_engine(db.url, echo=db.echo, wal_limit_bytes=db.wal_limit_bytes)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
