"""``python -m gateway`` is the ``goclaw`` command (the console script calls :func:`main` here too)."""

from __future__ import annotations

import errno
import gc
import os
import sys
from typing import Any, TextIO, cast

_SERVE_OPTIONS = {"--config": "config", "-c": "config", "--workers": "workers", "--child": "child"}


def main() -> None:
    """Run the ``goclaw`` command, its modules imported with the cyclic garbage collector paused.

    Importing the gateway makes about 100,000 long-lived objects (SQLAlchemy,
    pydantic, aiohttp, the tables and config models) and almost no garbage, yet
    the collector would run some 250 times over them while they are made: about
    an eighth of the start-up. So it waits until the modules are in, then
    ``gc.freeze()`` moves what they made out of its way (later collections do not
    walk these objects again), and it runs as usual from then on, before any
    command does its work.

    For ``serve``, aiohttp's CA bundle is read on a thread while the rest
    imports (``gateway/tls_trust.py``); ``serve_command`` waits for it.

    A plain ``goclaw serve`` line (see :func:`serve_options`) runs the command
    without the Typer CLI: importing Typer and every command group, and building
    the Click commands, is about 4% of a restart. Anything else, ``--help``
    and every error in the arguments among it, goes through the CLI.
    """
    gc.disable()
    try:
        serve = serve_options(sys.argv[1:])
        if serve is None:
            from gateway.cli import main as cli_main
        if sys.argv[1:2] == ["serve"]:
            from gateway import tls_trust

            with tls_trust.loaded_aside():  # its CA bundle read on the other core (gateway/tls_trust.py)
                import aiohttp  # noqa: F401
            import gateway.server  # noqa: F401  (what `serve` imports first thing, while the collector waits)
    finally:
        gc.freeze()
        gc.enable()
    if serve is None:
        cli_main()
    else:
        _serve(serve)


def serve_options(args: list[str]) -> dict[str, Any] | None:
    """The options of ``args`` if it is a ``serve`` line the Typer CLI would read the same way, else None.

    Only each of ``--config``/``-c``, ``--workers`` and ``--child`` at most once,
    as ``--name VALUE`` (``-c VALUE``) or ``--name=VALUE``, with a value that
    does not start with ``-``, and whole numbers written plainly. For anything
    else (``--help``, an unknown option, a value the CLI would refuse or read
    differently, shell completion) the CLI runs, with its own messages.
    """
    if args[:1] != ["serve"] or "_GOCLAW_COMPLETE" in os.environ:
        return None
    found: dict[str, Any] = {}
    rest = args[1:]
    while rest:
        flag, eq, value = rest[0].partition("=")
        if not (eq and flag.startswith("--")):
            if len(rest) < 2:
                return None
            flag, value = rest[0], rest[1]
            rest = rest[2:]
        else:
            rest = rest[1:]
        name = _SERVE_OPTIONS.get(flag)
        if name is None or name in found or not value or value.startswith("-"):
            return None
        if name != "config":
            if not (value.isascii() and value.isdigit()) or (value != "0" and value.startswith("0")):
                return None
            found[name] = int(value)
        else:
            found[name] = value
    return {"config": found.get("config"), "workers": found.get("workers", 1), "child": found.get("child")}


def _serve(options: dict[str, Any]) -> None:
    """Run ``goclaw serve`` as the CLI would: the same messages and exit codes (``gateway.cli.main``)."""
    from gateway.cli_base import USER_ERRORS, err, report_error
    from gateway.server import serve_command

    try:
        serve_command(**options)
    except USER_ERRORS as exc:  # as gateway.cli.common.cli_errors
        sys.exit(report_error(exc))
    except KeyboardInterrupt:  # Typer's exit status for Ctrl-C outside the serve loop
        sys.exit(130)
    except EOFError:  # Click's Abort
        sys.stderr.write("\n")
        err.print("aborted", highlight=False)
        sys.exit(1)
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            _typer_traceback(exc)
            raise
        from typer._click.utils import PacifyFlushWrapper  # as Click, on a closed pipe: quiet, status 1

        sys.stdout = cast("TextIO", PacifyFlushWrapper(sys.stdout))
        sys.stderr = cast("TextIO", PacifyFlushWrapper(sys.stderr))
        sys.exit(1)
    except Exception as exc:
        _typer_traceback(exc)
        raise
    sys.exit(0)


def _typer_traceback(exc: Exception) -> None:
    """Have ``exc`` shown as the Typer CLI shows an unexpected error (its traceback hook and settings)."""
    from typer import main as typer_main
    from typer.models import DeveloperExceptionConfig

    from gateway.cli import app

    sys.excepthook = typer_main.except_hook
    setattr(
        exc,
        typer_main._typer_developer_exception_attr_name,
        DeveloperExceptionConfig(
            pretty_exceptions_enable=app.pretty_exceptions_enable,
            pretty_exceptions_show_locals=app.pretty_exceptions_show_locals,
            pretty_exceptions_short=app.pretty_exceptions_short,
        ),
    )


if __name__ == "__main__":
    main()
