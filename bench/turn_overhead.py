"""Turn overhead: POST /v1/chat on the builtin model vs a bare aiohttp echo, same machine, same run.

Both servers run as their own processes; this process is the client. The
gateway's database is seeded with 10,000 stored messages first. Prints turns/s
and p50/p99 latency for each, and the throughput ratio (median of --runs).

    .venv/bin/python bench/turn_overhead.py [--requests 1500] [--concurrency 8] [--runs 3]
        [--url postgresql+asyncpg://postgres@127.0.0.1:5432/goclaw_bench]   # an EMPTY database
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token-0123456789abcdef"

ECHO_SERVER = textwrap.dedent(
    """
    import sys
    from aiohttp import web
    async def echo(request):
        body = await request.json()
        return web.json_response({"session": body["session"], "reply": body["text"]})
    app = web.Application()
    app.router.add_post("/v1/chat", echo)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def seed(db_url: str, n_messages: int) -> str:
    """Create the bench user and ``n_messages`` stored messages over 200 sessions."""
    from sqlalchemy import insert

    from gateway.db import make_engine, upgrade
    from gateway.models import Message, Session
    from pairing import PairingStore

    engine = make_engine(db_url)
    await upgrade(engine)
    user = await PairingStore(engine).add_user("Bench", "user")
    now = datetime.now(UTC)
    sessions = [
        {
            "id": f"s_seed{i:04d}",
            "channel": "api",
            "conversation_id": f"{user.id}/seed-{i}",
            "thread_id": "",
            "parent_conversation_id": None,
            "previous_context": "",
            "created_at": now,
            "updated_at": now,
        }
        for i in range(200)
    ]
    rows = [
        {
            "session_id": f"s_seed{i % 200:04d}",
            "platform_message_id": f"seed-{i}",
            "speaker_user_id": user.id,
            "stored_role": "user",
            "display_name": "Bench",
            "text": f"seeded message {i} about the daily report",
            "said_at": now - timedelta(seconds=n_messages - i),
            "is_agent": False,
            "created_at": now,
            "archive_id": f"a_seed{i % 200:04d}" if i < n_messages - 2000 else None,
        }
        for i in range(n_messages)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(Session), sessions)
        await conn.execute(insert(Message), rows)
    await engine.dispose()
    return user.id


async def wait_up(url: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def load(url: str, requests: int, concurrency: int, headers: dict[str, str]) -> tuple[float, list[float]]:
    """Send ``requests`` POSTs with ``concurrency`` in flight; return (turns/s, latencies ms)."""
    latencies: list[float] = []
    counter = iter(range(requests))
    async with aiohttp.ClientSession(headers=headers) as http:

        async def worker(w: int) -> None:
            for i in counter:
                body = {"session": f"bench-{(w * 7 + i) % 50}", "text": f"produce the daily report number {i}"}
                t0 = time.perf_counter()
                async with http.post(url, json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}")
                latencies.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - started
    return requests / elapsed, latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed-messages", type=int, default=10_000)
    ap.add_argument("--url", default=None, help="an empty database to use instead of a temporary SQLite file")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db_url = args.url or f"sqlite+aiosqlite:///{tmp}/bench.db"
        user_id = await seed(db_url, args.seed_messages)
        gw_port, echo_port = free_port(), free_port()
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "database": {"url": db_url},
                    "server": {"port": gw_port, "api_users": [{"token": TOKEN, "user": user_id}]},
                    "logging": {"level": "WARNING"},
                }
            )
        )
        env = {**os.environ, "NO_PROXY": "127.0.0.1"}
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(cfg)], cwd=tmp, env=env)
        echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(echo_port)], env=env)
        try:
            await wait_up(f"http://127.0.0.1:{gw_port}/healthz")
            await wait_up(f"http://127.0.0.1:{echo_port}/v1/chat")
            headers = {"Authorization": f"Bearer {TOKEN}"}
            gw_url, echo_url = f"http://127.0.0.1:{gw_port}/v1/chat", f"http://127.0.0.1:{echo_port}/v1/chat"
            await load(gw_url, 100, args.concurrency, headers)  # warm-up
            await load(echo_url, 100, args.concurrency, headers)
            results: dict[str, list[tuple[float, float, float]]] = {"gateway": [], "echo": []}
            ratios = []
            for run in range(args.runs):
                e_tps, e_lat = await load(echo_url, args.requests, args.concurrency, headers)
                g_tps, g_lat = await load(gw_url, args.requests, args.concurrency, headers)
                results["echo"].append((e_tps, pct(e_lat, 0.5), pct(e_lat, 0.99)))
                results["gateway"].append((g_tps, pct(g_lat, 0.5), pct(g_lat, 0.99)))
                ratios.append(g_tps / e_tps)
                print(
                    f"run {run + 1}: gateway {g_tps:7.1f} turns/s p50 {pct(g_lat, 0.5):6.2f} ms "
                    f"p99 {pct(g_lat, 0.99):6.2f} ms | echo {e_tps:7.1f} req/s p50 {pct(e_lat, 0.5):6.2f} ms "
                    f"p99 {pct(e_lat, 0.99):6.2f} ms | ratio {g_tps / e_tps:.2f}"
                )
        finally:
            gw.terminate()
            echo.terminate()
            gw.wait(10)
            echo.wait(10)

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in results[name])

    print(
        f"\nmedian of {args.runs} runs, {args.requests} requests each, concurrency {args.concurrency}, "
        f"{'PostgreSQL' if args.url else 'SQLite'}, "
        f"{args.seed_messages} seeded messages:\n"
        f"  gateway: {med('gateway', 0):.1f} turns/s, p50 {med('gateway', 1):.2f} ms, p99 {med('gateway', 2):.2f} ms\n"
        f"  echo:    {med('echo', 0):.1f} req/s,   p50 {med('echo', 1):.2f} ms, p99 {med('echo', 2):.2f} ms\n"
        f"  throughput ratio gateway/echo: {statistics.median(ratios):.2f} (target >= 0.40); "
        f"gateway p99 target < 25 ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
