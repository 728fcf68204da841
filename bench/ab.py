"""Another tree in the same run: a measurement in a child process per tree, alternating, medians.

A script that compares this tree with ``--baseline-source DIR`` runs itself again as a child
with ``GOCLAW_BENCH_SOURCE`` naming the tree whose code it measures (the script puts that
path first on ``sys.path``); the child prints its figures as one JSON object on its last
line. The trees take turns going first, run after run, and each figure's median is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

Figures = dict[str, float]


def add_arguments(ap: argparse.ArgumentParser, *, runs: int = 3) -> None:
    """The options every such script takes: ``--runs``, ``--postgres``, ``--pg-server``, ``--baseline-source``."""
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--postgres", action="store_true", help="fresh PostgreSQL databases instead of SQLite files")
    ap.add_argument("--pg-server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--baseline-source", type=Path, default=None, help="also measure this tree, alternating")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the child: one measurement on this database


def trees(root: Path, args: argparse.Namespace) -> dict[str, Path]:
    """``this`` (``root``) and, with ``--baseline-source``, ``baseline``."""
    found = {"this": root}
    if args.baseline_source:
        found["baseline"] = args.baseline_source.resolve()
    return found


def run_child(script: str, source: Path, args: list[str]) -> Figures:
    """``script args`` in a process of its own on ``source``'s code; its last line of output, parsed."""
    env = {**os.environ, "GOCLAW_BENCH_SOURCE": str(source)}
    out = subprocess.run([sys.executable, script, *args], env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # the child's errors go to our stderr as they come


async def alternate(
    trees: dict[str, Path],
    runs: int,
    measure: Callable[[str, Path, int], Awaitable[Figures]],
    show: Callable[[Figures], str],
) -> dict[str, Figures]:
    """``measure(name, tree, run)`` for each tree, ``runs`` times, the order alternating; each figure's median."""
    results: dict[str, list[Figures]] = {name: [] for name in trees}
    for run in range(runs):
        order = list(trees) if run % 2 == 0 else list(reversed(trees))
        for name in order:
            got = await measure(name, trees[name], run)
            results[name].append(got)
            print(f"run {run + 1}: {name:8} {show(got)}")
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}


async def on_fresh_databases(
    script: str,
    trees: dict[str, Path],
    runs: int,
    child_args: list[str],
    show: Callable[[Figures], str],
    *,
    postgres: bool,
    pg_server: str,
) -> dict[str, Figures]:
    """``alternate`` with ``script --child URL child_args`` for each measurement, each on a database of its own
    (a fresh PostgreSQL database, dropped after, or a SQLite file in a temporary folder)."""
    from memory_prompt import drop_pg_database, fresh_pg_database

    with tempfile.TemporaryDirectory(prefix="goclaw-bench-") as tmp:

        async def measure(name: str, tree: Path, run: int) -> Figures:
            pg_name = None
            if postgres:
                url, pg_name = await fresh_pg_database(pg_server)
            else:
                url = f"sqlite+aiosqlite:///{Path(tmp) / f'{name}-{run}.db'}"
            try:
                return run_child(script, tree, ["--child", url, *child_args])
            finally:
                if pg_name:
                    await drop_pg_database(pg_server, pg_name)

        return await alternate(trees, runs, measure, show)


Table = tuple[str, tuple[str, ...], list[tuple[Any, ...]]]
"""A table's name, the columns given, and the rows (values in that order) of a bulk load."""


async def loaded(url: str, tables: list[Table], *, inline: bool = False) -> Any:
    """A fresh database migrated by the measured tree's Alembic, ``tables`` loaded in bulk (a fixture, not the
    gate: SQLite ``executemany``, PostgreSQL ``COPY`` then ``VACUUM ANALYZE`` as autovacuum would); its engine.

    ``inline``: on SQLite the engine the job process and the worker thread make (the driver's calls made
    on the calling thread, ``gateway.sqlite_inline``), else the serving process's.
    """
    from gateway.db import make_engine, upgrade

    engine = make_engine(url)
    await upgrade(engine)
    await engine.dispose()
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.split("///", 1)[1])
        for table, columns, rows in tables:
            marks = ",".join("?" * len(columns))
            conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
        conn.commit()
        conn.close()
        if inline:
            from gateway.sqlite_inline import make_inline_engine

            return make_inline_engine(url)
        return make_engine(url)
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        for table, columns, rows in tables:
            await conn.copy_records_to_table(table, records=rows, columns=columns)
        # The whole database: the queues triggers keep (trees since the twenty-eighth session) had
        # most of their rows deleted by the later tables' inserts.
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return make_engine(url)


async def timed(calls: int, call: Callable[[], Awaitable[Any]], check: Callable[[Any], None]) -> Figures:
    """``call()`` ``calls`` times after two untimed (they warm the connection and the page cache), each result
    ``check``ed: wall p50/p99 ms and the process's CPU ms a call (every thread of it)."""
    walls, cpu = [], 0.0
    for i in range(calls + 2):
        c0, t0 = time.process_time(), time.perf_counter()
        got = await call()
        t1, c1 = time.perf_counter(), time.process_time()
        check(got)
        if i >= 2:
            walls.append((t1 - t0) * 1000)
            cpu += c1 - c0
    walls.sort()
    return {
        "p50": statistics.median(walls),
        "p99": walls[min(len(walls) - 1, round(0.99 * (len(walls) - 1)))],
        "cpu": cpu * 1000 / calls,
    }


def report(trees: dict[str, Path], medians: dict[str, Figures], show: Callable[[Figures], str]) -> None:
    """Each tree's medians, then this tree's p50 and CPU against the baseline's when there is one."""
    for name, m in medians.items():
        print(f"  {name:8} ({trees[name]}) {show(m)}")
    if "baseline" in medians:
        this, base = medians["this"], medians["baseline"]
        print(f"  this / baseline: p50 {this['p50'] / base['p50']:.2f}x, CPU {this['cpu'] / base['cpu']:.2f}x")
