"""``goclaw obligations``, ``goclaw obligation show|resolve``, ``goclaw signals list|route``.

Seed 001: "A person dispositions an obligation with ... resolve <id> --by <who>
--disposition <d> --rationale <text>. The interaction policy decides whether
<who> may resolve that severity." ``--by`` is looked up in the pairing store
and its stored role checked against ``intelligence.resolvers``.
"""

from __future__ import annotations

from typing import Any

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cli import ids
from gateway.cli.common import ConfigOpt, JsonOpt
from gateway.cli.identity import guarded, named_person, with_engine
from memory.facts_models import DISPOSITIONS
from memory.obligations import FindingsStore, ObligationHistory, ObligationView, resolve_obligation, route_pending

obligation_app = typer.Typer(help="One obligation: show it, resolve it (--by a person the policy allows).")
signals_app = typer.Typer(help="Intelligence signals from research SOPs: list them, route them.", no_args_is_help=True)
obligation_app.info.no_args_is_help = True

_CONFIG = ConfigOpt
_JSON = JsonOpt


def obligations_list(
    show_all: bool = typer.Option(False, "--all", help="Include resolved obligations."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Open obligations: on which SOP, how severe, whether it holds the SOP, and who may resolve it."""

    def body() -> None:
        from rich.table import Table

        from gateway.cli import out, print_json

        async def action(cfg: Any, engine: AsyncEngine) -> tuple[list[ObligationView], dict[str, tuple[str, ...]]]:
            found = await FindingsStore(engine).obligations(include_resolved=show_all)
            return found, cfg.intelligence.resolver_roles()

        found, resolvers = with_engine(config, action)
        if as_json:
            print_json([o.as_json(resolvers) for o in found])
            return
        if not found:
            out.print("no open obligations" if not show_all else "no obligations")
            return
        table = Table("id", "status", "sop", "severity", "holds", "owed to", "signal", "opened (UTC)", "disposition")
        for o in found:
            disp = f"{o.disposition.disposition} by {o.disposition.by_user_id}" if o.disposition else ""
            table.add_row(
                o.id, o.status, o.sop_name, o.severity, "yes" if o.holds else "no",
                " or ".join(resolvers.get(o.severity, ("admin",))) + "s", o.signal_id,
                f"{o.opened_at:%Y-%m-%d %H:%M}", disp,
            )  # fmt: skip
        out.print(table)

    guarded(body)


@obligation_app.command("show")
def obligation_show(obligation_id: str, as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """One obligation: the signal it came from and everything that happened to it since."""

    def body() -> None:
        from gateway.cli import out, print_json

        async def action(cfg: Any, engine: AsyncEngine) -> tuple[ObligationHistory, dict[str, tuple[str, ...]]]:
            oid = await ids.obligation_id(engine, obligation_id)
            return await FindingsStore(engine).history(oid), cfg.intelligence.resolver_roles()

        history, resolvers = with_engine(config, action)
        if as_json:
            print_json(history.as_json(resolvers))
            return
        o, s = history.obligation, history.signal
        out.print(
            f"{o.id}: {o.status}, {o.severity} on {o.sop_name}" + (" (holds it)" if o.holds else ""), highlight=False
        )
        out.print(f"signal {s.id}: {s.subject}: {s.claim}", highlight=False)
        out.print(f"  observation: {s.observation}", highlight=False)
        out.print(f"  evidence: {'; '.join(s.evidence)}", highlight=False)
        out.print(
            f"  confidence {s.confidence}, reported {s.reported_severity}, affects "
            f"{', '.join(s.affected_sops) or '-'}; observed {s.observed_at:%Y-%m-%d %H:%M}"
            + (f", expires {s.expires_at:%Y-%m-%d %H:%M}" if s.expires_at else ""),
            highlight=False,
        )
        for at, what in history.events():
            out.print(f"{at:%Y-%m-%d %H:%M:%S} {what}", highlight=False)

    guarded(body)


@obligation_app.command("resolve")
def obligation_resolve(
    obligation_id: str,
    by: str = typer.Option(..., "--by", help="Who resolves it: a unified user id (see 'goclaw users list')."),
    disposition: str = typer.Option(..., "--disposition", help=" | ".join(DISPOSITIONS)),
    rationale: str = typer.Option(..., "--rationale", help="Why (kept with the disposition)."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Disposition an obligation (a later event); a blocking one stops holding its SOP."""

    def body() -> None:
        from gateway.cli import out, print_json

        async def action(cfg: Any, engine: AsyncEngine) -> ObligationView:
            person = await named_person(engine, await ids.user_id(engine, by))
            return await resolve_obligation(
                FindingsStore(engine),
                await ids.obligation_id(engine, obligation_id),
                by=person,
                disposition=disposition,
                rationale=rationale,
                resolvers=cfg.intelligence.resolver_roles(),
            )

        done = with_engine(config, action)
        if as_json:
            print_json(done.as_json())
        else:
            out.print(f"resolved {done.id} ({done.sop_name}) as {disposition} by {by}", highlight=False)

    guarded(body)


@signals_app.command("route")
def signals_route(as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Route every signal not yet routed: note it, or open obligations (the scheduler does this each step)."""

    def body() -> None:
        from gateway.cli import out, print_json
        from gateway.facts_glue import routing_policy

        async def action(cfg: Any, engine: AsyncEngine) -> list[Any]:
            return await route_pending(FindingsStore(engine), routing_policy(cfg.intelligence))

        routed = with_engine(config, action)
        if as_json:
            print_json([r.as_json() for r in routed])
            return
        if not routed:
            out.print("no signals waiting to be routed")
        for r in routed:
            out.print(f"{r.signal_id}: {r.outcome} ({r.severity}): {r.reason}", highlight=False)

    guarded(body)


@signals_app.command("list")
def signals_list(as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Every signal, oldest first, with what the router made of it (or 'pending')."""

    def body() -> None:
        from gateway.cli import out, print_json

        async def action(_cfg: Any, engine: AsyncEngine) -> list[Any]:
            return await FindingsStore(engine).signals()

        rows = with_engine(config, action)
        if as_json:
            print_json([{**s.as_json(), "routing": r.as_json() if r else None} for s, r in rows])
            return
        if not rows:
            out.print("no signals")
        for s, r in rows:
            what = f"{r.outcome} ({r.severity}): {r.reason}" if r else "pending (not routed yet)"
            out.print(
                f"{s.id} from {s.sop_name} [{s.reported_severity}] {s.subject}: {s.claim} -> {what}", highlight=False
            )

    guarded(body)
