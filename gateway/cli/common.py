"""What every ``goclaw`` command group shares: consoles, options, one-line errors, the database.

One place for these (DESIGN: "gateway/cli/: one module per command group, shared
helpers in one place"); a leaf module, so every group imports it at the top.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

# The consoles, escape and load live in gateway.cli_base (`goclaw serve` uses them without Typer); the command
# groups import them from here.
from gateway.cli_base import USER_ERRORS, load, out, print_error, report_error
from gateway.cli_base import err as err
from gateway.cli_base import escape as escape
from gateway.config import Config
from gateway.db import make_engine, upgrade
from gateway.errors import DatabaseUnavailable
from pairing.store import PairingStore, parse_identity

if TYPE_CHECKING:
    from rich.table import Column, Table

T = TypeVar("T")

ConfigOpt = typer.Option(None, "--config", "-c", help="Config file (else $GOCLAW_CONFIG, else ./config.yaml).")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")


KNOWN_CHANNELS = ("discord", "teams", "web", "api")
"""The channels a person can be paired or linked on."""


def known_channel(channel: str) -> str:
    """``channel`` lower-cased, or a ValueError naming the known ones."""
    name = channel.strip().lower()
    if name not in KNOWN_CHANNELS:
        raise ValueError(f"unknown channel {channel!r}: use one of {', '.join(KNOWN_CHANNELS)}")
    return name


def known_identity(spec: str) -> str:
    """``CHANNEL:PLATFORM_ID`` whose channel is a known one."""
    channel, platform_id = parse_identity(spec)
    return f"{known_channel(channel)}:{platform_id}"


def id_column(header: str) -> Column:
    """A table column for ids: never cut (see :func:`print_table`), so it can be copied."""
    from rich.table import Column

    return Column(header, no_wrap=True, overflow="fold")


def print_table(table: Table) -> None:
    """Print ``table`` with each id column as wide as its longest id, however narrow the terminal."""
    for column in table.columns:
        if column.no_wrap and column.overflow == "fold":
            column.min_width = max([len(str(column.header)), *(len(str(c)) for c in column.cells)])
    out.print(table)


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2)."""
    print_error(message)
    return typer.Exit(2)


def cli_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn our errors into one line on stderr and exit code 2; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            raise typer.Exit(report_error(exc)) from None

    return wrapper


def with_engine(cfg: Config, body: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Open the database of ``cfg`` (migrating it), run ``body`` with the engine, close it."""

    async def go() -> T:
        engine = make_engine(cfg.database.url)
        try:
            await upgrade(engine)
            return await body(engine)
        finally:
            await engine.dispose()

    return run(go())


def run_with_store(config: str | None, body: Callable[[PairingStore], Awaitable[T]]) -> T:
    """Open the database (migrating it), run ``body`` with the pairing store, close."""
    return with_engine(load(config), lambda engine: body(PairingStore(engine)))


def run_with_pairing(config: str | None, body: Callable[[PairingStore, AsyncEngine], Awaitable[T]]) -> T:
    """Like :func:`run_with_store`, with the engine too (to resolve id prefixes)."""
    return with_engine(load(config), lambda engine: body(PairingStore(engine), engine))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine, mapping database failures to one line."""
    try:
        return asyncio.run(coro)
    except DatabaseUnavailable as exc:
        raise fail(str(exc)) from None


def print_json(value: Any) -> None:
    """JSON to stdout, unstyled (for scripts)."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def guarded(fn: Callable[[], None], *errors: type[Exception]) -> None:
    """Run a command body now: our errors and ``errors`` become one line on stderr (exit 2), never a traceback."""

    def body() -> None:
        try:
            fn()
        except errors as exc:
            raise fail(str(exc)) from None

    cli_errors(body)()
