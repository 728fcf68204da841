"""Several processes: turns/s through one ``goclaw serve`` against ``goclaw serve --workers 2``, on PostgreSQL.

Both gateways are real processes on a fresh PostgreSQL database each, with
``worker.mode: separate`` and no worker (no background work: the measurement is
serving turns) and no trims (``session.max_messages`` high). The model is the
builtin one by default (the gateway's own CPU is then the limit, which is what
more processes can spread over more cores) or, with ``--model-ms``, a local
OpenAI-compatible peer in its own process that answers after that delay. The
client is this process: ``--sessions`` concurrent sessions post /v1/chat for
``--seconds``. The two configurations alternate for ``--runs`` rounds and the
medians are compared (ratio = --workers 2 / one process, in the same run).

Note the machine: with 2 cores, the client, PostgreSQL and the gateway
processes all share them; the ratio says how much a second process gets out of
what is left.

    .venv/bin/python bench/multi_process.py [--sessions 16] [--seconds 10] [--runs 3]
        [--model-ms 0] [--postgres URL]
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
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.model_load import PEER, drop_pg_database, fresh_pg_database, seed_users
from bench.turn_overhead import MachineShare, free_port, pct, share_text, wait_up

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def safe_pct(values: list[float], q: float) -> float:
    return pct(values, q) if values else float("nan")


async def drive(base: str, tokens: list[str], sessions: int, seconds: float) -> dict[str, Any]:
    """``sessions`` concurrent sessions posting /v1/chat for ``seconds``: turns/s, p50/p99, errors."""
    latencies: list[float] = []
    errors = 0
    stop = asyncio.Event()
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    ) as http:

        async def session(s: int) -> None:
            nonlocal errors
            headers = {"Authorization": f"Bearer {tokens[s % len(tokens)]}"}
            i = 0
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    body = {"session": f"mp-{s}", "text": f"where does the daily report come from? ({i})"}
                    async with http.post(f"{base}/v1/chat", json=body, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if not ok:
                    errors += 1
                elif not stop.is_set():
                    latencies.append((time.perf_counter() - t0) * 1000)
                i += 1

        started = time.perf_counter()
        clients = [asyncio.create_task(session(s)) for s in range(sessions)]
        await asyncio.sleep(seconds)
        stop.set()
        elapsed = time.perf_counter() - started
        await asyncio.gather(*clients)
    return {
        "turns": len(latencies),
        "turns_s": len(latencies) / elapsed,
        "p50": safe_pct(latencies, 0.5),
        "p99": safe_pct(latencies, 0.99),
        "errors": errors,
    }


async def run_one(tmp: Path, workers: int, args: argparse.Namespace, peer_port: int | None) -> dict[str, Any]:
    """A fresh database, ``goclaw serve [--workers N]`` on it, loaded for ``--seconds``."""
    db_url, pg_name = await fresh_pg_database(args.postgres)
    try:
        users = await seed_users(db_url, args.sessions)
        tokens = [f"bench-mp-token-{i:04d}-0123456789" for i in range(len(users))]
        port = free_port()
        llm: dict[str, Any] = {"provider": "builtin"}
        if peer_port is not None:
            llm = {
                "provider": "openai",
                "model": "bench",
                "base_url": f"http://127.0.0.1:{peer_port}/v1",
                "api_key": "k",
            }
        cfg = tmp / f"w{workers}.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "database": {"url": db_url},
                    "llm": llm,
                    "server": {
                        "port": port,
                        "api_users": [{"token": t, "user": u} for t, u in zip(tokens, users, strict=True)],
                    },
                    "session": {"max_messages": 100000, "keep_messages": 10, "idle_extract_seconds": 0},
                    "worker": {"mode": "separate"},
                    "logging": {"level": "WARNING"},
                }
            )
        )
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--workers", str(workers)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1"}
        gw = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            await wait_up(f"{base}/healthz", timeout=120)
            if workers > 1:
                await asyncio.sleep(3)  # the other process(es) come up too (SO_REUSEPORT spreads only to listeners)
            await drive(base, tokens, args.sessions, 2)  # warm-up
            share = MachineShare({"gateway": gw.pid}, postgres=True)
            got = await drive(base, tokens, args.sessions, args.seconds)
            # The gateway's own CPU per turn: what more processes spread over more cores, whatever the load;
            # PostgreSQL's and this client's: what the same cores also run for every turn.
            got["share"] = share.per_turn(got["turns"])
            got["cpu_ms"] = got["share"]["gateway"]
            return got
        finally:
            gw.terminate()
            gw.wait(60)
    finally:
        await drop_pg_database(args.postgres, pg_name)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model-ms", type=float, default=0, help="0: the builtin model; else a peer answering after this")
    ap.add_argument("--postgres", default=DEFAULT_PG, help="the PostgreSQL server (a fresh database per run)")
    args = ap.parse_args()
    peer = None
    peer_port = None
    if args.model_ms > 0:
        peer_port = free_port()
        peer = subprocess.Popen([sys.executable, "-c", PEER, str(peer_port), str(args.model_ms)])
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.runs):
                for workers in (1, 2):
                    got = await run_one(Path(tmp), workers, args, peer_port)
                    results[workers].append(got)
                    print(
                        f"run {r + 1} --workers {workers}: {got['turns_s']:7.1f} turns/s  "
                        f"p50 {got['p50']:6.1f} ms  p99 {got['p99']:6.1f} ms  "
                        f"gateway CPU {got['cpu_ms']:5.1f} ms/turn  errors {got['errors']}  "
                        f"(load {os.getloadavg()[0]:.1f})\n    {share_text(got['share'])}",
                        flush=True,
                    )
    finally:
        if peer is not None:
            peer.terminate()
            peer.wait(15)
    med = {w: statistics.median(x["turns_s"] for x in rs) for w, rs in results.items()}
    cpu = {w: statistics.median(x["cpu_ms"] for x in rs) for w, rs in results.items()}
    parts = {k: statistics.median(x["share"][k] for x in results[2]) for k in results[2][0]["share"]}
    model = f"peer {args.model_ms:.0f} ms" if args.model_ms else "builtin model"
    print(f"\nPostgreSQL, {model}, {args.sessions} sessions, {args.seconds:.0f} s x {args.runs} runs (medians):")
    print(f"1 process    {med[1]:7.1f} turns/s  gateway CPU {cpu[1]:5.1f} ms/turn")
    print(
        f"--workers 2  {med[2]:7.1f} turns/s  gateway CPU {cpu[2]:5.1f} ms/turn  "
        f"ratio {med[2] / med[1]:.2f} (target >= 1.6; {os.cpu_count()} cores shared with the client and PostgreSQL)"
    )
    # What the machine allows: every turn costs the gateway, PostgreSQL and this client their CPU, all on
    # these cores; two processes can serve at most cores / (the sum a turn) turns/s, whatever the gateway does.
    per_turn = parts["gateway"] + parts["postgres"] + parts["client"]
    ceiling = (os.cpu_count() or 1) * 1000 / per_turn
    print(
        f"--workers 2: {share_text(parts)}\n"
        f"this machine's ceiling: {os.cpu_count()} cores / {per_turn:.2f} ms a turn (gateway + PostgreSQL + client) "
        f"= {ceiling:.0f} turns/s, ratio {ceiling / med[1]:.2f} of one process; measured {med[2] / med[1]:.2f}, "
        f"{med[2] / ceiling:.0%} of the ceiling"
    )


if __name__ == "__main__":
    asyncio.run(main())
