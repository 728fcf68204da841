"""What the ``goclaw`` command prints and how it fails, without Typer: consoles, one-line errors, the config.

A module of its own, outside the ``gateway.cli`` package, so that ``goclaw
serve`` (started by ``gateway/__main__.py`` without building the Typer CLI)
prints its errors and warnings exactly as every other command does;
``gateway.cli.common`` re-exports these for the command groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from gateway.config import Config, find_config_path, load_config
from gateway.errors import ConfigError, GoclawError
from pairing.store import PairingError

if TYPE_CHECKING:
    from rich.console import Console


class _Console:
    """A rich ``Console`` made at its first use: `goclaw serve` prints nothing with one, and need not import rich."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def _real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    # Dunder methods are looked up on the type, not through __getattr__ (rich's Live uses `with console:`).
    def __enter__(self) -> Console:
        return self._real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._real().__exit__(*exc)


out = cast("Console", _Console())
err = cast("Console", _Console(stderr=True, soft_wrap=True))

USER_ERRORS: tuple[type[Exception], ...] = (GoclawError, PairingError, ValueError)
"""The errors a command reports as one line (exit code 2), never as a traceback."""


def escape(text: str) -> str:
    """``text`` with rich's markup escaped."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def print_error(message: str) -> None:
    """One error line on stderr."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def report_error(exc: Exception) -> int:
    """Print one of :data:`USER_ERRORS` (a config error: one line per problem); the exit code (2)."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            where = f"{exc.path}: " if exc.path else ""
            err.print(f"[bold red]error:[/] {escape(where + problem)}", highlight=False)
    else:
        print_error(str(exc))
    return 2


def load(config: str | None) -> Config:
    """Load the config from the usual places, printing retired-setting warnings."""
    cfg = load_config(find_config_path(config))
    for warning in cfg.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    return cfg
