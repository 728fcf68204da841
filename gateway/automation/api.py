"""The plain async functions every surface calls (CLI, dashboard): none of them holds a rule of its own."""

from __future__ import annotations

import secrets
from typing import Any

from msgspec import Struct, field

from gateway.automation.config import SopConfig, check_name, check_secret, check_target
from gateway.automation.runner import SopRunner
from gateway.automation.schedule import make_trigger
from gateway.automation.store import AutomationStore, RunView, SopDefinition, SopError, SopView

LAST_RUNS = 3


class SopSummary(Struct, frozen=True):
    """An SOP with its next run and its latest runs (newest first)."""

    sop: SopView
    last_runs: list[RunView] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The CLI / dashboard shape."""
        return {**self.sop.as_json(), "last_runs": [r.as_json() for r in self.last_runs]}


def definition_from_config(cfg: SopConfig) -> SopDefinition:
    """A YAML SOP as a definition."""
    webhook = cfg.trigger.webhook
    return SopDefinition(
        name=cfg.name,
        instruction=cfg.instruction,
        trigger=cfg.trigger.trigger(),
        deliver_to=cfg.deliver_to,
        enabled=cfg.enabled,
        research=cfg.research,
        scope=tuple(cfg.scope),
        catch_up=cfg.catch_up,
        secret=webhook.secret.get_secret_value() if webhook is not None else None,
    )


def new_definition(
    name: str,
    instruction: str,
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: str | None = None,
    at: str | None = None,
    manual: bool = False,
    webhook: bool = False,
    secret: str | None = None,
    deliver_to: str | None = None,
    research: bool = False,
    scope: tuple[str, ...] = (),
    catch_up: str = "once",
    enabled: bool = True,
) -> SopDefinition:
    """A definition from its parts, validated like the YAML (a webhook without ``secret`` gets a fresh one).

    Raises:
        ValueError: naming what is wrong (the cron field, the unknown delivery channel, ...).
    """
    check_name(name)
    if not instruction.strip():
        raise ValueError("--instruction is empty: say what the agent is to do")
    if catch_up not in ("once", "skip"):
        raise ValueError(f"catch_up {catch_up!r}: use once or skip")
    trigger = make_trigger(cron=cron, tz=tz, every=every, at=at, manual=manual, webhook=webhook)
    if secret is not None and not webhook:
        raise ValueError("a secret applies to a webhook trigger only")
    if webhook:
        secret = check_secret(secret) if secret is not None else secrets.token_hex(32)
    return SopDefinition(
        name=name,
        instruction=instruction.strip(),
        trigger=trigger,
        deliver_to=check_target(deliver_to) if deliver_to else None,
        enabled=enabled,
        research=research,
        scope=tuple(scope),
        catch_up=catch_up,
        secret=secret,
    )


async def list_sops(store: AutomationStore, *, last: int = LAST_RUNS) -> list[SopSummary]:
    """Every SOP with its next run and its latest runs."""
    out = []
    for sop in await store.all():
        out.append(SopSummary(sop, await store.runs(sop.name, limit=last)))
    return out


async def get_sop(store: AutomationStore, name: str, *, last: int = 10) -> SopSummary:
    """One SOP with its latest runs.

    Raises:
        SopError: no SOP of that name.
    """
    sop = await store.require(name)
    return SopSummary(sop, await store.runs(name, limit=last))


async def add_sop(store: AutomationStore, definition: SopDefinition) -> SopView:
    """Add an SOP (from the CLI or the dashboard); stored, so it survives restarts.

    Raises:
        SopError: the name is taken.
    """
    return await store.add(definition, origin="cli")


async def set_enabled(store: AutomationStore, name: str, enabled: bool) -> SopView:
    """Enable or disable an SOP.

    Raises:
        SopError: no SOP of that name.
    """
    return await store.set_enabled(name, enabled)


async def remove_sop(store: AutomationStore, name: str) -> None:
    """Remove an SOP added with the CLI (its run history stays).

    Raises:
        SopError: no such SOP, or it is defined in the config file.
    """
    await store.remove(name)


async def run_now(runner: SopRunner, name: str) -> RunView:
    """Run an SOP now as ``sop-system``, whatever its trigger; the finished run (or the ``held`` row).

    Raises:
        SopError: no SOP of that name, or it is disabled.
    """
    sop = await runner.store.require(name)
    if not sop.enabled:
        raise SopError(f"SOP {name!r} is disabled; 'goclaw sop enable {name}' first")
    return await runner.run_now(sop)


async def list_runs(store: AutomationStore, name: str | None = None, *, limit: int = 50) -> list[RunView]:
    """Run history, newest first (one SOP's, or all)."""
    if name is not None and await store.get(name) is None and not await store.runs(name, limit=1):
        raise SopError(f"no SOP named {name!r} and no runs of one; see 'goclaw sop list'")
    return await store.runs(name, limit=limit)


__all__ = [
    "SopError",
    "SopSummary",
    "add_sop",
    "definition_from_config",
    "get_sop",
    "list_runs",
    "list_sops",
    "new_definition",
    "remove_sop",
    "run_now",
    "set_enabled",
]
