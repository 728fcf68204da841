"""One gateway process stepping the SOP scheduler on a shared database (run by test_sop_processes.py).

Usage: python -m tests.gateway.sop_process URL READY_FILE GO_FILE STEPS

It starts a Gateway on URL with an injected clock, signals READY_FILE, waits
for GO_FILE (so both processes step at the same moment), then moves its clock
through STEPS due times of 15 minutes, stepping the scheduler at each, and
prints the ids of the runs it claimed and its model calls as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gateway.app import Gateway
from gateway.config import Config
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
SOPS = [{"name": f"sop-{i}", "instruction": f"Check queue {i}.", "trigger": {"every": "15m"}} for i in range(5)]


async def main(url: str, ready: Path, go: Path, steps: int) -> None:
    clock = Clock(START)
    provider = ScriptedProvider()
    cfg = Config.model_validate({"database": {"url": url}, "automation": {"sops": SOPS}})
    gw = Gateway(cfg, provider=provider, clock=clock)
    await gw.start(channels=False, worker=False)
    ready.touch()
    async with asyncio.timeout(60):
        while not go.exists():
            await asyncio.sleep(0.01)
    claimed: list[str] = []
    try:
        for i in range(1, steps + 1):
            clock.now = START + timedelta(minutes=15 * i)
            claimed += [r.id for r in await gw.automation.scheduler.step()]
        await gw.automation.runner.drain()
    finally:
        await gw.stop()
    print(json.dumps({"claimed": claimed, "model_calls": len(provider.calls)}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
