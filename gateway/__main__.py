"""``python -m gateway`` is the ``goclaw`` command."""

from gateway.cli import main

main()
