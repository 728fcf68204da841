"""``goclaw sop``: list, show, add, run, enable, disable, remove, runs.

Every command calls the functions of ``gateway.automation.api`` (the dashboard
calls the same ones). The SOPs of ``automation.sops`` in the config are synced
into the database first, so they are listed and runnable before the first
``goclaw serve``. The helpers of ``gateway.cli`` are imported inside the
commands, so ``gateway.cli`` can import this module without a cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from gateway.automation import api
from gateway.automation.store import AutomationStore, RunView, SopError
from gateway.cli.common import ConfigOpt, JsonOpt, guarded

if TYPE_CHECKING:
    from gateway.config import Config

sop_app = typer.Typer(help="Standing procedures (SOPs): schedules, webhooks, runs.", no_args_is_help=True)
T = TypeVar("T")

_CONFIG = ConfigOpt
_JSON = JsonOpt


def _guarded(fn: Callable[[], None]) -> None:
    """Run a command body: one-line errors (exit 2), never a traceback."""
    guarded(fn, SopError)


def _load(config: str | None) -> Config:
    from gateway.cli import load

    return load(config)


def _with_store(config: str | None, action: Callable[[AutomationStore], Awaitable[T]]) -> T:
    """Open the database (migrating it), sync the config's SOPs, run ``action`` with the store, close."""
    from gateway.cli import with_engine

    cfg = _load(config)

    async def body(engine: Any) -> T:
        store = AutomationStore(engine)
        await store.sync_yaml([api.definition_from_config(s) for s in cfg.automation.sops])
        return await action(store)

    return with_engine(cfg, body)


def _when(value: Any) -> str:
    return f"{value:%Y-%m-%d %H:%M} UTC" if value else "-"


def _run_line(r: RunView) -> str:
    detail = f": {r.error}" if r.error else ""
    return f"{r.id}  {_when(r.created_at)}  {r.trigger:<8} {r.principal:<15} {r.status}{detail}"


@sop_app.command("list")
def sop_list(as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Every SOP: trigger, next run, last run."""

    def body() -> None:
        from rich.table import Table

        from gateway.cli import out, print_json

        rows = _with_store(config, api.list_sops)
        if as_json:
            print_json([r.as_json() for r in rows])
            return
        if not rows:
            out.print("no SOPs; add one under automation.sops in the config or with 'goclaw sop add'")
            return
        table = Table("name", "trigger", "enabled", "next run", "last run", "deliver to")
        for r in rows:
            last = r.last_runs[0] if r.last_runs else None
            table.add_row(
                r.sop.name,
                r.sop.trigger.describe(),
                "yes" if r.sop.enabled else "no",
                _when(r.sop.next_run),
                f"{last.status} {_when(last.created_at)}" if last else "-",
                r.sop.deliver_to or "-",
            )
        out.print(table)

    _guarded(body)


@sop_app.command("show")
def sop_show(name: str, as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """One SOP with its latest runs."""

    def body() -> None:
        from gateway.cli import out, print_json

        s = _with_store(config, lambda store: api.get_sop(store, name))
        if as_json:
            print_json(s.as_json())
            return
        sop = s.sop
        lines = [
            f"name:        {sop.name} ({'defined in the config' if sop.origin == 'yaml' else 'added with the CLI'})",
            f"instruction: {sop.instruction}",
            f"trigger:     {sop.trigger.describe()}" + ("  (signed with its secret)" if sop.has_secret else ""),
            f"enabled:     {'yes' if sop.enabled else 'no'}",
            f"next run:    {_when(sop.next_run)}",
            f"catch up:    {sop.catch_up}",
            f"deliver to:  {sop.deliver_to or '- (kept in the run history)'}",
            f"research:    {'yes' if sop.research else 'no'}",
            f"scope:       {', '.join(sop.scope) or '-'}",
            "runs:" if s.last_runs else "runs:        none yet",
            *(f"  {_run_line(r)}" for r in s.last_runs),
        ]
        out.print("\n".join(lines), markup=False, highlight=False)

    _guarded(body)


@sop_app.command("add")
def sop_add(
    name: str,
    instruction: str = typer.Option(..., "--instruction", help="What the agent is to do."),
    cron: str | None = typer.Option(None, "--cron", help='A 5-field cron expression, e.g. "0 7 * * 1-5".'),
    tz: str | None = typer.Option(None, "--tz", help="The cron expression's time zone (default UTC)."),
    every: str | None = typer.Option(None, "--every", help="An interval: 15m, 1h, 1h30m, 2d."),
    at: str | None = typer.Option(None, "--at", help="Once, at an ISO 8601 time with offset."),
    manual: bool = typer.Option(False, "--manual", help="Only when run with 'goclaw sop run'."),
    webhook: bool = typer.Option(False, "--webhook", help="On a signed POST /hooks/NAME."),
    deliver_to: str | None = typer.Option(
        None, "--deliver-to", help="discord:<channel id> or teams:<conversation id>."
    ),
    research: bool = typer.Option(False, "--research", help="A research SOP (may report findings)."),
    scope: list[str] = typer.Option([], "--scope", help="A scope tag (repeatable)."),
    catch_up: str = typer.Option("once", "--catch-up", help="Missed runs while down: once or skip."),
    config: str | None = _CONFIG,
) -> None:
    """Add an SOP (stored in the database; it survives restarts)."""

    def body() -> None:
        from gateway.cli import out

        definition = api.new_definition(
            name,
            instruction,
            cron=cron,
            tz=tz,
            every=every,
            at=at,
            manual=manual,
            webhook=webhook,
            deliver_to=deliver_to,
            research=research,
            scope=tuple(scope),
            catch_up=catch_up,
        )
        sop = _with_store(config, lambda store: api.add_sop(store, definition))
        out.print(
            f"added SOP {sop.name}: {sop.trigger.describe()}, next run {_when(sop.next_run)}",
            markup=False,
            highlight=False,
        )
        if webhook:
            out.print(
                f"webhook: POST /hooks/{sop.name}, secret {definition.secret} (shown once: keep it to sign requests)",
                markup=False,
                highlight=False,
            )

    _guarded(body)


@sop_app.command("run")
def sop_run(name: str, config: str | None = _CONFIG) -> None:
    """Run an SOP now (as sop-system) and print the reply."""

    def body() -> None:
        from gateway.app import Gateway
        from gateway.cli import fail, out, run

        cfg = _load(config)

        async def go() -> RunView:
            gw = Gateway(cfg)
            await gw.start(channels=False, worker=False)
            try:
                sop = await gw.automation.store.require(name)
                if sop.deliver_to:
                    await gw.start_channels()
                result = await api.run_now(gw.automation.runner, name)
                await gw.worker.drain()
                return result
            finally:
                await gw.stop()

        result = run(go())
        if result.status == "held":
            raise fail(
                f"SOP {name!r} is held by obligation {result.held_by}; an admin must disposition it before it runs"
            )
        if result.status != "ok":
            raise fail(f"run {result.id} of {name} {result.status}: {result.error}")
        out.print(result.reply or "", markup=False, highlight=False)

    _guarded(body)


def _toggle(name: str, enabled: bool, config: str | None) -> None:
    def body() -> None:
        from gateway.cli import out

        sop = _with_store(config, lambda store: api.set_enabled(store, name, enabled))
        note = ""
        if sop.origin == "yaml":
            note = " (it is defined in the config: set enabled there to keep it so across restarts)"
        out.print(
            f"SOP {sop.name} {'enabled' if enabled else 'disabled'}; next run {_when(sop.next_run)}{note}",
            markup=False,
            highlight=False,
        )

    _guarded(body)


@sop_app.command("enable")
def sop_enable(name: str, config: str | None = _CONFIG) -> None:
    """Enable an SOP (its schedule starts from now)."""
    _toggle(name, True, config)


@sop_app.command("disable")
def sop_disable(name: str, config: str | None = _CONFIG) -> None:
    """Disable an SOP: no scheduled runs, webhooks answered 409."""
    _toggle(name, False, config)


@sop_app.command("remove")
def sop_remove(name: str, config: str | None = _CONFIG) -> None:
    """Remove an SOP added with the CLI (its run history stays)."""

    def body() -> None:
        from gateway.cli import out

        _with_store(config, lambda store: api.remove_sop(store, name))
        out.print(f"removed SOP {name}", markup=False, highlight=False)

    _guarded(body)


@sop_app.command("runs")
def sop_runs(
    name: str | None = typer.Argument(None, help="Only this SOP's runs."),
    limit: int = typer.Option(50, "--limit", min=1, max=1000, help="How many, newest first."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Run history, newest first: trigger, principal, status, model calls, error."""

    def body() -> None:
        from rich.table import Table

        from gateway.cli import out, print_json

        rows = _with_store(config, lambda store: api.list_runs(store, name, limit=limit))
        if as_json:
            print_json([r.as_json() for r in rows])
            return
        if not rows:
            out.print("no runs yet")
            return
        table = Table("id", "sop", "trigger", "principal", "started (UTC)", "status", "model calls", "error")
        for r in rows:
            table.add_row(
                r.id,
                r.sop_name,
                r.trigger,
                r.principal,
                _when(r.started_at or r.created_at),
                r.status,
                str(r.model_calls),
                r.error or "",
            )
        out.print(table)

    _guarded(body)
