"""Instructions per turn: one steady-state turn through a real ``goclaw serve``, counted by callgrind.

A count of executed instructions does not move with the machine's load, so it
compares two trees on a shared VM where CPU seconds moved 30% from one minute
to the next (``turn_overhead.py`` measured the same code at 2.0 and 3.2 ms of
CPU a turn within the hour). It is not time: a cache miss or a system call
costs more than its count says, and what the kernel does (the socket, the
disk) is not counted at all. Use it to see whether a change made the gateway
do less, and ``turn_overhead.py`` for what that is worth in seconds.

Each tree's ``goclaw serve`` runs under ``valgrind --tool=callgrind`` on its
own database, seeded as ``turn_overhead.py`` seeds it (10,000 messages); a few
sessions are warmed past their first trim (``--sessions`` x 25 turns), then
callgrind counts ``--turns`` more turns, trims included, in the serving
process only (the job process runs outside valgrind), or with ``--with-jobs``
the job process too, every job of the counted turns run to the end (a tree that
ran its jobs inside serve, as main did before the job process, is counted whole
either way). For the same tree and inputs (the message texts and session names
are fixed) the count repeats within about 3% (hash seeds, and when the job
process's writes land relative to the turns).

    .venv/bin/python bench/turn_instructions.py [--turns 300] [--sessions 5] [--postgres] [--with-jobs]
        [--baseline-source DIR]

Needs Debian's ``valgrind`` (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import turn_overhead as T  # the seeding and the gateway's config, shared with turn_overhead

ROOT = Path(__file__).resolve().parents[1]


async def turns(url: str, n: int, sessions: int, start: int) -> None:
    """``n`` turns, one at a time, round-robin over ``sessions`` sessions (fixed texts)."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {T.TOKEN}"}) as http:
        for i in range(start, start + n):
            body = {"session": f"count-{i % sessions}", "text": f"produce the daily report number {i}"}
            async with http.post(url, json=body) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status}")


def _totals(path: str) -> int:
    total = 0
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return total


def _callgrind_pids_under(root: int) -> list[int]:
    """``root`` and its descendants that run under callgrind (the job process, with ``--with-jobs``)."""
    listed = subprocess.run(["callgrind_control"], capture_output=True, text=True).stdout
    running = {int(m) for m in re.findall(r"^PID (\d+):", listed, flags=re.M)}
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in running:
            found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


async def _jobs_left(db_url: str) -> int:
    """Jobs not done yet (the trims' extraction jobs of the counted turns)."""
    query = "SELECT count(*) FROM jobs WHERE status != 'done'"
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.split("///", 1)[1]) as conn:
            return int(conn.execute(query).fetchone()[0])
    import asyncpg

    conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return int(await conn.fetchval(query))
    finally:
        await conn.close()


async def count(source: Path, db_url: str, tmp: Path, n: int, sessions: int, *, with_jobs: bool) -> float:
    """Instructions per turn of the tree at ``source`` (with its job process's too: ``with_jobs``)."""
    g = T.Gateway("counted", source, db_url, tmp)
    await g.start(10_000)  # seeds the database and writes the config; then restarted under valgrind
    g.stop()
    out = tmp / "callgrind.out"
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(source)}
    cmd = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
        f"--trace-children={'yes' if with_jobs else 'no'}",
        sys.executable, "-m", "gateway", "serve", "--config", str(tmp / "config.yaml"),
    ]  # fmt: skip
    g.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await T.wait_up(f"http://127.0.0.1:{g.port}/healthz", timeout=600)
        warm = sessions * 25  # every session past its first trim (at 20 turns): the steady state
        await turns(g.url, warm, sessions, 0)
        while with_jobs and await _jobs_left(db_url):
            await asyncio.sleep(1)  # the warm-up's jobs are not the counted turns' work
        pids = [str(p) for p in (_callgrind_pids_under(g.proc.pid) if with_jobs else [g.proc.pid])]
        for pid in pids:
            subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True)
        await turns(g.url, n, sessions, warm)
        while with_jobs and await _jobs_left(db_url):
            await asyncio.sleep(1)  # the counted turns' jobs, run to the end
        for pid in pids:
            subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
    finally:
        g.stop()
    counted = 0
    for pid in pids:
        dumps = glob.glob(f"{out}.{pid}*")
        counted += max((_totals(p) for p in dumps), default=0)
    if not counted:
        raise RuntimeError(f"callgrind wrote no count for {source} ({pids})")
    return counted / n


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--postgres", action="store_true", help="fresh PostgreSQL databases instead of SQLite files")
    ap.add_argument("--pg-server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument(
        "--with-jobs",
        action="store_true",
        help="count the job process too (serve's child that runs extraction jobs; older trees ran them in serve)",
    )
    ap.add_argument("--baseline-source", type=Path, default=None, help="also count a gateway from this tree")
    args = ap.parse_args()
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("turn_instructions: valgrind is not installed (apt-get install valgrind); nothing was measured")
    trees = [("this", ROOT)] + ([("baseline", args.baseline_source.resolve())] if args.baseline_source else [])
    counted: dict[str, float] = {}
    for name, source in trees:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            pg_name = f"goclaw_bench_count_{secrets.token_hex(4)}"
            db_url = (
                await T.pg_database(args.pg_server, pg_name)
                if args.postgres
                else f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
            )
            try:
                counted[name] = await count(source, db_url, tmp, args.turns, args.sessions, with_jobs=args.with_jobs)
            finally:
                if args.postgres:
                    await T.pg_database(args.pg_server, pg_name, drop=True)
        print(f"{name:8s} {counted[name] / 1e6:7.3f} M instructions a turn ({source})", flush=True)
    db = "PostgreSQL" if args.postgres else "SQLite"
    what = "the serving process and its job process, jobs run to the end" if args.with_jobs else "serving process only"
    print(f"\n{args.turns} steady-state turns over {args.sessions} sessions, {db}, {what}")
    if "baseline" in counted:
        print(f"  this/baseline: {counted['this'] / counted['baseline']:.3f}")


if __name__ == "__main__":
    asyncio.run(main())
