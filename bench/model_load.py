"""A real model's load: 200 sessions on a 500 ms OpenAI-compatible model through a real ``goclaw serve``.

The model is a local OpenAI-compatible peer in its own process that answers
every chat.completions request after ``--model-ms`` (structured requests, the
extractor's and the judge's, get an empty valid answer). The gateway runs as its
own ``goclaw serve`` process with ``llm.provider: openai`` pointed at the peer
and ``--users`` API users; this process is the client: ``--sessions`` concurrent
sessions post /v1/chat for ``--seconds``, while another process samples /healthz
every 50 ms (on this process's loop it would wait behind the sessions' own
responses). The sessions' first messages are spread evenly over one model time,
as independent people's are; ``--burst`` starts them all in the same instant
instead, so that they stay in step: every answer arrives in one wave.

Reported for each gateway: turns/s, p50/p99 latency above the model's time,
errors, /healthz p50/p99, the gateway's cyclic garbage collections while counted
(how many, their time in all, how many stopped its loop over 20 ms: from its
``/metrics``) and the largest count its young generation reached (its ``/metrics``
read once a second: how near the next collection came), and on SQLite the write-ahead log file's largest size
during the load and its size at the end (sampled every 100 ms). The baseline in the same run is main's ceiling: the
same gateway with 32 model calls in flight (main held a 32-slot semaphore across
the whole turn, ``session.max_concurrent_sessions``, which caps the same way).

    .venv/bin/python bench/model_load.py [--sessions 200] [--seconds 20] [--model-ms 500] [--runs 3]
        [--users 20] [--baseline-limit 32] [--limit 256] [--no-baseline] [--burst] [--postgres [URL]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
# As in bench/turn_overhead.py: another tree's database is migrated and seeded by that tree's code.
sys.path.insert(0, os.environ.get("GOCLAW_BENCH_SOURCE") or str(ROOT))

from bench.turn_overhead import free_port, pct, wait_up

NAN = float("nan")

PEER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from aiohttp import web
    DELAY = float(sys.argv[2]) / 1000
    STRUCTURED = {"extraction_result": {"items": []}, "revision_judgement": {"decisions": []}}
    async def chat(request):
        body = await request.json()
        await asyncio.sleep(DELAY)
        fmt = (body.get("response_format") or {}).get("json_schema", {}).get("name")
        text = json.dumps(STRUCTURED.get(fmt, {})) if fmt else "The daily report comes from example_orders."
        return web.json_response({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "bench"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        })
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None, backlog=4096)
    """
)


async def fresh_pg_database(server: str) -> tuple[str, str]:
    """A new empty database on the PostgreSQL at ``server`` (postgresql+asyncpg://user@host:port/db)."""
    import asyncpg

    name = "goclaw_bench_" + secrets.token_hex(5)
    conn = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{server.rpartition('/')[0]}/{name}", name


async def drop_pg_database(server: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(server.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def seed_users(db_url: str, n: int) -> list[str]:
    """Migrate the database and pair ``n`` API users."""
    from gateway.db import make_engine, upgrade
    from pairing import PairingStore

    engine = make_engine(db_url)
    await upgrade(engine)
    store = PairingStore(engine)
    ids = [(await store.add_user(f"Bench {i}", "user")).id for i in range(n)]
    await engine.dispose()
    return ids


# /healthz sampled from a process of its own: a sampler on this process's loop would wait behind the
# 200 sessions' own responses, and its figure would be the client's queue, not the gateway's.
HEALTH_SAMPLER = textwrap.dedent(
    """
    import http.client, json, sys, time
    host, port, seconds, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    out, conn, end = [], None, time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            conn = conn or http.client.HTTPConnection(host, port, timeout=10)
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            conn, ok = None, False
        out.append((time.perf_counter() - t0) * 1000 if ok else 10_000.0)  # a failure counts as 10 s
        time.sleep(every)
    print(json.dumps(out))
    """
)


async def loop_stalls(http: aiohttp.ClientSession, base: str) -> tuple[float, float, float, float]:
    """The gateway's cyclic-collector pauses so far: (collections, seconds in all, collections over 20 ms),
    and the turns' pieces that waited at its turnstile for a later pass of the loop.

    From ``/metrics`` (``goclaw_gc_pause_seconds``, trees since the twenty-sixth session;
    ``goclaw_turnstile_waits_total`` since the thirty-eighth); NaN for a tree without it.
    """
    count = total = within = 0.0
    waits = NAN
    seen = False
    for name, value in (await metric_values(http, base)).items():
        if name == "goclaw_turnstile_waits_total":
            waits = value
        elif name.startswith("goclaw_gc_pause_seconds_count{"):
            count, seen = count + value, True
        elif name.startswith("goclaw_gc_pause_seconds_sum{"):
            total += value
        elif name.startswith("goclaw_gc_pause_seconds_bucket{") and name.endswith(',le="0.02"}'):
            within += value
    return ((count, total, count - within) if seen else (NAN, NAN, NAN)) + (waits,)


async def metric_values(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The gateway's ``/metrics`` now: each sample's name with its labels, and its value."""
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for metric_line in text.splitlines():
        if metric_line and not metric_line.startswith("#"):
            name, _, value = metric_line.rpartition(" ")  # a label's value may hold a space; the sample's may not
            out[name] = float(value)
    return out


async def young_count(http: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    """The gateway's young-generation count and threshold now (``goclaw_gc_pending``, ``goclaw_gc_threshold``).

    The count is the objects its collector counts, made and not freed, since the last young collection; one
    runs when it passes the threshold (``gateway/heap.py``). NaN for a tree without them (before 2026-12-07).
    """
    values = await metric_values(http, base)
    return values.get('goclaw_gc_pending{generation="0"}', NAN), values.get('goclaw_gc_threshold{generation="0"}', NAN)


async def healthz_sampler(base: str, seconds: float, every: float = 0.05) -> list[float]:
    """GET /healthz every ``every`` s for ``seconds`` from another process; latencies in ms."""
    host, port = base.removeprefix("http://").split(":")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HEALTH_SAMPLER, host, port, str(seconds), str(every), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return [float(v) for v in json.loads(out)]


async def drive(
    base: str,
    tokens: list[str],
    sessions: int,
    seconds: float,
    *,
    spread_s: float = 0.0,
    pid: int | None = None,
    peer_pid: int | None = None,
    postgres: bool = False,
    wal: Path | None = None,
) -> dict[str, Any]:
    """``sessions`` concurrent sessions posting /v1/chat for ``seconds``; the figures.

    With ``spread_s`` the sessions' first messages are spread evenly over that time (people do not all
    press enter in the same millisecond); with 0 they all start at once and stay in step. With ``wal``
    (a SQLite database's ``-wal`` file) also its largest size while counted and its size at the end, in MB.
    """
    # Here, not at the top: a --baseline-source tree's seeding child imports the bench from that tree.
    from bench.turn_overhead import MachineShare

    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def session(s: int) -> None:
            headers = {"Authorization": f"Bearer {tokens[s % len(tokens)]}"}
            await asyncio.sleep(spread_s * s / sessions)
            i = 0
            while not stop.is_set():
                body = {"session": f"load-{s}", "text": f"where does the daily report come from? ({i})"}
                t0 = time.perf_counter()
                try:
                    async with http.post(f"{base}/v1/chat", json=body, headers=headers) as r:
                        await r.read()
                        if r.status != 200:
                            errors[f"HTTP {r.status}"] = errors.get(f"HTTP {r.status}", 0) + 1
                            continue
                except (aiohttp.ClientError, TimeoutError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                if not stop.is_set():
                    latencies.append((time.perf_counter() - t0) * 1000)
                i += 1

        clients = [asyncio.create_task(session(s)) for s in range(sessions)]
        await asyncio.sleep(spread_s)  # every session under way before anything is counted
        latencies.clear()
        counted = time.perf_counter()
        pids = {"gateway": pid} if pid else {}
        if peer_pid:
            pids["peer"] = peer_pid
        share = MachineShare(pids, postgres=postgres)
        stalls_before = await loop_stalls(http, base)
        sampler = asyncio.create_task(healthz_sampler(base, seconds))
        wal_sizes: list[int] = []

        async def sample_wal() -> None:
            while wal is not None and not stop.is_set():
                with contextlib.suppress(OSError):
                    wal_sizes.append(wal.stat().st_size)
                await asyncio.sleep(0.1)

        wal_sampler = asyncio.create_task(sample_wal())
        young: list[tuple[float, float]] = []

        async def sample_young() -> None:  # once a second: how near the gateway's next young collection is
            while not stop.is_set():
                young.append(await young_count(http, base))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

        young_sampler = asyncio.create_task(sample_young())
        await asyncio.sleep(seconds)
        stop.set()
        stalls_after = await loop_stalls(http, base)
        young.append(await young_count(http, base))  # the turns still waiting on the model: the count at its top
        await wal_sampler
        await young_sampler
        elapsed = time.perf_counter() - counted
        turns = len(latencies)
        parts = share.per_turn(turns)
        health = await sampler
        await asyncio.gather(*clients)
    return {
        "turns_s": turns / elapsed,
        "cpu_ms": parts.get("gateway", float("nan")),
        "share": parts,
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
        "errors": float(sum(errors.values())),
        "health_p50": pct(health, 0.5),
        "health_p99": pct(health, 0.99),
        "error_kinds": errors,
        "gc_pauses": stalls_after[0] - stalls_before[0],
        "gc_ms": (stalls_after[1] - stalls_before[1]) * 1000,
        "gc_over_20ms": stalls_after[2] - stalls_before[2],
        "young_peak": max((c for c, _ in young), default=NAN),
        "young_threshold": young[-1][1] if young else NAN,
        "turnstile_waits": (stalls_after[3] - stalls_before[3]) / turns if turns else NAN,
        **({"wal_peak_mb": max(wal_sizes) / 2**20, "wal_end_mb": wal_sizes[-1] / 2**20} if wal_sizes else {}),
    }


async def run_gateway(
    tmp: Path, name: str, source: Path, limit: int | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Start a peer and ``source``'s ``goclaw serve`` with ``limit`` model calls in flight, load it, stop both.

    ``limit`` None runs a tree that predates ``llm.max_concurrent_calls`` on its own defaults.
    """
    pg_name = None
    if args.postgres:
        db_url, pg_name = await fresh_pg_database(args.postgres)
    else:
        db_url = f"sqlite+aiosqlite:///{tmp}/{name}.db"
    seeded = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, __file__, "--seed-users-into", db_url, "--users", str(args.users)],
        env={**os.environ, "GOCLAW_BENCH_SOURCE": str(source)},
        capture_output=True,
        text=True,
        check=True,
    )
    users = json.loads(seeded.stdout.strip().splitlines()[-1])
    tokens = [f"bench-token-{name}-{i:04d}-0123456789" for i in range(len(users))]
    peer_port, gw_port = free_port(), free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        json.dumps(
            {
                "database": {"url": db_url},
                "llm": {
                    "provider": "openai",
                    "model": "bench-model",
                    "base_url": f"http://127.0.0.1:{peer_port}/v1",
                    "api_key": "sk-bench",
                    **({"max_concurrent_calls": limit} if limit is not None else {}),
                },
                "server": {
                    "port": gw_port,
                    "api_users": [{"token": t, "user": u} for t, u in zip(tokens, users, strict=True)],
                },
                "logging": {"level": "WARNING"},
            }
        )
    )
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(source)}
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(peer_port), str(args.model_ms)], env=env)
    profile = ["-m", "cProfile", "-o", str(args.profile)] if args.profile and name == "gateway" else []
    gw = subprocess.Popen([sys.executable, *profile, "-m", "gateway", "serve", "--config", str(cfg)], cwd=tmp, env=env)
    try:
        await wait_up(f"http://127.0.0.1:{gw_port}/healthz", timeout=90)
        base = f"http://127.0.0.1:{gw_port}"
        await drive(base, tokens, min(args.sessions, 20), 2)  # warm-up
        from bench.turn_overhead import settle

        await settle(gw.pid)  # the job process started, the warm-up's jobs done: none of it is counted
        spread = 0.0 if args.burst else args.model_ms / 1000
        return await drive(
            base,
            tokens,
            args.sessions,
            args.seconds,
            spread_s=spread,
            pid=gw.pid,
            peer_pid=peer.pid,
            postgres=bool(args.postgres),
            wal=None if args.postgres else tmp / f"{name}.db-wal",
        )
    finally:
        for p in (gw, peer):
            p.terminate()
        for p in (gw, peer):
            p.wait(15)
        if pg_name:
            await drop_pg_database(args.postgres, pg_name)


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over ``runs`` (errors summed, their kinds merged)."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("errors", "error_kinds", "share")
    }
    out["share"] = {k: statistics.median(r["share"][k] for r in runs) for k in runs[0]["share"]}
    out["errors"] = float(sum(r["errors"] for r in runs))
    kinds: dict[str, int] = {}
    for r in runs:
        for kind, n in r["error_kinds"].items():
            kinds[kind] = kinds.get(kind, 0) + n
    out["error_kinds"] = kinds
    return out


def line(name: str, r: dict[str, Any], model_ms: float) -> str:
    from bench.turn_overhead import share_text  # here, as in drive: a baseline tree's child has an older bench

    return (
        f"{name:<22} {r['turns_s']:7.1f} turns/s  p50 +{r['p50'] - model_ms:7.1f} ms  "
        f"p99 +{r['p99'] - model_ms:7.1f} ms  errors {int(r['errors'])} {r['error_kinds'] or ''}  "
        f"/healthz p50 {r['health_p50']:6.1f} ms p99 {r['health_p99']:6.1f} ms  CPU {r['cpu_ms']:.2f} ms/turn\n"
        f"{'':<22} {share_text(r['share'])}"
        + (
            f"\n{'':<22} its cyclic garbage collections: {r['gc_pauses']:.0f}, {r['gc_ms']:.1f} ms in all, "
            f"{r['gc_over_20ms']:.0f} over 20 ms"
            if r.get("gc_pauses") == r.get("gc_pauses")  # NaN: a tree without goclaw_gc_pause_seconds
            else ""
        )
        + (
            f"\n{'':<22} its young generation's count at most {r['young_peak']:,.0f} of the {r['young_threshold']:,.0f}"
            " that start a collection (sampled each second)"
            if r.get("young_peak") == r.get("young_peak")  # NaN: a tree without goclaw_gc_pending
            else ""
        )
        + (
            f"\n{'':<22} pieces of turns that waited at its turnstile: {r['turnstile_waits']:.2f} a turn"
            if r.get("turnstile_waits") == r.get("turnstile_waits")  # NaN: a tree without it
            else ""
        )
        + (
            f"\n{'':<22} SQLite WAL file: largest {r['wal_peak_mb']:.1f} MB, at the end {r['wal_end_mb']:.1f} MB"
            if "wal_peak_mb" in r
            else ""
        )
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--model-ms", type=float, default=500)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--limit", type=int, default=256, help="llm.max_concurrent_calls of the measured gateway")
    ap.add_argument("--baseline-limit", type=int, default=32, help="main's ceiling (its 32-slot turn semaphore)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="pairs of runs, in alternating order; medians are printed")
    ap.add_argument(
        "--burst",
        action="store_true",
        help="start every session at the same instant (default: first messages spread over one model time)",
    )
    ap.add_argument("--seed-users-into", default=None, help=argparse.SUPPRESS)  # the child that seeds one database
    ap.add_argument(
        "--postgres",
        nargs="?",
        const="postgresql+asyncpg://postgres@127.0.0.1:5432/test",
        default=None,
        help="run on PostgreSQL (a fresh database on this server for each gateway) instead of SQLite",
    )
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the measured gateway here")
    ap.add_argument(
        "--baseline-source",
        type=Path,
        default=None,
        help="run the baseline from this source tree (e.g. an export of main) on its own defaults",
    )
    args = ap.parse_args()
    if args.seed_users_into:
        print(json.dumps(await seed_users(args.seed_users_into, args.users)))
        return
    trees: list[tuple[str, str, Path, int | None]] = []  # (label, database name, source, limit)
    if not args.no_baseline:
        if args.baseline_source:
            trees.append((f"baseline ({args.baseline_source.name})", "baseline", args.baseline_source, None))
        else:
            trees.append((f"baseline (limit {args.baseline_limit})", "baseline", ROOT, args.baseline_limit))
    trees.append((f"gateway (limit {args.limit})", "gateway", ROOT, args.limit))
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            # The order alternates: the machine's speed drifts within minutes, and the second of a
            # pair measured slower whichever tree it was (healthz p99 96 vs 187 ms, then 73 vs 98).
            for label, name, source, limit in trees if run % 2 == 0 else trees[::-1]:
                r = await run_gateway(Path(tmp), f"{name}{run}", source, limit, args)
                results[label].append(r)
                if args.runs > 1:
                    print(f"run {run + 1}: {line(label, r, args.model_ms)}", flush=True)
    backend = "PostgreSQL" if args.postgres else "SQLite"
    start = "all started at once" if args.burst else f"first messages spread over {args.model_ms:.0f} ms"
    each = f"{args.seconds:.0f} s each"
    if args.runs > 1:
        each += f", medians of {args.runs} runs in alternating order"
    print(f"\n{args.sessions} sessions ({start}), model {args.model_ms:.0f} ms, {each}, {backend}:")
    for label, runs in results.items():
        print(line(label, median_result(runs), args.model_ms))
    print(
        "targets: >= 300 turns/s, p99 < +500 ms, no errors, /healthz p99 < 20 ms "
        "(max possible: sessions / model time = "
        f"{args.sessions / (args.model_ms / 1000):.0f} turns/s)"
    )


if __name__ == "__main__":
    asyncio.run(main())
