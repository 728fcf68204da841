"""One gateway process consolidating again and again on a shared database (run by test_processes.py).

On PostgreSQL the processes stand for several ``goclaw serve`` and ``goclaw worker``
processes; on SQLite for ``goclaw serve`` (``notes_distill``), its job process (the
nightly and automatic runs) and ``goclaw memory consolidate``.

Usage: python -m tests.gateway.consolidate_process URL READY_FILE GO_FILE RUNS

It starts a Gateway on URL (no background loops), signals READY_FILE, waits for
GO_FILE (so both processes start together), then asks the scheduler for RUNS
consolidations, one after another. Each run that got the lock is recorded with
its start and end (``time.time_ns()``, one clock for every process on the
machine; the run holds the lock a little longer than an empty one would, so the
two processes really contend). Prints the intervals and how many were skipped.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from gateway.app import Gateway
from gateway.config import Config
from pairing.principal import Principal


async def main(url: str, ready: Path, go: Path, runs: int) -> None:
    # On SQLite (one serve, its job process, the CLI), worker.mode separate is refused: inline, and no loops.
    mode = "separate" if url.startswith("postgresql") else "inline"
    gw = Gateway(Config.model_validate({"database": {"url": url}, "worker": {"mode": mode}}))
    await gw.start(channels=False, worker=False)
    consolidator = gw.memory.scheduler.consolidator
    real_run = consolidator.run
    intervals: list[tuple[int, int]] = []

    async def recorded(principal: Principal) -> Any:
        start = time.time_ns()
        await asyncio.sleep(0.02)
        try:
            return await real_run(principal)
        finally:
            intervals.append((start, time.time_ns()))

    consolidator.run = recorded  # type: ignore[method-assign]
    ready.touch()
    async with asyncio.timeout(120):
        while not go.exists():
            await asyncio.sleep(0.01)
    skipped = 0
    try:
        for _ in range(runs):
            if await gw.memory.scheduler.consolidate(Principal.system("cron-system"), trigger="test") is None:
                skipped += 1
            await asyncio.sleep(0.005)
    finally:
        await gw.stop()
    print(json.dumps({"intervals": intervals, "skipped": skipped}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
