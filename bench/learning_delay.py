"""Learning delay: seconds from an admin's statement to the note being in the next prompt.

A real gateway (``goclaw serve`` as its own process, builtin model, idle
extraction on with a small ``session.idle_extract_seconds``) is taught over
POST /v1/chat: "from now on the daily report uses table bench_orders_<run>".
This process then watches the database (a read, so it does not disturb the
quiet the sweep waits for) until the note is live, and confirms with the next
turn in the same session that the reply uses it. Each run uses a fresh session.
Prints each run and the median; target: the idle delay plus under 2 s.

    .venv/bin/python bench/learning_delay.py [--idle 1] [--runs 7]
        [--url postgresql+asyncpg://postgres@127.0.0.1:5432/goclaw_bench]   # an EMPTY database
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.turn_overhead import free_port, wait_up

TOKEN = "bench-admin-token-0123456789abcdef"


async def seed_admin(db_url: str) -> str:
    """Migrate the database and pair the bench administrator."""
    from gateway.db import make_engine, upgrade
    from pairing import PairingStore

    engine = make_engine(db_url)
    try:
        await upgrade(engine)
        return (await PairingStore(engine).add_user("Bench Admin", "admin")).id
    finally:
        await engine.dispose()


async def one_run(
    http: aiohttp.ClientSession, url: str, store: object, run: int, timeout: float
) -> tuple[float, float]:
    """(seconds until the note is live, seconds until the next turn's reply used it)."""
    from memory.store import MemoryStore

    assert isinstance(store, MemoryStore)
    table = f"bench_orders_{run}_{os.getpid()}"
    session = f"learn-{run}-{os.getpid()}"
    started = time.perf_counter()
    teach = f"from now on the daily report uses table {table}"
    async with http.post(url, json={"session": session, "text": teach}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
    deadline = started + timeout
    while True:
        notes = await store.list_records(scope="agent_notes")
        if any(table in n.content for n in notes):
            break
        if time.perf_counter() > deadline:
            raise RuntimeError(f"run {run}: the note was not learned within {timeout} s")
        await asyncio.sleep(0.02)
    learned = time.perf_counter() - started
    async with http.post(url, json={"session": session, "text": "produce the daily report"}) as r:
        reply = (await r.json())["reply"]
    used = time.perf_counter() - started
    if table not in reply:
        raise RuntimeError(f"run {run}: the next reply did not use the note: {reply!r}")
    return learned, used


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=float, default=1.0, help="session.idle_extract_seconds")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--url", default=None, help="an empty database to use instead of a temporary SQLite file")
    args = ap.parse_args()

    from gateway.db import make_engine
    from memory.store import MemoryStore

    with tempfile.TemporaryDirectory() as tmp:
        db_url = args.url or f"sqlite+aiosqlite:///{tmp}/bench.db"
        admin = await seed_admin(db_url)
        port = free_port()
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "database": {"url": db_url},
                    "server": {"port": port, "api_users": [{"token": TOKEN, "user": admin}]},
                    "session": {"idle_extract_seconds": args.idle},
                    "logging": {"level": "WARNING"},
                }
            )
        )
        # This checkout's code in the gateway process too, whatever the venv has installed.
        env = {**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(ROOT)}
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(cfg)], cwd=tmp, env=env)
        engine = make_engine(db_url)
        learned: list[float] = []
        used: list[float] = []
        try:
            await wait_up(f"http://127.0.0.1:{port}/healthz")
            store = MemoryStore(engine)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as http:
                for run in range(args.runs):
                    a, b = await one_run(http, f"http://127.0.0.1:{port}/v1/chat", store, run, args.idle + 60)
                    learned.append(a)
                    used.append(b)
                    print(f"run {run + 1}: learned after {a:.2f} s; the next reply used it after {b:.2f} s")
        finally:
            await engine.dispose()
            gw.terminate()
            gw.wait(10)

    med_learned, med_used = statistics.median(learned), statistics.median(used)
    print(
        f"\nmedian of {args.runs} runs, {'PostgreSQL' if args.url else 'SQLite'}, "
        f"idle_extract_seconds={args.idle:g}:\n"
        f"  statement -> note live:          {med_learned:.2f} s (idle delay + {med_learned - args.idle:.2f} s)\n"
        f"  statement -> next reply uses it: {med_used:.2f} s (idle delay + {med_used - args.idle:.2f} s)\n"
        f"  target: idle delay + under 2 s -> {'met' if med_used - args.idle < 2 else 'NOT met'}"
    )


if __name__ == "__main__":
    asyncio.run(main())
