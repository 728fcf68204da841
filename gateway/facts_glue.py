"""Identity proposals, intelligence and obligations wired into the gateway: the tools and the SOP hooks.

The turn's tools come from :meth:`FactsGlue.tools` (``GatewayMemory.tools``
adds them). Who may use each is decided in code from the principal and the
turn's :class:`~gateway.turn.RunContext`: the ``authorize`` of each tool
(which also decides what is offered) captures the run, and every handler
checks again, so a tool named by a model that was not offered it still refuses.

The automation runner asks :meth:`FactsGlue.holds` before it starts an SOP run
and its scheduler calls :meth:`FactsGlue.before_step` before each step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from gateway.config import IntelligenceConfig
from gateway.llm.base import Tool
from gateway.turn import RunContext
from memory.identity import (
    IDENTITY_DECIDE_DESCRIPTION,
    IDENTITY_DECIDE_SCHEMA,
    PROPOSE_POLICY_CHANGE_DESCRIPTION,
    PROPOSE_POLICY_CHANGE_SCHEMA,
    IdentityStore,
    authorize_decide,
    authorize_propose,
    identity_decide,
    propose_policy_change,
)
from memory.intelligence import (
    REPORT_INTELLIGENCE_DESCRIPTION,
    REPORT_INTELLIGENCE_SCHEMA,
    Floor,
    Routing,
    RoutingPolicy,
)
from memory.obligations import (
    RESOLVE_OBLIGATION_DESCRIPTION,
    RESOLVE_OBLIGATION_SCHEMA,
    FindingsStore,
    authorize_report,
    holding_obligation,
    may_resolve_any,
    obligation_tool,
    report_intelligence,
    route_pending,
)
from memory.writer import MemoryWriter
from pairing.principal import Principal

REFUSE_RESOLVE = "Resolving obligations needs an administrator (intelligence.resolvers); nothing was changed."


def routing_policy(cfg: IntelligenceConfig) -> RoutingPolicy:
    """The config's ``intelligence`` section as the router's policy."""
    return RoutingPolicy(
        floors=tuple(Floor(f.pattern, f.at_least, f.why) for f in cfg.floors),
        owed_at=cfg.owed_at,
        blocks_at=cfg.blocks_at,
    )


class FactsGlue:
    """Identity proposals and decisions, signals and obligations, for the turn and for automation."""

    def __init__(
        self,
        *,
        identity: IdentityStore,
        findings: FindingsStore,
        writer: MemoryWriter,
        config: IntelligenceConfig,
        clock: Callable[[], datetime],
        on_identity_change: Callable[[], None] | None = None,
    ) -> None:
        self.identity = identity
        self.findings = findings
        self.writer = writer
        self.policy = routing_policy(config)
        self.resolvers = config.resolver_roles()
        self._clock = clock
        self._on_identity_change = on_identity_change

    async def before_step(self) -> list[Routing]:
        """Route every pending signal (the scheduler calls this before each step)."""
        return await route_pending(self.findings, self.policy, self._clock())

    async def holds(self, sop_name: str) -> str | None:
        """The obligation id holding ``sop_name``, or None; pending signals are routed first, so none is missed."""
        await self.before_step()
        return await holding_obligation(self.findings, sop_name)

    def tools(
        self, principal: Principal, *, session_id: str, message_id: str, run: RunContext | None = None
    ) -> list[Tool]:
        """``propose_policy_change``, ``report_intelligence``, ``identity_decide`` and ``obligation_resolve``."""
        run_id = run.run_id if run else None
        sop_name = run.sop_name if run else None
        research = bool(run and run.research)

        def may_propose(p: Principal) -> str | None:
            return authorize_propose(p, run_id=run_id)

        def may_report(p: Principal) -> str | None:
            # Decided from the run's profile (RunContext.research), not from the tool list.
            return authorize_report(p, research=research)

        def may_resolve(p: Principal) -> str | None:
            return None if may_resolve_any(p, self.resolvers) else REFUSE_RESOLVE

        async def propose(p: Principal, args: Mapping[str, Any]) -> str:
            return await propose_policy_change(
                self.identity, p, args, run_id=run_id, sop_name=sop_name, session_id=session_id, message_id=message_id
            )

        async def report(p: Principal, args: Mapping[str, Any]) -> str:
            return await report_intelligence(
                self.findings, p, args, research=research, sop_name=sop_name, run_id=run_id
            )

        async def decide(p: Principal, args: Mapping[str, Any]) -> str:
            return await identity_decide(self.identity, self.writer, p, args, on_accept=self._on_identity_change)

        async def resolve(p: Principal, args: Mapping[str, Any]) -> str:
            return await obligation_tool(self.findings, p, args, resolvers=self.resolvers)

        return [
            Tool(
                "propose_policy_change",
                PROPOSE_POLICY_CHANGE_DESCRIPTION,
                PROPOSE_POLICY_CHANGE_SCHEMA,
                propose,
                may_propose,
            ),
            Tool(
                "report_intelligence", REPORT_INTELLIGENCE_DESCRIPTION, REPORT_INTELLIGENCE_SCHEMA, report, may_report
            ),
            Tool("identity_decide", IDENTITY_DECIDE_DESCRIPTION, IDENTITY_DECIDE_SCHEMA, decide, authorize_decide),
            Tool("obligation_resolve", RESOLVE_OBLIGATION_DESCRIPTION, RESOLVE_OBLIGATION_SCHEMA, resolve, may_resolve),
        ]
