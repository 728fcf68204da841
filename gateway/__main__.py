"""``python -m gateway`` is the ``goclaw`` command (the console script calls :func:`main` here too)."""

from __future__ import annotations

import gc
import sys


def main() -> None:
    """Run the ``goclaw`` command, its modules imported with the cyclic garbage collector paused.

    Importing the gateway makes about 100,000 long-lived objects (SQLAlchemy,
    pydantic, aiohttp, the tables and config models) and almost no garbage, yet
    the collector would run some 250 times over them while they are made: about
    an eighth of the start-up. So it waits until the modules are in, then
    ``gc.freeze()`` moves what they made out of its way (later collections do not
    walk these objects again), and it runs as usual from then on, before any
    command does its work.
    """
    gc.disable()
    try:
        from gateway.cli import main as cli_main

        if sys.argv[1:2] == ["serve"]:
            import gateway.server  # noqa: F401  (what `serve` imports first thing, while the collector waits)
    finally:
        gc.freeze()
        gc.enable()
    cli_main()


if __name__ == "__main__":
    main()
